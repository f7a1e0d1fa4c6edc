//! In-place optimizer updates on parameter storage (no copy of the parameter).
//!
//! - [`sgd_in_place`]: `w[i] = w[i] - lr · g[i]`, computed in f32, stored in `w`'s
//!   dtype (f32, or bf16 rounded to nearest even), parallel over chunks.
//! - [`split_sgd`]: Split-SGD-BF16 (the op `split_sgd`): the f32 master
//!   `hi << 16 | lo` is updated in f32 and split again (exact: no rounding).
//! - [`sparse_sgd_in_place`], [`embedding_update`] and
//!   [`split_embedding_update`]: SC20's race-free embedding update. The
//!   table's rows are split into contiguous ranges, one per rayon task; every task
//!   scans *all* indices in order and applies only those that fall in its range.
//!   No two tasks touch the same row, so no atomics or locks, and each row receives
//!   its updates in index order — exactly the sequence of float operations of the
//!   sequential definition, so results are bitwise equal to the interpreter's
//!   (duplicates included). `embedding_update` takes its row gradient straight
//!   from `dy[bag]` (divided by the bag's size for `mean`, as `embedding_bag_grad`
//!   does) without materialising it. A bf16 table (not split) is rounded once per
//!   touched row, after all of its updates (the interpreter's rule): its task
//!   groups its positions by row (stable, so index order within a row) and keeps
//!   the row in f32 meanwhile; an f32 table and a split table need no grouping
//!   (the split form is exact after every update). The same functions update a
//!   row shard in place (`sparse_sgd_rows`, `embedding_update_rows`,
//!   `split_embedding_update_rows`, [`Rows::Shard`]): the tasks' ranges cover
//!   the shard's rows, and positions whose row lies outside it are skipped.
//!
//! Shapes: every kernel takes its operands bound to the update's
//! [`dlrm_ir::NodeInstance`] ([`CheckedMut`]: the op's shape rule verified the
//! shapes and dtypes once, the bind each buffer's length) and reads its dims
//! from there. The kernels check only data (every index, offsets) and do so
//! before writing anything: on error the parameters are unchanged.

use super::{Elem, Indices, Ix, KResult, KernelError, internal_in, read_offsets, validate_indices};
use dlrm_ir::{CheckedMut, Data, Op, Pool, Tensor};
use half::bf16;
use rayon::prelude::*;

/// Elements per task of the dense update.
const CHUNK: usize = 1 << 15;

/// A float gradient, f32 or bf16.
#[derive(Clone, Copy)]
pub(crate) enum Grad<'a> {
    F32(&'a [f32]),
    BF16(&'a [bf16]),
}

pub(crate) fn grad_of<'a>(op: &'static str, g: &'a Tensor) -> KResult<Grad<'a>> {
    match &g.data {
        Data::F32(v) => Ok(Grad::F32(v)),
        Data::BF16(v) => Ok(Grad::BF16(v)),
        _ => Err(KernelError::DType {
            op,
            reason: format!("gradient must be f32 or bf16, got {}", g.dtype()),
        }),
    }
}

/// The dims `[R, D]` of a rank-2 operand whose rank the op's shape rule verified
/// (an internal error if the kernel and the rule disagree, never a panic).
pub(crate) fn dims2(op: &'static str, shape: &[usize]) -> KResult<[usize; 2]> {
    <[usize; 2]>::try_from(shape)
        .map_err(|_| internal_in(op, &format!("{shape:?} is not of rank 2")))
}

/// The operands of a checked update as `K` parameters and `N` others (an internal
/// error if the kernel and the op's arity disagree).
pub(crate) fn operands<'c, 'a, const K: usize, const N: usize>(
    c: &'c mut CheckedMut<'a>,
) -> KResult<(&'c mut [Tensor; K], [&'a Tensor; N])> {
    let name = c.name();
    let (ps, rest) = c.split();
    let rest = <[&Tensor; N]>::try_from(rest)
        .map_err(|_| internal_in(name, &format!("{} operands", rest.len())))?;
    let ps = <&mut [Tensor; K]>::try_from(ps)
        .map_err(|_| internal_in(name, &format!("{K} parameters")))?;
    Ok((ps, rest))
}

/// `w <- w - lr · g`, in place (`sgd`'s semantics). `w` is f32 or bf16, `g` f32 or
/// bf16, with equal shapes (a call outside a plan: the operands are checked
/// against the op's instance first, [`crate::update_in_place`]).
pub fn sgd_in_place(w: &mut Tensor, g: &Tensor, lr: f32) -> KResult<()> {
    crate::update::reference_in_place(&Op::Sgd { lr }, std::slice::from_mut(w), &[g])
}

/// [`sgd_in_place`] on checked operands `(w, g)`.
pub(crate) fn sgd(c: &mut CheckedMut<'_>, lr: f32) -> KResult<()> {
    const OP: &str = "sgd";
    let ([w], [g]) = operands::<1, 1>(c)?;
    let grad = grad_of(OP, g)?;
    fn go<W: Elem, G: Elem>(w: &mut [W], g: &[G], lr: f32) {
        w.par_chunks_mut(CHUNK)
            .zip(g.par_chunks(CHUNK))
            .for_each(|(w, g)| {
                w.iter_mut()
                    .zip(g)
                    .for_each(|(w, &g)| *w = W::store(w.load() - lr * g.load()));
            });
    }
    match (&mut w.data, grad) {
        (Data::F32(w), Grad::F32(g)) => go(w, g, lr),
        (Data::F32(w), Grad::BF16(g)) => go(w, g, lr),
        (Data::BF16(w), Grad::F32(g)) => go(w, g, lr),
        (Data::BF16(w), Grad::BF16(g)) => go(w, g, lr),
        (_, _) => {
            return Err(KernelError::DType {
                op: OP,
                reason: format!("weight must be f32 or bf16, got {}", w.dtype()),
            });
        }
    }
    Ok(())
}

/// Which gradient row a position takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GradRows {
    /// Row `p` for index position `p` (`sparse_sgd`'s row gradient).
    PerPosition,
    /// Row `s` for every position of bag `s` (`embedding_update`'s `dy`), divided
    /// by the bag's size when `mean`.
    PerBag {
        /// Mean pooling (else sum).
        mean: bool,
    },
}

/// Which rows of its table a parameter's storage `[R_s, D]` holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    /// The whole table (`R_s` is the table's row count).
    All,
    /// A row shard (the `*_rows` ops): table rows `first .. first + R_s` of a
    /// table of `total` rows. Every index must lie in `0..total`; those outside
    /// the shard are skipped.
    Shard {
        /// The first table row the storage holds.
        first: usize,
        /// Rows of the whole table.
        total: usize,
    },
}

impl Rows {
    /// The whole table's rows for storage of `stored` rows (that a shard fits
    /// its table is the op's shape rule, verified by its instance).
    pub(crate) fn table_rows(self, stored: usize) -> usize {
        match self {
            Rows::All => stored,
            Rows::Shard { total, .. } => total,
        }
    }

    /// The first table row the storage holds.
    pub(crate) fn first(self) -> usize {
        match self {
            Rows::All => 0,
            Rows::Shard { first, .. } => first,
        }
    }
}

/// A validated sparse update: the bags over the indices and where each position's
/// gradient row comes from. Bag `s` is `idx[bounds[s]..bounds[s+1]]` (or
/// `s·L..(s+1)·L` with fixed pooling `L`); every index was validated against
/// the whole table. The storage holds the table rows `first .. first + stored`
/// (all of them unless it is a row shard); positions whose row it does not hold
/// are skipped.
pub(crate) struct SparsePlan<'a> {
    /// The first table row the storage holds.
    pub first: usize,
    /// Rows the storage holds.
    pub stored: usize,
    /// Row width.
    pub d: usize,
    /// The indices (validated against `rows`).
    pub idx: Indices<'a>,
    /// Number of bags.
    pub bags: usize,
    /// Fixed pooling `L`, else `bounds` (`bags + 1` non-decreasing entries from 0
    /// to the number of indices).
    pub pooling: Option<usize>,
    /// Bag bounds when `pooling` is `None`.
    pub bounds: Vec<i64>,
    /// Where the gradient rows come from.
    pub src: GradRows,
    /// The gradient rows.
    pub grad: Grad<'a>,
}

impl SparsePlan<'_> {
    /// The index range of bag `s`.
    #[inline]
    fn bag(&self, s: usize) -> std::ops::Range<usize> {
        match self.pooling {
            Some(l) => s * l..(s + 1) * l,
            None => self.bounds[s] as usize..self.bounds[s + 1] as usize,
        }
    }

    /// Calls `f(row, grad_row, divisor)` for every position whose row is in
    /// `r0..r1`, in index order.
    pub(crate) fn visit(&self, r0: usize, r1: usize, mut f: impl FnMut(usize, usize, Option<f32>)) {
        fn go<I: Ix>(
            plan: &SparsePlan<'_>,
            idx: &[I],
            r0: usize,
            r1: usize,
            f: &mut dyn FnMut(usize, usize, Option<f32>),
        ) {
            for s in 0..plan.bags {
                let bag = plan.bag(s);
                let div = match plan.src {
                    GradRows::PerBag { mean: true } => Some(bag.len() as f32),
                    _ => None,
                };
                for p in bag {
                    let r = idx[p].get() as usize;
                    if r < r0 || r >= r1 {
                        continue;
                    }
                    let src = match plan.src {
                        GradRows::PerPosition => p,
                        GradRows::PerBag { .. } => s,
                    };
                    f(r, src, div);
                }
            }
        }
        match self.idx {
            Indices::I64(v) => go(self, v, r0, r1, &mut f),
            Indices::I32(v) => go(self, v, r0, r1, &mut f),
        }
    }

    /// Stored rows per task: one range per thread, or one range for little work.
    pub(crate) fn range_rows(&self) -> usize {
        let threads = rayon::current_num_threads().max(1);
        let ranges = if self.idx.len() * self.d < 1 << 14 {
            1
        } else {
            threads
        };
        self.stored.div_ceil(ranges).max(1)
    }

    /// The plan for storage of `stored` rows holding `rows` of the table.
    fn holding(self, rows: Rows, stored: usize) -> Self {
        SparsePlan {
            first: rows.first(),
            stored,
            ..self
        }
    }
}

/// The update value of element `c` of gradient row `src`: `g` (divided by the bag
/// size when given), as `embedding_bag_grad` computes it.
#[inline(always)]
pub(crate) fn gval<G: Elem>(g: &[G], d: usize, src: usize, c: usize, div: Option<f32>) -> f32 {
    let v = g[src * d + c].load();
    match div {
        None => v,
        Some(n) => v / n,
    }
}

/// Applies `plan` to an f32 or bf16 table, race-free (see the module docs).
/// Each task's part of the storage starts at table row `r0`.
fn apply_plain<W: Elem>(t: &mut [W], plan: &SparsePlan<'_>, lr: f32, round_once: bool) {
    let (d, rr) = (plan.d, plan.range_rows());
    fn rows_of<W: Elem, G: Elem>(
        part: &mut [W],
        r0: usize,
        plan: &SparsePlan<'_>,
        g: &[G],
        lr: f32,
        round_once: bool,
    ) {
        let d = plan.d;
        let r1 = r0 + part.len() / d;
        if !round_once {
            plan.visit(r0, r1, |r, src, div| {
                let row = &mut part[(r - r0) * d..(r - r0 + 1) * d];
                for (c, w) in row.iter_mut().enumerate() {
                    *w = W::store(w.load() - lr * gval(g, d, src, c, div));
                }
            });
            return;
        }
        // Round once per row: group the positions by row (stable: index order kept).
        let mut hits: Vec<(usize, usize, Option<f32>)> = Vec::new();
        plan.visit(r0, r1, |r, src, div| hits.push((r, src, div)));
        hits.sort_by_key(|h| h.0);
        let mut acc = vec![0.0f32; d];
        for grp in hits.chunk_by(|a, b| a.0 == b.0) {
            let r = grp[0].0;
            let row = &mut part[(r - r0) * d..(r - r0 + 1) * d];
            acc.iter_mut()
                .zip(row.iter())
                .for_each(|(a, w)| *a = w.load());
            for &(_, src, div) in grp {
                for (c, a) in acc.iter_mut().enumerate() {
                    *a -= lr * gval(g, d, src, c, div);
                }
            }
            row.iter_mut()
                .zip(&acc)
                .for_each(|(w, &a)| *w = W::store(a));
        }
    }
    let first = plan.first;
    t.par_chunks_mut(rr * d)
        .enumerate()
        .for_each(|(blk, part)| match plan.grad {
            Grad::F32(g) => rows_of(part, first + blk * rr, plan, g, lr, round_once),
            Grad::BF16(g) => rows_of(part, first + blk * rr, plan, g, lr, round_once),
        });
}

/// Applies `plan` to a Split-SGD-BF16 table (`hi`, `lo`), race-free.
fn apply_split(hi: &mut [bf16], lo: &mut [bf16], plan: &SparsePlan<'_>, lr: f32) {
    let (d, rr) = (plan.d, plan.range_rows());
    fn rows_of<G: Elem>(
        hi: &mut [bf16],
        lo: &mut [bf16],
        r0: usize,
        plan: &SparsePlan<'_>,
        g: &[G],
        lr: f32,
    ) {
        let d = plan.d;
        let r1 = r0 + hi.len() / d;
        plan.visit(r0, r1, |r, src, div| {
            let e0 = (r - r0) * d;
            for c in 0..d {
                let (h, l) = (&mut hi[e0 + c], &mut lo[e0 + c]);
                let (nh, nl) = split_step(*h, *l, lr * gval(g, d, src, c, div));
                *h = nh;
                *l = nl;
            }
        });
    }
    let first = plan.first;
    hi.par_chunks_mut(rr * d)
        .zip(lo.par_chunks_mut(rr * d))
        .enumerate()
        .for_each(|(blk, (h, l))| match plan.grad {
            Grad::F32(g) => rows_of(h, l, first + blk * rr, plan, g, lr),
            Grad::BF16(g) => rows_of(h, l, first + blk * rr, plan, g, lr),
        });
}

/// One Split-SGD-BF16 step: `w = f32(hi << 16 | lo) - u`, split again.
#[inline(always)]
fn split_step(hi: bf16, lo: bf16, u: f32) -> (bf16, bf16) {
    let w = f32::from_bits((u32::from(hi.to_bits()) << 16) | u32::from(lo.to_bits())) - u;
    let b = w.to_bits();
    (bf16::from_bits((b >> 16) as u16), bf16::from_bits(b as u16))
}

/// The indices of an update, as an index view.
fn index_view<'a>(op: &'static str, t: &'a Tensor) -> KResult<Indices<'a>> {
    Indices::of(t).ok_or_else(|| KernelError::DType {
        op,
        reason: format!("indices must be i64 or i32, got {}", t.dtype()),
    })
}

/// The plan of `sparse_sgd(table[R,D], indices, rowgrad)` on operands checked
/// against its instance (`rowgrad` is the indices' shape then `D`): the index
/// values are validated here.
pub(crate) fn sparse_sgd_plan<'a>(
    op: &'static str,
    [rows, d]: [usize; 2],
    indices: &'a Tensor,
    rowgrad: &'a Tensor,
) -> KResult<SparsePlan<'a>> {
    let idx = index_view(op, indices)?;
    let per_sample =
        (indices.shape.len() >= 2).then(|| indices.shape[1..].iter().product::<usize>());
    validate_indices(op, idx, rows, per_sample, None)?;
    let grad = grad_of(op, rowgrad)?;
    let n = idx.len();
    Ok(SparsePlan {
        first: 0,
        stored: rows,
        d,
        idx,
        bags: usize::from(n > 0),
        pooling: Some(n),
        bounds: Vec::new(),
        src: GradRows::PerPosition,
        grad,
    })
}

/// The plan of `embedding_update`-style operands `(dy[S,D], indices[S,L])` or
/// `(dy[S,D], indices[N], offsets[S])` for a table of `[rows, D]`, on operands
/// checked against the op's instance (`embedding_update`'s rule, or
/// `embedding_bag_grad`'s): the offsets and the index values are validated here.
pub(crate) fn embedding_update_plan<'a>(
    op: &'static str,
    [rows, d]: [usize; 2],
    mode: Pool,
    dy: &'a Tensor,
    indices: &'a Tensor,
    offsets: Option<&'a Tensor>,
) -> KResult<SparsePlan<'a>> {
    let [s, _] = dims2(op, &dy.shape)?;
    let idx = index_view(op, indices)?;
    let grad = grad_of(op, dy)?;
    let (pooling, bounds) = match offsets {
        None => {
            let [_, l] = dims2(op, &indices.shape)?;
            validate_indices(op, idx, rows, Some(l), None)?;
            (Some(l), Vec::new())
        }
        Some(off) => {
            let n = idx.len();
            let mut b = read_offsets(op, off, n)?;
            if b.len() != s {
                return Err(internal_in(
                    op,
                    &format!("{} offsets for {s} samples", b.len()),
                ));
            }
            validate_indices(op, idx, rows, None, Some(&b))?;
            b.push(n as i64);
            (None, b)
        }
    };
    Ok(SparsePlan {
        first: 0,
        stored: rows,
        d,
        idx,
        bags: s,
        pooling,
        bounds,
        src: GradRows::PerBag {
            mean: mode == Pool::Mean,
        },
        grad,
    })
}

/// [`sparse_sgd_plan`] for storage of shape `storage` holding `rows` of its
/// table.
pub(crate) fn sparse_sgd_plan_of<'a>(
    op: &'static str,
    rows: Rows,
    storage: &[usize],
    indices: &'a Tensor,
    rowgrad: &'a Tensor,
) -> KResult<SparsePlan<'a>> {
    let [stored, d] = dims2(op, storage)?;
    let whole = [rows.table_rows(stored), d];
    Ok(sparse_sgd_plan(op, whole, indices, rowgrad)?.holding(rows, stored))
}

/// [`embedding_update_plan`] for storage of shape `storage` holding `rows` of
/// its table.
pub(crate) fn embedding_update_plan_of<'a>(
    op: &'static str,
    rows: Rows,
    storage: &[usize],
    mode: Pool,
    dy: &'a Tensor,
    indices: &'a Tensor,
    offsets: Option<&'a Tensor>,
) -> KResult<SparsePlan<'a>> {
    let [stored, d] = dims2(op, storage)?;
    let whole = [rows.table_rows(stored), d];
    Ok(embedding_update_plan(op, whole, mode, dy, indices, offsets)?.holding(rows, stored))
}

/// Applies a validated plan to `table` (f32 or bf16), race-free.
pub(crate) fn apply_plan(
    op: &'static str,
    table: &mut Tensor,
    plan: &SparsePlan<'_>,
    lr: f32,
) -> KResult<()> {
    if plan.d == 0 || plan.idx.len() == 0 {
        return match table.data {
            Data::F32(_) | Data::BF16(_) => Ok(()),
            _ => Err(table_dtype_err(op, table)),
        };
    }
    match &mut table.data {
        Data::F32(w) => apply_plain(w, plan, lr, false),
        Data::BF16(w) => apply_plain(w, plan, lr, true),
        _ => return Err(table_dtype_err(op, table)),
    }
    Ok(())
}

fn table_dtype_err(op: &'static str, t: &Tensor) -> KernelError {
    KernelError::DType {
        op,
        reason: format!("table must be f32 or bf16, got {}", t.dtype()),
    }
}

/// `table[indices[i]] -= lr · rowgrad[i]` for every index `i` in row-major order,
/// in place (`sparse_sgd`'s semantics), race-free (see the module docs). `table` is
/// `[R,D]` f32 or bf16 (bf16: each touched row rounded once, after its updates),
/// `indices` any shape of i64/i32, `rowgrad` the indices' shape then `D`, f32 or
/// bf16. An index outside `0..R` is an error naming its position (and sample, for
/// indices of rank >= 2), reported before any row is touched.
///
/// With `rows` a [`Rows::Shard`], `table` is that shard (`sparse_sgd_rows`). A
/// call outside a plan: the operands are checked against the op's instance
/// first ([`crate::update_in_place`]).
pub fn sparse_sgd_in_place(
    table: &mut Tensor,
    rows: Rows,
    indices: &Tensor,
    rowgrad: &Tensor,
    lr: f32,
) -> KResult<()> {
    let op = match rows {
        Rows::All => Op::SparseSgd { lr },
        Rows::Shard { first, total } => Op::SparseSgdRows {
            lr,
            lo: first,
            rows: total,
        },
    };
    crate::update::reference_in_place(&op, std::slice::from_mut(table), &[indices, rowgrad])
}

/// [`sparse_sgd_in_place`] on checked operands `(table, indices, rowgrad)`.
pub(crate) fn sparse_sgd(c: &mut CheckedMut<'_>, rows: Rows, lr: f32) -> KResult<()> {
    let op = c.name();
    let ([table], [indices, rowgrad]) = operands::<1, 2>(c)?;
    let plan = sparse_sgd_plan_of(op, rows, &table.shape, indices, rowgrad)?;
    apply_plan(op, table, &plan, lr)
}

/// `all` for a whole table, `shard` for a row shard.
pub(crate) fn op_name(rows: Rows, all: &'static str, shard: &'static str) -> &'static str {
    match rows {
        Rows::All => all,
        Rows::Shard { .. } => shard,
    }
}

/// The dy, indices and offsets of an `embedding_update`-style op's checked
/// operands after its `K` parameters.
pub(crate) fn bag_operands<'a>(
    op: &'static str,
    rest: &[&'a Tensor],
) -> KResult<(&'a Tensor, &'a Tensor, Option<&'a Tensor>)> {
    match *rest {
        [dy, idx] => Ok((dy, idx, None)),
        [dy, idx, off] => Ok((dy, idx, Some(off))),
        _ => Err(internal_in(op, &format!("{} operands", rest.len()))),
    }
}

/// `embedding_update(table, dy, indices[, offsets])` in place on checked
/// operands: the fused `sparse_sgd(table, indices, embedding_bag_grad(dy,
/// indices[, offsets]))` with exactly its arithmetic, no row gradient
/// materialised, race-free. `table` is `[R,D]` f32 or bf16, `dy` `[S,D]` f32 or
/// bf16; with `rows` a [`Rows::Shard`], `table` is that shard
/// (`embedding_update_rows`).
pub(crate) fn embedding_update(
    c: &mut CheckedMut<'_>,
    rows: Rows,
    mode: Pool,
    lr: f32,
) -> KResult<()> {
    let op = c.name();
    let (ps, rest) = c.split();
    let [table] = ps else {
        return Err(internal_in(op, "1 parameter"));
    };
    let (dy, indices, offsets) = bag_operands(op, rest)?;
    let plan = embedding_update_plan_of(op, rows, &table.shape, mode, dy, indices, offsets)?;
    apply_plan(op, table, &plan, lr)
}

/// The two halves of a checked Split-SGD-BF16 pair (bf16, of one shape: the
/// op's shape rule).
pub(crate) fn split_pair<'a>(
    op: &'static str,
    ps: &'a mut [Tensor],
) -> KResult<(&'a [usize], &'a mut [bf16], &'a mut [bf16])> {
    match ps {
        [hi, lo] => match (&mut hi.data, &mut lo.data) {
            (Data::BF16(h), Data::BF16(l)) => Ok((&hi.shape, h, l)),
            _ => Err(internal_in(op, "the halves' dtypes")),
        },
        _ => Err(internal_in(op, &format!("{} parameters", ps.len()))),
    }
}

/// `split_embedding_update(hi, lo, dy, indices[, offsets])` in place on checked
/// operands: [`embedding_update`] on a Split-SGD-BF16 table (f32 master
/// `hi << 16 | lo`, updated in f32 and split again after each update: exact);
/// with `rows` a [`Rows::Shard`], both halves are that shard
/// (`split_embedding_update_rows`).
pub(crate) fn split_embedding_update(
    c: &mut CheckedMut<'_>,
    rows: Rows,
    mode: Pool,
    lr: f32,
) -> KResult<()> {
    let op = c.name();
    let (ps, rest) = c.split();
    let (dy, indices, offsets) = bag_operands(op, rest)?;
    let (shape, h, l) = split_pair(op, ps)?;
    let plan = embedding_update_plan_of(op, rows, shape, mode, dy, indices, offsets)?;
    if plan.d > 0 && plan.idx.len() > 0 {
        apply_split(h, l, &plan, lr);
    }
    Ok(())
}

/// `split_sgd(hi, lo, g)` in place (Split-SGD-BF16) on checked operands:
/// elementwise `w = f32(hi << 16 | lo) - lr·g`, split again; `g` f32 or bf16 of
/// the same shape.
pub(crate) fn split_sgd(c: &mut CheckedMut<'_>, lr: f32) -> KResult<()> {
    const OP: &str = "split_sgd";
    let (ps, rest) = c.split();
    let [g] = *rest else {
        return Err(internal_in(OP, "1 gradient"));
    };
    let (_, h, l) = split_pair(OP, ps)?;
    fn go<G: Elem>(h: &mut [bf16], l: &mut [bf16], g: &[G], lr: f32) {
        h.par_chunks_mut(CHUNK)
            .zip(l.par_chunks_mut(CHUNK))
            .zip(g.par_chunks(CHUNK))
            .for_each(|((h, l), g)| {
                for ((h, l), g) in h.iter_mut().zip(l.iter_mut()).zip(g) {
                    let (nh, nl) = split_step(*h, *l, lr * g.load());
                    *h = nh;
                    *l = nl;
                }
            });
    }
    match grad_of(OP, g)? {
        Grad::F32(g) => go(h, l, g, lr),
        Grad::BF16(g) => go(h, l, g, lr),
    }
    Ok(())
}
