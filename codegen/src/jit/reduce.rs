//! Column sums over the samples: the `linear_db` JIT kernel (the bias gradient,
//! `Σ_s dz[s]` of `dz[S,N]`), f32 or bf16 `dz` and result, parallel over column
//! blocks; and, weighted, `Σ_s wt[s]·x[s]` — the weight gradient of a layer with
//! one output (`brgemm_wgrad` with `N = 1`, a matrix-vector product).
//!
//! Each column is summed from +0 over the samples in order, in one f32
//! accumulator (f32x4 groups of columns, chunks of 32 columns held in
//! registers: the embedding bag's row sum, `embedding::sum_rows`), a weighted
//! term with one fused multiply-add — exactly the reference's and the
//! interpreter's float operations for `linear_db`, so those results are bitwise
//! theirs, and the GEMM micro-kernels' for the weighted sum (bf16 operands widen
//! exactly; a bf16 result is rounded once, to nearest even).
//!
//! ABI: `fn(x: *const u8, wt: *const f32, out: *mut u8, s: i64)`: the `w`
//! columns of the spec from `x` on (row stride `n`), their sums written from
//! `out` on; `wt` (`s` f32, read only when the spec is weighted) weighs row `s`.

use super::embedding::{RowSum, sum_rows};
use super::gemm::{Elt, Operand, OutBuf};
use super::layout::{buf, checked, jit_err, par_chunks, zeros};
use super::linear::{elt_of, operand};
use super::{Jit, JitError};
use crate::kernels::{KResult, block_rows, dims2};
use cranelift_codegen::ir::{InstBuilder, types};
use dlrm_ir::{Tensor, TensorType};

/// What a column-sum kernel is specialised on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DbSpec {
    /// Row stride of `dz`, in elements.
    pub n: usize,
    /// Columns summed.
    pub w: usize,
    /// `dz` element type.
    pub dz: Elt,
    /// Result element type.
    pub out: Elt,
    /// Weigh each row by `wt[s]`.
    pub weighted: bool,
}

type DbFn = unsafe extern "C" fn(*const u8, *const f32, *mut u8, i64);

/// A compiled column-sum kernel.
#[derive(Clone, Copy, Debug)]
pub struct DbKernel {
    spec: DbSpec,
    f: DbFn,
}

pub(crate) fn compile(jit: &Jit, spec: DbSpec) -> Result<DbKernel, JitError> {
    let module = jit.new_module()?;
    let f = jit.compile_fn(module, "column_sum", 3, &[types::I64], |_, b, p| {
        let (dz, wt, out, s) = (p[0], p[1], p[2], p[3]);
        let zero = b.ins().iconst(types::I64, 0);
        let pool = RowSum {
            src: spec.dz,
            out: spec.out,
            mean: false,
            weights: spec.weighted.then_some(wt),
        };
        let row_bytes = (spec.n * spec.dz.size()) as i64;
        sum_rows(b, pool, zero, s, spec.w, out, &mut |b, r| {
            let off = b.ins().imul_imm_s(r, row_bytes);
            b.ins().iadd(dz, off)
        });
    })?;
    // SAFETY: generated with exactly this signature and the C call convention.
    let f: DbFn = unsafe { std::mem::transmute::<*const u8, DbFn>(f) };
    Ok(DbKernel { spec, f })
}

/// `linear_db(dz[S,N]) -> Σ_s dz[s]` with JIT kernels (`None`: non-float `dz`
/// or result).
pub(crate) fn linear_db(
    jit: &Jit,
    inputs: &[&Tensor],
    out_types: &[TensorType],
) -> Option<KResult<Vec<Tensor>>> {
    const OP: &str = "linear_db";
    operand(inputs.first()?)?;
    let out = elt_of(out_types.first()?.dtype)?;
    Some((|| {
        crate::kernels::arity(OP, inputs, &[1])?;
        let (s, n) = dims2(OP, "dz", inputs[0])?;
        let dz = checked(OP, 0, inputs[0])?;
        let mut data = zeros(out, n);
        if s > 0 && n > 0 {
            // Column blocks (as the reference), one task each, every one
            // scanning all the samples in order; the last may be narrower.
            let cb = if s * n >= 1 << 16 {
                block_rows(n, 64, usize::MAX)
            } else {
                n
            };
            let spec = |w: usize| DbSpec {
                n,
                w,
                dz: dz.elt(),
                out,
                weighted: false,
            };
            let full = jit.db(spec(cb)).map_err(jit_err(OP))?;
            let last = jit.db(spec(n - (n - 1) / cb * cb)).map_err(jit_err(OP))?;
            par_chunks(buf(&mut data), cb, &|blk, mut ch| {
                let c0 = blk * cb;
                let k = if ch.len() == cb { full } else { last };
                if k.spec.w != ch.len() || dz.elt() != k.spec.dz || ch.elt() != k.spec.out {
                    return Err(JitError::Args {
                        kernel: format!("{:?}", k.spec),
                        reason: "operands differ from the spec".into(),
                    });
                }
                let po = ch.as_mut_ptr();
                // SAFETY: `dz` holds s·n elements of the spec's type (checked);
                // the kernel reads elements r·n + c0 + [0, w) for r < s, and
                // c0 + w <= n, so all inside; unweighted, it reads no `wt`.
                // `po` is this task's own `w` elements of the result (w = the
                // chunk's length, checked).
                unsafe { (k.f)(dz.ptr_at(c0), std::ptr::null(), po, s as i64) };
                Ok(())
            })
            .map_err(jit_err(OP))?;
        }
        Ok(vec![Tensor {
            shape: vec![n],
            data,
        }])
    })())
}

/// `dw[q][j] = Σ_s wt[s] · x[q][s][j]` for every block `q` of a blocked
/// activation `x[Kb][S][bk]` (f32 or bf16), the samples in order, into `dw`
/// (`Kb·bk` elements of the kernel's result type, block after block): one task
/// per block. `brgemm_wgrad` with one output column, where `wt` is `dz`.
pub(crate) fn weighted_block_sums(
    jit: &Jit,
    x: Operand<'_>,
    (kb, s, bk): (usize, usize, usize),
    wt: &[f32],
    dw: OutBuf<'_>,
) -> Result<(), JitError> {
    let spec = DbSpec {
        n: bk,
        w: bk,
        dz: x.elt(),
        out: dw.elt(),
        weighted: true,
    };
    if x.len() != kb * s * bk || wt.len() != s || dw.len() != kb * bk {
        return Err(JitError::Args {
            kernel: format!("{spec:?}"),
            reason: format!(
                "x of {} elements, {} weights and a result of {} for {kb} blocks of {s} × {bk}",
                x.len(),
                wt.len(),
                dw.len()
            ),
        });
    }
    if kb * bk == 0 {
        return Ok(());
    }
    let k = jit.db(spec)?;
    par_chunks(dw, bk, &|q, mut ch| {
        // SAFETY: `x` holds kb·s·bk elements of the spec's type and block q
        // starts at q·s·bk: the kernel reads its s rows of bk (row stride bk),
        // and `wt`'s s floats (lengths checked above). `ch` is this task's own
        // bk elements of `dw` (chunks of bk of kb·bk).
        unsafe { (k.f)(x.ptr_at(q * s * bk), wt.as_ptr(), ch.as_mut_ptr(), s as i64) };
        Ok(())
    })
}
