//! Shape and dtype inference of the generic ops the ONNX importer emits (the
//! `generic ops (ONNX import)` block of [`Op`]). Same rules as `infer`: plain
//! messages, the caller attaches the node.

use crate::op::Op;
use crate::types::{DType, Dim, Shape, TensorType};

type R<T> = Result<T, String>;

fn arity(op: &Op, ins: &[&TensorType], n: usize) -> R<()> {
    if ins.len() == n {
        Ok(())
    } else {
        Err(format!(
            "`{}` takes {n} operands, got {}",
            op.mnemonic(),
            ins.len()
        ))
    }
}

fn float(what: &str, t: &TensorType) -> R<()> {
    if t.dtype.is_float() {
        Ok(())
    } else {
        Err(format!("{what} must be f32 or bf16, got {t}"))
    }
}

fn int(what: &str, t: &TensorType) -> R<()> {
    if t.dtype.is_int() {
        Ok(())
    } else {
        Err(format!("{what} must be i64 or i32, got {t}"))
    }
}

fn float_result(a: &TensorType, b: &TensorType) -> DType {
    if a.dtype == DType::BF16 && b.dtype == DType::BF16 {
        DType::BF16
    } else {
        DType::F32
    }
}

/// Numpy broadcasting of two shapes (aligned at the right; a fixed 1 stretches).
pub(crate) fn broadcast(a: &[Dim], b: &[Dim]) -> R<Shape> {
    let n = a.len().max(b.len());
    let one = Dim::Fixed(1);
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let da = if i + a.len() >= n {
            &a[i + a.len() - n]
        } else {
            &one
        };
        let db = if i + b.len() >= n {
            &b[i + b.len() - n]
        } else {
            &one
        };
        let d = if da == db || *db == one {
            da.clone()
        } else if *da == one {
            db.clone()
        } else {
            return Err(format!("dimensions {da} and {db} do not broadcast"));
        };
        out.push(d);
    }
    Ok(out)
}

fn check_axes(what: &str, axes: &[usize], rank: usize) -> R<()> {
    for (i, &a) in axes.iter().enumerate() {
        if a >= rank {
            return Err(format!("{what} {a} out of range for rank {rank}"));
        }
        if axes[..i].contains(&a) {
            return Err(format!("{what} {a} given twice"));
        }
    }
    Ok(())
}

/// Result types of a generic op.
pub(crate) fn infer_generic(op: &Op, ins: &[&TensorType]) -> R<Vec<TensorType>> {
    let one = |dtype: DType, shape: Shape| Ok(vec![TensorType { dtype, shape }]);
    match op {
        Op::MatMul => {
            arity(op, ins, 2)?;
            let (a, b) = (ins[0], ins[1]);
            float("a", a)?;
            float("b", b)?;
            if a.rank() < 2 || b.rank() < 2 {
                return Err(format!("matmul operands need rank >= 2, got {a} and {b}"));
            }
            let (ra, rb) = (a.rank(), b.rank());
            if a.shape[ra - 1] != b.shape[rb - 2] {
                return Err(format!("matmul {a} x {b}: inner dimensions differ"));
            }
            let mut shape = broadcast(&a.shape[..ra - 2], &b.shape[..rb - 2])?;
            shape.push(a.shape[ra - 2].clone());
            shape.push(b.shape[rb - 1].clone());
            one(float_result(a, b), shape)
        }
        Op::Binary { .. } => {
            arity(op, ins, 2)?;
            float("a", ins[0])?;
            float("b", ins[1])?;
            let shape = broadcast(&ins[0].shape, &ins[1].shape)
                .map_err(|e| format!("{} and {}: {e}", ins[0], ins[1]))?;
            one(float_result(ins[0], ins[1]), shape)
        }
        Op::Transpose { perm } => {
            arity(op, ins, 1)?;
            let x = ins[0];
            let mut seen = vec![false; x.rank()];
            if perm.len() != x.rank() {
                return Err(format!("perm {perm:?} does not match {x}"));
            }
            for &p in perm {
                if p >= x.rank() || seen[p] {
                    return Err(format!("perm {perm:?} is not a permutation for {x}"));
                }
                seen[p] = true;
            }
            one(x.dtype, perm.iter().map(|&p| x.shape[p].clone()).collect())
        }
        Op::Gather { .. } | Op::GatherElements { .. } | Op::GatherNd { .. } => gathers(op, ins),
        Op::Slice { .. } => slice(op, ins),
        Op::Reduce { axes, keepdims, .. } => {
            arity(op, ins, 1)?;
            let x = ins[0];
            float("operand", x)?;
            check_axes("reduce axis", axes, x.rank())?;
            let mut shape = Vec::with_capacity(x.rank());
            for (k, d) in x.shape.iter().enumerate() {
                if !axes.contains(&k) {
                    shape.push(d.clone());
                } else if *keepdims {
                    shape.push(Dim::Fixed(1));
                }
            }
            one(x.dtype, shape)
        }
        Op::Cast { to } => {
            arity(op, ins, 1)?;
            one(*to, ins[0].shape.clone())
        }
        Op::EmbeddingBagWeighted | Op::OffsetsFromLengths { .. } => bags(op, ins),
        _ => Err(format!("internal: `{}` is not a generic op", op.mnemonic())),
    }
}

/// `gather`, `gather_elements` and `gather_nd`.
fn gathers(op: &Op, ins: &[&TensorType]) -> R<Vec<TensorType>> {
    let one = |dtype: DType, shape: Shape| Ok(vec![TensorType { dtype, shape }]);
    match op {
        Op::Gather { axis } => {
            arity(op, ins, 2)?;
            let (d, i) = (ins[0], ins[1]);
            int("indices", i)?;
            if *axis >= d.rank() {
                return Err(format!("axis {axis} out of range for {d}"));
            }
            let mut shape = d.shape[..*axis].to_vec();
            shape.extend(i.shape.iter().cloned());
            shape.extend(d.shape[axis + 1..].iter().cloned());
            one(d.dtype, shape)
        }
        Op::GatherElements { axis } => {
            arity(op, ins, 2)?;
            let (d, i) = (ins[0], ins[1]);
            int("indices", i)?;
            if *axis >= d.rank() || i.rank() != d.rank() {
                return Err(format!("axis {axis}: bad operands {d} and {i}"));
            }
            // Off the axis, an index position must exist in the data (when both
            // lengths are known; always on an instance).
            let longer = i
                .shape
                .iter()
                .zip(&d.shape)
                .enumerate()
                .find(|(k, (a, b))| {
                    *k != *axis && matches!((a, b), (Dim::Fixed(a), Dim::Fixed(b)) if a > b)
                });
            if let Some((k, _)) = longer {
                return Err(format!(
                    "axis {axis}: indices {i} are longer than the data {d} on dimension {k}"
                ));
            }
            one(d.dtype, i.shape.clone())
        }
        Op::GatherNd { batch_dims } => {
            arity(op, ins, 2)?;
            let (d, i) = (ins[0], ins[1]);
            int("indices", i)?;
            let b = *batch_dims;
            let k = i
                .shape
                .last()
                .and_then(Dim::fixed)
                .ok_or_else(|| format!("indices {i} need a fixed last dimension"))?;
            if k == 0 {
                return Err(format!(
                    "gather_nd batch_dims={b}: index tuples of length 0 in {i}"
                ));
            }
            if i.rank() < b + 1 || d.rank() < b + k || d.shape[..b] != i.shape[..b] {
                return Err(format!(
                    "gather_nd batch_dims={b}: bad operands {d} and {i}"
                ));
            }
            let mut shape = i.shape[..i.rank() - 1].to_vec();
            shape.extend(d.shape[b + k..].iter().cloned());
            one(d.dtype, shape)
        }
        _ => Err(format!("internal: `{}` is not a generic op", op.mnemonic())),
    }
}

/// `slice`.
fn slice(op: &Op, ins: &[&TensorType]) -> R<Vec<TensorType>> {
    let one = |dtype: DType, shape: Shape| Ok(vec![TensorType { dtype, shape }]);
    match op {
        Op::Slice {
            axes,
            starts,
            ends,
            steps,
        } => {
            arity(op, ins, 1)?;
            let x = ins[0];
            let n = axes.len();
            if starts.len() != n || ends.len() != n || steps.len() != n {
                return Err("slice needs one start, end and step per axis".into());
            }
            check_axes("slice axis", axes, x.rank())?;
            let mut shape = x.shape.clone();
            for i in 0..n {
                let (s, st) = (starts[i], steps[i]);
                let (Some(dim), Some(e)) = (x.shape[axes[i]].fixed(), ends[i].fixed()) else {
                    shape[axes[i]] = symbolic_slice(&x.shape[axes[i]], s, &ends[i], st)
                        .map_err(|why| format!("slice axis {} of {x}: {why}", axes[i]))?;
                    continue;
                };
                if st == 0 || s > e || e > dim {
                    return Err(format!(
                        "slice {s}..{e} step {st} is invalid for axis {} of {x}",
                        axes[i]
                    ));
                }
                shape[axes[i]] = Dim::Fixed((e - s).div_ceil(st));
            }
            one(x.dtype, shape)
        }
        _ => Err(format!("internal: `{}` is not a generic op", op.mnemonic())),
    }
}

/// `embedding_bag_weighted` and `offsets_from_lengths`.
fn bags(op: &Op, ins: &[&TensorType]) -> R<Vec<TensorType>> {
    let one = |dtype: DType, shape: Shape| Ok(vec![TensorType { dtype, shape }]);
    match op {
        Op::EmbeddingBagWeighted => {
            arity(op, ins, 4)?;
            let (t, i, o, w) = (ins[0], ins[1], ins[2], ins[3]);
            float("table", t)?;
            int("indices", i)?;
            int("offsets", o)?;
            float("weights", w)?;
            if t.rank() != 2 || i.rank() != 1 || o.rank() != 1 || w.shape != i.shape {
                return Err(format!(
                    "embedding_bag_weighted needs table[R,D], indices[N], offsets[S], \
                     weights[N]; got {t}, {i}, {o}, {w}"
                ));
            }
            super::expect_bags(i, o)?;
            one(t.dtype, vec![o.shape[0].clone(), t.shape[1].clone()])
        }
        Op::OffsetsFromLengths { keys, key } => {
            arity(op, ins, 1)?;
            let l = ins[0];
            int("lengths", l)?;
            if l.rank() != 1 || key >= keys {
                return Err(format!(
                    "offsets_from_lengths needs lengths[N] and key < keys; got {l}, key={key}, keys={keys}"
                ));
            }
            let k = i64::try_from(*keys).map_err(|_| "too many keys".to_string())?;
            let per_key = l.shape[0]
                .to_expr()
                .div_exact(k)
                .and_then(|r| r.add(&crate::DimExpr::int(1)))
                .and_then(Dim::from_expr)
                .ok_or_else(|| format!("the {} lengths are not {keys} equal runs", l.shape[0]))?;
            one(l.dtype, vec![per_key])
        }
        _ => Err(format!("internal: `{}` is not a generic op", op.mnemonic())),
    }
}

/// The length of `start..end` (step 1) of a symbolic axis `dim`: `end` must be
/// provably at most `dim` whatever the sizes (`dim - end` has no negative
/// coefficient: `B` or `1` of `B+1`) and at least `start`.
fn symbolic_slice(dim: &Dim, start: usize, end: &Dim, step: usize) -> R<Dim> {
    if step != 1 {
        return Err(format!(
            "a symbolic axis is sliced with step 1 only, not {step}"
        ));
    }
    let within = dim.to_expr().sub(&end.to_expr());
    if !within.is_some_and(|d| d.non_negative()) {
        return Err(format!("the end {end} is not provably at or below {dim}"));
    }
    let start = i64::try_from(start).map_err(|_| "start too large".to_string())?;
    end.to_expr()
        .sub(&crate::DimExpr::int(start))
        .and_then(Dim::from_expr)
        .ok_or_else(|| format!("the start {start} is not at or below the end {end}"))
}
