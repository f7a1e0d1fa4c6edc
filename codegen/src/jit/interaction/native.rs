//! The dot interaction on [`native_dot`]'s AVX-512 kernels, or its AVX2 ones
//! ([`native_dot::avx2`]; [`kernels`] chooses), f32 arithmetic, for every mix
//! of element types the Cranelift kernels take. Operands that
//! share one type, f32 or bf16, are read in place (bf16 widened in registers
//! as loaded; the AVX-512 forward widens each sample's rows once,
//! [`native_dot::forward_widened`]), and f32 `dr` and results too: a `--precision bf16` plan's
//! interaction (bf16 operands, f32 `dr` and gradients) stages nothing but its
//! bf16 forward result. Otherwise each task widens its samples' operands of
//! mixed types (and a bf16 `dr`) into f32 scratch [`STAGE`] samples at a time,
//! runs the kernel on them, and rounds bf16 results once to nearest even
//! (`half::bf16::from_f32`, as the Cranelift kernels store them). Widening is
//! exact, so the products and sums are the f32 path's: the backward's
//! gradients equal the Cranelift kernel's bit for bit on the columns of whole
//! f32x4 vectors, bf16 or not. The one exception: a forward on all-bf16
//! operands where [`pairs`] takes AVX512_BF16's pair dot product sums column
//! pairs with `vdpbf16ps` (a reassociation, subnormal inputs as zero).

use super::super::buffers::{Fresh, Scratch};
use super::super::gemm::Elt;
use super::super::micro::probe;
use super::super::native_dot::{self, Dot, Elem, MAX_F};
use super::super::{JitOptions, KernelChoice};
use super::{DotSpec, elt_of};
use dlrm_ir::Tensor;
use half::bf16;
use rayon::prelude::*;

/// Samples widened (and rounded) at a time where some operand or result is
/// bf16: at 27 operands of 128 columns, 16 samples are 216 KiB of f32
/// operands and as much of gradients, well inside a core's L2.
const STAGE: usize = 16;

/// The native kernels that run a dot interaction ([`kernels`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kernels {
    /// [`native_dot`]'s AVX-512 kernels; `pairs`: the forward on all-bf16
    /// operands with [`native_dot::forward_pairs`] ([`pairs`]).
    Avx512 { pairs: bool },
    /// [`native_dot::avx2`]'s AVX2+FMA kernels.
    Avx2,
}

/// The native kernels that run `spec`, if any (else the Cranelift kernels
/// do): at most [`MAX_F`] operands of at least one column; the AVX-512
/// kernels where the CPU has AVX-512 and the kernel choice allows it (`auto`,
/// `avx512`, `avx512bf16`, `amxbf16`), else the AVX2 ones where it has AVX2
/// and FMA under `auto` or `native` (the AVX2 micro-kernel's choice), for
/// widths that are whole 8-lane vectors ([`native_dot::avx2::fits`]).
pub(super) fn kernels(opts: &JitOptions, spec: &DotSpec) -> Option<Kernels> {
    use KernelChoice as K;
    if spec.f > MAX_F || spec.d == 0 {
        return None;
    }
    let k = opts.kernels;
    if matches!(k, K::Auto | K::Avx512 | K::Avx512Bf16 | K::AmxBf16) && native_dot::available() {
        return Some(Kernels::Avx512 { pairs: pairs(opts) });
    }
    (matches!(k, K::Auto | K::Native)
        && native_dot::avx2::available()
        && native_dot::avx2::fits(spec.d))
    .then_some(Kernels::Avx2)
}

/// Whether the forward on bf16 operands takes [`native_dot::forward_pairs`]
/// (AVX512_BF16's pair dot product): where the CPU has it, under
/// `avx512bf16` and `amxbf16`, and under `auto` where the GEMMs take
/// `vdpbf16ps` too ([`probe::bf16_dot_pays`]: the probe, or
/// `DLRM_BF16_DOT`). Otherwise bf16 operands are widened once a sample
/// ([`native_dot::forward_widened`]) and the f32 path's sums computed. Where
/// `vdpbf16ps` is slow, the pairs lose to that: an Intel Xeon model 207
/// (2026-11-30, probe 0.48x, 2 threads, interleaved), the forward alone at
/// dlrm-small's 9 operands of 64 0.271-0.283 ms with the pairs against
/// 0.214-0.218 widened (f32 0.208-0.216), at dlrm-mlperf's 27 of 128
/// 1.80-1.84 against 1.33-1.37 (f32 1.43-1.49); widening as each register
/// block loads a row had been slower than the pairs there.
fn pairs(opts: &JitOptions) -> bool {
    native_dot::pairs_available()
        && match opts.kernels {
            KernelChoice::Avx512Bf16 | KernelChoice::AmxBf16 => true,
            KernelChoice::Auto => probe::bf16_dot_pays(),
            _ => false,
        }
}

/// The forward kernel of `kern` on operands of one type `E`.
///
/// # Safety
/// [`native_dot::forward()`]'s contract (with `kern`'s features: [`kernels`]
/// chose it; for AVX2, `d` whole vectors).
unsafe fn fwd<E: Elem>(kern: Kernels, dot: Dot, ops: &[*const E], out: *mut f32, n: usize) {
    // SAFETY: forwarded.
    unsafe {
        match kern {
            Kernels::Avx512 { .. } => native_dot::forward(dot, ops, out, 0, n),
            Kernels::Avx2 => native_dot::avx2::forward(dot, ops, out, 0, n),
        }
    }
}

/// The backward kernel of `kern` on operands of one type `E`.
///
/// # Safety
/// [`native_dot::backward()`]'s contract (with `kern`'s features, as
/// [`fwd`]).
unsafe fn bwd<E: Elem>(
    kern: Kernels,
    dot: Dot,
    ops: &[*const E],
    (dr, grads): (*const f32, &[*mut f32]),
    n: usize,
) {
    // SAFETY: forwarded.
    unsafe {
        match kern {
            Kernels::Avx512 { .. } => native_dot::backward(dot, ops, dr, grads, 0, n),
            Kernels::Avx2 => native_dot::avx2::backward(dot, ops, dr, grads, 0, n),
        }
    }
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
/// with [`native_dot::forward_pairs`] if `kern` says so), else widened into
/// `buf` first.
///
/// # Safety
/// Every operand holds rows `c0..c0 + n` of `spec.d` elements of its spec
/// type; `out` holds `n·width` f32 that no other thread touches; `n <=
/// STAGE` unless the operands share a type; `kern` is [`kernels`]' choice for
/// `spec`.
unsafe fn fwd_rows(
    kern: Kernels,
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
            Some(Elt::F32) => fwd(kern, dot, &views_of::<f32>(ptrs, c0, d)[..f], out, n),
            Some(Elt::BF16) if kern == (Kernels::Avx512 { pairs: true }) => {
                native_dot::forward_pairs(dot, &views_of::<bf16>(ptrs, c0, d)[..f], out, 0, n)
            }
            Some(Elt::BF16) if kern == (Kernels::Avx512 { pairs: false }) => {
                let ops = &views_of::<bf16>(ptrs, c0, d)[..f];
                native_dot::forward_widened(dot, ops, out, (0, n), buf)
            }
            Some(Elt::BF16) => fwd(kern, dot, &views_of::<bf16>(ptrs, c0, d)[..f], out, n),
            None => {
                let mut views = [std::ptr::null(); MAX_F];
                let ops = operands(spec, ptrs, (c0, n), buf, &mut views);
                fwd(kern, dot, ops, out, n)
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
    kern: Kernels,
    spec: &DotSpec,
    ptrs: &[usize],
    (c0, n): (usize, usize),
    buf: &mut [f32],
    io: (*const f32, &[*mut f32]),
) {
    let (dot, d, f) = (dot_of(spec), spec.d, spec.f);
    // SAFETY: the caller's contract.
    unsafe {
        match uniform(spec) {
            Some(Elt::F32) => bwd(kern, dot, &views_of::<f32>(ptrs, c0, d)[..f], io, n),
            Some(Elt::BF16) => bwd(kern, dot, &views_of::<bf16>(ptrs, c0, d)[..f], io, n),
            None => {
                let mut views = [std::ptr::null(); MAX_F];
                let ops = operands(spec, ptrs, (c0, n), buf, &mut views);
                bwd(kern, dot, ops, io, n)
            }
        }
    }
}

/// The forward interaction, parallel over blocks of `sb` samples; shapes were
/// checked by [`super::eval`] (every operand `[s, d]` of its spec type at
/// `ptrs`). With `blocked = Some(bk)` the result is `[Kb, S, bk]`, each row
/// written into its blocks from the task's scratch (zeros in the last block's
/// padding columns): `block_act{bk}` of the row-major result, which is never
/// stored.
/// `kern`: [`kernels`]' choice for `spec`.
pub(super) fn forward(
    kern: Kernels,
    spec: &DotSpec,
    ptrs: &[usize],
    (s, sb): (usize, usize),
    blocked: Option<usize>,
) -> Vec<Tensor> {
    let (d, width, f) = (spec.d, spec.width(), spec.f);
    // Operands of one type and f32 row-major results: whole blocks, in place.
    let direct = uniform(spec).is_some() && spec.out == Elt::F32 && blocked.is_none();
    // bf16 operands widened once a sample ([`native_dot::forward_widened`]):
    // the task's buffer of one sample's rows.
    let wide_len = match (uniform(spec), kern) {
        (Some(Elt::BF16), Kernels::Avx512 { pairs: false }) => f * d,
        _ => 0,
    };
    let (bk, kb) = match blocked {
        Some(bk) => (bk, width.div_ceil(bk)),
        None => (width, 1),
    };
    // Not zeroed: the kernel (or the blocking) writes every element.
    let mut fresh = Fresh::new(spec.out, kb * s * bk);
    if s > 0 && width > 0 {
        let out = fresh.buf().as_mut_ptr() as usize;
        (0..s.div_ceil(sb)).into_par_iter().for_each(|blk| {
            let (s0, s1) = (blk * sb, ((blk + 1) * sb).min(s));
            // SAFETY (every block below): operands hold s·d elements of their
            // types, the result s·width (allocated above, in `kb` blocks of
            // `s·bk` when blocked); this task reads and writes rows s0..s1
            // only; `kernels` checked the CPU, F and D.
            if direct {
                let o = unsafe { (out as *mut f32).add(s0 * width) };
                let mut wide = Scratch::new(wide_len);
                unsafe { fwd_rows(kern, spec, ptrs, (s0, s1 - s0), &mut wide, o) };
                return;
            }
            let mut buf = match uniform(spec) {
                Some(_) => Scratch::new(wide_len),
                None => Scratch::new(f * STAGE * d),
            };
            // f32 row-major results are written in place: no scratch.
            let staged = spec.out == Elt::BF16 || blocked.is_some();
            let mut res = staged.then(|| Scratch::new(STAGE * width));
            for c0 in (s0..s1).step_by(STAGE) {
                let n = STAGE.min(s1 - c0);
                unsafe {
                    match res.as_deref_mut() {
                        None => {
                            let o = (out as *mut f32).add(c0 * width);
                            fwd_rows(kern, spec, ptrs, (c0, n), &mut buf, o)
                        }
                        Some(res) => {
                            fwd_rows(kern, spec, ptrs, (c0, n), &mut buf, res.as_mut_ptr());
                            let rows = &res[..n * width];
                            match blocked {
                                None => round_into(rows, (out as *mut bf16).add(c0 * width)),
                                Some(_) => into_blocks(rows, (out, spec.out), (s, width, bk), c0),
                            }
                        }
                    }
                }
            }
        });
    }
    // SAFETY: the tasks cover rows 0..s, each row written whole (`x`, then
    // every kept pair; blocked: every block's row, padding included); empty
    // if s·width = 0.
    let shape = match blocked {
        Some(_) => vec![kb, s, bk],
        None => vec![s, width],
    };
    vec![unsafe { fresh.assume_init() }.tensor(shape)]
}

/// Rows `c0..c0 + rows.len() / width` of the `[Kb, S, bk]` tensor at `src`
/// (elements `e`) into the f32 `rows` (`width` columns each, bf16 widened):
/// per block, the row's live columns there.
///
/// # Safety
/// `src` holds `Kb·s·bk` elements of `e`, `Kb = ⌈width / bk⌉`, and those rows.
unsafe fn from_blocks(
    (src, e): (usize, Elt),
    (s, width, bk): (usize, usize, usize),
    c0: usize,
    rows: &mut [f32],
) {
    for (r, row) in rows.chunks_exact_mut(width).enumerate() {
        for (q, part) in row.chunks_mut(bk).enumerate() {
            let at = (q * s + c0 + r) * bk;
            // SAFETY: the caller's contract: row `c0 + r` of block `q`.
            unsafe {
                match e {
                    Elt::F32 => part.copy_from_slice(std::slice::from_raw_parts(
                        (src as *const f32).add(at),
                        part.len(),
                    )),
                    Elt::BF16 => {
                        widen((src as *const bf16).add(at), part);
                    }
                }
            }
        }
    }
}

/// Rows `c0..` of a `[Kb, S, bk]` result at `out` (elements `e`) from the
/// f32 `rows` (`width` columns each): per block, the row's columns there
/// (rounded to bf16 for a bf16 result), then zeros to `bk`.
///
/// # Safety
/// `out` holds `Kb·s·bk` elements of `e`, `Kb = ⌈width / bk⌉`, whose rows
/// `c0..c0 + rows.len() / width` no other thread touches.
unsafe fn into_blocks(
    rows: &[f32],
    (out, e): (usize, Elt),
    (s, width, bk): (usize, usize, usize),
    c0: usize,
) {
    for (r, row) in rows.chunks_exact(width).enumerate() {
        for (q, part) in row.chunks(bk).enumerate() {
            let at = (q * s + c0 + r) * bk;
            // SAFETY: the caller's contract: row `c0 + r` of block `q`.
            unsafe {
                match e {
                    Elt::F32 => {
                        let dst = std::slice::from_raw_parts_mut((out as *mut f32).add(at), bk);
                        dst[..part.len()].copy_from_slice(part);
                        dst[part.len()..].fill(0.0);
                    }
                    Elt::BF16 => {
                        let dst = (out as *mut bf16).add(at);
                        round_into(part, dst);
                        std::slice::from_raw_parts_mut(dst.add(part.len()), bk - part.len())
                            .fill(bf16::ZERO);
                    }
                }
            }
        }
    }
}

/// The interaction's gradients, parallel over blocks of `sb` samples; shapes
/// were checked by [`super::eval`] (every operand `[s, d]` at `ptrs`, `dr`
/// `[s, width]`, each of its spec type).
/// `kern`: [`kernels`]' choice for `spec`.
pub(super) fn backward(
    kern: Kernels,
    spec: &DotSpec,
    ptrs: &[usize],
    inputs: &[&Tensor],
    (s, sb): (usize, usize),
    blocked: Option<usize>,
) -> Vec<Tensor> {
    let (d, width, f) = (spec.d, spec.width(), spec.f);
    // Operands of one type, f32 row-major `dr` and f32 gradients: whole
    // blocks, in place.
    let direct =
        uniform(spec).is_some() && spec.dr == Elt::F32 && spec.out == Elt::F32 && blocked.is_none();
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
            // `kernels` checked the CPU, F and D.
            if direct {
                for (g, &p) in gs.iter_mut().zip(&gaddrs) {
                    *g = unsafe { (p as *mut f32).add(s0 * d) };
                }
                let drp = unsafe { (dr as *const f32).add(s0 * width) };
                unsafe { bwd_rows(kern, spec, ptrs, (s0, s1 - s0), &mut [], (drp, &gs[..f])) };
                return;
            }
            let mut buf = match uniform(spec) {
                Some(_) => Scratch::new(0),
                None => Scratch::new(f * STAGE * d),
            };
            // An f32 `dr` is read, f32 gradients written, in place: no scratch.
            let staged_dr = spec.dr == Elt::BF16 || blocked.is_some();
            let mut drb = staged_dr.then(|| Scratch::new(STAGE * width));
            let mut gbuf = (spec.out == Elt::BF16).then(|| Scratch::new(f * STAGE * d));
            for c0 in (s0..s1).step_by(STAGE) {
                let n = STAGE.min(s1 - c0);
                unsafe {
                    let drp = match (drb.as_deref_mut(), blocked) {
                        (None, _) => (dr as *const f32).add(c0 * width),
                        (Some(drb), None) => {
                            widen((dr as *const bf16).add(c0 * width), &mut drb[..n * width])
                        }
                        (Some(drb), Some(bk)) => {
                            let rows = &mut drb[..n * width];
                            from_blocks((dr, spec.dr), (s, width, bk), c0, rows);
                            rows.as_ptr()
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
                    bwd_rows(kern, spec, ptrs, (c0, n), &mut buf, (drp, &gs[..f]));
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
