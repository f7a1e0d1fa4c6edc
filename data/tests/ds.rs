//! The `.ds` format: write, open, read back, verify; atomic replacement; bad datasets.
#![expect(clippy::unwrap_used, reason = "tests fail loudly")]

use dlrm_data::{Dataset, DatasetMeta, DatasetWriter, Split, TableInfo};
use std::path::Path;

fn meta(samples: u64) -> DatasetMeta {
    DatasetMeta {
        dense_transform: "log1p".into(),
        tables: vec![TableInfo::new("C1", 10), TableInfo::new("C2", 3)],
        splits: vec![
            Split {
                name: "train".into(),
                start: 0,
                end: samples - 1,
            },
            Split {
                name: "test".into(),
                start: samples - 1,
                end: samples,
            },
        ],
        days: vec![samples],
        source: serde_json::json!({"format": "test"}),
    }
}

fn write(dir: &Path, n: u32) {
    let mut w = DatasetWriter::create(dir, 2, 2).unwrap();
    for i in 0..n {
        w.push((i % 2) as u8, &[i as f32, -(i as f32)], &[i % 10, i % 3])
            .unwrap();
    }
    w.finish(meta(u64::from(n))).unwrap();
}

#[test]
fn writes_and_reads_back() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("x.ds");
    write(&dir, 5);
    let ds = Dataset::open(&dir).unwrap();
    ds.verify().unwrap();
    assert_eq!(ds.len(), 5);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(
            mode & 0o777,
            0o755,
            "a dataset is not private like a temp dir"
        );
    }
    assert_eq!(ds.labels(), &[0, 1, 0, 1, 0]);
    assert_eq!(&ds.dense()[4..6], &[2.0, -2.0]);
    assert_eq!(ds.sparse(1), &[0, 1, 2, 0, 1]);
    assert_eq!(ds.split("test").unwrap(), 4..5);
    let e = ds.split("val").unwrap_err().to_string();
    assert!(
        e.contains("no split `val`") && e.contains("train, test"),
        "{e}"
    );
    // Only the dataset is left in the parent: no temporary directories.
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
}

#[test]
fn replaces_a_dataset_only_when_the_new_one_is_complete() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("x.ds");
    write(&dir, 5);
    // An unfinished write (dropped, as on an error) leaves the old dataset intact.
    {
        let mut w = DatasetWriter::create(&dir, 2, 2).unwrap();
        w.push(1, &[0.0, 0.0], &[9, 2]).unwrap();
    }
    assert_eq!(Dataset::open(&dir).unwrap().len(), 5);
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
    write(&dir, 7);
    assert_eq!(Dataset::open(&dir).unwrap().len(), 7);
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
}

#[test]
fn refuses_to_replace_a_directory_that_is_not_a_dataset() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("precious.txt"), "keep").unwrap();
    let e = DatasetWriter::create(tmp.path(), 2, 2)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("not a dataset"), "{e}");
    assert!(tmp.path().join("precious.txt").exists());
}

#[test]
fn bad_datasets_get_errors_that_say_where() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("x.ds");
    write(&dir, 5);
    // A flipped byte: opens (sizes agree), verify names the file.
    let p = dir.join("sparse.0.u32");
    let mut b = std::fs::read(&p).unwrap();
    b[0] ^= 1;
    std::fs::write(&p, &b).unwrap();
    let e = Dataset::open(&dir)
        .unwrap()
        .verify()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("sparse.0.u32") && e.contains("checksum mismatch"),
        "{e}"
    );
    // A truncated file.
    std::fs::write(&p, &b[..7]).unwrap();
    let e = Dataset::open(&dir).unwrap_err().to_string();
    assert!(e.contains("sparse.0.u32") && e.contains("7 bytes"), "{e}");
    // A version from the future.
    let mp = dir.join("manifest.json");
    let m = std::fs::read_to_string(&mp).unwrap();
    std::fs::write(&mp, m.replace("\"version\": 1", "\"version\": 99")).unwrap();
    let e = Dataset::open(&dir).unwrap_err().to_string();
    assert!(e.contains("version 99 is newer"), "{e}");
    // Malformed JSON.
    std::fs::write(&mp, "{").unwrap();
    let e = Dataset::open(&dir).unwrap_err().to_string();
    assert!(
        e.contains("manifest.json") && e.contains("malformed"),
        "{e}"
    );
}

/// Counts in the manifest are claims: sample and dense counts whose file sizes
/// overflow u64 are errors naming a file, not an arithmetic panic (found by
/// `scripts/fuzz ds`).
#[test]
fn counts_whose_sizes_overflow_are_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("x.ds");
    write(&dir, 5);
    let mp = dir.join("manifest.json");
    let m = std::fs::read_to_string(&mp).unwrap();
    for (from, to) in [
        ("\"samples\": 5", "\"samples\": 18446744073709551615"),
        ("\"dense\": 2", "\"dense\": 18446744073709551615"),
    ] {
        assert!(m.contains(from), "{from} not in {m}");
        std::fs::write(&mp, m.replace(from, to)).unwrap();
        let e = Dataset::open(&dir).unwrap_err().to_string();
        assert!(
            e.contains("manifest.json") || e.contains("bytes"),
            "{to}: {e}"
        );
    }
}

#[test]
fn verify_finds_ids_beyond_their_table() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("x.ds");
    let mut w = DatasetWriter::create(&dir, 2, 2).unwrap();
    w.push(0, &[0.0, 0.0], &[3, 5]).unwrap();
    let mut m = meta(1);
    m.splits.clear();
    w.finish(m).unwrap();
    let e = Dataset::open(&dir)
        .unwrap()
        .verify()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("id 5 of table 1 (C2) is beyond its 3 rows"),
        "{e}"
    );
}

#[test]
fn map_sparse_rewrites_ids_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("x.ds");
    let mut w = DatasetWriter::create(&dir, 2, 2).unwrap();
    for i in 0..4u32 {
        w.push(0, &[0.0, 0.0], &[1000 + i, i]).unwrap();
    }
    w.map_sparse(0, |id| id - 1000).unwrap();
    w.push(1, &[0.0, 0.0], &[5, 0]).unwrap();
    w.finish(meta(5)).unwrap();
    let ds = Dataset::open(&dir).unwrap();
    assert_eq!(ds.sparse(0), &[0, 1, 2, 3, 5]);
}

/// A file of an open dataset truncated (or grown) under it is found by
/// `check_unchanged`, which names the file and both sizes.
#[test]
fn files_changed_under_an_open_dataset_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("x.ds");
    write(&dir, 5);
    let ds = Dataset::open(&dir).unwrap();
    ds.check_unchanged().unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("sparse.1.u32"))
        .unwrap();
    f.set_len(8).unwrap();
    let e = ds.check_unchanged().unwrap_err().to_string();
    assert!(
        e.contains("sparse.1.u32") && e.contains("mapped at 20 bytes, now 8"),
        "{e}"
    );
}
