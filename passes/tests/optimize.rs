//! The optimised pipeline (e-graph fusion, blocked layout, precision) against the
//! unoptimised one on the example models: equal losses over training steps, the
//! expected ops and parameter dtypes, partitioned runs, compile time.

#![allow(clippy::unwrap_used)]

mod common;

use common::{make_batch, run_ranks};
use dlrm_ir::{DType, Graph, SingleRank, Tensor, interp};
use dlrm_passes::pipeline::Params;
use dlrm_passes::{
    Compiled, GraphStats, LossKind, PipelineOptions, Precision, TrainConfig, compile_params,
    partition,
};
use std::collections::HashMap;

fn model(name: &str) -> dlrm_json::Model {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../examples/{name}.json"));
    dlrm_json::load(&p).unwrap()
}

fn cfg(m: &dlrm_json::Model) -> TrainConfig {
    TrainConfig {
        loss: LossKind::Bce,
        lr: m.training.learning_rate,
    }
}

fn build(m: &dlrm_json::Model, opts: &PipelineOptions) -> Compiled {
    compile_params(m.graph.clone(), m.params.clone(), opts, &mut |_, _| {}).unwrap()
}

fn to_map(p: &Params) -> HashMap<String, Tensor> {
    p.iter().cloned().collect()
}

/// Trains `steps` steps on one device (data made for the unoptimised graph
/// `data`, whose loss is recognisable); returns the losses.
fn train(c: &Compiled, data: &Graph, batch: usize, steps: usize, seed: u64) -> Vec<f32> {
    let mut params = to_map(&c.params);
    (0..steps)
        .map(|s| {
            let b = make_batch(data, batch, seed + s as u64);
            let out = interp::run(&c.graph, &b.inputs, &mut params, &b.syms, &SingleRank).unwrap();
            out[0].to_f32_vec()[0]
        })
        .collect()
}

fn count(g: &Graph, m: &str) -> usize {
    g.nodes().iter().filter(|n| n.op.mnemonic() == m).count()
}

fn rel(a: f32, b: f32) -> f32 {
    (a - b).abs() / a.abs().max(b.abs()).max(1e-6)
}

#[test]
fn tiny_fp32_optimised_training_matches_unoptimised_over_50_steps() {
    let m = model("dlrm-tiny");
    let plain = build(&m, &PipelineOptions { train: Some(cfg(&m)), ..Default::default() });
    let opt = build(&m, &PipelineOptions::optimized(Some(cfg(&m))));
    assert!(count(&opt.graph, "brgemm") >= 3, "{}", dlrm_ir::text::print(&opt.graph));
    assert!(count(&opt.graph, "brgemm_wgrad") >= 3);
    assert!(count(&opt.graph, "brgemm_dgrad") >= 2);
    assert_eq!(count(&opt.graph, "bce_logits"), 1, "{}", dlrm_ir::text::print(&opt.graph));
    assert_eq!(count(&opt.graph, "embedding_update"), 3);
    assert_eq!(count(&opt.graph, "relu_grad"), 0);
    let a = train(&plain, &plain.graph, 16, 50, 7);
    let b = train(&opt, &plain.graph, 16, 50, 7);
    for (s, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(rel(*x, *y) <= 1e-5, "step {s}: {x} vs {y}");
    }
    // Training makes progress (same data every 10 steps is not guaranteed: compare
    // the mean of the first and last ten).
    let head: f32 = a[..10].iter().sum();
    let tail: f32 = a[40..].iter().sum();
    assert!(tail < head, "{head} -> {tail}");
}

#[test]
fn tiny_optimised_inference_matches() {
    let m = model("dlrm-tiny");
    let plain = build(&m, &PipelineOptions::default());
    let opt = build(&m, &PipelineOptions::optimized(None));
    assert!(count(&opt.graph, "brgemm") >= 4);
    assert_eq!(count(&opt.graph, "linear"), 0);
    let b = make_batch(&plain.graph, 9, 3);
    let mut p1 = to_map(&plain.params);
    let mut p2 = to_map(&opt.params);
    let o1 = interp::run(&plain.graph, &b.inputs, &mut p1, &b.syms, &SingleRank).unwrap();
    let o2 = interp::run(&opt.graph, &b.inputs, &mut p2, &b.syms, &SingleRank).unwrap();
    // Same arithmetic: bit-identical.
    assert_eq!(o1[0], o2[0]);
}

#[test]
fn optimised_training_partitions_for_1_2_3_ranks() {
    let m = model("dlrm-tiny");
    let opt = build(&m, &PipelineOptions::optimized(Some(cfg(&m))));
    let plain = build(&m, &PipelineOptions { train: Some(cfg(&m)), ..Default::default() });
    let params = to_map(&opt.params);
    let batch = make_batch(&plain.graph, 12, 5);
    let one = run_ranks(&partition(&opt.graph, 1).unwrap().graphs, &batch, &params);
    for ranks in [2, 3] {
        let p = partition(&opt.graph, ranks).unwrap();
        for g in &p.graphs {
            // Every blocked weight gradient is all-reduced before its update.
            assert_eq!(count(g, "all_reduce"), count(g, "sgd") + count(g, "split_sgd") + 1);
        }
        let res = run_ranks(&p.graphs, &batch, &params);
        for (r, (out, after)) in res.iter().enumerate() {
            assert!(rel(out[0].to_f32_vec()[0], one[0].0[0].to_f32_vec()[0]) <= 1e-5, "rank {r}");
            for (name, t) in after {
                let want = one[0].1[name].to_f32_vec();
                let got = t.to_f32_vec();
                for (x, y) in got.iter().zip(&want) {
                    assert!((x - y).abs() <= 1e-5 * y.abs().max(1.0), "{ranks} ranks {name}: {x} vs {y}");
                }
            }
        }
    }
}
