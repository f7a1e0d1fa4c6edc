//! Arithmetic, matrix products, reductions, casts and `Range`.

use super::array::{sym_ints, sym_val};
use super::{Builder, Built, axes_of, norm_axes};
use crate::import::{Ctx, NodeCx, Val};
use crate::tensor::dtype_of;
use dlrm_ir::{BinaryKind, DType, Op, Pool, Tensor};
use std::collections::HashMap;
use std::rc::Rc;

pub(super) fn register(r: &mut HashMap<&'static str, Builder>) {
    r.insert("Add", |cx, n| binary(cx, n, BinaryKind::Add));
    r.insert("Sub", |cx, n| binary(cx, n, BinaryKind::Sub));
    r.insert("Mul", |cx, n| binary(cx, n, BinaryKind::Mul));
    r.insert("Div", |cx, n| {
        crate::bag::mean_div(cx, n).unwrap_or_else(|| binary(cx, n, BinaryKind::Div))
    });
    r.insert("MatMul", matmul);
    r.insert("ReduceSum", |cx, n| reduce(cx, n, Pool::Sum));
    r.insert("ReduceMean", |cx, n| reduce(cx, n, Pool::Mean));
    r.insert("Cast", cast);
    r.insert("CastLike", cast_like);
    r.insert("Range", range);
}

fn binary(cx: &mut Ctx<'_>, n: &NodeCx<'_>, kind: BinaryKind) -> Built {
    let a = cx.input(n, 0)?;
    let b = cx.input(n, 1)?;
    let (ta, tb) = (cx.ty(&a)?, cx.ty(&b)?);
    if !ta.dtype.is_float() || !tb.dtype.is_float() {
        // Integer arithmetic on constants and shape vectors (index and shape
        // computations), evaluated symbolically with broadcasting.
        if let (Some((x, xs)), Some((y, ys))) = (sym_ints(&a), sym_ints(&b)) {
            let len = match (x.len(), y.len()) {
                (p, q) if p == q => p,
                (1, q) => q,
                (p, 1) => p,
                (p, q) => return Err(format!("cannot broadcast {p} and {q} entries").into()),
            };
            let mut out = Vec::with_capacity(len);
            for k in 0..len {
                let (p, q) = (&x[k.min(x.len() - 1)], &y[k.min(y.len() - 1)]);
                out.push(
                    match kind {
                        BinaryKind::Add => p.add(q),
                        BinaryKind::Sub => p.sub(q),
                        BinaryKind::Mul => p.mul(q),
                        BinaryKind::Div => p.div(q),
                    }
                    .ok_or_else(|| {
                        format!(
                            "integer {} of {p} and {q}: overflow, division by zero or inexact",
                            n.op_type()
                        )
                    })?,
                );
            }
            let v = sym_val(out, xs && ys, n);
            // Keep the operands' integer type (i32 stays i32).
            return Ok(vec![match (&v, ta.dtype) {
                (Val::Const(t, name), DType::I32) => Val::Const(
                    Rc::new(Tensor::i32(
                        t.shape.clone(),
                        t.to_i64_vec()
                            .unwrap_or_default()
                            .iter()
                            .map(|&v| v as i32)
                            .collect(),
                    )),
                    name.clone(),
                ),
                _ => v,
            }]);
        }
        return Err(format!(
            "unsupported dtype: integer {} on tensors computed at run time ({ta}, {tb})",
            n.op_type()
        )
        .into());
    }
    let op = if kind == BinaryKind::Add && ta.shape == tb.shape {
        Op::Add
    } else {
        Op::Binary { kind }
    };
    Ok(vec![cx.emit(op, &[a, b], &n.out_name(0))?])
}

fn matmul(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let a = cx.input(n, 0)?;
    let b = cx.input(n, 1)?;
    Ok(vec![cx.emit(Op::MatMul, &[a, b], &n.out_name(0))?])
}

/// `ReduceSum` / `ReduceMean`: axes as the attribute (before opsets 13 / 18) or as
/// the second input (from then on); both are accepted at any opset.
fn reduce(cx: &mut Ctx<'_>, n: &NodeCx<'_>, kind: Pool) -> Built {
    let x = cx.input(n, 0)?;
    let rank = cx.ty(&x)?.rank();
    let keepdims = n.attrs.int("keepdims", 1)? != 0;
    let noop = n.attrs.int("noop_with_empty_axes", 0)? != 0;
    let axes = match axes_of(cx, n, 1)? {
        Some(a) if !a.is_empty() => norm_axes(&a, rank)?,
        _ if noop => return Ok(vec![x]),
        _ => (0..rank).collect(),
    };
    Ok(vec![cx.emit(
        Op::Reduce {
            kind,
            axes,
            keepdims,
        },
        &[x],
        &n.out_name(0),
    )?])
}

fn cast_to(cx: &mut Ctx<'_>, n: &NodeCx<'_>, to: DType) -> Built {
    let x = cx.input(n, 0)?;
    if let Val::Shape(..) = x
        && to.is_int()
    {
        return Ok(vec![x]);
    }
    if cx.ty(&x)?.dtype == to {
        return Ok(vec![x]);
    }
    Ok(vec![cx.emit(Op::Cast { to }, &[x], &n.out_name(0))?])
}

fn cast(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let code = n.attrs.int("to", 0)?;
    let to = dtype_of(i32::try_from(code).unwrap_or(-1))
        .map_err(|e| format!("unsupported attribute value to={code}: {e}"))?;
    cast_to(cx, n, to)
}

fn cast_like(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let like = cx.input(n, 1)?;
    let to = cx.ty(&like)?.dtype;
    cast_to(cx, n, to)
}

/// `Range(start, limit, delta)`, evaluated at import (constant operands only).
fn range(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let mut v = Vec::new();
    for k in 0..3 {
        let x = cx.input(n, k)?;
        let t = cx
            .konst(&x)
            .ok_or("Range needs constant start, limit and delta")?;
        v.push(t.clone());
    }
    let name = n.out_name(0);
    if v.iter().all(|t| t.dtype().is_int()) {
        let s: Vec<i64> = v
            .iter()
            .filter_map(|t| t.to_i64_vec()?.first().copied())
            .collect();
        let [start, limit, delta] = s[..] else {
            return Err("Range operands must be scalars".into());
        };
        if delta == 0 {
            return Err("Range delta is 0".into());
        }
        let span = i128::from(limit) - i128::from(start);
        let count = ((span as f64) / (delta as f64)).ceil().max(0.0);
        if count > (1u64 << 24) as f64 {
            return Err("Range is too long".into());
        }
        let count = count as usize;
        let vals: Vec<i64> = (0..count as i64)
            .map(|i| start.saturating_add(i.saturating_mul(delta)))
            .collect();
        let t = match v[0].dtype() {
            DType::I32 => Tensor::i32(vec![count], vals.iter().map(|&x| x as i32).collect()),
            _ => Tensor::i64(vec![count], vals),
        };
        return Ok(vec![Val::Const(Rc::new(t), name)]);
    }
    let f: Vec<f32> = v
        .iter()
        .filter_map(|t| t.to_f32_vec().first().copied())
        .collect();
    let [start, limit, delta] = f[..] else {
        return Err("Range operands must be scalars".into());
    };
    let count = ((limit - start) / delta).ceil();
    if !(0.0..=(1u64 << 24) as f32).contains(&count) {
        return Err("Range length is negative, NaN or too large".into());
    }
    let vals: Vec<f32> = (0..count as usize)
        .map(|i| start + i as f32 * delta)
        .collect();
    Ok(vec![Val::Const(
        Rc::new(Tensor::f32(vec![vals.len()], vals)),
        name,
    )])
}
