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
//! `out` on; `wt` (`s` f32, read only when the spec is weighted): `wt[r]`
//! weighs row `r`.

use super::clif::{for_range, load_f32, load_f32x4, store_f32, var};
use super::embedding::{RowSum, Weights, sum_rows};
use super::gemm::{Elt, Operand, OutBuf};
use super::layout::{buf, jit_err, par_chunks, zeros};
use super::linear::{elt_of, operand};
use super::{Jit, JitError};
use crate::reference::{KResult, block_rows};
use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{InstBuilder, Value, types};
use cranelift_frontend::FunctionBuilder;
use dlrm_ir::{Checked, Tensor, TensorType};

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
    /// Weigh row `r` by `wt[r]`.
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
            weights: spec.weighted.then_some(Weights {
                at: wt,
                fused: true,
            }),
            fetch: None,
        };
        let row_bytes = (spec.n * spec.dz.size()) as i64;
        sum_rows(b, pool, zero, s, spec.w, out, &mut |b, r| {
            let off = b.ins().imul_imm_s(r, row_bytes);
            (b.ins().iadd(dz, off), None)
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
    c: &Checked<'_>,
    out_types: &[TensorType],
) -> Option<KResult<Vec<Tensor>>> {
    const OP: &str = "linear_db";
    // The instance verified dz[S,N]; its buffer holds S·N elements.
    let dz = operand(c.input(0))?;
    let out = elt_of(out_types.first()?.dtype)?;
    let &[s, n] = c.in_shape(0) else {
        return None;
    };
    Some((|| {
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
                // SAFETY: `dz` holds s·n elements of the spec's type (`Checked`);
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

/// What a row-dot kernel is specialised on: `y[s] = act(bias + Σ_q x[q][s] ·
/// w[q])` over the `kb` blocks of a blocked activation `x[Kb][S][bk]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowDotSpec {
    /// Blocks of `x` (`Kb`).
    pub kb: usize,
    /// Block width (`bk`).
    pub bk: usize,
    /// `x`'s element type.
    pub x: Elt,
    /// Result element type.
    pub out: Elt,
    /// Apply relu (`y > 0 || y is NaN ? y : 0`).
    pub relu: bool,
}

type RowDotFn = unsafe extern "C" fn(*const u8, *const f32, *mut u8, i64, i64, i64, f32);

/// A compiled row-dot kernel.
#[derive(Clone, Copy, Debug)]
pub struct RowDotKernel {
    spec: RowDotSpec,
    f: RowDotFn,
}

/// Accumulators of a row dot (f32x4 each): independent FMA chains.
const DOT_ACCS: usize = 4;

/// ABI: `fn(x, w, out, s0, s1, s, bias)`: for samples `si` in `s0..s1` of the
/// `s` samples of `x`, `out[si - s0] = act(bias + Σ_q Σ_j x[q][si][j] · w[q·bk + j])`.
/// Each sample's dot is summed in [`DOT_ACCS`] f32x4 accumulators (column `j`
/// of every block into lanes of accumulator `(j/4) % DOT_ACCS`), plus one
/// scalar accumulator for a ragged block width, added up at the end in a fixed
/// order: the same result whatever the thread count or the sample range.
pub(crate) fn compile_row_dot(jit: &Jit, spec: RowDotSpec) -> Result<RowDotKernel, JitError> {
    let module = jit.new_module()?;
    let scalars = [types::I64, types::I64, types::I64, types::F32];
    let f = jit.compile_fn(module, "row_dot", 3, &scalars, |_, b, p| {
        let (x, w, out, s0, s1, s, bias) = (p[0], p[1], p[2], p[3], p[4], p[5], p[6]);
        let (ex, eo) = (spec.x.size() as i64, spec.out.size() as i64);
        let (nv, tail) = (spec.bk / 4, spec.bk % 4);
        let zero = b.ins().iconst(types::I64, 0);
        let kb = b.ins().iconst(types::I64, spec.kb as i64);
        // Bytes between blocks: S rows of bk.
        let blk = b.ins().imul_imm_s(s, spec.bk as i64 * ex);
        for_range(b, s0, s1, 1, &mut |b, si| {
            let zf = b.ins().f32const(0.0);
            let zv = b.ins().splat(types::F32X4, zf);
            let vacc = [(); DOT_ACCS].map(|_| var(b, types::F32X4, zv));
            let sacc = var(b, types::F32, zf);
            let row0 = b.ins().imul_imm_s(si, spec.bk as i64 * ex);
            let row0 = b.ins().iadd(x, row0);
            for_range(b, zero, kb, 1, &mut |b, q| {
                let off = b.ins().imul(q, blk);
                let xr = b.ins().iadd(row0, off);
                let woff = b.ins().imul_imm_s(q, spec.bk as i64 * 4);
                let wr = b.ins().iadd(w, woff);
                for v in 0..nv {
                    let xv = load_f32x4(b, spec.x, xr, (4 * v as i64 * ex) as i32);
                    let wv = load_f32x4(b, Elt::F32, wr, (16 * v) as i32);
                    let acc = vacc[v % DOT_ACCS];
                    let a = b.use_var(acc);
                    let r = b.ins().fma(xv, wv, a);
                    b.def_var(acc, r);
                }
                for l in 0..tail {
                    let j = 4 * nv + l;
                    let xs = load_f32(b, spec.x, xr, (j as i64 * ex) as i32);
                    let ws = load_f32(b, Elt::F32, wr, (4 * j) as i32);
                    let a = b.use_var(sacc);
                    let r = b.ins().fma(xs, ws, a);
                    b.def_var(sacc, r);
                }
            });
            let v = vacc.map(|a| b.use_var(a));
            let t = pairwise_sum(b, v);
            let lanes = [0, 1, 2, 3].map(|l| b.ins().extractlane(t, l));
            let h = pairwise_sum(b, lanes);
            let sa = b.use_var(sacc);
            let h = b.ins().fadd(h, sa);
            let mut y = b.ins().fadd(h, bias);
            if spec.relu {
                // `y > 0` or NaN (kept, as the interpreter keeps it).
                let keep = b.ins().fcmp(FloatCC::UnorderedOrGreaterThan, y, zf);
                y = b.ins().select(keep, y, zf);
            }
            let rel = b.ins().isub(si, s0);
            let ooff = b.ins().imul_imm_s(rel, eo);
            let at = b.ins().iadd(out, ooff);
            store_f32(b, spec.out, y, at, 0);
        });
    })?;
    // SAFETY: generated with exactly this signature and the C call convention.
    let f: RowDotFn = unsafe { std::mem::transmute::<*const u8, RowDotFn>(f) };
    Ok(RowDotKernel { spec, f })
}

/// `(v0 + v1) + (v2 + v3)`: the sum of the four values `v` as a balanced tree.
fn pairwise_sum(b: &mut FunctionBuilder<'_>, v: [Value; 4]) -> Value {
    let l = b.ins().fadd(v[0], v[1]);
    let r = b.ins().fadd(v[2], v[3]);
    b.ins().fadd(l, r)
}

/// Samples per row-dot task.
const DOT_SAMPLES: usize = 256;

/// `y[s] = act(bias + Σ_k x[s][k] · w[k])` for every sample of a blocked
/// activation `x[Kb][S][bk]` (f32 or bf16; `w`: `Kb·bk` f32) into `y` (`S`
/// elements of the kernel's result type): the forward of a one-column block,
/// a matrix-vector product. Tasks of [`DOT_SAMPLES`] samples.
pub(crate) fn row_dots(
    jit: &Jit,
    spec: RowDotSpec,
    x: Operand<'_>,
    s: usize,
    (w, bias): (&[f32], f32),
    y: OutBuf<'_>,
) -> Result<(), JitError> {
    let k = jit.row_dot(spec)?;
    let (kb, bk) = (k.spec.kb, k.spec.bk);
    if x.len() != kb * s * bk
        || w.len() != kb * bk
        || y.len() != s
        || x.elt() != k.spec.x
        || y.elt() != k.spec.out
    {
        return Err(JitError::Args {
            kernel: format!("{:?}", k.spec),
            reason: format!(
                "x of {} elements, {} weights and a result of {} for {s} samples",
                x.len(),
                w.len(),
                y.len()
            ),
        });
    }
    if s == 0 {
        return Ok(());
    }
    par_chunks(y, DOT_SAMPLES, &|t, mut ch| {
        let s0 = t * DOT_SAMPLES;
        let s1 = s0 + ch.len();
        // SAFETY: `x` holds kb·s·bk elements of the spec's type and `w` kb·bk
        // f32 (checked above); the kernel reads x[q][si][0..bk] for q < kb,
        // si in s0..s1 <= s, and all of `w`. It writes s1 - s0 elements from
        // `ch`, this task's own chunk of `y`, whose length that is.
        unsafe {
            (k.f)(
                x.ptr_at(0),
                w.as_ptr(),
                ch.as_mut_ptr(),
                s0 as i64,
                s1 as i64,
                s as i64,
                bias,
            )
        };
        Ok(())
    })
}
