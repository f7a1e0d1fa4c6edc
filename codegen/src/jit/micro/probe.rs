//! Whether the AVX-512 BF16 kernel pays on this CPU, measured once per
//! process.
//!
//! `vdpbf16ps` does twice the multiply-adds of an f32 FMA per instruction, but
//! CPUs issue it at different rates. On an AMD EPYC of the Zen 5 class a bf16
//! dlrm-mlperf step on the AVX-512 BF16 kernel ([`super::avx512bf16`]) trained
//! at 1.66-1.78x fp32 (stop 53); on Intel Xeons its tile runs at about half
//! the AVX-512 FMA kernel's rate (this probe read 0.48 on one, model 207,
//! 2026-11-30), so a bf16 plan whose GEMMs took it there trained at 0.6x of
//! fp32 (10.7k against 17.3k samples/s on dlrm-mlperf). Under `--kernels
//! auto` the GEMMs of two bf16 operands take it only where it pays
//! ([`bf16_dot_pays`]); elsewhere they run
//! on the FMA kernels, timed like f32 GEMMs. AMX-BF16 is chosen wherever the
//! CPU has it, without this probe.
//!
//! The probe times the two kernels' best tiles on hot operands (12×32, `k` =
//! 256: the AVX-512 kernel on f32 `A` packed `[kk][mr]`, as the loop nest packs
//! a widened bf16 `A`; the BF16 kernel on bf16 `A` in place), taking turns,
//! best of [`SAMPLES`] each: about a millisecond. The choice changes the bits
//! of a run (the k-pair kernels add in their own order), so it must not flip
//! from one process to the next on one CPU: the threshold [`PAYS`] sits far
//! from the rates expected (about 0.5 on Intel; on Zen 5, where the probe has
//! not run yet, the whole bf16 step ran 1.7x fp32 on the kernel), and
//! `DLRM_BF16_DOT=1` (or `0`) fixes the answer for a run whose CPU would sit
//! near it. `--kernels avx512bf16` forces the kernel regardless.

use super::{AVX512, AVX512_BF16, BPacking, F_A_BF16, MicroKernel, TileArgs};
use half::bf16;
use std::sync::OnceLock;
use std::time::Instant;

/// [`bf16_dot_speedup`]'s measurement.
static SPEEDUP: OnceLock<Option<f64>> = OnceLock::new();

/// The speed-up over the FMA kernel at which the AVX-512 BF16 kernel is taken.
pub const PAYS: f64 = 1.25;

/// Timed samples of each kernel (taking turns; best kept).
const SAMPLES: usize = 15;

/// The AVX-512 BF16 kernel's tile rate over the AVX-512 FMA kernel's on this
/// CPU (module docs), measured on first use; `None` where the CPU lacks
/// either kernel.
pub fn bf16_dot_speedup() -> Option<f64> {
    *SPEEDUP.get_or_init(|| (AVX512.available() && AVX512_BF16.available()).then(measure))
}

/// [`bf16_dot_speedup`] if this process has measured it (a run that never
/// asked does not pay for the probe to report it).
pub fn bf16_dot_measured() -> Option<f64> {
    SPEEDUP.get().copied().flatten()
}

/// Whether `--kernels auto` runs the GEMMs of two bf16 operands (and the
/// bf16 weight gradients' k-pair path, and the interaction's bf16 forward:
/// `interaction::native`'s `pairs`) on `vdpbf16ps`: the CPU has AVX512_BF16 and
/// [`bf16_dot_speedup`] is at least [`PAYS`], unless `DLRM_BF16_DOT` is `1`
/// or `0`.
pub fn bf16_dot_pays() -> bool {
    if !AVX512_BF16.available() {
        return false;
    }
    match std::env::var("DLRM_BF16_DOT").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => bf16_dot_speedup().is_some_and(|r| r >= PAYS),
    }
}

/// One kernel's hot tile: `A` (f32 packed, or bf16 in place), `B` in its
/// packing, `C`.
struct Tile {
    kern: &'static MicroKernel,
    a: Vec<u32>,
    b: Vec<f32>,
    c: Vec<f32>,
    args: (usize, usize, u32),
}

const K: usize = 256;

impl Tile {
    fn new(kern: &'static MicroKernel) -> Tile {
        let (mr, nr) = (kern.mr, kern.nr);
        let val = |i: usize| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5;
        let b: Vec<f32> = (0..K * nr).map(val).collect();
        match kern.b_packing {
            BPacking::F32 => Tile {
                kern,
                a: (0..mr * K).map(|i| val(i + 1).to_bits()).collect(),
                b,
                c: vec![0.0; mr * nr],
                args: (1, mr, 0),
            },
            BPacking::KPairs => {
                let bb: Vec<bf16> = b.iter().map(|&x| bf16::from_f32(x)).collect();
                let mut pairs = vec![0.0f32; kern.b_packing.rows(K) * nr];
                super::avx512bf16::pack_b_pairs_into(&mut pairs, &bb, (K, nr, nr, 1), nr);
                // bf16 `A` row-major (`lda = K`), two per 32-bit word.
                let a16: Vec<u16> = (0..mr * K)
                    .map(|i| bf16::from_f32(val(i + 1)).to_bits())
                    .collect();
                let a = a16
                    .chunks(2)
                    .map(|p| u32::from(p[0]) | u32::from(p[1]) << 16)
                    .collect();
                Tile {
                    kern,
                    a,
                    b: pairs,
                    c: vec![0.0; mr * nr],
                    args: (K, 1, F_A_BF16),
                }
            }
        }
    }

    /// Seconds for `calls` calls of the tile.
    fn time(&mut self, calls: usize) -> f64 {
        let (lda, acs, flags) = self.args;
        let (mr, nr) = (self.kern.mr, self.kern.nr);
        let t0 = Instant::now();
        for _ in 0..calls {
            // SAFETY: `a` holds the `mr × K` tile (f32 `[kk][mr]`, or bf16
            // row-major `lda = K`), `b` the kernel's `K` steps of `nr` in its
            // packing, `c` the `mr × nr` tile; the caller checked the CPU has
            // the kernel's features.
            unsafe {
                self.kern.call(&TileArgs {
                    a: self.a.as_ptr().cast(),
                    b: self.b.as_ptr(),
                    c: self.c.as_mut_ptr().cast(),
                    bias: self.b.as_ptr(),
                    k: K,
                    lda,
                    acs,
                    ldc: nr,
                    ldb: nr,
                    kb: K,
                    a_blk: 0,
                    mr,
                    nr,
                    flags,
                    mask: 0,
                });
            }
            std::hint::black_box(&mut self.c);
        }
        t0.elapsed().as_secs_f64()
    }
}

/// The probe (module docs); both kernels available.
fn measure() -> f64 {
    let mut fma = Tile::new(&AVX512);
    let mut dot = Tile::new(&AVX512_BF16);
    let (mut t_fma, mut t_dot) = (f64::INFINITY, f64::INFINITY);
    // A warm-up round, then the samples; 16 calls are ~3 MFLOP.
    for i in 0..=SAMPLES {
        let (f, d) = (fma.time(16), dot.time(16));
        if i > 0 {
            t_fma = t_fma.min(f);
            t_dot = t_dot.min(d);
        }
    }
    t_fma / t_dot
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_measures_a_rate_where_both_kernels_run() {
        match bf16_dot_speedup() {
            Some(r) => {
                assert!(r.is_finite() && r > 0.05 && r < 20.0, "speed-up {r}");
                // The same answer twice (measured once per process).
                assert_eq!(bf16_dot_speedup(), Some(r));
            }
            None => assert!(!(AVX512.available() && AVX512_BF16.available())),
        }
        if !AVX512_BF16.available() {
            assert!(!bf16_dot_pays());
        }
    }
}
