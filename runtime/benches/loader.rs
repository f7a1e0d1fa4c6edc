//! The loader's batch assembly (one rank's inputs of a training step: shuffle
//! lookup, dense rows, 26 id columns, labels) on a generated dataset with
//! dlrm-kaggle's schema (13 dense, 26 tables) at its batch of 2048.
//! `cargo bench -p dlrm-runtime --bench loader`

use criterion::{Criterion, criterion_group, criterion_main};
use dlrm_data::{Learnable, write_learnable};
use dlrm_passes::pipeline::{PipelineOptions, compile_params};
use dlrm_passes::{LossKind, TrainConfig};
use dlrm_runtime::{DataConfig, DataSchema, DatasetSource};
use std::hint::black_box;

const SAMPLES: u64 = 200_000;
const BATCH: usize = 2048;

fn loader(c: &mut Criterion) {
    let kaggle = include_str!("../../examples/dlrm-kaggle.json");
    let spec: serde_json::Value = serde_json::from_str(kaggle).expect("example");
    let rows: Vec<u64> = spec["table_rows"]
        .as_array()
        .expect("table_rows")
        .iter()
        .filter_map(serde_json::Value::as_u64)
        .collect();
    let m = dlrm_json::from_str(kaggle, "dlrm-kaggle.json").expect("model");
    let opts = PipelineOptions {
        train: Some(TrainConfig {
            loss: LossKind::Bce,
            lr: 0.1,
            optimizer: Default::default(),
        }),
        ..PipelineOptions::default()
    };
    let g = compile_params(m.graph, m.params, &opts, &mut |_, _| {})
        .expect("train graph")
        .graph;
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("bench.ds");
    let data = Learnable {
        samples: SAMPLES,
        dense: 13,
        rows,
        generator: "runtime/benches/loader.rs".into(),
    };
    write_learnable(&path, &data).expect("dataset");
    let schema = DataSchema::from_graph(&g).expect("schema");
    let cfg = DataConfig {
        verify: false,
        ..DataConfig::new(&path)
    };
    let src = DatasetSource::open(&cfg, schema, 1, BATCH).expect("source");
    let mut step = 0u64;
    c.bench_function("loader/kaggle-schema/batch-2048/rank-0-of-1", |b| {
        b.iter(|| {
            step += 1;
            black_box(
                src.inputs(&src.train_samples(step), 1, 0, &g)
                    .expect("inputs"),
            )
        })
    });
    c.bench_function("loader/kaggle-schema/batch-2048/rank-0-of-2", |b| {
        b.iter(|| {
            step += 1;
            black_box(
                src.inputs(&src.train_samples(step), 2, 0, &g)
                    .expect("inputs"),
            )
        })
    });
}

criterion_group!(benches, loader);
criterion_main!(benches);
