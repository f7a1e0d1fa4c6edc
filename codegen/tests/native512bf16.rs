//! The AVX-512 BF16 micro-kernel ([`native512bf16::ukernel`]) and its `B`
//! packing against a scalar reference of the tile formula in f64 (the kernel
//! pairs the k steps, so it agrees up to reassociation: within 1e-5 of the sum
//! of the terms' magnitudes), on random ragged tiles (`mr`, `nr`), `k` odd and
//! even, batch-reduce blocks of even length (the last one partial), the
//! blocked widths 32/64/128 and other row strides, f32/bf16 `C`, every flag.
//! Elements of `A` outside the tile are NaN (a kernel that used one would show
//! it), and `C` outside the tile must stay untouched. Skipped, with a note, on
//! CPUs without AVX512_BF16.

use dlrm_codegen::jit::native512bf16::{
    self as bf, F_A_BF16, F_ACC, F_BIAS, F_C_BF16, F_RELU, MR, NR,
};
use half::bf16;
use proptest::prelude::*;

mod common;
use common::vals;

#[derive(Clone, Debug)]
struct Case {
    mr: usize,
    nr: usize,
    k: usize,
    /// Batch-reduce block length: even, or all of `k`.
    kb_len: usize,
    /// Row stride of `A` (elements, `>= kb_len`).
    lda: usize,
    /// Elements between `A` blocks (`>= mr·lda`).
    a_blk: usize,
    ldc_pad: usize,
    flags: u32,
    seed: u64,
}

fn cases() -> impl Strategy<Value = Case> {
    (
        1..=MR,
        1..=NR,
        0usize..300,
        (any::<bool>(), 1usize..40),
        prop_oneof![Just(0usize), Just(32), Just(64), Just(128), 1usize..9],
        (0usize..50, 0usize..3),
        0u32..32,
        0u64..1_000_000,
    )
        .prop_map(
            |(mr, nr, k, (one_block, half), width, (blk_pad, ldc_pad), flags, seed)| {
                let kb_len = if one_block || k == 0 {
                    k.max(1)
                } else {
                    (2 * half).min(k.max(2))
                };
                // A blocked width when it holds the block, else a few elements more.
                let lda = if width >= kb_len && width >= 32 {
                    width
                } else {
                    kb_len + width % 9
                };
                Case {
                    mr,
                    nr,
                    k,
                    kb_len,
                    lda,
                    a_blk: mr * lda + blk_pad,
                    ldc_pad,
                    flags: (flags & (F_BIAS | F_RELU | F_C_BF16 | F_ACC)) | F_A_BF16,
                    seed,
                }
            },
        )
}

/// The element index of `A(r, kk)`.
fn a_index(c: &Case, r: usize, kk: usize) -> usize {
    r * c.lda + (kk / c.kb_len) * c.a_blk + kk % c.kb_len
}

fn run_case(c: &Case) {
    let Case { mr, nr, k, .. } = *c;
    // A: NaN everywhere but the tile.
    let a_len = if k == 0 {
        1
    } else {
        a_index(c, mr - 1, k - 1) + 1
    };
    let mut a = vec![bf16::NAN; a_len];
    let av = vals(c.seed, mr * k);
    for r in 0..mr {
        for kk in 0..k {
            a[a_index(c, r, kk)] = bf16::from_f32(av[r * k + kk]);
        }
    }
    // B: k × nr bf16, packed into one panel of NR columns in k pairs.
    let b: Vec<bf16> = vals(c.seed + 1, k * nr)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    let mut bp = vec![0.0f32; k.div_ceil(2) * NR];
    bf::pack_b_pairs_into(&mut bp, &b, (k, nr, nr, 1), NR);
    if k == 0 {
        bp.resize(NR, 0.0);
    }
    let bias: Vec<f32> = vals(c.seed + 2, NR);
    let ldc = nr + c.ldc_pad;
    let cbf = c.flags & F_C_BF16 != 0;
    let start = vals(c.seed + 3, mr * ldc);
    let sentinel = 7.5f32;
    // C: the F_ACC start in the tile, a sentinel around it.
    let c0: Vec<f32> = (0..mr * ldc)
        .map(|i| if i % ldc < nr { start[i] } else { sentinel })
        .collect();
    let mut c32 = c0.clone();
    let mut c16: Vec<bf16> = c0.iter().map(|&x| bf16::from_f32(x)).collect();
    let cptr: *mut u8 = if cbf {
        c16.as_mut_ptr().cast()
    } else {
        c32.as_mut_ptr().cast()
    };
    // SAFETY: A covers every A(r,kk) of the tile, B ⌈k/2⌉ rows of NR words (at
    // least one row), the bias NR f32, C the mr × nr tile with row stride ldc;
    // the CPU has the features (checked by the caller).
    unsafe {
        bf::ukernel(
            a.as_ptr().cast(),
            bp.as_ptr(),
            cptr,
            bias.as_ptr(),
            k,
            c.lda,
            1,
            ldc,
            mr,
            nr,
            c.flags,
            NR,
            c.kb_len,
            c.a_blk,
        );
    }
    let got: Vec<f32> = if cbf {
        c16.iter().map(|x| x.to_f32()).collect()
    } else {
        c32
    };
    for r in 0..mr {
        for j in 0..ldc {
            let i = r * ldc + j;
            if j >= nr {
                let want = if cbf {
                    bf16::from_f32(sentinel).to_f32()
                } else {
                    sentinel
                };
                assert_eq!(
                    got[i].to_bits(),
                    want.to_bits(),
                    "{c:?}: C outside the tile at {r},{j}"
                );
                continue;
            }
            let mut sum = 0.0f64;
            let mut mag = 0.0f64;
            if c.flags & F_ACC != 0 {
                let s = if cbf {
                    bf16::from_f32(c0[i]).to_f32()
                } else {
                    c0[i]
                };
                sum += f64::from(s);
                mag += f64::from(s).abs();
            }
            for kk in 0..k {
                let t =
                    f64::from(a[a_index(c, r, kk)].to_f32()) * f64::from(b[kk * nr + j].to_f32());
                sum += t;
                mag += t.abs();
            }
            if c.flags & F_BIAS != 0 {
                sum += f64::from(bias[j]);
                mag += f64::from(bias[j]).abs();
            }
            if c.flags & F_RELU != 0 && sum <= 0.0 {
                sum = 0.0;
            }
            let tol = 1e-5 * mag + if cbf { sum.abs() / 128.0 } else { 0.0 } + 1e-30;
            let g = f64::from(got[i]);
            assert!(
                (g - sum).abs() <= tol,
                "{c:?}: C[{r}][{j}] = {g}, want {sum} (tolerance {tol})"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_bf16_tile_is_its_formula(c in cases()) {
        if bf::available() {
            run_case(&c);
        }
    }
}

#[test]
fn availability_and_layout_rules() {
    if !bf::available() {
        eprintln!("note: no AVX512_BF16 on this CPU, native512bf16 tests skipped");
    }
    assert_eq!(bf::ukernel_ptr().is_some(), bf::available());
    // Pairs never straddle two blocks: even blocks, or one block.
    assert!(bf::fits(64, 1, 32) && bf::fits(13, 1, 13) && bf::fits(13, 1, 0));
    assert!(!bf::fits(64, 1, 13) && !bf::fits(64, 2, 32));
}

#[test]
fn pair_packing_puts_even_steps_low_and_pads_with_zero() {
    // k = 3, n = 2 (row-major), one panel of 4 columns.
    let b: Vec<bf16> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]
        .iter()
        .map(|&x| bf16::from_f32(x))
        .collect();
    let mut dst = vec![f32::NAN; 2 * 4];
    bf::pack_b_pairs_into(&mut dst, &b, (3, 2, 2, 1), 4);
    let word = |lo: f32, hi: f32| {
        u32::from(bf16::from_f32(lo).to_bits()) | (u32::from(bf16::from_f32(hi).to_bits()) << 16)
    };
    let bits: Vec<u32> = dst.iter().map(|x| x.to_bits()).collect();
    assert_eq!(
        bits,
        vec![
            word(1.0, 3.0),
            word(2.0, 4.0),
            0,
            0,
            word(5.0, 0.0),
            word(6.0, 0.0),
            0,
            0
        ]
    );
}
