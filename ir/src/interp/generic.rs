//! The generic ops the ONNX importer emits: `matmul`, `binary` (broadcasting
//! add/sub/mul/div), the data-movement ops `transpose`, `gather`,
//! `gather_elements`, `gather_nd`, `slice`, and `reduce`, `cast`,
//! `embedding_bag_weighted`.
//!
//! Data movement computes, for every result element, the flat position of its source
//! element and copies with [`take`], so every dtype is handled by one routine.
//! Summation order: `matmul` adds over `k` in increasing order into one f32
//! accumulator starting at 0; `reduce` adds the reduced elements in row-major order;
//! `embedding_bag_weighted` adds `w_i * row_i` in bag order.

use super::common::{R, check_len, dims, floats, fview, ints, numel, store};
use super::embedding::Bags;
use crate::{BinaryKind, Checked, Concrete, DType, Data, Op, Pool, Tensor};
use half::bf16;

/// Row-major strides of a shape.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        s[k] = s[k + 1] * shape[k + 1];
    }
    s
}

/// Copies the elements at `src` positions (already bounds-checked).
fn take(data: &Data, src: &[usize]) -> Data {
    match data {
        Data::F32(v) => Data::F32(src.iter().map(|&i| v[i]).collect()),
        Data::BF16(v) => Data::BF16(src.iter().map(|&i| v[i]).collect()),
        Data::I64(v) => Data::I64(src.iter().map(|&i| v[i]).collect()),
        Data::I32(v) => Data::I32(src.iter().map(|&i| v[i]).collect()),
        Data::U8(v) => Data::U8(src.iter().map(|&i| v[i]).collect()),
    }
}

fn moved(t: &Tensor, shape: Vec<usize>, src: &[usize]) -> R<Tensor> {
    let n = check_len(t, "operand")?;
    if let Some(&bad) = src.iter().find(|&&i| i >= n) {
        return Err(format!("internal: source element {bad} out of range"));
    }
    Ok(Tensor {
        shape,
        data: take(&t.data, src),
    })
}

/// For each element of `out` (row-major), the flat position in an operand of shape
/// `shape` broadcast to `out`.
fn broadcast_src(shape: &[usize], out: &[usize]) -> R<Vec<usize>> {
    let total = numel(out)?;
    let off = out.len() - shape.len();
    let st = strides(shape);
    let ost = strides(out);
    let mut src = Vec::with_capacity(total);
    for flat in 0..total {
        let mut s = 0usize;
        for (k, &d) in shape.iter().enumerate() {
            let c = (flat / ost[k + off]) % out[k + off];
            if d != 1 {
                s += c * st[k];
            }
        }
        src.push(s);
    }
    Ok(src)
}

/// Evaluates a generic op on its checked operands (ranks, axes, permutations,
/// broadcasting and slice bounds are the op's rule, checked by its instance; index
/// values are checked here).
pub(super) fn eval(c: &Checked<'_>) -> R<Tensor> {
    let ins = c.inputs();
    let out = c.out(0);
    match c.op() {
        Op::MatMul => matmul(ins, out),
        Op::Binary { kind } => binary(*kind, ins, out),
        Op::Transpose { perm } => transpose(perm, ins[0], out),
        Op::Gather { axis } => gather(*axis, ins, out),
        Op::GatherElements { axis } => gather_elements(*axis, ins),
        Op::GatherNd { batch_dims } => gather_nd(*batch_dims, ins, out),
        Op::Slice {
            axes,
            starts,
            steps,
            ..
        } => slice(axes, starts, steps, ins[0], out),
        Op::Reduce {
            kind,
            axes,
            keepdims: _,
        } => reduce(*kind, axes, ins[0], out),
        Op::Cast { to } => cast(*to, ins[0]),
        Op::EmbeddingBagWeighted => embedding_bag_weighted(ins, out),
        other => super::common::not_in_family(other, "a generic op"),
    }
}

/// `binary {kind}(a, b)` with broadcasting.
fn binary(kind: BinaryKind, ins: &[&Tensor], out: &Concrete) -> R<Tensor> {
    let a = floats(ins[0], "a")?;
    let b = floats(ins[1], "b")?;
    let shape = out.shape.clone();
    let sa = broadcast_src(&ins[0].shape, &shape)?;
    let sb = broadcast_src(&ins[1].shape, &shape)?;
    let f = |x: f32, y: f32| match kind {
        BinaryKind::Add => x + y,
        BinaryKind::Sub => x - y,
        BinaryKind::Mul => x * y,
        BinaryKind::Div => x / y,
    };
    let v = sa.iter().zip(&sb).map(|(&i, &j)| f(a[i], b[j])).collect();
    store(out.dtype, shape, v)
}

/// `matmul(a[..,M,K], b[..,K,N])` with broadcast batch dimensions.
fn matmul(ins: &[&Tensor], out: &Concrete) -> R<Tensor> {
    let (ta, tb) = (ins[0], ins[1]);
    let (ra, rb) = (ta.shape.len(), tb.shape.len());
    let (m, k) = (ta.shape[ra - 2], ta.shape[ra - 1]);
    let n = tb.shape[rb - 1];
    let a = floats(ta, "a")?;
    let b = floats(tb, "b")?;
    let batch = out.shape[..out.shape.len() - 2].to_vec();
    let ba = broadcast_src(&ta.shape[..ra - 2], &batch)?;
    let bb = broadcast_src(&tb.shape[..rb - 2], &batch)?;
    let mut y = Vec::with_capacity(ba.len() * m * n);
    for (&ia, &ib) in ba.iter().zip(&bb) {
        let pa = &a[ia * m * k..(ia + 1) * m * k];
        let pb = &b[ib * k * n..(ib + 1) * k * n];
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0f32;
                for kk in 0..k {
                    acc += pa[i * k + kk] * pb[kk * n + j];
                }
                y.push(acc);
            }
        }
    }
    store(out.dtype, out.shape.clone(), y)
}

/// `transpose {perm}`.
fn transpose(perm: &[usize], x: &Tensor, out: &Concrete) -> R<Tensor> {
    let shape = out.shape.clone();
    let st = strides(&x.shape);
    let ost = strides(&shape);
    let total = numel(&shape)?;
    let src: Vec<usize> = (0..total)
        .map(|flat| {
            perm.iter()
                .enumerate()
                .map(|(k, &p)| (flat / ost[k]) % shape[k] * st[p])
                .sum()
        })
        .collect();
    moved(x, shape, &src)
}

/// An index along an axis of size `dim`, negative counting from the end.
fn wrap(i: i64, dim: usize, what: &str) -> R<usize> {
    let j = if i < 0 { i + dim as i64 } else { i };
    usize::try_from(j)
        .ok()
        .filter(|&u| u < dim)
        .ok_or_else(|| format!("{what} {i} is out of range for an axis of size {dim}"))
}

/// `gather {axis}(data, indices)`.
fn gather(axis: usize, ins: &[&Tensor], out: &Concrete) -> R<Tensor> {
    let (d, it) = (ins[0], ins[1]);
    let idx = ints(it, "indices")?;
    let dim = d.shape[axis];
    let outer = numel(&d.shape[..axis])?;
    let inner = numel(&d.shape[axis + 1..])?;
    let rows: Vec<usize> = idx
        .iter()
        .map(|&i| wrap(i, dim, "index"))
        .collect::<R<_>>()?;
    let mut src = Vec::with_capacity(outer * rows.len() * inner);
    for o in 0..outer {
        for &r in &rows {
            let base = (o * dim + r) * inner;
            src.extend(base..base + inner);
        }
    }
    moved(d, out.shape.clone(), &src)
}

/// `gather_elements {axis}(data, indices)`.
/// The indices are no longer than the data along any other axis (the shape
/// rule).
fn gather_elements(axis: usize, ins: &[&Tensor]) -> R<Tensor> {
    let (d, it) = (ins[0], ins[1]);
    let rank = d.shape.len();
    let idx = ints(it, "indices")?;
    let st = strides(&d.shape);
    let ist = strides(&it.shape);
    let mut src = Vec::with_capacity(idx.len());
    for (flat, &i) in idx.iter().enumerate() {
        let mut s = 0;
        for k in 0..rank {
            let c = if k == axis {
                wrap(i, d.shape[axis], "index")?
            } else {
                (flat / ist[k]) % it.shape[k]
            };
            s += c * st[k];
        }
        src.push(s);
    }
    moved(d, it.shape.clone(), &src)
}

/// `gather_nd {batch_dims}(data, indices)`.
/// Its index tuples are not empty (the shape rule).
fn gather_nd(b: usize, ins: &[&Tensor], out: &Concrete) -> R<Tensor> {
    let (d, it) = (ins[0], ins[1]);
    let k = it.shape[it.shape.len() - 1];
    let idx = ints(it, "indices")?;
    let st = strides(&d.shape);
    let inner = numel(&d.shape[b + k..])?;
    let per_batch = numel(&it.shape[b..it.shape.len() - 1])?;
    let mut src = Vec::new();
    for (t, tuple) in idx
        .chunks(k.max(1))
        .enumerate()
        .take(numel(&it.shape[..it.shape.len() - 1])?)
    {
        let batch = t / per_batch.max(1);
        // The batch coordinates of tuple `t` in data's leading dims.
        let mut s = 0;
        let mut rest = batch;
        for dd in (0..b).rev() {
            s += (rest % d.shape[dd]) * st[dd];
            rest /= d.shape[dd];
        }
        for (j, &i) in tuple.iter().take(k).enumerate() {
            s += wrap(i, d.shape[b + j], "index")? * st[b + j];
        }
        src.extend(s..s + inner);
    }
    moved(d, out.shape.clone(), &src)
}

/// `slice {axes, starts, ends, steps}`.
/// `out` has the length of each sliced axis (its `ends` resolved).
fn slice(
    axes: &[usize],
    starts: &[usize],
    steps: &[usize],
    x: &Tensor,
    out: &Concrete,
) -> R<Tensor> {
    let rank = x.shape.len();
    // Per axis: (start, step).
    let mut sel: Vec<(usize, usize)> = vec![(0, 1); rank];
    for ((&a, &s), &st) in axes.iter().zip(starts).zip(steps) {
        sel[a] = (s, st);
    }
    let shape = out.shape.clone();
    let st = strides(&x.shape);
    let ost = strides(&shape);
    let total = numel(&shape)?;
    let src: Vec<usize> = (0..total)
        .map(|flat| {
            (0..rank)
                .map(|k| ((flat / ost[k]) % shape[k] * sel[k].1 + sel[k].0) * st[k])
                .sum()
        })
        .collect();
    moved(x, shape, &src)
}

/// `reduce {kind, axes, keepdims}`.
/// `out` has the reduced shape (with or without the kept unit axes).
fn reduce(kind: Pool, axes: &[usize], x: &Tensor, out: &Concrete) -> R<Tensor> {
    let v = floats(x, "operand")?;
    let kept: Vec<usize> = x
        .shape
        .iter()
        .enumerate()
        .map(|(k, &d)| if axes.contains(&k) { 1 } else { d })
        .collect();
    let count: usize = axes.iter().map(|&a| x.shape[a]).product();
    let kst = strides(&kept);
    let st = strides(&x.shape);
    let mut acc = vec![0.0f32; numel(&kept)?];
    for (flat, &val) in v.iter().enumerate() {
        let mut o = 0;
        for k in 0..x.shape.len() {
            if !axes.contains(&k) {
                o += (flat / st[k]) % x.shape[k] * kst[k];
            }
        }
        acc[o] += val;
    }
    if kind == Pool::Mean && count > 0 {
        for a in &mut acc {
            *a /= count as f32;
        }
    }
    store(out.dtype, out.shape.clone(), acc)
}

fn to_int(x: f32) -> R<i64> {
    if x.is_finite() && x.abs() < 9.2e18 {
        Ok(x.trunc() as i64)
    } else {
        Err(format!("cannot cast {x} to an integer"))
    }
}

/// `cast {to}`.
fn cast(to: DType, x: &Tensor) -> R<Tensor> {
    let fit = |v: i64| i32::try_from(v).map_err(|_| format!("{v} does not fit in i32"));
    let data = match (&x.data, to) {
        (Data::F32(_) | Data::BF16(_), DType::F32 | DType::BF16) => {
            return store(to, x.shape.clone(), floats(x, "operand")?.into_owned());
        }
        (Data::F32(_) | Data::BF16(_), DType::I64) => Data::I64(
            floats(x, "operand")?
                .iter()
                .map(|&v| to_int(v))
                .collect::<R<_>>()?,
        ),
        (Data::F32(_) | Data::BF16(_), DType::I32) => Data::I32(
            floats(x, "operand")?
                .iter()
                .map(|&v| to_int(v).and_then(fit))
                .collect::<R<_>>()?,
        ),
        (Data::I64(v), DType::F32) => Data::F32(v.iter().map(|&i| i as f32).collect()),
        (Data::I32(v), DType::F32) => Data::F32(v.iter().map(|&i| i as f32).collect()),
        (Data::I64(v), DType::BF16) => {
            Data::BF16(v.iter().map(|&i| bf16::from_f32(i as f32)).collect())
        }
        (Data::I32(v), DType::BF16) => {
            Data::BF16(v.iter().map(|&i| bf16::from_f32(i as f32)).collect())
        }
        (Data::I64(v), DType::I64) => Data::I64(v.clone()),
        (Data::I32(v), DType::I64) => Data::I64(v.iter().map(|&i| i64::from(i)).collect()),
        (Data::I64(v), DType::I32) => Data::I32(v.iter().map(|&i| fit(i)).collect::<R<_>>()?),
        (Data::I32(v), DType::I32) => Data::I32(v.clone()),
        (Data::U8(v), DType::F32) => Data::F32(v.iter().map(|&i| f32::from(i)).collect()),
        (Data::U8(v), DType::U8) => Data::U8(v.clone()),
        (data, DType::U8) | (data @ Data::U8(_), _) => {
            return Err(format!("cannot cast {} to {to}", data.dtype()));
        }
    };
    Ok(Tensor {
        shape: x.shape.clone(),
        data,
    })
}

/// `embedding_bag_weighted(table, indices[N], offsets[S], weights[N])`.
fn embedding_bag_weighted(ins: &[&Tensor], out: &Concrete) -> R<Tensor> {
    let [rows, d] = dims(&ins[0].shape);
    let table = fview(ins[0], "table")?;
    let bags = Bags::new(ins[1], Some(ins[2]), false)?;
    let idx = ints(ins[1], "indices")?;
    let w = floats(ins[3], "weights")?;
    let mut y = vec![0.0f32; bags.samples() * d];
    for s in 0..bags.samples() {
        let acc = &mut y[s * d..(s + 1) * d];
        for (p, flat) in bags.bag(s).enumerate() {
            let i = idx[flat];
            let r = usize::try_from(i)
                .ok()
                .filter(|&r| r < rows)
                .ok_or_else(|| {
                    super::common::out_of_range(i, &format!("sample {s}, position {p}"), rows)
                })?;
            for (j, a) in acc.iter_mut().enumerate() {
                *a += w[flat] * table.get(r * d + j);
            }
        }
    }
    store(out.dtype, vec![bags.samples(), d], y)
}
