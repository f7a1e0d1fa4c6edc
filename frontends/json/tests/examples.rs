//! Every example description loads, validates and (where cheap enough) builds.

mod common;

use common::example;
use dlrm_ir::{DType, Dim, InteractionKind, Pool, TensorType};
use dlrm_json::{Loss, ModelSpec, Optimizer};

const KAGGLE: [usize; 26] = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992,
    5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
];
const TERABYTE: [usize; 26] = [
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10, 2209,
    11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
];

fn capped(v: &[usize]) -> Vec<usize> {
    v.iter().map(|&r| r.min(200_000)).collect()
}

/// Checks the output and that the graph has one parameter per expected tensor.
fn check_graph(spec: &ModelSpec) -> dlrm_ir::Graph {
    let g = spec.graph().expect("graph");
    dlrm_ir::verify(&g).expect("verifies");
    assert_eq!(g.name, spec.name);
    assert_eq!(g.outputs().len(), 1);
    let out = g.outputs()[0];
    assert_eq!(g.name_of(out), "prob");
    assert_eq!(g.ty(out), &TensorType::f32([Dim::batch(), Dim::Fixed(1)]));
    let nlayers = spec.bottom_mlp.len() - 1 + spec.top_mlp.len();
    assert_eq!(g.params().len(), spec.num_tables() + 2 * nlayers);
    let elems: u64 = g
        .param_types()
        .map(|(_, t)| t.fixed_numel().expect("fixed") as u64)
        .sum();
    assert_eq!(elems, spec.param_count());
    g
}

#[test]
fn tiny_builds() {
    let m = dlrm_json::load(example("dlrm-tiny")).expect("load");
    let s = &m.spec;
    assert_eq!(s.name, "dlrm-tiny");
    assert_eq!(s.dense_features, 4);
    assert_eq!(s.table_rows, vec![50, 30, 20]);
    assert_eq!(s.embedding_dim, 8);
    assert_eq!(s.pooling, vec![2, 2, 2]);
    assert_eq!(s.bottom_mlp, vec![4, 16, 8]);
    assert_eq!(s.top_mlp, vec![16, 1]);
    assert_eq!(s.interaction, InteractionKind::Dot);
    for k in [1, 2, 3, 4, 8] {
        assert_eq!(m.training.batch_size % k, 0);
    }
    assert_eq!(m.training.loss, Loss::Bce);
    assert_eq!(m.training.optimizer, Optimizer::Sgd);
    assert!((0.1..=0.5).contains(&m.training.learning_rate));
    assert_eq!(m.training.seed, 1);
    check_graph(s);
    // Tables 800, bottom 80 + 136, top 240 + 17.
    assert_eq!(s.param_count(), 1273);
    let summary = m.summary();
    for part in [
        "model `dlrm-tiny`",
        "3 tables (100 rows in all, dim 8, pooling 2 sum)",
        "bottom MLP 4-16-8, interaction dot (width 14), top MLP 14-16-1",
        "parameters: 1273",
        "training: bce loss, sgd lr 0.2, batch 24, seed 1",
    ] {
        assert!(summary.contains(part), "{part:?} not in\n{summary}");
    }
}

#[test]
fn small_builds_with_params() {
    let m = dlrm_json::load(example("dlrm-small")).expect("load");
    let s = &m.spec;
    assert_eq!(s.table_rows, vec![100_000; 8]);
    assert_eq!(s.embedding_dim, 64);
    assert_eq!(s.bottom_mlp, vec![13, 512, 256, 64]);
    assert_eq!(s.top_mlp, vec![512, 256, 1]);
    assert_eq!(s.batch_size, 2048);
    assert_eq!(s.loss, Loss::Bce);
    check_graph(s);
    // F = 9 vectors: 64 + 36.
    assert_eq!(s.top_input_width(), 100);
    let total: u64 = m.params.iter().map(|(_, t)| t.numel() as u64).sum();
    assert_eq!(total, s.param_count());
    for ((name, t), (gname, gty)) in m.params.iter().zip(m.graph.param_types()) {
        assert_eq!(name, gname);
        let bind = |_: &str| None;
        assert!(t.matches(gty, &bind), "{name}");
    }
    assert!(m.summary().contains("dlrm-small"));
}

#[test]
fn kaggle_builds_with_params() {
    let m = dlrm_json::load(example("dlrm-kaggle")).expect("load");
    let s = &m.spec;
    assert_eq!(s.table_rows, capped(&KAGGLE));
    assert_eq!(s.embedding_dim, 16);
    assert_eq!(s.pooling, vec![1; 26]);
    assert_eq!(s.bottom_mlp, vec![13, 512, 256, 64, 16]);
    assert_eq!(s.top_mlp, vec![512, 256, 1]);
    assert_eq!(s.batch_size, 2048);
    assert_eq!(s.loss, Loss::Bce);
    let g = check_graph(s);
    // F = 27 vectors: 16 + 351.
    assert_eq!(s.top_input_width(), 16 + 27 * 26 / 2);
    let w = g.find("top.0.w").expect("top.0.w");
    assert_eq!(
        g.ty(w),
        &TensorType::f32([Dim::Fixed(512), Dim::Fixed(367)])
    );
    let total: u64 = m.params.iter().map(|(_, t)| t.numel() as u64).sum();
    assert_eq!(total, s.param_count());
}

#[test]
fn mlperf_validates_and_builds_graph() {
    let s = ModelSpec::load(example("dlrm-mlperf")).expect("load");
    assert_eq!(s.table_rows, capped(&TERABYTE));
    assert_eq!(s.embedding_dim, 128);
    assert_eq!(s.bottom_mlp, vec![13, 512, 256, 128]);
    assert_eq!(s.top_mlp, vec![1024, 1024, 512, 256, 1]);
    assert_eq!(s.batch_size, 2048);
    assert_eq!(s.loss, Loss::Bce);
    check_graph(&s);
    assert_eq!(s.top_input_width(), 128 + 27 * 26 / 2);
}

#[test]
fn intel_small_validates_and_builds_graph() {
    // 8 x 1M x 64 floats (2 GB) are not initialised here: spec and graph only.
    let s = ModelSpec::load(example("dlrm-intel-small")).expect("load");
    assert_eq!(s.dense_features, 512);
    assert_eq!(s.table_rows, vec![1_000_000; 8]);
    assert_eq!(s.embedding_dim, 64);
    assert_eq!(s.pooling, vec![100; 8]);
    assert_eq!(s.pooling_mode, Pool::Sum);
    assert_eq!(s.bottom_mlp, vec![512, 512, 64]);
    assert_eq!(s.top_mlp, vec![1024, 1024, 1024, 1]);
    assert_eq!(s.batch_size, 2048);
    assert_eq!(s.loss, Loss::Bce);
    let g = check_graph(&s);
    let idx = g.find("idx.7").expect("idx.7");
    assert_eq!(
        g.ty(idx),
        &TensorType::new(DType::I64, [Dim::batch(), Dim::Fixed(100)])
    );
    let tables = 8 * 1_000_000 * 64u64;
    let mlp = (512 * 512 + 512)
        + (512 * 64 + 64)
        + (100 * 1024 + 1024)
        + 2 * (1024 * 1024 + 1024)
        + (1024 + 1);
    assert_eq!(s.top_input_width(), 64 + 9 * 8 / 2);
    assert_eq!(s.param_count(), tables + mlp);
}

#[test]
fn terabyte_describes_its_tables_without_creating_them() {
    let s = ModelSpec::load(example("dlrm-mlperf-terabyte")).expect("load");
    assert_eq!(s.table_rows, TERABYTE);
    assert_eq!(s.embedding_dim, 128);
    check_graph(&s);
    // ~100 GB of tables: described, so this is instant and small.
    let values = s.initial_values().expect("values");
    let described: u128 = values
        .iter()
        .filter_map(|(_, v)| match v {
            dlrm_ir::ParamValue::Described(d) => Some(d.numel()),
            dlrm_ir::ParamValue::Stored(_) | dlrm_ir::ParamValue::OnDemand(_) => None,
        })
        .sum();
    let rows: u128 = TERABYTE.iter().map(|&r| r as u128).sum();
    assert_eq!(described, rows * 128);
    // Row r of a table is the same values whoever creates it.
    let (name, v) = &values[0];
    let a = v.rows(name, 39_999_990, 40_000_000).expect("last rows");
    let b = v.rows(name, 39_999_995, 40_000_000).expect("fewer rows");
    assert_eq!(
        a.as_f32().expect("f32")[5 * 128..],
        b.as_f32().expect("f32")[..]
    );
}
