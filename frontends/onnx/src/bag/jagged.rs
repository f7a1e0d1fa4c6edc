//! TorchRec's per-key bags over a jagged batch (a `KeyedJaggedTensor`: `values`,
//! every key's ids one after another, and `lengths[K·R]`, the bag lengths key by
//! key), recognised by what the outer values compute, whatever the exporter's
//! form. With `G` the exclusive prefix sums of the lengths (the total appended),
//! key `k`'s bag `s` is `values[G[kR+s] .. G[kR+s+1]]`; PyTorch computes it as the
//! bag over `ids = values[G[kR] .. G[(k+1)R]]` with offsets `cumsum(row k) - row
//! k` of `lengths` viewed as `[K, R]` (the last bag ending at `len(ids)`).
//!
//! Each outer value is given a meaning ([`J`]): `lengths`, `cumsum(lengths)`
//! (`G[i+1]`), `cumsum - lengths` (`G[i]`), one element of those (`G[j]`, `j` a
//! symbolic integer), the `[K, R]` view and its row `k`, the row's prefix sums,
//! `values[G[a] .. G[b]]`, a length. `Reshape`/`Squeeze`/`Unsqueeze` and
//! `Gather(·, 0)` of one element keep a meaning. The loop's bags are then
//! `embedding_bag[last_offset](table, values, offsets_from_lengths{K, k}(lengths))`
//! when the ids
//! are `values[G[kR] .. G[(k+1)R]]`, the offsets row `k`'s prefix sums followed by
//! the length of those ids, and the loop runs `R` times. The length of `lengths`
//! is made `K·R` (a symbol solved, as `Concat` does), so a run whose lengths do
//! not fit the batch is refused when its sizes are bound.

use super::eval::{R, int_attr, op_of};
use super::shapes::{int_of, len_of, producer};
use crate::import::{Ctx, SymI, Val};
use dlrm_ir::{Dim, Op, Pool};

/// What an outer integer value is, in terms of the jagged batch.
#[derive(Clone, Debug, PartialEq)]
enum J {
    /// A known integer (scalar or one element).
    Int(SymI),
    /// An integer vector graph input (the lengths, the values).
    Input(String),
    /// `cumsum(L)`: entry `i` is `G[i+1]`.
    Incl(String),
    /// `cumsum(L) - L`: entry `i` is `G[i]`.
    Excl(String),
    /// `L` viewed as `[K, N/K]`.
    Grid(String, usize),
    /// Row `k` of the `[K, R]` view: `L[kR .. (k+1)R]`.
    Row(Key),
    /// `cumsum` of row `k`.
    RowIncl(Key),
    /// `cumsum(row) - row`: entry `s` is `G[kR+s] - G[kR]`.
    RowExcl(Key),
    /// One element `G[j]` (scalar or one-element vector).
    At(String, SymI),
    /// `values[G[a] .. G[b]]`.
    Ids(Ids),
    /// The length of a 1-D value (`Shape`, `Size`, `Gather(Shape, 0)`).
    LenOf(String),
    /// Row `k`'s prefix sums followed by the length of some ids: the bags'
    /// offsets relative to `G[kR]`.
    Bounds(Key, Ids),
}

/// Row `k` of lengths `L` viewed as `K` rows.
#[derive(Clone, Debug, PartialEq)]
struct Key {
    lengths: String,
    keys: usize,
    k: usize,
}

#[derive(Clone, Debug, PartialEq)]
struct Ids {
    values: String,
    lengths: String,
    a: SymI,
    b: SymI,
}

/// The meaning of an outer value, if it has one here.
fn mean(cx: &Ctx<'_>, name: &str, depth: usize) -> Option<J> {
    if depth > 24 {
        return None;
    }
    if let Some(v) = int_of(cx, name) {
        return Some(J::Int(v));
    }
    let Some(n) = producer(cx, name) else {
        let v = cx.lookup(name).ok()?;
        let ty = cx.ty(&v).ok()?;
        return (matches!(v, Val::Ir(_)) && ty.rank() == 1 && ty.dtype.is_int())
            .then(|| J::Input(name.to_string()));
    };
    let m = |k: usize| mean(cx, n.input.get(k)?, depth + 1);
    let int = |k: usize| int_of(cx, n.input.get(k)?);
    match op_of(n) {
        "CumSum" => {
            let axis = int(1)?.as_int()?;
            if int_attr(n, "exclusive", 0) != 0 || int_attr(n, "reverse", 0) != 0 {
                return None;
            }
            match m(0)? {
                J::Input(l) if axis == 0 || axis == -1 => Some(J::Incl(l)),
                J::Row(key) if axis == 0 || axis == -1 => Some(J::RowIncl(key)),
                _ => None,
            }
        }
        "Sub" => match (m(0)?, m(1)?) {
            (J::Incl(l), J::Input(l2)) if l == l2 => Some(J::Excl(l)),
            (J::RowIncl(a), J::Row(b)) if a == b => Some(J::RowExcl(a)),
            _ => None,
        },
        "Reshape" | "Squeeze" | "Unsqueeze" | "Flatten" => {
            let x = m(0)?;
            match x {
                J::Input(l) if op_of(n) == "Reshape" => {
                    let t = cx.lookup(n.input.get(1)?).ok()?;
                    let target = match t {
                        Val::Shape(v, false) => v,
                        other => cx
                            .const_ints(&other, "")
                            .ok()?
                            .into_iter()
                            .map(SymI::int)
                            .collect(),
                    };
                    let keys = usize::try_from(target.first()?.as_int()?).ok()?;
                    (target.len() == 2 && keys > 0).then_some(J::Grid(l, keys))
                }
                // One element, or ids flattened: the same values.
                x @ (J::At(..) | J::LenOf(_) | J::Ids(_)) => Some(x),
                _ => None,
            }
        }
        "Gather" => {
            if int_attr(n, "axis", 0) != 0 {
                return None;
            }
            let j = int(1)?;
            match m(0)? {
                J::Grid(lengths, keys) => {
                    let k = usize::try_from(j.as_int()?).ok().filter(|&k| k < keys)?;
                    Some(J::Row(Key { lengths, keys, k }))
                }
                J::Excl(l) => Some(J::At(l, j)),
                J::Incl(l) => Some(J::At(l, j.add(&SymI::int(1))?)),
                x @ (J::At(..) | J::LenOf(_)) if j.as_int() == Some(0) => Some(x),
                _ => None,
            }
        }
        "Shape" | "Size" if int_attr(n, "start", 0) == 0 => {
            Some(J::LenOf(n.input.first()?.clone()))
        }
        "Slice" => {
            let (J::Input(values), J::At(l, a), J::At(l2, b)) = (m(0)?, m(1)?, m(2)?) else {
                return None;
            };
            let one = |k: usize, want: i64| match n.input.get(k).filter(|s| !s.is_empty()) {
                None => true,
                Some(s) => int_of(cx, s).and_then(|v| v.as_int()) == Some(want),
            };
            (l == l2 && one(3, 0) && one(4, 1)).then_some(J::Ids(Ids {
                values,
                lengths: l,
                a,
                b,
            }))
        }
        "Concat" if n.input.len() == 2 => {
            let (J::RowExcl(key), J::LenOf(x)) = (m(0)?, m(1)?) else {
                return None;
            };
            match mean(cx, &x, depth + 1)? {
                J::Ids(ids) => Some(J::Bounds(key, ids)),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The symbolic length of a 1-D outer value: its type, else from its meaning.
fn length(cx: &Ctx<'_>, name: &str, depth: usize) -> Option<SymI> {
    if let Some(l) = len_of(cx, name) {
        return Some(l);
    }
    if depth > 24 {
        return None;
    }
    let n = producer(cx, name)?;
    match op_of(n) {
        "Slice" => {
            // `[s:]` of a vector.
            let s = int_of(cx, n.input.get(1)?)?.as_int()?;
            let e = int_of(cx, n.input.get(2)?)?.as_int()?;
            let step = n.input.get(4).and_then(|s| int_of(cx, s));
            if s < 0 || e < i64::from(i32::MAX) || step.is_some_and(|v| v != SymI::int(1)) {
                return None;
            }
            length(cx, n.input.first()?, depth + 1)?.sub(&SymI::int(s))
        }
        "Concat" => n
            .input
            .iter()
            .try_fold(SymI::int(0), |acc, i| acc.add(&length(cx, i, depth + 1)?)),
        _ => match mean(cx, name, depth + 1)? {
            J::Row(key) | J::RowIncl(key) | J::RowExcl(key) => row_len(cx, &key),
            J::Bounds(key, _) => row_len(cx, &key)?.add(&SymI::int(1)),
            J::Int(_) | J::At(..) | J::LenOf(_) => Some(SymI::int(1)),
            _ => None,
        },
    }
}

/// `R`, the length of a row of the `[K, R]` view.
fn row_len(cx: &Ctx<'_>, key: &Key) -> Option<SymI> {
    len_of(cx, &key.lengths)?.div(&SymI::int(key.keys as i64))
}

/// The integer a loop bound holds: computed at import, or a length.
fn count_of(cx: &Ctx<'_>, name: &str) -> Option<SymI> {
    match mean(cx, name, 0)? {
        J::Int(v) => Some(v),
        J::LenOf(x) => length(cx, &x, 0),
        _ => None,
    }
}

/// Whether the bag indices are a slice of a vector at bounds computed from
/// lengths (so [`emit`] is the bag's only chance).
pub(super) fn is_jagged(cx: &Ctx<'_>, ids: &str) -> bool {
    matches!(mean(cx, ids, 0), Some(J::Ids(_)))
}

/// Emits the bags of a loop over one key of a jagged batch: `ids` and `arr` (the
/// bag bounds) as described in the module docs, `count` the loop's bound.
pub(super) fn emit(
    cx: &mut Ctx<'_>,
    (table, ids, arr, count): (&str, &str, &str, &str),
    (mode, weighted): (Pool, bool),
    hint: &str,
) -> R<Val> {
    let Some(J::Ids(ids)) = mean(cx, ids, 0) else {
        return Err(
            "the bag indices are not a slice of a vector at bounds computed from lengths".into(),
        );
    };
    let Some(J::Bounds(key, ids2)) = mean(cx, arr, 0) else {
        return Err(format!(
            "the indices are `{}` sliced at prefix sums of `{}`, but the bag bounds are not the prefix sums of one row of those lengths followed by the number of indices (TorchRec's per-key offsets)",
            ids.values, ids.lengths
        ));
    };
    if ids2 != ids || key.lengths != ids.lengths {
        return Err(
            "the bag bounds end at the length of other indices, or count other lengths".into(),
        );
    }
    // The slice is key k's: `G[kR] .. G[(k+1)R]`, R the rows' length.
    let r = ids.b.sub(&ids.a).ok_or("bad slice bounds")?;
    let k = SymI::int(key.k as i64);
    let (ka, kb) = (k.mul(&r), k.add(&SymI::int(1)).and_then(|k1| k1.mul(&r)));
    if ka.as_ref() != Some(&ids.a) || kb.as_ref() != Some(&ids.b) {
        return Err(format!(
            "the indices of key {} are sliced at G[{}] .. G[{}], not at key {}'s bags",
            key.k, ids.a, ids.b, key.k
        ));
    }
    // The lengths hold K rows of R: solve their length's symbol (refused at run
    // time when the sizes do not fit).
    let l = cx.lookup(&key.lengths).map_err(super::eval::err_text)?;
    let n_dim = cx
        .ty(&l)?
        .shape
        .first()
        .cloned()
        .ok_or("the lengths are not a vector")?;
    let want = r
        .mul(&SymI::int(key.keys as i64))
        .and_then(|v| v.to_dim_expr())
        .and_then(Dim::from_expr)
        .ok_or("the lengths' size is not a dimension")?;
    if !cx.unify(&n_dim, &want) {
        return Err(format!(
            "the {n_dim} lengths are not {} keys of {r} bags",
            key.keys
        ));
    }
    match count_of(cx, count) {
        Some(c) if c == r => {}
        Some(c) => return Err(format!("the loop runs {c} times over {r} bags")),
        None => return Err("the loop's bound is not known at import".into()),
    }
    if weighted {
        return Err(
            "per-sample weights on the bags of a jagged batch are not supported yet".into(),
        );
    }
    let offsets = key_offsets(cx, &key, hint)?;
    let (t, v) = (
        cx.lookup(table).map_err(super::eval::err_text)?,
        cx.lookup(&ids.values).map_err(super::eval::err_text)?,
    );
    let op = Op::EmbeddingBag {
        mode,
        last_offset: true,
    };
    cx.emit(op, &[t, v, offsets], hint)
}

/// `offsets_from_lengths{K, k}(lengths)`: the `R+1` bounds of key `k`'s bags in
/// the values.
fn key_offsets(cx: &mut Ctx<'_>, key: &Key, hint: &str) -> R<Val> {
    let l = cx.lookup(&key.lengths).map_err(super::eval::err_text)?;
    let op = Op::OffsetsFromLengths {
        keys: key.keys,
        key: key.k,
    };
    cx.emit(op, &[l], &format!("{hint}_offsets"))
}
