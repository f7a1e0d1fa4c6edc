//! Data movement: `concat`, `split` and `reshape`, for every dtype.
//!
//! These ops copy elements without arithmetic. Operands are first converted to the
//! declared result dtype (a no-op when they agree, which the verifier guarantees;
//! see `common::convert` for the other cases).

use super::common::{R, convert, describe, fmt_shape, numel, resolve_dim};
use crate::{DType, Data, Shape, Tensor};
use std::borrow::Cow;
use std::collections::HashMap;

/// `outer` = product of the dims before `axis`; `inner` = product from `axis` on.
fn outer_inner(shape: &[usize], axis: usize) -> R<(usize, usize)> {
    Ok((numel(&shape[..axis])?, numel(&shape[axis..])?))
}

/// Joins blocks: for each outer index, the `inners[k]` elements of each part `k`.
fn join<T: Copy>(parts: &[&[T]], outer: usize, inners: &[usize]) -> Vec<T> {
    let mut out = Vec::with_capacity(inners.iter().sum::<usize>() * outer);
    for o in 0..outer {
        for (p, &w) in parts.iter().zip(inners) {
            out.extend_from_slice(&p[o * w..(o + 1) * w]);
        }
    }
    out
}

/// Cuts blocks: the inverse of [`join`].
fn cut<T: Copy>(data: &[T], outer: usize, inners: &[usize]) -> Vec<Vec<T>> {
    let total: usize = inners.iter().sum();
    let mut out: Vec<Vec<T>> = inners
        .iter()
        .map(|&w| Vec::with_capacity(w * outer))
        .collect();
    for o in 0..outer {
        let mut off = o * total;
        for (dst, &w) in out.iter_mut().zip(inners) {
            dst.extend_from_slice(&data[off..off + w]);
            off += w;
        }
    }
    out
}

/// `concat(x_0, .., x_k)` along `axis`.
pub(super) fn concat(axis: usize, ins: &[&Tensor], out: DType) -> R<Tensor> {
    let Some(first) = ins.first() else {
        return Err("concat needs at least one operand".into());
    };
    if axis >= first.shape.len() {
        return Err(format!("axis {axis} out of range for {}", describe(first)));
    }
    let mut datas: Vec<Cow<'_, Data>> = Vec::with_capacity(ins.len());
    let mut inners = Vec::with_capacity(ins.len());
    let mut total = 0usize;
    for (i, t) in ins.iter().enumerate() {
        let same_rank = t.shape.len() == first.shape.len();
        let others_agree = same_rank
            && t.shape
                .iter()
                .zip(&first.shape)
                .enumerate()
                .all(|(k, (a, b))| k == axis || a == b);
        if !others_agree {
            return Err(format!(
                "operand {i} {} does not match operand 0 {} outside axis {axis}",
                describe(t),
                describe(first)
            ));
        }
        datas.push(convert(t, out, &format!("operand {i}"))?);
        inners.push(outer_inner(&t.shape, axis)?.1);
        total += t.shape[axis];
    }
    let (outer, _) = outer_inner(&first.shape, axis)?;
    let mut shape = first.shape.clone();
    shape[axis] = total;
    numel(&shape)?;
    macro_rules! join_as {
        ($v:ident) => {{
            let parts = datas
                .iter()
                .map(|d| match d.as_ref() {
                    Data::$v(v) => Ok(v.as_slice()),
                    _ => Err("internal: concat operands of mixed dtypes".to_string()),
                })
                .collect::<R<Vec<_>>>()?;
            Data::$v(join(&parts, outer, &inners))
        }};
    }
    let data = match out {
        DType::F32 => join_as!(F32),
        DType::BF16 => join_as!(BF16),
        DType::I64 => join_as!(I64),
        DType::I32 => join_as!(I32),
    };
    Ok(Tensor { shape, data })
}

/// `split(x)` along `axis` into pieces of `sizes`.
pub(super) fn split(
    axis: usize,
    sizes: &[usize],
    ins: &[&Tensor],
    outs: &[DType],
) -> R<Vec<Tensor>> {
    let [x] = ins else {
        return Err(format!("`split` takes 1 operand, got {}", ins.len()));
    };
    if axis >= x.shape.len() {
        return Err(format!("axis {axis} out of range for {}", describe(x)));
    }
    let sum = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s));
    if sum != Some(x.shape[axis]) {
        return Err(format!(
            "split sizes {} do not sum to axis {axis} of {}",
            fmt_shape(sizes),
            describe(x)
        ));
    }
    let (outer, _) = outer_inner(&x.shape, axis)?;
    let after = numel(&x.shape[axis + 1..])?;
    let inners: Vec<usize> = sizes.iter().map(|&s| s * after).collect();
    let shapes: Vec<Vec<usize>> = sizes
        .iter()
        .map(|&s| {
            let mut sh = x.shape.clone();
            sh[axis] = s;
            sh
        })
        .collect();
    // Pieces are cut in the operand's dtype, then converted to each result's dtype.
    macro_rules! cut_as {
        ($v:ident, $data:expr) => {
            cut($data, outer, &inners)
                .into_iter()
                .map(|p| Data::$v(p))
                .collect::<Vec<Data>>()
        };
    }
    super::common::check_len(x, "operand")?;
    let pieces = match &x.data {
        Data::F32(v) => cut_as!(F32, v),
        Data::BF16(v) => cut_as!(BF16, v),
        Data::I64(v) => cut_as!(I64, v),
        Data::I32(v) => cut_as!(I32, v),
    };
    pieces
        .into_iter()
        .zip(shapes)
        .zip(outs)
        .enumerate()
        .map(|(k, ((data, shape), &dt))| {
            let t = Tensor { shape, data };
            Ok(match convert(&t, dt, &format!("piece {k}"))? {
                Cow::Borrowed(_) => t,
                Cow::Owned(data) => Tensor {
                    shape: t.shape,
                    data,
                },
            })
        })
        .collect()
}

/// `reshape(x)` to `shape` (symbols resolved with `syms`).
pub(super) fn reshape(
    target: &Shape,
    ins: &[&Tensor],
    out: DType,
    syms: &HashMap<String, usize>,
) -> R<Tensor> {
    let [x] = ins else {
        return Err(format!("`reshape` takes 1 operand, got {}", ins.len()));
    };
    let shape = target
        .iter()
        .map(|d| resolve_dim(d, syms))
        .collect::<R<Vec<usize>>>()
        .map_err(|e| format!("reshape target: {e}"))?;
    let n_in = numel(&x.shape)?;
    let n_out = numel(&shape)?;
    if n_in != n_out {
        return Err(format!(
            "cannot reshape {} ({n_in} elements) to {} ({n_out} elements)",
            describe(x),
            fmt_shape(&shape)
        ));
    }
    let data = convert(x, out, "operand")?.into_owned();
    Ok(Tensor { shape, data })
}
