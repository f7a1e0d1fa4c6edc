//! Throughput of one micro-kernel tile called repeatedly through the
//! registry's entry ([`micro::MicroKernel::call`]): the AVX2+FMA `6×16` kernel
//! ([`micro::avx2`]) against the AVX-512 kernel ([`micro::avx512`]) at 8 and 12
//! rows (its full `MR` and a shorter tile, to show the choice of `MR`), for
//! `k` = 64, 256, 1024, `A` packed (`[kk][mr]`, as the loop nest packs it),
//! blocked (f32 `[k/64][mr][64]`, the blocked activations `brgemm` reads in
//! place: `lda` 64, batch-reduce blocks of 64) or unpacked (row-major, `lda =
//! k`), f32 and bf16 `A`; `B` hot (one panel of `k` rows, `ldb = nr`, reused
//! by every call) or streamed (each call the next of 1 MiB of panels, and
//! the next `C` tile: `B` from L2, as the loop nest reads a layer's weight
//! panels, and `C` not in L1; f32 `A`, the AVX-512 12-row tile only); and the AVX-512 BF16 kernel ([`micro::avx512bf16`], `B`
//! in k pairs) on unpacked and on blocked bf16 `A` (a row stride other than
//! the blocked widths, as unpacked here, is staged through a buffer: on the Zen
//! 4 of stop 67, k = 1024, 171-177 against 216-217 GFLOP/s blocked, 92% of one core's
//! `vdpbf16ps` peak), and the AMX-BF16 one ([`micro::amx`], the same `B`) on
//! unpacked bf16 `A`. Best of N samples (robust on a shared
//! machine), one thread, variants interleaved; the last line is the FMA peak
//! of one core (independent `vfmadd231ps zmm` chains).
//!
//! `cargo run --release -p dlrm-codegen --example ukernel_best -- [samples]`
//!
//! `STREAM_KB=N` (default 1024) sets how many KiB of `B` panels a streamed
//! variant cycles through: rerun with 256, 512, 1024 and 2048 to see how the
//! kernel's rate falls as its `B` working set grows through the L2.

use dlrm_codegen::jit::micro::{self, BPacking, F_A_BF16, F_BIAS, MicroKernel, TileArgs};
use half::bf16;
use std::time::Instant;

/// One variant: a name, flops per call and the call.
struct Variant {
    name: String,
    flops: f64,
    run: Box<dyn FnMut()>,
}

/// How `A` is laid out.
#[derive(Clone, Copy, PartialEq)]
enum Layout {
    /// `[kk][mr]` (`lda` 1, `acs = mr`), as the loop nest packs it.
    Packed,
    /// `[k/64][mr][64]` (`lda` 64, `acs` 1, batch-reduce blocks of 64).
    Blocked,
    /// Row-major `mr × k` (`lda = k`, `acs` 1).
    Unpacked,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::Packed => "packed  ",
            Layout::Blocked => "blocked ",
            Layout::Unpacked => "unpacked",
        }
    }
}

fn main() {
    let samples: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("samples: a number"))
        .unwrap_or(30);
    let have2 = micro::AVX2.available();
    let have512 = micro::AVX512.available();
    if !have512 {
        println!("note: no AVX-512 on this CPU: only the AVX2 kernel is measured");
    }
    let mut variants = Vec::new();
    for k in [64usize, 256, 1024] {
        for layout in [Layout::Packed, Layout::Blocked, Layout::Unpacked] {
            for abf in [false, true] {
                // (label, kernel, mr): the AVX2 tile and two AVX-512 heights
                // (bf16 blocked: the AVX-512 BF16 kernel only, as `brgemm`
                // reads a bf16 plan's blocked activations).
                let fma = !(abf && layout == Layout::Blocked);
                let mut kernels: Vec<(&str, &'static MicroKernel, usize)> = Vec::new();
                if have2 && fma {
                    kernels.push(("avx2", &micro::AVX2, micro::AVX2.mr));
                }
                if have512 && fma {
                    for mr in [8, 12] {
                        kernels.push(("avx512", &micro::AVX512, mr));
                    }
                }
                let unpacked_bf = abf && layout == Layout::Unpacked;
                if micro::AVX512_BF16.available() && abf && layout != Layout::Packed {
                    let bf = &micro::AVX512_BF16;
                    kernels.push(("avx512bf16", bf, bf.mr));
                }
                if micro::AMX_BF16.available() && unpacked_bf {
                    let amx = &micro::AMX_BF16;
                    kernels.push(("amxbf16", amx, amx.mr));
                }
                for (label, kern, mr) in kernels {
                    variants.push(variant(label, kern, mr, k, layout, abf, false));
                }
                if have512 && !abf {
                    let kern = &micro::AVX512;
                    variants.push(variant("avx512", kern, kern.mr, k, layout, abf, true));
                }
            }
        }
    }
    variants.push(fma_peak());
    let mut best = vec![f64::INFINITY; variants.len()];
    for _ in 0..samples {
        for (v, b) in variants.iter_mut().zip(&mut best) {
            let t0 = Instant::now();
            (v.run)();
            *b = b.min(t0.elapsed().as_secs_f64());
        }
    }
    println!("{:<50} {:>9}", "variant (one thread)", "GFLOP/s");
    for (v, t) in variants.iter().zip(best) {
        println!("{:<50} {:>9.1}", v.name, v.flops / t / 1e9);
    }
}

/// Bytes of `B` panels a streamed variant cycles through (beyond L1, within
/// L2), unless `STREAM_KB` says otherwise.
const STREAM_BYTES: usize = 1 << 20;

/// [`STREAM_BYTES`], or `STREAM_KB` KiB from the environment.
fn stream_bytes() -> usize {
    match std::env::var("STREAM_KB") {
        Ok(v) => v.parse::<usize>().expect("STREAM_KB: a number of KiB") << 10,
        Err(_) => STREAM_BYTES,
    }
}

/// A variant calling `kern`'s `mr×nr` tile on its own buffers, about 20 MFLOP
/// per sample; `stream`: each call on the next of several `B` panels (and `C`
/// tiles), cycling through [`stream_bytes`] of them.
fn variant(
    label: &str,
    kern: &'static MicroKernel,
    mr: usize,
    k: usize,
    layout: Layout,
    abf: bool,
    stream: bool,
) -> Variant {
    let nr = kern.nr;
    let a: Vec<f32> = (0..mr * k)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let a_bf: Vec<bf16> = a.iter().map(|&x| bf16::from_f32(x)).collect();
    // Rows of B `nr` apart: each kernel's NR (rows of k pairs for the BF16
    // kernels).
    let rows = kern.b_packing.rows(k);
    let panels = if stream {
        (stream_bytes() / (rows * nr * 4)).max(2)
    } else {
        1
    };
    let b: Vec<f32> = (0..panels * k * nr)
        .map(|i| ((i * 104729) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let b = if kern.b_packing == BPacking::KPairs {
        let bb: Vec<bf16> = b.iter().map(|&x| bf16::from_f32(x)).collect();
        let mut pairs = vec![0.0f32; rows * nr];
        micro::avx512bf16::pack_b_pairs_into(&mut pairs, &bb, (k, nr, nr, 1), nr);
        pairs
    } else {
        b
    };
    let bias = vec![0.25f32; nr];
    let ctiles = if stream { panels } else { 1 };
    let mut c = vec![0f32; ctiles * mr * nr];
    let (lda, acs, kb, a_blk) = match layout {
        Layout::Packed => (1, mr, k, 0),
        Layout::Blocked => (64, 1, 64, mr * 64),
        Layout::Unpacked => (k, 1, k, 0),
    };
    let flops_call = 2.0 * (mr * nr * k) as f64;
    let calls = (2e7 / flops_call).ceil() as usize;
    let flags = F_BIAS | if abf { F_A_BF16 } else { 0 };
    let name = format!(
        "{label} {mr}x{nr} k={k:<4} A {} {} B {}",
        layout.name(),
        if abf { "bf16" } else { "f32 " },
        if stream { "streamed" } else { "hot" }
    );
    let mut next = 0;
    let run: Box<dyn FnMut()> = Box::new(move || {
        let ap: *const u8 = if abf {
            a_bf.as_ptr().cast()
        } else {
            a.as_ptr().cast()
        };
        for _ in 0..calls {
            let (pb, pc) = (next * rows * nr, next * mr * nr);
            next = (next + 1) % panels;
            // SAFETY: `a` holds the `mr × k` tile in the (lda, acs, kb, a_blk)
            // layout, `b[pb..]` k rows of `nr` (the kernel's NR), `bias` NR
            // floats, `c[pc..]` the tile (`ldc = nr`); the kernel's CPU
            // features were detected above.
            unsafe {
                kern.call(&TileArgs {
                    a: ap,
                    b: b[pb..].as_ptr(),
                    c: c[pc..].as_mut_ptr().cast(),
                    bias: bias.as_ptr(),
                    k,
                    lda,
                    acs,
                    ldc: nr,
                    ldb: nr,
                    kb,
                    a_blk,
                    mr,
                    nr,
                    flags,
                    mask: 0,
                });
            }
            std::hint::black_box(&mut c);
        }
    });
    Variant {
        name,
        flops: flops_call * calls as f64,
        run,
    }
}

/// This core's FMA peak: 16 independent `vfmadd231ps zmm` chains (AVX-512),
/// else 12 `ymm` chains (AVX2+FMA), about 20 MFLOP per sample.
fn fma_peak() -> Variant {
    const ITERS: usize = 40_000;
    let lanes = if micro::AVX512.available() { 256 } else { 96 };
    Variant {
        name: "FMA peak (independent chains)".into(),
        flops: (2 * ITERS * lanes) as f64,
        run: Box::new(|| {
            #[cfg(target_arch = "x86_64")]
            {
                if micro::AVX512.available() {
                    // SAFETY: the CPU has AVX-512 F.
                    unsafe { chains512(ITERS) };
                } else if micro::AVX2.available() {
                    // SAFETY: the CPU has AVX2 and FMA.
                    unsafe { chains256(ITERS) };
                }
            }
        }),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn chains512(iters: usize) {
    use std::arch::x86_64::*;
    let (m, c) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
    let mut acc = [_mm512_set1_ps(1.0); 16];
    for _ in 0..iters {
        for a in &mut acc {
            *a = _mm512_fmadd_ps(*a, m, c);
        }
    }
    std::hint::black_box(acc);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn chains256(iters: usize) {
    use std::arch::x86_64::*;
    let (m, c) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
    let mut acc = [_mm256_set1_ps(1.0); 12];
    for _ in 0..iters {
        for a in &mut acc {
            *a = _mm256_fmadd_ps(*a, m, c);
        }
    }
    std::hint::black_box(acc);
}
