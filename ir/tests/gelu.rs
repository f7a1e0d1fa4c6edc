//! The `gelu` module op and its gradient beyond the hand values, finite
//! differences, text form and kernels tested elsewhere (`interp.rs`,
//! `gradcheck.rs`, `text.rs`, `codegen/tests/jit_ops.rs`): its decomposition
//! into primitive ops (what the exporter writes before opset 20) against the op,
//! its ONNX facts, its work count and its shape rule's errors.

use dlrm_ir::interp::run;
use dlrm_ir::module::{ModOp, ONNX_DEFAULT_DOMAIN, OnnxAttr, OnnxNode, decompose_modules};
use dlrm_ir::{DType, Dim, Graph, Op, SingleRank, Tensor, TensorType, infer};
use std::collections::HashMap;

/// `y = gelu(x)`, `dx = gelu_grad(dy, x)` on `[4, 5]` operands of `dtype`.
fn graph(dtype: DType) -> Graph {
    let mut g = Graph::new("gelu");
    let ty = TensorType::new(dtype, [Dim::Fixed(4), Dim::Fixed(5)]);
    let x = g.add_input("x", ty.clone()).expect("input");
    let dy = g.add_input("dy", ty).expect("input");
    let y = g.add(ModOp::op("gelu"), &[x], "y").expect("gelu");
    let dx = g
        .add(ModOp::op("gelu_grad"), &[dy, x], "dx")
        .expect("gelu_grad");
    g.add_output(y);
    g.add_output(dx);
    g
}

/// `n` values spread over [-6, 6] (both tails and the curved middle).
fn spread(n: usize, phase: f32) -> Vec<f32> {
    (0..n)
        .map(|i| 6.0 * ((i as f32 * 0.77 + phase).sin()))
        .collect()
}

#[test]
fn decomposition_computes_the_same_values() {
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::BF16, 1.0 / 128.0)] {
        let g = graph(dtype);
        let flat = decompose_modules(&g).expect("decomposes");
        assert!(
            flat.graph
                .nodes()
                .iter()
                .all(|n| !matches!(n.op, Op::Module(_))),
            "primitive ops only"
        );
        assert!(!flat.constants.is_empty(), "its constants are parameters");
        let inputs: HashMap<String, Tensor> = [
            (
                "x".into(),
                Tensor::from_f32(dtype, vec![4, 5], spread(20, 0.0)),
            ),
            (
                "dy".into(),
                Tensor::from_f32(dtype, vec![4, 5], spread(20, 1.0)),
            ),
        ]
        .into();
        let syms = HashMap::new();
        let want = run(&g, &inputs, &mut HashMap::new(), &syms, &SingleRank).expect("op");
        let mut consts: HashMap<String, Tensor> = flat.constants.into_iter().collect();
        let got = run(&flat.graph, &inputs, &mut consts, &syms, &SingleRank).expect("flat");
        for (k, (w, o)) in want.iter().zip(&got).enumerate() {
            assert_eq!(w.dtype(), o.dtype(), "{dtype} output {k}");
            assert_eq!(w.shape, o.shape, "{dtype} output {k}");
            for (i, (a, b)) in w.to_f32_vec().iter().zip(o.to_f32_vec()).enumerate() {
                assert!(
                    (a - b).abs() <= tol * (1.0 + a.abs()),
                    "{dtype} output {k}[{i}]: {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn onnx_facts() {
    let tanh = || OnnxNode::new("Gelu", ONNX_DEFAULT_DOMAIN, 20);
    let want = tanh().with("approximate", OnnxAttr::Str("tanh".into()));
    let Op::Module(gelu) = ModOp::op("gelu") else {
        unreachable!("a module op")
    };
    assert_eq!(gelu.onnx(), Some(want.clone()));
    let Op::Module(grad) = ModOp::op("gelu_grad") else {
        unreachable!("a module op")
    };
    assert_eq!(grad.onnx(), None);
    // Import: the tanh form (`ai.onnx` is the default domain), nothing else.
    let mut ai = want.clone();
    ai.domain = "ai.onnx".into();
    for node in [want, ai] {
        let op = dlrm_ir::module::onnx_import(&node)
            .expect("gelu's")
            .expect("tanh");
        assert_eq!(op, ModOp::op("gelu"));
    }
    let refused = |node: OnnxNode| {
        dlrm_ir::module::onnx_import(&node)
            .expect("gelu's")
            .expect_err("refused")
    };
    assert!(refused(tanh()).contains("approximate=\"none\""));
    let odd = tanh()
        .with("approximate", OnnxAttr::Str("tanh".into()))
        .with("alpha", OnnxAttr::Float(1.0));
    assert!(refused(odd).contains("unsupported attribute `alpha`"));
    let other = OnnxNode::new("Gelu", "com.example", 1);
    assert!(dlrm_ir::module::onnx_import(&other).is_none());
}

#[test]
fn work_counts_every_element() {
    let t = TensorType::new(DType::BF16, [Dim::batch(), Dim::Fixed(8)]);
    let dim = |d: &Dim| d.fixed().unwrap_or(16) as f64;
    let Op::Module(gelu) = ModOp::op("gelu") else {
        unreachable!("a module op")
    };
    let w = gelu.def().work(&gelu, &[&t], &[&t], &dim);
    assert_eq!(w.flops, 9.0 * 128.0);
    assert_eq!(w.bytes, 2.0 * 2.0 * 128.0);
}

#[test]
fn shape_errors_name_the_operand() {
    let f = TensorType::f32([Dim::Fixed(4)]);
    let g = TensorType::f32([Dim::Fixed(5)]);
    let i = TensorType::new(DType::I64, [Dim::Fixed(4)]);
    let err =
        |op: &str, ins: &[&TensorType]| infer(&ModOp::op(op), ins, &[]).expect_err("an error");
    assert!(err("gelu", &[&f, &f]).contains("takes 1 operand (operand), got 2"));
    assert!(err("gelu", &[&i]).contains("operand must be f32 or bf16"));
    assert!(err("gelu_grad", &[&f]).contains("takes 2 operands (dy, x), got 1"));
    assert!(err("gelu_grad", &[&f, &i]).contains("x must be f32 or bf16"));
    assert!(err("gelu_grad", &[&f, &g]).contains("must have the same shape"));
}
