//! The forward for narrow operands ([`forward_narrow`]): at most 16 columns,
//! the operands transposed in registers.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use super::{Dot, Elem, mask};

/// Most operands [`forward_narrow`] takes (two 16-lane vectors of partners).
pub(super) const NARROW_F: usize = 32;

/// [`forward`](super::forward()) for operands of at most 16 columns (one `zmm` each) and at most
/// [`NARROW_F`] of them, per sample: the operands transposed in registers
/// (`Tᵀ[c]` holds column `c` of every operand, partners in lanes), then each
/// operand `i`'s dot products with all its partners at once,
/// `Σ_c T_i[c] · Tᵀ[c]` (one FMA per column, in column order, a broadcast of
/// `T_i[c]`), stored straight into the row's pairs of `i` — no sums across
/// lanes. Four operands at a time, so that their FMA chains overlap.
///
/// # Safety
/// [`forward`](super::forward())'s contract; `1 <= d <= 16`, `f <= NARROW_F`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn forward_narrow<E: Elem>(
    dot: Dot,
    ops: &[*const E],
    out: *mut f32,
    s0: usize,
    s1: usize,
) {
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
    // The operands' rows widened to f32, for elements narrower than f32.
    // (Written and read through one pointer: `wide_rows` derive from it.)
    let mut wide = [[0.0f32; 16]; NARROW_F];
    let wp: *mut [f32; 16] = wide.as_mut_ptr();
    let wide_rows: [*const f32; NARROW_F] =
        std::array::from_fn(|j| wp.wrapping_add(j).cast::<f32>().cast_const());
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
            let narrower = size_of::<E>() < size_of::<f32>();
            if narrower {
                // Narrower elements: the widened rows, staged once per
                // sample, so each broadcast is one f32 load (a bf16
                // broadcast took a scalar load, shift and move per column:
                // the bf16 dlrm-kaggle forward ran 1.6-1.7x the f32 one's
                // time). Once a sample, not once a group of operands: the
                // bf16 dlrm-kaggle forward in a `--bench` inference step
                // 0.58-0.70 to 0.50-0.56 ms (Intel Xeon model 207,
                // interleaved).
                for (j, &tj) in t.iter().enumerate().take(f) {
                    _mm512_storeu_ps(wp.add(j).cast(), tj);
                }
            }
            for i0 in (start..f).step_by(4) {
                let n = (f - i0).min(4);
                // The group's last operand has the most partners.
                let mut acc = [[_mm512_setzero_ps(); 2]; 4];
                let hi = kept(i0 + n - 1) > 16;
                if narrower {
                    group(n, hi, (&tt, &wide_rows), i0, d, &mut acc);
                } else {
                    group(n, hi, (&tt, &rows), i0, d, &mut acc);
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

/// Operands `i0..i0 + n` (`n` of 1..=4)'s dot products with partners `0..16`
/// (and `16..32` with `hi`) into `out[..n]`: [`narrow_rows`] for that group.
///
/// # Safety
/// `rows[i0..i0 + n]` hold `d` elements; AVX-512 F, BW and VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn group<E: Elem>(
    n: usize,
    hi: bool,
    (tt, rows): (&[__m512; 32], &[*const E; NARROW_F]),
    i0: usize,
    d: usize,
    a: &mut [[__m512; 2]; 4],
) {
    // SAFETY: forwarded.
    unsafe {
        match (n, hi) {
            (4, false) => narrow_rows::<E, 4, false>(tt, rows, i0, d, a),
            (4, true) => narrow_rows::<E, 4, true>(tt, rows, i0, d, a),
            (3, false) => narrow_rows::<E, 3, false>(tt, rows, i0, d, a),
            (3, true) => narrow_rows::<E, 3, true>(tt, rows, i0, d, a),
            (2, false) => narrow_rows::<E, 2, false>(tt, rows, i0, d, a),
            (2, true) => narrow_rows::<E, 2, true>(tt, rows, i0, d, a),
            (_, false) => narrow_rows::<E, 1, false>(tt, rows, i0, d, a),
            (_, true) => narrow_rows::<E, 1, true>(tt, rows, i0, d, a),
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
