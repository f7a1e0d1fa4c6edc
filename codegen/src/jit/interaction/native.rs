//! The dot interaction on [`native_dot`]'s AVX-512 kernels (f32 arithmetic),
//! for every mix of element types the Cranelift kernels take. Operands that
//! share one type, f32 or bf16, are read in place (bf16 widened in registers
//! as loaded), and f32 `dr` and results too: a `--precision bf16` plan's
//! interaction (bf16 operands, f32 `dr` and gradients) stages nothing but its
//! bf16 forward result. Otherwise each task widens its samples' operands of
//! mixed types (and a bf16 `dr`) into f32 scratch [`STAGE`] samples at a time,
//! runs the kernel on them, and rounds bf16 results once to nearest even
//! (`half::bf16::from_f32`, as the Cranelift kernels store them). Widening is
//! exact, so the products and sums are the f32 path's: the backward's
//! gradients equal the Cranelift kernel's bit for bit on the columns of whole
//! f32x4 vectors, bf16 or not. The one exception: a forward on all-bf16
//! operands where the CPU has AVX512_BF16 ([`pairs`]) sums column pairs with
//! `vdpbf16ps` (a reassociation, subnormal inputs as zero).

use super::super::buffers::{Fresh, Scratch};
use super::super::gemm::Elt;
use super::super::native_dot::{self, Dot, MAX_F};
use super::super::{JitOptions, KernelChoice};
use super::{DotSpec, elt_of};
use dlrm_ir::Tensor;
use half::bf16;
use rayon::prelude::*;

/// Samples widened (and rounded) at a time where some operand or result is
/// bf16: at 27 operands of 128 columns, 16 samples are 216 KiB of f32
/// operands and as much of gradients, well inside a core's L2.
const STAGE: usize = 16;

/// Whether the AVX-512 kernels run `spec`: a CPU that has AVX-512, a kernel
/// choice that allows it, and at most [`MAX_F`] operands.
pub(super) fn applies(opts: &JitOptions, spec: &DotSpec) -> bool {
    matches!(
        opts.kernels,
        KernelChoice::Auto
            | KernelChoice::Avx512
            | KernelChoice::Avx512Bf16
            | KernelChoice::AmxBf16
    ) && native_dot::available()
        && spec.f <= MAX_F
        // Zero-width operands: nothing to stage (the Cranelift kernel runs).
        && spec.d > 0
}

/// Whether the forward on bf16 operands takes [`native_dot::forward_pairs`]
/// (AVX512_BF16's pair dot product): where the CPU has it, under the kernel
/// choices that let the GEMMs use it (`auto`, `avx512-bf16`, `amx-bf16`), as
/// the bf16 GEMMs choose their k-pair kernels: not timed, so a run's numbers
/// are the same on every run on one CPU. Under `avx512` the bf16 operands are
/// widened and the f32 path's sums computed.
pub(super) fn pairs(opts: &JitOptions) -> bool {
    matches!(
        opts.kernels,
        KernelChoice::Auto | KernelChoice::Avx512Bf16 | KernelChoice::AmxBf16
    ) && native_dot::pairs_available()
}

fn dot_of(spec: &DotSpec) -> Dot {
    Dot {
        f: spec.f,
        d: spec.d,
        self_interaction: spec.self_interaction,
    }
}

/// The f32 views of samples `c0..c0 + n` of the operands at `ptrs` (element
/// types as `spec`'s), written into `views`: f32 operands in place, bf16 ones
/// widened into `buf` (`f · STAGE · d` floats), each view's row 0 being sample
/// `c0`; returns the `f` views.
///
/// # Safety
/// Every operand holds rows `c0..c0 + n` of `spec.d` elements of its type;
/// `n <= STAGE`; `spec.f <= MAX_F`.
unsafe fn operands<'v>(
    spec: &DotSpec,
    ptrs: &[usize],
    (c0, n): (usize, usize),
    buf: &mut [f32],
    views: &'v mut [*const f32; MAX_F],
) -> &'v [*const f32] {
    let d = spec.d;
    let chunks = buf.chunks_exact_mut(STAGE * d);
    for (i, ((&p, dst), v)) in ptrs.iter().zip(chunks).zip(views.iter_mut()).enumerate() {
        // SAFETY: the caller's contract: rows c0..c0+n of operand i exist.
        unsafe {
            *v = match spec.elt(i) {
                Elt::F32 => (p as *const f32).add(c0 * d),
                Elt::BF16 => widen((p as *const bf16).add(c0 * d), &mut dst[..n * d]),
            };
        }
    }
    &views[..spec.f]
}

/// `dst` = the `dst.len()` bf16 at `src`, widened (exact); returns `dst`'s
/// address.
///
/// # Safety
/// `src` holds `dst.len()` bf16.
unsafe fn widen(src: *const bf16, dst: &mut [f32]) -> *const f32 {
    // SAFETY: the caller's contract.
    let src = unsafe { std::slice::from_raw_parts(src, dst.len()) };
    crate::reference::convert::widen(src, dst);
    dst.as_ptr()
}

/// `src` rounded to bf16 (nearest even, NaN kept NaN) at `dst`.
///
/// # Safety
/// `dst` holds `src.len()` bf16 that no other thread touches.
unsafe fn round_into(src: &[f32], dst: *mut bf16) {
    // SAFETY: the caller's contract.
    let dst = unsafe { std::slice::from_raw_parts_mut(dst, src.len()) };
    crate::reference::convert::narrow(src, dst);
}

/// The element type all operands share, if they share one (then the kernels
/// read them in place, bf16 widened in registers).
fn uniform(spec: &DotSpec) -> Option<Elt> {
    let all = if spec.f >= 64 {
        u64::MAX
    } else {
        (1u64 << spec.f) - 1
    };
    match spec.bf16_ops & all {
        0 => Some(Elt::F32),
        b if b == all => Some(Elt::BF16),
        _ => None,
    }
}

/// Operands of one type `E` from sample `c0`: each view's row 0 is sample
/// `c0` of its operand.
///
/// # Safety
/// Every operand holds at least `c0` rows of `d` elements of type `E`.
unsafe fn views_of<E>(ptrs: &[usize], c0: usize, d: usize) -> [*const E; MAX_F] {
    let mut v = [std::ptr::null(); MAX_F];
    for (v, &p) in v.iter_mut().zip(ptrs) {
        // SAFETY: the caller's contract.
        *v = unsafe { (p as *const E).add(c0 * d) };
    }
    v
}

/// The forward kernel on samples `c0..c0 + n` into `out` (`n` f32 rows of
/// `width`, sample `c0`'s first): operands of one type in place (all bf16:
/// with [`native_dot::forward_pairs`] if `pairs`), else widened into `buf`
/// first.
///
/// # Safety
/// Every operand holds rows `c0..c0 + n` of `spec.d` elements of its spec
/// type; `out` holds `n·width` f32 that no other thread touches; `n <=
/// STAGE` unless the operands share a type; `applies(spec)`; `pairs` only
/// where [`native_dot::pairs_available`].
unsafe fn fwd_rows(
    pairs: bool,
    spec: &DotSpec,
    ptrs: &[usize],
    (c0, n): (usize, usize),
    buf: &mut [f32],
    out: *mut f32,
) {
    let (dot, d, f) = (dot_of(spec), spec.d, spec.f);
    // SAFETY: the caller's contract.
    unsafe {
        match uniform(spec) {
            Some(Elt::F32) => {
                native_dot::forward(dot, &views_of::<f32>(ptrs, c0, d)[..f], out, 0, n)
            }
            Some(Elt::BF16) if pairs => {
                native_dot::forward_pairs(dot, &views_of::<bf16>(ptrs, c0, d)[..f], out, 0, n)
            }
            Some(Elt::BF16) => {
                native_dot::forward(dot, &views_of::<bf16>(ptrs, c0, d)[..f], out, 0, n)
            }
            None => {
                let mut views = [std::ptr::null(); MAX_F];
                let ops = operands(spec, ptrs, (c0, n), buf, &mut views);
                native_dot::forward(dot, ops, out, 0, n)
            }
        }
    }
}

/// The backward kernel on samples `c0..c0 + n`: `dr` and `grads` f32 rows of
/// those samples (sample `c0`'s first); operands as [`fwd_rows`]'.
///
/// # Safety
/// As [`fwd_rows`], with `dr` holding `n·width` f32 and every `grads[i]`
/// `n·d` f32 that no other thread touches.
unsafe fn bwd_rows(
    spec: &DotSpec,
    ptrs: &[usize],
    (c0, n): (usize, usize),
    buf: &mut [f32],
    (dr, grads): (*const f32, &[*mut f32]),
) {
    let (dot, d, f) = (dot_of(spec), spec.d, spec.f);
    // SAFETY: the caller's contract.
    unsafe {
        match uniform(spec) {
            Some(Elt::F32) => {
                native_dot::backward(dot, &views_of::<f32>(ptrs, c0, d)[..f], dr, grads, 0, n)
            }
            Some(Elt::BF16) => {
                native_dot::backward(dot, &views_of::<bf16>(ptrs, c0, d)[..f], dr, grads, 0, n)
            }
            None => {
                let mut views = [std::ptr::null(); MAX_F];
                let ops = operands(spec, ptrs, (c0, n), buf, &mut views);
                native_dot::backward(dot, ops, dr, grads, 0, n)
            }
        }
    }
}

/// The forward interaction, parallel over blocks of `sb` samples; shapes were
/// checked by [`super::eval`] (every operand `[s, d]` of its spec type at
/// `ptrs`).
/// `pairs`: bf16 operands take [`native_dot::forward_pairs`] ([`pairs`]).
pub(super) fn forward(
    spec: &DotSpec,
    ptrs: &[usize],
    (s, sb): (usize, usize),
    pairs: bool,
) -> Vec<Tensor> {
    let (d, width, f) = (spec.d, spec.width(), spec.f);
    // Operands of one type and f32 results: whole blocks, in place.
    let direct = uniform(spec).is_some() && spec.out == Elt::F32;
    // Not zeroed: the kernel writes every column of its rows.
    let mut fresh = Fresh::new(spec.out, s * width);
    if s > 0 && width > 0 {
        let out = fresh.buf().as_mut_ptr() as usize;
        (0..s.div_ceil(sb)).into_par_iter().for_each(|blk| {
            let (s0, s1) = (blk * sb, ((blk + 1) * sb).min(s));
            // SAFETY (every block below): operands hold s·d elements of their
            // types, the result s·width (allocated above); this task reads and
            // writes rows s0..s1 only; `applies` checked the CPU and F.
            if direct {
                let o = unsafe { (out as *mut f32).add(s0 * width) };
                unsafe { fwd_rows(pairs, spec, ptrs, (s0, s1 - s0), &mut [], o) };
                return;
            }
            let mut buf = match uniform(spec) {
                Some(_) => Scratch::new(0),
                None => Scratch::new(f * STAGE * d),
            };
            // f32 results are written in place: no scratch.
            let mut res = (spec.out == Elt::BF16).then(|| Scratch::new(STAGE * width));
            for c0 in (s0..s1).step_by(STAGE) {
                let n = STAGE.min(s1 - c0);
                unsafe {
                    match res.as_deref_mut() {
                        None => {
                            let o = (out as *mut f32).add(c0 * width);
                            fwd_rows(pairs, spec, ptrs, (c0, n), &mut buf, o)
                        }
                        Some(res) => {
                            fwd_rows(pairs, spec, ptrs, (c0, n), &mut buf, res.as_mut_ptr());
                            round_into(&res[..n * width], (out as *mut bf16).add(c0 * width));
                        }
                    }
                }
            }
        });
    }
    // SAFETY: the tasks cover rows 0..s, each row written whole (`x`, then
    // every kept pair); empty if s·width = 0.
    vec![unsafe { fresh.assume_init() }.tensor(vec![s, width])]
}

/// The interaction's gradients, parallel over blocks of `sb` samples; shapes
/// were checked by [`super::eval`] (every operand `[s, d]` at `ptrs`, `dr`
/// `[s, width]`, each of its spec type).
pub(super) fn backward(
    spec: &DotSpec,
    ptrs: &[usize],
    inputs: &[&Tensor],
    s: usize,
    sb: usize,
) -> Vec<Tensor> {
    let (d, width, f) = (spec.d, spec.width(), spec.f);
    // Operands of one type, f32 `dr` and gradients: whole blocks, in place.
    let direct = uniform(spec).is_some() && spec.dr == Elt::F32 && spec.out == Elt::F32;
    // Not zeroed: the kernel writes every column of its rows of each.
    let mut grads: Vec<Fresh> = (0..f).map(|_| Fresh::new(spec.out, s * d)).collect();
    if s > 0 && d > 0 {
        // Addresses, as the Cranelift path passes them to its tasks.
        let gaddrs: Vec<usize> = grads
            .iter_mut()
            .map(|g| g.buf().as_mut_ptr() as usize)
            .collect();
        let dr = elt_of(inputs[0]).map_or(0, |(_, p)| p);
        (0..s.div_ceil(sb)).into_par_iter().for_each(|blk| {
            let (s0, s1) = (blk * sb, ((blk + 1) * sb).min(s));
            let mut gs = [std::ptr::null_mut(); MAX_F];
            // SAFETY (every block below): operands hold s·d elements, dr
            // s·width, every gradient s·d, each of its type (checked or
            // allocated above); this task reads and writes rows s0..s1 only;
            // `applies` checked the CPU and F.
            if direct {
                for (g, &p) in gs.iter_mut().zip(&gaddrs) {
                    *g = unsafe { (p as *mut f32).add(s0 * d) };
                }
                let drp = unsafe { (dr as *const f32).add(s0 * width) };
                unsafe { bwd_rows(spec, ptrs, (s0, s1 - s0), &mut [], (drp, &gs[..f])) };
                return;
            }
            let mut buf = match uniform(spec) {
                Some(_) => Scratch::new(0),
                None => Scratch::new(f * STAGE * d),
            };
            // An f32 `dr` is read, f32 gradients written, in place: no scratch.
            let mut drb = (spec.dr == Elt::BF16).then(|| Scratch::new(STAGE * width));
            let mut gbuf = (spec.out == Elt::BF16).then(|| Scratch::new(f * STAGE * d));
            for c0 in (s0..s1).step_by(STAGE) {
                let n = STAGE.min(s1 - c0);
                unsafe {
                    let drp = match drb.as_deref_mut() {
                        None => (dr as *const f32).add(c0 * width),
                        Some(drb) => {
                            widen((dr as *const bf16).add(c0 * width), &mut drb[..n * width])
                        }
                    };
                    match gbuf.as_deref_mut() {
                        None => {
                            for (g, &p) in gs.iter_mut().zip(&gaddrs) {
                                *g = (p as *mut f32).add(c0 * d);
                            }
                        }
                        Some(gbuf) => {
                            for (g, b) in gs.iter_mut().zip(gbuf.chunks_exact_mut(STAGE * d)) {
                                *g = b.as_mut_ptr();
                            }
                        }
                    }
                    bwd_rows(spec, ptrs, (c0, n), &mut buf, (drp, &gs[..f]));
                    if let Some(gbuf) = &gbuf {
                        for (g, &p) in gbuf.chunks_exact(STAGE * d).zip(&gaddrs) {
                            round_into(&g[..n * d], (p as *mut bf16).add(c0 * d));
                        }
                    }
                }
            }
        });
    }
    // SAFETY: the tasks cover rows 0..s of every gradient, each row written
    // whole (all `d` columns); empty if s·d = 0.
    grads
        .into_iter()
        .map(|g| unsafe { g.assume_init() }.tensor(vec![s, d]))
        .collect()
}
