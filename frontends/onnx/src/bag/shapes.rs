//! Symbolic integers and shapes of the enclosing graph's values around a loop: what
//! the import computed, else what the exporter's shape arithmetic computes for
//! values the import could not represent.

use super::eval::{int_attr, op_of};
use crate::import::{Ctx, SymI, Val};
use crate::proto::NodeProto;
use std::cell::Cell;

/// The symbolic integer an outer name holds, if the import computed one.
pub(super) fn sym_of(cx: &Ctx<'_>, name: &str) -> Option<SymI> {
    match cx.lookup(name).ok()? {
        Val::Shape(v, _) if v.len() == 1 => v.into_iter().next(),
        Val::Const(t, _) => {
            let v = t.to_i64_vec()?;
            (v.len() == 1).then(|| SymI::int(v[0]))
        }
        _ => None,
    }
}

pub(super) fn same_value(cx: &Ctx<'_>, a: &str, b: &str) -> bool {
    a == b || matches!((int_of(cx, a), int_of(cx, b)), (Some(x), Some(y)) if x == y)
}

/// The symbolic integer an outer name holds: what the import computed, else what
/// the shape arithmetic around bag bounds computes (`Gather(Shape(x), k)`, `Size`,
/// `+ - *`), for values the import could not represent (a `Concat` of the offsets
/// with a length is data, not a shape).
pub(super) fn int_of(cx: &Ctx<'_>, name: &str) -> Option<SymI> {
    int_in(cx, name, &budget(cx))
}

/// Producers [`int_of`] and [`shape_of`] may follow in one question: a value's
/// shape arithmetic needs a few, so running out means a cycle (a malformed
/// model; the cap also bounds the recursion's depth) or a chain of values reused
/// as both operands.
fn budget(cx: &Ctx<'_>) -> Cell<usize> {
    Cell::new((16 * cx.graph.node.len() + 256).min(2048))
}

fn int_in(cx: &Ctx<'_>, name: &str, b: &Cell<usize>) -> Option<SymI> {
    b.set(b.get().checked_sub(1)?);
    if let Some(v) = sym_of(cx, name) {
        return Some(v);
    }
    let n = producer(cx, name)?;
    let input = |k: usize| n.input.get(k).map(String::as_str);
    match op_of(n) {
        "Squeeze" | "Unsqueeze" | "Reshape" => int_in(cx, input(0)?, b),
        "Shape" => {
            let s = shape_in(cx, input(0)?, b)?;
            let start = usize::try_from(int_attr(n, "start", 0)).ok()?;
            (s.len() == start + 1).then(|| s[start].clone())
        }
        "Gather" => {
            let s = producer(cx, input(0)?).filter(|s| op_of(s) == "Shape")?;
            let k = sym_of(cx, input(1)?)?.as_int()?;
            let shape = shape_in(cx, s.input.first()?, b)?;
            let start = int_attr(s, "start", 0);
            let at = usize::try_from(if k < 0 {
                k + shape.len() as i64
            } else {
                k + start
            })
            .ok()?;
            shape.get(at).cloned()
        }
        "Size" => shape_in(cx, input(0)?, b)?
            .iter()
            .try_fold(SymI::int(1), |a, d| a.mul(d)),
        op @ ("Add" | "Sub" | "Mul") => {
            let (x, y) = (int_in(cx, input(0)?, b)?, int_in(cx, input(1)?, b)?);
            match op {
                "Add" => x.add(&y),
                "Sub" => x.sub(&y),
                _ => x.mul(&y),
            }
        }
        _ => None,
    }
}

/// The symbolic shape of an outer value: its IR type, else derived through the
/// ops that compute bag bounds (`Concat` and `Slice` of vectors, `Reshape` to
/// `[-1]`, `Range`).
pub(super) fn shape_of(cx: &Ctx<'_>, name: &str) -> Option<Vec<SymI>> {
    shape_in(cx, name, &budget(cx))
}

fn shape_in(cx: &Ctx<'_>, name: &str, b: &Cell<usize>) -> Option<Vec<SymI>> {
    b.set(b.get().checked_sub(1)?);
    if let Ok(v) = cx.lookup(name)
        && let Ok(ty) = cx.ty(&v)
    {
        return Some(ty.shape.iter().map(crate::ops::dim_sym).collect());
    }
    let n = producer(cx, name)?;
    let input = |k: usize| n.input.get(k).map(String::as_str);
    let len = |v: Vec<SymI>| -> Option<SymI> { (v.len() == 1).then(|| v[0].clone()) };
    match op_of(n) {
        "Unsqueeze" => {
            // A scalar made a one-element vector.
            int_in(cx, input(0)?, b)?;
            Some(vec![SymI::int(1)])
        }
        "Concat" => {
            let mut total = SymI::int(0);
            for i in &n.input {
                total = total.add(&len(shape_in(cx, i, b)?)?)?;
            }
            Some(vec![total])
        }
        "Slice" => {
            // One axis of a vector, a constant start and an end past it (`[s:]`).
            let l = len(shape_in(cx, input(0)?, b)?)?;
            let s = sym_of(cx, input(1)?)?.as_int()?;
            let e = sym_of(cx, input(2)?)?.as_int()?;
            if let Some(st) = input(4).filter(|s| !s.is_empty()) {
                (sym_of(cx, st)?.as_int()? == 1).then_some(())?;
            }
            (s >= 0 && e >= i64::from(i32::MAX))
                .then(|| l.sub(&SymI::int(s)))?
                .map(|v| vec![v])
        }
        "Reshape" => {
            let t = cx.lookup(input(1)?).ok()?;
            (cx.const_ints(&t, "").ok()? == [-1]).then_some(())?;
            let numel = shape_in(cx, input(0)?, b)?
                .iter()
                .try_fold(SymI::int(1), |a, d| a.mul(d))?;
            Some(vec![numel])
        }
        "Range" => {
            let (s, l, d) = (
                int_in(cx, input(0)?, b)?,
                int_in(cx, input(1)?, b)?,
                int_in(cx, input(2)?, b)?,
            );
            (d.as_int()? > 0).then_some(())?;
            Some(vec![l.sub(&s)?.div(&d)?])
        }
        _ => None,
    }
}

/// The length of an outer 1-D value, symbolically.
pub(super) fn len_of(cx: &Ctx<'_>, name: &str) -> Option<SymI> {
    let s = shape_of(cx, name)?;
    (s.len() == 1).then(|| s[0].clone())
}

/// The producer of an outer name, through `Identity`/`Cast`.
pub(super) fn producer<'m>(cx: &Ctx<'m>, name: &'m str) -> Option<&'m NodeProto> {
    producer_out(cx, name).map(|(n, _)| n)
}

/// [`producer`], and which of its outputs the name is (through `Identity`/`Cast`).
pub(super) fn producer_out<'m>(cx: &Ctx<'m>, mut name: &'m str) -> Option<(&'m NodeProto, usize)> {
    for _ in 0..32 {
        let n = cx
            .graph
            .node
            .iter()
            .find(|n| n.output.iter().any(|o| o == name))?;
        match op_of(n) {
            "Identity" | "Cast" => name = n.input.first()?,
            _ => return Some((n, n.output.iter().position(|o| o == name)?)),
        }
    }
    None
}

/// An integer value before the integer `Cast`s that only widen or narrow its type
/// (the exporter casts int32 offsets to int64 to append the length; the bag takes
/// either type).
pub(super) fn uncast_int(cx: &Ctx<'_>, name: &str) -> String {
    let mut name = name.to_string();
    for _ in 0..8 {
        let Some(n) = cx
            .graph
            .node
            .iter()
            .find(|n| n.output.first() == Some(&name))
        else {
            break;
        };
        let Some(src) = n.input.first() else { break };
        let int = |v: &str| {
            cx.lookup(v)
                .ok()
                .and_then(|v| cx.ty(&v).ok())
                .is_some_and(|t| t.dtype.is_int())
        };
        if !(matches!(op_of(n), "Cast" | "Identity") && int(src) && int(&name)) {
            break;
        }
        name = src.clone();
    }
    name
}

/// The flat index vector's origin: a 2-D `[n, P]` value flattened by `Reshape`s,
/// as `(name, P, numel)`.
pub(super) fn flattened<'m>(cx: &Ctx<'m>, ids: &'m str) -> Option<(&'m str, usize, SymI)> {
    let mut name = ids;
    for _ in 0..8 {
        if let Ok(v) = cx.lookup(name)
            && let Ok(ty) = cx.ty(&v)
            && ty.rank() == 2
        {
            let p = ty.shape[1].fixed()?;
            return Some((name, p, crate::ops::numel_sym(&ty.shape)?));
        }
        let n = producer(cx, name)?;
        if op_of(n) != "Reshape" {
            return None;
        }
        name = n.input.first()?;
    }
    None
}
