//! Packing a blocked activation's rows into the micro-kernels' `A` tiles (the
//! row-chunk form of `brgemm` and `brgemm_dgrad`, [`super::brgemm`]).
//!
//! The source is a blocked operand `[Kb][S][w]` read as the batch-reduce `A`
//! (`k = Kb·w`, element `(row, q·w + j)` at `(q·S + row)·w + j`): `x` itself, or
//! `dz = act'(dy, y)` computed on the way. The packed rows are tile-major f32
//! panels `[tile][k][mr]`, rows past the chunk zero — a transpose of each
//! `mr`-row tile. On CPUs with AVX-512 an f32 source is gathered `mr` rows at a
//! time (one masked gather and one masked store per k step; the scalar
//! transpose it replaces took ~16% of a 2048×512×512 `brgemm`); otherwise, and
//! for bf16 sources, a scalar loop. Both compute every element exactly as
//! [`crate::kernels::brgemm::act_grad`] does, so the results are bitwise equal.

use crate::kernels::brgemm::act_grad;
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
/// (`⌈rows/mr⌉` tiles `[k][mr]`, every element written). Panics if `src` is
/// shorter than `Kb·s·w` or the chunk's rows pass `s` (the callers' shapes
/// are checked before).
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
    let blocks = k / w;
    assert!(
        dst.len() == tiles * mr * k
            && k == blocks * w
            && r0 + rows <= s
            && src.len() >= blocks * s * w,
        "pack_blocked: {} rows from {r0} of [{blocks}][{s}][{w}] into {} floats",
        rows,
        dst.len()
    );
    #[cfg(target_arch = "x86_64")]
    if mr <= 16
        && !matches!(src, Src::BF16(_))
        && blocks * s * w <= i32::MAX as usize
        && std::is_x86_feature_detected!("avx512f")
    {
        // SAFETY: the CPU has AVX-512F; the sizes were checked above.
        unsafe { gather_tiles(dst, (s, w, mr, k), (r0, rows), src) };
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
    let blocks = k / w;
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
                let seg = &mut tile[q * w * mr..(q + 1) * w * mr];
                for (j, d) in seg.iter_mut().skip(r).step_by(mr).enumerate() {
                    *d = at(from + j);
                }
            }
        }
    }
}

/// [`pack_blocked`] with AVX-512 gathers: per tile, block `q` and column `j`,
/// the tile's live rows (`w` apart) in one masked gather (dead lanes zero),
/// stored as the `mr` floats of k step `q·w + j`.
///
/// # Safety
/// AVX-512F is available; `mr <= 16`; `dst` is `⌈rows/mr⌉·mr·k` floats with
/// `k = Kb·w`; `r0 + rows <= s`; `src` holds `Kb·s·w <= i32::MAX` elements
/// (every gathered index, `(q·s + row)·w + j`, is below that).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn gather_tiles(
    dst: &mut [f32],
    (s, w, mr, k): (usize, usize, usize, usize),
    (r0, rows): (usize, usize),
    src: Src<'_>,
) {
    use std::arch::x86_64::*;
    let blocks = k / w;
    let lanes: [i32; 16] = std::array::from_fn(|r| if r < mr { (r * w) as i32 } else { 0 });
    // SAFETY: reads the 16 i32 of `lanes`.
    let vindex = unsafe { _mm512_loadu_si512(lanes.as_ptr().cast()) };
    let store: __mmask16 = ((1u32 << mr) - 1) as u16;
    let zero = _mm512_setzero_ps();
    for (t, tile) in dst.chunks_exact_mut(k * mr).enumerate() {
        let live = mr.min(rows - t * mr);
        let m: __mmask16 = ((1u32 << live) - 1) as u16;
        let out = tile.as_mut_ptr();
        for q in 0..blocks {
            let base = (q * s + r0 + t * mr) * w;
            for j in 0..w {
                // SAFETY: lane r < live reads element base + r·w + j =
                // (q·s + row)·w + j with row < r0 + rows <= s, j < w: inside
                // `src` (the caller's contract); masked-off lanes read nothing.
                // The store writes floats (q·w + j)·mr .. +mr of this tile.
                unsafe {
                    let gather = |v: &[f32]| {
                        _mm512_mask_i32gather_ps::<4>(
                            zero,
                            m,
                            vindex,
                            v.as_ptr().add(base + j).cast(),
                        )
                    };
                    let v = match src {
                        Src::F32(v) => gather(v),
                        Src::Dz(act, d, y) => {
                            let dv = gather(d);
                            match act {
                                Act::None => dv,
                                Act::Relu => {
                                    let yv = gather(y);
                                    let pos = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(yv, zero);
                                    _mm512_maskz_mov_ps(pos, dv)
                                }
                                Act::Sigmoid => {
                                    let yv = gather(y);
                                    let one_minus = _mm512_sub_ps(_mm512_set1_ps(1.0), yv);
                                    _mm512_mul_ps(_mm512_mul_ps(dv, yv), one_minus)
                                }
                            }
                        }
                        Src::BF16(_) => zero,
                    };
                    _mm512_mask_storeu_ps(out.add((q * w + j) * mr), store, v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            for mr in [1, 4, 6, 12, 16] {
                for (r0, rows) in [(0, s), (3, 13), (28, 1), (12, 12)] {
                    for src in srcs {
                        let len = rows.div_ceil(mr) * mr * blocks * w;
                        let mut got = vec![f32::INFINITY; len];
                        let mut want = vec![f32::INFINITY; len];
                        pack_blocked(&mut got, (s, w, mr), (r0, rows), src);
                        scalar_tiles(&mut want, (s, w, mr, blocks * w), (r0, rows), src);
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&got), bits(&want), "w {w} mr {mr} rows {r0}+{rows}");
                    }
                }
            }
        }
    }
}
