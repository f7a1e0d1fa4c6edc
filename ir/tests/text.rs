//! The text form: print/parse round trips over graphs that use every op, the exact
//! canonical layout, parse errors with their line and column, modules, float
//! attributes, a no-panic property over mutated text, and the Graphviz export.

#![expect(
    clippy::unwrap_used,
    reason = "a test fails loudly on any unexpected error"
)]

use dlrm_ir::module::ModOp;
use dlrm_ir::{
    A2aDir, Act, DType, Dim, Graph, InteractionKind, IrError, MNEMONICS, Op, Pool, TensorType,
    ValueId, dot, text, verify,
};
use proptest::prelude::*;
use std::collections::BTreeSet;
use std::path::Path;

// ------------------------------------------------------------------ builders

fn b() -> Dim {
    Dim::batch()
}

fn d(n: usize) -> Dim {
    Dim::Fixed(n)
}

fn f32t(shape: &[Dim]) -> TensorType {
    TensorType::f32(shape.to_vec())
}

fn ty(dtype: DType, shape: &[Dim]) -> TensorType {
    TensorType::new(dtype, shape.to_vec())
}

/// Handles to the values of the small DLRM forward.
struct Fwd {
    g: Graph,
    dense: ValueId,
    idx0: ValueId,
    idx1: ValueId,
    off1: ValueId,
    emb0: ValueId,
    emb1: ValueId,
    bot_w: ValueId,
    bot_b: ValueId,
    top_w: ValueId,
    top_b: ValueId,
    h: ValueId,
    e0: ValueId,
    e1: ValueId,
    z: ValueId,
    p: ValueId,
}

/// A small DLRM forward: bottom MLP, a fixed-pooling and a variable-bag table, dot
/// interaction, top layer, sigmoid.
fn forward(name: &str) -> Fwd {
    let mut g = Graph::new(name);
    let dense = g.add_input("dense", f32t(&[b(), d(4)])).unwrap();
    let idx0 = g.add_input("idx.0", ty(DType::I64, &[b(), d(2)])).unwrap();
    let idx1 = g
        .add_input("idx.1", ty(DType::I32, &[Dim::Sym("N".into())]))
        .unwrap();
    let off1 = g.add_input("off.1", ty(DType::I32, &[b()])).unwrap();
    let emb0 = g.add_param("emb.0", f32t(&[d(50), d(8)])).unwrap();
    let emb1 = g.add_param("emb.1", f32t(&[d(20), d(8)])).unwrap();
    let bot_w = g.add_param("bot.0.w", f32t(&[d(8), d(4)])).unwrap();
    let bot_b = g.add_param("bot.0.b", f32t(&[d(8)])).unwrap();
    let top_w = g.add_param("top.0.w", f32t(&[d(1), d(11)])).unwrap();
    let top_b = g.add_param("top.0.b", f32t(&[d(1)])).unwrap();
    let h = g
        .add(Op::Linear { act: Act::Relu }, &[dense, bot_w, bot_b], "h")
        .unwrap();
    let e0 = g
        .add(
            Op::EmbeddingBag {
                mode: Pool::Sum,
                last_offset: false,
            },
            &[emb0, idx0],
            "e.0",
        )
        .unwrap();
    let e1 = g
        .add(
            Op::EmbeddingBag {
                mode: Pool::Mean,
                last_offset: false,
            },
            &[emb1, idx1, off1],
            "e.1",
        )
        .unwrap();
    let z = g
        .add(
            Op::Interaction {
                kind: InteractionKind::Dot,
                self_interaction: false,
            },
            &[h, e0, e1],
            "z",
        )
        .unwrap();
    let t = g
        .add(Op::Linear { act: Act::None }, &[z, top_w, top_b], "t")
        .unwrap();
    let p = g.add(Op::Sigmoid, &[t], "prob").unwrap();
    Fwd {
        g,
        dense,
        idx0,
        idx1,
        off1,
        emb0,
        emb1,
        bot_w,
        bot_b,
        top_w,
        top_b,
        h,
        e0,
        e1,
        z,
        p,
    }
}

fn dlrm_forward() -> Graph {
    let mut f = forward("dlrm_fwd");
    f.g.add_output(f.p);
    f.g
}

/// The forward plus loss, backward, optimizer and updates (as the autodiff pass
/// would write it).
fn dlrm_train() -> Graph {
    let f = forward("dlrm_train");
    let mut g = f.g;
    let label = g.add_input("label", f32t(&[b(), d(1)])).unwrap();
    let bden = || Dim::batch();
    let loss = g
        .add(Op::Bce { denom: bden() }, &[f.p, label], "loss")
        .unwrap();
    let dp = g
        .add(Op::BceGrad { denom: bden() }, &[f.p, label], "d.prob")
        .unwrap();
    let dt = g.add(Op::SigmoidGrad, &[dp, f.p], "d.t").unwrap();
    let dz = g.add(Op::LinearDx, &[dt, f.top_w], "d.z").unwrap();
    let dtw = g.add(Op::LinearDw, &[dt, f.z], "d.top.0.w").unwrap();
    let dtb = g.add(Op::LinearDb, &[dt], "d.top.0.b").unwrap();
    let grads = g
        .add_node(
            Op::InteractionGrad {
                kind: InteractionKind::Dot,
                self_interaction: false,
            },
            &[dz, f.h, f.e0, f.e1],
            &["d.h", "d.e.0", "d.e.1"],
        )
        .unwrap();
    let dh = g.add(Op::ReluGrad, &[grads[0], f.h], "d.h.pre").unwrap();
    let dbw = g.add(Op::LinearDw, &[dh, f.dense], "d.bot.0.w").unwrap();
    let dbb = g.add(Op::LinearDb, &[dh], "d.bot.0.b").unwrap();
    // linear_dx of the bottom layer is dead in DLRM but must print all the same.
    let _ddense = g.add(Op::LinearDx, &[dh, f.bot_w], "d.dense").unwrap();
    let r0 = g
        .add(
            Op::EmbeddingBagGrad {
                mode: Pool::Sum,
                last_offset: false,
            },
            &[grads[1], f.idx0],
            "rows.0",
        )
        .unwrap();
    let r1 = g
        .add(
            Op::EmbeddingBagGrad {
                mode: Pool::Mean,
                last_offset: false,
            },
            &[grads[2], f.idx1, f.off1],
            "rows.1",
        )
        .unwrap();
    let lr = 0.05;
    let mut updates = Vec::new();
    for (w, gr) in [
        (f.bot_w, dbw),
        (f.bot_b, dbb),
        (f.top_w, dtw),
        (f.top_b, dtb),
    ] {
        let name = format!("{}.new", g.name_of(w));
        let w2 = g.add(Op::Sgd { lr }, &[w, gr], &name).unwrap();
        updates.push((w, w2));
    }
    let t0 = g
        .add(Op::SparseSgd { lr }, &[f.emb0, f.idx0, r0], "emb.0.new")
        .unwrap();
    let t1 = g
        .add(
            Op::SparseSgd { lr: 1e-3 },
            &[f.emb1, f.idx1, r1],
            "emb.1.new",
        )
        .unwrap();
    updates.push((f.emb0, t0));
    updates.push((f.emb1, t1));
    g.add_output(loss);
    for (w, w2) in updates {
        g.add_update(w, w2).unwrap();
    }
    g
}

/// Shape plumbing with symbols: split/concat/reshape, bf16, add, relu, cat and
/// self-dot interaction (and its gradient), mse with a symbolic and a fixed denom.
fn shapes() -> Graph {
    let mut g = Graph::new("shapes-and-symbols");
    let x = g.add_input("x", ty(DType::BF16, &[b(), d(12)])).unwrap();
    let y = g.add_input("y", f32t(&[b(), d(12)])).unwrap();
    let parts = g
        .add_node(
            Op::Split {
                axis: 1,
                sizes: vec![4, 8],
            },
            &[x],
            &["lo", "hi"],
        )
        .unwrap();
    let c = g
        .add(Op::Concat { axis: 1 }, &[parts[1], parts[0]], "swapped")
        .unwrap();
    let r = g
        .add(
            Op::Reshape {
                shape: vec![b(), d(3), d(4)],
            },
            &[c],
            "cube",
        )
        .unwrap();
    let r2 = g
        .add(
            Op::Reshape {
                shape: vec![d(12), b()],
            },
            &[r],
            "flat",
        )
        .unwrap();
    let r3 = g
        .add(
            Op::Reshape {
                shape: vec![b(), d(12)],
            },
            &[r2],
            "back",
        )
        .unwrap();
    let q = g.add(Op::Relu, &[r3], "q").unwrap();
    let s = g.add(Op::Add, &[q, y], "s").unwrap();
    let cat = g
        .add(
            Op::Interaction {
                kind: InteractionKind::Cat,
                self_interaction: false,
            },
            &[s, q],
            "cat",
        )
        .unwrap();
    let dot = g
        .add(
            Op::Interaction {
                kind: InteractionKind::Dot,
                self_interaction: true,
            },
            &[s, y],
            "dot",
        )
        .unwrap();
    let dgrads = g
        .add_node(
            Op::InteractionGrad {
                kind: InteractionKind::Cat,
                self_interaction: false,
            },
            &[cat, s, q],
            &["d.s", "d.q"],
        )
        .unwrap();
    let m = g.add(Op::Mse { denom: b() }, &[s, y], "mse").unwrap();
    let dm = g
        .add(Op::MseGrad { denom: d(4) }, &[s, y], "d.mse")
        .unwrap();
    for v in [m, dm, dot, dgrads[0], dgrads[1]] {
        g.add_output(v);
    }
    g
}

/// Rank `rank` of a hybrid-parallel training step over `counts.len()` ranks, where
/// rank `r` owns `counts[r]` tables (each `[40,8]`, two lookups per sample).
fn partitioned(rank: usize, counts: &[usize]) -> Graph {
    let mut g = Graph::new(format!("dlrm.rank{rank}"));
    let total: usize = counts.iter().sum();
    let own = counts[rank];
    let dense = g.add_input("dense", f32t(&[b(), d(8)])).unwrap();
    let label = g.add_input("label", f32t(&[b(), d(1)])).unwrap();
    let mut idx = Vec::new();
    let mut tables = Vec::new();
    for t in 0..own {
        idx.push(
            g.add_input(&format!("idx.{t}"), ty(DType::I64, &[Dim::global(), d(2)]))
                .unwrap(),
        );
    }
    for t in 0..own {
        tables.push(
            g.add_param(&format!("emb.{t}"), f32t(&[d(40), d(8)]))
                .unwrap(),
        );
    }
    let width = 8 + (total + 1) * (total + 2) / 2;
    let top_w = g.add_param("top.0.w", f32t(&[d(1), d(width)])).unwrap();
    let top_b = g.add_param("top.0.b", f32t(&[d(1)])).unwrap();
    let mut bags = Vec::new();
    for t in 0..own {
        bags.push(
            g.add(
                Op::EmbeddingBag {
                    mode: Pool::Sum,
                    last_offset: false,
                },
                &[tables[t], idx[t]],
                &format!("e.{t}"),
            )
            .unwrap(),
        );
    }
    let a2a = |dir| Op::AllToAll {
        dir,
        counts: counts.to_vec(),
        rank,
    };
    let names: Vec<String> = (0..total).map(|k| format!("x.{k}")).collect();
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let declared = vec![f32t(&[b(), d(8)]); total];
    let xs = g
        .add_node_typed(a2a(A2aDir::Scatter), &bags, &name_refs, &declared)
        .unwrap();
    let mut fwd = vec![dense];
    fwd.extend(&xs);
    let inter = Op::Interaction {
        kind: InteractionKind::Dot,
        self_interaction: true,
    };
    let z = g.add(inter.clone(), &fwd, "z").unwrap();
    let p = g
        .add(Op::Linear { act: Act::Sigmoid }, &[z, top_w, top_b], "prob")
        .unwrap();
    let loss = g
        .add(
            Op::Bce {
                denom: Dim::global(),
            },
            &[p, label],
            "loss",
        )
        .unwrap();
    let gloss = g.add(Op::AllReduce, &[loss], "loss.global").unwrap();
    let dp = g
        .add(
            Op::BceGrad {
                denom: Dim::global(),
            },
            &[p, label],
            "d.prob",
        )
        .unwrap();
    let dz = g.add(Op::LinearDx, &[dp, top_w], "d.z").unwrap();
    let dtw = g.add(Op::LinearDw, &[dp, z], "d.top.0.w").unwrap();
    let dtb = g.add(Op::LinearDb, &[dp], "d.top.0.b").unwrap();
    let reduced = g
        .add_node(
            Op::AllReduce,
            &[dtw, dtb],
            &["d.top.0.w.sum", "d.top.0.b.sum"],
        )
        .unwrap();
    let mut gi = vec![dz];
    gi.extend(&fwd);
    let gnames: Vec<String> = std::iter::once("d.dense".to_string())
        .chain((0..total).map(|k| format!("d.x.{k}")))
        .collect();
    let gname_refs: Vec<&str> = gnames.iter().map(String::as_str).collect();
    let grads = g
        .add_node(
            Op::InteractionGrad {
                kind: InteractionKind::Dot,
                self_interaction: true,
            },
            &gi,
            &gname_refs,
        )
        .unwrap();
    let w2 = g
        .add(Op::Sgd { lr: 0.1 }, &[top_w, reduced[0]], "top.0.w.new")
        .unwrap();
    let b2 = g
        .add(Op::Sgd { lr: 0.1 }, &[top_b, reduced[1]], "top.0.b.new")
        .unwrap();
    g.add_output(gloss);
    g.add_update(top_w, w2).unwrap();
    g.add_update(top_b, b2).unwrap();
    if own > 0 {
        let own_names: Vec<String> = (0..own).map(|t| format!("d.e.{t}")).collect();
        let own_refs: Vec<&str> = own_names.iter().map(String::as_str).collect();
        let gathered = g
            .add_node(a2a(A2aDir::Gather), &grads[1..], &own_refs)
            .unwrap();
        for t in 0..own {
            let rows = g
                .add(
                    Op::EmbeddingBagGrad {
                        mode: Pool::Sum,
                        last_offset: false,
                    },
                    &[gathered[t], idx[t]],
                    &format!("rows.{t}"),
                )
                .unwrap();
            let t2 = g
                .add(
                    Op::SparseSgd { lr: 0.1 },
                    &[tables[t], idx[t], rows],
                    &format!("emb.{t}.new"),
                )
                .unwrap();
            g.add_update(tables[t], t2).unwrap();
        }
    }
    g
}

fn all_graphs() -> Vec<Graph> {
    vec![
        dlrm_forward(),
        dlrm_train(),
        shapes(),
        partitioned(0, &[1, 2, 0]),
        partitioned(1, &[1, 2, 0]),
        partitioned(2, &[1, 2, 0]),
        // ---- fused / blocked ops (e-graph, precision)
        fused_ops(),
        split_sgd(),
        // ---- sharded embeddings
        sharded_ops(),
        // ---- generic ops (ONNX import)
        generic_ops(),
        gelu(),
        adagrad(),
        jagged(),
    ]
}

/// A jagged batch's per-key bags (the round-trip case
/// `text_cases/roundtrip/offsets_from_lengths.ir`).
fn jagged() -> Graph {
    let src = include_str!("text_cases/roundtrip/offsets_from_lengths.ir");
    text::parse(src).unwrap()
}

/// The Adagrad updates (the round-trip case `text_cases/roundtrip/adagrad.ir`).
fn adagrad() -> Graph {
    let src = include_str!("text_cases/roundtrip/adagrad.ir");
    text::parse(src).unwrap()
}

/// `gelu` and its gradient (whose second operand is the forward input).
fn gelu() -> Graph {
    let mut g = Graph::new("gelu");
    let ty = TensorType::f32([Dim::batch(), Dim::Fixed(8)]);
    let x = g.add_input("x", ty.clone()).unwrap();
    let dy = g.add_input("dy", ty).unwrap();
    let y = g.add(ModOp::op("gelu"), &[x], "y").unwrap();
    let dx = g.add(ModOp::op("gelu_grad"), &[dy, x], "dx").unwrap();
    g.add_output(y);
    g.add_output(dx);
    g
}

// ---- fused / blocked ops (e-graph, precision)
/// Every fused/blocked op but `split_sgd`.
fn fused_ops() -> Graph {
    text::parse(
        "graph @fused {
  input %x: f32[B,5]
  input %y: f32[B,3]
  input %idx: i64[B,2]
  param %w: f32[2,2,4,2]
  param %wh: bf16[3,5]
  param %b: f32[3]
  param %t: f32[6,3]
  %xb: bf16[2,B,4] = block_act %x {bk=4, dtype=bf16}
  %yb: f32[2,B,2] = brgemm %xb, %w, %b {act=relu}
  %z: f32[B,3] = unblock_act %yb {k=3, dtype=f32}
  %wb: bf16[2,2,4,2] = block_weight %wh {bn=2, bk=4}
  %wu: bf16[3,5] = unblock_weight %wb {n=3, k=5}
  %dyb: f32[2,B,2] = block_act %y {bk=2, dtype=f32}
  %dxb: f32[2,B,4] = brgemm_dgrad %dyb, %yb, %w {act=relu}
  %dzb: f32[2,B,4] = brgemm_dgrad %dyb, %yb, %w, %xb {act=relu, mask=relu}
  %dw: f32[2,2,4,2], %db: f32[3] = brgemm_wgrad %dyb, %yb, %xb {act=relu, n=3}
  %l: f32[] = bce_logits %z, %y {denom=B}
  %g: f32[B,3] = bce_logits_grad %z, %y {denom=B}
  %t2: f32[6,3] = embedding_update %t, %y, %idx {mode=sum, lr=0.5}
  output %l
  output %wu
  output %dxb
  output %dzb
  output %dw
  output %db
  output %g
  output %t2
}
",
    )
    .unwrap()
}

/// Split-SGD-BF16.
fn split_sgd() -> Graph {
    text::parse(
        "graph @split {
  input %g: f32[4]
  input %dy: f32[B,3]
  input %idx: i64[B,2]
  param %w: bf16[4]
  param %w.lo: bf16[4]
  param %t: bf16[6,3]
  param %t.lo: bf16[6,3]
  %w2: bf16[4], %lo2: bf16[4] = split_sgd %w, %w.lo, %g {lr=0.25}
  %t2: bf16[6,3], %t.lo2: bf16[6,3] = split_embedding_update %t, %t.lo, %dy, %idx {mode=sum, lr=0.5}
  output %w2
  update %w <- %w2
  update %w.lo <- %lo2
  update %t <- %t2
  update %t.lo <- %t.lo2
}
",
    )
    .unwrap()
}

/// Asserts both round trips: `parse(print(g)) == g` and `print(parse(s)) == s`.
fn assert_round_trip(g: &Graph) {
    verify(g).unwrap();
    let s = text::print(g);
    let back = text::parse(&s).unwrap_or_else(|e| panic!("{e}\n{s}"));
    assert_eq!(&back, g, "parse(print(g)) differs for\n{s}");
    assert_eq!(text::print(&back), s);
}

fn parse_err(src: &str) -> (usize, usize, String) {
    match text::parse(src) {
        Err(IrError::Parse { line, col, reason }) => (line, col, reason),
        other => panic!("expected a parse error, got {other:?}"),
    }
}

// ------------------------------------------------------------ round trips

/// Every op of the op table, and no other op but module ops (`gelu`), which
/// are not in the table.
#[test]
fn test_graphs_use_every_op() {
    let used: BTreeSet<&str> = all_graphs()
        .iter()
        .flat_map(|g| {
            g.nodes()
                .iter()
                .filter(|n| !matches!(n.op, Op::Module(_)))
                .map(|n| n.op.mnemonic())
                .collect::<Vec<_>>()
        })
        .collect();
    let all: BTreeSet<&str> = MNEMONICS.iter().copied().collect();
    assert_eq!(used, all);
}

#[test]
fn every_graph_round_trips() {
    for g in all_graphs() {
        assert_round_trip(&g);
    }
}

#[test]
fn forward_prints_canonically() {
    let want = "\
graph @dlrm_fwd {
  input %dense: f32[B,4]
  input %idx.0: i64[B,2]
  input %idx.1: i32[N]
  input %off.1: i32[B]
  param %emb.0: f32[50,8]
  param %emb.1: f32[20,8]
  param %bot.0.w: f32[8,4]
  param %bot.0.b: f32[8]
  param %top.0.w: f32[1,11]
  param %top.0.b: f32[1]
  %h: f32[B,8] = linear %dense, %bot.0.w, %bot.0.b {act=relu}
  %e.0: f32[B,8] = embedding_bag %emb.0, %idx.0 {mode=sum}
  %e.1: f32[B,8] = embedding_bag %emb.1, %idx.1, %off.1 {mode=mean}
  %z: f32[B,11] = interaction %h, %e.0, %e.1 {kind=dot, self=false}
  %t: f32[B,1] = linear %z, %top.0.w, %top.0.b {act=none}
  %prob: f32[B,1] = sigmoid %t
  output %prob
}
";
    assert_eq!(text::print(&dlrm_forward()), want);
    assert_eq!(text::parse(want).unwrap(), dlrm_forward());
}

#[test]
fn multi_result_and_collective_lines() {
    let s = text::print(&partitioned(0, &[1, 2, 0]));
    assert!(s.contains(
        "  %x.0: f32[B,8], %x.1: f32[B,8], %x.2: f32[B,8] = all_to_all %e.0 \
         {dir=scatter, counts=[1,2,0], rank=0}\n"
    ));
    assert!(s.contains("  %loss: f32[] = bce %prob, %label {denom=G}\n"));
    assert!(s.contains("  update %emb.0 <- %emb.0.new\n}\n"));
    // A rank that owns no table scatters from no operands.
    let s = text::print(&partitioned(2, &[1, 2, 0]));
    assert!(s.contains(" = all_to_all {dir=scatter, counts=[1,2,0], rank=2}\n"));
}

#[test]
fn round_trip_cases_are_canonical() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/text_cases/roundtrip");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "ir") {
            continue;
        }
        let src = std::fs::read_to_string(&path).unwrap();
        // The header is the leading comment lines.
        let body: String = src
            .lines()
            .skip_while(|l| l.starts_with(';'))
            .map(|l| format!("{l}\n"))
            .collect();
        let graphs = text::parse_module(&src).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(!graphs.is_empty(), "{}", path.display());
        assert_eq!(text::print_module(&graphs), body, "{}", path.display());
        n += 1;
    }
    assert!(n >= 2, "expected the round-trip cases in {}", dir.display());
}

/// The examples in `docs/ir.md` parse, and are canonical, so the doc cannot rot.
#[test]
fn doc_examples_parse() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/ir.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let blocks: Vec<&str> = doc.split("```").skip(1).step_by(2).collect();
    let mut n = 0;
    for block in blocks {
        if !block.starts_with('\n') || !block.contains("graph @") || block.contains("%<") {
            continue;
        }
        let graphs = text::parse_module(block).unwrap_or_else(|e| panic!("{e}\n{block}"));
        assert_eq!(graphs.len(), 1);
        let body: String = block
            .lines()
            .skip(1)
            .skip_while(|l| l.starts_with(';'))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(text::print(&graphs[0]), body);
        n += 1;
    }
    assert_eq!(n, 2, "the two examples of {}", path.display());
}

#[test]
fn floats_round_trip_bit_exactly() {
    let lrs = [
        0.05f32,
        0.1,
        1e-7,
        -2.5,
        3.0,
        -0.0,
        0.0,
        f32::MAX,
        f32::MIN_POSITIVE,
        1e-45,
        123456790.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ];
    for lr in lrs {
        let mut g = Graph::new("lr");
        let w = g.add_param("w", f32t(&[d(2)])).unwrap();
        let gr = g.add_input("g", f32t(&[d(2)])).unwrap();
        let w2 = g.add(Op::Sgd { lr }, &[w, gr], "w2").unwrap();
        g.add_update(w, w2).unwrap();
        let s = text::print(&g);
        let back = text::parse(&s).unwrap();
        match back.nodes()[0].op {
            Op::Sgd { lr: got } => assert_eq!(got.to_bits(), lr.to_bits(), "{s}"),
            ref other => panic!("{other:?}"),
        }
        assert_eq!(text::print(&back), s);
    }
    // NaN prints as `NaN` and reads back as a NaN.
    let src = "graph @n {\n  param %w: f32[2]\n  input %g: f32[2]\n  \
               %w2: f32[2] = sgd %w, %g {lr=NaN}\n}\n";
    match text::parse(src).unwrap().nodes()[0].op {
        Op::Sgd { lr } => assert!(lr.is_nan()),
        ref other => panic!("{other:?}"),
    }
}

#[test]
fn attribute_value_forms() {
    // An integer learning rate is accepted (and prints as a float); `-inf`, exponent
    // forms; a fixed denom; an identifier where a symbol is expected.
    let src = "graph @a {\n  param %w: f32[2]\n  input %g: f32[2]\n  input %p: f32[B]\n  \
               %w2: f32[2] = sgd %w, %g {lr=1}\n  %w3: f32[2] = sgd %w2, %g {lr=-inf}\n  \
               %w4: f32[2] = sgd %w3, %g {lr=2.5E-3}\n  \
               %l: f32[] = mse %p, %p {denom=7}\n  %m: f32[] = mse %p, %p {denom=Batch}\n}\n";
    let g = text::parse(src).unwrap();
    let ops: Vec<&Op> = g.nodes().iter().map(|n| &n.op).collect();
    assert_eq!(ops[0], &Op::Sgd { lr: 1.0 });
    assert_eq!(
        ops[1],
        &Op::Sgd {
            lr: f32::NEG_INFINITY
        }
    );
    assert_eq!(ops[2], &Op::Sgd { lr: 2.5e-3 });
    assert_eq!(ops[3], &Op::Mse { denom: d(7) });
    assert_eq!(
        ops[4],
        &Op::Mse {
            denom: Dim::Sym("Batch".into())
        }
    );
    assert!(text::print(&g).contains("{lr=1.0}"));
}

#[test]
fn comments_whitespace_and_crlf_are_ignored() {
    let src = "; leading comment\r\n\r\ngraph   @dlrm_fwd{ ; trailing\r\n\
               input %dense :f32[ B , 4 ]\tinput %idx.0: i64[B,2]\n\
               input %idx.1: i32[N] input %off.1: i32[B]\n\
               param %emb.0: f32[50,8] param %emb.1: f32[20,8]\n\
               param %bot.0.w: f32[8,4] param %bot.0.b: f32[8]\n\
               param %top.0.w: f32[1,11] param %top.0.b: f32[1]\n\
               %h: f32[B,8] = linear %dense,%bot.0.w,%bot.0.b{act=relu}\n\
               %e.0: f32[B,8] = embedding_bag %emb.0, %idx.0 { mode = sum }\n\
               %e.1: f32[B,8] = embedding_bag %emb.1, %idx.1, %off.1 {mode=mean}\n\
               %z: f32[B,11] = interaction %h, %e.0, %e.1 {self=false, kind=dot}\n\
               %t: f32[B,1] = linear %z, %top.0.w, %top.0.b {act=none}\n\
               %prob: f32[B,1] = sigmoid %t output %prob }";
    assert_eq!(text::parse(src).unwrap(), dlrm_forward());
}

#[test]
fn value_names_may_start_with_digits() {
    let src = "graph @0-g.x {\n  input %0: f32[B,4]\n  %1: f32[B,4] = relu %0\n  output %1\n}\n";
    let g = text::parse(src).unwrap();
    assert_eq!(g.name, "0-g.x");
    assert_eq!(text::print(&g), src);
    assert!(text::is_value_name("0.a_b"));
    assert!(!text::is_value_name("a-b"));
    assert!(!text::is_value_name(""));
    assert!(text::is_graph_name("a-b.0"));
    assert!(!text::is_graph_name("a b"));
}

// ---------------------------------------------------------------- modules

#[test]
fn module_of_three_graphs() {
    let graphs = vec![
        partitioned(0, &[1, 2, 0]),
        partitioned(1, &[1, 2, 0]),
        partitioned(2, &[1, 2, 0]),
    ];
    let s = text::print_module(&graphs);
    assert_eq!(s.matches("graph @").count(), 3);
    let back = text::parse_module(&s).unwrap();
    assert_eq!(back, graphs);
    assert_eq!(text::print_module(&back), s);
    // `parse` wants exactly one graph and points at the second.
    let second_line = s.lines().position(|l| l == "graph @dlrm.rank1 {").unwrap() + 1;
    let (line, col, reason) = parse_err(&s);
    assert_eq!((line, col), (second_line, 1));
    assert!(reason.contains("found 3"), "{reason}");
}

#[test]
fn empty_module_and_empty_graph() {
    assert_eq!(text::parse_module("; nothing here\n").unwrap(), vec![]);
    assert_eq!(
        parse_err("; nothing\n"),
        (2, 1, "expected `graph`, found end of input".to_string())
    );
    let g = text::parse("graph @empty {\n}\n").unwrap();
    assert_eq!(g, Graph::new("empty"));
    assert_eq!(text::print(&g), "graph @empty {\n}\n");
}

#[test]
fn module_verifier_errors_name_the_graph() {
    let src = "graph @ok {\n  input %x: f32[B,4]\n  %y: f32[B,4] = relu %x\n}\n\
               graph @bad {\n  input %x: f32[B,4]\n  %y: f32[B,5] = relu %x\n}\n";
    let err = text::parse_module(src).unwrap_err();
    assert!(matches!(err, IrError::Node { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("node #0 %y (`relu`)"), "{msg}");
    assert!(msg.contains("in graph `bad`"), "{msg}");
}

// ------------------------------------------------------------ parse errors

const HEAD: &str = "graph @g {\n  input %x: f32[B,4]\n  param %w: f32[8,4]\n  param %b: f32[8]\n";

#[test]
fn error_expected_equals() {
    let src = format!("{HEAD}  %h: f32[B,8] linear %x, %w, %b {{act=relu}}\n}}\n");
    assert_eq!(
        parse_err(&src),
        (5, 16, "expected `=`, found `linear`".to_string())
    );
}

#[test]
fn error_unknown_op() {
    let src = format!("{HEAD}  %h: f32[B,8] = lineer %x, %w, %b {{act=relu}}\n}}\n");
    let (line, col, reason) = parse_err(&src);
    assert_eq!((line, col), (5, 18));
    assert!(
        reason.starts_with("unknown op `lineer` (expected one of: embedding_bag, linear,"),
        "{reason}"
    );
}

#[test]
fn error_unknown_value() {
    let src = format!("{HEAD}  %h: f32[B,8] = linear %x, %v, %b {{act=relu}}\n}}\n");
    assert_eq!(parse_err(&src), (5, 29, "unknown value %v".to_string()));
    // Use before definition is an unknown name too.
    let src = format!("{HEAD}  output %h\n  %h: f32[B,8] = linear %x, %w, %b {{act=relu}}\n}}\n");
    assert_eq!(parse_err(&src), (5, 10, "unknown value %h".to_string()));
}

#[test]
fn error_bad_attribute_value() {
    let src = format!("{HEAD}  %h: f32[B,8] = linear %x, %w, %b {{act=relux}}\n}}\n");
    assert_eq!(
        parse_err(&src),
        (
            5,
            41,
            "attribute `act`: `act` must be none, relu or sigmoid, got `relux`".to_string()
        )
    );
}

#[test]
fn error_missing_and_unknown_attributes() {
    let src = format!("{HEAD}  %h: f32[B,8] = linear %x, %w, %b\n}}\n");
    assert_eq!(
        parse_err(&src),
        (5, 18, "op `linear`: missing attribute `act`".to_string())
    );
    let src = format!("{HEAD}  %r: f32[B,4] = relu %x {{act=relu}}\n}}\n");
    assert_eq!(
        parse_err(&src),
        (
            5,
            27,
            "attribute `act`: op `relu` has no attribute `act`".to_string()
        )
    );
    let src = format!("{HEAD}  %r: f32[B,4] = concat %x {{axis=1, axis=1}}\n}}\n");
    assert_eq!(
        parse_err(&src),
        (5, 37, "attribute `axis` is given twice".to_string())
    );
    let src = format!("{HEAD}  %r: f32[B,4] = concat %x {{axis=-1}}\n}}\n");
    assert_eq!(
        parse_err(&src),
        (
            5,
            34,
            "attribute `axis`: attribute `axis` must be a non-negative integer, got `-1`"
                .to_string()
        )
    );
}

#[test]
fn error_types() {
    let src = "graph @g {\n  input %x: f33[B,4]\n}\n";
    assert_eq!(
        parse_err(src),
        (
            2,
            13,
            "unknown element type `f33` (expected f32, bf16, i64 or i32)".to_string()
        )
    );
    let src = "graph @g {\n  input %x: f32[B,-4]\n}\n";
    assert_eq!(
        parse_err(src),
        (
            2,
            19,
            "a dimension must be a non-negative integer or a symbol, found `-4`".to_string()
        )
    );
    let src = "graph @g {\n  input %x: f32[B 4]\n}\n";
    assert_eq!(
        parse_err(src),
        (2, 19, "expected `,` or `]`, found `4`".to_string())
    );
}

#[test]
fn error_lexical_and_end_of_input() {
    let src = format!("{HEAD}  %r: f32[B,4] = relu $x\n}}\n");
    assert_eq!(
        parse_err(&src),
        (5, 23, "unexpected character `$`".to_string())
    );
    let src = format!("{HEAD}  %r: f32[B,4] = relu %x\n");
    let (line, col, reason) = parse_err(&src);
    assert_eq!((line, col), (6, 1));
    assert!(reason.ends_with("found end of input"), "{reason}");
    let src = "graph g {\n}\n";
    assert_eq!(
        parse_err(src),
        (1, 7, "expected a graph name `@name`, found `g`".to_string())
    );
}

#[test]
fn error_definitions_and_updates() {
    let src = format!("{HEAD}  input %w: f32[2]\n}}\n");
    assert_eq!(
        parse_err(&src),
        (5, 9, "value %w is defined twice".to_string())
    );
    let src = format!("{HEAD}  %a: f32[B,4], %a: f32[B,4] = relu %x\n}}\n");
    assert_eq!(
        parse_err(&src),
        (5, 17, "value %a is defined twice".to_string())
    );
    let src = format!("{HEAD}  %r: f32[B,4] = relu %x\n  update %x <- %r\n}}\n");
    assert_eq!(
        parse_err(&src),
        (6, 10, "update target %x is not a parameter".to_string())
    );
    let src = format!("{HEAD}  update %w = %x\n}}\n");
    assert_eq!(
        parse_err(&src),
        (5, 13, "expected `<-`, found `=`".to_string())
    );
}

#[test]
fn verifier_errors_come_back_unchanged() {
    let src = format!("{HEAD}  %h: f32[B,8] = linear %x, %w, %w {{act=relu}}\n}}\n");
    let err = text::parse(&src).unwrap_err();
    assert_eq!(
        err,
        IrError::Node {
            node: "#0 %h".into(),
            op: "linear".into(),
            reason: "bias must have rank 1, got f32[8,4]".into(),
        }
    );
}

#[test]
fn huge_dimensions_are_errors_not_panics() {
    let max = usize::MAX;
    for body in [
        format!(
            "input %x: f32[B,2]\n  %a: f32[B,1], %b: f32[B,1] = split %x {{axis=1, sizes=[{max},3]}}"
        ),
        format!("input %x: f32[B,{max}]\n  %a: f32[B,1] = concat %x, %x {{axis=1}}"),
        format!(
            "input %x: f32[B,{max}]\n  %a: f32[B,1] = interaction %x, %x {{kind=cat, self=false}}"
        ),
        format!("input %x: f32[B,{max}]\n  %a: f32[B,1] = interaction %x {{kind=dot, self=true}}"),
        format!("%a: f32[B,1] = all_to_all {{dir=scatter, counts=[0,{max},1], rank=0}}"),
    ] {
        let src = format!("graph @huge {{\n  {body}\n}}\n");
        let err = text::parse(&src).unwrap_err();
        assert!(matches!(err, IrError::Node { .. }), "{err:?}");
    }
}

// ------------------------------------------------------------ no panics

fn mutate(base: &str, edits: &[(u8, usize, char)]) -> String {
    let mut chars: Vec<char> = base.chars().collect();
    for &(kind, at, c) in edits {
        if chars.is_empty() {
            chars.push(c);
            continue;
        }
        let i = at % chars.len();
        match kind {
            0 => {
                chars.remove(i);
            }
            1 => {
                let dup = chars[i];
                chars.insert(i, dup);
            }
            2 => chars[i] = c,
            _ => chars.insert(i, c),
        }
    }
    chars.into_iter().collect()
}

const ALPHABET: &[char] = &[
    '%', '@', '{', '}', '[', ']', ':', ',', '=', '<', '-', ';', '.', '_', ' ', '\n', '0', '1', '9',
    'B', 'G', 'e', 'x', 'é', '\t', '"',
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn mutated_text_never_panics(
        which in 0usize..6,
        edits in prop::collection::vec(
            (0u8..4, any::<usize>(), prop::sample::select(ALPHABET)),
            1..6,
        ),
    ) {
        let base = text::print(&all_graphs()[which]);
        let src = mutate(&base, &edits);
        let _ = text::parse_module(&src);
        // Whatever parses is a valid graph that round-trips.
        if let Ok(g) = text::parse(&src) {
            let printed = text::print(&g);
            if !printed.contains("NaN") {
                prop_assert_eq!(text::parse(&printed).unwrap(), g);
            }
        }
    }

    #[test]
    fn random_text_never_panics(src in "[%@{}\\[\\]:,=<;. a-z0-9A-Z\n-]{0,200}") {
        let _ = text::parse(&src);
        let _ = text::parse_module(&src);
    }

    #[test]
    fn any_float_round_trips(bits in any::<u32>()) {
        let lr = f32::from_bits(bits);
        let attrs = Op::Sgd { lr }.attrs();
        let printed = attrs[0].1.to_string();
        let src = format!(
            "graph @f {{\n  param %w: f32[2]\n  input %g: f32[2]\n  \
             %w2: f32[2] = sgd %w, %g {{lr={printed}}}\n}}\n"
        );
        let g = text::parse(&src).unwrap();
        match g.nodes()[0].op {
            Op::Sgd { lr: got } if lr.is_nan() => prop_assert!(got.is_nan()),
            Op::Sgd { lr: got } => prop_assert_eq!(got.to_bits(), bits),
            ref other => prop_assert!(false, "{:?}", other),
        }
    }
}

// ------------------------------------------------------------------- dot

/// Checks braces balance outside quoted strings and that quotes pair up.
fn assert_well_formed_dot(s: &str) {
    let (mut depth, mut in_str, mut escaped) = (0i64, false, false);
    for c in s.chars() {
        if in_str {
            match (escaped, c) {
                (false, '\\') => escaped = true,
                (false, '"') => in_str = false,
                _ => escaped = false,
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                assert!(depth >= 0, "unbalanced braces in\n{s}");
            }
            _ => {}
        }
    }
    assert!(!in_str, "unterminated string in\n{s}");
    assert_eq!(depth, 0, "unbalanced braces in\n{s}");
    assert!(s.starts_with("digraph \""));
}

#[test]
fn dot_has_a_box_per_node_and_an_edge_per_use() {
    for g in all_graphs() {
        let s = dot::to_dot(&g);
        assert_well_formed_dot(&s);
        for (n, node) in g.nodes().iter().enumerate() {
            let line = s
                .lines()
                .find(|l| l.starts_with(&format!("  n{n} [")))
                .unwrap_or_else(|| panic!("no box for node {n} in\n{s}"));
            assert!(line.contains(node.op.mnemonic()), "{line}");
            assert_eq!(line.contains("#fdba74"), node.op.is_collective(), "{line}");
        }
        let uses: usize = g.nodes().iter().map(|n| n.inputs.len()).sum();
        let edges = s.matches("->").count();
        assert_eq!(edges, uses + g.outputs().len() + g.updates().len(), "{s}");
        for &p in g.params() {
            let label = format!("%{}\\n{}", g.name_of(p), g.ty(p));
            assert!(s.contains(&label), "param {label} missing in\n{s}");
        }
        for (i, &o) in g.outputs().iter().enumerate() {
            assert!(s.contains(&format!("out{i} [label=\"output %{}\"", g.name_of(o))));
        }
    }
}

#[test]
fn dot_labels_edges_with_types_and_shows_attributes() {
    let s = dot::to_dot(&dlrm_forward());
    assert!(s.contains("v0 -> n0 [label=\"f32[B,4]\"];"), "{s}");
    assert!(s.contains("\"%h = linear\\nact=relu\""), "{s}");
    assert!(s.contains("n5 -> out0 [label=\"f32[B,1]\"];"), "{s}");
    // Results of multi-result nodes are named on their edges.
    let s = dot::to_dot(&shapes());
    assert!(s.contains("n0 -> n1 [label=\"%hi: bf16[B,8]\"];"), "{s}");
}

#[test]
fn dot_escapes_and_sizes_big_tables() {
    let mut g = Graph::new("q\"uote\\d");
    let x = g.add_input("x\"y", f32t(&[b(), d(4)])).unwrap();
    let _t = g.add_param("big", f32t(&[d(1_000_000), d(64)])).unwrap();
    // Absurd sizes are drawn without overflowing.
    let _huge = g.add_param("huge", f32t(&[d(usize::MAX), d(2)])).unwrap();
    let r = g.add(Op::Relu, &[x], "r\"}").unwrap();
    g.add_output(r);
    let s = dot::to_dot(&g);
    assert_well_formed_dot(&s);
    assert!(s.starts_with("digraph \"q\\\"uote\\\\d\" {"), "{s}");
    assert!(s.contains("%x\\\"y"), "{s}");
    assert!(s.contains("%big\\nf32[1000000,64]\\n244.1 MiB"), "{s}");
}

// ---- generic ops (ONNX import)

/// A graph using every generic op of the ONNX import.
fn generic_ops() -> Graph {
    use dlrm_ir::{BinaryKind, Pool};
    let f = |d: &[usize]| TensorType::f32(d.iter().map(|&k| Dim::Fixed(k)));
    let i64t = |d: &[usize]| TensorType::new(DType::I64, d.iter().map(|&k| Dim::Fixed(k)));
    let mut g = Graph::new("generic");
    let x = g
        .add_input("x", TensorType::f32([Dim::batch(), Dim::Fixed(4)]))
        .unwrap();
    let w = g.add_param("w", f(&[4, 2])).unwrap();
    let idx = g.add_input("idx", i64t(&[3])).unwrap();
    let off = g
        .add_input("off", TensorType::new(DType::I64, [Dim::batch()]))
        .unwrap();
    let psw = g.add_input("psw", f(&[3])).unwrap();
    let nd = g.add_input("nd", i64t(&[2, 2])).unwrap();
    let m = g.add(Op::MatMul, &[x, w], "m").unwrap();
    let b = g
        .add(
            Op::Binary {
                kind: BinaryKind::Div,
            },
            &[m, m],
            "b",
        )
        .unwrap();
    let t = g
        .add(Op::Transpose { perm: vec![1, 0] }, &[w], "t")
        .unwrap();
    let ga = g.add(Op::Gather { axis: 1 }, &[t, idx], "ga").unwrap();
    let ge = g
        .add(Op::GatherElements { axis: 0 }, &[w, nd], "ge")
        .unwrap();
    let gn = g
        .add(Op::GatherNd { batch_dims: 0 }, &[w, nd], "gn")
        .unwrap();
    let s = g
        .add(
            Op::Slice {
                axes: vec![1],
                starts: vec![0],
                ends: vec![Dim::Fixed(2)],
                steps: vec![2],
            },
            &[ga],
            "s",
        )
        .unwrap();
    let r = g
        .add(
            Op::Reduce {
                kind: Pool::Mean,
                axes: vec![0, 1],
                keepdims: true,
            },
            &[b],
            "r",
        )
        .unwrap();
    let c = g.add(Op::Cast { to: DType::I32 }, &[gn], "c").unwrap();
    let eb = g
        .add(Op::EmbeddingBagWeighted, &[w, idx, off, psw], "eb")
        .unwrap();
    for v in [s, r, c, ge, eb] {
        g.add_output(v);
    }
    g
}

/// The sharded embedding ops of the partition pass (row-wise and replicated tables).
fn sharded_ops() -> Graph {
    let src = "graph @sharded {
  input %idx: i64[G,2]
  input %dy: f32[G,4]
  param %t.rows5_10: f32[5,4]
  param %s.rows5_10: bf16[5,4]
  param %s.lo.rows5_10: bf16[5,4]
  %e: f32[G,4] = embedding_bag_rows %t.rows5_10, %idx {mode=mean, lo=5, rows=10}
  %rg: f32[G,2,4] = embedding_bag_grad %dy, %idx {mode=mean}
  %t1: f32[5,4] = sparse_sgd_rows %t.rows5_10, %idx, %rg {lr=0.5, lo=5, rows=10}
  %t2: f32[5,4] = embedding_update_rows %t1, %dy, %idx {mode=sum, lr=0.5, lo=5, rows=10}
  %gd: f32[10,4] = embedding_grad_dense %dy, %idx {mode=sum, rows=10}
  %s1: bf16[5,4], %s1.lo: bf16[5,4] = split_embedding_update_rows %s.rows5_10, %s.lo.rows5_10, %dy, %idx {mode=sum, lr=0.5, lo=5, rows=10}
  output %e
  output %gd
  update %t.rows5_10 <- %t2
  update %s.rows5_10 <- %s1
  update %s.lo.rows5_10 <- %s1.lo
}
";
    dlrm_ir::text::parse(src).unwrap()
}
