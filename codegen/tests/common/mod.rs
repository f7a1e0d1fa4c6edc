//! Random test cases for the kernels, with an independent f64 reference.
//!
//! Each case is an op, its operands, declared result types (leading sample dims
//! symbolic `B`), the symbol binding, and the expected results computed naively in
//! f64 together with a per-element *scale* (the sum of the magnitudes of the terms
//! summed into that element) so that tolerances can be stated relative to the
//! terms, as float reassociation errors are.

#![allow(dead_code)]

use dlrm_ir::{Act, DType, Dim, InteractionKind, Op, Pool, Tensor, TensorType};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;

pub mod interp;

/// Expected result: shape, values, scales.
pub struct Want {
    pub shape: Vec<usize>,
    pub vals: Vec<f64>,
    pub scale: Vec<f64>,
}

pub struct Case {
    pub name: String,
    pub op: Op,
    pub inputs: Vec<Tensor>,
    pub out_types: Vec<TensorType>,
    pub syms: HashMap<String, usize>,
    pub want: Vec<Want>,
}

impl Case {
    pub fn refs(&self) -> Vec<&Tensor> {
        self.inputs.iter().collect()
    }
}

/// Deterministic pseudo-random values in [-1, 1) (xorshift; the same stream
/// for the same seed in every test and bench that uses it).
pub fn vals(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Asserts `a` and `b` have the same shape, dtype and bits, naming the first
/// element that differs.
pub fn same_bits(name: &str, a: &Tensor, b: &Tensor) {
    assert_eq!(a.shape, b.shape, "{name}: shape");
    assert_eq!(a.dtype(), b.dtype(), "{name}: dtype");
    let (x, y) = (a.to_f32_vec(), b.to_f32_vec());
    if let Some(i) = (0..x.len()).find(|&i| x[i].to_bits() != y[i].to_bits()) {
        panic!("{name}: element {i}: {} vs {}", x[i], y[i]);
    }
}

/// `n` indices into `rows` rows (i32 or i64), of shape `shape`; many duplicates
/// when `rows` is small.
pub fn random_indices(seed: u64, n: usize, rows: usize, i32s: bool, shape: Vec<usize>) -> Tensor {
    let raw: Vec<i64> = vals(seed, n)
        .iter()
        .map(|v| ((v + 1.0) * 0.5 * rows as f32) as i64 % rows as i64)
        .collect();
    if i32s {
        Tensor::i32(shape, raw.iter().map(|&x| x as i32).collect())
    } else {
        Tensor::i64(shape, raw)
    }
}

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

pub fn uniform(r: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| r.random_range(-1.0f32..1.0)).collect()
}

/// Sizes that hit SIMD tails and block edges.
pub const SIZES: &[usize] = &[1, 2, 3, 7, 8, 13, 16, 31, 64, 65, 130];

pub fn pick(r: &mut ChaCha8Rng, from: &[usize]) -> usize {
    from[r.random_range(0..from.len())]
}

fn bt(shape_tail: &[usize]) -> TensorType {
    let mut dims = vec![Dim::batch()];
    dims.extend(shape_tail.iter().map(|&n| Dim::Fixed(n)));
    TensorType::new(DType::F32, dims)
}

fn fixed(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.iter().map(|&n| Dim::Fixed(n)))
}

fn syms_b(s: usize) -> HashMap<String, usize> {
    HashMap::from([("B".to_string(), s)])
}

/// Tolerance check: |got - want| <= rel·scale + 4 ulp-ish of |want|.
pub fn assert_close(case: &str, got: &Tensor, want: &Want, rel: f64) {
    assert_eq!(got.shape, want.shape, "{case}: shape");
    let g = got.to_f32_vec();
    for (i, ((&a, &b), &s)) in g.iter().zip(&want.vals).zip(&want.scale).enumerate() {
        let tol = rel * s + 1e-6 * b.abs() + 1e-30;
        assert!(
            (f64::from(a) - b).abs() <= tol,
            "{case}: element {i}: got {a}, want {b} (scale {s}, tol {tol})"
        );
    }
}

pub fn linear(r: &mut ChaCha8Rng, s: usize, k: usize, n: usize, act: Act) -> Case {
    let x = uniform(r, s * k);
    let w = uniform(r, n * k);
    let b = uniform(r, n);
    let mut vals = Vec::with_capacity(s * n);
    let mut scale = Vec::with_capacity(s * n);
    for i in 0..s {
        for j in 0..n {
            let mut z = f64::from(b[j]);
            let mut sc = f64::from(b[j]).abs();
            for p in 0..k {
                let t = f64::from(x[i * k + p]) * f64::from(w[j * k + p]);
                z += t;
                sc += t.abs();
            }
            let (v, sc) = match act {
                Act::None => (z, sc),
                Act::Relu => (z.max(0.0), sc),
                Act::Sigmoid => (1.0 / (1.0 + (-z).exp()), sc * 0.25),
            };
            vals.push(v);
            scale.push(sc);
        }
    }
    Case {
        name: format!("linear s={s} k={k} n={n} act={act:?}"),
        op: Op::Linear { act },
        inputs: vec![
            Tensor::f32(vec![s, k], x),
            Tensor::f32(vec![n, k], w),
            Tensor::f32(vec![n], b),
        ],
        out_types: vec![bt(&[n])],
        syms: syms_b(s),
        want: vec![Want {
            shape: vec![s, n],
            vals,
            scale,
        }],
    }
}

/// `a[m×k] · b[k×n]` naive in f64 with strides (element (i,p) of a = a[i*ars + p*acs]).
#[allow(clippy::too_many_arguments)]
fn matmul(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    ars: usize,
    acs: usize,
    b: &[f32],
    brs: usize,
    bcs: usize,
) -> (Vec<f64>, Vec<f64>) {
    let mut vals = vec![0.0; m * n];
    let mut scale = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            for p in 0..k {
                let t = f64::from(a[i * ars + p * acs]) * f64::from(b[p * brs + j * bcs]);
                vals[i * n + j] += t;
                scale[i * n + j] += t.abs();
            }
        }
    }
    (vals, scale)
}

pub fn linear_dx(r: &mut ChaCha8Rng, s: usize, n: usize, k: usize) -> Case {
    let dz = uniform(r, s * n);
    let w = uniform(r, n * k);
    let (vals, scale) = matmul(s, n, k, &dz, n, 1, &w, k, 1);
    Case {
        name: format!("linear_dx s={s} n={n} k={k}"),
        op: Op::LinearDx,
        inputs: vec![Tensor::f32(vec![s, n], dz), Tensor::f32(vec![n, k], w)],
        out_types: vec![bt(&[k])],
        syms: syms_b(s),
        want: vec![Want {
            shape: vec![s, k],
            vals,
            scale,
        }],
    }
}

pub fn linear_dw(r: &mut ChaCha8Rng, s: usize, n: usize, k: usize) -> Case {
    let dz = uniform(r, s * n);
    let x = uniform(r, s * k);
    let (vals, scale) = matmul(n, s, k, &dz, 1, n, &x, k, 1);
    Case {
        name: format!("linear_dw s={s} n={n} k={k}"),
        op: Op::LinearDw,
        inputs: vec![Tensor::f32(vec![s, n], dz), Tensor::f32(vec![s, k], x)],
        out_types: vec![fixed(&[n, k])],
        syms: syms_b(s),
        want: vec![Want {
            shape: vec![n, k],
            vals,
            scale,
        }],
    }
}

pub fn linear_db(r: &mut ChaCha8Rng, s: usize, n: usize) -> Case {
    let dz = uniform(r, s * n);
    let mut vals = vec![0.0; n];
    let mut scale = vec![0.0; n];
    for i in 0..s {
        for j in 0..n {
            vals[j] += f64::from(dz[i * n + j]);
            scale[j] += f64::from(dz[i * n + j]).abs();
        }
    }
    Case {
        name: format!("linear_db s={s} n={n}"),
        op: Op::LinearDb,
        inputs: vec![Tensor::f32(vec![s, n], dz)],
        out_types: vec![fixed(&[n])],
        syms: syms_b(s),
        want: vec![Want {
            shape: vec![n],
            vals,
            scale,
        }],
    }
}

pub fn relu_grad(r: &mut ChaCha8Rng, s: usize, n: usize) -> Case {
    let dy = uniform(r, s * n);
    let mut y = uniform(r, s * n);
    y.iter_mut().step_by(5).for_each(|v| *v = 0.0);
    let vals: Vec<f64> = dy
        .iter()
        .zip(&y)
        .map(|(&d, &y)| if y > 0.0 { f64::from(d) } else { 0.0 })
        .collect();
    Case {
        name: format!("relu_grad s={s} n={n}"),
        op: Op::ReluGrad,
        inputs: vec![Tensor::f32(vec![s, n], dy), Tensor::f32(vec![s, n], y)],
        out_types: vec![bt(&[n])],
        syms: syms_b(s),
        want: vec![Want {
            shape: vec![s, n],
            scale: vec![0.0; vals.len()],
            vals,
        }],
    }
}

fn index_tensor(shape: Vec<usize>, v: Vec<i64>, i32s: bool) -> Tensor {
    if i32s {
        Tensor::i32(shape, v.into_iter().map(|x| x as i32).collect())
    } else {
        Tensor::i64(shape, v)
    }
}

/// Bags as index lists (fixed pooling `l`, or variable 0..=max_bag when `l` is None).
pub fn bags(
    r: &mut ChaCha8Rng,
    s: usize,
    rows: usize,
    l: Option<usize>,
    max_bag: usize,
) -> Vec<Vec<i64>> {
    (0..s)
        .map(|_| {
            let len = l.unwrap_or_else(|| r.random_range(0..=max_bag));
            (0..len)
                .map(|_| {
                    // Some hot rows so duplicates happen.
                    if r.random_bool(0.3) {
                        r.random_range(0..rows.min(3)) as i64
                    } else {
                        r.random_range(0..rows) as i64
                    }
                })
                .collect()
        })
        .collect()
}

/// Indices operands for `bags`: `[S,L]` (fixed) or `[N]` + offsets `[S]`.
pub fn bag_operands(bags: &[Vec<i64>], fixed_l: Option<usize>, i32s: bool) -> Vec<Tensor> {
    let flat: Vec<i64> = bags.iter().flatten().copied().collect();
    match fixed_l {
        Some(l) => vec![index_tensor(vec![bags.len(), l], flat, i32s)],
        None => {
            let mut off = Vec::with_capacity(bags.len());
            let mut at = 0i64;
            for b in bags {
                off.push(at);
                at += b.len() as i64;
            }
            vec![
                index_tensor(vec![flat.len()], flat, i32s),
                index_tensor(vec![bags.len()], off, i32s),
            ]
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub fn embedding_bag(
    r: &mut ChaCha8Rng,
    rows: usize,
    d: usize,
    s: usize,
    l: Option<usize>,
    mode: Pool,
    i32s: bool,
) -> Case {
    let table = uniform(r, rows * d);
    let bs = bags(r, s, rows, l, 5);
    let mut vals = vec![0.0; s * d];
    let mut scale = vec![0.0; s * d];
    for (i, bag) in bs.iter().enumerate() {
        for &ix in bag {
            for c in 0..d {
                let t = f64::from(table[ix as usize * d + c]);
                vals[i * d + c] += t;
                scale[i * d + c] += t.abs();
            }
        }
        if mode == Pool::Mean && !bag.is_empty() {
            for c in 0..d {
                vals[i * d + c] /= bag.len() as f64;
                scale[i * d + c] /= bag.len() as f64;
            }
        }
    }
    let mut inputs = vec![Tensor::f32(vec![rows, d], table)];
    inputs.extend(bag_operands(&bs, l, i32s));
    Case {
        name: format!("embedding_bag rows={rows} d={d} s={s} l={l:?} {mode:?} i32={i32s}"),
        op: Op::EmbeddingBag {
            mode,
            last_offset: false,
        },
        inputs,
        out_types: vec![bt(&[d])],
        syms: syms_b(s),
        want: vec![Want {
            shape: vec![s, d],
            vals,
            scale,
        }],
    }
}

pub fn embedding_bag_grad(
    r: &mut ChaCha8Rng,
    d: usize,
    s: usize,
    l: Option<usize>,
    mode: Pool,
    i32s: bool,
) -> Case {
    let dy = uniform(r, s * d);
    let bs = bags(r, s, 50, l, 5);
    let mut vals = Vec::new();
    for (i, bag) in bs.iter().enumerate() {
        for _ in bag {
            for c in 0..d {
                let mut v = f64::from(dy[i * d + c]);
                if mode == Pool::Mean {
                    v /= bag.len() as f64;
                }
                vals.push(v);
            }
        }
    }
    let n = bs.iter().map(Vec::len).sum::<usize>();
    let (shape, out_ty) = match l {
        Some(l) => (vec![s, l, d], bt(&[l, d])),
        None => (
            vec![n, d],
            TensorType::new(DType::F32, [Dim::Sym("N".into()), Dim::Fixed(d)]),
        ),
    };
    let mut inputs = vec![Tensor::f32(vec![s, d], dy)];
    inputs.extend(bag_operands(&bs, l, i32s));
    let mut syms = syms_b(s);
    syms.insert("N".into(), n);
    Case {
        name: format!("embedding_bag_grad d={d} s={s} l={l:?} {mode:?}"),
        op: Op::EmbeddingBagGrad {
            mode,
            last_offset: false,
        },
        inputs,
        out_types: vec![out_ty],
        syms,
        want: vec![Want {
            shape,
            scale: vals.iter().map(|v: &f64| v.abs()).collect(),
            vals,
        }],
    }
}

pub fn interaction(
    r: &mut ChaCha8Rng,
    s: usize,
    d: usize,
    n: usize,
    kind: InteractionKind,
    self_i: bool,
) -> Case {
    let widths: Vec<usize> = match kind {
        InteractionKind::Dot => vec![d; n + 1],
        InteractionKind::Cat => (0..=n).map(|i| d + i % 3).collect(),
    };
    let ops: Vec<Vec<f32>> = widths.iter().map(|&w| uniform(r, s * w)).collect();
    let width = dlrm_ir::interaction_width(kind, self_i, &widths);
    let mut vals = Vec::with_capacity(s * width);
    let mut scale = Vec::with_capacity(s * width);
    for i in 0..s {
        match kind {
            InteractionKind::Cat => {
                for (o, &w) in ops.iter().zip(&widths) {
                    for c in 0..w {
                        vals.push(f64::from(o[i * w + c]));
                        scale.push(0.0);
                    }
                }
            }
            InteractionKind::Dot => {
                for c in 0..d {
                    vals.push(f64::from(ops[0][i * d + c]));
                    scale.push(0.0);
                }
                for a in 0..=n {
                    for b in 0..if self_i { a + 1 } else { a } {
                        let (mut z, mut sc) = (0.0, 0.0);
                        for c in 0..d {
                            let t = f64::from(ops[a][i * d + c]) * f64::from(ops[b][i * d + c]);
                            z += t;
                            sc += t.abs();
                        }
                        vals.push(z);
                        scale.push(sc);
                    }
                }
            }
        }
    }
    Case {
        name: format!("interaction s={s} d={d} n={n} {kind:?} self={self_i}"),
        op: Op::Interaction {
            kind,
            self_interaction: self_i,
        },
        inputs: ops
            .into_iter()
            .zip(&widths)
            .map(|(o, &w)| Tensor::f32(vec![s, w], o))
            .collect(),
        out_types: vec![bt(&[width])],
        syms: syms_b(s),
        want: vec![Want {
            shape: vec![s, width],
            vals,
            scale,
        }],
    }
}

pub fn interaction_grad(
    r: &mut ChaCha8Rng,
    s: usize,
    d: usize,
    n: usize,
    kind: InteractionKind,
    self_i: bool,
) -> Case {
    let fwd = interaction(r, s, d, n, kind, self_i);
    let widths: Vec<usize> = fwd.inputs.iter().map(|t| t.shape[1]).collect();
    let width = fwd.want[0].shape[1];
    let dr = uniform(r, s * width);
    let ops: Vec<Vec<f32>> = fwd.inputs.iter().map(|t| t.to_f32_vec()).collect();
    let mut wants: Vec<Want> = widths
        .iter()
        .map(|&w| Want {
            shape: vec![s, w],
            vals: vec![0.0; s * w],
            scale: vec![0.0; s * w],
        })
        .collect();
    for i in 0..s {
        let drow = &dr[i * width..(i + 1) * width];
        match kind {
            InteractionKind::Cat => {
                let mut at = 0;
                for (f, &w) in widths.iter().enumerate() {
                    for c in 0..w {
                        wants[f].vals[i * w + c] = f64::from(drow[at + c]);
                    }
                    at += w;
                }
            }
            InteractionKind::Dot => {
                for (c, &v) in drow[..d].iter().enumerate() {
                    wants[0].vals[i * d + c] += f64::from(v);
                    wants[0].scale[i * d + c] += f64::from(v).abs();
                }
                let mut p = d;
                for a in 0..=n {
                    for b in 0..if self_i { a + 1 } else { a } {
                        let g = f64::from(drow[p]);
                        p += 1;
                        for c in 0..d {
                            let ta = f64::from(ops[a][i * d + c]);
                            let tb = f64::from(ops[b][i * d + c]);
                            wants[a].vals[i * d + c] += g * tb;
                            wants[a].scale[i * d + c] += (g * tb).abs();
                            wants[b].vals[i * d + c] += g * ta;
                            wants[b].scale[i * d + c] += (g * ta).abs();
                        }
                    }
                }
            }
        }
    }
    let mut inputs = vec![Tensor::f32(vec![s, width], dr)];
    inputs.extend(fwd.inputs);
    Case {
        name: format!("interaction_grad s={s} d={d} n={n} {kind:?} self={self_i}"),
        op: Op::InteractionGrad {
            kind,
            self_interaction: self_i,
        },
        inputs,
        out_types: widths.iter().map(|&w| bt(&[w])).collect(),
        syms: syms_b(s),
        want: wants,
    }
}

/// A mixed bag of random cases of every kernel (deterministic for a seed).
pub fn all_cases(seed: u64, rounds: usize) -> Vec<Case> {
    let mut r = rng(seed);
    let mut cases = Vec::new();
    for round in 0..rounds {
        let (s, k, n) = (
            pick(&mut r, SIZES),
            pick(&mut r, SIZES),
            pick(&mut r, SIZES),
        );
        let act = [Act::None, Act::Relu, Act::Sigmoid][round % 3];
        cases.push(linear(&mut r, s, k, n, act));
        cases.push(linear_dx(&mut r, s, n, k));
        cases.push(linear_dw(&mut r, s, n, k));
        cases.push(linear_dw(&mut r, s, 1, 70 + k));
        cases.push(linear_db(&mut r, s, n));
        cases.push(relu_grad(&mut r, s, n));
        let mode = if round % 2 == 0 {
            Pool::Sum
        } else {
            Pool::Mean
        };
        let i32s = round % 4 >= 2;
        let d = pick(&mut r, &[1, 3, 8, 16, 17]);
        let rows = pick(&mut r, &[1, 5, 100, 1000]);
        let l = pick(&mut r, &[1, 2, 5]);
        cases.push(embedding_bag(&mut r, rows, d, s, Some(l), mode, i32s));
        cases.push(embedding_bag(&mut r, rows, d, s, None, mode, i32s));
        cases.push(embedding_bag_grad(&mut r, d, s, Some(l), mode, i32s));
        cases.push(embedding_bag_grad(&mut r, d, s, None, mode, i32s));
        let self_i = round % 2 == 1;
        let tables = pick(&mut r, &[0, 1, 3, 8]);
        for kind in [InteractionKind::Dot, InteractionKind::Cat] {
            cases.push(interaction(&mut r, s, d, tables, kind, self_i));
            cases.push(interaction_grad(&mut r, s, d, tables, kind, self_i));
        }
    }
    cases
}

/// A table, indices and row gradients for sparse_sgd (duplicates included).
pub fn sparse_sgd_case(
    r: &mut ChaCha8Rng,
    rows: usize,
    d: usize,
    s: usize,
    l: usize,
    i32s: bool,
) -> (Tensor, Tensor, Tensor) {
    let table = Tensor::f32(vec![rows, d], uniform(r, rows * d));
    let bs = bags(r, s, rows, Some(l), 0);
    let idx = bag_operands(&bs, Some(l), i32s).remove(0);
    let g = Tensor::f32(vec![s, l, d], uniform(r, s * l * d));
    (table, idx, g)
}
