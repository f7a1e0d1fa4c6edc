//! bf16 ↔ f32 over slices, in loops that vectorise: the branch-free
//! conversions of [`Elem`] (bit for bit `half`'s), compiled for AVX-512 F+BW
//! or else AVX2 where the CPU has them (the crate's baseline, SSE2, has no
//! 32-to-16-bit pack, so a narrowing loop would stay scalar there). `half`'s own slice conversions run
//! one element at a time with a NaN branch each.

use super::Elem;
use half::bf16;

/// Whether the CPU has AVX2 (detected once by the standard library).
pub(crate) fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the CPU has AVX-512 F and BW (detected once by the standard
/// library).
pub(crate) fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the CPU has AVX-512 F, BW, DQ and BF16 (detected once by the
/// standard library).
pub(crate) fn has_avx512_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        has_avx512()
            && std::is_x86_feature_detected!("avx512dq")
            && std::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `dst[i] = src[i]` widened (exact); the slices have one length. With
/// AVX-512 sixteen a vector (AVX2's eight took 4.2% of the cycles of a bf16
/// `brgemm` 2048×512×256 whose `A` is widened once per row chunk).
pub(crate) fn widen(src: &[bf16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: the CPU has AVX-512 F and BW (checked just above).
        return unsafe { widen_avx512(src, dst) };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { widen_avx2(src, dst) };
    }
    widen_loop(src, dst);
}

/// `dst[i] = src[i]` rounded to nearest even (NaN kept NaN); the slices have
/// one length.
pub(crate) fn narrow(src: &[f32], dst: &mut [bf16]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx512_bf16() {
        // SAFETY: the CPU has AVX-512 F, BW, DQ and BF16 (checked just above).
        return unsafe { narrow_avx512bf16(src, dst) };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: the CPU has AVX-512 F and BW (checked just above).
        return unsafe { narrow_avx512(src, dst) };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { narrow_avx2(src, dst) };
    }
    narrow_loop(src, dst);
}

#[inline(always)]
fn widen_loop(src: &[bf16], dst: &mut [f32]) {
    for (o, &x) in dst.iter_mut().zip(src) {
        *o = x.load();
    }
}

#[inline(always)]
fn narrow_loop(src: &[f32], dst: &mut [bf16]) {
    for (o, &x) in dst.iter_mut().zip(src) {
        *o = bf16::store(x);
    }
}

/// [`widen_loop`] compiled for AVX2.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn widen_avx2(src: &[bf16], dst: &mut [f32]) {
    widen_loop(src, dst);
}

/// [`widen_loop`] compiled for AVX-512.
///
/// # Safety
/// The CPU has AVX-512 F and BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn widen_avx512(src: &[bf16], dst: &mut [f32]) {
    widen_loop(src, dst);
}

/// [`narrow_loop`] compiled for AVX2.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn narrow_avx2(src: &[f32], dst: &mut [bf16]) {
    narrow_loop(src, dst);
}

/// [`narrow_loop`] compiled for AVX-512.
///
/// # Safety
/// The CPU has AVX-512 F and BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn narrow_avx512(src: &[f32], dst: &mut [bf16]) {
    narrow_loop(src, dst);
}

/// [`narrow_loop`] sixteen at a time with AVX512_BF16's `vcvtneps2bf16`
/// (one instruction where the integer rounding takes eight): the same
/// rounding to nearest even and quieted NaN as `half`, except that it
/// flushes subnormal inputs to zero, so a vector holding one (`vfpclassps`)
/// takes [`narrow_loop`] instead. A `--precision bf16` inference step's
/// interaction, whose results are rounded through this, 0.40-0.43 to
/// 0.38-0.39 ms at dlrm-kaggle's shape and 0.230-0.244 to 0.221-0.229 at
/// dlrm-small's (Intel Xeon model 207, 2 threads, interleaved).
///
/// # Safety
/// The CPU has AVX-512 F, BW, DQ and BF16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512bf16")]
unsafe fn narrow_avx512bf16(src: &[f32], dst: &mut [bf16]) {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len());
    let (src, dst) = (&src[..n], &mut dst[..n]);
    let mut s = src.chunks_exact(16);
    let mut d = dst.chunks_exact_mut(16);
    for (s16, d16) in (&mut s).zip(&mut d) {
        // SAFETY: 16 floats to read, 16 bf16 to write; the CPU has the
        // features (the caller's contract).
        unsafe {
            let x = _mm512_loadu_ps(s16.as_ptr());
            // Class 0x20: subnormal.
            if _mm512_fpclass_ps_mask::<0x20>(x) == 0 {
                let h: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(x));
                _mm256_storeu_si256(d16.as_mut_ptr().cast(), h);
            } else {
                narrow_loop(s16, d16);
            }
        }
    }
    narrow_loop(s.remainder(), d.into_remainder());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every form is `half`'s conversions bit for bit, on every bf16 and on
    /// f32 values around every rounding case (the vector forms this CPU has,
    /// each, at a length with a tail).
    #[test]
    fn both_forms_are_halfs() {
        let all: Vec<bf16> = (0..=u16::MAX).chain(0..37).map(bf16::from_bits).collect();
        let mut wide = vec![0.0f32; all.len()];
        let mut base = vec![0.0f32; all.len()];
        widen(&all, &mut wide);
        widen_loop(&all, &mut base);
        for ((w, b), x) in wide.iter().zip(&base).zip(&all) {
            assert_eq!(w.to_bits(), x.to_f32().to_bits());
            assert_eq!(b.to_bits(), x.to_f32().to_bits());
        }
        #[cfg(target_arch = "x86_64")]
        for (has, form) in [
            (has_avx2(), widen_avx2 as unsafe fn(&[bf16], &mut [f32])),
            (has_avx512(), widen_avx512),
        ] {
            if has {
                let mut v = vec![0.0f32; all.len()];
                // SAFETY: the CPU has the form's features (`has`).
                unsafe { form(&all, &mut v) };
                assert!(v.iter().zip(&base).all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }
        let vals: Vec<f32> = (0..=u16::MAX as u32)
            .flat_map(|h| {
                [0u32, 0x7fff, 0x8000, 0x8001, 0xffff].map(|l| f32::from_bits(h << 16 | l))
            })
            .collect();
        let mut wide = vec![bf16::ZERO; vals.len()];
        let mut base = vec![bf16::ZERO; vals.len()];
        narrow(&vals, &mut wide);
        narrow_loop(&vals, &mut base);
        for ((w, b), x) in wide.iter().zip(&base).zip(&vals) {
            assert_eq!(
                w.to_bits(),
                bf16::from_f32(*x).to_bits(),
                "{:#010x}",
                x.to_bits()
            );
            assert_eq!(b.to_bits(), w.to_bits());
        }
        #[cfg(target_arch = "x86_64")]
        for (has, form) in [
            (has_avx2(), narrow_avx2 as unsafe fn(&[f32], &mut [bf16])),
            (has_avx512(), narrow_avx512),
            (has_avx512_bf16(), narrow_avx512bf16),
        ] {
            if has {
                let mut v = vec![bf16::ZERO; vals.len() - 3];
                // SAFETY: the CPU has the form's features (`has`).
                unsafe { form(&vals[..v.len()], &mut v) };
                assert!(v.iter().zip(&base).all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }
    }
}
