//! The `linear_db` JIT kernel (the bias gradient: column sums of `dz[S,N]` over
//! the samples), f32 or bf16 `dz` and result, parallel over column blocks.
//!
//! Each column is summed from +0 over the samples in order, in one f32
//! accumulator (f32x4 groups of columns, chunks of 32 columns held in
//! registers: the embedding bag's row sum, `embedding::sum_rows`) —
//! exactly the reference's and the interpreter's float operations, so the
//! results are bitwise theirs (bf16 operands widen exactly; a bf16 result is
//! rounded once, to nearest even).
//!
//! ABI: `fn(dz: *const u8, out: *mut u8, s: i64)`: the `w` columns of the spec
//! from `dz` on (row stride `n`), their sums written from `out` on.

use super::embedding::{RowSum, sum_rows};
use super::gemm::Elt;
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
}

type DbFn = unsafe extern "C" fn(*const u8, *mut u8, i64);

/// A compiled column-sum kernel.
#[derive(Clone, Copy, Debug)]
pub struct DbKernel {
    spec: DbSpec,
    f: DbFn,
}

pub(crate) fn compile(jit: &Jit, spec: DbSpec) -> Result<DbKernel, JitError> {
    let module = jit.new_module()?;
    let f = jit.compile_fn(module, "linear_db", 2, &[types::I64], |_, b, p| {
        let (dz, out, s) = (p[0], p[1], p[2]);
        let zero = b.ins().iconst(types::I64, 0);
        let pool = RowSum {
            src: spec.dz,
            out: spec.out,
            mean: false,
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
                // c0 + w <= n, so all inside. `po` is this task's own `w`
                // elements of the result (w = the chunk's length, checked).
                unsafe { (k.f)(dz.ptr_at(c0), po, s as i64) };
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
