//! The dot interaction's JIT kernels, forward and backward, parallel over blocks
//! of samples; every operand f32 or bf16 (independently), results f32 or bf16.
//!
//! Forward, per sample: `T = [x, e_0, .., e_{n-1}]` is read in place from the
//! operands (row pointers, no concatenation copy); the result row is `x` then
//! `T_i · T_j` for the kept pairs in row-major order. The pairs of one `i` are
//! computed four `j` at a time (four f32x4 FMA accumulators sharing each load of
//! `T_i`), then each accumulator is summed across lanes and the scalar tail
//! (`D mod 4`) added: a reassociation of the definition's sum (the tests allow
//! 1e-5 relative to the terms' magnitudes).
//!
//! Backward, per sample and operand `i`, in chunks of up to 32 columns (8 f32x4
//! accumulators): `dT_i = [i == 0] dr[..D] + Σ_{k≠i} dZ_{ik} T_k (+ 2 dZ_ii T_i)`
//! with `dZ_{ik}` the `dr` entry of the pair `(max, min)` — the reference's sums in
//! another order.
//!
//! The pair loops and the operand choice are unrolled at compile time (operands
//! may differ in element type); the column loop runs at run time in 16- (forward)
//! or 32-column (backward) steps with a static tail. Above `UNROLL_F` (12) operands
//! whose embeddings share one element type, the backward loops over the operands
//! and their partners at run time instead (the unrolled code grows as `F²`).
//!
//! Under `--kernels auto|avx512|avx512bf16|amxbf16`, on a CPU with AVX-512, both
//! directions run on [`super::native_dot`]'s kernels instead ([`native`]:
//! operands of one type read in place, bf16 widened in registers (the
//! forward: once a sample's rows); mixed
//! operands, a bf16 `dr` and bf16 results widened and rounded around them in
//! blocks of samples): the backward sums in the same order (the same
//! gradients, bit for bit, on the columns of whole f32x4 vectors); the forward
//! sums 16 lanes, not 4 (within the same tolerance of the reference). On a CPU
//! with AVX2 and FMA but no AVX-512, under `--kernels auto|native`, operands
//! whose width is a multiple of 8 take [`super::native_dot::avx2`]'s kernels
//! the same way (the backward the same gradients bit for bit again, the
//! forward 8-lane sums).
//!
//! ABI: forward `fn(ops: *const *const u8, out: *mut u8, s0: i64, s1: i64)` writes
//! samples `s0..s1` from `out` (sample `s0`'s row first); backward
//! `fn(ops, dr: *const u8, grads: *const *mut u8, s0, s1)` writes rows `s0..s1` of
//! each gradient (absolute rows). Shapes are checked by the Rust wrappers.

mod emit;
#[cfg(target_arch = "x86_64")]
mod native;

use super::buffers::Fresh;
use super::gemm::Elt;
use super::{Jit, JitError, JitOptions};
use crate::reference::{KResult, KernelError, block_rows, shape_err};
use cranelift_codegen::ir::types;
use dlrm_ir::{Checked, DType, Data, InteractionKind, Op, Tensor, TensorType, interaction_width};
use emit::{emit_backward, emit_forward};
use rayon::prelude::*;

/// Most operands a kernel takes (one bit per operand in [`DotSpec::bf16_ops`]).
const MAX_F: usize = 64;

/// What a dot-interaction kernel is specialised on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DotSpec {
    /// Operands (`x` and the embeddings), `F`.
    pub f: usize,
    /// Their width `D`.
    pub d: usize,
    /// Keep the diagonal pairs.
    pub self_interaction: bool,
    /// Backward (`interaction_grad`), else forward.
    pub backward: bool,
    /// Bit `i` set: operand `i` is bf16 (else f32).
    pub bf16_ops: u64,
    /// `dr`'s element type (backward).
    pub dr: Elt,
    /// The results' element type.
    pub out: Elt,
}

impl DotSpec {
    fn elt(&self, i: usize) -> Elt {
        if (self.bf16_ops >> i) & 1 == 1 {
            Elt::BF16
        } else {
            Elt::F32
        }
    }

    fn pairs(&self) -> Vec<(usize, usize)> {
        let si = self.self_interaction;
        (0..self.f)
            .flat_map(|i| (0..if si { i + 1 } else { i }).map(move |j| (i, j)))
            .collect()
    }

    fn width(&self) -> usize {
        self.d + self.pairs().len()
    }

    /// The element type of operands `1..F` when they share one.
    fn tail_elt(&self) -> Option<Elt> {
        let e = self.elt(1.min(self.f - 1));
        (1..self.f).all(|k| self.elt(k) == e).then_some(e)
    }
}

type FwdFn = unsafe extern "C" fn(*const usize, *mut u8, i64, i64);
type BwdFn = unsafe extern "C" fn(*const usize, *const u8, *const usize, i64, i64);

#[derive(Clone, Copy, Debug)]
enum DotFn {
    Fwd(FwdFn),
    Bwd(BwdFn),
}

/// A compiled dot-interaction kernel.
#[derive(Clone, Copy, Debug)]
pub struct DotKernel {
    spec: DotSpec,
    f: DotFn,
}

pub(crate) fn compile(jit: &Jit, spec: DotSpec) -> Result<DotKernel, JitError> {
    let nptr = if spec.backward { 3 } else { 2 };
    // The loads and FMAs are emitted interleaved, register-blocked: kept in
    // that order ([`Jit::in_order_module`]).
    let module = jit.in_order_module()?;
    let f = jit.compile_fn(module, "interaction", nptr, &[types::I64; 2], |_, b, p| {
        if spec.backward {
            emit_backward(b, &spec, p);
        } else {
            emit_forward(b, &spec, p);
        }
    })?;
    // SAFETY: generated with exactly the signature of the spec's direction and the
    // C call convention.
    let f = unsafe {
        if spec.backward {
            DotFn::Bwd(std::mem::transmute::<*const u8, BwdFn>(f))
        } else {
            DotFn::Fwd(std::mem::transmute::<*const u8, FwdFn>(f))
        }
    };
    Ok(DotKernel { spec, f })
}

fn elt_of(t: &Tensor) -> Option<(Elt, usize)> {
    match &t.data {
        Data::F32(v) => Some((Elt::F32, v.as_ptr() as usize)),
        Data::BF16(v) => Some((Elt::BF16, v.as_ptr() as usize)),
        _ => None,
    }
}

fn elt_dtype(d: DType) -> Option<Elt> {
    match d {
        DType::F32 => Some(Elt::F32),
        DType::BF16 => Some(Elt::BF16),
        _ => None,
    }
}

/// `interaction` / `interaction_grad` of kind `dot` with a JIT kernel (`None`:
/// `cat`, which [`super::layout`] copies; non-float operands or results; more
/// than 64 operands).
pub(crate) fn eval(
    jit: &Jit,
    opts: &JitOptions,
    c: &Checked<'_>,
    out_types: &[TensorType],
) -> Option<KResult<Vec<Tensor>>> {
    let (op, inputs) = (c.op(), c.inputs());
    let (self_interaction, backward) = match op {
        Op::Interaction {
            kind: InteractionKind::Dot,
            self_interaction,
        } => (*self_interaction, false),
        Op::InteractionGrad {
            kind: InteractionKind::Dot,
            self_interaction,
        } => (*self_interaction, true),
        _ => return None,
    };
    let out = elt_dtype(out_types.first()?.dtype)?;
    if out_types.iter().any(|t| elt_dtype(t.dtype) != Some(out)) {
        return None;
    }
    dot(jit, opts, inputs, (self_interaction, backward), out, None)
}

/// `interaction_blocked{self, bk}` (`dlrm_ir::ops::interaction_blocked`)
/// with results stored as `out`, whose dtype is the interaction's own
/// (`None` where [`eval`] has none): where the native kernels run, their
/// rows are written straight into the `bk`-column blocks
/// ([`native::forward`]); otherwise the row-major result is blocked after.
pub(crate) fn eval_blocked(
    jit: &Jit,
    opts: &JitOptions,
    inputs: &[&Tensor],
    (self_interaction, bk): (bool, usize),
    out: DType,
) -> Option<KResult<Tensor>> {
    let out = elt_dtype(out)?;
    let r = dot(jit, opts, inputs, (self_interaction, false), out, Some(bk))?;
    Some(r.and_then(|mut v| {
        v.pop()
            .ok_or_else(|| shape_err("interaction_blocked", "internal: no result".into()))
    }))
}

/// `interaction_grad_blocked{self}` (`dlrm_ir::ops::interaction_blocked`):
/// the gradients (all of `out`) of the dot interaction from `dr` blocked as
/// `[Kb, S, bk]` (`inputs[0]`; `None` where [`eval`] has none): the native
/// kernels gather each staged row from the blocks ([`native::backward`]);
/// otherwise `dr` is unblocked first.
pub(crate) fn eval_grad_blocked(
    jit: &Jit,
    opts: &JitOptions,
    inputs: &[&Tensor],
    self_interaction: bool,
    out: DType,
) -> Option<KResult<Vec<Tensor>>> {
    let out = elt_dtype(out)?;
    let &[_, _, bk] = inputs.first()?.shape.as_slice() else {
        return None;
    };
    dot(jit, opts, inputs, (self_interaction, true), out, Some(bk))
}

/// The dot interaction's kernels on `inputs` (`dr` first when `backward`),
/// results of `out`; with `blocked = Some(bk)`, the forward's result is
/// `[Kb, S, bk]` ([`eval_blocked`]) and the backward's `dr` is
/// ([`eval_grad_blocked`]).
fn dot(
    jit: &Jit,
    opts: &JitOptions,
    inputs: &[&Tensor],
    (self_interaction, backward): (bool, bool),
    out: Elt,
    blocked: Option<usize>,
) -> Option<KResult<Vec<Tensor>>> {
    let name = match backward {
        false => "interaction",
        true => "interaction_grad",
    };
    let fwd = if backward { inputs.get(1..)? } else { inputs };
    let f = fwd.len();
    if f == 0 || f > MAX_F || blocked == Some(0) {
        return None;
    }
    let mut bf16_ops = 0u64;
    let mut ptrs = Vec::with_capacity(f);
    for (i, t) in fwd.iter().enumerate() {
        let (e, p) = elt_of(t)?;
        bf16_ops |= u64::from(e == Elt::BF16) << i;
        ptrs.push(p);
    }
    let dr = if backward {
        elt_of(inputs[0])?.0
    } else {
        Elt::F32
    };
    // The instance verified every operand [S, D] (equal widths for `dot`), dr
    // [S, width] and the buffers' lengths: the kernel reads exactly those.
    let &[s, d] = fwd[0].shape.as_slice() else {
        return None;
    };
    Some((|| {
        let spec = DotSpec {
            f,
            d,
            self_interaction,
            backward,
            bf16_ops,
            dr,
            out,
        };
        let width = interaction_width(InteractionKind::Dot, self_interaction, &vec![d; f]);
        debug_assert_eq!(width, spec.width());
        let sb = block_rows(s, 8, 256);
        #[cfg(not(target_arch = "x86_64"))]
        let _ = opts;
        #[cfg(target_arch = "x86_64")]
        if let Some(kern) = native::kernels(opts, &spec) {
            return Ok(match backward {
                false => native::forward(kern, &spec, &ptrs, (s, sb), blocked),
                true => native::backward(kern, &spec, &ptrs, inputs, (s, sb), blocked),
            });
        }
        let k = jit.interaction(spec).map_err(|e| KernelError::Jit {
            op: name,
            reason: e.to_string(),
        })?;
        // SAFETY: `ptrs` are the `f` forward operands' buffers, each of
        // `s·d` elements of its spec type, `inputs[0]` (backward) is `dr` of
        // `s·width` (the node's instance verified the shapes, the bind the
        // buffers' lengths), and `k` was compiled for `spec`.
        // A blocked `dr` is unblocked first (the same values).
        let dr_rows = match (backward, blocked) {
            (true, Some(_)) => Some(unblock_rows_of(inputs[0], width)),
            _ => None,
        };
        let dr = dr_rows.as_ref().unwrap_or(inputs[0]);
        let r = unsafe {
            match backward {
                false => run_forward(k, &ptrs, s, sb),
                true => run_backward(k, (&ptrs, dr), s, sb),
            }
        }?;
        Ok(match (backward, blocked) {
            (false, Some(bk)) => r.iter().map(|t| block_rows_of(t, bk)).collect(),
            _ => r,
        })
    })())
}

/// `unblock_act{width}` of a blocked `tb` (`[Kb, S, bk]`), in its dtype.
fn unblock_rows_of(tb: &Tensor, width: usize) -> Tensor {
    let (s, bk) = (tb.shape[1], tb.shape[2]);
    fn rows<T: Copy + Default + Send + Sync>(
        v: &[T],
        (s, width, bk): (usize, usize, usize),
    ) -> Vec<T> {
        let mut y = vec![T::default(); s * width];
        if y.is_empty() {
            return y;
        }
        y.par_chunks_mut(width).enumerate().for_each(|(si, row)| {
            for (q, part) in row.chunks_mut(bk).enumerate() {
                let at = (q * s + si) * bk;
                part.copy_from_slice(&v[at..at + part.len()]);
            }
        });
        y
    }
    let dims = (s, width, bk);
    let data = match &tb.data {
        Data::F32(v) => Data::F32(rows(v, dims)),
        Data::BF16(v) => Data::BF16(rows(v, dims)),
        other => other.clone(),
    };
    Tensor {
        shape: vec![s, width],
        data,
    }
}

/// `block_act{bk}` of a row-major result `t` (`[S, width]`), in its dtype:
/// the padding columns zero.
fn block_rows_of(t: &Tensor, bk: usize) -> Tensor {
    let (s, width) = (t.shape[0], t.shape[1]);
    let kb = width.div_ceil(bk);
    fn blocks<T: Copy + Default + Send + Sync>(
        v: &[T],
        (s, width, bk, kb): (usize, usize, usize, usize),
    ) -> Vec<T> {
        let mut y = vec![T::default(); kb * s * bk];
        if y.is_empty() {
            return y;
        }
        y.par_chunks_mut(s * bk).enumerate().for_each(|(q, blk)| {
            let (c0, w) = (q * bk, bk.min(width - q * bk));
            for (si, row) in blk.chunks_mut(bk).enumerate() {
                row[..w].copy_from_slice(&v[si * width + c0..si * width + c0 + w]);
            }
        });
        y
    }
    let dims = (s, width, bk, kb);
    let data = match &t.data {
        Data::F32(v) => Data::F32(blocks(v, dims)),
        Data::BF16(v) => Data::BF16(blocks(v, dims)),
        other => other.clone(),
    };
    Tensor {
        shape: vec![kb, s, bk],
        data,
    }
}

/// The forward dot interaction with kernel `k` over `s` samples in blocks of
/// `sb`.
///
/// # Safety
///
/// `ptrs` are the addresses of `k.spec.f` operands of `s·d` elements of their
/// spec types each.
unsafe fn run_forward(k: DotKernel, ptrs: &[usize], s: usize, sb: usize) -> KResult<Vec<Tensor>> {
    let (out, width) = (k.spec.out, k.spec.width());
    // Not zeroed: the kernel writes every element of its rows.
    let mut fresh = Fresh::new(out, s * width);
    if s > 0 && width > 0 {
        let DotFn::Fwd(fun) = k.f else {
            return Err(shape_err(
                "interaction",
                "internal: kernel direction".into(),
            ));
        };
        let call = Call::Fwd {
            fun,
            ops: ptrs.as_ptr() as usize,
            out: fresh.buf().as_mut_ptr() as usize,
            row_bytes: width * out.size(),
        };
        // SAFETY: the operands as the caller guarantees; the result holds
        // s·width elements of `out`, rows of `row_bytes`.
        unsafe { call.blocks(s, sb) };
    }
    // SAFETY: the blocks cover rows 0..s, each written whole (`x`, then
    // every kept pair); empty if s·width = 0.
    Ok(vec![unsafe { fresh.assume_init() }.tensor(vec![s, width])])
}

/// The backward dot interaction with kernel `k` over `s` samples in blocks of
/// `sb`.
///
/// # Safety
///
/// As [`run_forward`], and `dr` holds `s·width` elements of `k.spec.dr`.
unsafe fn run_backward(
    k: DotKernel,
    (ptrs, dr): (&[usize], &Tensor),
    s: usize,
    sb: usize,
) -> KResult<Vec<Tensor>> {
    let (out, d, f) = (k.spec.out, k.spec.d, k.spec.f);
    // Not zeroed: the kernel writes every column of its rows of each.
    let mut grads: Vec<Fresh> = (0..f).map(|_| Fresh::new(out, s * d)).collect();
    if s > 0 && d > 0 {
        let DotFn::Bwd(fun) = k.f else {
            return Err(shape_err(
                "interaction_grad",
                "internal: kernel direction".into(),
            ));
        };
        let gptrs: Vec<usize> = grads
            .iter_mut()
            .map(|g| g.buf().as_mut_ptr() as usize)
            .collect();
        let call = Call::Bwd {
            fun,
            ops: ptrs.as_ptr() as usize,
            dr: elt_of(dr).map_or(0, |(_, p)| p),
            grads: gptrs.as_ptr() as usize,
        };
        // SAFETY: the operands and `dr` as the caller guarantees; every
        // gradient holds s·d elements of `out` (allocated above).
        unsafe { call.blocks(s, sb) };
    }
    // SAFETY: the blocks cover rows 0..s of every gradient, each row written
    // whole (all `d` columns); empty if s·d = 0.
    Ok(grads
        .into_iter()
        .map(|g| unsafe { g.assume_init() }.tensor(vec![s, d]))
        .collect())
}

/// A Cranelift dot kernel with its buffers (addresses, shared by the tasks):
/// the operands' address table `ops`, and the forward result (`row_bytes`
/// per sample) or `dr` and the gradients' address table.
enum Call {
    Fwd {
        fun: FwdFn,
        ops: usize,
        out: usize,
        row_bytes: usize,
    },
    Bwd {
        fun: BwdFn,
        ops: usize,
        dr: usize,
        grads: usize,
    },
}

impl Call {
    /// Runs the kernel on rows `0..s` in blocks of `sb` rows, one rayon task
    /// each.
    ///
    /// # Safety
    ///
    /// The buffers hold `s` rows each, of the element types and widths the
    /// kernel was compiled for (operands `[s, d]`, forward result `[s,
    /// width]`, `dr` `[s, width]`, gradients `[s, d]`).
    unsafe fn blocks(&self, s: usize, sb: usize) {
        (0..s.div_ceil(sb)).into_par_iter().for_each(|blk| {
            let (s0, s1) = (blk * sb, ((blk + 1) * sb).min(s));
            // SAFETY: the buffers hold `s` rows (the contract); the kernel
            // reads rows s0..s1 of the operands (and `dr`) and writes rows
            // s0..s1 of the result or of each gradient only, this task's own
            // (the forward's from its row s0, at `out + s0·row_bytes`).
            unsafe {
                match *self {
                    Call::Fwd {
                        fun,
                        ops,
                        out,
                        row_bytes,
                    } => fun(
                        ops as *const usize,
                        (out as *mut u8).add(s0 * row_bytes),
                        s0 as i64,
                        s1 as i64,
                    ),
                    Call::Bwd {
                        fun,
                        ops,
                        dr,
                        grads,
                    } => fun(
                        ops as *const usize,
                        dr as *const u8,
                        grads as *const usize,
                        s0 as i64,
                        s1 as i64,
                    ),
                }
            }
        });
    }
}
