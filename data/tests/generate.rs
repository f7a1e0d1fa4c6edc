//! The generator: Criteo's format and character, determinism, and that its labels
//! carry signal the features can find.
#![expect(clippy::unwrap_used, reason = "tests fail loudly")]

use dlrm_data::criteo::{RawSample, parse_line};
use dlrm_data::{ConvertOptions, Dataset, Format, GenerateOptions, IdMapping, convert, generate};
use std::collections::HashMap;
use std::path::Path;

fn opts(rows: u64, output: &Path) -> GenerateOptions {
    GenerateOptions {
        rows,
        days: 7,
        seed: 3,
        cardinality_scale: 0.001,
        gzip: false,
        split_files: false,
        output: output.to_path_buf(),
    }
}

#[test]
fn criteo_format_and_character() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("train.txt");
    let report = generate(&opts(40_000, &out), &mut |_| {}).unwrap();
    assert!(
        (0.22..0.28).contains(&report.positive_rate),
        "{}",
        report.positive_rate
    );
    let text = std::fs::read_to_string(&out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 40_000);
    let mut missing = [0usize; 40];
    let mut negative_i2 = 0;
    let mut c3: HashMap<&str, usize> = HashMap::new();
    let mut s = RawSample::default();
    for l in &lines {
        parse_line(l.as_bytes(), &mut s).unwrap();
        let f: Vec<&str> = l.split('\t').collect();
        for (i, v) in f.iter().enumerate() {
            missing[i] += usize::from(v.is_empty());
            if i >= 14 && !v.is_empty() {
                assert!(
                    v.len() == 8
                        && v.bytes()
                            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
                    "{v}"
                );
            }
        }
        negative_i2 += usize::from(s.dense[1] < 0);
        *c3.entry(f[16]).or_default() += 1;
    }
    let rate = |i: usize| missing[i] as f64 / lines.len() as f64;
    // I12 (~77%), I1 (~45%) and C22 (~76%) missing; I2 never; label never.
    assert!((0.72..0.82).contains(&rate(12)), "{}", rate(12));
    assert!((0.40..0.50).contains(&rate(1)));
    assert!((0.71..0.81).contains(&rate(14 + 21)));
    assert_eq!((missing[0], missing[2]), (0, 0));
    assert!(negative_i2 > 0);
    // Power law: C3's top id covers far more than its uniform share, and ids repeat.
    let top = *c3.values().max().unwrap();
    assert!(top > 40_000 / 100, "top {top}");
    assert!(c3.len() < 40_000 / 2);
}

#[test]
fn deterministic_and_split_by_day() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a.txt"), tmp.path().join("b.txt"));
    generate(&opts(50_000, &a), &mut |_| {}).unwrap();
    generate(&opts(50_000, &b), &mut |_| {}).unwrap();
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    let dir = tmp.path().join("days");
    let mut o = opts(50_000, &dir);
    o.split_files = true;
    o.gzip = true;
    let r = generate(&o, &mut |_| {}).unwrap();
    assert_eq!(r.files.len(), 7);
    assert!(r.files[6].ends_with("day_6.gz"));
    // The days, concatenated, are the single file.
    let mut joined = Vec::new();
    for f in &r.files {
        let mut d = flate2::read::GzDecoder::new(std::fs::File::open(f).unwrap());
        std::io::copy(&mut d, &mut joined).unwrap();
    }
    assert_eq!(joined, std::fs::read(&a).unwrap());
    let c = tmp.path().join("c.txt");
    let mut s = opts(50_000, &c);
    s.seed = 4;
    generate(&s, &mut |_| {}).unwrap();
    assert_ne!(std::fs::read(&c).unwrap(), std::fs::read(&a).unwrap());
}

/// Per-id click rates learned on the training days predict the test day: the
/// labels carry signal a DLRM can learn.
#[test]
fn labels_are_learnable() {
    let tmp = tempfile::tempdir().unwrap();
    let txt = tmp.path().join("train.txt");
    generate(&opts(70_000, &txt), &mut |_| {}).unwrap();
    let ds_path = tmp.path().join("g.ds");
    convert(
        &ConvertOptions {
            format: Format::CriteoTsv,
            inputs: vec![txt],
            output: ds_path.clone(),
            mapping: IdMapping::default(),
            split: None,
            skip_bad_lines: false,
        },
        &mut |_| {},
    )
    .unwrap();
    let ds = Dataset::open(&ds_path).unwrap();
    let (train, test) = (ds.split("train").unwrap(), ds.split("test").unwrap());
    let y = ds.labels();
    let base = y[train.clone()].iter().map(|&v| f64::from(v)).sum::<f64>() / train.len() as f64;
    // Naive Bayes-like score: sum over tables of the smoothed log-odds of the id.
    let logit = |p: f64| (p / (1.0 - p)).ln();
    let mut score = vec![0f64; ds.len()];
    for t in 0..ds.num_tables() {
        let ids = ds.sparse(t);
        let mut stats: HashMap<u32, (f64, f64)> = HashMap::new();
        for i in train.clone() {
            let e = stats.entry(ids[i]).or_default();
            e.0 += f64::from(y[i]);
            e.1 += 1.0;
        }
        for i in test.clone() {
            let (pos, n) = stats.get(&ids[i]).copied().unwrap_or_default();
            score[i] += logit((pos + 10.0 * base) / (n + 10.0)) - logit(base);
        }
    }
    let auc = auc(&score[test.clone()], &y[test]);
    assert!(auc > 0.65, "AUC {auc}");
}

fn auc(score: &[f64], y: &[u8]) -> f64 {
    let mut idx: Vec<usize> = (0..score.len()).collect();
    idx.sort_by(|&a, &b| score[a].total_cmp(&score[b]));
    let (mut rank_sum, mut pos) = (0f64, 0f64);
    for (r, &i) in idx.iter().enumerate() {
        if y[i] == 1 {
            rank_sum += (r + 1) as f64;
            pos += 1.0;
        }
    }
    let neg = score.len() as f64 - pos;
    (rank_sum - pos * (pos + 1.0) / 2.0) / (pos * neg)
}
