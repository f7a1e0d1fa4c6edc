//! The autodiff pass: structure of the training graph, errors, and gradients
//! against finite differences of the loss (through the reference interpreter).

#![allow(clippy::unwrap_used)]

mod common;

use common::{Spec, count, init_params, make_batch, run1};
use dlrm_ir::{Act, DType, Dim, Graph, Op, TensorType, verify};
use dlrm_passes::autodiff::autodiff;
use dlrm_passes::{LossKind, PassError, TrainConfig};

const BCE: TrainConfig = TrainConfig {
    loss: LossKind::Bce,
    lr: 0.5,
};

fn param_names(g: &Graph) -> Vec<String> {
    g.params()
        .iter()
        .map(|&p| g.name_of(p).to_string())
        .collect()
}

fn updated_names(g: &Graph) -> Vec<String> {
    g.updates()
        .iter()
        .map(|u| g.name_of(u.param).to_string())
        .collect()
}

#[test]
fn dot_model_training_graph_has_the_expected_nodes() {
    let fwd = Spec::dot().build();
    let t = autodiff(&fwd, &BCE).unwrap();
    verify(&t).unwrap();
    assert_eq!(t.outputs().len(), 1);
    let loss = t.outputs()[0];
    assert_eq!(t.name_of(loss), "loss");
    assert_eq!(t.ty(loss), &TensorType::scalar_f32());
    let label = t.find("label").unwrap();
    assert_eq!(t.ty(label), &TensorType::f32([Dim::batch(), Dim::Fixed(1)]));
    assert_eq!(t.inputs().last(), Some(&label));
    assert_eq!(count(&t, "bce"), 1);
    assert_eq!(count(&t, "bce_grad"), 1);
    // 4 linear layers: dw and db each; dx for all but the first (dense input).
    assert_eq!(count(&t, "linear_dw"), 4);
    assert_eq!(count(&t, "linear_db"), 4);
    assert_eq!(count(&t, "linear_dx"), 3);
    assert_eq!(count(&t, "relu_grad"), 3);
    assert_eq!(count(&t, "sigmoid_grad"), 1);
    assert_eq!(count(&t, "interaction_grad"), 1);
    assert_eq!(count(&t, "embedding_bag_grad"), 3);
    assert_eq!(count(&t, "sparse_sgd"), 3);
    assert_eq!(count(&t, "sgd"), 8);
    assert_eq!(count(&t, "add"), 0, "no value is used twice");
    // Every parameter is updated, in parameter order, by its `.next` value.
    assert_eq!(updated_names(&t), param_names(&fwd));
    for u in t.updates() {
        assert_eq!(
            t.name_of(u.value),
            format!("{}.next", t.name_of(u.param)),
            "update names"
        );
    }
    // Readable gradient names.
    for name in [
        "d.prob",
        "d.top.0.w",
        "d.bot.0.b",
        "d.inter",
        "d.e.1",
        "d.emb.2.rows",
    ] {
        assert!(t.find(name).is_some(), "missing %{name}");
    }
    // The loss is computed with denom=B.
    let bce = t.nodes().iter().find(|n| n.op.mnemonic() == "bce").unwrap();
    assert_eq!(
        bce.op,
        Op::Bce {
            denom: Dim::batch()
        }
    );
}

#[test]
fn mse_loss_and_other_variants_verify() {
    let mse = TrainConfig {
        loss: LossKind::Mse,
        lr: 0.1,
    };
    for spec in [
        Spec::dot(),
        Spec::cat(),
        Spec::offsets(),
        Spec::shared(),
        Spec::twice(),
        Spec::exotic(),
    ] {
        let fwd = spec.build();
        for cfg in [BCE, mse] {
            let t = autodiff(&fwd, &cfg).unwrap_or_else(|e| panic!("{}: {e}", spec.name));
            verify(&t).unwrap();
            assert_eq!(updated_names(&t), param_names(&fwd), "{}", spec.name);
            let loss = if cfg.loss == LossKind::Mse {
                "mse"
            } else {
                "bce"
            };
            assert_eq!(count(&t, loss), 1);
            assert_eq!(count(&t, &format!("{loss}_grad")), 1);
        }
    }
}

#[test]
fn a_table_serving_two_bags_gets_chained_sparse_updates() {
    let fwd = Spec::shared().build();
    let t = autodiff(&fwd, &BCE).unwrap();
    assert_eq!(count(&t, "embedding_bag_grad"), 4);
    assert_eq!(count(&t, "sparse_sgd"), 4);
    let emb0 = t.find("emb.0").unwrap();
    let upd = t.updates().iter().find(|u| u.param == emb0).unwrap();
    // The final update consumes the first one, which consumes the table.
    let Some(last) = t.nodes().iter().find(|n| n.outputs[0] == upd.value) else {
        panic!("no node for the update")
    };
    assert!(matches!(last.op, Op::SparseSgd { .. }));
    let first = t
        .nodes()
        .iter()
        .find(|n| n.outputs[0] == last.inputs[0])
        .unwrap();
    assert!(matches!(first.op, Op::SparseSgd { .. }));
    assert_eq!(first.inputs[0], emb0);
    // Bag order: the first update uses the first bag's indices.
    assert_eq!(t.name_of(first.inputs[1]), "idx.0");
    assert_eq!(t.name_of(last.inputs[1]), "idx.2");
}

#[test]
fn a_value_used_twice_gets_its_gradients_summed() {
    let fwd = Spec::twice().build();
    let t = autodiff(&fwd, &BCE).unwrap();
    // One forward add, one gradient sum for %bot.1 (used by the interaction and the add).
    assert_eq!(count(&t, "add"), 2);
    let dx = t.find("d.bot.1").unwrap();
    let def = t.nodes().iter().find(|n| n.outputs.contains(&dx)).unwrap();
    assert_eq!(def.op, Op::Add);
    assert!(t.name_of(def.inputs[0]).starts_with("d.bot.1.part"));
}

#[test]
fn unknown_gradient_rules_name_the_node_and_op() {
    let mut g = Graph::new("bad");
    let x = g
        .add_input("x", TensorType::f32([Dim::batch(), Dim::Fixed(3)]))
        .unwrap();
    let w = g
        .add_param("w", TensorType::f32([Dim::Fixed(1), Dim::Fixed(3)]))
        .unwrap();
    let b = g.add_param("b", TensorType::f32([Dim::Fixed(1)])).unwrap();
    let y = g
        .add(Op::Linear { act: Act::Sigmoid }, &[x, w, b], "y")
        .unwrap();
    let z = g.add(Op::AllReduce, &[y], "z").unwrap();
    g.add_output(z);
    let err = autodiff(&g, &BCE).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, PassError::Node { .. }), "{err:?}");
    assert!(msg.contains("no gradient rule for `all_reduce`"), "{msg}");
    assert!(msg.contains("%z"), "{msg}");
}

#[test]
fn an_unused_split_result_is_unsupported() {
    let mut g = Graph::new("split");
    let x = g
        .add_input("x", TensorType::f32([Dim::batch(), Dim::Fixed(3)]))
        .unwrap();
    let w = g
        .add_param("w", TensorType::f32([Dim::Fixed(2), Dim::Fixed(3)]))
        .unwrap();
    let b = g.add_param("b", TensorType::f32([Dim::Fixed(2)])).unwrap();
    let y = g
        .add(Op::Linear { act: Act::None }, &[x, w, b], "y")
        .unwrap();
    let parts = g
        .add_node(
            Op::Split {
                axis: 1,
                sizes: vec![1, 1],
            },
            &[y],
            &["y0", "y1"],
        )
        .unwrap();
    let p = g.add(Op::Sigmoid, &[parts[0]], "p").unwrap();
    g.add_output(p);
    let msg = autodiff(&g, &BCE).unwrap_err().to_string();
    assert!(msg.contains("unsupported") && msg.contains("%y1"), "{msg}");
}

#[test]
fn a_prediction_without_parameters_is_rejected() {
    let mut g = Graph::new("noparam");
    let x = g
        .add_input("x", TensorType::f32([Dim::batch(), Dim::Fixed(1)]))
        .unwrap();
    let p = g.add(Op::Sigmoid, &[x], "p").unwrap();
    g.add_output(p);
    let msg = autodiff(&g, &BCE).unwrap_err().to_string();
    assert!(msg.contains("nothing to train"), "{msg}");
    // And a graph without outputs.
    let empty = Graph::new("empty");
    assert!(autodiff(&empty, &BCE).is_err());
}

#[test]
fn bf16_parameters_get_f32_gradients() {
    let mut g = Graph::new("bf16");
    let x = g
        .add_input("x", TensorType::f32([Dim::batch(), Dim::Fixed(3)]))
        .unwrap();
    let w = g
        .add_param(
            "w",
            TensorType::new(DType::BF16, [Dim::Fixed(1), Dim::Fixed(3)]),
        )
        .unwrap();
    let b = g.add_param("b", TensorType::f32([Dim::Fixed(1)])).unwrap();
    let p = g
        .add(Op::Linear { act: Act::Sigmoid }, &[x, w, b], "p")
        .unwrap();
    g.add_output(p);
    let t = autodiff(&g, &BCE).unwrap();
    let dw = t.find("d.w").unwrap();
    assert_eq!(t.ty(dw).dtype, DType::F32);
    assert_eq!(t.ty(t.find("w.next").unwrap()).dtype, DType::BF16);
}

// ------------------------------------------------------------ numerical

/// Gradients recovered from the SGD step (`g = (w - w') / lr`) against central
/// finite differences of the loss, for a few entries of every parameter.
fn check_gradients(spec: &Spec, loss: LossKind) {
    let lr = 1.0;
    let fwd = spec.build();
    let t = autodiff(&fwd, &TrainConfig { loss, lr }).unwrap();
    let batch = make_batch(&t, 6, 7);
    let params = init_params(&fwd, 3);
    let (_, stepped) = run1(&t, &batch, &params);
    let loss_at = |p: &std::collections::HashMap<String, dlrm_ir::Tensor>| -> f64 {
        f64::from(run1(&t, &batch, p).0[0].to_f32_vec()[0])
    };
    let eps = 1e-3f32;
    let mut nonzero = 0;
    let mut checked = 0;
    for name in param_names(&fwd) {
        let w = params[&name].to_f32_vec();
        let w1 = stepped[&name].to_f32_vec();
        // Entries: first, last, and a few in between (all rows of small tables).
        let n = w.len();
        let mut entries: Vec<usize> = vec![0, n - 1, n / 2, n / 3];
        entries.sort_unstable();
        entries.dedup();
        for i in entries {
            let g_step = f64::from(w[i] - w1[i]) / f64::from(lr);
            let mut plus = params.clone();
            let mut minus = params.clone();
            plus.get_mut(&name).unwrap().as_f32_mut().unwrap()[i] += eps;
            minus.get_mut(&name).unwrap().as_f32_mut().unwrap()[i] -= eps;
            let fd = (loss_at(&plus) - loss_at(&minus)) / (2.0 * f64::from(eps));
            let tol = 2e-3 + 3e-2 * fd.abs().max(g_step.abs());
            assert!(
                (fd - g_step).abs() <= tol,
                "{}: d loss / d {name}[{i}]: finite difference {fd}, autodiff {g_step}",
                spec.name
            );
            checked += 1;
            if g_step.abs() > 1e-3 {
                nonzero += 1;
            }
        }
    }
    assert!(
        nonzero * 2 >= checked,
        "{}: only {nonzero} of {checked} checked gradients are non-zero",
        spec.name
    );
}

#[test]
fn gradients_match_finite_differences_dot_bce() {
    check_gradients(&Spec::dot(), LossKind::Bce);
}

#[test]
fn gradients_match_finite_differences_cat_mse() {
    check_gradients(&Spec::cat(), LossKind::Mse);
}

#[test]
fn gradients_match_finite_differences_offsets() {
    check_gradients(&Spec::offsets(), LossKind::Bce);
}

#[test]
fn gradients_match_finite_differences_shared_table() {
    check_gradients(&Spec::shared(), LossKind::Bce);
}

#[test]
fn gradients_match_finite_differences_value_used_twice() {
    check_gradients(&Spec::twice(), LossKind::Mse);
}

#[test]
fn gradients_match_finite_differences_concat_split_reshape() {
    check_gradients(&Spec::exotic(), LossKind::Bce);
}
