//! In-place optimizer updates on parameter storage (no copy of the parameter).
//!
//! - [`sgd_in_place`]: `w[i] = w[i] - lr · g[i]`, computed in f32, stored in `w`'s
//!   dtype (f32, or bf16 rounded to nearest even), parallel over chunks.
//! - [`split_sgd_in_place`]: Split-SGD-BF16 (`split_sgd`): the f32 master
//!   `hi << 16 | lo` is updated in f32 and split again (exact: no rounding).
//! - [`sparse_sgd_in_place`], [`embedding_update_in_place`] and
//!   [`split_embedding_update_in_place`]: SC20's race-free embedding update. The
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
//! All validate everything (shapes, dtypes, every index, offsets) before writing
//! anything: on error the parameters are unchanged.

use super::{
    Elem, Indices, Ix, KResult, KernelError, data_len, read_offsets, shape_err, validate_indices,
};
use dlrm_ir::{Data, Pool, Tensor};
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

pub(crate) fn check_consistent(op: &'static str, what: &str, t: &Tensor) -> KResult<()> {
    if data_len(t) == t.numel() {
        Ok(())
    } else {
        Err(shape_err(
            op,
            format!(
                "{what} holds {} elements for shape {:?}",
                data_len(t),
                t.shape
            ),
        ))
    }
}

/// `w <- w - lr · g`, in place (`sgd`'s semantics). `w` is f32 or bf16, `g` f32 or
/// bf16, with equal shapes.
pub fn sgd_in_place(w: &mut Tensor, g: &Tensor, lr: f32) -> KResult<()> {
    const OP: &str = "sgd";
    if w.shape != g.shape {
        return Err(shape_err(
            OP,
            format!("weight {:?} and gradient {:?} differ", w.shape, g.shape),
        ));
    }
    check_consistent(OP, "weight", w)?;
    check_consistent(OP, "gradient", g)?;
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
    /// The whole table's shape for storage of shape `storage`, checking that a
    /// shard fits its table.
    pub(crate) fn table_shape(self, op: &'static str, storage: &[usize]) -> KResult<Vec<usize>> {
        let Rows::Shard { first, total } = self else {
            return Ok(storage.to_vec());
        };
        let [rs, d] = storage[..] else {
            return Err(shape_err(
                op,
                format!("table shard must have rank 2, got {storage:?}"),
            ));
        };
        if first.checked_add(rs).is_none_or(|end| end > total) {
            return Err(shape_err(
                op,
                format!("a shard of {rs} rows at row {first} does not fit a table of {total} rows"),
            ));
        }
        Ok(vec![total, d])
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

    /// The plan for storage of `stored` rows holding `rows` of the table
    /// (checked by [`Rows::table_shape`]).
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

/// Validates `sparse_sgd(table[R,D], indices, rowgrad)` operands into a plan.
pub(crate) fn sparse_sgd_plan<'a>(
    op: &'static str,
    table_shape: &[usize],
    indices: &'a Tensor,
    rowgrad: &'a Tensor,
) -> KResult<SparsePlan<'a>> {
    let [rows, d] = table_shape[..] else {
        return Err(shape_err(
            op,
            format!("table must have rank 2, got {table_shape:?}"),
        ));
    };
    let mut want = indices.shape.clone();
    want.push(d);
    if rowgrad.shape != want {
        return Err(shape_err(
            op,
            format!(
                "row gradient {:?} must have shape {want:?} (indices {:?} then the table width)",
                rowgrad.shape, indices.shape
            ),
        ));
    }
    check_consistent(op, "indices", indices)?;
    check_consistent(op, "row gradient", rowgrad)?;
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

/// Validates `embedding_update`-style operands `(dy[S,D], indices[S,L])` or
/// `(dy[S,D], indices[N], offsets[S])` against a table of shape `table_shape`.
pub(crate) fn embedding_update_plan<'a>(
    op: &'static str,
    table_shape: &[usize],
    mode: Pool,
    dy: &'a Tensor,
    indices: &'a Tensor,
    offsets: Option<&'a Tensor>,
) -> KResult<SparsePlan<'a>> {
    let [rows, d] = table_shape[..] else {
        return Err(shape_err(
            op,
            format!("table must have rank 2, got {table_shape:?}"),
        ));
    };
    let [s, dd] = dy.shape[..] else {
        return Err(shape_err(
            op,
            format!("dy must have rank 2, got {:?}", dy.shape),
        ));
    };
    if dd != d {
        return Err(shape_err(
            op,
            format!(
                "dy {:?} and table {table_shape:?} differ in width",
                dy.shape
            ),
        ));
    }
    check_consistent(op, "dy", dy)?;
    check_consistent(op, "indices", indices)?;
    let idx = index_view(op, indices)?;
    let grad = grad_of(op, dy)?;
    let (pooling, bounds) = match offsets {
        None => {
            let [si, l] = indices.shape[..] else {
                return Err(shape_err(
                    op,
                    format!(
                        "indices (fixed pooling) must have rank 2, got {:?}",
                        indices.shape
                    ),
                ));
            };
            if si != s {
                return Err(shape_err(
                    op,
                    format!(
                        "dy {:?} and indices {:?} differ in samples",
                        dy.shape, indices.shape
                    ),
                ));
            }
            validate_indices(op, idx, rows, Some(l), None)?;
            (Some(l), Vec::new())
        }
        Some(off) => {
            if indices.shape.len() != 1 {
                return Err(shape_err(
                    op,
                    format!(
                        "indices with offsets must have rank 1, got {:?}",
                        indices.shape
                    ),
                ));
            }
            let n = idx.len();
            let mut b = read_offsets(op, off, n)?;
            if b.len() != s {
                return Err(shape_err(
                    op,
                    format!("dy has {s} samples, offsets {}", b.len()),
                ));
            }
            if s == 0 && n > 0 {
                return Err(KernelError::Offsets {
                    op,
                    reason: format!("{n} indices but no bags (offsets is empty)"),
                });
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
/// table (checked by [`Rows::table_shape`]).
pub(crate) fn sparse_sgd_plan_of<'a>(
    op: &'static str,
    rows: Rows,
    storage: &[usize],
    indices: &'a Tensor,
    rowgrad: &'a Tensor,
) -> KResult<SparsePlan<'a>> {
    let whole = rows.table_shape(op, storage)?;
    Ok(sparse_sgd_plan(op, &whole, indices, rowgrad)?.holding(rows, storage[0]))
}

/// [`embedding_update_plan`] for storage of shape `storage` holding `rows` of
/// its table (checked by [`Rows::table_shape`]).
pub(crate) fn embedding_update_plan_of<'a>(
    op: &'static str,
    rows: Rows,
    storage: &[usize],
    mode: Pool,
    dy: &'a Tensor,
    indices: &'a Tensor,
    offsets: Option<&'a Tensor>,
) -> KResult<SparsePlan<'a>> {
    let whole = rows.table_shape(op, storage)?;
    Ok(embedding_update_plan(op, &whole, mode, dy, indices, offsets)?.holding(rows, storage[0]))
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
/// With `rows` a [`Rows::Shard`], `table` is that shard (`sparse_sgd_rows`).
pub fn sparse_sgd_in_place(
    table: &mut Tensor,
    rows: Rows,
    indices: &Tensor,
    rowgrad: &Tensor,
    lr: f32,
) -> KResult<()> {
    let op = op_name(rows, "sparse_sgd", "sparse_sgd_rows");
    check_consistent(op, "table", table)?;
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

/// `embedding_update(table, dy, indices[, offsets])` in place: the fused
/// `sparse_sgd(table, indices, embedding_bag_grad(dy, indices[, offsets]))` with
/// exactly its arithmetic, no row gradient materialised, race-free. `table` is
/// `[R,D]` f32 or bf16, `dy` `[S,D]` f32 or bf16; with `rows` a
/// [`Rows::Shard`], `table` is that shard (`embedding_update_rows`).
#[allow(clippy::too_many_arguments)]
pub fn embedding_update_in_place(
    table: &mut Tensor,
    rows: Rows,
    mode: Pool,
    dy: &Tensor,
    indices: &Tensor,
    offsets: Option<&Tensor>,
    lr: f32,
) -> KResult<()> {
    let op = op_name(rows, "embedding_update", "embedding_update_rows");
    check_consistent(op, "table", table)?;
    let plan = embedding_update_plan_of(op, rows, &table.shape, mode, dy, indices, offsets)?;
    apply_plan(op, table, &plan, lr)
}

/// Checks a Split-SGD-BF16 pair: both bf16, same shape, consistent lengths.
pub(crate) fn split_pair<'a>(
    op: &'static str,
    hi: &'a mut Tensor,
    lo: &'a mut Tensor,
) -> KResult<(&'a [usize], &'a mut [bf16], &'a mut [bf16])> {
    if hi.shape != lo.shape {
        return Err(shape_err(
            op,
            format!(
                "high half {:?} and low half {:?} differ",
                hi.shape, lo.shape
            ),
        ));
    }
    check_consistent(op, "high half", hi)?;
    check_consistent(op, "low half", lo)?;
    let (hd, ld) = (hi.dtype(), lo.dtype());
    match (&mut hi.data, &mut lo.data) {
        (Data::BF16(h), Data::BF16(l)) => Ok((&hi.shape, h, l)),
        _ => Err(KernelError::DType {
            op,
            reason: format!("both halves must be bf16, got {hd} and {ld}"),
        }),
    }
}

/// `split_embedding_update(hi, lo, dy, indices[, offsets])` in place:
/// [`embedding_update_in_place`] on a Split-SGD-BF16 table (f32 master
/// `hi << 16 | lo`, updated in f32 and split again after each update: exact);
/// with `rows` a [`Rows::Shard`], both halves are that shard
/// (`split_embedding_update_rows`).
#[allow(clippy::too_many_arguments)]
pub fn split_embedding_update_in_place(
    hi: &mut Tensor,
    lo: &mut Tensor,
    rows: Rows,
    mode: Pool,
    dy: &Tensor,
    indices: &Tensor,
    offsets: Option<&Tensor>,
    lr: f32,
) -> KResult<()> {
    let op = op_name(
        rows,
        "split_embedding_update",
        "split_embedding_update_rows",
    );
    let (shape, h, l) = split_pair(op, hi, lo)?;
    let plan = embedding_update_plan_of(op, rows, shape, mode, dy, indices, offsets)?;
    if plan.d > 0 && plan.idx.len() > 0 {
        apply_split(h, l, &plan, lr);
    }
    Ok(())
}

/// `split_sgd(hi, lo, g)` in place (Split-SGD-BF16): elementwise
/// `w = f32(hi << 16 | lo) - lr·g`, split again; `g` f32 or bf16 of the same shape.
pub fn split_sgd_in_place(hi: &mut Tensor, lo: &mut Tensor, g: &Tensor, lr: f32) -> KResult<()> {
    const OP: &str = "split_sgd";
    let (shape, h, l) = split_pair(OP, hi, lo)?;
    if shape != &g.shape[..] {
        return Err(shape_err(
            OP,
            format!("weight {shape:?} and gradient {:?} differ", g.shape),
        ));
    }
    check_consistent(OP, "gradient", g)?;
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
