//! Dead-code elimination and the pass pipeline (order, log, dump stages, errors).

#![allow(clippy::unwrap_used)]

mod common;

use common::{Spec, count};
use dlrm_ir::{Act, Dim, Graph, IrError, Op, TensorType, verify};
use dlrm_passes::dce::dce;
use dlrm_passes::pipeline::{PASSES, dump_stages, pass_ids_for};
use dlrm_passes::{DumpSpec, LossKind, PassError, PassLog, PipelineOptions, TrainConfig, compile};

const TRAIN: PipelineOptions = PipelineOptions {
    train: Some(TrainConfig {
        loss: LossKind::Bce,
        lr: 0.05,
        optimizer: dlrm_passes::Optimizer::Sgd,
    }),
    optimize: false,
    precision: dlrm_passes::Precision::Fp32,
    block: None,
    fuse_embedding: false,
    canon: false,
    limits: dlrm_passes::egraph::Limits {
        iterations: 30,
        nodes: 200_000,
        time_ms: 5_000,
    },
};

/// `p = sigmoid(linear(x))`, optionally with a dead branch and an unused parameter.
fn small(dead: bool) -> Graph {
    let mut g = Graph::new("small");
    let x = g
        .add_input("x", TensorType::f32([Dim::batch(), Dim::Fixed(3)]))
        .unwrap();
    let w = g
        .add_param("w", TensorType::f32([Dim::Fixed(1), Dim::Fixed(3)]))
        .unwrap();
    let b = g.add_param("b", TensorType::f32([Dim::Fixed(1)])).unwrap();
    g.add_param("unused", TensorType::f32([Dim::Fixed(2)]))
        .unwrap();
    let y = g
        .add(Op::Linear { act: Act::None }, &[x, w, b], "y")
        .unwrap();
    if dead {
        let r = g.add(Op::Relu, &[x], "dead").unwrap();
        g.add(Op::Add, &[r, r], "dead2").unwrap();
    }
    let p = g.add(Op::Sigmoid, &[y], "p").unwrap();
    g.add_output(p);
    g
}

#[test]
fn dce_removes_a_dead_branch_and_keeps_the_interface() {
    let g = small(true);
    let out = dce(&g).unwrap();
    verify(&out).unwrap();
    assert_eq!(out.nodes().len(), 2);
    assert!(out.find("dead").is_none() && out.find("dead2").is_none());
    // Inputs and parameters stay, used or not.
    assert!(out.find("unused").is_some());
    assert_eq!(out, small(false));
    // Idempotent, and a no-op on a live graph.
    assert_eq!(dce(&out).unwrap(), out);
}

#[test]
fn training_pipeline_drops_forward_only_outputs() {
    // A second forward output that the loss does not need.
    let mut g = Spec::dot().build();
    let h = g.find("bot.0").unwrap();
    let aux = g.add(Op::Relu, &[h], "aux").unwrap();
    g.add_output(aux);
    let mut stages = Vec::new();
    let (t, log) = compile(g.clone(), &TRAIN, &mut |id, g| {
        stages.push((id.to_string(), g.nodes().len()))
    })
    .unwrap();
    assert_eq!(
        stages.iter().map(|s| s.0.as_str()).collect::<Vec<_>>(),
        ["input", "autodiff", "save-activations", "dce"]
    );
    assert!(t.find("aux").is_none());
    assert_eq!(count(&t, "relu"), 0);
    assert_eq!(stages[2].1, stages[1].1, "no cross layer: nothing saved");
    assert_eq!(stages[3].1 + 1, stages[2].1, "dce removed exactly %aux");
    assert_eq!(t.updates().len(), g.params().len());
    assert_eq!(log.passes.len(), 3);
    assert_eq!(log.passes[0].id, "autodiff");
    assert_eq!(log.passes[0].nodes_before, g.nodes().len());
    assert_eq!(log.passes[0].nodes_after, stages[1].1);
    assert_eq!(log.passes[1].id, "save-activations");
    assert_eq!(log.passes[2].nodes_before, stages[2].1);
    assert_eq!(log.passes[2].nodes_after, t.nodes().len());
    assert!(log.passes.iter().all(|p| p.wall_ms >= 0.0));
    // The log goes into a manifest and comes back.
    let json = serde_json::to_string(&log).unwrap();
    let back: PassLog = serde_json::from_str(&json).unwrap();
    assert_eq!(back, log);
    let table = log.to_string();
    assert!(
        table.contains("autodiff") && table.contains("dce"),
        "{table}"
    );
}

#[test]
fn inference_pipeline_skips_autodiff() {
    assert_eq!(
        PASSES,
        [
            "canon",
            "autodiff",
            "contract-cross",
            "save-activations",
            "fuse",
            "fuse-dgrad-mask",
            "layout",
            "precision",
            "fuse-cross-epilogue",
            "fuse-interaction-layout",
            "dce"
        ]
    );
    let infer = PipelineOptions::default();
    assert_eq!(pass_ids_for(&infer), ["dce"]);
    assert_eq!(
        pass_ids_for(&TRAIN),
        ["autodiff", "save-activations", "dce"]
    );
    let opt = PipelineOptions::optimized(TRAIN.train);
    assert_eq!(
        pass_ids_for(&opt),
        [
            "autodiff",
            "contract-cross",
            "save-activations",
            "fuse",
            "fuse-dgrad-mask",
            "layout",
            "fuse-cross-epilogue",
            "fuse-interaction-layout",
            "dce"
        ]
    );
    let bf16 = PipelineOptions {
        precision: dlrm_passes::Precision::Bf16,
        ..opt
    };
    assert_eq!(
        pass_ids_for(&bf16),
        [
            "autodiff",
            "contract-cross",
            "save-activations",
            "fuse",
            "fuse-dgrad-mask",
            "layout",
            "precision",
            "fuse-cross-epilogue",
            "fuse-interaction-layout",
            "dce"
        ]
    );
    let imported = PipelineOptions { canon: true, ..opt };
    assert_eq!(
        pass_ids_for(&imported),
        [
            "canon",
            "autodiff",
            "contract-cross",
            "save-activations",
            "fuse",
            "fuse-dgrad-mask",
            "layout",
            "fuse-cross-epilogue",
            "fuse-interaction-layout",
            "dce"
        ]
    );
    let (g, log) = compile(small(true), &infer, &mut |_, _| {}).unwrap();
    assert_eq!(g, small(false));
    assert_eq!(log.passes.len(), 1);
    assert_eq!(log.passes[0].nodes_before, 4);
    assert_eq!(log.passes[0].nodes_after, 2);
}

#[test]
fn an_invalid_input_is_reported_as_such() {
    let mut g = small(false);
    let p = g.find("p").unwrap();
    // A node whose declared type is wrong.
    g.push_node_unchecked(
        Op::Relu,
        vec![p],
        vec![("bad".into(), TensorType::f32([Dim::Fixed(7)]))],
    )
    .unwrap();
    let mut called = false;
    let err = compile(g, &TRAIN, &mut |_, _| called = true).unwrap_err();
    assert!(
        matches!(&err, PassError::Verify { after, .. } if after == "input"),
        "{err:?}"
    );
    assert!(!called);
    assert!(err.to_string().contains("%bad"), "{err}");
}

#[test]
fn pass_errors_name_the_pass() {
    let mut g = Graph::new("nograd");
    let x = g
        .add_input("x", TensorType::f32([Dim::batch(), Dim::Fixed(1)]))
        .unwrap();
    let p = g.add(Op::Sigmoid, &[x], "p").unwrap();
    g.add_output(p);
    let err = compile(g, &TRAIN, &mut |_, _| {}).unwrap_err();
    assert!(err.to_string().starts_with("autodiff:"), "{err}");
    let wrapped = PassError::ir("dce")(IrError::Comm("x".into()));
    assert_eq!(
        wrapped.to_string(),
        "while running pass `dce`: communication: x"
    );
}

#[test]
fn dump_specs_are_validated() {
    assert_eq!(
        dump_stages(),
        [
            "input",
            "canon",
            "autodiff",
            "contract-cross",
            "save-activations",
            "fuse",
            "fuse-dgrad-mask",
            "layout",
            "precision",
            "fuse-cross-epilogue",
            "fuse-interaction-layout",
            "dce",
            "partition",
            "bucket",
            "schedule"
        ]
    );
    assert_eq!(DumpSpec::parse("all").unwrap(), DumpSpec::All);
    let s = DumpSpec::parse("dce").unwrap();
    assert!(s.wants("dce") && !s.wants("input"));
    let s = DumpSpec::parse("input, partition").unwrap();
    assert!(s.wants("input") && s.wants("partition") && !s.wants("autodiff"));
    assert!(DumpSpec::All.wants("autodiff"));
    let err = DumpSpec::parse("fusion").unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("`fusion`")
            && msg.contains(
                "all, input, canon, autodiff, contract-cross, save-activations, fuse, fuse-dgrad-mask, layout, \
                 precision, fuse-cross-epilogue, fuse-interaction-layout, dce, partition, bucket, schedule"
            ),
        "{msg}"
    );
    assert!(DumpSpec::parse("").is_err());
}
