//! Recognition of `nn.EmbeddingBag` in the `Loop`s PyTorch's exporters write, by
//! what the loop computes rather than by one exporter's layout.
//!
//! The loop body is evaluated abstractly: each value is described by its meaning for
//! bag `i` (the loop's index) — `i + k`, `E[i + k]` for an outer vector `E` (a bag
//! bound), `rows[E[i] .. E[i+1]]` of a per-index value (the indices, the gathered
//! table rows, the per-sample weights), the reduction of those rows (sum or mean),
//! "the bag is empty", zeros. Wrappers that keep a value (`Identity`, `Cast`,
//! `CastLike`, `Reshape`/`Unsqueeze`/`Squeeze` of a one-element value) are looked
//! through. The loop is an EmbeddingBag when its result is, for each of its `n`
//! iterations, the reduction of bag `i` (zeros when empty), with `n` proved equal to
//! `len(E) - 1` by symbolic shape arithmetic, and its index either the trip
//! counter (TorchScript) or a carried counter that starts at 0 and grows by 1 while
//! `counter < n` (dynamo). Rows may be gathered inside the loop (`table[ids[lo..hi]]`)
//! or before it (`(table[ids])[lo..hi]`), weighted or not (a weight that is the
//! constant 1 is no weight); the result may be a scan output or a sequence built by
//! `SequenceInsert`; other loop-carried values must not change.
//!
//! `E` then says which bag form it is: `Concat(offsets, [len(ids)])` gives
//! `embedding_bag(table, ids, offsets)` (or `embedding_bag_weighted`);
//! `Range(0, len(ids), P)` as the offsets of indices that are a `[n, P]` tensor
//! flattened gives the fixed-size `embedding_bag(table, ids2d)`. A loop that does
//! not match is refused with the first reason it did not, naming the node.
//!
//! Indices sliced from a longer vector at prefix sums of lengths are TorchRec's
//! per-key view of a jagged batch: [`jagged`] recognises those bags.

mod eval;
mod jagged;
mod segment;
mod shapes;

pub(crate) use segment::{mean_div, part_of_segment, scatter_nd};

use crate::import::{Ctx, NodeCx, SymI, Val};
use crate::ops::Built;
use crate::proto::{GraphProto, NodeProto};
use dlrm_ir::{Op, Pool};
use eval::{A, Eval, PerIdx, R, Scope, arg, err_text, op_of};
use shapes::{flattened, int_of, len_of, producer, same_value, uncast_int};
use std::collections::HashMap;
use std::rc::Rc;

/// What a loop computes, once recognised.
struct Found {
    v: PerIdx,
    arr: String,
    mode: Pool,
    /// The loop output that holds the bags, and whether they come as a sequence.
    out: usize,
    /// The bound on the index (`n`): trip count or the `Less` limit.
    count: String,
}

/// A loop's body seen from outside: names of its inputs and outputs.
struct Body<'m> {
    node: &'m NodeProto,
    body: &'m GraphProto,
    carried: usize,
}

impl Body<'_> {
    fn input(&self, k: usize) -> String {
        self.body
            .input
            .get(k)
            .and_then(|v| v.name.clone())
            .unwrap_or_default()
    }
    fn output(&self, k: usize) -> String {
        self.body
            .output
            .get(k)
            .and_then(|v| v.name.clone())
            .unwrap_or_default()
    }
}

fn recognise<'m>(cx: &Ctx<'m>, node: &'m NodeProto, body: &'m GraphProto) -> R<Found> {
    let b = Body {
        node,
        body,
        carried: node.input.len().saturating_sub(2),
    };
    let trip = node.input.first().filter(|s| !s.is_empty()).cloned();
    let (mut ev, counter, invariant) = bind_inputs(cx, &b, trip.is_some())?;
    let count = match (counter, &trip) {
        (Some(_), Some(_)) => return Err("both a trip count and a counter".into()),
        (Some(_), None) => counter_bound(cx, &mut ev, &b)?,
        (None, Some(t)) => {
            match ev.eval(&b.output(0))? {
                A::Int(c) if c != 0 => {}
                other => return Err(format!("the loop condition is {other:?}, not true")),
            }
            t.clone()
        }
        (None, None) => return Err("no trip count and no counter from 0 by 1".into()),
    };
    // The bags: a carried sequence, or a scan output.
    let mut found: Option<Found> = None;
    let mut one = |f: Found| match found.replace(f) {
        None => Ok(()),
        Some(_) => Err("the loop computes more than one bag".to_string()),
    };
    for (k, &inv) in invariant.iter().enumerate() {
        match ev.eval(&b.output(1 + k))? {
            A::Append(bag) => {
                let A::Bag { v, arr, mode, keep } = *bag else {
                    return Err("a sequence of something other than bags".into());
                };
                let init = producer(cx, arg(node, 2 + k)?).map(op_of);
                if !keep || init != Some("SequenceEmpty") {
                    return Err(
                        "bags of rank 1, or added to a sequence that is not empty at first".into(),
                    );
                }
                let count = count.clone();
                one(Found {
                    v,
                    arr,
                    mode,
                    out: k,
                    count,
                })?;
            }
            _ if inv => {}
            A::Iter(1) if Some(k) == counter => {}
            other => return Err(format!("loop-carried value {k} becomes {other:?}")),
        }
    }
    for k in 0..body.output.len().saturating_sub(1 + b.carried) {
        match ev.eval(&b.output(1 + b.carried + k))? {
            A::Bag {
                v,
                arr,
                mode,
                keep: false,
            } => {
                let count = count.clone();
                one(Found {
                    v,
                    arr,
                    mode,
                    out: b.carried + k,
                    count,
                })?;
            }
            other => return Err(format!("scan output {k} is {other:?}, not one bag")),
        }
    }
    found.ok_or_else(|| "the loop computes no bag".to_string())
}

/// The meaning of the body's inputs: the bag index (the trip counter, or the
/// carried value that starts at 0 and grows by 1), loop-invariant carried values as
/// the outer values they start as, others as themselves. Returns the evaluator, the
/// counter and which carried values are invariant.
fn bind_inputs<'c, 'm>(
    cx: &'c Ctx<'m>,
    b: &Body<'m>,
    has_trip: bool,
) -> R<(Eval<'c, 'm>, Option<usize>, Vec<bool>)> {
    let mut inputs = HashMap::new();
    for j in 0..b.carried {
        inputs.insert(b.input(2 + j), A::Same(j));
    }
    let mut probe = Eval {
        cx,
        scopes: vec![Scope::of(b.body, inputs.clone())],
        last: false,
    };
    let mut counter = None;
    for j in 0..b.carried {
        if probe.outer(arg(b.node, 2 + j)?)? == A::Int(0) {
            probe.scopes[0].inputs.insert(b.input(2 + j), A::Iter(0));
            if probe.eval(&b.output(1 + j)).ok() == Some(A::Iter(1)) {
                counter = Some(j);
                break;
            }
            probe.scopes[0].inputs.insert(b.input(2 + j), A::Same(j));
        }
    }
    let mut invariant = vec![false; b.carried];
    for (j, inv) in invariant.iter_mut().enumerate() {
        if Some(j) != counter && probe.eval(&b.output(1 + j)).ok() == Some(A::Same(j)) {
            *inv = true;
            inputs.insert(b.input(2 + j), probe.outer(arg(b.node, 2 + j)?)?);
        }
    }
    match counter {
        Some(j) => {
            inputs.insert(b.input(2 + j), A::Iter(0));
        }
        None if has_trip => {
            inputs.insert(b.input(0), A::Iter(0));
            // A condition passed through keeps its first value.
            if let Ok(first) = probe.outer(arg(b.node, 1)?) {
                inputs.insert(b.input(1), first);
            }
        }
        None => {}
    }
    let ev = Eval {
        cx,
        scopes: vec![Scope::of(b.body, inputs)],
        last: false,
    };
    Ok((ev, counter, invariant))
}

/// The bound `n` of a counter loop: the first condition is `0 < n` and the body's is
/// `counter + 1 < n`.
fn counter_bound(cx: &Ctx<'_>, ev: &mut Eval<'_, '_>, b: &Body<'_>) -> R<String> {
    let A::Less { k: 1, n } = ev.eval(&b.output(0))? else {
        return Err("the loop condition is not `counter + 1 < n`".into());
    };
    let first = arg(b.node, 1)?;
    let p = producer(cx, first)
        .filter(|p| op_of(p) == "Less")
        .ok_or("the first condition is not `0 < n`")?;
    let (lhs, rhs) = (ev.outer(arg(p, 0)?)?, ev.outer(arg(p, 1)?)?);
    match rhs {
        A::Outer(m) if lhs == A::Int(0) && same_value(cx, &m, &n) => Ok(n),
        _ => Err("the first condition is not `0 < n`".into()),
    }
}

/// `Loop`: an EmbeddingBag, else an error naming what did not match.
pub(crate) fn lower_loop(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let body = n.attrs.graph("body")?;
    let why = |e: String| format!("unsupported Loop: it does not compute an EmbeddingBag ({e})");
    let f = recognise(cx, n.proto, body).map_err(why)?;
    let bag = emit(cx, &f, &n.out_name(f.out)).map_err(why)?;
    let carried = n.n_inputs().saturating_sub(2);
    let mut outs = Vec::new();
    for k in 0..n.proto.output.len() {
        outs.push(if k == f.out {
            bag.clone()
        } else if k < carried {
            // Other carried values are loop-invariant or the counter (unused).
            match cx.opt_input(n, 2 + k) {
                Ok(Some(v)) => v,
                _ => Val::Failed(Rc::new(
                    cx.node_err(n, format!("Loop output {k} is not supported")),
                )),
            }
        } else {
            Val::Failed(Rc::new(
                cx.node_err(n, format!("Loop scan output {k} is not supported")),
            ))
        });
    }
    Ok(outs)
}

/// Emits the bag of a recognised loop, after checking that its bound `n` is
/// `len(E) - 1` and finding what `E` is.
fn emit(cx: &mut Ctx<'_>, f: &Found, hint: &str) -> R<Val> {
    let PerIdx::TableRows {
        table,
        ids,
        weights,
    } = &f.v
    else {
        return Err("the bag's rows are not gathered from a table".into());
    };
    if jagged::is_jagged(cx, ids) {
        let names = (
            table.as_str(),
            ids.as_str(),
            f.arr.as_str(),
            f.count.as_str(),
        );
        return jagged::emit(cx, names, (f.mode, weights.is_some()), hint);
    }
    let Some(count) = int_of(cx, &f.count) else {
        return Err("the loop's bound is not known at import".into());
    };
    let get = |cx: &Ctx<'_>, name: &str| cx.lookup(name).map_err(err_text);
    let Some(e) = producer(cx, &f.arr) else {
        let rows = (table.as_str(), ids.as_str(), weights.as_deref());
        return emit_last_offset(cx, f, rows, &count, hint);
    };
    let (offsets, fixed) = match op_of(e) {
        "Concat" if e.input.len() == 2 => {
            let (o, tail) = (arg(e, 0)?, arg(e, 1)?);
            let total = match flattened(cx, ids) {
                Some((_, _, numel)) => numel,
                None => len_of(cx, ids).ok_or("the indices are not a vector")?,
            };
            if int_of(cx, tail) != Some(total) {
                return Err("the bounds do not end at the number of indices".into());
            }
            let rng = producer(cx, o).filter(|p| op_of(p) == "Range");
            (uncast_int(cx, o), rng.map(|r| (r, flattened(cx, ids))))
        }
        _ => {
            return Err(
                "the bag bounds are neither `offsets` followed by the number of indices nor offsets used whole (include_last_offset=True)"
                    .into(),
            );
        }
    };
    if let Some((rng, flat)) = fixed {
        // `Range(0, numel, P)` over `[n, P]` indices: fixed-size bags.
        let (src, p, numel) =
            flat.ok_or("Range offsets over indices that are not a flattened matrix")?;
        let (s, l, d) = (
            int_of(cx, arg(rng, 0)?),
            int_of(cx, arg(rng, 1)?),
            int_of(cx, arg(rng, 2)?),
        );
        if s != Some(SymI::int(0)) || l != Some(numel.clone()) || d != Some(SymI::int(p as i64)) {
            return Err("Range offsets that are not 0, P, 2P, .. over [n, P] indices".into());
        }
        let rows = numel
            .div(&SymI::int(p as i64))
            .ok_or("bad fixed bag size")?;
        if count != rows {
            return Err(format!("the loop runs {count} times over {rows} bags"));
        }
        if weights.is_some() {
            return Err("per-sample weights on fixed-size bags are not supported yet".into());
        }
        let (t, i) = (get(cx, table)?, get(cx, src)?);
        let op = Op::EmbeddingBag {
            mode: f.mode,
            last_offset: false,
        };
        return cx.emit(op, &[t, i], hint);
    }
    let n_off = len_of(cx, &offsets).ok_or("the offsets are not a vector")?;
    if count != n_off {
        return Err(format!("the loop runs {count} times over {n_off} bags"));
    }
    let (t, i, o) = (get(cx, table)?, get(cx, ids)?, get(cx, &offsets)?);
    emit_offsets_bag(cx, f.mode, [t, i, o], weights.as_deref(), hint)
}

/// `embedding_bag[_weighted](table, ids, offsets[, weights])`: the bag over
/// offsets, weighted when the loop multiplies the rows by per-sample weights.
pub(super) fn emit_offsets_bag(
    cx: &mut Ctx<'_>,
    mode: Pool,
    [t, i, o]: [Val; 3],
    weights: Option<&str>,
    hint: &str,
) -> R<Val> {
    match weights {
        None => cx.emit(
            Op::EmbeddingBag {
                mode,
                last_offset: false,
            },
            &[t, i, o],
            hint,
        ),
        Some(w) => {
            if mode != Pool::Sum {
                return Err("per-sample weights need mode sum".into());
            }
            let w = cx.lookup(w).map_err(err_text)?;
            cx.emit(Op::EmbeddingBagWeighted, &[t, i, o, w], hint)
        }
    }
}

/// Bounds `E` used whole: PyTorch's `include_last_offset=True`, `n + 1` offsets for
/// `n` bags, the last one the end of the last bag (the CSR form PyTorch documents).
/// The bags are `embedding_bag[last_offset=true](table, ids, E)`, with `n` the
/// loop's bound proved to be `len(E) - 1`. Weighted bags (`embedding_bag_weighted`
/// has no last_offset form) read `E[..n]`, a slice to a dimension expression
/// (`B` of `B+1` offsets), which trusts the last offset to be the number of
/// indices. The table, indices and weights are those [`emit`] found the loop
/// gathering rows from.
fn emit_last_offset(
    cx: &mut Ctx<'_>,
    f: &Found,
    (table, ids, weights): (&str, &str, Option<&str>),
    count: &SymI,
    hint: &str,
) -> R<Val> {
    let len = len_of(cx, &f.arr).ok_or("the bag bounds are not a vector")?;
    let n = len.sub(&SymI::int(1)).ok_or("too many bag bounds")?;
    if *count != n {
        return Err(format!(
            "the loop runs {count} times over {len} bounds used whole (include_last_offset=True needs {n})"
        ));
    }
    let get = |cx: &Ctx<'_>, name: &str| cx.lookup(name).map_err(err_text);
    let end = crate::ops::sym_dim(&n)?;
    let (t, i, e) = (get(cx, table)?, get(cx, ids)?, get(cx, &f.arr)?);
    if weights.is_none() {
        let op = Op::EmbeddingBag {
            mode: f.mode,
            last_offset: true,
        };
        return cx.emit(op, &[t, i, e], hint);
    }
    let slice = Op::Slice {
        axes: vec![0],
        starts: vec![0],
        ends: vec![end],
        steps: vec![1],
    };
    let o = cx.emit(slice, &[e], &format!("{hint}_offsets"))?;
    emit_offsets_bag(cx, f.mode, [t, i, o], weights, hint)
}
