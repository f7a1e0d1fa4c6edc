//! Hot-cache throughput of one micro-kernel tile called repeatedly through the
//! registry's entry ([`micro::MicroKernel::call`]): the AVX2+FMA `6×16` kernel
//! ([`micro::avx2`]) against the AVX-512 kernel ([`micro::avx512`]) at 8 and 12
//! rows (its full `MR` and a shorter tile, to show the choice of `MR`), for
//! `k` = 64, 256, 512, `A` packed (`[kk][mr]`, as the loop nest packs it) or
//! unpacked (row-major, `lda = k`), f32 and bf16 `A`; and the AVX-512 BF16
//! kernel ([`micro::avx512bf16`], `B` in k pairs) and the AMX-BF16 one
//! ([`micro::amx`], the same `B`) on unpacked bf16 `A`, the only layout they
//! take. Best of N samples (robust on a shared machine), one
//! thread, variants interleaved.
//!
//! `cargo run --release -p dlrm-codegen --example ukernel_best -- [samples]`

use dlrm_codegen::jit::micro::{self, BPacking, F_A_BF16, F_BIAS, MicroKernel, TileArgs};
use half::bf16;
use std::time::Instant;

/// One variant: a name, flops per call and the call.
struct Variant {
    name: String,
    flops: f64,
    run: Box<dyn FnMut()>,
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
    for k in [64usize, 256, 512] {
        for packed in [true, false] {
            for abf in [false, true] {
                // (label, kernel, mr): the AVX2 tile and two AVX-512 heights.
                let mut kernels: Vec<(&str, &'static MicroKernel, usize)> = Vec::new();
                if have2 {
                    kernels.push(("avx2", &micro::AVX2, micro::AVX2.mr));
                }
                if have512 {
                    for mr in [8, 12, 14] {
                        if mr <= micro::AVX512.mr {
                            kernels.push(("avx512", &micro::AVX512, mr));
                        }
                    }
                }
                if micro::AVX512_BF16.available() && abf && !packed {
                    let bf = &micro::AVX512_BF16;
                    kernels.push(("avx512bf16", bf, bf.mr));
                }
                if micro::AMX_BF16.available() && abf && !packed {
                    let amx = &micro::AMX_BF16;
                    kernels.push(("amxbf16", amx, amx.mr));
                }
                for (label, kern, mr) in kernels {
                    variants.push(variant(label, kern, mr, k, packed, abf));
                }
            }
        }
    }
    let mut best = vec![f64::INFINITY; variants.len()];
    for _ in 0..samples {
        for (v, b) in variants.iter_mut().zip(&mut best) {
            let t0 = Instant::now();
            (v.run)();
            *b = b.min(t0.elapsed().as_secs_f64());
        }
    }
    println!("{:<44} {:>9}", "variant (one thread, hot cache)", "GFLOP/s");
    for (v, t) in variants.iter().zip(best) {
        println!("{:<44} {:>9.1}", v.name, v.flops / t / 1e9);
    }
}

/// A variant calling `kern`'s `mr×nr` tile `calls` times on its own buffers.
fn variant(
    label: &str,
    kern: &'static MicroKernel,
    mr: usize,
    k: usize,
    packed: bool,
    abf: bool,
) -> Variant {
    let nr = kern.nr;
    let a: Vec<f32> = (0..mr * k)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let a_bf: Vec<bf16> = a.iter().map(|&x| bf16::from_f32(x)).collect();
    let b: Vec<f32> = (0..k * nr)
        .map(|i| ((i * 104729) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let bias = vec![0.25f32; nr];
    let mut c = vec![0f32; mr * nr];
    // Packed: `[kk][mr]`; unpacked: row-major `mr × k`.
    let (lda, acs) = if packed { (1, mr) } else { (k, 1) };
    let flops_call = 2.0 * (mr * nr * k) as f64;
    // About 20 MFLOP per sample.
    let calls = (2e7 / flops_call).ceil() as usize;
    let flags = F_BIAS | if abf { F_A_BF16 } else { 0 };
    let name = format!(
        "{label} {mr}x{nr} k={k:<3} A {} {}",
        if packed { "packed  " } else { "unpacked" },
        if abf { "bf16" } else { "f32" }
    );
    // Rows of B `nr` apart: each kernel's NR (rows of k pairs for the BF16
    // kernels).
    let b = if kern.b_packing == BPacking::KPairs {
        let bb: Vec<bf16> = b.iter().map(|&x| bf16::from_f32(x)).collect();
        let mut pairs = vec![0.0f32; k.div_ceil(2) * nr];
        micro::avx512bf16::pack_b_pairs_into(&mut pairs, &bb, (k, nr, nr, 1), nr);
        pairs
    } else {
        b
    };
    let run: Box<dyn FnMut()> = Box::new(move || {
        let ap: *const u8 = if abf {
            a_bf.as_ptr().cast()
        } else {
            a.as_ptr().cast()
        };
        for _ in 0..calls {
            // SAFETY: `a` holds the `mr × k` tile in the (lda, acs) layout, `b`
            // k rows of `nr` (the kernel's NR), `bias` NR floats, `c` the tile
            // (`ldc = nr`); the kernel's CPU features were detected above.
            unsafe {
                kern.call(&TileArgs {
                    a: ap,
                    b: b.as_ptr(),
                    c: c.as_mut_ptr().cast(),
                    bias: bias.as_ptr(),
                    k,
                    lda,
                    acs,
                    ldc: nr,
                    ldb: nr,
                    kb: k,
                    a_blk: 0,
                    mr,
                    nr,
                    flags,
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
