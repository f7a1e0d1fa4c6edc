//! Packing a blocked activation's rows into the micro-kernels' `A` tiles (the
//! row-chunk form of `brgemm` and `brgemm_dgrad`, [`super::brgemm`]), and the
//! blocked weights' transpose into `brgemm_dgrad`'s `B` panels (`pack_wt`).
//!
//! The source is a blocked operand `[Kb][S][w]` read as the batch-reduce `A`
//! (`k = Kb·w`, element `(row, q·w + j)` at `(q·S + row)·w + j`): `x` itself, or
//! `dz = act'(dy, y)` computed on the way. The packed rows are tile-major f32
//! panels `[tile][k][mr]`, rows past the chunk zero — a transpose of each
//! `mr`-row tile. On CPUs with AVX-512 an f32 source is transposed 16 columns
//! at a time in registers (the scalar loop it replaces took ~16% of a
//! 2048×512×512 `brgemm`), a bf16 source widened on the way (the scalar loop
//! was 11% of a bf16 dlrm-mlperf inference step under the FMA kernels);
//! otherwise a scalar loop. Both compute every element exactly as
//! [`crate::reference::brgemm::act_grad`] does, so the results are bitwise equal.

use crate::reference::brgemm::act_grad;
use dlrm_ir::Act;
use half::bf16;

/// What the packed elements are.
#[derive(Clone, Copy)]
pub(crate) enum Src<'a> {
    /// The elements themselves (f32).
    F32(&'a [f32]),
    /// The elements widened (bf16).
    BF16(&'a [bf16]),
    /// `act'(dy, y)` of the same-shaped `dy` and `y`.
    Dz(Act, &'a [f32], &'a [f32]),
}

impl Src<'_> {
    fn len(&self) -> usize {
        match self {
            Src::F32(v) => v.len(),
            Src::BF16(v) => v.len(),
            Src::Dz(_, d, y) => d.len().min(y.len()),
        }
    }
}

/// Packs rows `r0..r0+rows` of the blocked `src` (`[Kb][s][w]`) into `dst`
/// (`⌈rows/mr⌉` tiles `[k][mr]`, every element written): the first `k`
/// columns, `Kb = ⌈k/w⌉` (the last block's first `k - (Kb-1)·w`, the GEMM
/// stopping before its zero tail). Panics if `src` is shorter than `Kb·s·w`
/// or the chunk's rows pass `s` (the callers' shapes are checked before).
pub(crate) fn pack_blocked(
    dst: &mut [f32],
    (s, w, mr): (usize, usize, usize),
    (r0, rows): (usize, usize),
    src: Src<'_>,
) {
    let tiles = rows.div_ceil(mr.max(1));
    if tiles == 0 || w == 0 {
        dst.fill(0.0);
        return;
    }
    let k = dst.len() / tiles / mr;
    let blocks = k.div_ceil(w);
    assert!(
        dst.len() == tiles * mr * k && r0 + rows <= s && src.len() >= blocks * s * w,
        "pack_blocked: {} rows from {r0} of [{blocks}][{s}][{w}] into {} floats",
        rows,
        dst.len()
    );
    #[cfg(target_arch = "x86_64")]
    if mr <= 16
        && std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("avx512bw")
        && std::is_x86_feature_detected!("avx512vl")
    {
        // SAFETY: the CPU has AVX-512 F, BW and VL; the sizes were checked above.
        unsafe { transpose_tiles(dst, (s, w, mr, k), (r0, rows), src) };
        return;
    }
    scalar_tiles(dst, (s, w, mr, k), (r0, rows), src);
}

/// [`pack_blocked`] element by element (the shapes checked by it).
fn scalar_tiles(
    dst: &mut [f32],
    (s, w, mr, k): (usize, usize, usize, usize),
    (r0, rows): (usize, usize),
    src: Src<'_>,
) {
    let blocks = k.div_ceil(w);
    let at = |i: usize| match src {
        Src::F32(v) => v[i],
        Src::BF16(v) => v[i].to_f32(),
        Src::Dz(act, d, y) => act_grad(act, d[i], y[i]),
    };
    for (t, tile) in dst.chunks_exact_mut(k * mr).enumerate() {
        for r in 0..mr {
            if t * mr + r >= rows {
                tile.iter_mut().skip(r).step_by(mr).for_each(|d| *d = 0.0);
                continue;
            }
            let row = r0 + t * mr + r;
            for q in 0..blocks {
                let from = (q * s + row) * w;
                let wq = w.min(k - q * w);
                let seg = &mut tile[q * w * mr..(q * w + wq) * mr];
                for (j, d) in seg.iter_mut().skip(r).step_by(mr).enumerate() {
                    *d = at(from + j);
                }
            }
        }
    }
}

/// [`pack_blocked`] with AVX-512: per tile, block `q` and 16 columns `j..`, the
/// tile's live rows (`w` apart; the rest zero) are loaded as 16 vectors —
/// bf16 widened, `act'` applied lane-wise for `dz` — transposed in registers, and each column
/// stored as the `mr` floats of its k step. (Gathering the column directly
/// measured no faster than the scalar loop: gathers are slow on this CPU.)
///
/// # Safety
/// AVX-512 F, BW and VL are available; `mr <= 16`; `dst` is `⌈rows/mr⌉·mr·k` floats with
/// `Kb = ⌈k/w⌉`; `r0 + rows <= s`; `src` holds `Kb·s·w` elements.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn transpose_tiles(
    dst: &mut [f32],
    (s, w, mr, k): (usize, usize, usize, usize),
    (r0, rows): (usize, usize),
    src: Src<'_>,
) {
    use crate::jit::native_dot::Elem;
    use std::arch::x86_64::*;
    let blocks = k.div_ceil(w);
    let store: __mmask16 = ((1u32 << mr) - 1) as u16;
    let zero = _mm512_setzero_ps();
    let esize = match src {
        Src::BF16(_) => 2,
        _ => 4,
    };
    for (t, tile) in dst.chunks_exact_mut(k * mr).enumerate() {
        let live = mr.min(rows - t * mr);
        let out = tile.as_mut_ptr();
        // The next tile's rows of every block, while this one's are packed
        // (a hint: it never faults, so it may run past the chunk's rows). The
        // loads waited on memory: 2.5-3.1% of a dlrm-mlperf training step's
        // samples were this function, 1.7-2.5% with the hint.
        let next = mr.min(rows.saturating_sub((t + 1) * mr));
        for q in 0..blocks {
            let base = (q * s + r0 + t * mr) * w;
            prefetch_rows(&src, (base + mr * w) * esize, next * w * esize);
            // The last block may end before its `w` columns (`k`).
            let wq = w.min(k - q * w);
            for j in (0..wq).step_by(16) {
                let cols = 16.min(wq - j);
                let m: __mmask16 = ((1u32 << cols) - 1) as u16;
                let mut r = [zero; 16];
                for (i, ri) in r.iter_mut().enumerate().take(live) {
                    let at = base + i * w + j;
                    // SAFETY: lanes < cols read elements at..at+cols of row
                    // (q·s + row)·w + j.., row < r0 + rows <= s, j + cols <= wq <= w:
                    // inside `src` (the caller's contract); masked lanes read
                    // nothing.
                    *ri = unsafe {
                        let load = |v: &[f32]| _mm512_maskz_loadu_ps(m, v.as_ptr().add(at));
                        match src {
                            Src::F32(v) => load(v),
                            Src::Dz(Act::None, d, _) => load(d),
                            Src::Dz(Act::Relu, d, y) => {
                                let pos = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(load(y), zero);
                                _mm512_maskz_mov_ps(pos, load(d))
                            }
                            Src::Dz(Act::Sigmoid, d, y) => {
                                let yv = load(y);
                                let one_minus = _mm512_sub_ps(_mm512_set1_ps(1.0), yv);
                                _mm512_mul_ps(_mm512_mul_ps(load(d), yv), one_minus)
                            }
                            // Widened exactly, as the interaction kernels load.
                            Src::BF16(v) => <half::bf16 as Elem>::load16(v.as_ptr().add(at), m),
                        }
                    };
                }
                let c = transpose16(r);
                for (cc, col) in c.iter().enumerate().take(cols) {
                    // SAFETY: k step q·w + j + cc < k: its `mr` floats lie in
                    // this tile (`k·mr` floats).
                    unsafe { _mm512_mask_storeu_ps(out.add((q * w + j + cc) * mr), store, *col) };
                }
            }
        }
    }
}

/// Prefetches `len` bytes of `src`'s operand(s) from byte `at` into L1, one
/// hint a line (a hint: reads nothing, never faults).
#[cfg(target_arch = "x86_64")]
#[inline]
fn prefetch_rows(src: &Src<'_>, at: usize, len: usize) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    let line = |p: *const u8| {
        let mut off = 0;
        while off < len {
            // SAFETY: a prefetch hint reads nothing and never faults.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(at + off).cast()) };
            off += 64;
        }
    };
    match *src {
        Src::F32(v) => line(v.as_ptr().cast()),
        Src::BF16(v) => line(v.as_ptr().cast()),
        Src::Dz(act, d, y) => {
            line(d.as_ptr().cast());
            if act != Act::None {
                line(y.as_ptr().cast());
            }
        }
    }
}

/// One panel of `wᵀ` for `brgemm_dgrad`'s `B`: from the blocked weights
/// `w` (`[Nb][Kb][bk][bn]`, `Src::F32` or `Src::BF16`), the `Nb·bn` rows of
/// `nr` floats whose column `j < cols` is `w[n/bn][kbi][i0 + j][n % bn]` for
/// row `n`; columns `cols..nr` zero. On AVX-512 CPUs each 16×16 sub-block is
/// transposed in registers (bf16 widened on the way); the scalar loop it
/// replaces was 3.7% of a 2048×1024×1024 `brgemm_dgrad`. Both give the same
/// bits.
pub(crate) fn pack_wt(
    pan: &mut [f32],
    w: Src<'_>,
    (nb, kb, bk, bn): (usize, usize, usize, usize),
    (kbi, i0, nr): (usize, usize, usize),
) {
    let cols = nr.min(bk.saturating_sub(i0));
    assert!(
        pan.len() == nb * bn * nr && kbi < kb && w.len() >= nb * kb * bk * bn,
        "pack_wt: a panel of {} floats for {nb}×{bn} rows of {nr} from [{nb}][{kb}][{bk}][{bn}]",
        pan.len()
    );
    if cols < nr {
        pan.fill(0.0);
    }
    if cols == 0 || matches!(w, Src::Dz(..)) {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("avx512bw")
        && std::is_x86_feature_detected!("avx512vl")
    {
        // SAFETY: the CPU has AVX-512 F, BW and VL; the sizes were checked above.
        unsafe { transpose_wt(pan, w, (nb, kb, bk, bn), (kbi, i0, nr, cols)) };
        return;
    }
    scalar_wt(pan, w, (nb, kb, bk, bn), (kbi, i0, nr, cols));
}

/// [`pack_wt`] element by element (the shapes checked by it).
fn scalar_wt(
    pan: &mut [f32],
    w: Src<'_>,
    (nb, kb, bk, bn): (usize, usize, usize, usize),
    (kbi, i0, nr, cols): (usize, usize, usize, usize),
) {
    let at = |i: usize| match w {
        Src::F32(v) => v[i],
        Src::BF16(v) => v[i].to_f32(),
        Src::Dz(..) => 0.0,
    };
    for nbi in 0..nb {
        let blk = (nbi * kb + kbi) * bk * bn;
        let dst = &mut pan[nbi * bn * nr..(nbi + 1) * bn * nr];
        for ii in 0..cols {
            let from = blk + (i0 + ii) * bn;
            for (n, d) in dst[ii..].iter_mut().step_by(nr).take(bn).enumerate() {
                *d = at(from + n);
            }
        }
    }
}

/// [`pack_wt`] with AVX-512: per N block, 16 rows `i` (the panel's columns)
/// by 16 columns `n` loaded (masked), transposed, each `n` stored as its row
/// of the panel.
///
/// # Safety
/// AVX-512 F, BW and VL are available; `pan` is `Nb·bn·nr` floats, `w` holds
/// `Nb·Kb·bk·bn` elements, `kbi < Kb`, `cols <= nr` and `i0 + cols <= bk`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn transpose_wt(
    pan: &mut [f32],
    w: Src<'_>,
    (nb, kb, bk, bn): (usize, usize, usize, usize),
    (kbi, i0, nr, cols): (usize, usize, usize, usize),
) {
    use crate::jit::native_dot::Elem;
    use std::arch::x86_64::*;
    let zero = _mm512_setzero_ps();
    let out = pan.as_mut_ptr();
    for nbi in 0..nb {
        let blk = (nbi * kb + kbi) * bk * bn;
        for n0 in (0..bn).step_by(16) {
            let ns = 16.min(bn - n0);
            let m: __mmask16 = ((1u32 << ns) - 1) as u16;
            for j0 in (0..cols).step_by(16) {
                let js = 16.min(cols - j0);
                let mut r = [zero; 16];
                for (jj, rj) in r.iter_mut().enumerate().take(js) {
                    let at = blk + (i0 + j0 + jj) * bn + n0;
                    // SAFETY: lanes < ns read elements at..at+ns of row
                    // i0 + j0 + jj < bk of block (nbi, kbi): inside `w`;
                    // masked lanes read nothing.
                    *rj = unsafe {
                        match w {
                            Src::F32(v) => _mm512_maskz_loadu_ps(m, v.as_ptr().add(at)),
                            Src::BF16(v) => <half::bf16 as Elem>::load16(v.as_ptr().add(at), m),
                            Src::Dz(..) => zero,
                        }
                    };
                }
                let c = transpose16(r);
                let store: __mmask16 = ((1u32 << js) - 1) as u16;
                for (nn, col) in c.iter().enumerate().take(ns) {
                    // SAFETY: row nbi·bn + n0 + nn < Nb·bn of the panel, its
                    // columns j0..j0 + js <= cols <= nr.
                    unsafe {
                        let at = (nbi * bn + n0 + nn) * nr + j0;
                        _mm512_mask_storeu_ps(out.add(at), store, *col);
                    }
                }
            }
        }
    }
}

/// The 16×16 transpose of `r` (row `i` lane `c` becomes row `c` lane `i`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn transpose16(r: [std::arch::x86_64::__m512; 16]) -> [std::arch::x86_64::__m512; 16] {
    use std::arch::x86_64::*;
    // Pairs of rows interleaved, then quads: u[4g + c] holds column c (and c+4,
    // c+8, c+12, one per 128-bit lane) of rows 4g..4g+4.
    let mut u = [_mm512_setzero_ps(); 16];
    for g in 0..4 {
        let [a, b, c, d] = [r[4 * g], r[4 * g + 1], r[4 * g + 2], r[4 * g + 3]];
        let (t0, t1) = (_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
        let (t2, t3) = (_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
        u[4 * g] = _mm512_shuffle_ps::<0x44>(t0, t2);
        u[4 * g + 1] = _mm512_shuffle_ps::<0xEE>(t0, t2);
        u[4 * g + 2] = _mm512_shuffle_ps::<0x44>(t1, t3);
        u[4 * g + 3] = _mm512_shuffle_ps::<0xEE>(t1, t3);
    }
    // 128-bit lanes: v[c] (c < 4) = lanes 0, 2 of u[c] and u[4 + c]; v[4 + c]
    // lanes 1, 3; likewise v[8..16] from u[8..16].
    let mut v = [_mm512_setzero_ps(); 16];
    for h in [0, 8] {
        for c in 0..4 {
            v[h + c] = _mm512_shuffle_f32x4::<0x88>(u[h + c], u[h + 4 + c]);
            v[h + 4 + c] = _mm512_shuffle_f32x4::<0xDD>(u[h + c], u[h + 4 + c]);
        }
    }
    // Column c: c < 4 from v[c], v[8 + c] (lanes 0, 2); 8 + c lanes 1, 3; 4 + c
    // and 12 + c likewise from v[4 + c], v[12 + c].
    let mut out = [_mm512_setzero_ps(); 16];
    for c in 0..4 {
        out[c] = _mm512_shuffle_f32x4::<0x88>(v[c], v[8 + c]);
        out[8 + c] = _mm512_shuffle_f32x4::<0xDD>(v[c], v[8 + c]);
        out[4 + c] = _mm512_shuffle_f32x4::<0x88>(v[4 + c], v[12 + c]);
        out[12 + c] = _mm512_shuffle_f32x4::<0xDD>(v[4 + c], v[12 + c]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `wᵀ`'s panels (transposed in registers on AVX-512 CPUs) are bitwise
    /// the scalar packing's, f32 and bf16, on ragged blocks and panels.
    #[test]
    fn wt_panels_are_bitwise_the_scalar_packing() {
        for (nb, kb, bk, bn) in [(2, 3, 5, 7), (1, 2, 64, 64), (3, 1, 50, 17), (2, 2, 33, 40)] {
            let n = nb * kb * bk * bn;
            let v: Vec<f32> = (0..n)
                .map(|i| match (i * 11) % 29 {
                    0 => f32::NAN,
                    1 => -0.0,
                    x => (x as f32 - 14.0) / 7.0,
                })
                .collect();
            let b: Vec<bf16> = v.iter().map(|&x| bf16::from_f32(x)).collect();
            for nr in [16, 32] {
                for kbi in 0..kb {
                    for i0 in (0..bk).step_by(nr) {
                        for src in [Src::F32(&v), Src::BF16(&b)] {
                            let mut got = vec![f32::INFINITY; nb * bn * nr];
                            let mut want = got.clone();
                            pack_wt(&mut got, src, (nb, kb, bk, bn), (kbi, i0, nr));
                            let cols = nr.min(bk - i0);
                            want.fill(0.0);
                            scalar_wt(&mut want, src, (nb, kb, bk, bn), (kbi, i0, nr, cols));
                            // The definition, element by element.
                            for (row, r) in want.chunks(nr).enumerate() {
                                let (nbi, nn) = (row / bn, row % bn);
                                for (j, x) in r.iter().enumerate() {
                                    let e = if j < cols {
                                        let at = ((nbi * kb + kbi) * bk + i0 + j) * bn + nn;
                                        match src {
                                            Src::BF16(b) => b[at].to_f32(),
                                            _ => v[at],
                                        }
                                    } else {
                                        0.0
                                    };
                                    assert_eq!(x.to_bits(), e.to_bits(), "row {row} col {j}");
                                }
                            }
                            let bits =
                                |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                            assert_eq!(bits(&got), bits(&want), "{nb} {kb} {bk} {bn} nr {nr}");
                        }
                    }
                }
            }
        }
    }

    /// The packing (gathered on AVX-512 CPUs) is bitwise the scalar one, on
    /// ragged chunks, every tile height and every source, NaN and ±0 included.
    #[test]
    fn packing_is_bitwise_the_scalar_packing() {
        let (blocks, s) = (3, 29);
        for w in [1, 5, 16, 17] {
            let n = blocks * s * w;
            let vals = |seed: usize| -> Vec<f32> {
                (0..n)
                    .map(|i| match (i * 7 + seed) % 23 {
                        0 => f32::NAN,
                        1 => -0.0,
                        2 => 0.0,
                        v => (v as f32 - 11.0) / 3.0,
                    })
                    .collect()
            };
            let (d, y) = (vals(1), vals(5));
            let b: Vec<bf16> = d.iter().map(|&v| bf16::from_f32(v)).collect();
            let srcs = [
                Src::F32(&d),
                Src::BF16(&b),
                Src::Dz(Act::None, &d, &y),
                Src::Dz(Act::Relu, &d, &y),
                Src::Dz(Act::Sigmoid, &d, &y),
            ];
            // Whole blocks, and the last one cut short (the GEMM stopping
            // before a zero tail).
            let ks = [blocks * w, (blocks - 1) * w + w.div_ceil(2)];
            for (mr, k) in [1, 4, 6, 12, 16]
                .into_iter()
                .flat_map(|m| ks.map(|k| (m, k)))
            {
                for (r0, rows) in [(0, s), (3, 13), (28, 1), (12, 12)] {
                    for src in srcs {
                        let len = rows.div_ceil(mr) * mr * k;
                        let mut got = vec![f32::INFINITY; len];
                        let mut want = vec![f32::INFINITY; len];
                        pack_blocked(&mut got, (s, w, mr), (r0, rows), src);
                        scalar_tiles(&mut want, (s, w, mr, k), (r0, rows), src);
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        let what = format!("w {w} k {k} mr {mr} rows {r0}+{rows}");
                        assert_eq!(bits(&got), bits(&want), "{what}");
                        // The definition: tile t's k step kk, row r.
                        let x = |i: usize| match src {
                            Src::F32(v) => v[i],
                            Src::BF16(v) => v[i].to_f32(),
                            Src::Dz(act, d, y) => act_grad(act, d[i], y[i]),
                        };
                        for (i, g) in got.iter().enumerate() {
                            let (t, kk, r) = (i / (k * mr), i / mr % k, i % mr);
                            let row = t * mr + r;
                            let e = match row < rows {
                                true => x((kk / w * s + r0 + row) * w + kk % w),
                                false => 0.0,
                            };
                            assert_eq!(g.to_bits(), e.to_bits(), "{what}: element {i}");
                        }
                    }
                }
            }
        }
    }
}
