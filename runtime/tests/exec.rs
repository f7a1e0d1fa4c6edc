//! The executor against the reference interpreter (`interp::run`), in-place
//! updates, value lifetimes, and its errors.

mod common;

use common::*;
use dlrm_ir::{SingleRank, Tensor, interp};
use dlrm_passes::pipeline::{PipelineOptions, compile_params};
use dlrm_passes::{LossKind, TrainConfig};
use dlrm_runtime::synthetic::{DataSchema, SyntheticData};
use dlrm_runtime::{Executor, RuntimeError};
use std::collections::HashMap;

fn inputs(g: &dlrm_ir::Graph, step: u64, batch: usize) -> HashMap<String, Tensor> {
    let data = SyntheticData::new(DataSchema::from_graph(g).expect("schema"), 3);
    data.inputs_for(step, batch, 1, 0, g).expect("inputs")
}

fn syms(batch: usize) -> HashMap<String, usize> {
    HashMap::from([("B".to_string(), batch)])
}

#[test]
fn training_steps_match_the_interpreter() {
    let g = tiny(1, 0, true, 0.05);
    let init: HashMap<String, Tensor> = params(1).into_iter().collect();
    let mut exec = Executor::new(g.clone(), init.clone(), 0).expect("executor");
    let mut ref_params = init;
    for step in 0..4 {
        let batch = [32, 17, 1, 64][step as usize];
        let ins = inputs(&g, step, batch);
        let want =
            interp::run(&g, &ins, &mut ref_params, &syms(batch), &SingleRank).expect("interp");
        let got = exec.step(ins, &syms(batch), &SingleRank).expect("step");
        assert_eq!(got.len(), 1);
        assert!(
            close(&got[0].to_f32_vec(), &want[0].to_f32_vec(), 1e-5),
            "loss {got:?} vs {want:?}"
        );
    }
    assert_eq!(exec.next_step(), 4);
    for (name, want) in &ref_params {
        let got = exec.param(name).expect("param");
        assert_eq!(got.shape, want.shape, "{name}");
        assert!(
            close(&got.to_f32_vec(), &want.to_f32_vec(), 1e-4),
            "{name} drifted"
        );
        // The update really happened (not a no-op).
    }
    let start: HashMap<String, Tensor> = params(1).into_iter().collect();
    assert!(
        start
            .iter()
            .all(|(n, t)| exec.param(n).expect("param") != t),
        "every param trained"
    );
}

#[test]
fn inference_matches_the_interpreter_and_times_ops() {
    let g = tiny(1, 0, false, 0.0);
    let mut p: HashMap<String, Tensor> = params(2).into_iter().collect();
    let mut exec = Executor::new(g.clone(), p.clone(), 0).expect("executor");
    let ins = inputs(&g, 0, 50);
    let want = interp::run(&g, &ins, &mut p, &syms(50), &SingleRank).expect("interp");
    let got = exec.step(ins, &syms(50), &SingleRank).expect("step");
    assert_eq!(got[0].shape, vec![50, 1]);
    assert!(close(&got[0].to_f32_vec(), &want[0].to_f32_vec(), 1e-5));
    let times = exec.op_times();
    let linear = times
        .iter()
        .find(|t| t.op == "linear")
        .expect("linear timed");
    assert_eq!(linear.calls, 4);
    assert_eq!(
        times
            .iter()
            .find(|t| t.op == "embedding_bag")
            .expect("bags")
            .calls,
        3
    );
}

/// Consecutive independent bags (from the second step under one binding) run
/// side by side (one rayon task each): the results stay the interpreter's,
/// step after step, training and inference, and each bag is timed once per
/// step.
#[test]
fn bags_side_by_side_match_the_interpreter() {
    for train in [false, true] {
        let g = tiny(1, 0, train, 0.05);
        let pair = |op: &str| {
            g.nodes()
                .windows(2)
                .any(|w| w.iter().all(|n| n.op.mnemonic() == op))
        };
        assert!(
            pair("embedding_bag"),
            "consecutive bags (a case under test)"
        );
        let init: HashMap<String, Tensor> = params(4).into_iter().collect();
        let mut exec = Executor::new(g.clone(), init.clone(), 0).expect("executor");
        let mut ref_params = init;
        for step in 0..3 {
            let ins = inputs(&g, step, 40);
            let want =
                interp::run(&g, &ins, &mut ref_params, &syms(40), &SingleRank).expect("interp");
            let got = exec.step(ins, &syms(40), &SingleRank).expect("step");
            assert!(
                close(&got[0].to_f32_vec(), &want[0].to_f32_vec(), 1e-5),
                "train={train} step {step}: {got:?} vs {want:?}"
            );
        }
        for (name, want) in &ref_params {
            let got = exec.param(name).expect("param");
            assert!(close(&got.to_f32_vec(), &want.to_f32_vec(), 1e-4), "{name}");
        }
        let bags = exec
            .op_times()
            .into_iter()
            .find(|t| t.op == "embedding_bag");
        assert_eq!(bags.expect("bags timed").calls, 9, "train={train}");
    }
}

/// A compiled training graph's fused table updates (consecutive, one per
/// table) run side by side, as its bags do: three steps at one batch size
/// give the interpreter's losses and parameters.
#[test]
fn fused_updates_side_by_side_match_the_interpreter() {
    let src = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/dlrm-tiny.json"
    ))
    .expect("example");
    let m = dlrm_json::from_str(&src, "dlrm-tiny.json").expect("model");
    let opts = PipelineOptions {
        train: Some(TrainConfig {
            loss: LossKind::Bce,
            lr: 0.2,
            optimizer: Default::default(),
        }),
        // As `dlrmc compile` optimises: fused updates, blocked MLPs.
        ..PipelineOptions::optimized(None)
    };
    let c = compile_params(m.graph, m.params, &opts, &mut |_, _| {}).expect("compiled");
    let g = c.graph;
    let updates = g
        .nodes()
        .windows(2)
        .any(|w| w.iter().all(|n| n.op.mnemonic() == "embedding_update"));
    assert!(
        updates,
        "consecutive fused table updates (the case under test)"
    );
    let init: HashMap<String, Tensor> = c.params.into_iter().collect();
    let mut exec = Executor::new(g.clone(), init.clone(), 0).expect("executor");
    let mut ref_params = init.clone();
    for step in 0..3 {
        let ins = inputs(&g, step, 24);
        let want = interp::run(&g, &ins, &mut ref_params, &syms(24), &SingleRank).expect("interp");
        let got = exec.step(ins, &syms(24), &SingleRank).expect("step");
        assert!(
            close(&got[0].to_f32_vec(), &want[0].to_f32_vec(), 1e-5),
            "step {step}: {got:?} vs {want:?}"
        );
    }
    for (name, want) in &ref_params {
        let got = exec.param(name).expect("param").to_f32_vec();
        assert!(close(&got, &want.to_f32_vec(), 1e-4), "{name}");
        if name.starts_with("emb") {
            assert_ne!(&got, &init[name].to_f32_vec(), "{name} trained");
        }
    }
}

/// Two updates in a row where the first reads, as its gradient, the
/// parameter the second updates in place: they run one after the other (the
/// second would take its storage from under the first), as the interpreter
/// runs them, step after step.
#[test]
fn an_update_reading_anothers_storage_waits_for_it() {
    use dlrm_ir::{DType, Dim, Graph, Op, TensorType};
    let ty = TensorType::new(DType::F32, [Dim::Fixed(3)]);
    let mut g = Graph::new("chained");
    let p = g.add_param("p", ty.clone()).expect("p");
    let q = g.add_param("q", ty.clone()).expect("q");
    let r = g.add_input("r", ty).expect("r");
    let p2 = g
        .add(Op::Sgd { lr: 0.5 }, &[p, q], "p.next")
        .expect("p update");
    let q2 = g
        .add(Op::Sgd { lr: 0.25 }, &[q, r], "q.next")
        .expect("q update");
    g.add_update(p, p2).expect("p");
    g.add_update(q, q2).expect("q");
    g.add_output(p2);
    dlrm_ir::verify(&g).expect("valid");
    let init: HashMap<String, Tensor> = [
        ("p".to_string(), Tensor::f32(vec![3], vec![1.0, 2.0, 3.0])),
        ("q".to_string(), Tensor::f32(vec![3], vec![4.0, 5.0, 6.0])),
    ]
    .into();
    let mut exec = Executor::new(g.clone(), init.clone(), 0).expect("executor");
    let mut want = init;
    for step in 0..3 {
        let ins: HashMap<String, Tensor> =
            [("r".to_string(), Tensor::f32(vec![3], vec![1.0, -1.0, 0.5]))].into();
        let w = interp::run(&g, &ins, &mut want, &HashMap::new(), &SingleRank).expect("interp");
        let got = exec
            .step(ins, &HashMap::new(), &SingleRank)
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
        assert_eq!(got[0].to_f32_vec(), w[0].to_f32_vec(), "step {step}");
    }
    assert_eq!(
        exec.param("q").expect("q").to_f32_vec(),
        want["q"].to_f32_vec()
    );
}

#[test]
fn tables_are_updated_in_place_without_a_copy() {
    let g = tiny(1, 0, true, 0.05);
    let mut exec = Executor::new(g.clone(), params(1).into_iter().collect(), 0).expect("executor");
    let ptr = |e: &Executor, n: &str| e.param(n).and_then(Tensor::as_f32).expect("f32").as_ptr();
    let (t0, w0) = (ptr(&exec, "emb.2"), ptr(&exec, "top.0.w"));
    let before = exec.param("emb.2").expect("table").clone();
    exec.step(inputs(&g, 0, 16), &syms(16), &SingleRank)
        .expect("step");
    assert_eq!(
        ptr(&exec, "emb.2"),
        t0,
        "the table's storage moved through the update"
    );
    assert_eq!(ptr(&exec, "top.0.w"), w0, "dense weights too");
    assert_ne!(exec.param("emb.2").expect("table"), &before);
}

#[test]
fn values_die_after_their_last_use() {
    let g = tiny(1, 0, true, 0.05);
    let exec = Executor::new(g.clone(), params(1).into_iter().collect(), 0).expect("executor");
    let lu = exec.last_uses();
    let id = |n: &str| g.find(n).expect("value").index();
    // The bottom MLP's output is used by the interaction and its gradient, then dies.
    let users = g.users();
    assert_eq!(lu[id("bot.1")], *users[id("bot.1")].last().expect("used"));
    assert_eq!(lu[id("loss")], usize::MAX, "outputs live to the end");
    assert_eq!(lu[id("emb.0.next")], usize::MAX, "update values too");
}

/// A bad index is a node error naming the rank, the step, the node and the
/// sample, and costs an inference executor nothing: it runs again. The same
/// whether the bags run one after another (the first step under a binding) or
/// side by side (a later step, their kernels known).
#[test]
fn bad_index_is_a_node_error_naming_rank_step_and_node() {
    for good_first in [0, 1] {
        let g = tiny(1, 0, false, 0.0);
        let mut exec =
            Executor::new(g.clone(), params(1).into_iter().collect(), 3).expect("executor");
        for step in 0..good_first {
            exec.step(inputs(&g, step, 4), &syms(4), &SingleRank)
                .expect("a good step");
        }
        let mut ins = inputs(&g, good_first, 4);
        ins.insert("idx.1".into(), Tensor::i64(vec![4, 1], vec![0, 1, 30, 2]));
        let err = exec
            .step(ins, &syms(4), &SingleRank)
            .expect_err("row 30 of 30");
        match &err {
            RuntimeError::Node {
                rank,
                step,
                node,
                op,
                reason,
            } => {
                assert_eq!(
                    (*rank, *step, op.as_str()),
                    (3, good_first, "embedding_bag")
                );
                assert!(node.contains("%bag.1"), "{node}");
                assert!(
                    reason.contains("30") && reason.contains("sample 2"),
                    "{reason}"
                );
            }
            other => panic!("wrong error {other}"),
        }
        exec.step(inputs(&g, good_first + 1, 4), &syms(4), &SingleRank)
            .expect("still usable");
    }
}

#[test]
fn input_bindings_are_checked() {
    let g = tiny(1, 0, false, 0.0);
    let mut exec = Executor::new(g.clone(), params(1).into_iter().collect(), 0).expect("executor");
    let mut ins = inputs(&g, 0, 4);
    ins.remove("dense");
    let err = exec.step(ins, &syms(4), &SingleRank).expect_err("missing");
    assert!(
        matches!(&err, RuntimeError::Input { name, .. } if name == "dense"),
        "{err}"
    );
    let mut ins = inputs(&g, 0, 4);
    ins.insert("dense".into(), Tensor::f32(vec![4, 5], vec![0.0; 20]));
    let err = exec
        .step(ins, &syms(4), &SingleRank)
        .expect_err("wrong width");
    assert!(
        err.to_string().contains("dense") && err.to_string().contains("B=4"),
        "{err}"
    );
    let mut ins = inputs(&g, 0, 4);
    ins.insert("bogus".into(), Tensor::scalar(1.0));
    let err = exec.step(ins, &syms(4), &SingleRank).expect_err("extra");
    assert!(
        matches!(&err, RuntimeError::Input { name, .. } if name == "bogus"),
        "{err}"
    );
    let err = exec
        .step(inputs(&g, 0, 4), &syms(5), &SingleRank)
        .expect_err("B mismatch");
    assert!(matches!(err, RuntimeError::Input { .. }), "{err}");
}

#[test]
fn parameters_are_checked_at_construction() {
    let g = tiny(1, 0, false, 0.0);
    let mut p: HashMap<String, Tensor> = params(1).into_iter().collect();
    p.remove("top.1.b");
    let err = Executor::new(g.clone(), p, 0).err().expect("missing");
    assert!(
        matches!(&err, RuntimeError::Param { name, .. } if name == "top.1.b"),
        "{err}"
    );
    let mut p: HashMap<String, Tensor> = params(1).into_iter().collect();
    p.insert("emb.0".into(), Tensor::f32(vec![51, 4], vec![0.0; 204]));
    let err = Executor::new(g.clone(), p, 0).err().expect("wrong shape");
    assert!(
        matches!(&err, RuntimeError::Param { name, .. } if name == "emb.0"),
        "{err}"
    );
    let mut p: HashMap<String, Tensor> = params(1).into_iter().collect();
    p.insert("extra".into(), Tensor::scalar(0.0));
    assert!(Executor::new(g, p, 0).is_err());
}

#[test]
fn the_step_learning_rate_reaches_every_update_like_the_interpreter() {
    let g = tiny(1, 0, true, 0.05);
    let init: HashMap<String, Tensor> = params(1).into_iter().collect();
    let mut exec = Executor::new(g.clone(), init.clone(), 0).expect("executor");
    let mut plain = Executor::new(g.clone(), init.clone(), 0).expect("executor");
    let mut ref_params = init.clone();
    assert!(exec.set_lr(Some(-0.5)).is_err());
    assert!(exec.set_lr(Some(f32::NAN)).is_err());
    for (step, lr) in [0.05f32, 0.01, 0.2, 0.05].into_iter().enumerate() {
        let ins = inputs(&g, step as u64, 16);
        let want = interp::run_with_lr(&g, &ins, &mut ref_params, &syms(16), &SingleRank, Some(lr))
            .expect("interp");
        exec.set_lr(Some(lr)).expect("rate");
        let got = exec.step(ins, &syms(16), &SingleRank).expect("step");
        assert!(
            close(&got[0].to_f32_vec(), &want[0].to_f32_vec(), 1e-5),
            "step {step}: loss {got:?} vs {want:?}"
        );
    }
    for (name, want) in &ref_params {
        let got = exec.param(name).expect("param").to_f32_vec();
        assert!(close(&got, &want.to_f32_vec(), 1e-4), "{name} drifted");
    }
    // The compiled rate given as the step's rate changes nothing, bit for bit.
    let mut same = Executor::new(g.clone(), init.clone(), 0).expect("executor");
    same.set_lr(Some(0.05)).expect("rate");
    for step in 0..3 {
        let a = plain.step(inputs(&g, step, 16), &syms(16), &SingleRank);
        let b = same.step(inputs(&g, step, 16), &syms(16), &SingleRank);
        assert_eq!(a.expect("plain"), b.expect("same"), "step {step}");
    }
    for name in init.keys() {
        assert_eq!(plain.param(name), same.param(name), "{name}");
    }
    // A zero rate leaves every parameter as it was.
    let mut frozen = Executor::new(g.clone(), init.clone(), 0).expect("executor");
    frozen.set_lr(Some(0.0)).expect("rate");
    for step in 0..3 {
        frozen
            .step(inputs(&g, step, 16), &syms(16), &SingleRank)
            .expect("step");
    }
    for (name, t) in &init {
        assert_eq!(frozen.param(name), Some(t), "{name} moved at lr 0");
    }
}
