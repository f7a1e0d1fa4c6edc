//! TorchRec's per-key bags over a jagged batch (a `KeyedJaggedTensor`: `values`,
//! every key's ids one after another, and `lengths[K·R]`, the bag lengths key by
//! key), recognised by what the outer values compute, whatever the exporter's
//! form. With `G` the exclusive prefix sums of the lengths (the total appended),
//! key `k`'s bag `s` is `values[G[kR+s] .. G[kR+s+1]]`; PyTorch computes it as the
//! bag over `ids = values[G[kR] .. G[(k+1)R]]` with offsets relative to `G[kR]`:
//! `cumsum(row k) - row k` of `lengths` viewed as `[K, R]` followed by `len(ids)`
//! (a hand-written KJT split), or row `k` of `Concat(zeros[K, 1], cumsum(view, 1))`
//! used whole (include_last_offset; `KeyedJaggedTensor.to_dict()`).
//!
//! Each outer value is given a meaning ([`J`]): `lengths`, `cumsum(lengths)`
//! (`G[i+1]`), `cumsum - lengths` (`G[i]`), one element of those (`G[j]`, `j` a
//! symbolic integer) or a difference `G[b] - G[a]`, the `[K, R]` view, its row
//! `k` and the row's prefix sums, the view summed over rows (each key's id count,
//! whose running sums `Add` up to `G[kR]`), the per-row offsets and their row `k`
//! (by `Gather`, or a `Split` or `Slice` piece then `Squeeze`d),
//! `values[G[a] .. G[b]]` (by `Slice`, or by `Split` at `Concat`ed id counts),
//! a length. `Reshape`/`Squeeze`/`Unsqueeze` and `Gather(·, 0)` of one element
//! keep a meaning. The loop's bags are then
//! `embedding_bag[last_offset](table, values, offsets_from_lengths{K, k}(lengths))`
//! when the ids are `values[G[kR] .. G[(k+1)R]]`, the offsets row `k`'s relative
//! bounds as above, and the loop runs `R` times. `R` is the length of the
//! reshape's rows, `len(lengths) / K` (a symbol of its own when that length is
//! one, as it is when the batch size is `lengths`' own, TorchRec's KJT stride).
//! The length of `lengths` is made `K·R` (a symbol solved, as `Concat` does), so
//! a run whose lengths do not fit the batch is refused when its sizes are bound.

use super::eval::{R, int_attr, op_of};
use super::shapes::{int_of, len_of, producer, producer_out};
use crate::import::{Ctx, SymI, Val};
use crate::proto::NodeProto;
use dlrm_ir::{Dim, Op, Pool};
use std::cell::Cell;

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
    /// One element `G[b] - G[a]` (`a > 0`; `a = 0` is [`J::At`]).
    Span(String, SymI, SymI),
    /// The `[K, R]` view summed over its rows (`ReduceSum(axes=[1])`): entry `k` is
    /// key `k`'s number of ids, `G[(k+1)R] - G[kR]` (KJT's `length_per_key`).
    KeySums(String, usize),
    /// `cumsum` of the `[K, R]` view along its rows.
    GridIncl(String, usize),
    /// `Concat(zeros[K, 1], cumsum(view, axis 1), axis 1)`: `[K, R+1]`, row `k` key
    /// `k`'s bag bounds relative to `G[kR]` (KJT's `_batched_lengths_to_offsets`).
    GridBounds(String, usize),
    /// Row `k` of [`J::GridBounds`]: `[R+1]`, or `[1, R+1]` when `keep` (a row
    /// split or sliced off, before its `Squeeze`). Its last entry is key `k`'s
    /// number of ids, so it bounds `values[G[kR] .. G[(k+1)R]]` whole
    /// (include_last_offset).
    RowBounds(Key, bool),
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

/// How deep [`mean`] follows operands: TorchScript's chain of `Add`s of the keys'
/// id counts is as deep as the keys are many (some 250 keys fit).
const DEPTH: usize = 256;

/// Producers [`mean`] may follow in one recognition: an acyclic graph's patterns
/// need a few per node, so running out means a cycle or a chain of values reused
/// as both operands (as the loop evaluator's budget, `eval.rs`).
type Budget = Cell<usize>;

fn budget(cx: &Ctx<'_>) -> Budget {
    Cell::new(16 * cx.graph.node.len() + 256)
}

/// The meaning of an outer value, if it has one here.
fn mean(cx: &Ctx<'_>, name: &str, depth: usize, b: &Budget) -> Option<J> {
    if depth > DEPTH {
        return None;
    }
    b.set(b.get().checked_sub(1)?);
    if let Some(v) = int_of(cx, name) {
        return Some(J::Int(v));
    }
    let Some((n, out)) = producer_out(cx, name) else {
        let v = cx.lookup(name).ok()?;
        let ty = cx.ty(&v).ok()?;
        return (matches!(v, Val::Ir(_)) && ty.rank() == 1 && ty.dtype.is_int())
            .then(|| J::Input(name.to_string()));
    };
    let m = |k: usize| mean(cx, n.input.get(k)?, depth + 1, b);
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
                J::Grid(l, keys) if axis == 1 || axis == -1 => Some(J::GridIncl(l, keys)),
                _ => None,
            }
        }
        "Sub" => match (m(0)?, m(1)?) {
            (J::Incl(l), J::Input(l2)) if l == l2 => Some(J::Excl(l)),
            (J::RowIncl(a), J::Row(b)) if a == b => Some(J::RowExcl(a)),
            _ => None,
        },
        "Add" => mean_add(cx, n, depth, b),
        "Slice" => mean_slice(cx, n, depth, b),
        "Split" => mean_split(cx, n, out, depth, b),
        "Concat" if n.input.len() == 2 => mean_concat(cx, n, depth, b),
        "ReduceSum" => {
            let J::Grid(l, keys) = m(0)? else {
                return None;
            };
            (axes(cx, n)? == [1] || axes(cx, n)? == [-1]).then_some(J::KeySums(l, keys))
        }
        "Reshape" | "Squeeze" | "Unsqueeze" | "Flatten" => {
            let x = m(0)?;
            match x {
                J::Input(l) if op_of(n) == "Reshape" => {
                    // `[K, R]` or `[K, -1]`: only `K` matters (a reshape keeps the
                    // element count, so the other is `len / K`).
                    let target = vector_of(cx, n.input.get(1)?)?;
                    let keys = usize::try_from(target.first()?.as_ref()?.as_int()?).ok()?;
                    (target.len() == 2 && keys > 0).then_some(J::Grid(l, keys))
                }
                // A row split off, squeezed to its `[R+1]` bounds.
                J::RowBounds(key, true)
                    if op_of(n) == "Squeeze"
                        && axes(cx, n).is_none_or(|a| a == [0] || a == [-2]) =>
                {
                    Some(J::RowBounds(key, false))
                }
                // One element, or ids flattened: the same values.
                x @ (J::At(..) | J::Span(..) | J::LenOf(_) | J::Ids(_)) => Some(x),
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
                x @ (J::At(..) | J::Span(..) | J::LenOf(_)) if j.as_int() == Some(0) => Some(x),
                x @ (J::KeySums(..) | J::GridBounds(..)) => {
                    // A scalar index drops the axis; a one-element vector keeps it
                    // (so a row must then be squeezed to be bounds).
                    let keep = is_scalar(cx, n.input.get(1)?) != Some(true);
                    pick(cx, x, usize::try_from(j.as_int()?).ok()?, keep)
                }
                _ => None,
            }
        }
        "Shape" | "Size" if int_attr(n, "start", 0) == 0 => {
            Some(J::LenOf(n.input.first()?.clone()))
        }
        _ => None,
    }
}

/// `Add`: running sums of the keys' id counts, `G[a] + (G[b] - G[a])`.
fn mean_add(cx: &Ctx<'_>, n: &NodeProto, depth: usize, b: &Budget) -> Option<J> {
    let m = |k: usize| mean(cx, n.input.get(k)?, depth + 1, b);
    match (m(0)?, m(1)?) {
        (J::Int(z), x @ (J::At(..) | J::Span(..))) | (x @ (J::At(..) | J::Span(..)), J::Int(z))
            if z.as_int() == Some(0) =>
        {
            Some(x)
        }
        (J::At(l, a), J::Span(l2, a2, c)) | (J::Span(l2, a2, c), J::At(l, a))
            if l == l2 && a == a2 =>
        {
            Some(J::At(l, c))
        }
        (J::Span(l, a, c), J::Span(l2, c2, e)) | (J::Span(l2, c2, e), J::Span(l, a, c))
            if l == l2 && c == c2 =>
        {
            Some(span(l, a, e))
        }
        _ => None,
    }
}

/// `Slice`: ids between two positions of `G`, or one entry of the keys' sums or
/// bounds.
fn mean_slice(cx: &Ctx<'_>, n: &NodeProto, depth: usize, b: &Budget) -> Option<J> {
    let m = |k: usize| mean(cx, n.input.get(k)?, depth + 1, b);
    let one = |k: usize, want: i64| match n.input.get(k).filter(|s| !s.is_empty()) {
        None => true,
        Some(s) => int_of(cx, s).and_then(|v| v.as_int()) == Some(want),
    };
    if !(one(3, 0) && one(4, 1)) {
        return None;
    }
    match (m(0)?, m(1)?, m(2)?) {
        (J::Input(values), lo, J::At(l, b)) => {
            let a = match lo {
                J::At(l2, a) if l2 == l => a,
                J::Int(z) if z.as_int() == Some(0) => z,
                _ => return None,
            };
            Some(J::Ids(Ids {
                values,
                lengths: l,
                a,
                b,
            }))
        }
        // `x[j : j+1]` of the keys' sums or bounds.
        (x @ (J::KeySums(..) | J::GridBounds(..)), J::Int(s), J::Int(e)) => {
            let s = usize::try_from(s.as_int()?).ok()?;
            (e.as_int()? == s as i64 + 1)
                .then(|| pick(cx, x, s, true))
                .flatten()
        }
        _ => None,
    }
}

/// `Split` (output `out`): a key's ids, or one entry of the keys' sums or bounds.
fn mean_split(cx: &Ctx<'_>, n: &NodeProto, out: usize, depth: usize, b: &Budget) -> Option<J> {
    let m = |k: usize| mean(cx, n.input.get(k)?, depth + 1, b);
    if int_attr(n, "axis", 0) != 0 {
        return None;
    }
    let sizes = n.input.get(1).filter(|s| !s.is_empty());
    match m(0)? {
        // `values` split at the keys' id counts: key `out`'s ids.
        J::Input(values) => {
            let (lengths, at) = running_sums(cx, sizes?, depth + 1, b)?;
            let (a, b) = (at.get(out)?.clone(), at.get(out + 1)?.clone());
            Some(J::Ids(Ids {
                values,
                lengths,
                a,
                b,
            }))
        }
        // Pieces of one entry (row) of the keys' sums or bounds.
        x @ (J::KeySums(..) | J::GridBounds(..)) => {
            let sizes = match sizes {
                Some(s) => vector_of(cx, s)?
                    .into_iter()
                    .map(|v| v?.as_int())
                    .collect::<Option<Vec<i64>>>()?,
                None => crate::attrs::Attrs::new(n).ints("split")?,
            };
            if sizes.get(out) != Some(&1) {
                return None;
            }
            let start: i64 = sizes[..out].iter().sum();
            pick(cx, x, usize::try_from(start).ok()?, true)
        }
        _ => None,
    }
}

/// `Concat` of two: a row's exclusive prefix sums and the length of ids, or zeros
/// before the rows' prefix sums.
fn mean_concat(cx: &Ctx<'_>, n: &NodeProto, depth: usize, b: &Budget) -> Option<J> {
    let m = |k: usize| mean(cx, n.input.get(k)?, depth + 1, b);
    match m(1)? {
        J::LenOf(x) => {
            let J::RowExcl(key) = m(0)? else {
                return None;
            };
            match mean(cx, &x, depth + 1, b)? {
                J::Ids(ids) => Some(J::Bounds(key, ids)),
                _ => None,
            }
        }
        // Zeros before the rows' prefix sums.
        J::GridIncl(l, keys)
            if matches!(int_attr(n, "axis", 0), 1 | -1) && zero_column(cx, &n.input[0]) =>
        {
            Some(J::GridBounds(l, keys))
        }
        _ => None,
    }
}

/// `G[b] - G[a]`, as [`J::At`] when `a` is 0.
fn span(l: String, a: SymI, b: SymI) -> J {
    if a.as_int() == Some(0) {
        J::At(l, b)
    } else {
        J::Span(l, a, b)
    }
}

/// Entry (row) `k` of the keys' sums or bounds: key `k`'s id count (one element,
/// whatever its shape), or its bag bounds (`keep`: still `[1, R+1]`).
fn pick(cx: &Ctx<'_>, x: J, k: usize, keep: bool) -> Option<J> {
    let (J::KeySums(lengths, keys) | J::GridBounds(lengths, keys)) = &x else {
        return None;
    };
    let key = Key {
        lengths: lengths.clone(),
        keys: *keys,
        k,
    };
    if k >= key.keys {
        return None;
    }
    match x {
        J::KeySums(..) => {
            let r = row_len(cx, &key)?;
            let kk = SymI::int(k as i64);
            let a = kk.mul(&r)?;
            let b = kk.add(&SymI::int(1))?.mul(&r)?;
            Some(span(key.lengths, a, b))
        }
        _ => Some(J::RowBounds(key, keep)),
    }
}

/// The positions `G[0], G[p1], .., G[pK]` that `Concat`ed id counts split a
/// vector at (`Split`'s sizes), and the lengths they count.
fn running_sums(
    cx: &Ctx<'_>,
    sizes: &str,
    depth: usize,
    b: &Budget,
) -> Option<(String, Vec<SymI>)> {
    let (n, _) = producer_out(cx, sizes)?;
    if op_of(n) != "Concat" {
        return None;
    }
    let mut lengths: Option<String> = None;
    let mut at = vec![SymI::int(0)];
    for piece in &n.input {
        let (l, a, e) = match mean(cx, piece, depth + 1, b)? {
            J::At(l, e) => (l, SymI::int(0), e),
            J::Span(l, a, e) => (l, a, e),
            _ => return None,
        };
        if at.last() != Some(&a) || lengths.get_or_insert_with(|| l.clone()) != &l {
            return None;
        }
        at.push(e);
    }
    Some((lengths?, at))
}

/// A 1-D integer value's entries, those known at import (`Concat` of constants
/// and of one-element values): a reshape's target.
fn vector_of(cx: &Ctx<'_>, name: &str) -> Option<Vec<Option<SymI>>> {
    vector_at(cx, name, 0, &budget(cx))
}

fn vector_at(cx: &Ctx<'_>, name: &str, depth: usize, b: &Budget) -> Option<Vec<Option<SymI>>> {
    if depth > DEPTH {
        return None;
    }
    b.set(b.get().checked_sub(1)?);
    if let Ok(v) = cx.lookup(name) {
        match v {
            Val::Shape(s, false) => return Some(s.into_iter().map(Some).collect()),
            Val::Const(t, _) if t.shape.len() == 1 => {
                return Some(
                    t.to_i64_vec()?
                        .into_iter()
                        .map(|v| Some(SymI::int(v)))
                        .collect(),
                );
            }
            _ => {}
        }
    }
    let (n, _) = producer_out(cx, name)?;
    match op_of(n) {
        "Concat" => {
            let mut all = Vec::new();
            for i in &n.input {
                all.extend(vector_at(cx, i, depth + 1, b)?);
            }
            Some(all)
        }
        // A scalar made a one-element vector.
        "Unsqueeze" => Some(vec![int_of(cx, n.input.first()?)]),
        _ => None,
    }
}

/// The axes of a reduction or `Squeeze` (attribute, or constant operand 1);
/// `None` when absent or not constant.
fn axes(cx: &Ctx<'_>, n: &NodeProto) -> Option<Vec<i64>> {
    if let Some(a) = crate::attrs::Attrs::new(n).ints("axes") {
        return Some(a);
    }
    let v = cx.lookup(n.input.get(1).filter(|s| !s.is_empty())?).ok()?;
    cx.const_ints(&v, "").ok()
}

/// Whether an index known at import is a scalar (`None`: not known).
fn is_scalar(cx: &Ctx<'_>, name: &str) -> Option<bool> {
    match cx.lookup(name).ok()? {
        Val::Const(t, _) => Some(t.shape.is_empty()),
        Val::Shape(_, scalar) => Some(scalar),
        _ => None,
    }
}

/// Whether `name` is a `[K, 1]` column of integer zeros: a constant, or
/// `ConstantOfShape` (of value 0) of a shape ending in 1.
fn zero_column(cx: &Ctx<'_>, name: &str) -> bool {
    if let Ok(v) = cx.lookup(name)
        && let Some(t) = cx.konst(&v)
    {
        return t.shape.len() == 2
            && t.shape[1] == 1
            && t.to_i64_vec().is_some_and(|v| v.iter().all(|&x| x == 0));
    }
    let Some((n, _)) = producer_out(cx, name) else {
        return false;
    };
    let zero = match crate::attrs::Attrs::new(n).tensor("value") {
        Ok(Some(t)) => t.to_f32_vec().iter().all(|&x| x == 0.0),
        Ok(None) => true,
        Err(_) => false,
    };
    let shape = n.input.first().and_then(|s| vector_of(cx, s));
    op_of(n) == "ConstantOfShape"
        && zero
        && shape.is_some_and(|s| s.len() == 2 && s[1].as_ref().and_then(SymI::as_int) == Some(1))
}

/// The symbolic length of a 1-D outer value: its type, else from its meaning.
fn length(cx: &Ctx<'_>, name: &str, depth: usize, b: &Budget) -> Option<SymI> {
    if let Some(l) = len_of(cx, name) {
        return Some(l);
    }
    if depth > DEPTH {
        return None;
    }
    b.set(b.get().checked_sub(1)?);
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
            length(cx, n.input.first()?, depth + 1, b)?.sub(&SymI::int(s))
        }
        "Concat" => n.input.iter().try_fold(SymI::int(0), |acc, i| {
            acc.add(&length(cx, i, depth + 1, b)?)
        }),
        _ => match mean(cx, name, depth + 1, b)? {
            J::Row(key) | J::RowIncl(key) | J::RowExcl(key) => row_len(cx, &key),
            J::Bounds(key, _) | J::RowBounds(key, false) => row_len(cx, &key)?.add(&SymI::int(1)),
            J::Int(_) | J::At(..) | J::Span(..) | J::LenOf(_) => Some(SymI::int(1)),
            _ => None,
        },
    }
}

/// `R`, the length of a row of the `[K, R]` view: `len(L) / K`. When that does
/// not divide symbolically (`L`'s length a symbol `n` of its own), `R` is the
/// symbol `n_divK`, which [`emit`] then makes `L`'s length `K·n_divK` (the
/// `[K, R]` view says it is a multiple of `K`).
fn row_len(cx: &Ctx<'_>, key: &Key) -> Option<SymI> {
    let n = len_of(cx, &key.lengths)?;
    let k = SymI::int(key.keys as i64);
    n.div(&k).or_else(|| {
        let s = n.as_sym()?;
        Some(SymI::sym(&format!("{s}_div{}", key.keys)))
    })
}

/// The integer a loop bound holds: computed at import, a length, or one of those
/// plus or minus a constant (dynamo's `Size(offsets) - 1`).
fn count_of(cx: &Ctx<'_>, name: &str, depth: usize, b: &Budget) -> Option<SymI> {
    if depth > DEPTH {
        return None;
    }
    b.set(b.get().checked_sub(1)?);
    match mean(cx, name, depth + 1, b) {
        Some(J::Int(v)) => return Some(v),
        Some(J::LenOf(x)) => return length(cx, &x, depth + 1, b),
        _ => {}
    }
    let (n, _) = producer_out(cx, name)?;
    let c = |k: usize| int_of(cx, n.input.get(k)?);
    let x = |k: usize| count_of(cx, n.input.get(k)?, depth + 1, b);
    match op_of(n) {
        "Sub" => x(0)?.sub(&c(1)?),
        "Add" => match c(1) {
            Some(c1) => x(0)?.add(&c1),
            None => x(1)?.add(&c(0)?),
        },
        "Reshape" | "Squeeze" | "Unsqueeze" => x(0),
        _ => None,
    }
}

/// Whether the bag indices are a slice of a vector at bounds computed from
/// lengths (so [`emit`] is the bag's only chance).
pub(super) fn is_jagged(cx: &Ctx<'_>, ids: &str) -> bool {
    matches!(mean(cx, ids, 0, &budget(cx)), Some(J::Ids(_)))
}

/// Emits the bags of a loop over one key of a jagged batch: `ids` and `arr` (the
/// bag bounds) as described in the module docs, `count` the loop's bound.
pub(super) fn emit(
    cx: &mut Ctx<'_>,
    (table, ids, arr, count): (&str, &str, &str, &str),
    (mode, weighted): (Pool, bool),
    hint: &str,
) -> R<Val> {
    let Some(J::Ids(ids)) = mean(cx, ids, 0, &budget(cx)) else {
        return Err(
            "the bag indices are not a slice of a vector at bounds computed from lengths".into(),
        );
    };
    let key = match mean(cx, arr, 0, &budget(cx)) {
        Some(J::Bounds(key, ids2)) if ids2 == ids => key,
        // Ends at key k's id count, the ids' length once they are key k's.
        Some(J::RowBounds(key, false)) => key,
        Some(J::Bounds(..)) => {
            return Err("the bag bounds end at the length of other indices".into());
        }
        _ => {
            return Err(format!(
                "the indices are `{}` sliced at prefix sums of `{}`, but the bag bounds are neither the prefix sums of one row of those lengths followed by the number of indices nor a row of the lengths' per-row offsets (TorchRec's per-key offsets)",
                ids.values, ids.lengths
            ));
        }
    };
    if key.lengths != ids.lengths {
        return Err("the bag bounds count other lengths than the indices' bounds".into());
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
    match count_of(cx, count, 0, &budget(cx)) {
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
