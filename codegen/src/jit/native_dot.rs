//! The dot interaction on AVX-512, forward and backward (f32 operands, `dr`,
//! results and gradients): the 512-bit sibling of the Cranelift kernel of
//! [`super::interaction`], whose vectors are 128 bits wide (the x86-64 backend
//! has no wider ones). Chosen at run time ([`available`]) under
//! [`super::KernelChoice::Auto`], `Avx512`, `Avx512Bf16` or `AmxBf16`, like the
//! GEMM micro-kernels (bf16 operands and results are widened and rounded
//! around these kernels by the interaction's driver); under the other
//! choices the Cranelift kernel runs.
//!
//! Per sample, 64 columns at a time (up to four `zmm`, as many as have live
//! columns) and six operands `i` at a time (each partner's loaded columns feed
//! all six):
//! `dT_i = [i == 0] dr[..D] + Σ_k c_ik T_k` over the partners `k` of `i` in
//! ascending order, one FMA per term, with `c_ik` the `dr` entry of the pair
//! `(max, min)` (`2·dr` on the diagonal with self-interaction): the Cranelift
//! kernel's order term for term, so the two agree bit for bit on the columns
//! of its whole f32x4 vectors (its last `D mod 4` columns use a multiply and
//! an add). Columns past a multiple of 16 are masked loads and stores: nothing
//! outside a row is read or written. The coefficients are read where they lie
//! in the sample's `dr` row (no per-sample `F × F` matrix of them: gathering
//! one took a third of the backward's time at 16 columns).
//!
//! The forward ([`forward`]): per sample, `x`, then the dot products in
//! register blocks of 4 operands × 4 partners (16-lane partial sums, each
//! loaded vector feeding four FMAs), the block's 16 sums across lanes at once
//! (a reassociation, as the Cranelift kernel's 4-lane sums are). The next
//! sample's rows are prefetched meanwhile, a few before each block of work
//! ([`Ahead`]): at dlrm-mlperf's 27×128 the operands are 27 streams, more
//! than the hardware prefetchers follow. There
//! (`examples/interaction_best 27 128 2048`, 2026-11-29, AMD EPYC Zen 5 class,
//! 2 threads, interleaved) the blocks and the prefetch took the forward from
//! 2.48-2.52 to 1.38-1.45 ms, and the prefetch the backward from 3.08-3.09
//! to 2.52-2.55 ms (its reads and writes alone take 1.9 ms); spreading the
//! prefetch over the sample's blocks took them on to 0.87 and 1.84 ms. An earlier
//! forward (one operand against 8 partners, a load per FMA) ran at 16% of the
//! FMA peak. Operands of at most 16 columns (dlrm-kaggle's 27×16), where
//! the sums across lanes were most of the work, take [`forward_narrow`]: the
//! operands transposed in registers once per sample, then each operand's dot
//! products with all its partners as lanes of one or two vectors, summed in
//! column order. bf16 operands, where the CPU has AVX512_BF16, take
//! [`forward_pairs`]: the same register blocks on `vdpbf16ps` (32 columns an
//! instruction, nothing widened; a bf16 dlrm-mlperf step's forward went from
//! 1.05-1.10 to 0.68-0.72 ms, `dlrm-run --bench`, interleaved, Zen 5 class).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// True if this CPU can run these kernels (AVX-512 F, BW and VL).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// True if this CPU also has AVX512_BF16's pair dot product
/// (`vdpbf16ps`), for [`forward_pairs`].
pub fn pairs_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        available() && std::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The shape of one interaction: `f` operands of `d` columns, diagonal pairs
/// kept or not.
#[derive(Clone, Copy, Debug)]
pub struct Dot {
    /// Operands `F` (`x` and the embeddings).
    pub f: usize,
    /// Their width `D`.
    pub d: usize,
    /// Keep the diagonal pairs.
    pub self_interaction: bool,
}

impl Dot {
    /// The result's width: `D` plus one column per kept pair.
    pub fn width(&self) -> usize {
        dlrm_ir::interaction_width(
            dlrm_ir::InteractionKind::Dot,
            self.self_interaction,
            &vec![self.d; self.f],
        )
    }

    /// The result column of pair `(hi, lo)`, `lo <= hi` (`lo < hi` without
    /// self-interaction): pairs in row-major order after the `D` columns of `x`.
    fn col(&self, hi: usize, lo: usize) -> usize {
        let before = if self.self_interaction {
            hi * (hi + 1) / 2
        } else {
            hi * hi.saturating_sub(1) / 2
        };
        self.d + before + lo
    }
}

/// The lane mask of the 16 columns from `c` of a `d`-column row.
#[cfg(target_arch = "x86_64")]
fn mask(c: usize, d: usize) -> u16 {
    let n = d.saturating_sub(c).min(16);
    if n == 16 { u16::MAX } else { (1u16 << n) - 1 }
}

/// An operand element type the kernels read as f32 lanes: f32, or bf16
/// widened exactly in registers as it is loaded (no widened copy of the
/// operands). Its methods are inlined into the kernels' `#[target_feature]`
/// functions, which have the features they need (AVX-512 F, BW and VL).
#[cfg(target_arch = "x86_64")]
pub trait Elem: Copy {
    /// 16 elements at `p` as f32 (lanes outside `m` zero, not read).
    ///
    /// # Safety
    /// The lanes of `m` lie inside an allocation; AVX-512 F, BW and VL.
    unsafe fn load16(p: *const Self, m: __mmask16) -> __m512;

    /// The element at `p` as f32.
    ///
    /// # Safety
    /// `p` is valid for reads.
    unsafe fn get(p: *const Self) -> f32;
}

#[cfg(target_arch = "x86_64")]
impl Elem for f32 {
    #[inline(always)]
    unsafe fn load16(p: *const f32, m: __mmask16) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_maskz_loadu_ps(m, p) }
    }

    #[inline(always)]
    unsafe fn get(p: *const f32) -> f32 {
        // SAFETY: the caller's contract.
        unsafe { *p }
    }
}

#[cfg(target_arch = "x86_64")]
impl Elem for half::bf16 {
    #[inline(always)]
    unsafe fn load16(p: *const half::bf16, m: __mmask16) -> __m512 {
        // SAFETY: the caller's contract; a bf16 is the high half of its f32.
        unsafe {
            let h = _mm256_maskz_loadu_epi16(m, p.cast());
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }

    #[inline(always)]
    unsafe fn get(p: *const half::bf16) -> f32 {
        // SAFETY: the caller's contract.
        unsafe { (*p).to_f32() }
    }
}

/// Rows of a gradient block: the operands whose gradients one pass over the
/// partners computes together (each load of a partner's columns feeds `ROWS`
/// FMAs; `ROWS × 4` accumulators, 4 loaded vectors and a broadcast fit the 32
/// `zmm` registers).
const ROWS: usize = 6;

/// Backward rows `s0..s1`: `ops[i]` operand `i`, `dr` the result's gradient
/// (`[S][width]`), `grads[i]` operand `i`'s gradient (`[S][D]`); rows `s0..s1`
/// of each gradient are written (absolute rows).
///
/// Per sample, each 64-column chunk of the gradients is computed `ROWS`
/// operands at a time: a per-sample `[F × F] · [F × D]` product, register
/// blocked, each gradient entry summed over its partners in ascending order
/// with one FMA per term. The coefficients are read from the sample's `dr` row
/// where they lie (see [`Block::rows_cols`]): no per-sample matrix of them.
///
/// # Safety
/// Every `ops[i]` holds rows `0..s1` of `d` f32, `dr` rows `0..s1` of `width`
/// f32, every `grads[i]` rows `0..s1` of `d` f32 whose rows `s0..s1` no other
/// thread touches; `f <= MAX_F`; the CPU has AVX-512 F ([`available`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn backward<E: Elem>(
    dot: Dot,
    ops: &[*const E],
    dr: *const f32,
    grads: &[*mut f32],
    s0: usize,
    s1: usize,
) {
    let Dot { f, d, .. } = dot;
    let width = dot.width();
    let mut rows = [std::ptr::null::<E>(); MAX_F];
    let mut outs = [std::ptr::null_mut::<f32>(); MAX_F];
    // Column of operand `i`'s first pair in a `dr` row (its pairs with
    // partners `0..i`, and `i` itself with self-interaction, follow it).
    let mut first = [0usize; MAX_F];
    for (i, c) in first.iter_mut().enumerate().take(f) {
        *c = dot.col(i, 0);
    }
    for s in s0..s1 {
        // SAFETY: the caller's contract: row `s` of every operand, of `dr` and
        // of every gradient; the masked loads and stores stay inside the rows.
        unsafe {
            for (r, &op) in rows.iter_mut().zip(ops) {
                *r = op.add(s * d);
            }
            for (o, &g) in outs.iter_mut().zip(grads) {
                *o = g.add(s * d);
            }
            let mut ahead = Ahead::new(ops, s + AHEAD, s1, d, d.div_ceil(64) * f.div_ceil(ROWS));
            if s + AHEAD < s1 {
                super::prefetch::fetch_lines(dr.add((s + AHEAD) * width) as *const u8, 4 * width);
            }
            let blk = Block {
                f,
                self_interaction: dot.self_interaction,
                drow: dr.add(s * width),
                first: &first[..f],
                rows: &rows[..f],
                outs: &outs[..f],
            };
            for c0 in (0..d).step_by(64) {
                // Only the vectors with live columns (a 16-wide operand is one
                // `zmm`, not four).
                let n = d - c0;
                for i0 in (0..f).step_by(ROWS) {
                    ahead.step();
                    blk.run(i0, (f - i0).min(ROWS), n.div_ceil(16).min(4), c0, n);
                }
            }
        }
    }
}

/// One sample's operands for [`Block::run`].
#[cfg(target_arch = "x86_64")]
struct Block<'a, E> {
    f: usize,
    self_interaction: bool,
    /// The sample's `dr` row.
    drow: *const f32,
    /// [`backward`]'s first pair column of each operand.
    first: &'a [usize],
    /// Its operands' rows.
    rows: &'a [*const E],
    /// Its gradients' rows.
    outs: &'a [*mut f32],
}

#[cfg(target_arch = "x86_64")]
impl<E: Elem> Block<'_, E> {
    /// Gradients `i0..i0 + r` (`r <= ROWS`), columns `c0..c0 + n` in `nv`
    /// vectors (`1..=4`, `n <= 16·nv`), through the block kernel specialised
    /// on `(r, nv)`.
    ///
    /// # Safety
    /// [`backward`]'s contract for this sample; AVX-512 F.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn run(&self, i0: usize, r: usize, nv: usize, c0: usize, n: usize) {
        macro_rules! dispatch {
            ($($r:literal),*) => {
                match (r, nv) {
                    $(
                        ($r, 1) => self.rows_cols::<$r, 1>(i0, c0, n),
                        ($r, 2) => self.rows_cols::<$r, 2>(i0, c0, n),
                        ($r, 3) => self.rows_cols::<$r, 3>(i0, c0, n),
                        ($r, _) => self.rows_cols::<$r, 4>(i0, c0, n),
                    )*
                    _ => unreachable!("a block has 1..=ROWS rows"),
                }
            };
        }
        // SAFETY: forwarded.
        unsafe { dispatch!(1, 2, 3, 4, 5, 6) }
    }

    /// Columns `c0..c0 + n` (`NV` vectors) of gradients `i0..i0 + R`: operand
    /// 0's starts from `dr`'s first `D` columns, the others from zero; then
    /// per partner `k` ascending (skipping `k == i` without self-interaction),
    /// `acc_i += c_ik · T_k`, one FMA per term, with `c_ik` the `dr` entry of
    /// the pair `(max, min)` (`2·dr` on the diagonal with self-interaction).
    ///
    /// The partners come in three runs, each reading its coefficients where
    /// they lie in the `dr` row: `k < i0` (below every row of the block: `c_ik`
    /// is entry `k` of operand `i`'s pairs), the block's own `i0..i0 + R`
    /// (either side, and the diagonal), and `k >= i0 + R` (above every row:
    /// the block's `R` coefficients are entries `i0..i0 + R` of operand `k`'s
    /// pairs, side by side).
    ///
    /// # Safety
    /// [`backward`]'s contract for this sample; `i0 + R <= f`; AVX-512 F.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn rows_cols<const R: usize, const NV: usize>(&self, i0: usize, c0: usize, n: usize) {
        let ms: [u16; NV] = std::array::from_fn(|v| mask(16 * v, n));
        let mut acc = [[_mm512_setzero_ps(); NV]; R];
        // SAFETY: the caller's contract; the masked loads and stores touch the
        // `n` live columns only; every coefficient read is a kept pair's column
        // of the `dr` row (`Dot::col`).
        unsafe {
            let load = |k: usize| -> [__m512; NV] {
                let t = self.rows[k].add(c0);
                std::array::from_fn(|v| E::load16(t.add(16 * v), ms[v]))
            };
            let fma = |row: &mut [__m512; NV], c: f32, x: &[__m512; NV]| {
                let cv = _mm512_set1_ps(c);
                for (a, &xv) in row.iter_mut().zip(x) {
                    *a = _mm512_fmadd_ps(cv, xv, *a);
                }
            };
            if i0 == 0 {
                for v in 0..NV {
                    acc[0][v] = _mm512_maskz_loadu_ps(ms[v], self.drow.add(c0 + 16 * v));
                }
            }
            // Below the block: row `i`'s pairs, entry `k`.
            let below: [*const f32; R] = std::array::from_fn(|r| self.drow.add(self.first[i0 + r]));
            for k in 0..i0 {
                let x = load(k);
                for (row, p) in acc.iter_mut().zip(below) {
                    fma(row, *p.add(k), &x);
                }
            }
            // The block's own partners.
            for k in i0..i0 + R {
                let x = load(k);
                for (r, row) in acc.iter_mut().enumerate() {
                    let i = i0 + r;
                    let c = match k.cmp(&i) {
                        std::cmp::Ordering::Less => *self.drow.add(self.first[i] + k),
                        std::cmp::Ordering::Greater => *self.drow.add(self.first[k] + i),
                        std::cmp::Ordering::Equal if self.self_interaction => {
                            *self.drow.add(self.first[i] + i) * 2.0
                        }
                        std::cmp::Ordering::Equal => continue,
                    };
                    fma(row, c, &x);
                }
            }
            // Above the block: operand `k`'s pairs, entries `i0..i0 + R`.
            for k in i0 + R..self.f {
                let x = load(k);
                let p = self.drow.add(self.first[k] + i0);
                for (r, row) in acc.iter_mut().enumerate() {
                    fma(row, *p.add(r), &x);
                }
            }
            for (row, out) in acc.iter().zip(&self.outs[i0..i0 + R]) {
                let g = out.add(c0);
                for (v, a) in row.iter().enumerate() {
                    _mm512_mask_storeu_ps(g.add(16 * v), ms[v], *a);
                }
            }
        }
    }
}

/// Forward rows `s0..s1`: `ops[i]` operand `i` (`[S][D]`), `out` the result
/// (`[S][width]`): per sample, `x` (operand 0) and then each kept pair's dot
/// product `T_i · T_j` (`j < i`, or `j <= i` with self-interaction) in
/// row-major order. The products are computed in register blocks of
/// [`BLK`] × [`BLK`] pairs (operands `i0..i0 + 4` against partners `j0..j0 +
/// 4`, `j0 <= i0`): 16-lane partial sums over the columns, each loaded vector
/// feeding four FMAs, then the 16 sums across lanes at once ([`sum16`]): a
/// reassociation of the definition's sum, as the Cranelift kernel's 4-lane one
/// is. The next sample's rows are prefetched while one is computed (its
/// operands are 27 rows of 27 arrays at dlrm-mlperf's shape, more streams than
/// the hardware prefetchers follow).
///
/// # Safety
/// Every `ops[i]` holds rows `0..s1` of `d` f32, `out` rows `0..s1` of `width`
/// f32 whose rows `s0..s1` no other thread touches; the CPU has AVX-512 F and
/// VL ([`available`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn forward<E: Elem>(dot: Dot, ops: &[*const E], out: *mut f32, s0: usize, s1: usize) {
    if (1..=16).contains(&dot.d) && dot.f <= NARROW_F {
        // SAFETY: forwarded; the operands fit `forward_narrow`'s registers.
        return unsafe { forward_narrow(dot, ops, out, s0, s1) };
    }
    // SAFETY: forwarded; `block_dots` wants what this function has.
    unsafe {
        each_sample(dot, ops, out, (s0, s1), |rows, ij, orow| {
            block_dots(dot, rows, ij, orow)
        })
    }
}

/// [`forward`] on bf16 operands with AVX512_BF16's `vdpbf16ps`: each
/// instruction multiplies 32 column pairs exactly (a bf16 product fits an
/// f32) and adds them into 16 f32 lanes, two columns a lane — twice the
/// columns per instruction of widening and an FMA, and no widening. Its
/// sums are a reassociation of [`forward`]'s (column pairs summed together)
/// and it treats subnormal inputs as zero, so the results may differ from the
/// widened f32 path in the last bits; they are the same on every run on one
/// CPU. Operands of at most 16 columns take [`forward_narrow`] as in
/// [`forward`].
///
/// # Safety
/// As [`forward`], and the CPU has AVX512_BF16 ([`pairs_available`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn forward_pairs(
    dot: Dot,
    ops: &[*const half::bf16],
    out: *mut f32,
    s0: usize,
    s1: usize,
) {
    if (1..=16).contains(&dot.d) && dot.f <= NARROW_F {
        // SAFETY: forwarded; the operands fit `forward_narrow`'s registers.
        return unsafe { forward_narrow(dot, ops, out, s0, s1) };
    }
    // SAFETY: forwarded; `block_pairs` wants what this function has.
    unsafe {
        each_sample(dot, ops, out, (s0, s1), |rows, ij, orow| {
            block_pairs(dot, rows, ij, orow)
        })
    }
}

/// The forward's loop over samples: `x` into the row, then `block` on every
/// register block of pairs, the next sample's rows prefetched meanwhile.
///
/// # Safety
/// As [`forward`]; `block` may be called with `rows[..f + BLK]` holding `d`
/// elements each, and the sample's result row.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn each_sample<E: Elem>(
    dot: Dot,
    ops: &[*const E],
    out: *mut f32,
    (s0, s1): (usize, usize),
    block: impl Fn(&[*const E], (usize, usize), *mut f32),
) {
    let Dot { f, d, .. } = dot;
    let width = dot.width();
    let mut rows = [std::ptr::null::<E>(); MAX_F + BLK];
    for s in s0..s1 {
        // SAFETY: the caller's contract: row `s` of every operand and of the
        // result; pair columns are inside the row (`Dot::col`); a prefetch
        // never faults.
        unsafe {
            for (r, &op) in rows.iter_mut().zip(ops) {
                *r = op.add(s * d);
            }
            // The last block's missing operands read operand 0 (their
            // products are not stored).
            let r0 = rows[0];
            rows[f..f + BLK].fill(r0);
            let mut ahead = Ahead::new(ops, s + AHEAD, s1, d, forward_blocks(f));
            let orow = out.add(s * width);
            for c in (0..d).step_by(16) {
                let m = mask(c, d);
                _mm512_mask_storeu_ps(orow.add(c), m, E::load16(rows[0].add(c), m));
            }
            for i0 in (0..f).step_by(BLK) {
                for j0 in (0..=i0).step_by(BLK) {
                    ahead.step();
                    block(&rows, (i0, j0), orow);
                }
            }
        }
    }
}

/// The register blocks of [`forward`] for `f` operands (`BLK × BLK` pairs on
/// and below the diagonal).
fn forward_blocks(f: usize) -> usize {
    let n = f.div_ceil(BLK);
    n * (n + 1) / 2
}

/// Operands and partners in one register block of [`forward`].
const BLK: usize = 4;

/// The kept pairs among operands `i0..i0 + 4` (those below `f`) and partners
/// `j0..j0 + 4` of one sample, into its result row `orow`.
///
/// # Safety
/// `rows[..f + BLK]` hold `d` f32 each; `orow` holds the sample's `width`
/// result columns; AVX-512 F and VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn block_dots<E: Elem>(
    dot: Dot,
    rows: &[*const E],
    (i0, j0): (usize, usize),
    orow: *mut f32,
) {
    let d = dot.d;
    let mut acc = [[_mm512_setzero_ps(); BLK]; BLK];
    // SAFETY: the caller's contract; the masked loads touch the live columns
    // only.
    unsafe {
        for c in (0..d).step_by(16) {
            let m = mask(c, d);
            let a: [__m512; BLK] = std::array::from_fn(|r| E::load16(rows[i0 + r].add(c), m));
            let b: [__m512; BLK] = std::array::from_fn(|q| E::load16(rows[j0 + q].add(c), m));
            for (ar, &av) in acc.iter_mut().zip(&a) {
                for (x, &bv) in ar.iter_mut().zip(&b) {
                    *x = _mm512_fmadd_ps(av, bv, *x);
                }
            }
        }
        store_block(dot, &acc, (i0, j0), orow);
    }
}

/// [`block_dots`] with `vdpbf16ps` on bf16 rows ([`forward_pairs`]): 32
/// columns a step, column pairs `2q, 2q + 1` into lane `q`.
///
/// # Safety
/// As [`block_dots`], and AVX512_BF16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn block_pairs(
    dot: Dot,
    rows: &[*const half::bf16],
    (i0, j0): (usize, usize),
    orow: *mut f32,
) {
    let d = dot.d;
    let mut acc = [[_mm512_setzero_ps(); BLK]; BLK];
    // SAFETY: the caller's contract; the masked loads touch the live columns
    // only (the others read as zeros, whose products add nothing).
    unsafe {
        for c in (0..d).step_by(32) {
            let n = (d - c).min(32);
            let m: __mmask32 = if n == 32 { !0 } else { (1u32 << n) - 1 };
            let load = |p: *const half::bf16| -> __m512bh {
                std::mem::transmute(_mm512_maskz_loadu_epi16(m, p.add(c).cast()))
            };
            let a: [__m512bh; BLK] = std::array::from_fn(|r| load(rows[i0 + r]));
            let b: [__m512bh; BLK] = std::array::from_fn(|q| load(rows[j0 + q]));
            for (ar, &av) in acc.iter_mut().zip(&a) {
                for (x, &bv) in ar.iter_mut().zip(&b) {
                    *x = _mm512_dpbf16_ps(*x, av, bv);
                }
            }
        }
        store_block(dot, &acc, (i0, j0), orow);
    }
}

/// The sums across lanes of one register block's accumulators (`acc[r][q]`:
/// operand `i0 + r` against partner `j0 + q`), stored at the kept pairs'
/// columns of `orow`.
///
/// # Safety
/// `orow` holds the sample's `width` result columns; AVX-512 F and VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl")]
#[inline]
unsafe fn store_block(
    dot: Dot,
    acc: &[[__m512; BLK]; BLK],
    (i0, j0): (usize, usize),
    orow: *mut f32,
) {
    // Lane 4r + q: the pair (i0 + r, j0 + q).
    let v = sum16(std::array::from_fn(|k| acc[k % BLK][k / BLK]));
    let blocks = [
        _mm512_castps512_ps128(v),
        _mm512_extractf32x4_ps::<1>(v),
        _mm512_extractf32x4_ps::<2>(v),
        _mm512_extractf32x4_ps::<3>(v),
    ];
    for (r, &row) in blocks.iter().enumerate() {
        let i = i0 + r;
        if i >= dot.f {
            break;
        }
        let kept = if dot.self_interaction { i + 1 } else { i };
        let n = kept.saturating_sub(j0).min(BLK);
        if n > 0 {
            // SAFETY: the caller's contract: the pair columns of row `i`
            // with partners `j0..j0 + n` lie inside the sample's row.
            unsafe { _mm_mask_storeu_ps(orow.add(dot.col(i, j0)), (1u8 << n) - 1, row) };
        }
    }
}

/// The lane sums of 16 vectors: lane `4r + q` of the result is the sum of the
/// lanes of `a[4q + r]` (a transposing tree of 256- and 128-bit block
/// shuffles, in-block shuffles and adds: 45 instructions for 16 sums).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn sum16(a: [__m512; 16]) -> __m512 {
    // s[p]: block b of a[2p]'s halves summed in blocks 0, 1 (b = 0, 1 with 2,
    // 3), a[2p + 1]'s in blocks 2, 3.
    let s: [__m512; 8] = std::array::from_fn(|p| {
        let (x, y) = (a[2 * p], a[2 * p + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x44>(x, y),
            _mm512_shuffle_f32x4::<0xEE>(x, y),
        )
    });
    // t[q]: block r holds four partial sums of a[4q + r].
    let t: [__m512; 4] = std::array::from_fn(|q| {
        let (x, y) = (s[2 * q], s[2 * q + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x88>(x, y),
            _mm512_shuffle_f32x4::<0xDD>(x, y),
        )
    });
    // u01, per block: the sums of t0's and t1's lanes 0 + 2, 0 + 2, 1 + 3,
    // 1 + 3 (alike u23 of t2, t3).
    let half =
        |x: __m512, y: __m512| _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
    let (u01, u23) = (half(t[0], t[1]), half(t[2], t[3]));
    // Per block: t0's, t1's, t2's and t3's whole sums.
    _mm512_add_ps(
        _mm512_shuffle_ps::<0b01_00_01_00>(u01, u23),
        _mm512_shuffle_ps::<0b11_10_11_10>(u01, u23),
    )
}

/// Most operands [`forward_narrow`] takes (two 16-lane vectors of partners).
const NARROW_F: usize = 32;

/// [`forward`] for operands of at most 16 columns (one `zmm` each) and at most
/// [`NARROW_F`] of them, per sample: the operands transposed in registers
/// (`Tᵀ[c]` holds column `c` of every operand, partners in lanes), then each
/// operand `i`'s dot products with all its partners at once,
/// `Σ_c T_i[c] · Tᵀ[c]` (one FMA per column, in column order, a broadcast of
/// `T_i[c]`), stored straight into the row's pairs of `i` — no sums across
/// lanes. Four operands at a time, so that their FMA chains overlap.
///
/// # Safety
/// [`forward`]'s contract; `1 <= d <= 16`, `f <= NARROW_F`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn forward_narrow<E: Elem>(dot: Dot, ops: &[*const E], out: *mut f32, s0: usize, s1: usize) {
    let Dot {
        f,
        d,
        self_interaction,
    } = dot;
    let width = dot.width();
    let md = mask(0, d);
    // Operand `i`'s first pair column, and how many partners it has.
    let first: [usize; NARROW_F] = std::array::from_fn(|i| dot.col(i, 0));
    let kept = |i: usize| if self_interaction { i + 1 } else { i };
    let start = if self_interaction { 0 } else { 1 };
    let mut rows = [std::ptr::null::<E>(); NARROW_F];
    for s in s0..s1 {
        // SAFETY: the caller's contract: row `s` of every operand and of the
        // result; loads masked to the `d` columns, stores to each operand's
        // `kept(i)` pair columns (`Dot::col`).
        unsafe {
            for (r, &op) in rows.iter_mut().zip(ops) {
                *r = op.add(s * d);
            }
            let t: [__m512; NARROW_F] = std::array::from_fn(|j| {
                if j < f {
                    E::load16(rows[j], md)
                } else {
                    _mm512_setzero_ps()
                }
            });
            let orow = out.add(s * width);
            _mm512_mask_storeu_ps(orow, md, t[0]);
            // tt[c]: column c of operands 0..16; tt[16 + c]: of 16..32.
            let mut tt = [_mm512_setzero_ps(); 32];
            tt[..16].copy_from_slice(&transpose16(t[..16].try_into().expect("16 rows")));
            if f > 16 {
                tt[16..].copy_from_slice(&transpose16(t[16..].try_into().expect("16 rows")));
            }
            for i0 in (start..f).step_by(4) {
                let n = (f - i0).min(4);
                // The group's last operand has the most partners.
                let mut acc = [[_mm512_setzero_ps(); 2]; 4];
                let a = &mut acc;
                match (n, kept(i0 + n - 1) > 16) {
                    (4, false) => narrow_rows::<E, 4, false>(&tt, &rows, i0, d, a),
                    (4, true) => narrow_rows::<E, 4, true>(&tt, &rows, i0, d, a),
                    (3, false) => narrow_rows::<E, 3, false>(&tt, &rows, i0, d, a),
                    (3, true) => narrow_rows::<E, 3, true>(&tt, &rows, i0, d, a),
                    (2, false) => narrow_rows::<E, 2, false>(&tt, &rows, i0, d, a),
                    (2, true) => narrow_rows::<E, 2, true>(&tt, &rows, i0, d, a),
                    (_, false) => narrow_rows::<E, 1, false>(&tt, &rows, i0, d, a),
                    (_, true) => narrow_rows::<E, 1, true>(&tt, &rows, i0, d, a),
                }
                for (r, [lo, hi]) in acc.iter().take(n).enumerate() {
                    let (i, k) = (i0 + r, kept(i0 + r));
                    let dst = orow.add(first[i]);
                    _mm512_mask_storeu_ps(dst, mask(0, k), *lo);
                    if k > 16 {
                        _mm512_mask_storeu_ps(dst.add(16), mask(16, k), *hi);
                    }
                }
            }
        }
    }
}

/// Operands `i0..i0 + R`'s dot products with partners `0..16` (and `16..32`
/// with `HI`) into `out[..R]`: `Σ_{c<d} T_i[c] · tt[c]` in column order, one
/// FMA per column.
///
/// # Safety
/// `rows[i0..i0 + R]` hold `d` f32; AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn narrow_rows<E: Elem, const R: usize, const HI: bool>(
    tt: &[__m512; 32],
    rows: &[*const E; NARROW_F],
    i0: usize,
    d: usize,
    out: &mut [[__m512; 2]; 4],
) {
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    for c in 0..d {
        for (r, a) in acc.iter_mut().enumerate() {
            // SAFETY: column `c < d` of operand `i0 + r`'s row.
            let b = _mm512_set1_ps(unsafe { E::get(rows[i0 + r].add(c)) });
            a[0] = _mm512_fmadd_ps(b, tt[c], a[0]);
            if HI {
                a[1] = _mm512_fmadd_ps(b, tt[16 + c], a[1]);
            }
        }
    }
    out[..R].copy_from_slice(&acc);
}

/// The transpose of 16 rows of 16 lanes: lane `j` of result `c` is lane `c`
/// of row `j` (interleaves of row pairs, then of their 64-bit pairs, then of
/// 128-bit blocks: 64 shuffles).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn transpose16(r: &[__m512; 16]) -> [__m512; 16] {
    // t[2p], t[2p + 1]: rows 2p and 2p + 1 interleaved, columns 4L + {0, 1}
    // and 4L + {2, 3} of each 128-bit block L.
    let t: [__m512; 16] = std::array::from_fn(|q| {
        let (a, b) = (r[q & !1], r[q | 1]);
        if q % 2 == 0 {
            _mm512_unpacklo_ps(a, b)
        } else {
            _mm512_unpackhi_ps(a, b)
        }
    });
    // u[4g + q]: rows 4g..4g + 4 of column 4L + q in block L.
    let u: [__m512; 16] = std::array::from_fn(|x| {
        let (g, q) = (x / 4, x % 4);
        let (a, b) = (t[4 * g + q / 2], t[4 * g + 2 + q / 2]);
        if q % 2 == 0 {
            _mm512_shuffle_ps::<0x44>(a, b)
        } else {
            _mm512_shuffle_ps::<0xEE>(a, b)
        }
    });
    // Column 4L + q gathers block L of u[q], u[4 + q], u[8 + q], u[12 + q].
    let mut out = [_mm512_setzero_ps(); 16];
    for q in 0..4 {
        let a = _mm512_shuffle_f32x4::<0x88>(u[q], u[4 + q]);
        let b = _mm512_shuffle_f32x4::<0xDD>(u[q], u[4 + q]);
        let c = _mm512_shuffle_f32x4::<0x88>(u[8 + q], u[12 + q]);
        let e = _mm512_shuffle_f32x4::<0xDD>(u[8 + q], u[12 + q]);
        out[q] = _mm512_shuffle_f32x4::<0x88>(a, c);
        out[8 + q] = _mm512_shuffle_f32x4::<0xDD>(a, c);
        out[4 + q] = _mm512_shuffle_f32x4::<0x88>(b, e);
        out[12 + q] = _mm512_shuffle_f32x4::<0xDD>(b, e);
    }
    out
}

/// Samples ahead of the one computed whose rows are prefetched.
const AHEAD: usize = 1;

/// The prefetch of a later sample's operand rows, spread over the work of
/// the current one: a few rows before each of its `steps` pieces of work
/// ([`Ahead::step`]). All 27 rows asked for at once (216 lines at dlrm-mlperf's
/// 27×128) wait for each other in the core's few miss buffers and stall the
/// loads behind them; spread, they overlap with the arithmetic
/// (`examples/interaction_best 27 128 2048`, 2026-11-29, AMD EPYC Zen 5 class,
/// 2 threads, interleaved: forward 1.14-1.15 to 0.87-0.88 ms).
struct Ahead<'a, E> {
    ops: &'a [*const E],
    /// The sample's first element in each operand, `None` past the last one.
    at: Option<usize>,
    bytes: usize,
    /// Operands asked for so far, and per step.
    next: usize,
    per: usize,
}

impl<'a, E> Ahead<'a, E> {
    /// Sample `s`'s rows of `d` elements (none if `s >= end`) over `steps`.
    fn new(ops: &'a [*const E], s: usize, end: usize, d: usize, steps: usize) -> Self {
        Ahead {
            ops,
            at: (s < end).then(|| s * d),
            bytes: d * size_of::<E>(),
            next: 0,
            per: ops.len().div_ceil(steps.max(1)),
        }
    }

    /// Asks for the next few rows (a hint: nothing is read).
    #[inline(always)]
    fn step(&mut self) {
        let Some(at) = self.at else { return };
        for &op in self.ops.iter().skip(self.next).take(self.per) {
            super::prefetch::fetch_lines(op.wrapping_add(at) as *const u8, self.bytes);
        }
        self.next += self.per;
    }
}

/// Most operands these kernels take (the row-pointer array's size).
pub const MAX_F: usize = 64;
