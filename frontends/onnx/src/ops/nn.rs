//! Activations (`Relu`, `Sigmoid`) and `Gemm`.

use super::{Builder, Built};
use crate::import::{Ctx, NodeCx, Val};
use dlrm_ir::{Act, BinaryKind, Op, Tensor};
use std::collections::HashMap;
use std::rc::Rc;

pub(super) fn register(r: &mut HashMap<&'static str, Builder>) {
    r.insert("Relu", |cx, n| unary(cx, n, Op::Relu));
    r.insert("Sigmoid", |cx, n| unary(cx, n, Op::Sigmoid));
    r.insert("Gemm", gemm);
}

fn unary(cx: &mut Ctx<'_>, n: &NodeCx<'_>, op: Op) -> Built {
    let x = cx.input(n, 0)?;
    Ok(vec![cx.emit(op, &[x], &n.out_name(0))?])
}

/// `Gemm`: `alpha * op(A) · op(B) + beta * C`. Maps to `linear` when that is exactly
/// the semantics (`transA=0`, alpha = beta = 1, 1-D `C` of length N, `B` as `[N, K]`
/// directly or a constant transposed at import); otherwise transpose / matmul /
/// binary ops.
fn gemm(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let alpha = n.attrs.float("alpha", 1.0)?;
    let beta = n.attrs.float("beta", 1.0)?;
    let ta = n.attrs.int("transA", 0)?;
    let tb = n.attrs.int("transB", 0)?;
    for (k, v) in [("transA", ta), ("transB", tb)] {
        if v != 0 && v != 1 {
            return Err(format!("unsupported attribute value {k}={v} (0 or 1)").into());
        }
    }
    let a = cx.input(n, 0)?;
    let b = cx.input(n, 1)?;
    let c = cx.opt_input(n, 2)?;
    let (at, bt) = (cx.ty(&a)?, cx.ty(&b)?);
    if at.rank() != 2 || bt.rank() != 2 {
        return Err(format!("Gemm needs 2-D A and B, got {at} and {bt}").into());
    }
    let name = n.out_name(0);
    let c_is_bias = match &c {
        Some(c) => {
            let ct = cx.ty(c)?;
            let nn = if tb == 1 { &bt.shape[0] } else { &bt.shape[1] };
            ct.rank() == 1 && &ct.shape[0] == nn && ct.dtype == at.dtype
        }
        None => false,
    };
    if ta == 0 && alpha == 1.0 && beta == 1.0 && c_is_bias && (tb == 1 || cx.konst(&b).is_some()) {
        let w = if tb == 1 {
            b
        } else {
            cx.emit(
                Op::Transpose { perm: vec![1, 0] },
                &[b],
                &format!("{name}.wT"),
            )?
        };
        let c = c.ok_or("internal: bias")?;
        return Ok(vec![cx.emit(
            Op::Linear { act: Act::None },
            &[a, w, c],
            &name,
        )?]);
    }
    let t = Op::Transpose { perm: vec![1, 0] };
    let a = if ta == 1 {
        cx.emit(t.clone(), &[a], &format!("{name}.aT"))?
    } else {
        a
    };
    let b = if tb == 1 {
        cx.emit(t, &[b], &format!("{name}.bT"))?
    } else {
        b
    };
    let mut y = cx.emit(Op::MatMul, &[a, b], &format!("{name}.ab"))?;
    let scalar =
        |v: f32, what: &str| Val::Const(Rc::new(Tensor::f32(vec![], vec![v])), what.to_string());
    if alpha != 1.0 {
        y = cx.emit(
            Op::Binary {
                kind: BinaryKind::Mul,
            },
            &[y, scalar(alpha, &format!("{name}.alpha"))],
            &format!("{name}.scaled"),
        )?;
    }
    if let Some(c) = c
        && beta != 0.0
    {
        let c = if beta != 1.0 {
            cx.emit(
                Op::Binary {
                    kind: BinaryKind::Mul,
                },
                &[c, scalar(beta, &format!("{name}.beta"))],
                &format!("{name}.c"),
            )?
        } else {
            c
        };
        y = cx.emit(
            Op::Binary {
                kind: BinaryKind::Add,
            },
            &[y, c],
            &name,
        )?;
    }
    Ok(vec![y])
}
