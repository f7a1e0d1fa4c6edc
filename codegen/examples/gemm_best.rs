//! Best-of-N GEMM throughput (robust on a shared machine): the JIT GEMM with each
//! micro-kernel against `matrixmultiply::sgemm`, runs interleaved.
//!
//! `RAYON_NUM_THREADS=1 cargo run --release -p dlrm-codegen --example gemm_best -- M K N [reps]`

use dlrm_codegen::jit::Jit;
use dlrm_codegen::jit::gemm::{BLayout, Elt, GemmSpec, Micro, Operand, OutBuf, pack_b};
use half::bf16;
use std::time::Instant;

/// The allocator `dlrm-run` uses (freed buffers are reused, not page-faulted
/// back), so the timings include the same allocation costs as a training step.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let a: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| s.parse().expect("numbers: M K N [reps]"))
        .collect();
    let (m, k, n) = (a[0], a[1], a[2]);
    let reps = a.get(3).copied().unwrap_or(20);
    let jit = Jit::global().expect("jit");
    let av: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let abf: Vec<bf16> = av.iter().map(|&x| bf16::from_f32(x)).collect();
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 104729) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let mut out = vec![0.0f32; m * n];
    let mut outb = vec![bf16::ZERO; m * n];
    let flops = 2.0 * (m * n * k) as f64;
    let mut micros = vec![Micro::Cranelift];
    if Micro::Native.available() {
        micros.push(Micro::Native);
    }
    if Micro::Native512.available() {
        micros.push(Micro::Native512);
    }
    let mut variants: Vec<(String, Box<dyn FnMut()>)> = Vec::new();
    for (micro, pack_a) in micros.into_iter().flat_map(|m| [(m, false), (m, true)]) {
        for bf in [false, true] {
            let spec = GemmSpec {
                m,
                n,
                k,
                lda: k,
                acs: 1,
                ldc: n,
                a: if bf { Elt::BF16 } else { Elt::F32 },
                c: if bf { Elt::BF16 } else { Elt::F32 },
                bias: false,
                relu: false,
                mask: false,
                micro,
                pack_a,
                b: BLayout::Packed,
                kb: 0,
                a_blk: 0,
                kc: 0,
            };
            let kern = jit.gemm(spec).expect("compiles");
            let bp = pack_b(&w, k, n, 1, k, micro.nr());
            let (ap, bfp) = (av.as_ptr() as usize, abf.as_ptr() as usize);
            let (op, obp) = (out.as_mut_ptr() as usize, outb.as_mut_ptr() as usize);
            let len = m * n;
            let alen = m * k;
            variants.push((
                format!(
                    "{micro:?}{}/{}",
                    if pack_a { "+packA" } else { "" },
                    if bf { "bf16" } else { "f32" }
                ),
                Box::new(move || {
                    // SAFETY: the buffers outlive the closures (dropped at the end of
                    // main, after every run) and are used by one closure at a time.
                    unsafe {
                        if bf {
                            let a = std::slice::from_raw_parts(bfp as *const bf16, alen);
                            let o = std::slice::from_raw_parts_mut(obp as *mut bf16, len);
                            kern.run(Operand::BF16(a), &bp, None, OutBuf::BF16(o))
                                .expect("runs");
                        } else {
                            let a = std::slice::from_raw_parts(ap as *const f32, alen);
                            let o = std::slice::from_raw_parts_mut(op as *mut f32, len);
                            kern.run(Operand::F32(a), &bp, None, OutBuf::F32(o))
                                .expect("runs");
                        }
                    }
                }),
            ));
        }
    }
    variants.push(matrixmultiply_variant(m, k, n, &av, &w, &mut out));
    let mut best = vec![f64::INFINITY; variants.len()];
    for _ in 0..reps {
        for (i, (_, f)) in variants.iter_mut().enumerate() {
            let t0 = Instant::now();
            f();
            best[i] = best[i].min(t0.elapsed().as_secs_f64());
        }
    }
    let threads = rayon::current_num_threads();
    for ((name, _), t) in variants.iter().zip(best) {
        println!(
            "m{m} k{k} n{n} threads={threads} {name:<22} {:>7.1} GFLOP/s (best of {reps})",
            flops / t / 1e9
        );
    }
}

/// matrixmultiply's `sgemm` on the same operands (f32), as a variant to time.
fn matrixmultiply_variant(
    m: usize,
    k: usize,
    n: usize,
    av: &[f32],
    w: &[f32],
    out: &mut [f32],
) -> (String, Box<dyn FnMut()>) {
    let (ap, wp, op) = (
        av.as_ptr() as usize,
        w.as_ptr() as usize,
        out.as_mut_ptr() as usize,
    );
    (
        "matrixmultiply/f32".into(),
        Box::new(move || {
            // SAFETY: A m×k, wᵀ by strides (k×n), C m×n: main keeps them alive
            // past every run of the closure, which it runs one at a time.
            unsafe {
                matrixmultiply::sgemm(
                    m,
                    k,
                    n,
                    1.0,
                    ap as *const f32,
                    k as isize,
                    1,
                    wp as *const f32,
                    1,
                    k as isize,
                    0.0,
                    op as *mut f32,
                    n as isize,
                    1,
                );
            }
        }),
    )
}
