//! Dimension expressions (`B+1`, `F*B`) in types: the text form reads back what it
//! prints, `bind_symbols` solves a symbol from an expression's size or checks it,
//! a slice of a `B+1` axis to `B` runs, and a graph substitutes a symbol.

#![expect(clippy::unwrap_used, reason = "tests fail loudly")]

use dlrm_ir::interp::{bind_symbols, run};
use dlrm_ir::{DType, Dim, DimExpr, Graph, Op, Pool, SingleRank, Tensor, TensorType, text};
use std::collections::HashMap;

fn expr(s: &str) -> Dim {
    Dim::from_expr(DimExpr::parse(s).unwrap()).unwrap()
}

/// `embedding_bag(table, ids, offsets[..B])` with `offsets: i64[B+1]`.
fn last_offset_graph() -> Graph {
    let mut g = Graph::new("last_offset");
    let t = g
        .add_input(
            "table",
            TensorType::new(DType::F32, [Dim::Fixed(4), Dim::Fixed(2)]),
        )
        .unwrap();
    let ids = g
        .add_input("ids", TensorType::new(DType::I64, [Dim::Sym("N".into())]))
        .unwrap();
    let off = g
        .add_input("offsets", TensorType::new(DType::I64, [expr("B+1")]))
        .unwrap();
    let s = g
        .add(
            Op::Slice {
                axes: vec![0],
                starts: vec![0],
                ends: vec![Dim::batch()],
                steps: vec![1],
            },
            &[off],
            "bounds",
        )
        .unwrap();
    assert_eq!(g.ty(s).shape, vec![Dim::batch()]);
    let y = g
        .add(
            Op::EmbeddingBag {
                mode: Pool::Sum,
                last_offset: false,
            },
            &[t, ids, s],
            "y",
        )
        .unwrap();
    g.add_output(y);
    g
}

#[test]
fn expressions_normalise_and_the_text_form_reads_them_back() {
    assert_eq!(expr("B+1").to_string(), "B+1");
    assert_eq!(expr("1+B"), expr("B+1"));
    assert_eq!(expr("F*B"), expr("B*F"));
    assert_eq!(expr("B+1-1"), Dim::batch());
    assert_eq!(expr("3"), Dim::Fixed(3));
    assert!(matches!(expr("B*2+1"), Dim::Expr(_)));
    let g = last_offset_graph();
    let src = text::print(&g);
    assert!(
        src.contains("i64[B+1]") && src.contains("ends=[B]"),
        "{src}"
    );
    let back = text::parse(&src).unwrap();
    assert_eq!(text::print(&back), src);
    let src2 = "graph @g {\n  input %x: f32[B*F,B-1,N*2+3]\n  output %x\n}\n";
    let g2 = text::parse(src2).unwrap();
    assert_eq!(text::print(&g2), src2);
}

#[test]
fn binding_solves_a_symbol_from_an_expression_and_checks_it() {
    let g = last_offset_graph();
    let table = Tensor::f32(vec![4, 2], vec![1., 2., 3., 4., 5., 6., 7., 8.]);
    let ids = Tensor::i64(vec![4], vec![1, 0, 3, 2]);
    // Offsets alone carry B: `B+1 = 4` gives B = 3 (bags [0,2) [2,2) [2,4)).
    let ins: HashMap<String, Tensor> = [
        ("table".to_string(), table.clone()),
        ("ids".to_string(), ids.clone()),
        (
            "offsets".to_string(),
            Tensor::i64(vec![4], vec![0, 2, 2, 4]),
        ),
    ]
    .into_iter()
    .collect();
    let syms = bind_symbols(&g, &ins, &HashMap::new()).unwrap();
    assert_eq!(syms["B"], 3);
    let out = run(&g, &ins, &mut HashMap::new(), &syms, &SingleRank).unwrap();
    assert_eq!(
        out[0],
        Tensor::f32(vec![3, 2], vec![4., 6., 0., 0., 12., 14.])
    );
    // An empty offsets vector has no B.
    let mut bad = ins.clone();
    bad.insert("offsets".into(), Tensor::i64(vec![0], vec![]));
    let e = bind_symbols(&g, &bad, &HashMap::new())
        .unwrap_err()
        .to_string();
    assert!(e.contains("offsets") && e.contains("B+1"), "{e}");
}

#[test]
fn binding_checks_an_expression_against_a_symbol_bound_elsewhere() {
    let mut g = Graph::new("g");
    let x = g
        .add_input("x", TensorType::new(DType::F32, [Dim::batch()]))
        .unwrap();
    let o = g
        .add_input("o", TensorType::new(DType::I64, [expr("B+1")]))
        .unwrap();
    g.add_output(x);
    g.add_output(o);
    let mk = |b: usize, n: usize| -> HashMap<String, Tensor> {
        [
            ("x".to_string(), Tensor::f32(vec![b], vec![0.; b])),
            ("o".to_string(), Tensor::i64(vec![n], vec![0; n])),
        ]
        .into_iter()
        .collect()
    };
    assert_eq!(
        bind_symbols(&g, &mk(7, 8), &HashMap::new()).unwrap()["B"],
        7
    );
    let e = bind_symbols(&g, &mk(7, 7), &HashMap::new())
        .unwrap_err()
        .to_string();
    assert!(e.contains("B+1 is 7 here but 8"), "{e}");
}

#[test]
fn a_graph_substitutes_a_symbol_in_types_and_attributes() {
    let mut g = Graph::new("g");
    let o = g
        .add_input("o", TensorType::new(DType::I64, [Dim::Sym("n".into())]))
        .unwrap();
    let s = g
        .add(
            Op::Slice {
                axes: vec![0],
                starts: vec![0],
                ends: vec![expr("n-1")],
                steps: vec![1],
            },
            &[o],
            "s",
        )
        .unwrap();
    g.add_output(s);
    assert_eq!(g.ty(s).shape, vec![expr("n-1")]);
    g.substitute("n", &DimExpr::parse("B+1").unwrap()).unwrap();
    assert_eq!(g.ty(o).shape, vec![expr("B+1")]);
    assert_eq!(g.ty(s).shape, vec![Dim::batch()]);
    let src = text::print(&g);
    assert!(src.contains("ends=[B]"), "{src}");
    dlrm_ir::verify(&g).unwrap();
}

#[test]
fn a_symbolic_slice_must_stay_within_its_axis() {
    let x = TensorType::new(DType::I64, [expr("B+1")]);
    let op = |end: Dim, step: usize| Op::Slice {
        axes: vec![0],
        starts: vec![0],
        ends: vec![end],
        steps: vec![step],
    };
    assert!(dlrm_ir::infer(&op(expr("B+2"), 1), &[&x], &[]).is_err());
    assert!(dlrm_ir::infer(&op(Dim::Sym("N".into()), 1), &[&x], &[]).is_err());
    assert!(dlrm_ir::infer(&op(Dim::batch(), 2), &[&x], &[]).is_err());
    let t = dlrm_ir::infer(&op(expr("B+1"), 1), &[&x], &[]).unwrap();
    assert_eq!(t[0].shape, vec![expr("B+1")]);
    // A constant end is within `B+1` whatever B is (the first offset: `[0:1]`);
    // one past it is not, nor is `B-1` within `B` (B may be 0).
    let t = dlrm_ir::infer(&op(Dim::Fixed(1), 1), &[&x], &[]).unwrap();
    assert_eq!(t[0].shape, vec![Dim::Fixed(1)]);
    let err = dlrm_ir::infer(&op(Dim::Fixed(2), 1), &[&x], &[]).unwrap_err();
    assert!(
        err.to_string().contains("not provably at or below B+1"),
        "{err}"
    );
    let b = TensorType::new(DType::I64, [Dim::batch()]);
    assert!(dlrm_ir::infer(&op(expr("B-1"), 1), &[&b], &[]).is_ok());
    assert!(dlrm_ir::infer(&op(Dim::Fixed(1), 1), &[&b], &[]).is_err());
}
