//! The pass `fuse-interaction-layout`: a dot interaction read only by its
//! `block_act` becomes `interaction_blocked` with the same values; one with
//! another reader, an exported result, a change of dtype or a `cat`
//! interaction stays as it is.

use dlrm_ir::interp::run;
use dlrm_ir::{DType, Dim, Graph, InteractionKind, Op, SingleRank, Tensor, TensorType, verify};
use dlrm_passes::interaction_layout::fuse_interaction_layout;
use std::collections::HashMap;

/// `f` operands of `d` columns, their interaction (`kind`), `block_act{bk,
/// dtype}` of it as the output; with `also`, the interaction's result is an
/// output too.
fn graph(kind: InteractionKind, dtype: DType, also: bool) -> Graph {
    let (f, d, bk) = (5, 6, 8);
    let mut g = Graph::new("inter");
    let ins: Vec<_> = (0..f)
        .map(|i| {
            g.add_input(
                &format!("e{i}"),
                TensorType::f32([Dim::batch(), Dim::Fixed(d)]),
            )
            .expect("builds")
        })
        .collect();
    let op = Op::Interaction {
        kind,
        self_interaction: false,
    };
    let r = g.add(op, &ins, "r").expect("builds");
    let rb = g
        .add(Op::BlockAct { bk, dtype }, &[r], "rb")
        .expect("builds");
    g.add_output(rb);
    if also {
        g.add_output(r);
    }
    g
}

fn ops(g: &Graph) -> Vec<&'static str> {
    g.nodes().iter().map(|n| n.op.mnemonic()).collect()
}

fn outputs(g: &Graph) -> Vec<Tensor> {
    let s = 7;
    let feeds: HashMap<String, Tensor> = (0..5)
        .map(|i| {
            let v: Vec<f32> = (0..s * 6)
                .map(|k| ((k * 7 + i * 13) % 17) as f32 / 8.0 - 1.0)
                .collect();
            (format!("e{i}"), Tensor::f32(vec![s, 6], v))
        })
        .collect();
    let syms = HashMap::from([("B".to_string(), s)]);
    run(g, &feeds, &mut HashMap::new(), &syms, &SingleRank).expect("runs")
}

#[test]
fn a_dot_interaction_read_only_by_its_block_act_is_fused_with_the_same_values() {
    let g = graph(InteractionKind::Dot, DType::F32, false);
    let (fused, n) = fuse_interaction_layout(&g, "fuse-interaction-layout").expect("the pass runs");
    assert_eq!(n, 1);
    assert_eq!(ops(&fused), ["interaction_blocked"]);
    verify(&fused).expect("a valid graph");
    let (a, b) = (outputs(&g), outputs(&fused));
    assert_eq!(a[0].shape, vec![2, 7, 8]);
    assert_eq!(a, b);
}

#[test]
fn other_readers_dtype_changes_and_cat_interactions_are_left_alone() {
    for (kind, dtype, also) in [
        (InteractionKind::Dot, DType::F32, true),
        (InteractionKind::Dot, DType::BF16, false),
        (InteractionKind::Cat, DType::F32, false),
    ] {
        let g = graph(kind, dtype, also);
        let (same, n) =
            fuse_interaction_layout(&g, "fuse-interaction-layout").expect("the pass runs");
        assert_eq!(n, 0, "{kind:?} {dtype:?} {also}");
        assert_eq!(ops(&same), ops(&g));
    }
}

/// The gradient read from its blocks: `interaction_grad` of an
/// `unblock_act` becomes `interaction_grad_blocked` with the same values; a
/// dtype change or a second reader of the rows keeps it.
#[test]
fn the_gradient_of_an_unblocked_dr_reads_the_blocks() {
    let grad_graph = |dtype: DType, also: bool| {
        let (f, d, bk, width) = (5, 6, 8, 16);
        let mut g = Graph::new("grad");
        let drb = g
            .add_input(
                "drb",
                TensorType::f32([Dim::Fixed(2), Dim::batch(), Dim::Fixed(bk)]),
            )
            .expect("builds");
        let ins: Vec<_> = (0..f)
            .map(|i| {
                let t = TensorType::f32([Dim::batch(), Dim::Fixed(d)]);
                g.add_input(&format!("e{i}"), t).expect("builds")
            })
            .collect();
        let dr = g
            .add(Op::UnblockAct { k: width, dtype }, &[drb], "dr")
            .expect("builds");
        let mut operands = vec![dr];
        operands.extend(&ins);
        let op = Op::InteractionGrad {
            kind: InteractionKind::Dot,
            self_interaction: false,
        };
        let names: Vec<String> = (0..f).map(|i| format!("de{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        for v in g.add_node(op, &operands, &names).expect("builds") {
            g.add_output(v);
        }
        if also {
            g.add_output(dr);
        }
        g
    };
    let g = grad_graph(DType::F32, false);
    let (fused, n) = fuse_interaction_layout(&g, "fuse-interaction-layout").expect("the pass runs");
    assert_eq!(n, 1);
    assert_eq!(ops(&fused), ["interaction_grad_blocked"]);
    verify(&fused).expect("a valid graph");
    let s = 7;
    let mut feeds: HashMap<String, Tensor> = (0..5)
        .map(|i| {
            let v: Vec<f32> = (0..s * 6)
                .map(|k| ((k * 5 + i * 11) % 13) as f32 / 8.0 - 0.7)
                .collect();
            (format!("e{i}"), Tensor::f32(vec![s, 6], v))
        })
        .collect();
    let v: Vec<f32> = (0..2 * s * 8)
        .map(|k| ((k * 3) % 19) as f32 / 16.0 - 0.5)
        .collect();
    feeds.insert("drb".into(), Tensor::f32(vec![2, s, 8], v));
    let syms = HashMap::from([("B".to_string(), s)]);
    let out = |g: &Graph| run(g, &feeds, &mut HashMap::new(), &syms, &SingleRank).expect("runs");
    assert_eq!(out(&g), out(&fused));
    for (dtype, also) in [(DType::BF16, false), (DType::F32, true)] {
        let g = grad_graph(dtype, also);
        let (same, n) =
            fuse_interaction_layout(&g, "fuse-interaction-layout").expect("the pass runs");
        assert_eq!(n, 0, "{dtype:?} {also}");
        assert_eq!(ops(&same), ops(&g));
    }
}
