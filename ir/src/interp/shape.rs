//! Data movement: `concat`, `split` and `reshape`, for every dtype.
//!
//! These ops copy elements without arithmetic. Operands are first converted to the
//! declared result dtype (a no-op when they agree, which the verifier guarantees;
//! see `common::convert` for the other cases).

use super::common::{R, convert, numel};
use crate::{Checked, Concrete, DType, Data, Op, Tensor};
use std::borrow::Cow;

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

/// Evaluates a data-movement op on its checked operands (ranks, axes, sizes and
/// the reshape's element count are the op's rule, checked by its instance).
pub(super) fn eval(c: &Checked<'_>) -> R<Vec<Tensor>> {
    let ins = c.inputs();
    match c.op() {
        Op::Concat { axis } => concat(*axis, ins, c.out(0)).map(|t| vec![t]),
        Op::Split { axis, sizes } => split(*axis, sizes, ins[0], c),
        Op::Reshape { .. } => {
            let data = convert(ins[0], c.out(0).dtype, "operand")?.into_owned();
            Ok(vec![Tensor {
                shape: c.out(0).shape.clone(),
                data,
            }])
        }
        other => super::common::not_in_family(other, "a data-movement op"),
    }
}

/// `concat(x_0, .., x_k)` along `axis`, into a result of type `res`.
fn concat(axis: usize, ins: &[&Tensor], res: &Concrete) -> R<Tensor> {
    let out = res.dtype;
    let first = ins[0];
    let mut datas: Vec<Cow<'_, Data>> = Vec::with_capacity(ins.len());
    let mut inners = Vec::with_capacity(ins.len());
    for (i, t) in ins.iter().enumerate() {
        datas.push(convert(t, out, &format!("operand {i}"))?);
        inners.push(outer_inner(&t.shape, axis)?.1);
    }
    let (outer, _) = outer_inner(&first.shape, axis)?;
    let shape = res.shape.clone();
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
        DType::U8 => join_as!(U8),
    };
    Ok(Tensor { shape, data })
}

/// `split(x)` along `axis` into pieces of `sizes` (the results of `c`).
fn split(axis: usize, sizes: &[usize], x: &Tensor, c: &Checked<'_>) -> R<Vec<Tensor>> {
    let (outer, _) = outer_inner(&x.shape, axis)?;
    let after = numel(&x.shape[axis + 1..])?;
    let inners: Vec<usize> = sizes.iter().map(|&s| s * after).collect();
    let shapes = (0..sizes.len()).map(|k| c.out(k).shape.clone());
    // Pieces are cut in the operand's dtype, then converted to each result's dtype.
    macro_rules! cut_as {
        ($v:ident, $data:expr) => {
            cut($data, outer, &inners)
                .into_iter()
                .map(|p| Data::$v(p))
                .collect::<Vec<Data>>()
        };
    }
    let pieces = match &x.data {
        Data::F32(v) => cut_as!(F32, v),
        Data::BF16(v) => cut_as!(BF16, v),
        Data::I64(v) => cut_as!(I64, v),
        Data::I32(v) => cut_as!(I32, v),
        Data::U8(v) => cut_as!(U8, v),
    };
    pieces
        .into_iter()
        .zip(shapes)
        .enumerate()
        .map(|(k, (data, shape))| {
            let t = Tensor { shape, data };
            let dt = c.out(k).dtype;
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
