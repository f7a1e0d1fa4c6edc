//! The loader's batch assembly (one rank's inputs of a training step: shuffle
//! lookup, dense rows, 26 id columns, labels) on a generated dataset with
//! dlrm-kaggle's schema (13 dense, 26 tables) at its batch of 2048.
//! `cargo bench -p dlrm-runtime --bench loader`

use criterion::{Criterion, criterion_group, criterion_main};
use dlrm_data::{DatasetMeta, DatasetWriter, Split, TableInfo};
use dlrm_passes::pipeline::{PipelineOptions, compile_params};
use dlrm_passes::{LossKind, TrainConfig};
use dlrm_runtime::{DataConfig, DataSchema, DatasetSource};
use std::hint::black_box;

const SAMPLES: u64 = 200_000;
const BATCH: usize = 2048;

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

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
    let mut w = DatasetWriter::create(&path, 13, rows.len()).expect("create");
    let mut ids = vec![0u32; rows.len()];
    for i in 0..SAMPLES {
        let dense: Vec<f32> = (0..13)
            .map(|j| (mix(i * 64 + j) % 100) as f32 / 10.0)
            .collect();
        for (t, id) in ids.iter_mut().enumerate() {
            *id = (mix(i * 64 + 20 + t as u64) % rows[t]) as u32;
        }
        w.push((i % 4 == 0) as u8, &dense, &ids).expect("push");
    }
    w.finish(DatasetMeta {
        dense_transform: "log1p".into(),
        tables: rows
            .iter()
            .enumerate()
            .map(|(t, &r)| TableInfo {
                name: format!("C{}", t + 1),
                rows: r,
            })
            .collect(),
        splits: vec![Split {
            name: "train".into(),
            start: 0,
            end: SAMPLES,
        }],
        days: vec![SAMPLES],
        source: serde_json::json!({"generator": "runtime/benches/loader.rs"}),
    })
    .expect("finish");
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
