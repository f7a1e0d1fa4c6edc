//! The dot interaction's backward on AVX-512 (f32 operands, `dr` and
//! gradients): the 512-bit sibling of the Cranelift kernel of
//! [`super::interaction`], whose vectors are 128 bits wide (the x86-64 backend
//! has no wider ones). Chosen at run time ([`available`]) under
//! [`super::KernelChoice::Auto`] or `Avx512`, like the GEMM micro-kernels;
//! other element types and choices run the Cranelift kernel.
//!
//! Per sample and operand `i`, 64 columns at a time (up to four `zmm`, as many
//! as have live columns):
//! `dT_i = [i == 0] dr[..D] + Σ_k c_ik T_k` over the partners `k` of `i` in
//! ascending order, one FMA per term, with `c_ik` the `dr` entry of the pair
//! `(max, min)` (`2·dr` on the diagonal with self-interaction): the Cranelift
//! kernel's order term for term, so the two agree bit for bit on the columns
//! of its whole f32x4 vectors (its last `D mod 4` columns use a multiply and
//! an add). Columns past a multiple of 16 are masked loads and stores: nothing
//! outside a row is read or written.
//!
//! The forward has no such kernel: an AVX-512 version (16-lane dot products,
//! four partners per load of `T_i`) was no faster than the Cranelift one in a
//! training step (`--bench`, 3 interleaved pairs: 0.49–0.72 ms against
//! 0.43–0.80); its time is the operands' reads, not its arithmetic.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// True if this CPU can run these kernels (AVX-512 F).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
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

/// Backward rows `s0..s1`: `ops[i]` operand `i`, `dr` the result's gradient
/// (`[S][width]`), `grads[i]` operand `i`'s gradient (`[S][D]`); rows `s0..s1`
/// of each gradient are written (absolute rows).
///
/// # Safety
/// Every `ops[i]` holds rows `0..s1` of `d` f32, `dr` rows `0..s1` of `width`
/// f32, every `grads[i]` rows `0..s1` of `d` f32 whose rows `s0..s1` no other
/// thread touches; `f <= MAX_F`; the CPU has AVX-512 F ([`available`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub unsafe fn backward(
    dot: Dot,
    ops: &[*const f32],
    dr: *const f32,
    grads: &[*mut f32],
    s0: usize,
    s1: usize,
) {
    let Dot { f, d, .. } = dot;
    let width = dot.width();
    let mut rows = [std::ptr::null::<f32>(); MAX_F];
    // Per operand i: its partners k (ascending) and the dr column of the pair
    // (the diagonal doubled), fixed for the call.
    let partners: Vec<Vec<(usize, usize, bool)>> = (0..f)
        .map(|i| {
            (0..f)
                .filter(|&k| k != i || dot.self_interaction)
                .map(|k| (k, dot.col(i.max(k), i.min(k)), k == i))
                .collect()
        })
        .collect();
    for s in s0..s1 {
        // SAFETY: the caller's contract: row `s` of every operand, of `dr` and
        // of every gradient; the masked loads and stores stay inside the rows.
        unsafe {
            for (r, &op) in rows.iter_mut().zip(ops) {
                *r = op.add(s * d);
            }
            let drow = dr.add(s * width);
            for (i, part) in partners.iter().enumerate() {
                let g = grads[i].add(s * d);
                for c0 in (0..d).step_by(64) {
                    // Only the vectors with live columns (a 16-wide operand
                    // is one `zmm`, not four).
                    let at = (c0, d - c0, i == 0);
                    match (d - c0).div_ceil(16) {
                        1 => cols::<1>(part, drow, &rows[..f], g, at),
                        2 => cols::<2>(part, drow, &rows[..f], g, at),
                        3 => cols::<3>(part, drow, &rows[..f], g, at),
                        _ => cols::<4>(part, drow, &rows[..f], g, at),
                    }
                }
            }
        }
    }
}

/// Columns `c0..c0 + n` (`NV` vectors, `n <= 16·NV`) of one operand's gradient
/// row `g`: `drow`'s columns when `init` (operand 0), plus `c·T_k` per partner
/// `(k, col, diag)` in order (`c` = `drow[col]`, doubled on the diagonal; `T_k`
/// is the row `rows[k]`).
///
/// # Safety
/// [`backward`]'s contract for this sample: `drow` is its `dr` row, `rows` its
/// operands' rows, `g` its gradient row, each holding columns `c0..c0 + n`;
/// AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn cols<const NV: usize>(
    part: &[(usize, usize, bool)],
    drow: *const f32,
    rows: &[*const f32],
    g: *mut f32,
    (c0, n, init): (usize, usize, bool),
) {
    let ms: [u16; NV] = std::array::from_fn(|v| mask(16 * v, n));
    let mut acc = [_mm512_setzero_ps(); NV];
    // SAFETY: the caller's contract; the masked loads and stores touch the
    // `n` live columns only.
    unsafe {
        let g = g.add(c0);
        if init {
            for v in 0..NV {
                acc[v] = _mm512_maskz_loadu_ps(ms[v], drow.add(c0 + 16 * v));
            }
        }
        for &(k, col, diag) in part {
            let mut coef = *drow.add(col);
            if diag {
                coef *= 2.0;
            }
            let cv = _mm512_set1_ps(coef);
            let t = rows[k].add(c0);
            for v in 0..NV {
                let x = _mm512_maskz_loadu_ps(ms[v], t.add(16 * v));
                acc[v] = _mm512_fmadd_ps(cv, x, acc[v]);
            }
        }
        for v in 0..NV {
            _mm512_mask_storeu_ps(g.add(16 * v), ms[v], acc[v]);
        }
    }
}

/// Most operands these kernels take (the row-pointer array's size).
pub const MAX_F: usize = 64;
