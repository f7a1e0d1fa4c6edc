//! In-place optimizer updates on parameter storage (no copy of the parameter).
//!
//! - [`sgd_in_place`]: `w[i] = w[i] - lr · g[i]`, computed in f32, stored in `w`'s
//!   dtype (f32, or bf16 rounded to nearest even), parallel over chunks.
//! - [`sparse_sgd_in_place`]: SC20's race-free embedding update. The table's rows
//!   are split into contiguous ranges, one per rayon task; every task scans *all*
//!   indices in order and applies only those that fall in its range. No two tasks
//!   touch the same row, so no atomics or locks, and each row receives its updates
//!   in index order — exactly the sequence of float operations of the sequential
//!   definition, so the result is bitwise equal to the interpreter's (duplicates
//!   included, bf16 rounding after each update included).
//!
//! Both validate everything (shapes, dtypes, every index) before writing anything:
//! on error the parameter is unchanged.

use super::{Elem, Indices, Ix, KResult, KernelError, data_len, shape_err, validate_indices};
use dlrm_ir::{Data, Tensor};
use half::bf16;
use rayon::prelude::*;

/// Elements per task of the dense update.
const CHUNK: usize = 1 << 15;

/// A float gradient, f32 or bf16.
#[derive(Clone, Copy)]
enum Grad<'a> {
    F32(&'a [f32]),
    BF16(&'a [bf16]),
}

fn grad_of<'a>(op: &'static str, g: &'a Tensor) -> KResult<Grad<'a>> {
    match &g.data {
        Data::F32(v) => Ok(Grad::F32(v)),
        Data::BF16(v) => Ok(Grad::BF16(v)),
        _ => Err(KernelError::DType {
            op,
            reason: format!("gradient must be f32 or bf16, got {}", g.dtype()),
        }),
    }
}

fn check_consistent(op: &'static str, what: &str, t: &Tensor) -> KResult<()> {
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

/// `table[indices[i]] -= lr · rowgrad[i]` for every index `i` in row-major order,
/// in place (`sparse_sgd`'s semantics), race-free (see the module docs). `table` is
/// `[R,D]` f32 or bf16, `indices` any shape of i64/i32, `rowgrad` the indices' shape
/// then `D`, f32 or bf16. An index outside `0..R` is an error naming its position
/// (and sample, for indices of rank >= 2), reported before any row is touched.
pub fn sparse_sgd_in_place(
    table: &mut Tensor,
    indices: &Tensor,
    rowgrad: &Tensor,
    lr: f32,
) -> KResult<()> {
    const OP: &str = "sparse_sgd";
    let [rows, d] = table.shape[..] else {
        return Err(shape_err(
            OP,
            format!("table must have rank 2, got {:?}", table.shape),
        ));
    };
    let mut want = indices.shape.clone();
    want.push(d);
    if rowgrad.shape != want {
        return Err(shape_err(
            OP,
            format!(
                "row gradient {:?} must have shape {want:?} (indices {:?} then the table width)",
                rowgrad.shape, indices.shape
            ),
        ));
    }
    check_consistent(OP, "table", table)?;
    check_consistent(OP, "indices", indices)?;
    check_consistent(OP, "row gradient", rowgrad)?;
    let idx = Indices::of(indices).ok_or_else(|| KernelError::DType {
        op: OP,
        reason: format!("indices must be i64 or i32, got {}", indices.dtype()),
    })?;
    let per_sample =
        (indices.shape.len() >= 2).then(|| indices.shape[1..].iter().product::<usize>());
    validate_indices(OP, idx, rows, per_sample, None)?;
    let grad = grad_of(OP, rowgrad)?;
    if d == 0 || idx.len() == 0 {
        return Ok(());
    }
    // One row range per thread (or one range when there is little work).
    let threads = rayon::current_num_threads().max(1);
    let ranges = if idx.len() * d < 1 << 14 { 1 } else { threads };
    let range_rows = rows.div_ceil(ranges).max(1);

    fn go<W: Elem, I: Ix, G: Elem>(t: &mut [W], d: usize, rr: usize, idx: &[I], g: &[G], lr: f32) {
        t.par_chunks_mut(rr * d)
            .enumerate()
            .for_each(|(blk, part)| {
                let r0 = blk * rr;
                let r1 = r0 + part.len() / d;
                for (p, &i) in idx.iter().enumerate() {
                    let r = i.get() as usize;
                    if r < r0 || r >= r1 {
                        continue;
                    }
                    let row = &mut part[(r - r0) * d..(r - r0 + 1) * d];
                    row.iter_mut()
                        .zip(&g[p * d..(p + 1) * d])
                        .for_each(|(w, &gv)| *w = W::store(w.load() - lr * gv.load()));
                }
            });
    }
    macro_rules! dispatch_idx {
        ($w:expr, $g:expr) => {
            match idx {
                Indices::I64(i) => go($w, d, range_rows, i, $g, lr),
                Indices::I32(i) => go($w, d, range_rows, i, $g, lr),
            }
        };
    }
    match (&mut table.data, grad) {
        (Data::F32(w), Grad::F32(g)) => dispatch_idx!(w, g),
        (Data::F32(w), Grad::BF16(g)) => dispatch_idx!(w, g),
        (Data::BF16(w), Grad::F32(g)) => dispatch_idx!(w, g),
        (Data::BF16(w), Grad::BF16(g)) => dispatch_idx!(w, g),
        (_, _) => {
            return Err(KernelError::DType {
                op: OP,
                reason: format!("table must be f32 or bf16, got {}", table.dtype()),
            });
        }
    }
    Ok(())
}
