//! The autodiff pass: structure of the training graph, errors, and gradients
//! against finite differences of the loss (through the reference interpreter).

#![allow(clippy::unwrap_used)]

mod common;

use common::{Batch, Rng, Spec, count, init_params, make_batch, run1};
use dlrm_ir::module::ModOp;
use dlrm_ir::{Act, DType, Dim, Graph, InteractionKind, Op, Pool, Tensor, TensorType, verify};
use dlrm_passes::autodiff::autodiff;
use dlrm_passes::{LossKind, Optimizer, PassError, TrainConfig};
use std::collections::HashMap;

const BCE: TrainConfig = TrainConfig {
    loss: LossKind::Bce,
    lr: 0.5,
    optimizer: Optimizer::Sgd,
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
        optimizer: Optimizer::Sgd,
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
    check_gradients_of(spec.name, &spec.build(), loss, |t| make_batch(t, 6, 7));
}

/// [`check_gradients`] of a forward graph with a batch made for its training graph.
fn check_gradients_of(name: &str, fwd: &Graph, loss: LossKind, batch: impl Fn(&Graph) -> Batch) {
    let lr = 1.0;
    let t = autodiff(
        fwd,
        &TrainConfig {
            loss,
            lr,
            optimizer: Optimizer::Sgd,
        },
    )
    .unwrap();
    let batch = batch(&t);
    let params = init_params(fwd, 3);
    let (_, stepped) = run1(&t, &batch, &params);
    let loss_at = |p: &std::collections::HashMap<String, dlrm_ir::Tensor>| -> f64 {
        f64::from(run1(&t, &batch, p).0[0].to_f32_vec()[0])
    };
    let eps = 1e-3f32;
    let mut nonzero = 0;
    let mut checked = 0;
    for pname in param_names(fwd) {
        let w = params[&pname].to_f32_vec();
        let w1 = stepped[&pname].to_f32_vec();
        // Entries: first, last, and a few in between (all rows of small tables).
        let n = w.len();
        let mut entries: Vec<usize> = vec![0, n - 1, n / 2, n / 3];
        entries.sort_unstable();
        entries.dedup();
        for i in entries {
            let g_step = f64::from(w[i] - w1[i]) / f64::from(lr);
            let mut plus = params.clone();
            let mut minus = params.clone();
            plus.get_mut(&pname).unwrap().as_f32_mut().unwrap()[i] += eps;
            minus.get_mut(&pname).unwrap().as_f32_mut().unwrap()[i] -= eps;
            let fd = (loss_at(&plus) - loss_at(&minus)) / (2.0 * f64::from(eps));
            let tol = 2e-3 + 3e-2 * fd.abs().max(g_step.abs());
            assert!(
                (fd - g_step).abs() <= tol,
                "{name}: d loss / d {pname}[{i}]: finite difference {fd}, autodiff {g_step}"
            );
            checked += 1;
            if g_step.abs() > 1e-3 {
                nonzero += 1;
            }
        }
    }
    assert!(
        nonzero * 2 >= checked,
        "{name}: only {nonzero} of {checked} checked gradients are non-zero"
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

/// `dense -> linear -> gelu -> linear{sigmoid}`: `gelu`'s gradient is
/// `gelu_grad(dy, x)` on the forward *input*, and the step matches finite
/// differences of the loss.
#[test]
fn gelu_gradient_reads_the_input_and_matches_finite_differences() {
    let (b, f) = (Dim::batch, Dim::Fixed);
    let mut g = Graph::new("gelu_mlp");
    let dense = g.add_input("dense", TensorType::f32([b(), f(3)])).unwrap();
    let w0 = g.add_param("bot.w", TensorType::f32([f(4), f(3)])).unwrap();
    let b0 = g.add_param("bot.b", TensorType::f32([f(4)])).unwrap();
    let z = g
        .add(Op::Linear { act: Act::None }, &[dense, w0, b0], "z")
        .unwrap();
    let h = g.add(ModOp::op("gelu"), &[z], "h").unwrap();
    let w1 = g.add_param("top.w", TensorType::f32([f(1), f(4)])).unwrap();
    let b1 = g.add_param("top.b", TensorType::f32([f(1)])).unwrap();
    let p = g
        .add(Op::Linear { act: Act::Sigmoid }, &[h, w1, b1], "p")
        .unwrap();
    g.add_output(p);
    verify(&g).unwrap();
    let t = autodiff(&g, &BCE).unwrap();
    assert_eq!(count(&t, "gelu_grad"), 1);
    let node = t
        .nodes()
        .iter()
        .find(|n| n.op == ModOp::op("gelu_grad"))
        .unwrap();
    assert_eq!(t.name_of(node.inputs[0]), "d.h");
    assert_eq!(t.name_of(node.inputs[1]), "z");
    check_gradients_of("gelu_mlp", &g, LossKind::Bce, |t| make_batch(t, 6, 7));
}

/// `dense -> linear -> x`; table `emb` serves a weighted bag (`idx`, `off`, per-
/// sample weights `psw` as inputs) and a fixed-pooling bag; dot interaction; top.
fn weighted_model(weights_from_param: bool) -> Graph {
    let b = Dim::batch;
    let f = Dim::Fixed;
    let mut g = Graph::new("weighted");
    let dense = g.add_input("dense", TensorType::f32([b(), f(3)])).unwrap();
    let n = Dim::Sym("N".into());
    let idx = g
        .add_input("idx", TensorType::new(DType::I64, [n.clone()]))
        .unwrap();
    let off = g
        .add_input("off", TensorType::new(DType::I64, [b()]))
        .unwrap();
    let idx2 = g
        .add_input("idx2", TensorType::new(DType::I64, [b(), f(2)]))
        .unwrap();
    let psw = g.add_input("psw", TensorType::f32([n.clone()])).unwrap();
    let emb = g.add_param("emb", TensorType::f32([f(9), f(4)])).unwrap();
    let w0 = g.add_param("bot.w", TensorType::f32([f(4), f(3)])).unwrap();
    let b0 = g.add_param("bot.b", TensorType::f32([f(4)])).unwrap();
    let x = g
        .add(Op::Linear { act: Act::Relu }, &[dense, w0, b0], "x")
        .unwrap();
    let psw = if weights_from_param {
        let s = g.add_param("scale", TensorType::f32([n])).unwrap();
        g.add(Op::Add, &[psw, s], "psw.scaled").unwrap()
    } else {
        psw
    };
    let e0 = g
        .add(Op::EmbeddingBagWeighted, &[emb, idx, off, psw], "e0")
        .unwrap();
    let e1 = g
        .add(
            Op::EmbeddingBag {
                mode: Pool::Sum,
                last_offset: false,
            },
            &[emb, idx2],
            "e1",
        )
        .unwrap();
    let op = Op::Interaction {
        kind: InteractionKind::Dot,
        self_interaction: false,
    };
    let r = g.add(op, &[x, e0, e1], "r").unwrap();
    let w1 = g.add_param("top.w", TensorType::f32([f(1), f(7)])).unwrap();
    let b1 = g.add_param("top.b", TensorType::f32([f(1)])).unwrap();
    let p = g
        .add(Op::Linear { act: Act::Sigmoid }, &[r, w1, b1], "prob")
        .unwrap();
    g.add_output(p);
    verify(&g).unwrap();
    g
}

/// A batch of 5 for [`weighted_model`]'s training graph: bags of 0..=3 rows
/// (an empty one included), weights in [-1.5, 1.5), labels 0/1.
fn weighted_batch(t: &Graph) -> Batch {
    let mut rng = Rng(11);
    let sizes = [2usize, 0, 3, 1, 3];
    let n: usize = sizes.iter().sum();
    let mut offs = Vec::new();
    let mut acc = 0i64;
    for &s in &sizes {
        offs.push(acc);
        acc += s as i64;
    }
    let label = t
        .inputs()
        .iter()
        .map(|&v| t.name_of(v))
        .find(|n| n.starts_with("label"))
        .unwrap()
        .to_string();
    let inputs = HashMap::from([
        (
            "dense".to_string(),
            Tensor::f32(vec![5, 3], (0..15).map(|_| rng.uniform(1.0)).collect()),
        ),
        (
            "idx".to_string(),
            Tensor::i64(vec![n], (0..n).map(|_| rng.below(9) as i64).collect()),
        ),
        ("off".to_string(), Tensor::i64(vec![5], offs)),
        (
            "idx2".to_string(),
            Tensor::i64(vec![5, 2], (0..10).map(|_| rng.below(9) as i64).collect()),
        ),
        (
            "psw".to_string(),
            Tensor::f32(vec![n], (0..n).map(|_| rng.uniform(1.5)).collect()),
        ),
        (
            label,
            Tensor::f32(vec![5, 1], (0..5).map(|i| (i % 2) as f32).collect()),
        ),
    ]);
    Batch {
        inputs,
        syms: HashMap::from([("B".to_string(), 5), ("N".to_string(), n)]),
        bag_sizes: HashMap::new(),
    }
}

/// A per-sample-weighted bag trains its table: the row gradient is the sum bag's
/// scaled by the weights (`embedding_bag_grad` with the weights as its fourth
/// operand), applied by `sparse_sgd` (chained with the same table's unweighted
/// bag), and matches finite differences of the loss.
#[test]
fn weighted_bag_gradients_match_finite_differences() {
    let fwd = weighted_model(false);
    let t = autodiff(&fwd, &BCE).unwrap();
    assert_eq!(count(&t, "embedding_bag_grad"), 2);
    assert_eq!(count(&t, "sparse_sgd"), 2);
    let scaled: Vec<_> = t
        .nodes()
        .iter()
        .filter(|n| n.op.mnemonic() == "embedding_bag_grad" && n.inputs.len() == 4)
        .collect();
    assert_eq!(scaled.len(), 1);
    let psw = t.find("psw").unwrap();
    assert_eq!(scaled[0].inputs[3], psw, "the weights scale the rows");
    assert!(
        t.nodes()
            .iter()
            .any(|n| n.op.mnemonic() == "sparse_sgd" && n.inputs[2] == scaled[0].outputs[0]),
        "the weighted row gradient updates the table"
    );
    check_gradients_of("weighted", &fwd, LossKind::Bce, weighted_batch);
    check_gradients_of("weighted", &fwd, LossKind::Mse, weighted_batch);
}

/// Per-sample weights computed from a parameter have no gradient rule: an error
/// naming the node.
#[test]
fn weighted_bag_with_trained_weights_is_unsupported() {
    let err = autodiff(&weighted_model(true), &BCE)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("%e0") && err.contains("per-sample weights %psw.scaled"),
        "{err}"
    );
}

/// DLRM-DCNv2 (`examples/dlrm-dcnv2-tiny.json`: two `cross` layers): gradients of
/// every parameter, the cross layers' among them, against finite differences.
fn dcn_forward() -> Graph {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/dlrm-dcnv2-tiny.json"
    );
    dlrm_json::ModelSpec::load(path).unwrap().graph().unwrap()
}

#[test]
fn gradients_match_finite_differences_dcn() {
    check_gradients_of("dcn", &dcn_forward(), LossKind::Bce, |t| {
        make_batch(t, 6, 7)
    });
}

/// The `save-activations` pass turns every `cross` / `cross_grad` pair into
/// `cross_save` / `cross_grad_saved`, and the training step computes bit for bit
/// the same loss and updated parameters.
#[test]
fn saved_activations_train_bit_for_bit_like_recomputing_ones() {
    let fwd = dcn_forward();
    let t = autodiff(&fwd, &BCE).unwrap();
    let s = dlrm_passes::saved::save(&t).unwrap();
    verify(&s).unwrap();
    let mnemonics = |g: &Graph, m: &str| g.nodes().iter().filter(|n| n.op.mnemonic() == m).count();
    assert_eq!(mnemonics(&t, "cross_grad"), 2);
    assert_eq!(mnemonics(&s, "cross_save"), 2);
    assert_eq!(mnemonics(&s, "cross_grad_saved"), 2);
    assert_eq!(mnemonics(&s, "cross") + mnemonics(&s, "cross_grad"), 0);
    let batch = make_batch(&t, 6, 7);
    let params = init_params(&fwd, 3);
    let (loss_t, p_t) = run1(&t, &batch, &params);
    let (loss_s, p_s) = run1(&s, &batch, &params);
    assert_eq!(loss_t[0].to_f32_vec(), loss_s[0].to_f32_vec());
    for (name, v) in &p_t {
        assert_eq!(v.to_f32_vec(), p_s[name].to_f32_vec(), "{name}");
    }
}

/// The `contract-cross` pass turns every cross layer and its gradient into
/// blocked GEMMs (`brgemm`, `brgemm_dgrad`, `brgemm_wgrad`) and `cross_mix` /
/// `cross_mix_grad`, reusing the forward's `z` and `w`; the training step
/// computes bit for bit the same loss and updated parameters, with block sizes
/// that divide the dims and ones that pad them (`--block 3`: D=32 and R=4 padded).
#[test]
fn contracted_cross_layers_train_bit_for_bit_like_cross() {
    let fwd = dcn_forward();
    let t = autodiff(&fwd, &BCE).unwrap();
    let batch = make_batch(&t, 6, 7);
    let params = init_params(&fwd, 3);
    let (loss_t, p_t) = run1(&t, &batch, &params);
    let mnemonics = |g: &Graph, m: &str| g.nodes().iter().filter(|n| n.op.mnemonic() == m).count();
    for block in [None, Some(3), Some(64)] {
        let (c, layers) = dlrm_passes::cross::contract(&t, block).unwrap();
        verify(&c).unwrap();
        assert_eq!(layers, 4, "two layers, forward and gradient");
        assert_eq!(mnemonics(&c, "cross") + mnemonics(&c, "cross_grad"), 0);
        assert_eq!(mnemonics(&c, "cross_mix"), 2);
        assert_eq!(mnemonics(&c, "cross_mix_grad"), 2);
        // z and w per layer: the gradient recomputes neither.
        assert_eq!(mnemonics(&c, "brgemm"), 4, "{block:?}");
        assert_eq!(mnemonics(&c, "brgemm_dgrad"), 4);
        assert_eq!(mnemonics(&c, "brgemm_wgrad"), 4);
        let (loss_c, p_c) = run1(&c, &batch, &params);
        assert_eq!(loss_t[0].to_f32_vec(), loss_c[0].to_f32_vec(), "{block:?}");
        for (name, v) in &p_t {
            assert_eq!(v.to_f32_vec(), p_c[name].to_f32_vec(), "{name} {block:?}");
        }
    }
    // The inference graph alone (no gradient) is contracted too.
    let (c, layers) = dlrm_passes::cross::contract(&fwd, None).unwrap();
    assert_eq!(layers, 2);
    assert_eq!(mnemonics(&c, "cross_mix"), 2);
}
