//! `brgemm_wgrad` on a bf16 dot-product kernel (AMX-BF16 or AVX-512 BF16, as
//! `auto` or the forced `--kernels` picks them): `x` and `dy` both bf16 (a bf16
//! plan's gradients between bf16 layers) and an activation whose derivative
//! keeps bf16 values exact (`none`; `relu`: `dz` is `dy` or 0).
//!
//! The reduction runs over the samples, so the k pairs the kernel reads are
//! pairs of samples: `A = xᵀ` is copied once per call into a blocked layout
//! `[⌈S/64⌉][Kb·bk][64]` (consecutive samples adjacent, batch-reduce blocks of
//! 64 samples, read in place by the kernels), and `B =
//! dz[nb]` (`S × bn`) is packed in sample pairs as
//! [`crate::jit::micro::avx512bf16::pack_b_pairs_into`] packs them, in one pass
//! over `dy` that applies relu's mask and sums `db` (in f32, sample order, as
//! the interpreter) on the way ([`pack_dz_pairs`]). One GEMM per N block over
//! all `Kb·bk` rows gives `dw[nb]` in its blocked layout; with enough N blocks
//! each task packs its block's `dz` just before that GEMM
//! ([`super::per_n_block`]: `examples/brgemm_best`, `DTYPE=bf16 FLUSH=1`, 2
//! interleaved rounds, AMD EPYC Zen 4, 2026-12-01: 1024→1024 10.94-11.08 to
//! 10.57-10.69 ms, 1024→512 5.69-5.76 to 5.52-5.55, 480→1024 5.65-5.67 to
//! 5.42-5.47, 512→256 level; in dlrm-mlperf bf16 training steps of a slow
//! minute the wgrad nodes 33.7-34.3 to 25.8-26.3 ms a step).
//! Taken only where `auto` (or the forced `avx512bf16` / `amxbf16`) runs such
//! a kernel (`auto`: AMX-BF16, or AVX-512 BF16 where
//! [`crate::jit::micro::probe::bf16_dot_pays`]); elsewhere the general path runs.

use super::{
    PooledBf16, check_cover, mask_into, masked, per_n_block, per_n_block_pays, positive, row_block,
    run_blocks, with_kernel,
};
use crate::jit::buffers::{Fresh, Scratch};
use crate::jit::gemm::{Elt, GemmSpec, Micro, Operand, OutBuf, pack_b_into};
use crate::jit::micro::BPacking;
use crate::jit::{Jit, JitOptions, KernelChoice};
use crate::reference::KResult;
use crate::reference::brgemm::floats;
use dlrm_ir::{Act, Data, Tensor};
use half::bf16;
use rayon::prelude::*;
use std::borrow::Cow;

/// `dz = act'(dy, y)` of the path, bf16: `dy` itself (`none`), `dy` masked by
/// a bf16 `y` on the way into the packed panels (`relu`, [`pack_dz_pairs`]),
/// or computed whole (`relu` with an f32 `y`).
pub(super) enum Dz<'t> {
    /// `dz = dy`.
    Plain(&'t [bf16]),
    /// `dz = y > 0 ? dy : 0`, `(dy, y)`.
    Relu(&'t [bf16], &'t [bf16]),
    /// `dz` computed.
    Owned(PooledBf16),
}

impl Dz<'_> {
    /// `(dy, the relu mask's y if any)`.
    fn parts(&self) -> (&[bf16], Option<&[bf16]>) {
        match self {
            Dz::Plain(d) => (d, None),
            Dz::Relu(d, y) => (d, Some(y)),
            Dz::Owned(d) => (d.values(), None),
        }
    }
}

/// The bf16 operands of the path: `dz` (`[Nb][S][bn]`, [`Dz`]) and `x`
/// (`[Kb][S][bk]`), or `None` when it does not apply (module docs).
pub(super) fn operands<'t>(
    opts: &JitOptions,
    act: Act,
    (dy, y, x): (&'t Tensor, &'t Tensor, &'t Tensor),
) -> Option<(Dz<'t>, &'t [bf16])> {
    let (Data::BF16(d), Data::BF16(xv)) = (&dy.data, &x.data) else {
        return None;
    };
    let dot = match opts.kernels {
        KernelChoice::Auto => {
            Micro::Amx.available()
                || (Micro::Bf16Dot.available() && crate::jit::micro::probe::bf16_dot_pays())
        }
        KernelChoice::Avx512Bf16 => Micro::Bf16Dot.available(),
        KernelChoice::AmxBf16 => Micro::Amx.available(),
        _ => false,
    };
    if !dot {
        return None;
    }
    let dz = match (act, &y.data) {
        (Act::None, _) => Dz::Plain(d),
        (Act::Relu, Data::BF16(yv)) if yv.len() == d.len() => Dz::Relu(d, yv),
        (Act::Relu, _) => Dz::Owned(masked(d, &floats(y), |y: f32| y > 0.0)?),
        (Act::Sigmoid, _) => return None,
    };
    Some((dz, xv.as_slice()))
}

/// Packs one N block of `dz` (`S × bn` rows of `dy`, masked by `y > 0` when
/// `y` is given) in sample pairs for the k-pair kernels, as
/// [`crate::jit::micro::avx512bf16::pack_b_pairs_into`] packs `dz` itself (`⌈bn/nr⌉` panels of `⌈S/2⌉` rows
/// of `nr` words, each two bf16 of consecutive samples, zero past `S` and
/// `bn`), and adds the block's `dz` into `db` (`bn` f32) in sample order, in
/// the same pass over `dy`.
fn pack_dz_pairs(
    dst: &mut [f32],
    db: &mut [f32],
    (dy, y): (&[bf16], Option<&[bf16]>),
    (s, bn): (usize, usize),
    nr: usize,
) {
    let k2 = s.div_ceil(2);
    // `dz` of `len <= W` elements of `dy` from `at`, as bits.
    const W: usize = 64;
    let dz = |at: usize, len: usize, out: &mut [u16; W]| {
        let d = &dy[at..at + len];
        match y {
            Some(y) => {
                for ((o, &d), &y) in out.iter_mut().zip(d).zip(&y[at..at + len]) {
                    *o = if positive(y) { d.to_bits() } else { 0 };
                }
            }
            None => {
                for (o, &d) in out.iter_mut().zip(d) {
                    *o = d.to_bits();
                }
            }
        }
    };
    let widen = |b: u16| f32::from_bits(u32::from(b) << 16);
    let (mut lo, mut hi) = ([0u16; W], [0u16; W]);
    #[cfg(target_arch = "x86_64")]
    let wide =
        std::is_x86_feature_detected!("avx512bw") && std::is_x86_feature_detected!("avx512vl");
    for (p, panel) in dst.chunks_mut(k2 * nr).enumerate() {
        let j0 = p * nr;
        let cols = nr.min(bn - j0);
        for (q, row) in panel.chunks_exact_mut(nr).enumerate() {
            let pair = 2 * q + 1 < s;
            #[cfg(target_arch = "x86_64")]
            if wide && cols == 32 && nr == 32 {
                let at = |i: usize| i * bn + j0;
                let ys = y.map(|y| {
                    (
                        &y[at(2 * q)..at(2 * q) + 32],
                        pair.then(|| &y[at(2 * q + 1)..]),
                    )
                });
                let his = pair.then(|| &dy[at(2 * q + 1)..at(2 * q + 1) + 32]);
                // SAFETY: the CPU has AVX-512 BW and VL; each slice holds the
                // 32 elements read ([`x86::pair_row32`]).
                unsafe {
                    x86::pair_row32(row, &mut db[j0..j0 + 32], (&dy[at(2 * q)..], his), ys);
                }
                continue;
            }
            for c0 in (0..cols).step_by(W) {
                let len = W.min(cols - c0);
                dz(2 * q * bn + j0 + c0, len, &mut lo);
                if pair {
                    dz((2 * q + 1) * bn + j0 + c0, len, &mut hi);
                } else {
                    hi.fill(0);
                }
                for ((w, &l), &h) in row[c0..c0 + len].iter_mut().zip(&lo).zip(&hi) {
                    *w = f32::from_bits(u32::from(l) | u32::from(h) << 16);
                }
                // `db` in sample order: each column's first sample, then its second.
                let db = &mut db[j0 + c0..j0 + c0 + len];
                for (a, &l) in db.iter_mut().zip(&lo) {
                    *a += widen(l);
                }
                if pair {
                    for (a, &h) in db.iter_mut().zip(&hi) {
                        *a += widen(h);
                    }
                }
            }
            row[cols..].fill(0.0);
        }
    }
}

/// `dw` (`[Nb][Kb·bk][bn]`, elements `dw_elt`) and `db` sums (`[Nb][bn]`) from
/// the bf16 `dz` and `x` ([`operands`]).
pub(super) fn wgrad_gemm(
    jit: &Jit,
    opts: &JitOptions,
    (dz, x): (&Dz<'_>, &[bf16]),
    (nb, kb, s, bk, bn): (usize, usize, usize, usize, usize),
    dw_elt: Elt,
) -> KResult<(crate::jit::buffers::Floats, Vec<f32>)> {
    const OP: &str = "brgemm_wgrad";
    let kp = kb * bk;
    let (dy, mask) = dz.parts();
    let xt = transpose_x(x, (kb, s, bk));
    let xt16: &[bf16] = bytemuck::cast_slice(&xt[..]);
    let base = GemmSpec::new(kp, bn, s, Elt::BF16, dw_elt).blocked_a(SB);
    let mut result = None;
    with_kernel(jit, opts, OP, (base, false, true), &mut |kern| {
        let sp = *kern.spec();
        let (mr, nr) = (sp.micro.mr(), sp.micro.nr());
        let blk_b = sp.packed_b_len();
        let mut dbp = vec![0.0f32; nb * bn];
        // N block `nbi`'s panels of `dz` into `dst`, its `db` into `db`.
        let pack = |nbi: usize, dst: &mut [f32], db: &mut [f32]| {
            let blk = nbi * s * bn..(nbi + 1) * s * bn;
            let src = (&dy[blk.clone()], mask.map(|y| &y[blk]));
            match sp.micro.b_packing() {
                BPacking::KPairs => pack_dz_pairs(dst, db, src, (s, bn), nr),
                BPacking::F32 => {
                    let dz = dz_block(db, src, bn);
                    pack_b_into(dst, &dz[..], (s, bn, bn, 1), nr);
                }
            }
        };
        if per_n_block_pays(nb) {
            let fresh = Fresh::new(dw_elt, nb * kp * bn);
            check_cover(&kern, &fresh, (nb, kp, bn))?;
            let gemm = |b: &[f32], cb: OutBuf<'_>| {
                kern.run_block(Operand::BF16(xt16), b, None, cb, kp, None)
            };
            // SAFETY: `check_cover` held: a task's one GEMM over all `Kb·bk`
            // rows writes its whole block.
            let dw = unsafe { per_n_block(fresh, blk_b, (&mut dbp, bn), &pack, &gemm)? };
            result = Some((dw, dbp));
            return Ok(());
        }
        let mut bp = Scratch::new(nb * blk_b);
        // One task per N block: its panels of `dz` and its `db`.
        bp.par_chunks_mut(blk_b)
            .zip(dbp.par_chunks_mut(bn))
            .enumerate()
            .for_each(|(nbi, (dst, db))| pack(nbi, dst, db));
        let b_of = |nbi: usize| (&bp[nbi * blk_b..(nbi + 1) * blk_b], None);
        let dw = run_blocks(
            kern,
            Fresh::new(dw_elt, nb * kp * bn),
            (nb, kp, bn, row_block(kp, mr, nb)),
            &|_, r0| Operand::BF16(&xt16[(r0 * SB).min(xt16.len())..]),
            &b_of,
            (None, None),
        )?;
        result = Some((dw, dbp));
        Ok(())
    })?;
    result.ok_or_else(|| crate::reference::shape_err(OP, "internal: no result".into()))
}

/// One N block's `dz` whole (`S × bn`, for the FMA kernels' f32 panels), with
/// its `db` summed in sample order.
fn dz_block<'a>(
    db: &mut [f32],
    (dy, y): (&'a [bf16], Option<&[bf16]>),
    bn: usize,
) -> Cow<'a, [bf16]> {
    let dz = match y {
        Some(y) => {
            let mut z = vec![bf16::ZERO; dy.len()];
            mask_into(&mut z, dy, y, positive);
            Cow::Owned(z)
        }
        None => Cow::Borrowed(dy),
    };
    for row in dz.chunks_exact(bn) {
        for (a, &z) in db.iter_mut().zip(row) {
            *a += z.to_f32();
        }
    }
    dz
}

/// Samples per block of [`transpose_x`]'s `xᵀ`: a blocked width the k-pair
/// kernels read in place with a constant row stride.
const SB: usize = 64;

/// `xᵀ` of a blocked activation `xb[Kb][S][bk]` as a blocked activation
/// itself, `[⌈S/SB⌉][Kb·bk][SB]` bf16 (in a pooled f32 buffer, two a word):
/// block `q` holds samples `q·SB..` of every row `r` (column `r % bk` of
/// block `r / bk`), zero past `S`. The GEMM reads it as the forward reads
/// its activations ([`GemmSpec::blocked_a`]), in place: a row-major `xᵀ`
/// (rows `S` long) had each micro-kernel tile copied into a staging buffer
/// for every column panel. One task per sample block.
fn transpose_x(x: &[bf16], (kb, s, bk): (usize, usize, usize)) -> Scratch {
    let kp = kb * bk;
    let blocks = s.div_ceil(SB);
    let mut xt = Scratch::new(blocks * kp * SB / 2);
    let avx2 = crate::reference::convert::has_avx2();
    xt.par_chunks_mut(kp * SB / 2)
        .enumerate()
        .for_each(|(q, words)| {
            let dst: &mut [bf16] = bytemuck::cast_slice_mut(words);
            let (s0, n) = (q * SB, SB.min(s - q * SB));
            if n < SB {
                for row in dst.chunks_exact_mut(SB) {
                    row[n..].fill(bf16::ZERO);
                }
            }
            for b in 0..kb {
                // Samples s0.. of block b: rows of bk elements.
                let src = &x[(b * s + s0) * bk..(b * s + s0 + n) * bk];
                let out = &mut dst[b * bk * SB..(b + 1) * bk * SB];
                for c0 in (0..bk).step_by(16) {
                    for i0 in (0..n).step_by(16) {
                        let (cols, rows) = (16.min(bk - c0), 16.min(n - i0));
                        if avx2 && cols == 16 && rows == 16 {
                            // SAFETY: the CPU has AVX2; the 16 source rows of
                            // 16 (samples i0.., columns c0..) and the 16
                            // destination rows of 16 (rows c0.., samples i0..)
                            // are inside `src` and `out`.
                            #[cfg(target_arch = "x86_64")]
                            unsafe {
                                x86::transpose16(
                                    src[i0 * bk + c0..].as_ptr().cast(),
                                    bk,
                                    out[c0 * SB + i0..].as_mut_ptr().cast(),
                                    SB,
                                );
                            }
                            continue;
                        }
                        for i in i0..i0 + rows {
                            for c in c0..c0 + cols {
                                out[c * SB + i] = src[i * bk + c];
                            }
                        }
                    }
                }
            }
        });
    xt
}

/// The 16 × 16 tile transposes of [`transpose_x`] in AVX2 registers, and
/// [`pack_dz_pairs`]'s rows of 32 columns in AVX-512 ones.
mod x86 {
    /// One row of 32 k-pair words of [`super::pack_dz_pairs`]: word `j` is
    /// `dz` of the pair's first sample (`lo[j]`) in its low half and of its
    /// second (`hi[j]`, zero without one) in its high half, `dz` being `dy`
    /// masked by `y > 0` ([`super::super::positive`]: bits `1..=0x7F80`)
    /// where `y` is given; `db[j]` += the first's `dz`, then the second's (f32,
    /// the scalar loop's order and values).
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW and VL; `row`, `db` and every slice given
    /// hold at least 32 elements.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn pair_row32(
        row: &mut [f32],
        db: &mut [f32],
        (lo, hi): (&[half::bf16], Option<&[half::bf16]>),
        y: Option<(&[half::bf16], Option<&[half::bf16]>)>,
    ) {
        use std::arch::x86_64::*;
        assert!(row.len() >= 32 && db.len() >= 32 && lo.len() >= 32);
        assert!(hi.is_none_or(|h| h.len() >= 32));
        assert!(y.is_none_or(|(a, b)| a.len() >= 32 && b.is_none_or(|b| b.len() >= 32)));
        // SAFETY (the loads and stores): the lengths asserted above.
        unsafe {
            let load =
                |v: &[half::bf16], h: usize| _mm256_loadu_si256(v.as_ptr().add(16 * h).cast());
            let dz = |d: __m256i, y: Option<&[half::bf16]>, h: usize| match y {
                Some(y) => {
                    let below = _mm256_sub_epi16(load(y, h), _mm256_set1_epi16(1));
                    let keep = _mm256_cmplt_epu16_mask(below, _mm256_set1_epi16(0x7F80));
                    _mm256_maskz_mov_epi16(keep, d)
                }
                None => d,
            };
            for h in 0..2 {
                let l = _mm512_cvtepu16_epi32(dz(load(lo, h), y.map(|y| y.0), h));
                let u = match hi {
                    Some(hi) => _mm512_cvtepu16_epi32(dz(load(hi, h), y.and_then(|y| y.1), h)),
                    None => _mm512_setzero_si512(),
                };
                let w = _mm512_or_si512(l, _mm512_slli_epi32::<16>(u));
                _mm512_storeu_si512(row.as_mut_ptr().add(16 * h).cast(), w);
                let acc = db.as_mut_ptr().add(16 * h);
                let mut sum = _mm512_add_ps(
                    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(l)),
                    _mm512_loadu_ps(acc),
                );
                if hi.is_some() {
                    sum = _mm512_add_ps(_mm512_castsi512_ps(_mm512_slli_epi32::<16>(u)), sum);
                }
                _mm512_storeu_ps(acc, sum);
            }
        }
    }

    /// `dst[c·dst_ld + i] = src[i·src_ld + c]` for `i, c < 16` (16-bit
    /// elements): four rounds of in-lane unpacks (16-, 32- and 64-bit), then
    /// the 128-bit lanes exchanged.
    ///
    /// # Safety
    /// The CPU has AVX2; the 16 rows of 16 elements at `src` (`src_ld` apart)
    /// are readable and those at `dst` (`dst_ld` apart) writable.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn transpose16(src: *const u16, src_ld: usize, dst: *mut u16, dst_ld: usize) {
        use std::arch::x86_64::*;
        // SAFETY (the loads and stores): the caller's contract.
        let a: [__m256i; 16] =
            std::array::from_fn(|i| unsafe { _mm256_loadu_si256(src.add(i * src_ld).cast()) });
        // Rows 2k, 2k+1 interleaved: columns 0-3 (and 8-11) from `lo`,
        // 4-7 (and 12-15) from `hi`.
        let lo: [__m256i; 8] =
            std::array::from_fn(|k| _mm256_unpacklo_epi16(a[2 * k], a[2 * k + 1]));
        let hi: [__m256i; 8] =
            std::array::from_fn(|k| _mm256_unpackhi_epi16(a[2 * k], a[2 * k + 1]));
        // Per group g of 4 rows: two columns each (c0, c0+1 and +8 in lane 1).
        let quad = |v: &[__m256i; 8], high: bool| -> [__m256i; 4] {
            std::array::from_fn(|g| {
                if high {
                    _mm256_unpackhi_epi32(v[2 * g], v[2 * g + 1])
                } else {
                    _mm256_unpacklo_epi32(v[2 * g], v[2 * g + 1])
                }
            })
        };
        let sets = [
            (quad(&lo, false), 0),
            (quad(&lo, true), 2),
            (quad(&hi, false), 4),
            (quad(&hi, true), 6),
        ];
        for (q, c0) in sets {
            // Column c0 (+1 from the high halves) of rows 0-7 and of rows 8-15.
            let cols = [
                (
                    _mm256_unpacklo_epi64(q[0], q[1]),
                    _mm256_unpacklo_epi64(q[2], q[3]),
                    c0,
                ),
                (
                    _mm256_unpackhi_epi64(q[0], q[1]),
                    _mm256_unpackhi_epi64(q[2], q[3]),
                    c0 + 1,
                ),
            ];
            for (top, bottom, c) in cols {
                let first = _mm256_permute2x128_si256::<0x20>(top, bottom);
                let second = _mm256_permute2x128_si256::<0x31>(top, bottom);
                unsafe {
                    _mm256_storeu_si256(dst.add(c * dst_ld).cast(), first);
                    _mm256_storeu_si256(dst.add((c + 8) * dst_ld).cast(), second);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{dz_block, pack_dz_pairs};
    use crate::jit::brgemm::positive;
    use crate::jit::micro::avx512bf16::pack_b_pairs_into;
    use half::bf16;

    /// bf16 values with the cases relu's mask tells apart: ±0, ±inf, NaN,
    /// subnormals, negatives and positives.
    fn values(seed: u64, n: usize) -> Vec<bf16> {
        let special = [
            0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC1, 0x0001, 0x8001, 0x3F80, 0xBF80,
        ];
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let bits = if x.is_multiple_of(5) {
                    special[(x >> 8) as usize % special.len()]
                } else {
                    (x >> 16) as u16 & 0xBFFF // finite
                };
                bf16::from_bits(bits)
            })
            .collect()
    }

    #[test]
    fn transpose_x_is_the_transpose() {
        use super::SB;
        // Widths of whole and ragged 16-element tiles; sample counts of
        // whole, ragged and partial blocks of SB.
        for (kb, s, bk) in [
            (2, 37, 64),
            (3, 16, 32),
            (2, 5, 20),
            (4, 33, 8),
            (1, 1, 3),
            (2, 128, 16),
            (1, 150, 48),
        ] {
            let x = values(kb as u64 * 31 + s as u64, kb * s * bk);
            let xt = super::transpose_x(&x, (kb, s, bk));
            let xt: &[bf16] = bytemuck::cast_slice(&xt[..]);
            let (kp, blocks) = (kb * bk, s.div_ceil(SB));
            assert_eq!(xt.len(), blocks * kp * SB, "kb {kb} s {s} bk {bk}");
            for r in 0..kp {
                for si in 0..blocks * SB {
                    let want = if si < s {
                        x[(r / bk) * s * bk + si * bk + r % bk].to_bits()
                    } else {
                        0
                    };
                    assert_eq!(
                        xt[((si / SB) * kp + r) * SB + si % SB].to_bits(),
                        want,
                        "bk {bk} s {s}: row {r} sample {si}"
                    );
                }
            }
        }
    }

    #[test]
    fn pack_dz_pairs_is_the_masked_pair_packing_and_its_db() {
        for (case, (s, bn, nr)) in [
            (1, 1, 32),
            (2, 5, 32),
            (7, 32, 32),
            (8, 64, 32),
            (33, 70, 32),
            (64, 96, 16),
            (101, 31, 16),
        ]
        .into_iter()
        .enumerate()
        {
            for relu in [false, true] {
                let seed = case as u64 * 2 + u64::from(relu);
                let (dy, y) = (values(seed, s * bn), values(seed + 100, s * bn));
                let mask = relu.then_some(&y[..]);
                let len = bn.div_ceil(nr) * s.div_ceil(2) * nr;
                let (mut got, mut db) = (vec![f32::NAN; len], vec![0.0f32; bn]);
                pack_dz_pairs(&mut got, &mut db, (&dy, mask), (s, bn), nr);
                // The reference: dz whole, then packed, db summed in sample order.
                let dz: Vec<bf16> = match mask {
                    Some(y) => dy
                        .iter()
                        .zip(y)
                        .map(|(&d, &y)| if y.to_f32() > 0.0 { d } else { bf16::ZERO })
                        .collect(),
                    None => dy.clone(),
                };
                let mut want = vec![f32::NAN; len];
                pack_b_pairs_into(&mut want, &dz, (s, bn, bn, 1), nr);
                let mut db_want = vec![0.0f32; bn];
                for row in dz.chunks_exact(bn) {
                    for (a, &z) in db_want.iter_mut().zip(row) {
                        *a += z.to_f32();
                    }
                }
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "panels: s {s} bn {bn} nr {nr} relu {relu}"
                );
                // The sums' bits, any NaN as one: which NaN a sum of NaN
                // operands gives (sign, payload) depends on the operands'
                // order in the add instruction, which Rust leaves to the
                // compiler (the scalar and the AVX-512 loops differ there).
                let sums = |v: &[f32]| {
                    v.iter()
                        .map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() })
                        .collect::<Vec<_>>()
                };
                assert_eq!(
                    sums(&db),
                    sums(&db_want),
                    "db: s {s} bn {bn} nr {nr} relu {relu}"
                );
                let mut db_block = vec![0.0f32; bn];
                let whole = dz_block(&mut db_block, (&dy, mask), bn);
                let raw = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(raw(&whole), raw(&dz), "dz_block: s {s} bn {bn}");
                assert_eq!(sums(&db_block), sums(&db_want), "dz_block's db");
            }
        }
        for b in 0..=u16::MAX {
            let y = bf16::from_bits(b);
            assert_eq!(positive(y), y.to_f32() > 0.0, "bits {b:#06x}");
        }
    }
}
