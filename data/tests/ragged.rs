//! `--format ragged-npz`: multi-hot bags from `.npz` files (ids + lengths or
//! offsets per table), written as multi-hot tables; malformed bags refused naming
//! the file, the array and the position.
#![expect(clippy::unwrap_used, reason = "tests fail loudly")]

use dlrm_data::{Bags, ConvertOptions, Dataset, Format, IdMapping, convert, npy::raw_npy};
use std::io::Write;
use std::path::{Path, PathBuf};

/// A `.npy` of little-endian `descr` elements `bytes` of `shape`.
fn npy(descr: &str, shape: &str, bytes: &[u8]) -> Vec<u8> {
    raw_npy(
        &format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"),
        bytes,
    )
    .unwrap()
}

fn i64s(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Writes `members` (name, npy bytes) as an `.npz` at `path`.
fn npz(path: &Path, members: &[(&str, Vec<u8>)]) {
    let mut zip = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, bytes) in members {
        zip.start_file(format!("{name}.npy"), opts).unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap();
}

/// Three samples, two dense features, two tables: table 0 by lengths (2, 0, 1),
/// table 1 by offsets (bags of 1).
fn members(offsets1: &[i64]) -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("y", npy("<i8", "(3,)", &i64s(&[1, 0, 1]))),
        ("X_int", npy("<i8", "(3, 2)", &i64s(&[0, 1, 2, 3, -4, 5]))),
        ("X_cat_0_ids", npy("<i8", "(3,)", &i64s(&[4, 9, 2]))),
        ("X_cat_0_lengths", npy("<i8", "(3,)", &i64s(&[2, 0, 1]))),
        ("X_cat_1_ids", npy("<i8", "(3,)", &i64s(&[0, 1, 0]))),
        (
            "X_cat_1_offsets",
            npy("<i8", &format!("({},)", offsets1.len()), &i64s(offsets1)),
        ),
    ]
}

fn opts(input: PathBuf, output: PathBuf) -> ConvertOptions {
    ConvertOptions {
        format: Format::RaggedNpz,
        inputs: vec![input],
        output,
        mapping: IdMapping::AsIs { modulo: None },
        split: Some("train=0.67,test=0.33".parse().unwrap()),
        skip_bad_lines: false,
    }
}

#[test]
fn ragged_npz_converts_to_multi_hot_tables() {
    let tmp = tempfile::tempdir().unwrap();
    let (input, out) = (tmp.path().join("day_0.npz"), tmp.path().join("r.ds"));
    npz(&input, &members(&[0, 1, 2, 3]));
    let report = convert(&opts(input, out.clone()), &mut |_| {}).unwrap();
    assert_eq!(report.manifest.version, 2);
    let ds = Dataset::open(&out).unwrap();
    ds.verify().unwrap();
    assert_eq!(ds.labels(), &[1, 0, 1]);
    assert_eq!(ds.dense()[1], 2f32.ln());
    assert_eq!(ds.dense()[4], 0.0);
    let t = &ds.manifest().tables;
    assert_eq!(
        (t[0].bags, t[0].rows, t[0].hotness),
        (Bags::MultiHot, 10, None)
    );
    assert_eq!((t[1].rows, t[1].hotness), (2, Some(1)));
    assert_eq!(ds.bag(0, 0).unwrap(), &[4, 9]);
    assert_eq!(ds.bag(0, 1).unwrap(), &[] as &[u32]);
    assert_eq!(ds.bag(0, 2).unwrap(), &[2]);
    assert_eq!(ds.bag_offsets(1).unwrap(), &[0, 1, 2, 3]);
}

#[test]
fn malformed_ragged_bags_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("day_0.npz");
    for (offsets, says) in [
        (
            &[0, 2, 1, 3][..],
            "X_cat_1_offsets: element 2 (1) is below element 1 (2)",
        ),
        (&[1, 1, 2, 3][..], "X_cat_1_offsets: element 0 is 1, not 0"),
        (
            &[0, 1, 2, 2][..],
            "table 1: the bags hold 2 ids, X_cat_1_ids has 3",
        ),
        (&[0, 1, 2][..], "X_cat_1_offsets has shape [3]"),
    ] {
        npz(&input, &members(offsets));
        let e = convert(&opts(input.clone(), tmp.path().join("x.ds")), &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("day_0.npz") && e.contains(says),
            "{offsets:?}: {e}"
        );
        assert!(!tmp.path().join("x.ds").exists());
    }
}

fn i32s(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// An MLPerf multi-hot day of 3 samples in `dir`: table 0 of hotness 2, table 1 of
/// hotness 1; returns the `.npz` path.
fn mlperf_day(dir: &Path) -> PathBuf {
    let f32s: Vec<u8> = [0.5f32, 1.0, 1.5, 2.0, 2.5, 3.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    std::fs::write(dir.join("day_0_dense.npy"), npy("<f4", "(3, 2)", &f32s)).unwrap();
    std::fs::write(
        dir.join("day_0_labels.npy"),
        npy("<i4", "(3, 1)", &i32s(&[0, 1, 1])),
    )
    .unwrap();
    let sparse = dir.join("day_0_sparse_multi_hot.npz");
    npz(
        &sparse,
        &[
            ("0", npy("<i4", "(3, 2)", &i32s(&[1, 2, 3, 4, 5, 6]))),
            ("1", npy("<i4", "(3, 1)", &i32s(&[7, 8, 9]))),
        ],
    );
    sparse
}

#[test]
fn mlperf_multi_hot_days_convert_to_fixed_hotness_tables() {
    let tmp = tempfile::tempdir().unwrap();
    let input = mlperf_day(tmp.path());
    let out = tmp.path().join("m.ds");
    let o = ConvertOptions {
        format: Format::MlperfMultiHot,
        ..opts(input, out.clone())
    };
    convert(&o, &mut |_| {}).unwrap();
    let ds = Dataset::open(&out).unwrap();
    ds.verify().unwrap();
    assert_eq!(ds.labels(), &[0, 1, 1]);
    assert_eq!(ds.dense(), &[0.5, 1.0, 1.5, 2.0, 2.5, 3.0]);
    let m = ds.manifest();
    assert_eq!(m.dense_transform, "ln(x+3)");
    assert_eq!((m.tables[0].hotness, m.tables[0].rows), (Some(2), 7));
    assert_eq!((m.tables[1].hotness, m.tables[1].rows), (Some(1), 10));
    assert_eq!(ds.bag(0, 1).unwrap(), &[3, 4]);
    assert_eq!(ds.bag(1, 2).unwrap(), &[9]);
    // A day without its labels is refused naming the file.
    std::fs::remove_file(tmp.path().join("day_0_labels.npy")).unwrap();
    let e = convert(&o, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("day_0_labels.npy"), "{e}");
}
