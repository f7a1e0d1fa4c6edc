//! The `canon` rules for the dot interaction's lower triangle taken by Slice or
//! GatherND, on random shapes (vectors F, width D, batch, with and without the
//! diagonal, every form): the interaction is found exactly when the pairs are in
//! the interaction's order, never when they are shuffled, and the canonical graph
//! computes bit for bit what the generic one does (reference interpreter).

#![allow(clippy::unwrap_used)]

mod common;

use common::Rng;
use dlrm_ir::interp::run;
use dlrm_ir::{
    DType, Dim, Graph, InteractionKind, Op, SingleRank, Tensor, TensorType, ValueId, verify,
};
use dlrm_passes::egraph::Limits;
use dlrm_passes::egraph::canon::canonicalise;
use std::collections::HashMap;

#[derive(Clone, Copy, Debug)]
enum Form {
    /// `reshape[B,k](slice(Z))` per row, `concat{axis=1}`.
    Slices,
    /// Row slices `concat{axis=2}`, then `reshape[B,P]`.
    SlicesCat2,
    /// `transpose(gather_nd{0}(transpose(Z), pairs[P,2]))`.
    GatherNd,
    /// `gather_nd{1}(Z, pairs[B,P,2])` (fixed batch).
    GatherNdBatched,
}

/// The pairs of the lower triangle in the interaction's order.
fn triangle(f: usize, diag: bool) -> Vec<(usize, usize)> {
    (0..f)
        .flat_map(|i| (0..i + usize::from(diag)).map(move |j| (i, j)))
        .collect()
}

struct Case {
    g: Graph,
    params: Vec<(String, Tensor)>,
    inputs: HashMap<String, Tensor>,
    syms: HashMap<String, usize>,
}

fn build(form: Form, f: usize, d: usize, batch: usize, diag: bool, shuffle: bool) -> Case {
    let fixed = Dim::Fixed;
    let b = match form {
        Form::GatherNdBatched => fixed(batch),
        _ => Dim::batch(),
    };
    let mut g = Graph::new("tri");
    let mut rng =
        Rng((f * 1000 + d * 100 + batch * 10 + usize::from(diag)) as u64 + u64::from(shuffle));
    let mut inputs = HashMap::new();
    let vs: Vec<ValueId> = (0..f)
        .map(|k| {
            let name = format!("v{k}");
            let data = (0..batch * d).map(|_| rng.uniform(1.0)).collect();
            inputs.insert(name.clone(), Tensor::f32(vec![batch, d], data));
            g.add_input(&name, TensorType::f32([b.clone(), fixed(d)]))
                .unwrap()
        })
        .collect();
    let add = |g: &mut Graph, op: Op, ins: &[ValueId], name: &str| g.add(op, ins, name).unwrap();
    let t = add(&mut g, Op::Concat { axis: 1 }, &vs, "t_flat");
    let t = add(
        &mut g,
        Op::Reshape {
            shape: vec![b.clone(), fixed(f), fixed(d)],
        },
        &[t],
        "t",
    );
    let tt = add(
        &mut g,
        Op::Transpose {
            perm: vec![0, 2, 1],
        },
        &[t],
        "tt",
    );
    let z = add(&mut g, Op::MatMul, &[t, tt], "z");
    let mut pairs = triangle(f, diag);
    let mut params = Vec::new();
    let p = pairs.len();
    let tri = match form {
        Form::Slices | Form::SlicesCat2 => {
            let mut slices = Vec::new();
            for i in 0..f {
                let k = i + usize::from(diag);
                if k == 0 {
                    continue;
                }
                let op = Op::Slice {
                    axes: vec![1, 2],
                    starts: vec![i, 0],
                    ends: vec![Dim::Fixed(i + 1), Dim::Fixed(k)],
                    steps: vec![1, 1],
                };
                slices.push((add(&mut g, op, &[z], &format!("s{i}")), k));
            }
            if shuffle {
                slices.reverse();
            }
            if let Form::Slices = form {
                let pieces: Vec<ValueId> = slices
                    .iter()
                    .map(|&(s, k)| {
                        let shape = vec![b.clone(), fixed(k)];
                        add(&mut g, Op::Reshape { shape }, &[s], "piece")
                    })
                    .collect();
                match pieces.as_slice() {
                    [one] => *one,
                    _ => add(&mut g, Op::Concat { axis: 1 }, &pieces, "tri"),
                }
            } else {
                let ss: Vec<ValueId> = slices.iter().map(|s| s.0).collect();
                let c = match ss.as_slice() {
                    [one] => *one,
                    _ => add(&mut g, Op::Concat { axis: 2 }, &ss, "rows"),
                };
                let shape = vec![b.clone(), fixed(p)];
                add(&mut g, Op::Reshape { shape }, &[c], "tri")
            }
        }
        Form::GatherNd | Form::GatherNdBatched => {
            if shuffle {
                pairs.reverse();
            }
            let flat: Vec<i64> = pairs
                .iter()
                .flat_map(|&(i, j)| [i as i64, j as i64])
                .collect();
            if let Form::GatherNd = form {
                let idx = g
                    .add_param("pairs", TensorType::new(DType::I64, [fixed(p), fixed(2)]))
                    .unwrap();
                params.push(("pairs".to_string(), Tensor::i64(vec![p, 2], flat)));
                let zp = add(
                    &mut g,
                    Op::Transpose {
                        perm: vec![1, 2, 0],
                    },
                    &[z],
                    "zp",
                );
                let gt = add(&mut g, Op::GatherNd { batch_dims: 0 }, &[zp, idx], "gt");
                add(&mut g, Op::Transpose { perm: vec![1, 0] }, &[gt], "tri")
            } else {
                let ty = TensorType::new(DType::I64, [fixed(batch), fixed(p), fixed(2)]);
                let idx = g.add_param("pairs", ty).unwrap();
                let all = (0..batch).flat_map(|_| flat.iter().copied()).collect();
                params.push(("pairs".to_string(), Tensor::i64(vec![batch, p, 2], all)));
                add(&mut g, Op::GatherNd { batch_dims: 1 }, &[z, idx], "tri")
            }
        }
    };
    let r = add(&mut g, Op::Concat { axis: 1 }, &[vs[0], tri], "r");
    g.add_output(r);
    verify(&g).unwrap();
    Case {
        g,
        params,
        inputs,
        syms: HashMap::from([("B".to_string(), batch)]),
    }
}

fn eval(c: &Case, g: &Graph, params: &[(String, Tensor)]) -> Vec<u32> {
    let mut p: HashMap<String, Tensor> = params.iter().cloned().collect();
    let out = run(g, &c.inputs, &mut p, &c.syms, &SingleRank).unwrap();
    out[0].to_f32_vec().iter().map(|x| x.to_bits()).collect()
}

#[test]
fn sliced_and_gather_nd_triangles_on_random_shapes() {
    let mut rng = Rng(7);
    let forms = [
        Form::Slices,
        Form::SlicesCat2,
        Form::GatherNd,
        Form::GatherNdBatched,
    ];
    for round in 0..48 {
        let form = forms[round % forms.len()];
        let f = 2 + rng.below(4);
        let d = 1 + rng.below(5);
        let batch = 1 + rng.below(4);
        let diag = rng.below(2) == 1;
        // A shuffle changes the order only with two pieces / pairs or more.
        let pieces = f - usize::from(!diag);
        let shuffle = rng.below(3) == 0 && pieces >= 2;
        let what = format!("{form:?} F={f} D={d} B={batch} diag={diag} shuffle={shuffle}");
        let c = build(form, f, d, batch, diag, shuffle);
        let mut params = c.params.clone();
        let (out, _) = canonicalise(&c.g, Some(&mut params), &Limits::default()).unwrap();
        verify(&out).unwrap();
        let dots: Vec<bool> = out
            .nodes()
            .iter()
            .filter_map(|n| match n.op {
                Op::Interaction {
                    kind: InteractionKind::Dot,
                    self_interaction,
                } => Some(self_interaction),
                _ => None,
            })
            .collect();
        if shuffle {
            assert!(dots.is_empty(), "{what}: rewritten");
        } else {
            assert_eq!(dots, vec![diag], "{what}");
            assert!(
                out.nodes()
                    .iter()
                    .all(|n| !matches!(n.op.mnemonic(), "slice" | "gather_nd" | "matmul")),
                "{what}: generic ops left"
            );
        }
        assert_eq!(eval(&c, &c.g, &c.params), eval(&c, &out, &params), "{what}");
    }
}
