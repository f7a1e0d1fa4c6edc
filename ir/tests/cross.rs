//! The `cross` module op (DCN-v2's low-rank cross layer) and its gradient: hand
//! values, central finite differences, its decomposition into primitive ops, the
//! text form and the shape rule's errors; the elementwise step `cross_mix` and its
//! gradient (`contract-cross`'s epilogue) against `cross`.

use dlrm_ir::interp::{EvalCtx, eval_op, run};
use dlrm_ir::module::{ModOp, decompose_modules};
use dlrm_ir::{Dim, Graph, Op, SingleRank, Tensor, TensorType, infer, text};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;

fn randn(r: &mut ChaCha8Rng, shape: &[usize]) -> Tensor {
    let n = shape.iter().product();
    Tensor::f32(
        shape.to_vec(),
        (0..n).map(|_| r.random::<f32>() * 2.0 - 1.0).collect(),
    )
}

fn ty(t: &Tensor) -> TensorType {
    TensorType::new(t.dtype(), t.shape.iter().map(|&d| Dim::Fixed(d)))
}

fn eval(op: &Op, ins: &[&Tensor]) -> Vec<Tensor> {
    let tys: Vec<TensorType> = ins.iter().map(|t| ty(t)).collect();
    let refs: Vec<&TensorType> = tys.iter().collect();
    let outs = infer(op, &refs, &[]).expect("infer");
    let syms = HashMap::new();
    let ctx = EvalCtx {
        syms: &syms,
        comm: &SingleRank,
    };
    eval_op(op, ins, &outs, &ctx).expect("eval")
}

/// `x0, x, v, u, b` of a layer with batch `s`, width `d`, rank `r`.
fn layer(seed: u64, s: usize, d: usize, r: usize) -> Vec<Tensor> {
    let mut g = ChaCha8Rng::seed_from_u64(seed);
    vec![
        randn(&mut g, &[s, d]),
        randn(&mut g, &[s, d]),
        randn(&mut g, &[r, d]),
        randn(&mut g, &[d, r]),
        randn(&mut g, &[d]),
    ]
}

#[test]
fn cross_by_hand() {
    // S=1, D=2, R=1: z = x·vᵀ = 1·2 + 3·(-1) = -1; w = z·uᵀ + b = [-1·0.5 + 1, -1·2 + 0]
    // = [0.5, -2]; y = x0 ⊙ w + x = [2·0.5 + 1, -1·-2 + 3] = [2, 5].
    let x0 = Tensor::f32(vec![1, 2], vec![2.0, -1.0]);
    let x = Tensor::f32(vec![1, 2], vec![1.0, 3.0]);
    let v = Tensor::f32(vec![1, 2], vec![2.0, -1.0]);
    let u = Tensor::f32(vec![2, 1], vec![0.5, 2.0]);
    let b = Tensor::f32(vec![2], vec![1.0, 0.0]);
    let y = eval(&ModOp::op("cross"), &[&x0, &x, &v, &u, &b]);
    assert_eq!(y[0].as_f32().expect("test value"), &[2.0, 5.0]);
}

fn dot(a: &Tensor, b: &[f32]) -> f64 {
    a.as_f32()
        .expect("test value")
        .iter()
        .zip(b)
        .map(|(&p, &q)| f64::from(p) * f64::from(q))
        .sum()
}

#[test]
fn cross_grad_matches_finite_differences() {
    let (s, d, r) = (3, 5, 2);
    let ins = layer(7, s, d, r);
    let mut g = ChaCha8Rng::seed_from_u64(8);
    let dy = randn(&mut g, &[s, d]);
    let cross = ModOp::op("cross");
    let mut operands = vec![&dy];
    operands.extend(ins.iter());
    let grads = eval(&ModOp::op("cross_grad"), &operands);
    assert_eq!(grads.len(), 5);
    let dyv = dy.as_f32().expect("test value").to_vec();
    let eps = 1e-2f32;
    for (k, grad) in grads.iter().enumerate() {
        assert_eq!(grad.shape, ins[k].shape, "d operand {k}");
        for i in 0..ins[k].numel() {
            let mut plus = ins.clone();
            let mut minus = ins.clone();
            let base = ins[k].as_f32().expect("test value")[i];
            plus[k].as_f32_mut().expect("test value")[i] = base + eps;
            minus[k].as_f32_mut().expect("test value")[i] = base - eps;
            let h = f64::from(base + eps) - f64::from(base - eps);
            let f = |t: &[Tensor]| dot(&eval(&cross, &t.iter().collect::<Vec<_>>())[0], &dyv);
            let fd = (f(&plus) - f(&minus)) / h;
            let an = f64::from(grad.as_f32().expect("test value")[i]);
            assert!(
                (an - fd).abs() <= 1e-3 + 1e-3 * fd.abs(),
                "d operand {k}[{i}]: analytic {an}, finite difference {fd}"
            );
        }
    }
}

/// A graph of two cross layers (`y = cross(x0, cross(x0, x0, ..), ..)`) and its
/// gradient node, as a module graph.
fn two_layers(s: usize, d: usize, r: usize) -> Graph {
    let f = |dims: &[usize]| TensorType::f32(dims.iter().map(|&x| Dim::Fixed(x)));
    let mut g = Graph::new("two_layers");
    let x0 = g.add_input("x0", f(&[s, d])).expect("test value");
    let dy = g.add_input("dy", f(&[s, d])).expect("test value");
    let mut p = Vec::new();
    for l in 0..2 {
        p.push(
            g.add_param(&format!("v{l}"), f(&[r, d]))
                .expect("test value"),
        );
        p.push(
            g.add_param(&format!("u{l}"), f(&[d, r]))
                .expect("test value"),
        );
        p.push(g.add_param(&format!("b{l}"), f(&[d])).expect("test value"));
    }
    let y1 = g
        .add(ModOp::op("cross"), &[x0, x0, p[0], p[1], p[2]], "y1")
        .expect("test value");
    let y2 = g
        .add(ModOp::op("cross"), &[x0, y1, p[3], p[4], p[5]], "y2")
        .expect("test value");
    let grads = g
        .add_node(
            ModOp::op("cross_grad"),
            &[dy, x0, y1, p[3], p[4], p[5]],
            &["dx0", "dx", "dv", "du", "db"],
        )
        .expect("test value");
    g.add_output(y2);
    for v in grads {
        g.add_output(v);
    }
    dlrm_ir::verify(&g).expect("test value");
    g
}

#[test]
fn decomposition_computes_the_same_values() {
    let (s, d, r) = (4, 6, 3);
    let g = two_layers(s, d, r);
    let flat = decompose_modules(&g).expect("test value").graph;
    assert!(flat.nodes().iter().all(|n| !matches!(n.op, Op::Module(_))));
    assert_eq!(flat.outputs().len(), g.outputs().len());
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let inputs: HashMap<String, Tensor> = [
        ("x0".to_string(), randn(&mut rng, &[s, d])),
        ("dy".to_string(), randn(&mut rng, &[s, d])),
    ]
    .into();
    let mut params = HashMap::new();
    for l in 0..2 {
        params.insert(format!("v{l}"), randn(&mut rng, &[r, d]));
        params.insert(format!("u{l}"), randn(&mut rng, &[d, r]));
        params.insert(format!("b{l}"), randn(&mut rng, &[d]));
    }
    let syms = HashMap::new();
    let a = run(&g, &inputs, &mut params.clone(), &syms, &SingleRank).expect("test value");
    let b = run(&flat, &inputs, &mut params, &syms, &SingleRank).expect("test value");
    for (k, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x.shape, y.shape, "output {k}");
        for (i, (&p, &q)) in x
            .as_f32()
            .expect("test value")
            .iter()
            .zip(y.as_f32().expect("test value"))
            .enumerate()
        {
            assert!(
                (p - q).abs() <= 1e-5 * (1.0 + q.abs()),
                "output {k}[{i}]: {p} vs {q}"
            );
        }
    }
}

#[test]
fn text_form_round_trips() {
    let g = two_layers(2, 4, 2);
    let printed = text::print(&g);
    assert!(printed.contains("cross_grad"), "{printed}");
    let back = text::parse(&printed).expect("test value");
    assert_eq!(text::print(&back), printed);
    assert!(matches!(&back.nodes()[0].op, Op::Module(m) if m.mnemonic() == "cross"));
}

#[test]
fn shape_errors_name_the_operand() {
    let t = |dims: &[usize]| TensorType::f32(dims.iter().map(|&x| Dim::Fixed(x)));
    let (x, v, u, b) = (t(&[4, 6]), t(&[3, 6]), t(&[6, 3]), t(&[6]));
    let cross = ModOp::op("cross");
    let err = |ins: &[&TensorType]| infer(&cross, ins, &[]).expect_err("an error");
    assert!(err(&[&x, &x, &v, &u]).contains("takes 5 operands"));
    let bad_u = t(&[6, 2]);
    assert!(
        err(&[&x, &x, &v, &bad_u, &b]).contains("u's columns"),
        "{}",
        err(&[&x, &x, &v, &bad_u, &b])
    );
    let bad_b = t(&[5]);
    assert!(err(&[&x, &x, &v, &u, &bad_b]).contains("b's length"));
    let x3 = t(&[4, 6, 1]);
    assert!(err(&[&x3, &x, &v, &u, &b]).contains("x0 must have rank 2"));
    assert!(infer(&cross, &[&x, &x, &v, &u, &b], &[]).is_ok());
}

#[test]
fn module_mnemonics_are_not_in_the_op_table() {
    for m in dlrm_ir::module::MODULES {
        assert!(
            !dlrm_ir::MNEMONICS.contains(&m.mnemonic()),
            "`{}` is both a module and a table op",
            m.mnemonic()
        );
    }
}

#[test]
fn unknown_attributes_of_a_module_op_are_errors() {
    let e = Op::from_parts("cross", &[("rank".to_string(), dlrm_ir::Attr::Int(2))])
        .expect_err("an error");
    assert!(e.contains("no attribute `rank`"), "{e}");
}

/// `cross_mix(x0, w, x)` and `cross_mix_grad(dy, x0, w)` by hand, on blocked
/// (rank-3) operands, and bit for bit as `cross` computes its last step: `cross`
/// of a layer whose `w` is given equals `cross_mix` of that `w`.
#[test]
fn cross_mix_by_hand_and_as_cross_computes_it() {
    let t = |v: Vec<f32>| Tensor::f32(vec![1, 1, 2], v);
    let (x0, w, x) = (t(vec![2.0, -1.0]), t(vec![0.5, -2.0]), t(vec![1.0, 3.0]));
    let y = eval(&ModOp::op("cross_mix"), &[&x0, &w, &x]);
    assert_eq!(y[0].as_f32().expect("f32"), &[2.0, 5.0]);
    assert_eq!(y[0].shape, vec![1, 1, 2]);
    let dy = t(vec![3.0, 0.25]);
    let g = eval(&ModOp::op("cross_mix_grad"), &[&dy, &x0, &w]);
    assert_eq!(g[0].as_f32().expect("f32"), &[6.0, -0.25], "dy ⊙ x0");
    assert_eq!(g[1].as_f32().expect("f32"), &[1.5, -0.5], "dy ⊙ w");
    // A rank-0 layer has w = b: cross equals cross_mix of b (broadcast by hand).
    let (s, d) = (5, 7);
    let l = layer(9, s, d, 0);
    let y = eval(&ModOp::op("cross"), &l.iter().collect::<Vec<_>>());
    let b = l[4].as_f32().expect("f32");
    let w = Tensor::f32(vec![s, d], (0..s * d).map(|i| b[i % d]).collect());
    let mixed = eval(&ModOp::op("cross_mix"), &[&l[0], &w, &l[1]]);
    assert_eq!(y[0], mixed[0]);
    let dy = randn(&mut ChaCha8Rng::seed_from_u64(4), &[s, d]);
    let grads = eval(
        &ModOp::op("cross_grad"),
        &[&dy, &l[0], &l[1], &l[2], &l[3], &l[4]],
    );
    let mg = eval(&ModOp::op("cross_mix_grad"), &[&dy, &l[0], &w]);
    assert_eq!(grads[0], mg[1], "dx0 = dy ⊙ w");
}

#[test]
fn cross_mix_shape_errors_name_the_operand() {
    let a = TensorType::f32([Dim::Fixed(2), Dim::Fixed(3)]);
    let b = TensorType::f32([Dim::Fixed(2), Dim::Fixed(4)]);
    let err = infer(&ModOp::op("cross_mix"), &[&a, &b, &a], &[]).expect_err("shapes differ");
    assert!(err.to_string().contains("w f32[2,4]"), "{err}");
    let i = TensorType::new(dlrm_ir::DType::I64, [Dim::Fixed(2), Dim::Fixed(3)]);
    let err = infer(&ModOp::op("cross_mix_grad"), &[&a, &i, &a], &[]).expect_err("int");
    assert!(err.to_string().contains("x0 must be f32 or bf16"), "{err}");
}
