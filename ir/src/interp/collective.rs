//! Collectives: `all_reduce` and `all_to_all` over the rank's [`Communicator`].
//!
//! `all_reduce` calls [`Communicator::all_reduce_sum`] once per node, on its
//! operands packed back to back (a gradient bucket of several operands is one
//! call; the communicator gives every rank identical bits).
//!
//! `all_to_all` moves f32 values (bf16 operands are widened exactly and the results
//! stored in their declared dtype). Rank `r`'s samples of a `[G, ..]` tensor are
//! rows [`crate::batch_slice`]`(G, ranks, r)`. The buffer one rank sends another is
//! the concatenation, in tensor order, of the row-major blocks involved:
//! - `scatter`: to rank `r`, rows `slice(r)` of each of this rank's tensors; from
//!   rank `r`, the `[B, ..]` blocks of `r`'s tensors, whose shapes are the declared
//!   result types (symbols resolved with `ctx.syms`);
//! - `gather`: to rank `r`, the whole `[B, ..]` operands owned by `r`; from rank `r`,
//!   rows `slice(r)` of each of this rank's tensors, written in place.
//!
//! Local checks (group size, rank, operand count and shapes, `G` and `B`) run before
//! any communication; when one fails the op calls [`Communicator::abort`] so that
//! the peers, which may already wait in the exchange, fail instead of hanging.
//!
//! [`Communicator`]: crate::Communicator
//! [`Communicator::all_reduce_sum`]: crate::Communicator::all_reduce_sum
//! [`Communicator::abort`]: crate::Communicator::abort

use super::EvalCtx;
use super::common::{R, describe, fmt_shape, numel, resolve_dim, resolve_shape, store};
use crate::{A2aDir, Data, Dim, Tensor, TensorType, batch_slice};
use std::ops::Range;

/// Aborts the group with `why` and returns it as the op's error.
fn fail(ctx: &EvalCtx<'_>, why: String) -> String {
    ctx.comm.abort(&why);
    why
}

/// `all_reduce(x_0, .., x_k)`: elementwise sums over the ranks, with one
/// [`Communicator::all_reduce_sum`](crate::Communicator::all_reduce_sum) call for
/// the whole node (a gradient bucket): the operands are packed back to back into
/// one buffer, reduced, and the results cut from it in operand order.
pub(super) fn all_reduce(ins: &[&Tensor], ctx: &EvalCtx<'_>) -> R<Vec<Tensor>> {
    let mut lens = Vec::with_capacity(ins.len());
    for (i, t) in ins.iter().enumerate() {
        let what = format!("all_reduce operand {i}");
        match (&t.data, super::common::check_len(t, &what)) {
            (Data::F32(v), Ok(_)) => lens.push(v.len()),
            (_, Err(e)) => return Err(fail(ctx, e)),
            _ => {
                return Err(fail(
                    ctx,
                    format!("{what} must be f32, got {}", describe(t)),
                ));
            }
        }
    }
    let mut buf = Vec::with_capacity(lens.iter().sum());
    for t in ins {
        if let Data::F32(v) = &t.data {
            buf.extend_from_slice(v);
        }
    }
    ctx.comm
        .all_reduce_sum(&mut buf)
        .map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(ins.len());
    let mut at = 0;
    for (t, n) in ins.iter().zip(lens) {
        out.push(Tensor {
            shape: t.shape.clone(),
            data: Data::F32(buf[at..at + n].to_vec()),
        });
        at += n;
    }
    Ok(out)
}

/// The rows of `rows` in a row-major block with `inner` elements per row.
fn rows_of(rows: &Range<usize>, inner: usize) -> Range<usize> {
    rows.start * inner..rows.end * inner
}

/// A float operand widened to f32, with its elements per sample (product of the
/// dims after the first).
fn sample_major(t: &Tensor, what: &str) -> R<(Vec<f32>, usize)> {
    if t.shape.is_empty() {
        return Err(format!("{what} {} needs a sample axis", describe(t)));
    }
    let inner = numel(&t.shape[1..])?;
    let v = super::common::floats(t, what)?.into_owned();
    Ok((v, inner))
}

/// `all_to_all {dir, counts, rank}`.
pub(super) fn all_to_all(
    dir: A2aDir,
    counts: &[usize],
    rank: usize,
    ins: &[&Tensor],
    out_types: &[TensorType],
    ctx: &EvalCtx<'_>,
) -> R<Vec<Tensor>> {
    let plan = Exchange::new(dir, counts, rank, ins, out_types, ctx).map_err(|e| fail(ctx, e))?;
    let recv = ctx
        .comm
        .all_to_all_v(plan.send)
        .map_err(|e| e.to_string())?;
    match dir {
        A2aDir::Scatter => {
            // recv[r] holds r's tensors, restricted to this rank's samples.
            let mut out = Vec::with_capacity(plan.shapes.len());
            let mut next = 0usize;
            for (r, buf) in recv.into_iter().enumerate() {
                let mine = next..next + counts[r];
                next = mine.end;
                let want: usize = plan.numels[mine.clone()].iter().sum();
                if buf.len() != want {
                    return Err(format!(
                        "rank {r} sent {} values, expected {want} for its {} tensors",
                        buf.len(),
                        counts[r]
                    ));
                }
                let mut off = 0usize;
                for j in mine {
                    let n = plan.numels[j];
                    let vals = buf[off..off + n].to_vec();
                    off += n;
                    out.push(store(out_types[j].dtype, plan.shapes[j].clone(), vals)?);
                }
            }
            Ok(out)
        }
        A2aDir::Gather => {
            // recv[r] holds rows slice(r) of each of this rank's tensors.
            let ranks = counts.len();
            let mut full: Vec<Vec<f32>> = plan.numels.iter().map(|&n| vec![0.0f32; n]).collect();
            for (r, buf) in recv.into_iter().enumerate() {
                let rows = batch_slice(plan.global, ranks, r);
                let want: usize = plan.inners.iter().map(|&i| rows.len() * i).sum();
                if buf.len() != want {
                    return Err(format!(
                        "rank {r} sent {} values, expected {want} (rows {rows:?} of {} tensors)",
                        buf.len(),
                        plan.inners.len()
                    ));
                }
                let mut off = 0usize;
                for (dst, &inner) in full.iter_mut().zip(&plan.inners) {
                    let n = rows.len() * inner;
                    dst[rows_of(&rows, inner)].copy_from_slice(&buf[off..off + n]);
                    off += n;
                }
            }
            full.into_iter()
                .zip(&plan.shapes)
                .zip(out_types)
                .map(|((v, shape), ty)| store(ty.dtype, shape.clone(), v))
                .collect()
        }
    }
}

/// What one rank sends and expects, computed from local information only.
struct Exchange {
    /// The buffers to send, one per rank.
    send: Vec<Vec<f32>>,
    /// The concrete result shapes.
    shapes: Vec<Vec<usize>>,
    /// Their element counts.
    numels: Vec<usize>,
    /// Gather: elements per sample of each result.
    inners: Vec<usize>,
    /// The global batch `G`.
    global: usize,
}

/// Where this rank stands in the exchange: checked against the group and the
/// symbol binding, from local information only.
struct Place {
    /// The group's size.
    ranks: usize,
    /// The global batch `G`.
    global: usize,
    /// This rank's samples of `G`.
    local: Range<usize>,
    /// The positions of this rank's tensors in the exchange's list.
    own: Range<usize>,
}

impl Exchange {
    fn new(
        dir: A2aDir,
        counts: &[usize],
        rank: usize,
        ins: &[&Tensor],
        out_types: &[TensorType],
        ctx: &EvalCtx<'_>,
    ) -> R<Exchange> {
        let at = Place::of(counts, rank, ctx)?;
        Self::check_counts(dir, counts, rank, &at, ins.len(), out_types.len())?;
        let lead = match dir {
            A2aDir::Scatter => at.global,
            A2aDir::Gather => at.local.len(),
        };
        let mut vals = Vec::with_capacity(ins.len());
        for (i, t) in ins.iter().enumerate() {
            let what = format!("all_to_all operand {i}");
            let (v, inner) = sample_major(t, &what)?;
            if t.shape[0] != lead {
                let global = at.global;
                let which = match dir {
                    A2aDir::Scatter => format!("G = {global}"),
                    A2aDir::Gather => format!("this rank's {} of the G = {global} samples", lead),
                };
                return Err(format!("{what} {} must have {which} rows", describe(t)));
            }
            vals.push((v, inner));
        }
        match dir {
            A2aDir::Scatter => Self::scatter(&at, &vals, ins, out_types, ctx),
            A2aDir::Gather => Self::gather(&at, counts, &vals, ins),
        }
    }

    /// `ins` operands and `outs` results for `dir` on this rank: the scatter
    /// takes this rank's tensors and gives every tensor's local rows, the
    /// gather the reverse.
    fn check_counts(
        dir: A2aDir,
        counts: &[usize],
        rank: usize,
        at: &Place,
        ins: usize,
        outs: usize,
    ) -> R<()> {
        let total = counts.iter().fold(0usize, |a, &c| a.saturating_add(c));
        let (n_in, n_out) = match dir {
            A2aDir::Scatter => (at.own.len(), total),
            A2aDir::Gather => (total, at.own.len()),
        };
        if ins != n_in || outs != n_out {
            return Err(format!(
                "all_to_all {} on rank {rank} with counts {} takes {n_in} operands and \
                 {n_out} results, got {ins} and {outs}",
                if dir == A2aDir::Scatter {
                    "scatter"
                } else {
                    "gather"
                },
                fmt_shape(counts),
            ));
        }
        Ok(())
    }

    /// The scatter's buffers (to rank `r`, rows `slice(r)` of each operand) and
    /// its results' shapes: the declared types, this rank's samples of each
    /// tensor.
    fn scatter(
        at: &Place,
        vals: &[(Vec<f32>, usize)],
        ins: &[&Tensor],
        out_types: &[TensorType],
        ctx: &EvalCtx<'_>,
    ) -> R<Exchange> {
        let (local, own) = (&at.local, &at.own);
        let mut shapes = Vec::with_capacity(out_types.len());
        for (j, ty) in out_types.iter().enumerate() {
            let shape = resolve_shape(ty, ctx.syms)?;
            if shape.first() != Some(&local.len()) {
                return Err(format!(
                    "result {j} {ty} = {} must have this rank's {} samples",
                    fmt_shape(&shape),
                    local.len()
                ));
            }
            if own.contains(&j) {
                let src = ins[j - own.start];
                if shape[1..] != src.shape[1..] {
                    return Err(format!(
                        "result {j} {ty} is this rank's operand {} {}: shapes differ",
                        j - own.start,
                        describe(src)
                    ));
                }
            }
            shapes.push(shape);
        }
        let numels = shapes.iter().map(|s| numel(s)).collect::<R<Vec<_>>>()?;
        let send = (0..at.ranks)
            .map(|r| {
                let rows = batch_slice(at.global, at.ranks, r);
                let mut buf = Vec::new();
                for (v, inner) in vals {
                    buf.extend_from_slice(&v[rows_of(&rows, *inner)]);
                }
                buf
            })
            .collect();
        Ok(Exchange {
            send,
            shapes,
            numels,
            inners: Vec::new(),
            global: at.global,
        })
    }

    /// The gather's buffers (to rank `r`, the whole operands `r` owns) and its
    /// results' shapes: this rank's tensors with all `G` samples.
    fn gather(
        at: &Place,
        counts: &[usize],
        vals: &[(Vec<f32>, usize)],
        ins: &[&Tensor],
    ) -> R<Exchange> {
        let mut send = Vec::with_capacity(at.ranks);
        let mut next = 0usize;
        for &c in counts {
            let mut buf = Vec::new();
            for (v, _) in &vals[next..next + c] {
                buf.extend_from_slice(v);
            }
            next += c;
            send.push(buf);
        }
        let own = &at.own;
        let mut shapes = Vec::with_capacity(own.len());
        let mut inners = Vec::with_capacity(own.len());
        for k in 0..own.len() {
            let src = ins[own.start + k];
            let mut shape = src.shape.clone();
            shape[0] = at.global;
            shapes.push(shape);
            inners.push(vals[own.start + k].1);
        }
        let numels = shapes.iter().map(|s| numel(s)).collect::<R<Vec<_>>>()?;
        Ok(Exchange {
            send,
            shapes,
            numels,
            inners,
            global: at.global,
        })
    }
}

impl Place {
    /// This rank's place: `counts` name every rank of the group, the op is for
    /// this rank, and `B` (when bound) is its share of `G`.
    fn of(counts: &[usize], rank: usize, ctx: &EvalCtx<'_>) -> R<Place> {
        let ranks = counts.len();
        if ranks != ctx.comm.size() {
            return Err(format!(
                "counts {} name {ranks} ranks but the group has {}",
                fmt_shape(counts),
                ctx.comm.size()
            ));
        }
        if rank != ctx.comm.rank() {
            return Err(format!(
                "the op is for rank {rank} but runs on rank {}",
                ctx.comm.rank()
            ));
        }
        let global = resolve_dim(&Dim::global(), ctx.syms)?;
        let local = batch_slice(global, ranks, rank);
        if let Some(&b) = ctx.syms.get(Dim::BATCH)
            && b != local.len()
        {
            return Err(format!(
                "B is {b} but rank {rank} of {ranks} owns {} of the G = {global} samples",
                local.len()
            ));
        }
        let own_start: usize = counts[..rank].iter().sum();
        Ok(Place {
            ranks,
            global,
            local,
            own: own_start..own_start + counts[rank],
        })
    }
}
