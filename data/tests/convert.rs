//! Conversion to `.ds`: the reference's preprocessing against hand-computed values,
//! id mappings, splits, every input format, every bad input, atomicity, determinism.
#![expect(clippy::unwrap_used, reason = "tests fail loudly")]

use dlrm_data::{ConvertOptions, ConvertReport, Dataset, Format, IdMapping, SplitSpec, convert};
use std::io::Write;
use std::path::{Path, PathBuf};

/// A line from its label, (sparse) dense values and categorical strings; the fields
/// not given are empty.
fn line(label: &str, dense: &[(usize, &str)], cats: &[(usize, &str)]) -> String {
    let mut f = vec![String::new(); 40];
    f[0] = label.into();
    for &(i, v) in dense {
        f[1 + i] = v.into();
    }
    for &(t, v) in cats {
        f[14 + t] = v.into();
    }
    f.join("\t")
}

/// A valid line whose ids depend on `i`.
fn good(i: usize) -> String {
    let label = if i.is_multiple_of(4) { "1" } else { "0" };
    let a = format!("{:08x}", i % 5);
    let b = format!("{:08x}", (i * 7) % 3);
    line(
        label,
        &[(0, &i.to_string()), (1, "-1")],
        &[(0, &a), (3, &b)],
    )
}

fn write_lines(path: &Path, lines: &[String]) {
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(path, text).unwrap();
}

fn opts(inputs: Vec<PathBuf>, output: &Path) -> ConvertOptions {
    ConvertOptions {
        format: Format::CriteoTsv,
        inputs,
        output: output.to_path_buf(),
        mapping: IdMapping::default(),
        split: None,
        skip_bad_lines: false,
    }
}

fn run(o: &ConvertOptions) -> dlrm_data::Result<ConvertReport> {
    convert(o, &mut |_| {})
}

fn err(o: &ConvertOptions) -> String {
    run(o).unwrap_err().to_string()
}

#[test]
#[expect(
    clippy::approx_constant,
    reason = "numpy's float32 results, as numpy prints them"
)]
fn preprocessing_matches_hand_computed_values() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("train.txt");
    write_lines(
        &input,
        &[
            line(
                "1",
                &[
                    (0, "0"),
                    (1, "-3"),
                    (3, "1"),
                    (4, "9"),
                    (5, "999"),
                    (6, "16777217"),
                ],
                &[(0, "68fd1e64"), (2, "0000000a"), (25, "FFFFFFFF")],
            ),
            line("0", &[(12, "2147483647")], &[(0, "00000001"), (2, "a")]),
            line("0", &[], &[(0, "68fd1e64"), (2, "")]),
        ],
    );
    let out = tmp.path().join("x.ds");
    let mut o = opts(vec![input], &out);
    o.split = Some("train=1".parse().unwrap());
    run(&o).unwrap();
    let ds = Dataset::open(&out).unwrap();
    ds.verify().unwrap();
    assert_eq!(ds.labels(), &[1, 0, 0]);
    // numpy: np.log(np.array([0, 0, 0, 1, 9, 999, 16777217], 'i4').clip(0).astype('f4') + 1)
    let d = ds.dense();
    assert_eq!(
        &d[..7],
        &[
            0.0,
            0.0,
            0.0,
            0.693_147_2,
            2.302_585_1,
            6.907_755_4,
            16.635_532
        ]
    );
    assert!(d[7..13].iter().all(|&x| x == 0.0));
    assert_eq!(d[13 + 12], 21.487_562);
    assert!(d[26..39].iter().all(|&x| x == 0.0));
    // Rows in order of first appearance; a missing id is id 0, a category of its own.
    assert_eq!(ds.sparse(0), &[0, 1, 0]);
    assert_eq!(ds.sparse(1), &[0, 0, 0]);
    assert_eq!(ds.sparse(2), &[0, 0, 1]); // 0xa, then "a" (= 0xa), then missing
    assert_eq!(ds.sparse(25), &[0, 1, 1]);
    let rows: Vec<u64> = ds.manifest().tables.iter().map(|t| t.rows).collect();
    assert_eq!(&rows[..3], &[2, 1, 2]);
    assert_eq!(ds.manifest().tables[25].name, "C26");
    assert_eq!(ds.manifest().dense_transform, "log1p");
}

#[test]
fn hash_and_modulo_vocabulary_mappings() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("t.txt");
    write_lines(
        &input,
        &[
            line("1", &[], &[(0, "68fd1e64")]), // 1761418852 = 4 mod 7
            line("0", &[], &[(0, "0000000b")]), // 11 = 4 mod 7
            line("0", &[], &[(0, "00000002")]),
        ],
    );
    let out = tmp.path().join("h.ds");
    let mut o = opts(vec![input.clone()], &out);
    o.split = Some("train=1".parse().unwrap());
    o.mapping = IdMapping::Hash { modulo: 7 };
    run(&o).unwrap();
    let ds = Dataset::open(&out).unwrap();
    assert_eq!(ds.sparse(0), &[4, 4, 2]);
    assert!(ds.manifest().tables.iter().all(|t| t.rows == 7));
    // The reference: modulo first, then the dictionary over the reduced ids.
    o.mapping = IdMapping::Vocabulary {
        modulo: Some(7),
        min_count: 1,
    };
    run(&o).unwrap();
    let ds = Dataset::open(&out).unwrap();
    assert_eq!(ds.sparse(0), &[0, 0, 1]);
    assert_eq!(ds.manifest().tables[0].rows, 2);
}

#[test]
fn min_count_puts_rare_ids_on_the_last_row() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("t.txt");
    let ids = ["5", "7", "5", "9", "7", "5", "3"];
    let lines: Vec<String> = ids.iter().map(|id| line("0", &[], &[(0, id)])).collect();
    write_lines(&input, &lines);
    let out = tmp.path().join("v.ds");
    let mut o = opts(vec![input], &out);
    o.split = Some("train=1".parse().unwrap());
    o.mapping = IdMapping::Vocabulary {
        modulo: None,
        min_count: 2,
    };
    let report = run(&o).unwrap();
    let ds = Dataset::open(&out).unwrap();
    assert_eq!(ds.sparse(0), &[0, 1, 0, 2, 1, 0, 2]);
    assert_eq!(ds.manifest().tables[0].rows, 3);
    assert_eq!(report.manifest.source["vocabulary"][0]["rare_ids"], 2);
}

#[test]
fn kaggle_split_is_the_references_divmod() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("train.txt");
    write_lines(&input, &(0..100).map(good).collect::<Vec<_>>());
    let out = tmp.path().join("k.ds");
    run(&opts(vec![input], &out)).unwrap();
    let ds = Dataset::open(&out).unwrap();
    // divmod(100, 7) = (14, 2): the first two days get 15.
    assert_eq!(ds.manifest().days, vec![15, 15, 14, 14, 14, 14, 14]);
    assert_eq!(ds.split("train").unwrap(), 0..86);
    // np.array_split(day 6, 2): test is the first half, val the second.
    assert_eq!(ds.split("test").unwrap(), 86..93);
    assert_eq!(ds.split("val").unwrap(), 93..100);
    assert_eq!(dlrm_data::split::kaggle_days(45_840_617, 7)[0], 6_548_660);
}

fn gzip(path: &Path, data: &[u8]) {
    let f = std::fs::File::create(path).unwrap();
    let mut gz = flate2::write::GzEncoder::new(f, flate2::Compression::fast());
    gz.write_all(data).unwrap();
    gz.finish().unwrap();
}

#[test]
fn terabyte_days_from_plain_and_gzip_files() {
    let tmp = tempfile::tempdir().unwrap();
    let mut inputs = Vec::new();
    let mut plain = Vec::new();
    for day in 0..3 {
        let lines: Vec<String> = (day * 10..day * 10 + 10 + day).map(good).collect();
        let p = tmp.path().join(format!("day_{day}"));
        write_lines(&p, &lines);
        plain.push(p.clone());
        let gz = tmp.path().join(format!("day_{day}.gz"));
        gzip(&gz, &std::fs::read(&p).unwrap());
        inputs.push(gz);
    }
    let a = tmp.path().join("a.ds");
    let b = tmp.path().join("b.ds");
    run(&opts(inputs, &a)).unwrap();
    run(&opts(plain, &b)).unwrap();
    let (da, db) = (Dataset::open(&a).unwrap(), Dataset::open(&b).unwrap());
    assert_eq!(da.manifest().days, vec![10, 11, 12]);
    assert_eq!(da.split("train").unwrap(), 0..21);
    assert_eq!(da.split("test").unwrap(), 21..27);
    assert_eq!(da.split("val").unwrap(), 27..33);
    assert_eq!(da.manifest().files, db.manifest().files);
    assert_eq!(da.manifest().source["files"][0]["gzip"], true);
}

#[test]
fn fraction_splits_and_their_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("t.txt");
    write_lines(&input, &(0..10).map(good).collect::<Vec<_>>());
    let out = tmp.path().join("f.ds");
    let mut o = opts(vec![input], &out);
    o.split = Some("train=0.75,val=0.15,test=0.1".parse().unwrap());
    run(&o).unwrap();
    let ds = Dataset::open(&out).unwrap();
    assert_eq!(ds.split("train").unwrap(), 0..7);
    assert_eq!(ds.split("val").unwrap(), 7..8);
    assert_eq!(ds.split("test").unwrap(), 8..10);
    for bad in ["train=0.5,val=0.4", "train", "train=x", "a=0.5,a=0.5"] {
        assert!(bad.parse::<SplitSpec>().is_err(), "{bad}");
    }
    o.split = Some(SplitSpec::Terabyte);
    assert!(err(&o).contains("one input file per day"));
}

/// Each bad input, its message's file, line and field.
#[test]
fn bad_lines_name_file_line_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: [(&str, String, &str); 5] = [
        (
            "fields",
            "1\t2\t3".into(),
            "expected 40 tab-separated fields, found 3",
        ),
        (
            "hex",
            line("0", &[], &[(4, "zz12")]),
            "field C5: `zz12` is not a hex id",
        ),
        ("long", line("0", &[], &[(0, "123456789")]), "field C1"),
        (
            "int",
            line("0", &[(4, "1.5")], &[]),
            "field I5: `1.5` is not an integer",
        ),
        (
            "label",
            line("2", &[], &[]),
            "field label: `2` is not 0 or 1",
        ),
    ];
    for (name, bad, want) in cases {
        let input = tmp.path().join(format!("{name}.txt"));
        let mut lines: Vec<String> = (0..5).map(good).collect();
        lines.insert(3, bad);
        write_lines(&input, &lines);
        let out = tmp.path().join(format!("{name}.ds"));
        let e = err(&opts(vec![input.clone()], &out));
        let at = format!("{}:4: ", input.display());
        assert!(e.starts_with(&at) && e.contains(want), "{name}: {e}");
        assert!(!out.exists());
    }
}

#[test]
fn empty_and_truncated_inputs() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let out = tmp.path().join("x.ds");
    let e = err(&opts(vec![empty.clone()], &out));
    assert!(
        e.contains(&empty.display().to_string()) && e.contains("empty"),
        "{e}"
    );

    let text: String = (0..2000).map(|i| good(i) + "\n").collect();
    let gz = tmp.path().join("day_0.gz");
    gzip(&gz, text.as_bytes());
    let bytes = std::fs::read(&gz).unwrap();
    std::fs::write(&gz, &bytes[..bytes.len() / 2]).unwrap();
    let e = err(&opts(vec![gz.clone()], &out));
    assert!(
        e.starts_with(&gz.display().to_string()) && e.contains("gzip"),
        "{e}"
    );
    assert!(!out.exists());
}

#[test]
fn skip_bad_lines_counts_by_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("t.txt");
    let mut lines: Vec<String> = (0..20).map(good).collect();
    lines[2] = "1\t2".into();
    lines[5] = line("x", &[], &[]);
    lines[6] = line("0", &[(0, "abc")], &[]);
    lines[7] = line("0", &[(0, "3")], &[(1, "g")]);
    lines[9] = line("0", &[(0, "3")], &[(1, "g")]);
    write_lines(&input, &lines);
    let out = tmp.path().join("s.ds");
    let mut o = opts(vec![input.clone()], &out);
    o.skip_bad_lines = true;
    o.split = Some("train=1".parse().unwrap());
    let r = run(&o).unwrap();
    assert_eq!(r.lines, 20);
    assert_eq!(r.manifest.samples, 15);
    let counts: Vec<(&str, u64)> = r.skipped.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(
        counts,
        [
            ("categorical", 2),
            ("field-count", 1),
            ("integer", 1),
            ("label", 1)
        ]
    );
    assert!(r.first_skipped.unwrap().contains(":3: expected 40"));
    assert_eq!(r.manifest.source["skipped"]["categorical"], 2);
    // The good lines, in order: line 1 (i = 0) has I1 = 0, line 2 (i = 1) has I1 = 1.
    let ds = Dataset::open(&out).unwrap();
    assert_eq!(ds.dense()[13], (2f32).ln());
    assert_eq!(ds.dense()[2 * 13], (4f32).ln()); // line 4 (i = 3)
}

#[test]
fn a_failed_convert_leaves_the_existing_dataset_and_no_temporaries() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("work");
    std::fs::create_dir(&dir).unwrap();
    let input = dir.join("t.txt");
    let mut lines: Vec<String> = (0..300_000).map(good).collect();
    write_lines(&input, &lines);
    let out = dir.join("x.ds");
    run(&opts(vec![input.clone()], &out)).unwrap();
    let before = std::fs::read(out.join("manifest.json")).unwrap();
    // A bad line past the first batches: the error comes mid-conversion.
    lines[250_000] = line("0", &[(2, "--")], &[]);
    lines.truncate(260_000);
    write_lines(&input, &lines);
    let e = err(&opts(vec![input.clone()], &out));
    assert!(e.contains(":250001: field I3"), "{e}");
    assert_eq!(std::fs::read(out.join("manifest.json")).unwrap(), before);
    Dataset::open(&out).unwrap().verify().unwrap();
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let mut names = names;
    names.sort();
    assert_eq!(names, ["t.txt", "x.ds"]);
}

#[test]
fn converting_twice_gives_identical_files() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("t.txt");
    write_lines(&input, &(0..200_000).map(good).collect::<Vec<_>>());
    let (a, b) = (tmp.path().join("a.ds"), tmp.path().join("b.ds"));
    run(&opts(vec![input.clone()], &a)).unwrap();
    run(&opts(vec![input], &b)).unwrap();
    for f in &Dataset::open(&a).unwrap().manifest().files {
        assert_eq!(
            std::fs::read(a.join(&f.path)).unwrap(),
            std::fs::read(b.join(&f.path)).unwrap(),
            "{}",
            f.path
        );
    }
}

fn mlperf_record(label: i32, dense0: i32, ids: [i32; 2]) -> Vec<u8> {
    let mut v = [0i32; 40];
    v[0] = label;
    v[1] = dense0;
    v[14] = ids[0];
    v[39] = ids[1];
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn mlperf_binary_records() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("train_data.bin");
    let mut bytes = Vec::new();
    for r in [(1, 9, [3, 0]), (0, -4, [5, 2]), (0, 0, [0, 7])] {
        bytes.extend(mlperf_record(r.0, r.1, r.2));
    }
    std::fs::write(&input, &bytes).unwrap();
    let out = tmp.path().join("m.ds");
    let mut o = opts(vec![input.clone()], &out);
    o.format = Format::MlperfBin;
    o.split = Some("train=1".parse().unwrap());
    run(&o).unwrap();
    let ds = Dataset::open(&out).unwrap();
    ds.verify().unwrap();
    assert_eq!(ds.labels(), &[1, 0, 0]);
    assert_eq!(ds.dense()[0], 10f32.ln());
    assert_eq!(ds.dense()[13], 0.0);
    assert_eq!(ds.sparse(0), &[3, 5, 0]);
    assert_eq!(ds.sparse(25), &[0, 2, 7]);
    assert_eq!(ds.manifest().tables[0].rows, 6);
    assert_eq!(ds.manifest().tables[25].rows, 8);
    // --max-ind-range on mapped ids: `% N` as the reference's loader does.
    o.mapping = IdMapping::Hash { modulo: 4 };
    run(&o).unwrap();
    let ds = Dataset::open(&out).unwrap();
    assert_eq!(ds.sparse(0), &[3, 1, 0]);
    assert_eq!(ds.manifest().tables[0].rows, 4);

    // A truncated last record, a bad label, a negative id.
    std::fs::write(&input, &bytes[..bytes.len() - 7]).unwrap();
    let e = err(&o);
    assert!(e.contains("record 3: truncated record"), "{e}");
    let mut bad = bytes.clone();
    bad.extend(mlperf_record(3, 0, [0, 0]));
    std::fs::write(&input, &bad).unwrap();
    assert!(err(&o).contains("record 4: field label: 3 is not 0 or 1"));
    let mut bad = bytes.clone();
    bad.extend(mlperf_record(0, 0, [0, -2]));
    std::fs::write(&input, &bad).unwrap();
    assert!(err(&o).contains("record 4: field C26: id -2 is negative"));
    o.skip_bad_lines = true;
    let r = run(&o).unwrap();
    assert_eq!((r.manifest.samples, r.skipped["categorical"]), (3, 1));
}

#[test]
fn reference_npz_as_numpy_writes_it() {
    // data/tests/fixtures/make_reference_npz.py: X_cat float64 in Fortran order.
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/reference.npz");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("n.ds");
    let mut o = opts(vec![fixture], &out);
    o.format = Format::ReferenceNpz;
    o.split = Some("train=0.6,test=0.4".parse().unwrap());
    run(&o).unwrap();
    let ds = Dataset::open(&out).unwrap();
    ds.verify().unwrap();
    assert_eq!(ds.labels(), &[1, 0, 0, 1, 0]);
    let i1: Vec<f32> = (0..5).map(|i| ds.dense()[i * 13]).collect();
    assert_eq!(i1, [0.0, 2f32.ln(), 10f32.ln(), 1000f32.ln(), 4f32.ln()]);
    assert_eq!(ds.dense()[12], 3f32.ln());
    // X_cat[i, j] = i * (j + 1) % 4
    assert_eq!(ds.sparse(0), &[0, 1, 2, 3, 0]);
    assert_eq!(ds.sparse(1), &[0, 2, 0, 2, 0]);
    assert!(ds.manifest().tables.iter().all(|t| t.rows == 4));
    assert_eq!(ds.split("test").unwrap(), 3..5);
    // Not a zip file: a clear error naming it.
    let junk = tmp.path().join("junk.npz");
    std::fs::write(&junk, "not a zip").unwrap();
    o.inputs = vec![junk.clone()];
    let e = err(&o);
    assert!(e.contains("junk.npz") && e.contains("zip"), "{e}");
    o.mapping = IdMapping::Vocabulary {
        modulo: None,
        min_count: 3,
    };
    assert!(err(&o).contains("--min-count"));
}
