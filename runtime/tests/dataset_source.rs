//! A `.ds` dataset as a plan's data: the schema mapping and its errors, the
//! deterministic block shuffle (same seed same order, every sample once an epoch),
//! resuming at an offset, rank slices, evaluation padding.

use dlrm_data::{Dataset, Learnable, parse_pooling, write_learnable, write_learnable_bags};
use dlrm_ir::{Graph, Tensor};
use dlrm_passes::pipeline::{PipelineOptions, compile_params};
use dlrm_passes::{LossKind, TrainConfig};
use dlrm_runtime::dataset::steps_per_epoch;
use dlrm_runtime::{DataConfig, DataSchema, DatasetSource, Position, RuntimeError, Source};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

const ROWS: [u64; 3] = [40, 7, 300];

/// `n` samples, `dense` dense columns, tables of `rows`: [`write_learnable`]'s
/// label and splits (80% train, then val and test halves of the rest).
fn write_ds(dir: &Path, n: u64, dense: usize, rows: &[u64]) -> PathBuf {
    let path = dir.join("t.ds");
    let spec = Learnable {
        samples: n,
        dense,
        rows: rows.to_vec(),
        generator: "dataset_source test".into(),
    };
    write_learnable(&path, &spec).expect("dataset");
    path
}

/// A pooling-1 model with `dense` dense features and tables of `rows`: its
/// training graph (with the label input).
fn model(dense: usize, rows: &[u64]) -> Graph {
    model_pooled(dense, rows, 1)
}

/// [`model`] with a fixed pooling of `pooling` ids per sample and table.
fn model_pooled(dense: usize, rows: &[u64], pooling: usize) -> Graph {
    let src = serde_json::json!({
        "name": "ds-test",
        "dense_features": dense,
        "embedding_dim": 4,
        "table_rows": rows,
        "pooling": pooling,
        "pooling_mode": "sum",
        "bottom_mlp": format!("{dense}-8-4"),
        "top_mlp": "8-1",
        "interaction": "dot",
        "interaction_itself": false,
        "loss": "bce",
        "batch_size": 32,
        "optimizer": "sgd",
        "learning_rate": 0.1,
        "seed": 1
    });
    let m = dlrm_json::from_str(&src.to_string(), "test").expect("model");
    let opts = PipelineOptions {
        train: Some(TrainConfig {
            loss: LossKind::Bce,
            lr: 0.1,
            optimizer: Default::default(),
        }),
        ..PipelineOptions::default()
    };
    compile_params(m.graph, m.params, &opts, &mut |_, _| {})
        .expect("train graph")
        .graph
}

fn source(path: &Path, g: &Graph, seed: u64, batch: usize, block: usize) -> DatasetSource {
    let schema = DataSchema::from_graph(g).expect("schema");
    let cfg = DataConfig {
        block,
        ..DataConfig::new(path)
    };
    DatasetSource::open(&cfg, schema, seed, batch).expect("source")
}

fn open_err(path: &Path, g: &Graph) -> String {
    let schema = DataSchema::from_graph(g).expect("schema");
    let e: RuntimeError =
        DatasetSource::open(&DataConfig::new(path), schema, 1, 32).expect_err("must fail");
    e.to_string()
}

#[test]
fn the_shuffle_is_a_function_of_seed_and_step_and_covers_each_epoch_once() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = write_ds(dir.path(), 1000, 4, &ROWS);
    let g = model(4, &ROWS);
    // 800 training samples in blocks of 64 (the last one short: 800 = 12·64 + 32).
    let a = source(&path, &g, 7, 32, 64);
    let b = source(&path, &g, 7, 32, 64);
    let c = source(&path, &g, 8, 32, 64);
    let spe = a.steps_per_epoch();
    assert_eq!(spe, 25);
    let epoch = |s: &DatasetSource, e: u64| -> Vec<usize> {
        (e * spe..(e + 1) * spe)
            .flat_map(|k| s.train_samples(k))
            .collect()
    };
    for e in 0..3 {
        let order = epoch(&a, e);
        assert_eq!(order, epoch(&b, e), "same seed, epoch {e}");
        assert_ne!(order, epoch(&c, e), "another seed, epoch {e}");
        let distinct: HashSet<usize> = order.iter().copied().collect();
        assert_eq!(distinct.len(), order.len(), "a sample twice in epoch {e}");
        assert!(order.iter().all(|&s| s < 800), "outside the training split");
    }
    assert_ne!(epoch(&a, 0), epoch(&a, 1), "epochs in the same order");
    // Not the file order, and not merely rotated blocks.
    let first = a.train_samples(0);
    assert_ne!(first, (0..32).collect::<Vec<_>>());
    let sorted_runs = first.windows(2).filter(|w| w[1] == w[0] + 1).count();
    assert!(sorted_runs < 8, "{first:?}");

    // With a batch that divides the split, every sample once per epoch; with one
    // that does not, the tail (< one batch) is dropped.
    let exact = source(&path, &g, 3, 40, 64);
    assert_eq!(exact.steps_per_epoch(), 20);
    let mut all: Vec<usize> = epoch_of(&exact, 1);
    all.sort_unstable();
    assert_eq!(all, (0..800).collect::<Vec<_>>());
    let ragged = source(&path, &g, 3, 48, 64);
    assert_eq!(ragged.steps_per_epoch(), 16);
    let seen: HashSet<usize> = epoch_of(&ragged, 0).into_iter().collect();
    assert_eq!(seen.len(), 768);
}

fn epoch_of(s: &DatasetSource, e: u64) -> Vec<usize> {
    let spe = s.steps_per_epoch();
    (e * spe..(e + 1) * spe)
        .flat_map(|k| s.train_samples(k))
        .collect()
}

fn same_inputs(a: &HashMap<String, Tensor>, b: &HashMap<String, Tensor>) -> bool {
    a.len() == b.len() && a.iter().all(|(k, v)| b.get(k) == Some(v))
}

#[test]
fn resuming_at_an_offset_reads_what_a_fresh_iteration_reads() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = write_ds(dir.path(), 1000, 4, &ROWS);
    let g = model(4, &ROWS);
    let run = source(&path, &g, 11, 32, 64);
    let spe = run.steps_per_epoch();
    assert_eq!(run.position(0), Position { epoch: 0, batch: 0 });
    assert_eq!(run.position(spe + 3), Position { epoch: 1, batch: 3 });
    // A run that went through steps 0..k, and one started at k.
    let k = spe + 5;
    let walked: Vec<Vec<usize>> = (0..k + 30).map(|s| run.train_samples(s)).collect();
    let resumed = source(&path, &g, 11, 32, 64);
    for s in k..k + 30 {
        assert_eq!(resumed.train_samples(s), walked[s as usize], "step {s}");
    }
    // The same through the source interface, inputs and all.
    let fresh = Source::Dataset(Box::new(source(&path, &g, 11, 32, 64)));
    let again = Source::Dataset(Box::new(run));
    for s in [k, k + 1, 3 * spe + 2] {
        let x = fresh.train_inputs(s, 32, 1, 0, &g).expect("inputs");
        let y = again.train_inputs(s, 32, 1, 0, &g).expect("inputs");
        assert!(same_inputs(&x, &y), "step {s}");
    }
}

#[test]
fn rank_slices_cover_the_global_batch_and_hold_the_data() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = write_ds(dir.path(), 1000, 4, &ROWS);
    let g = model(4, &ROWS);
    let src = source(&path, &g, 5, 30, 64);
    let ds = Dataset::open(&path).expect("open");
    let step = 9;
    let samples = src.train_samples(step);
    let one = src.inputs(&samples, 1, 0, &g).expect("one rank");
    // The values are the dataset's, in batch order.
    let dense = one["dense"].to_f32_vec();
    for (i, &s) in samples.iter().enumerate() {
        assert_eq!(&dense[i * 4..(i + 1) * 4], &ds.dense()[s * 4..(s + 1) * 4]);
    }
    let idx1 = &one["idx.1"];
    assert_eq!(idx1.shape, vec![30, 1]);
    let want: Vec<i64> = samples
        .iter()
        .map(|&s| i64::from(ds.sparse(1)[s]))
        .collect();
    assert_eq!(idx1.to_i64_vec(), Some(want));
    let label = one["label"].to_f32_vec();
    let want: Vec<f32> = samples.iter().map(|&s| f32::from(ds.labels()[s])).collect();
    assert_eq!(label, want);
    // Three ranks' slices of B-leading inputs join into the one-rank batch.
    for name in ["dense", "label", "idx.0", "idx.2"] {
        let mut joined = Vec::new();
        for r in 0..3 {
            let part = src.inputs(&samples, 3, r, &g).expect("rank");
            assert_eq!(part[name].shape[0], 10, "{name} rank {r}");
            joined.extend(part[name].to_f32_vec());
        }
        assert_eq!(joined, one[name].to_f32_vec(), "{name}");
    }
}

#[test]
fn evaluation_reads_the_split_in_order_and_pads_the_last_batch() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = write_ds(dir.path(), 1000, 4, &ROWS);
    let g = model(4, &ROWS);
    let src = source(&path, &g, 5, 32, 64);
    let val = 800..900;
    assert_eq!(src.eval_batches(&val), 4);
    assert_eq!(src.eval_samples(&val, 0), (800..832).collect::<Vec<_>>());
    let last = src.eval_samples(&val, 3);
    assert_eq!(&last[..4], &[896, 897, 898, 899]);
    assert!(last[4..].iter().all(|&s| s == 899), "{last:?}");
    let source = Source::Dataset(Box::new(src));
    let set = source.eval_set("val", 0).expect("val");
    assert_eq!(source.eval_valid(&set, 3, 32), 4);
    assert_eq!(source.eval_labels(&set, 32).len(), 100);
    let e = source.eval_set("holdout", 0).expect_err("no such split");
    assert!(e.to_string().contains("no split `holdout`"), "{e}");
}

#[test]
fn a_dataset_that_does_not_fit_the_plan_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = write_ds(dir.path(), 200, 4, &ROWS);
    let shown = path.display().to_string();
    // Dense width.
    let e = open_err(&path, &model(3, &ROWS));
    assert!(
        e.contains(&shown) && e.contains("has 4 dense features"),
        "{e}"
    );
    assert!(e.contains("take 3"), "{e}");
    // Table count.
    let e = open_err(&path, &model(4, &ROWS[..2]));
    assert!(e.contains(&shown) && e.contains("has 3 tables"), "{e}");
    assert!(e.contains("2 sparse features"), "{e}");
    // A table smaller than the data's.
    let e = open_err(&path, &model(4, &[40, 7, 250]));
    assert!(e.contains("table 2 (`C3`) has 300 rows"), "{e}");
    assert!(
        e.contains("has 250") && e.contains("dlrmc compile --data"),
        "{e}"
    );
    // A larger table is fine (ids stay in range).
    let g = model(4, &[40, 9, 300]);
    let schema = DataSchema::from_graph(&g).expect("schema");
    DatasetSource::open(&DataConfig::new(&path), schema, 1, 32).expect("larger tables");
    // A batch larger than the training split.
    let schema = DataSchema::from_graph(&g).expect("schema");
    let e = DatasetSource::open(&DataConfig::new(&path), schema, 1, 500).expect_err("batch");
    assert!(e.to_string().contains("fewer than one global batch"), "{e}");
    // A damaged file fails verification, naming it.
    let col = path.join("sparse.1.u32");
    let mut bytes = std::fs::read(&col).expect("read");
    bytes[0] ^= 1;
    std::fs::write(&col, bytes).expect("write");
    let e = open_err(&path, &g);
    assert!(e.contains("sparse.1.u32") && e.contains("checksum"), "{e}");
    // Unverified, it still opens; ids are checked against the plan as read.
    let schema = DataSchema::from_graph(&g).expect("schema");
    let cfg = DataConfig {
        verify: false,
        ..DataConfig::new(&path)
    };
    DatasetSource::open(&cfg, schema, 1, 32).expect("unverified");
}

/// Overwrites the bytes of `file` at `at` (a change `verify` would catch).
fn patch(file: &Path, at: usize, with: &[u8]) {
    let mut bytes = std::fs::read(file).expect("read");
    bytes[at..at + with.len()].copy_from_slice(with);
    std::fs::write(file, bytes).expect("write");
}

/// The dataset at `path` as `g`'s data, opened without `verify` (a no-verify run).
fn unverified(path: &Path, g: &Graph) -> DatasetSource {
    let schema = DataSchema::from_graph(g).expect("schema");
    let cfg = DataConfig {
        verify: false,
        ..DataConfig::new(path)
    };
    DatasetSource::open(&cfg, schema, 1, 32).expect("unverified")
}

#[test]
fn an_id_beyond_the_plans_table_is_caught_while_reading() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = write_ds(dir.path(), 200, 4, &ROWS);
    // A plan whose table 1 has 7 rows reads ids < 7; pretend the data holds more by
    // editing an id past the check of `verify` (no-verify run).
    patch(&path.join("sparse.1.u32"), 0, &100u32.to_le_bytes());
    let g = model(4, &ROWS);
    let src = unverified(&path, &g);
    let e = src
        .inputs(&[5, 0, 3], 1, 0, &g)
        .expect_err("id 100 of 7 rows");
    let e = e.to_string();
    assert!(
        e.contains("sparse.1.u32") && e.contains("sample 0: id 100"),
        "{e}"
    );
    assert!(e.contains("7 rows"), "{e}");
    assert!(steps_per_epoch(src.dataset(), "train", 32).expect("spe") == 5);
}

/// Issue 42: a NaN or infinite dense value and a label outside {0, 1} (past the
/// check of `verify`) are errors naming the sample, not trained on.
#[test]
fn non_finite_dense_values_and_bad_labels_are_caught_while_reading() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = write_ds(dir.path(), 200, 4, &ROWS);
    // Sample 3, column 2.
    patch(
        &path.join("dense.f32"),
        (3 * 4 + 2) * 4,
        &f32::NAN.to_le_bytes(),
    );
    patch(&path.join("label.u8"), 7, &[2]);
    let g = model(4, &ROWS);
    let src = unverified(&path, &g);
    let e = src
        .inputs(&[5, 3, 0], 1, 0, &g)
        .expect_err("NaN")
        .to_string();
    assert!(
        e.contains("t.ds") && e.contains("sample 3: dense column 2") && e.contains("NaN"),
        "{e}"
    );
    let e = src
        .inputs(&[5, 7, 0], 1, 0, &g)
        .expect_err("label 2")
        .to_string();
    assert!(e.contains("sample 7: label 2 is not 0 or 1"), "{e}");
    src.inputs(&[5, 6, 0], 1, 0, &g).expect("finite rows read");
}

#[test]
fn a_fixed_pooling_takes_a_multi_hot_table_of_that_hotness_and_refuses_others() {
    let dir = tempfile::tempdir().expect("tmp");
    let spec = Learnable {
        samples: 500,
        dense: 4,
        rows: ROWS.to_vec(),
        generator: "dataset_source test".into(),
    };
    let path = dir.path().join("h3.ds");
    let pooling = parse_pooling("3", 3).expect("pooling");
    write_learnable_bags(&path, &spec, &pooling).expect("dataset");
    let g = model_pooled(4, &ROWS, 3);
    let src = source(&path, &g, 5, 30, 64);
    let ds = Dataset::open(&path).expect("open");
    let samples = src.train_samples(2);
    let one = src.inputs(&samples, 1, 0, &g).expect("one rank");
    assert_eq!(one["idx.2"].shape, vec![30, 3]);
    let want: Vec<i64> = samples
        .iter()
        .flat_map(|&s| ds.bag(2, s).expect("bag").iter().map(|&i| i64::from(i)))
        .collect();
    assert_eq!(one["idx.2"].to_i64_vec(), Some(want));
    // Pooling 1 on bags of 3; pooling 3 on bags of 1..=4.
    let e = open_err(&path, &model(4, &ROWS));
    assert!(
        e.contains("%idx.0") && e.contains("table 0 (`C1`) has bags of 3 ids"),
        "{e}"
    );
    let var = dir.path().join("var.ds");
    write_learnable_bags(&var, &spec, &parse_pooling("1-4", 3).expect("p")).expect("dataset");
    let e = open_err(&var, &g);
    assert!(
        e.contains("fixed pooling of 3") && e.contains("varying size"),
        "{e}"
    );
}
