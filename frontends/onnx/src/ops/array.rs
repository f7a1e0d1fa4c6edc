//! Shapes, indexing and constants: `Concat`, `Reshape`, `Flatten`, `Transpose`,
//! `Unsqueeze`, `Squeeze`, `Gather`, `GatherElements`, `GatherND`, `Slice`, `Split`
//! (of a fixed axis, each piece a `slice`), and the
//! ops folded at import: `Shape`, `Constant`, `ConstantOfShape`, `Identity`.
//!
//! Shape values that involve the dynamic batch travel as [`Val::Shape`] so that the
//! usual `Shape -> Gather -> Unsqueeze -> Concat -> Reshape` chains resolve to a
//! static IR `reshape` with the `B` symbol.

use super::{Builder, Built, axes_of, norm_axes, norm_axis};
use crate::import::{Ctx, NodeCx, NodeErr, SymI, Val};
use dlrm_ir::{DType, Dim, Op, Tensor};
use std::collections::HashMap;
use std::rc::Rc;

pub(super) fn register(r: &mut HashMap<&'static str, Builder>) {
    r.insert("Identity", |cx, n| Ok(vec![cx.input(n, 0)?]));
    r.insert("Constant", constant);
    r.insert("ConstantOfShape", constant_of_shape);
    r.insert("Shape", shape);
    r.insert("Concat", concat);
    r.insert("Reshape", reshape);
    r.insert("Flatten", flatten);
    r.insert("Transpose", transpose);
    r.insert("Unsqueeze", unsqueeze);
    r.insert("Squeeze", squeeze);
    r.insert("Gather", gather);
    r.insert("GatherElements", gather_elements);
    r.insert("GatherND", gather_nd);
    r.insert("Slice", slice);
    r.insert("Split", split);
    r.insert("Size", size);
    r.insert("ReduceProd", reduce_prod);
}

/// `Size`: the element count, symbolic when the shape is.
fn size(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let x = cx.input(n, 0)?;
    let count = numel_sym(&cx.ty(&x)?.shape).ok_or("the element count overflows")?;
    Ok(vec![sym_val(vec![count], true, n)])
}

/// `ReduceProd` of a shape vector or small integer constant (all axes; the
/// element count of a shape), evaluated at import.
fn reduce_prod(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let x = cx.input(n, 0)?;
    let (v, _) = sym_ints(&x).ok_or("ReduceProd is supported on shape computations only")?;
    if axes_of(cx, n, 1)?.is_some_and(|a| a.iter().any(|&a| a != 0 && a != -1)) {
        return Err("ReduceProd of a vector reduces axis 0 only".into());
    }
    let p = v
        .iter()
        .try_fold(SymI::int(1), |acc, d| acc.mul(d))
        .ok_or("the product overflows")?;
    let keep = n.attrs.int("keepdims", 1)? != 0;
    Ok(vec![sym_val(vec![p], !keep, n)])
}

fn konst(t: Tensor, n: &NodeCx<'_>) -> Val {
    Val::Const(Rc::new(t), n.out_name(0))
}

fn constant(_cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let a = &n.attrs;
    let t = if let Some(t) = a.tensor("value")? {
        t
    } else if a.has("value_float") {
        Tensor::f32(vec![], vec![a.float("value_float", 0.0)?])
    } else if a.has("value_int") {
        Tensor::i64(vec![], vec![a.int("value_int", 0)?])
    } else if let Some(v) = a.ints("value_ints") {
        Tensor::i64(vec![v.len()], v)
    } else {
        let names: Vec<&str> = a.names().collect();
        return Err(format!("unsupported Constant attributes {names:?}").into());
    };
    Ok(vec![konst(t, n)])
}

/// A value's entries as a symbolic integer vector (constants or `Shape` values).
pub(super) fn sym_ints(v: &Val) -> Option<(Vec<SymI>, bool)> {
    match v {
        Val::Shape(s, scalar) => Some((s.clone(), *scalar)),
        Val::Const(t, _) if t.shape.len() <= 1 => Some((
            t.to_i64_vec()?.into_iter().map(SymI::int).collect(),
            t.shape.is_empty(),
        )),
        _ => None,
    }
}

/// A symbolic vector as a value: a constant when every entry is known.
pub(super) fn sym_val(v: Vec<SymI>, scalar: bool, n: &NodeCx<'_>) -> Val {
    let known: Option<Vec<i64>> = v.iter().map(SymI::as_int).collect();
    match known {
        Some(k) => {
            let shape = if scalar { vec![] } else { vec![k.len()] };
            konst(Tensor::i64(shape, k), n)
        }
        None => Val::Shape(v, scalar),
    }
}

fn constant_of_shape(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let s = cx.input(n, 0)?;
    let dims = cx.const_ints(&s, "the shape").map_err(
        |_| "ConstantOfShape with a shape depending on the dynamic batch is unsupported",
    )?;
    let shape: Vec<usize> = dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("negative dimension {d}")))
        .collect::<Result<_, _>>()?;
    let count = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&c| c <= 1 << 24);
    let count = count.ok_or("ConstantOfShape is too large")?;
    let value = n
        .attrs
        .tensor("value")?
        .unwrap_or_else(|| Tensor::f32(vec![1], vec![0.0]));
    let t = match value.dtype() {
        DType::I64 | DType::I32 => {
            let v = value
                .to_i64_vec()
                .and_then(|v| v.first().copied())
                .unwrap_or(0);
            match value.dtype() {
                DType::I32 => Tensor::i32(shape, vec![v as i32; count]),
                _ => Tensor::i64(shape, vec![v; count]),
            }
        }
        dt => {
            let v = value.to_f32_vec().first().copied().unwrap_or(0.0);
            Tensor::from_f32(dt, shape, vec![v; count])
        }
    };
    Ok(vec![konst(t, n)])
}

fn shape(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let x = cx.input(n, 0)?;
    let ty = cx.ty(&x)?;
    let rank = ty.rank() as i64;
    let clampi = |v: i64| (if v < 0 { v + rank } else { v }).clamp(0, rank) as usize;
    let start = clampi(n.attrs.int("start", 0)?);
    let end = clampi(n.attrs.int("end", rank)?);
    let dims: Vec<SymI> = ty.shape[start..end.max(start)]
        .iter()
        .map(dim_sym)
        .collect();
    Ok(vec![sym_val(dims, false, n)])
}

fn concat(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let ins: Vec<Val> = (0..n.n_inputs())
        .filter_map(|k| cx.opt_input(n, k).transpose())
        .collect::<Result<_, NodeErr>>()?;
    if ins.iter().any(|v| matches!(v, Val::Shape(..))) {
        let mut all = Vec::new();
        for v in &ins {
            let (s, _) = sym_ints(v).ok_or("Concat mixes a dynamic shape with data")?;
            all.extend(s);
        }
        return Ok(vec![sym_val(all, false, n)]);
    }
    if let Some(x) = unsplit(cx, n) {
        return Ok(vec![x]);
    }
    let first = ins.first().ok_or("Concat needs operands")?;
    let rank = cx.ty(first)?.rank();
    let axis = norm_axis(n.attrs.int("axis", 0)?, rank)?;
    // Sizes off the axis are equal at run time: learn what that says about symbols
    // (bags over `n - 1` offsets next to a `B`-row input: `n = B+1`).
    for v in &ins[1..] {
        for k in (0..rank).filter(|&k| k != axis) {
            let (a, b) = (cx.ty(first)?, cx.ty(v)?);
            if let (Some(da), Some(db)) = (a.shape.get(k), b.shape.get(k)) {
                cx.unify(da, db);
            }
        }
    }
    Ok(vec![cx.emit(Op::Concat { axis }, &ins, &n.out_name(0))?])
}

/// The value a `Concat` puts back together: every piece of one `Split`, in order,
/// on the split's axis (TorchRec's `KeyedTensor` splits the pooled embeddings by
/// key and concatenates them again). `None` for any other `Concat`, or when the
/// split did not import.
fn unsplit(cx: &Ctx<'_>, n: &NodeCx<'_>) -> Option<Val> {
    let first = n.proto.input.first()?;
    let s = cx
        .graph
        .node
        .iter()
        .find(|p| p.output.iter().any(|o| o == first))?;
    if s.op_type.as_deref() != Some("Split") || s.output != n.proto.input {
        return None;
    }
    cx.lookup(first).ok()?;
    let x = cx.lookup(s.input.first()?).ok()?;
    let rank = cx.ty(&x).ok()?.rank();
    let split_axis = crate::attrs::Attrs::new(s).int("axis", 0).ok()?;
    let axis = n.attrs.int("axis", 0).ok()?;
    (norm_axis(split_axis, rank).ok()? == norm_axis(axis, rank).ok()?).then_some(x)
}

/// A dimension as a symbolic integer.
pub(crate) fn dim_sym(d: &Dim) -> SymI {
    match d {
        Dim::Fixed(k) => SymI::int(*k as i64),
        Dim::Sym(s) => SymI::sym(s),
        Dim::Expr(e) => SymI::from_dim_expr(e).unwrap_or_default(),
    }
}

/// A symbolic integer as a dimension of the IR (a size or one symbol).
pub(crate) fn sym_dim(v: &SymI) -> Result<Dim, String> {
    if let Some(k) = v.as_int() {
        return usize::try_from(k)
            .map(Dim::Fixed)
            .map_err(|_| format!("bad target dimension {k}"));
    }
    match v.as_sym() {
        Some(s) => Ok(Dim::Sym(s.to_string())),
        None => v
            .to_dim_expr()
            .and_then(Dim::from_expr)
            .ok_or_else(|| format!("bad target dimension {v}")),
    }
}

/// The symbolic element count of a shape.
pub(crate) fn numel_sym(shape: &[Dim]) -> Option<SymI> {
    shape
        .iter()
        .try_fold(SymI::int(1), |acc, d| acc.mul(&dim_sym(d)))
}

/// Resolves an ONNX reshape target against the input shape: `0` copies the input
/// dimension (unless `allowzero`), `-1` is the element count divided by the others',
/// computed symbolically (`[B,3] -> [-1]` is `[B*3]`).
fn resolve_target(input: &[Dim], target: &[SymI], allowzero: bool) -> Result<Vec<Dim>, String> {
    let mut out: Vec<Option<SymI>> = Vec::with_capacity(target.len());
    let mut infer_at = None;
    for (k, t) in target.iter().enumerate() {
        out.push(match t.as_int() {
            Some(0) if !allowzero => {
                Some(dim_sym(input.get(k).ok_or(
                    "a 0 in the target copies a missing input dimension",
                )?))
            }
            Some(-1) if infer_at.is_none() => {
                infer_at = Some(k);
                None
            }
            Some(v) if v < 0 => return Err(format!("bad target dimension {v}")),
            _ => Some(t.clone()),
        });
    }
    if let Some(k) = infer_at {
        let total = numel_sym(input).ok_or("the element count overflows")?;
        let known = out
            .iter()
            .flatten()
            .try_fold(SymI::int(1), |acc, d| acc.mul(d))
            .ok_or("the element count overflows")?;
        out[k] = Some(divide_sym(&total, &known).ok_or_else(|| {
            format!("cannot infer the -1 dimension: {total} elements do not divide by {known}")
        })?);
    }
    out.iter().flatten().map(sym_dim).collect()
}

/// `a / b` for symbolic counts where `b` is a known integer times a product of
/// symbols that divides `a`'s one monomial (`B*30 / B*10 = 3`).
fn divide_sym(a: &SymI, b: &SymI) -> Option<SymI> {
    if b.as_int().is_some() {
        return a.div(b);
    }
    let (cb, sb) = b.as_monomial()?;
    let (ca, sa) = a.as_monomial()?;
    let mut rest: Vec<String> = sa.to_vec();
    for s in sb {
        let p = rest.iter().position(|x| x == s)?;
        rest.remove(p);
    }
    if ca % cb != 0 {
        return None;
    }
    rest.iter()
        .try_fold(SymI::int(ca / cb), |acc, s| acc.mul(&SymI::sym(s)))
}

fn reshape(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let x = cx.input(n, 0)?;
    let s = cx.input(n, 1)?;
    let (target, _) = sym_ints(&s).ok_or("Reshape needs a shape computed at import")?;
    let ty = cx.ty(&x)?;
    let shape = resolve_target(&ty.shape, &target, n.attrs.int("allowzero", 0)? != 0)?;
    reshape_to(cx, n, x, shape)
}

fn reshape_to(cx: &mut Ctx<'_>, n: &NodeCx<'_>, x: Val, shape: Vec<Dim>) -> Built {
    if let Val::Shape(v, _) = &x {
        // Reshaping a shape vector between scalar and 1-D forms.
        let scalar = shape.is_empty();
        return Ok(vec![Val::Shape(v.clone(), scalar)]);
    }
    if cx.ty(&x)?.shape == shape {
        return Ok(vec![x]);
    }
    Ok(vec![cx.emit(
        Op::Reshape { shape },
        &[x],
        &n.out_name(0),
    )?])
}

/// The product of some dims as one dim (a symbol may only stand alone).
fn prod(ds: &[Dim]) -> Result<Dim, String> {
    match ds {
        [d] => Ok(d.clone()),
        _ => ds.iter().try_fold(Dim::Fixed(1), |a, d| match (a, d) {
            (Dim::Fixed(x), Dim::Fixed(y)) => Ok(Dim::Fixed(x * y)),
            (Dim::Fixed(1), s) => Ok(s.clone()),
            (s, Dim::Fixed(1)) => Ok(s),
            _ => {
                Err("flattening the dynamic batch with other dimensions is unsupported".to_string())
            }
        }),
    }
}

fn flatten(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let x = cx.input(n, 0)?;
    let ty = cx.ty(&x)?;
    let r = ty.rank();
    let mut axis = n.attrs.int("axis", 1)?;
    if axis < 0 {
        axis += r as i64;
    }
    let axis = usize::try_from(axis)
        .ok()
        .filter(|&a| a <= r)
        .ok_or("axis out of range")?;
    let shape = vec![prod(&ty.shape[..axis])?, prod(&ty.shape[axis..])?];
    reshape_to(cx, n, x, shape)
}

fn transpose(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let x = cx.input(n, 0)?;
    let r = cx.ty(&x)?.rank();
    let perm = match n.attrs.ints("perm") {
        Some(p) => p
            .iter()
            .map(|&a| norm_axis(a, r))
            .collect::<Result<Vec<_>, _>>()?,
        None => (0..r).rev().collect(),
    };
    Ok(vec![cx.emit(
        Op::Transpose { perm },
        &[x],
        &n.out_name(0),
    )?])
}

fn unsqueeze(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let x = cx.input(n, 0)?;
    let ty = cx.ty(&x)?;
    let axes = axes_of(cx, n, 1)?.ok_or("Unsqueeze needs axes")?;
    let out_rank = ty.rank() + axes.len();
    let axes = norm_axes(&axes, out_rank)?;
    let mut src = ty.shape.into_iter();
    let shape: Vec<Dim> = (0..out_rank)
        .map(|k| {
            if axes.contains(&k) {
                Some(Dim::Fixed(1))
            } else {
                src.next()
            }
        })
        .collect::<Option<_>>()
        .ok_or("bad Unsqueeze axes")?;
    reshape_to(cx, n, x, shape)
}

fn squeeze(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let x = cx.input(n, 0)?;
    let ty = cx.ty(&x)?;
    let axes = match axes_of(cx, n, 1)? {
        Some(a) => norm_axes(&a, ty.rank())?,
        None => (0..ty.rank())
            .filter(|&k| ty.shape[k] == Dim::Fixed(1))
            .collect(),
    };
    for &a in &axes {
        if ty.shape[a] != Dim::Fixed(1) {
            return Err(format!("cannot squeeze axis {a} of {ty}: its size is not 1").into());
        }
    }
    let shape = ty
        .shape
        .iter()
        .enumerate()
        .filter(|(k, _)| !axes.contains(k))
        .map(|(_, d)| d.clone())
        .collect();
    reshape_to(cx, n, x, shape)
}

fn gather(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let data = cx.input(n, 0)?;
    let idx = cx.input(n, 1)?;
    let rank = cx.ty(&data)?.rank();
    let axis = norm_axis(n.attrs.int("axis", 0)?, rank)?;
    if let Val::Shape(v, _) = &data {
        let it = cx
            .konst(&idx)
            .ok_or("Gather on a dynamic shape needs constant indices")?;
        let ids = it.to_i64_vec().ok_or("indices must be integers")?;
        let mut out = Vec::new();
        for i in ids {
            let j = if i < 0 { i + v.len() as i64 } else { i };
            out.push(
                usize::try_from(j)
                    .ok()
                    .and_then(|j| v.get(j).cloned())
                    .ok_or(format!("index {i} out of range"))?,
            );
        }
        return Ok(vec![sym_val(out, it.shape.is_empty(), n)]);
    }
    Ok(vec![cx.emit(
        Op::Gather { axis },
        &[data, idx],
        &n.out_name(0),
    )?])
}

fn gather_elements(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let data = cx.input(n, 0)?;
    let idx = cx.input(n, 1)?;
    let axis = norm_axis(n.attrs.int("axis", 0)?, cx.ty(&data)?.rank())?;
    Ok(vec![cx.emit(
        Op::GatherElements { axis },
        &[data, idx],
        &n.out_name(0),
    )?])
}

fn gather_nd(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let data = cx.input(n, 0)?;
    let idx = cx.input(n, 1)?;
    let b = n.attrs.int("batch_dims", 0)?;
    let batch_dims =
        usize::try_from(b).map_err(|_| format!("unsupported attribute value batch_dims={b}"))?;
    Ok(vec![cx.emit(
        Op::GatherNd { batch_dims },
        &[data, idx],
        &n.out_name(0),
    )?])
}

/// ONNX slice bounds for one axis of size `dim`: `(start, end)` clamped, step > 0.
fn bounds(start: i64, end: i64, dim: usize) -> (usize, usize) {
    let d = dim as i64;
    let fix = |v: i64| (if v < 0 { v.saturating_add(d) } else { v }).clamp(0, d) as usize;
    let (s, e) = (fix(start), fix(end));
    (s, e.max(s))
}

/// `Split` of a fixed-size axis into pieces (sizes from the `split` input, opset
/// 13+, or attribute, or equal pieces, one per output): each piece is a `slice`
/// of the axis, so a piece later squeezed is a row of the input (the reference
/// DLRM's Criteo mode iterates its stacked `[T, B]` ids this way).
fn split(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let x = cx.input(n, 0)?;
    let ty = cx.ty(&x)?;
    let axis = norm_axis(n.attrs.int("axis", 0)?, ty.rank())?;
    let Dim::Fixed(len) = ty.shape[axis] else {
        return Err(format!(
            "splitting the dynamic dimension {} is unsupported",
            ty.shape[axis]
        )
        .into());
    };
    let outs = n.proto.output.len();
    let sizes: Vec<i64> = match cx.opt_input(n, 1)? {
        Some(v) => cx.const_ints(&v, "split")?,
        None => match n.attrs.ints("split") {
            Some(s) => s,
            None => {
                if outs == 0 || !len.is_multiple_of(outs) {
                    return Err(
                        format!("{len} elements do not split into {outs} equal pieces").into(),
                    );
                }
                vec![(len / outs) as i64; outs]
            }
        },
    };
    if sizes.len() != outs
        || sizes.iter().any(|&s| s < 0)
        || sizes.iter().sum::<i64>() != len as i64
    {
        return Err(format!(
            "split sizes {sizes:?} do not cut an axis of {len} into {outs} pieces"
        )
        .into());
    }
    let mut vals = Vec::with_capacity(outs);
    let mut at = 0usize;
    for (k, &size) in sizes.iter().enumerate() {
        let size = size as usize;
        let op = Op::Slice {
            axes: vec![axis],
            starts: vec![at],
            ends: vec![Dim::Fixed(at + size)],
            steps: vec![1],
        };
        vals.push(cx.emit(op, std::slice::from_ref(&x), &n.out_name(k))?);
        at += size;
    }
    Ok(vals)
}

fn slice(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let x = cx.input(n, 0)?;
    let ty = cx.ty(&x)?;
    let ints = |cx: &Ctx<'_>, k: usize, what: &str| -> Result<Option<Vec<i64>>, NodeErr> {
        match cx.opt_input(n, k)? {
            Some(v) => Ok(Some(cx.const_ints(&v, what)?)),
            None => Ok(None),
        }
    };
    let starts = ints(cx, 1, "starts")?.ok_or("Slice needs starts")?;
    let ends = ints(cx, 2, "ends")?.ok_or("Slice needs ends")?;
    let axes = match ints(cx, 3, "axes")? {
        Some(a) => a
            .iter()
            .map(|&a| norm_axis(a, ty.rank()))
            .collect::<Result<Vec<_>, _>>()?,
        None if starts.len() <= ty.rank() => (0..starts.len()).collect(),
        None => {
            return Err(format!(
                "{} starts for an operand of rank {} (and no axes)",
                starts.len(),
                ty.rank()
            )
            .into());
        }
    };
    let steps = ints(cx, 4, "steps")?.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err("starts, ends, axes and steps must have the same length".into());
    }
    if starts.is_empty() {
        return Err("Slice needs at least one axis".into());
    }
    if let Some(s) = steps.iter().find(|&&s| s <= 0) {
        return Err(format!("unsupported attribute value: step {s} (only positive steps)").into());
    }
    if let Val::Shape(v, _) = &x {
        let (s, e) = bounds(starts[0], ends[0], v.len());
        let out: Vec<SymI> = v[s..e].iter().step_by(steps[0] as usize).cloned().collect();
        return Ok(vec![sym_val(out, false, n)]);
    }
    let (mut a2, mut s2, mut e2, mut st2) = (vec![], vec![], vec![], vec![]);
    for i in 0..axes.len() {
        match &ty.shape[axes[i]] {
            Dim::Fixed(d) => {
                let (s, e) = bounds(starts[i], ends[i], *d);
                a2.push(axes[i]);
                s2.push(s);
                e2.push(Dim::Fixed(e));
                st2.push(steps[i] as usize);
            }
            sym => {
                if !(starts[i] == 0 && ends[i] >= i32::MAX as i64 && steps[i] == 1) {
                    return Err(format!(
                        "slicing part of the dynamic dimension {sym} is unsupported"
                    )
                    .into());
                }
            }
        }
    }
    if a2.is_empty() {
        return Ok(vec![x]);
    }
    let op = Op::Slice {
        axes: a2,
        starts: s2,
        ends: e2,
        steps: st2,
    };
    Ok(vec![cx.emit(op, &[x], &n.out_name(0))?])
}
