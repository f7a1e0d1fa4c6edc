//! Layout-copy JIT kernels: `block_act`, `unblock_act` and the `cat` interaction
//! (forward and backward), f32 or bf16 storage in any mix, all on one generated
//! strided row copy.
//!
//! The kernel ([`CopySpec`]) copies `rows` rows: row `r` reads `w` elements at
//! `src + r·src_stride` and writes them, followed by `pad` zeros, at
//! `dst + r·dst_stride` (f32x4 groups, then a scalar tail; the columns are
//! unrolled with immediate offsets up to `UNROLL` (16) groups, else a loop). Every
//! element goes through f32: bf16 widens exactly and rounds back to nearest even,
//! so bf16 → bf16 is the identity on every value (a signalling NaN comes out
//! quiet, as in the reference and the interpreter) and every result is bitwise
//! the reference's. bf16 → bf16 copies skip the kernel: a native row loop
//! gives the same bits (a NaN's quiet bit set, everything else kept) without
//! the widening and rounding, which made the bf16 copy slower than the f32
//! one of twice the bytes (dlrm-kaggle's bf16 `%inter.blk`, 3 interleaved
//! pairs of `dlrm-run --bench --infer`, Intel Xeon model 207, 2026-11-30:
//! 0.32-0.33 ms to 0.17; f32 0.16-0.21).
//!
//! - `block_act{bk}(x[S,K]) -> [Kb,S,bk]`: per block `kb`, rows of width
//!   `min(bk, K-kb·bk)` plus the zero padding;
//! - `unblock_act{k}(xb[Kb,S,bk]) -> [S,k]`: per block, the live columns back;
//! - `interaction{cat}`: each operand's rows at its column offset of the result;
//!   `interaction_grad{cat}`: each gradient's columns of `dr`.
//!
//! Parallelism: one rayon task per block of samples (and per feature block for
//! `block_act`), each writing its own contiguous chunk of the result.
//!
//! ABI: `fn(src: *const u8, dst: *mut u8, rows: i64)`.

use super::buffers::Fresh;
use super::clif::{flags, for_range, load_f32, load_f32x4, store_f32, store_f32x4};
use super::gemm::{Elt, Operand, OutBuf};
use super::linear::{elt_of, operand};
use super::{Jit, JitError};
use crate::reference::{KResult, KernelError, block_rows, dims_of, internal};
use cranelift_codegen::ir::{InstBuilder, Value, types};
use cranelift_frontend::FunctionBuilder;
use dlrm_ir::{Checked, Data, InteractionKind, Op, Tensor, TensorType, interaction_width};
use half::bf16;
use rayon::prelude::*;

/// Column groups of 4 up to which a row copy is unrolled.
const UNROLL: usize = 16;

/// What a row-copy kernel is specialised on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CopySpec {
    /// Source element type.
    pub src: Elt,
    /// Destination element type.
    pub dst: Elt,
    /// Elements copied per row.
    pub w: usize,
    /// Zeros written after them.
    pub pad: usize,
    /// Source row stride, in elements.
    pub src_stride: usize,
    /// Destination row stride, in elements.
    pub dst_stride: usize,
}

type CopyFn = unsafe extern "C" fn(*const u8, *mut u8, i64);

/// A compiled row-copy kernel.
#[derive(Clone, Copy, Debug)]
pub struct CopyKernel {
    spec: CopySpec,
    f: CopyFn,
}

/// Emits `f(b, at, off, vector)` for the columns `base..base+n` of a row, column
/// `at + off` (`at` an i64 value, `off` a constant): f32x4 groups (unrolled with
/// `at = base`, or a loop advancing `at`), then the scalar tail.
fn columns(
    b: &mut FunctionBuilder<'_>,
    n: usize,
    base: Value,
    f: &mut dyn FnMut(&mut FunctionBuilder<'_>, Value, usize, bool),
) {
    let groups = n / 4;
    if groups <= UNROLL {
        for g in 0..groups {
            f(b, base, 4 * g, true);
        }
    } else {
        let zero = b.ins().iconst(types::I64, 0);
        let end = b.ins().iconst(types::I64, (4 * groups) as i64);
        for_range(b, zero, end, 4, &mut |b, c| {
            let at = b.ins().iadd(base, c);
            f(b, at, 0, true);
        });
    }
    let tail = b.ins().iadd_imm_s(base, (4 * groups) as i64);
    for c in 0..n % 4 {
        f(b, tail, c, false);
    }
}

/// Emits the copy of the `w` elements of the row at `ps` (`src` elements) to the
/// row at `pd` (`dst` elements), each value (f32x4 when `vector`, else f32)
/// passed through `map(b, x, vector)` on the way.
pub(super) fn copy_row(
    b: &mut FunctionBuilder<'_>,
    src: Elt,
    dst: Elt,
    ps: Value,
    pd: Value,
    w: usize,
    map: &mut dyn FnMut(&mut FunctionBuilder<'_>, Value, bool) -> Value,
) {
    let (es, ed) = (src.size() as i64, dst.size() as i64);
    // `at` is an element index in the row (addresses derived per access).
    let zero = b.ins().iconst(types::I64, 0);
    columns(b, w, zero, &mut |b, at, off, vector| {
        let a = b.ins().imul_imm_s(at, es);
        let a = b.ins().iadd(ps, a);
        let d = b.ins().imul_imm_s(at, ed);
        let d = b.ins().iadd(pd, d);
        let (os, od) = ((off as i64 * es) as i32, (off as i64 * ed) as i32);
        if vector {
            let x = load_f32x4(b, src, a, os);
            let x = map(b, x, true);
            store_f32x4(b, dst, x, d, od);
        } else {
            let x = load_f32(b, src, a, os);
            let x = map(b, x, false);
            store_f32(b, dst, x, d, od);
        }
    });
}

pub(crate) fn compile(jit: &Jit, spec: CopySpec) -> Result<CopyKernel, JitError> {
    let module = jit.new_module()?;
    let f = jit.compile_fn(module, "row_copy", 2, &[types::I64], |_, b, p| {
        let (src, dst, rows) = (p[0], p[1], p[2]);
        let (es, ed) = (spec.src.size() as i64, spec.dst.size() as i64);
        let zero = b.ins().iconst(types::I64, 0);
        for_range(b, zero, rows, 1, &mut |b, r| {
            let so = b.ins().imul_imm_s(r, spec.src_stride as i64 * es);
            let ps = b.ins().iadd(src, so);
            let dof = b.ins().imul_imm_s(r, spec.dst_stride as i64 * ed);
            let pd = b.ins().iadd(dst, dof);
            copy_row(b, spec.src, spec.dst, ps, pd, spec.w, &mut |_, x, _| x);
            let w = b.ins().iconst(types::I64, spec.w as i64);
            columns(b, spec.pad, w, &mut |b, at, off, vector| {
                let d = b.ins().imul_imm_s(at, ed);
                let d = b.ins().iadd(pd, d);
                let od = (off as i64 * ed) as i32;
                // Zero bits are +0.0 in f32 and in bf16.
                if vector {
                    let z = b.ins().iconst(types::I64, 0);
                    match spec.dst {
                        Elt::F32 => {
                            let z = b.ins().splat(types::I64X2, z);
                            b.ins().store(flags(), z, d, od);
                        }
                        Elt::BF16 => {
                            b.ins().store(flags(), z, d, od);
                        }
                    }
                } else {
                    let z = b.ins().iconst(types::I32, 0);
                    match spec.dst {
                        Elt::F32 => b.ins().store(flags(), z, d, od),
                        Elt::BF16 => b.ins().istore16(flags(), z, d, od),
                    };
                }
            });
        });
    })?;
    // SAFETY: generated with exactly this signature and the C call convention.
    let f: CopyFn = unsafe { std::mem::transmute::<*const u8, CopyFn>(f) };
    Ok(CopyKernel { spec, f })
}

impl CopyKernel {
    /// Copies `rows` rows from `src` (row 0 at element `src_off`) into `dst` (row
    /// 0 at element `dst_off`). Every row's extent is checked against both
    /// slices first: nothing is read or written out of bounds.
    fn run(
        &self,
        src: Operand<'_>,
        src_off: usize,
        mut dst: OutBuf<'_>,
        dst_off: usize,
        rows: usize,
    ) -> Result<(), JitError> {
        let s = self.spec;
        let bad = |r: &str| JitError::Args {
            kernel: format!("{s:?}"),
            reason: r.to_string(),
        };
        if src.elt() != s.src || dst.elt() != s.dst {
            return Err(bad("operand types differ from the spec"));
        }
        if rows == 0 || s.w + s.pad == 0 {
            return Ok(());
        }
        // One past the last element touched, in each slice.
        let end = |off: usize, stride: usize, w: usize| {
            (rows - 1)
                .checked_mul(stride)
                .and_then(|x| x.checked_add(off))
                .and_then(|x| x.checked_add(w))
        };
        if s.w > 0 && end(src_off, s.src_stride, s.w).is_none_or(|e| e > src.len()) {
            return Err(bad("source rows out of bounds"));
        }
        if end(dst_off, s.dst_stride, s.w + s.pad).is_none_or(|e| e > dst.len()) {
            return Err(bad("destination rows out of bounds"));
        }
        let sp = if s.w > 0 {
            src.ptr_at(src_off)
        } else {
            src.ptr_at(0)
        };
        // SAFETY: `dst_off < dst.len()` (checked above: w + pad > 0).
        let dp = unsafe { dst.as_mut_ptr().add(dst_off * s.dst.size()) };
        // SAFETY: row r reads elements src_off + r·src_stride + [0, w) of `src`
        // and writes dst_off + r·dst_stride + [0, w + pad) of `dst`, r < rows:
        // all inside the slices (checked above); `dst` is borrowed mutably.
        unsafe {
            match (s.src, s.dst) {
                (Elt::BF16, Elt::BF16) => same_type_rows::<u16>(&s, sp, dp, rows),
                _ => (self.f)(sp, dp, rows as i64),
            }
        };
        Ok(())
    }
}

/// Bits an element type's row copy passes through [`Quiet::quiet`].
trait Quiet: Copy + Default {
    /// The element a widen-then-round copy gives for `self`.
    fn quiet(self) -> Self;
}

impl Quiet for u16 {
    /// bf16 bits: themselves, but a NaN's quiet bit set (as rounding its
    /// exact f32 widening back does, `half::bf16::from_f32`): branch-free, so
    /// the row loop vectorises.
    #[inline(always)]
    fn quiet(self) -> u16 {
        let nan = ((self & 0x7FFF) > 0x7F80) as u16;
        self | (nan << 6)
    }
}

/// [`CopyKernel::run`]'s rows for a spec whose source and destination have
/// the same element type `T` (its bits): each row's `w` elements through
/// [`Quiet::quiet`], then `pad` zeros.
///
/// # Safety
/// [`CopyKernel::run`]'s checked extents: row `r < rows` reads `w` elements
/// at `sp + r·src_stride` and writes `w + pad` at `dp + r·dst_stride`.
unsafe fn same_type_rows<T: Quiet>(s: &CopySpec, sp: *const u8, dp: *mut u8, rows: usize) {
    let (sp, dp) = (sp.cast::<T>(), dp.cast::<T>());
    for r in 0..rows {
        // SAFETY: the caller's contract (no source row when `w` is 0).
        let dst = unsafe { std::slice::from_raw_parts_mut(dp.add(r * s.dst_stride), s.w + s.pad) };
        let (live, pad) = dst.split_at_mut(s.w);
        if s.w > 0 {
            // SAFETY: the caller's contract.
            let src = unsafe { std::slice::from_raw_parts(sp.add(r * s.src_stride), s.w) };
            for (d, &x) in live.iter_mut().zip(src) {
                *d = x.quiet();
            }
        }
        pad.fill(T::default());
    }
}

/// Runs `task(i, chunk)` over the consecutive chunks of `chunk` elements of `out`,
/// one rayon task each.
pub(super) fn par_chunks(
    out: OutBuf<'_>,
    chunk: usize,
    task: &(dyn Fn(usize, OutBuf<'_>) -> Result<(), JitError> + Sync),
) -> Result<(), JitError> {
    out.chunks(chunk)
        .into_par_iter()
        .enumerate()
        .try_for_each(|(i, c)| task(i, c))
}

pub(super) fn zeros(e: Elt, n: usize) -> Data {
    match e {
        Elt::F32 => Data::F32(vec![0.0; n]),
        Elt::BF16 => Data::BF16(vec![bf16::ZERO; n]),
    }
}

pub(super) fn buf(d: &mut Data) -> OutBuf<'_> {
    match d {
        Data::BF16(v) => OutBuf::BF16(v),
        Data::F32(v) => OutBuf::F32(v),
        // `zeros` only makes float data.
        _ => OutBuf::F32(&mut []),
    }
}

/// Samples per task.
fn sample_block(s: usize) -> usize {
    block_rows(s, 16, 1024)
}

pub(super) fn jit_err(op: &'static str) -> impl Fn(JitError) -> KernelError {
    move |e| KernelError::Jit {
        op,
        reason: e.to_string(),
    }
}

/// The float operand `i` of checked operands (its buffer holds its shape's
/// elements: [`Checked`]).
pub(super) fn float_operand<'a>(c: &Checked<'a>, i: usize) -> KResult<Operand<'a>> {
    operand(c.input(i)).ok_or_else(|| internal(c, &format!("operand {i}'s dtype")))
}

/// `block_act`, `unblock_act` and the `cat` interaction with JIT kernels (`None`:
/// another op, or non-float operands or results).
pub(crate) fn eval(
    jit: &Jit,
    c: &Checked<'_>,
    out_types: &[TensorType],
) -> Option<KResult<Vec<Tensor>>> {
    let (op, inputs) = (c.op(), c.inputs());
    if inputs.iter().any(|t| operand(t).is_none()) {
        return None;
    }
    let outs: Vec<Elt> = out_types
        .iter()
        .map(|t| elt_of(t.dtype))
        .collect::<Option<_>>()?;
    match op {
        Op::BlockAct { bk, .. } => Some(block_act(jit, *bk, c, *outs.first()?)),
        Op::UnblockAct { k, .. } => Some(unblock_act(jit, *k, c, *outs.first()?)),
        Op::Interaction {
            kind: InteractionKind::Cat,
            ..
        } => Some(cat(jit, c, *outs.first()?)),
        Op::InteractionGrad {
            kind: InteractionKind::Cat,
            ..
        } => Some(cat_grad(jit, c, &outs)),
        _ => None,
    }
}

/// `block_act{bk}(x[S,K]) -> [ceil(K/bk), S, bk]`.
fn block_act(jit: &Jit, bk: usize, c: &Checked<'_>, out: Elt) -> KResult<Vec<Tensor>> {
    const OP: &str = "block_act";
    // The instance verified x[S,K] and bk > 0; the buffer holds S·K elements.
    let [s, k] = dims_of::<2>(c, 0)?;
    let x = float_operand(c, 0)?;
    let kb = k.div_ceil(bk.max(1));
    // Not zeroed: every row of every block is written, padding included.
    let mut fresh = Fresh::new(out, kb * s * bk);
    if s > 0 && kb > 0 {
        // The full blocks' kernel and the last block's (ragged when bk ∤ K).
        let spec = |w: usize| CopySpec {
            src: x.elt(),
            dst: out,
            w,
            pad: bk - w,
            src_stride: k,
            dst_stride: bk,
        };
        let full = jit.copy(spec(bk)).map_err(jit_err(OP))?;
        let last = jit.copy(spec(k - (kb - 1) * bk)).map_err(jit_err(OP))?;
        let sb = sample_block(s);
        par_chunks(fresh.buf(), s * bk, &|kbi, blk| {
            let kern = if kbi + 1 == kb { last } else { full };
            par_chunks(blk, sb * bk, &|c, ch| {
                let s0 = c * sb;
                let rows = ch.len() / bk;
                kern.run(x, s0 * k + kbi * bk, ch, 0, rows)
            })
        })
        .map_err(jit_err(OP))?;
    }
    // SAFETY: each block's sample chunks cover its `s` rows, each written
    // whole (`w + pad = bk` elements at stride `bk`); empty if s = 0.
    Ok(vec![unsafe { fresh.assume_init() }.tensor(vec![kb, s, bk])])
}

/// `unblock_act{k}(xb[Kb,S,bk]) -> [S, k]`.
fn unblock_act(jit: &Jit, k: usize, c: &Checked<'_>, out: Elt) -> KResult<Vec<Tensor>> {
    const OP: &str = "unblock_act";
    // The instance verified that `k` fills the `Kb` blocks of `bk`.
    let [kb, s, bk] = dims_of::<3>(c, 0)?;
    let xb = float_operand(c, 0)?;
    // Not zeroed: every column of every row is written.
    let mut fresh = Fresh::new(out, s * k);
    if s > 0 && k > 0 {
        let spec = |w: usize| CopySpec {
            src: xb.elt(),
            dst: out,
            w,
            pad: 0,
            src_stride: bk,
            dst_stride: k,
        };
        let kerns = (0..kb)
            .map(|kbi| jit.copy(spec(bk.min(k - kbi * bk))))
            .collect::<Result<Vec<_>, _>>()
            .map_err(jit_err(OP))?;
        let sb = sample_block(s);
        par_chunks(fresh.buf(), sb * k, &|c, mut ch| {
            let s0 = c * sb;
            let rows = ch.len() / k;
            for (kbi, kern) in kerns.iter().enumerate() {
                kern.run(xb, (kbi * s + s0) * bk, ch.reborrow(), kbi * bk, rows)?;
            }
            Ok(())
        })
        .map_err(jit_err(OP))?;
    }
    // SAFETY: the sample chunks cover all `s` rows, and per row the blocks'
    // live columns `kbi·bk..` cover all `k` (the instance); empty if s·k = 0.
    Ok(vec![unsafe { fresh.assume_init() }.tensor(vec![s, k])])
}

/// `interaction{cat}(x, e_0, ..) -> [S, Σ widths]`.
fn cat(jit: &Jit, c: &Checked<'_>, out: Elt) -> KResult<Vec<Tensor>> {
    const OP: &str = "interaction";
    // The instance verified the operands' ranks and samples.
    let (s, widths) = crate::reference::interaction::samples_and_widths(c, 0)?;
    let ops = (0..c.inputs().len())
        .map(|i| float_operand(c, i))
        .collect::<KResult<Vec<_>>>()?;
    let width = interaction_width(InteractionKind::Cat, false, &widths);
    // Not zeroed: every column of every row is written.
    let mut fresh = Fresh::new(out, s * width);
    if s > 0 && width > 0 {
        let kerns = ops
            .iter()
            .zip(&widths)
            .map(|(o, &w)| {
                jit.copy(CopySpec {
                    src: o.elt(),
                    dst: out,
                    w,
                    pad: 0,
                    src_stride: w,
                    dst_stride: width,
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(jit_err(OP))?;
        let sb = sample_block(s);
        par_chunks(fresh.buf(), sb * width, &|c, mut ch| {
            let s0 = c * sb;
            let rows = ch.len() / width;
            let mut at = 0;
            for ((kern, o), &w) in kerns.iter().zip(&ops).zip(&widths) {
                kern.run(*o, s0 * w, ch.reborrow(), at, rows)?;
                at += w;
            }
            Ok(())
        })
        .map_err(jit_err(OP))?;
    }
    // SAFETY: the sample chunks cover all `s` rows, and per row the operands'
    // columns, one after another, cover `width` (their sum); empty if 0.
    Ok(vec![unsafe { fresh.assume_init() }.tensor(vec![s, width])])
}

/// `interaction_grad{cat}(dr, x, e_0, ..) -> (dx, de_0, ..)`: `dr` split by width.
fn cat_grad(jit: &Jit, c: &Checked<'_>, outs: &[Elt]) -> KResult<Vec<Tensor>> {
    const OP: &str = "interaction_grad";
    // The instance verified dr[S, width], the operands after it and one result
    // per operand.
    let (s, widths) = crate::reference::interaction::samples_and_widths(c, 1)?;
    let width = interaction_width(InteractionKind::Cat, false, &widths);
    let dr = float_operand(c, 0)?;
    let sb = sample_block(s);
    let mut res = Vec::with_capacity(widths.len());
    let mut at = 0;
    for (&w, &e) in widths.iter().zip(outs) {
        let mut data = zeros(e, s * w);
        if s > 0 && w > 0 {
            let kern = jit
                .copy(CopySpec {
                    src: dr.elt(),
                    dst: e,
                    w,
                    pad: 0,
                    src_stride: width,
                    dst_stride: w,
                })
                .map_err(jit_err(OP))?;
            par_chunks(buf(&mut data), sb * w, &|c, ch| {
                let rows = ch.len() / w;
                kern.run(dr, c * sb * width + at, ch, 0, rows)
            })
            .map_err(jit_err(OP))?;
        }
        res.push(Tensor {
            shape: vec![s, w],
            data,
        });
        at += w;
    }
    Ok(res)
}
