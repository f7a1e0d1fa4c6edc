//! Multi-hot tables in `.ds` (format version 2): round trip, fixed hotness,
//! malformed offsets refused with the file, table and position, one-hot datasets
//! still version 1 (and a version-1 manifest read unchanged).
#![expect(clippy::unwrap_used, reason = "tests fail loudly")]

use dlrm_data::{
    BagSizes, Bags, Dataset, DatasetMeta, DatasetWriter, Learnable, Split, TableInfo,
    parse_pooling, write_learnable, write_learnable_bags,
};
use std::path::Path;

fn meta(samples: u64) -> DatasetMeta {
    DatasetMeta {
        dense_transform: "none".into(),
        tables: vec![
            TableInfo::new("C1", 10),
            TableInfo::new("C2", 7),
            TableInfo::new("C3", 5),
        ],
        splits: vec![Split {
            name: "train".into(),
            start: 0,
            end: samples,
        }],
        days: vec![samples],
        source: serde_json::json!({"format": "test"}),
    }
}

/// Table 0 one-hot, table 1 variable bags (sample i: i % 3 ids), table 2 fixed 2.
fn write(dir: &Path, n: u32) {
    let kinds = [Bags::OneHot, Bags::MultiHot, Bags::MultiHot];
    let mut w = DatasetWriter::create_bags(dir, 1, &kinds).unwrap();
    for i in 0..n {
        let var: Vec<u32> = (0..i % 3).map(|k| (i + k) % 7).collect();
        let fixed = [i % 5, (i + 1) % 5];
        w.push_bags((i % 2) as u8, &[i as f32], &[&[i % 10], &var, &fixed])
            .unwrap();
    }
    w.finish(meta(u64::from(n))).unwrap();
}

#[test]
fn multi_hot_tables_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m.ds");
    write(&dir, 6);
    let ds = Dataset::open(&dir).unwrap();
    ds.verify().unwrap();
    let m = ds.manifest();
    assert_eq!(m.version, 2);
    assert_eq!(m.tables[0].bags, Bags::OneHot);
    assert_eq!(
        (m.tables[1].bags, m.tables[1].ids),
        (Bags::MultiHot, Some(6))
    );
    assert_eq!(m.tables[1].hotness, None);
    assert_eq!((m.tables[2].ids, m.tables[2].hotness), (Some(12), Some(2)));
    assert_eq!(m.tables[2].fixed_hotness(), Some(2));
    assert_eq!(m.tables[0].fixed_hotness(), Some(1));
    assert_eq!(ds.bag_offsets(0), None);
    assert_eq!(ds.bag_offsets(1).unwrap(), &[0, 0, 1, 3, 3, 4, 6]);
    assert_eq!(ds.bag(1, 2).unwrap(), &[2, 3]);
    assert_eq!(ds.bag(1, 3).unwrap(), &[] as &[u32]);
    assert_eq!(ds.bag(2, 4).unwrap(), &[4, 0]);
    assert_eq!(ds.bag(0, 5).unwrap(), &[5]);
    let text = std::fs::read_to_string(dir.join("manifest.json")).unwrap();
    assert!(text.contains("\"bags\": \"multi_hot\""), "{text}");
    assert!(text.contains("sparse.1.off.u64"), "{text}");
}

#[test]
fn a_one_hot_table_refuses_a_bag_of_two() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = DatasetWriter::create_bags(&tmp.path().join("x.ds"), 1, &[Bags::OneHot]).unwrap();
    let e = w.push_bags(0, &[0.0], &[&[1, 2]]).unwrap_err().to_string();
    assert!(
        e.contains("table 0 is one-hot") && e.contains("2 ids"),
        "{e}"
    );
}

fn learnable(samples: u64, dense: usize, rows: Vec<u64>) -> Learnable {
    Learnable {
        samples,
        dense,
        rows,
        generator: "data/tests/multihot.rs".into(),
    }
}

/// Overwrites the `u64` at `index` of `file` in `dir`.
fn poke(dir: &Path, file: &str, index: usize, v: u64) {
    let p = dir.join(file);
    let mut b = std::fs::read(&p).unwrap();
    b[index * 8..index * 8 + 8].copy_from_slice(&v.to_le_bytes());
    std::fs::write(&p, &b).unwrap();
}

#[test]
fn malformed_offsets_are_refused_naming_file_table_and_position() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m.ds");
    // A decrease inside: opens (the ends agree), the bag read and verify refuse it.
    write(&dir, 6);
    poke(&dir, "sparse.1.off.u64", 2, 5);
    let ds = Dataset::open(&dir).unwrap();
    let e = ds.bag(1, 2).unwrap_err().to_string();
    assert!(
        e.contains("sparse.1.off.u64") && e.contains("table 1") && e.contains("sample 2"),
        "{e}"
    );
    assert!(ds.bag(1, 0).is_ok());
    let e = ds.verify().unwrap_err().to_string();
    assert!(e.contains("sparse.1.off.u64"), "{e}");
    // A bag past the ids.
    write(&dir, 6);
    poke(&dir, "sparse.1.off.u64", 3, 99);
    let e = Dataset::open(&dir)
        .unwrap()
        .bag(1, 3)
        .unwrap_err()
        .to_string();
    assert!(e.contains("ids 99..3") || e.contains("sample 3"), "{e}");
    // Not starting at 0, not ending at the id count: refused at open.
    for (at, v) in [(0, 1), (6, 5)] {
        write(&dir, 6);
        poke(&dir, "sparse.1.off.u64", at, v);
        let e = Dataset::open(&dir).unwrap_err().to_string();
        assert!(
            e.contains("sparse.1.off.u64") && e.contains("table 1") && e.contains("start at 0"),
            "{e}"
        );
    }
    // An offsets file of the wrong size.
    write(&dir, 6);
    std::fs::write(dir.join("sparse.2.off.u64"), [0u8; 8]).unwrap();
    let e = Dataset::open(&dir).unwrap_err().to_string();
    assert!(
        e.contains("sparse.2.off.u64") && e.contains("8 bytes"),
        "{e}"
    );
}

#[test]
fn manifests_claiming_the_impossible_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m.ds");
    write(&dir, 6);
    let mp = dir.join("manifest.json");
    let m = std::fs::read_to_string(&mp).unwrap();
    for (from, to, says) in [
        ("\"version\": 2", "\"version\": 1", "format version 1"),
        ("\"hotness\": 2", "\"hotness\": 3", "hotness 3"),
        ("\"ids\": 12,", "", "no id count"),
    ] {
        std::fs::write(&mp, m.replace(from, to)).unwrap();
        let e = Dataset::open(&dir).unwrap_err().to_string();
        assert!(e.contains(says) && e.contains("C"), "{from} -> {to}: {e}");
    }
}

#[test]
fn one_hot_datasets_stay_version_1_and_read_as_before() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("o.ds");
    let spec = learnable(50, 2, vec![10, 5]);
    let m = write_learnable(&dir, &spec).unwrap();
    assert_eq!(m.version, 1);
    let text = std::fs::read_to_string(dir.join("manifest.json")).unwrap();
    assert!(
        !text.contains("bags") && !text.contains("hotness"),
        "{text}"
    );
    let ds = Dataset::open(&dir).unwrap();
    ds.verify().unwrap();
    assert_eq!(ds.bag(1, 7).unwrap(), &ds.sparse(1)[7..8]);
    // Bags of one written as a one-hot pooling give the same ids.
    let dir2 = tmp.path().join("o2.ds");
    write_learnable_bags(&dir2, &spec, &parse_pooling("1", 2).unwrap()).unwrap();
    assert_eq!(Dataset::open(&dir2).unwrap().sparse(0), ds.sparse(0));
}

#[test]
fn generated_pooling_follows_the_spec() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("g.ds");
    let spec = learnable(400, 3, vec![40, 25, 60]);
    let pooling = parse_pooling("1-100,3,1", 3).unwrap();
    assert_eq!(pooling[0], BagSizes::Uniform(1, 100));
    write_learnable_bags(&dir, &spec, &pooling).unwrap();
    let ds = Dataset::open(&dir).unwrap();
    ds.verify().unwrap();
    let sizes: Vec<usize> = (0..400).map(|s| ds.bag(0, s).unwrap().len()).collect();
    assert!(sizes.iter().all(|n| (1..=100).contains(n)));
    assert!(sizes.iter().min() < Some(&10) && sizes.iter().max() > Some(&90));
    assert_eq!(ds.manifest().tables[1].hotness, Some(3));
    assert_eq!(ds.manifest().tables[2].bags, Bags::OneHot);
    for bad in ["70000", "5-2", "x", "1,2"] {
        assert!(parse_pooling(bad, 3).is_err(), "{bad}");
    }
}

#[test]
fn a_multi_hot_table_of_empty_bags_reads_as_no_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("e.ds");
    let mut w = DatasetWriter::create_bags(&dir, 1, &[Bags::MultiHot]).unwrap();
    for i in 0..3 {
        w.push_bags(0, &[i as f32], &[&[]]).unwrap();
    }
    let mut m = meta(3);
    m.tables.truncate(1);
    w.finish(m).unwrap();
    let ds = Dataset::open(&dir).unwrap();
    ds.verify().unwrap();
    assert_eq!(ds.sparse(0), &[] as &[u32]);
    assert_eq!(ds.bag(0, 2).unwrap(), &[] as &[u32]);
    assert_eq!(ds.manifest().tables[0].hotness, Some(0));
}
