//! The AVX-512 micro-kernel ([`native512::ukernel`]) against a scalar reference of
//! its tile formula (bitwise: both sum `k` in order with one `mul_add` per term
//! from `0.0` or the `F_ACC` start), and against the AVX2 kernel on the part of
//! the tile it can express. Random tile sizes (`mr`, `nr` ragged), `k` with random
//! batch-reduce blocks (the last one partial), row-major, transposed and general
//! strided `A`, padded `B` rows with NaN garbage in the lanes past `nr`, f32/bf16
//! `A` and `C`, every flag combination, special values (NaN, ±inf, -0). Elements
//! outside the `A` tile are NaN (a kernel that used one would show it) and `C`
//! outside the tile must stay untouched. Skipped, with a note, on CPUs without
//! AVX-512.

use dlrm_codegen::jit::{native, native512};
use half::bf16;
use native512::{F_A_BF16, F_ACC, F_BIAS, F_C_BF16, F_RELU, MR, NR};
use proptest::prelude::*;

/// Deterministic pseudo-random values in [-1, 1), with special values mixed in
/// when `specials`.
fn vals(seed: u64, n: usize, specials: bool) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
            if specials && x.is_multiple_of(37) {
                [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 3.0e38][(x % 5) as usize]
            } else {
                v
            }
        })
        .collect()
}

/// How `A` is laid out.
#[derive(Clone, Copy, Debug)]
enum Layout {
    /// Blocks of `mr × kb_len` rows, k adjacent (`acs = 1`).
    RowMajor,
    /// Blocks of `kb_len × mr`, rows adjacent (`lda = 1`), as a packed or
    /// transposed `A`.
    Transposed,
    /// A plain row-major matrix (`a_blk = kb_len`: the blocks are contiguous).
    Contiguous,
    /// Arbitrary strides (elements may alias).
    General,
    /// Blocks of `mr` rows of this many elements (`acs = 1`), `kb_len` of each
    /// used: a blocked activation, whose widths 32, 64 and 128 the kernel reads
    /// in place with the stride a constant.
    Blocked(usize),
}

#[derive(Clone, Debug)]
struct Case {
    mr: usize,
    nr: usize,
    k: usize,
    kb_len: usize,
    layout: Layout,
    pads: (usize, usize, usize),
    ldb_pad: usize,
    ldc_pad: usize,
    flags: u32,
    specials: bool,
    seed: u64,
}

impl Case {
    /// `(lda, acs, a_blk)` in elements.
    fn strides(&self) -> (usize, usize, usize) {
        let (p0, p1, p2) = self.pads;
        match self.layout {
            Layout::RowMajor => {
                let lda = self.kb_len + p0;
                (lda, 1, self.mr * lda + p1)
            }
            Layout::Transposed => {
                let acs = self.mr + p0;
                (1, acs, self.kb_len * acs + p1)
            }
            Layout::Contiguous => (self.k.max(1) + p0, 1, self.kb_len),
            Layout::General => (p0 + 1, p1 + 1, p2),
            Layout::Blocked(w) => (w, 1, self.mr * w + p1),
        }
    }

    /// The element index of `A(r, kk)`.
    fn a_index(&self, r: usize, kk: usize) -> usize {
        let (lda, acs, a_blk) = self.strides();
        r * lda + (kk / self.kb_len) * a_blk + (kk % self.kb_len) * acs
    }
}

fn cases() -> impl Strategy<Value = Case> {
    (
        1..=MR,
        1..=NR,
        0usize..300,
        any::<u64>(),
        prop_oneof![
            Just(Layout::RowMajor),
            Just(Layout::Transposed),
            Just(Layout::Contiguous),
            Just(Layout::General),
            prop_oneof![Just(32usize), Just(64), Just(128)].prop_map(Layout::Blocked)
        ],
        (0usize..5, 0usize..40, 0usize..60),
        (0usize..3, 0usize..5),
        0u32..32,
        any::<bool>(),
        0u64..1_000_000,
    )
        .prop_map(
            |(mr, nr, k, kb, layout, pads, (ldb_pad, ldc_pad), flags, sp, seed)| Case {
                mr,
                nr,
                k,
                // 1..=k (1 when k = 0); small blocks often, to exercise the splits.
                kb_len: if k == 0 {
                    1
                } else if kb.is_multiple_of(3) {
                    k
                } else {
                    1 + (kb as usize) % k
                },
                layout,
                pads,
                ldb_pad: ldb_pad * 5,
                ldc_pad,
                flags,
                specials: sp,
                seed,
            },
        )
}

/// Bitwise equal, or both NaN (NaN payloads may differ between the hardware FMA
/// and the reference's `mul_add`).
fn same(x: f32, y: f32) -> bool {
    x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
}

/// The buffers of one case and the kernels' runs on them.
struct Problem {
    case: Case,
    /// `A` as f32 (the bf16 case: values already rounded to bf16, so widening is
    /// exact); elements outside the tile NaN.
    a: Vec<f32>,
    a_bf: Vec<bf16>,
    /// `B`: `k` rows, `ldb` apart, NaN in lanes `>= nr`.
    b: Vec<f32>,
    ldb: usize,
    bias: Vec<f32>,
    /// `C` before the call: the `F_ACC` start values in the tile, sentinels around.
    c0: Vec<f32>,
    ldc: usize,
}

impl Problem {
    fn new(case: Case) -> Problem {
        let abf = case.flags & F_A_BF16 != 0;
        let alen = if case.k == 0 {
            1
        } else {
            (0..case.mr)
                .flat_map(|r| (0..case.k).map(move |kk| (r, kk)))
                .map(|(r, kk)| case.a_index(r, kk))
                .max()
                .unwrap_or(0)
                + 1
        };
        let mut a = vec![f32::NAN; alen];
        let av = vals(case.seed, case.mr * case.k, case.specials);
        for r in 0..case.mr {
            for kk in 0..case.k {
                let v = av[r * case.k + kk];
                a[case.a_index(r, kk)] = if abf { bf16::from_f32(v).to_f32() } else { v };
            }
        }
        let a_bf = a.iter().map(|&x| bf16::from_f32(x)).collect();
        let ldb = NR + case.ldb_pad;
        let mut b = vals(case.seed + 1, case.k * ldb, false);
        for row in b.chunks_mut(ldb) {
            for x in &mut row[case.nr..] {
                *x = f32::NAN;
            }
        }
        let mut bias = vals(case.seed + 2, NR, case.specials);
        for x in &mut bias[case.nr..] {
            *x = f32::NAN;
        }
        let ldc = case.nr + case.ldc_pad;
        // One sentinel row after the tile; the tile's start values in range.
        let mut c0 = vec![-7.5f32; (case.mr + 1) * ldc + 1];
        let cv = vals(case.seed + 3, case.mr * case.nr, false);
        for r in 0..case.mr {
            for j in 0..case.nr {
                let v = cv[r * case.nr + j];
                c0[r * ldc + j] = if case.flags & F_C_BF16 != 0 {
                    bf16::from_f32(v).to_f32()
                } else {
                    v
                };
            }
        }
        Problem {
            case,
            a,
            a_bf,
            b,
            ldb,
            bias,
            c0,
            ldc,
        }
    }

    /// The expected `C` buffer (as f32; bf16 values widened).
    fn reference(&self) -> Vec<f32> {
        let c = &self.case;
        let mut out = self.c0.clone();
        for r in 0..c.mr {
            for j in 0..c.nr {
                let mut acc = if c.flags & F_ACC != 0 {
                    self.c0[r * self.ldc + j]
                } else {
                    0.0
                };
                for kk in 0..c.k {
                    acc = self.a[c.a_index(r, kk)].mul_add(self.b[kk * self.ldb + j], acc);
                }
                if c.flags & F_BIAS != 0 {
                    acc += self.bias[j];
                }
                if c.flags & F_RELU != 0 {
                    acc = if acc > 0.0 || acc.is_nan() { acc } else { 0.0 };
                }
                out[r * self.ldc + j] = if c.flags & F_C_BF16 != 0 {
                    bf16::from_f32(acc).to_f32()
                } else {
                    acc
                };
            }
        }
        out
    }

    fn a_ptr(&self) -> *const u8 {
        if self.case.flags & F_A_BF16 != 0 {
            self.a_bf.as_ptr().cast()
        } else {
            self.a.as_ptr().cast()
        }
    }

    /// Runs `kern` on a fresh copy of `c0` in the case's `C` type, returns the
    /// buffer as f32.
    fn run(&self, kern: impl FnOnce(*mut u8)) -> Vec<f32> {
        if self.case.flags & F_C_BF16 != 0 {
            let mut c: Vec<bf16> = self.c0.iter().map(|&x| bf16::from_f32(x)).collect();
            kern(c.as_mut_ptr().cast());
            c.iter().map(|x| x.to_f32()).collect()
        } else {
            let mut c = self.c0.clone();
            kern(c.as_mut_ptr().cast());
            c
        }
    }

    fn avx512(&self) -> Vec<f32> {
        let c = &self.case;
        let (lda, acs, a_blk) = c.strides();
        self.run(|cp| {
            // SAFETY: the buffers cover the tile as `ukernel` requires (A by
            // construction of `alen`, k rows of B `ldb` apart with NR floats each,
            // NR bias floats, the C tile `ldc` apart); the CPU has AVX-512.
            unsafe {
                native512::ukernel(
                    self.a_ptr(),
                    self.b.as_ptr(),
                    cp,
                    self.bias.as_ptr(),
                    c.k,
                    lda,
                    acs,
                    self.ldc,
                    c.mr,
                    c.nr,
                    c.flags,
                    self.ldb,
                    c.kb_len,
                    a_blk,
                )
            }
        })
    }

    /// The AVX2 kernel on the first `min(mr,6)` rows × `min(nr,16)` columns, if it
    /// can express the case (one `A` block, no `F_ACC`).
    fn avx2(&self) -> Option<(Vec<f32>, usize, usize)> {
        let c = &self.case;
        let (lda, acs, a_blk) = c.strides();
        if !native::available()
            || c.flags & F_ACC != 0
            || (c.k > c.kb_len && a_blk != c.kb_len * acs)
        {
            return None;
        }
        let (mr, nr) = (c.mr.min(native::MR), c.nr.min(native::NR));
        let bp: Vec<f32> = (0..c.k)
            .flat_map(|kk| (0..native::NR).map(move |j| (kk, j)))
            .map(|(kk, j)| self.b[kk * self.ldb + j])
            .collect();
        let flags = c.flags & (F_A_BF16 | F_C_BF16 | F_BIAS | F_RELU);
        let out = self.run(|cp| {
            // SAFETY: as in `avx512`, with the 16-wide panel `bp` (k rows of 16).
            unsafe {
                native::ukernel(
                    self.a_ptr(),
                    bp.as_ptr(),
                    cp,
                    self.bias.as_ptr(),
                    c.k,
                    lda,
                    acs,
                    self.ldc,
                    mr,
                    nr,
                    flags,
                    native::NR,
                    c.k.max(1),
                    0,
                )
            }
        });
        Some((out, mr, nr))
    }
}

fn check(case: Case) -> Result<(), TestCaseError> {
    let p = Problem::new(case);
    let want = p.reference();
    let got = p.avx512();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        prop_assert!(
            same(*g, *w),
            "C[{}] (row {}, col {}): got {:e}, want {:e}",
            i,
            i / p.ldc,
            i % p.ldc,
            g,
            w
        );
    }
    if let Some((avx2, mr, nr)) = p.avx2() {
        for r in 0..mr {
            for j in 0..nr {
                let i = r * p.ldc + j;
                prop_assert!(
                    same(got[i], avx2[i]),
                    "vs AVX2 at ({}, {}): {:e} vs {:e}",
                    r,
                    j,
                    got[i],
                    avx2[i]
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// The kernel gives the reference's `C` bit for bit (NaN for NaN), writes
    /// nothing outside the tile, and agrees with the AVX2 kernel.
    #[test]
    fn ukernel_matches_the_reference(case in cases()) {
        if !native512::available() {
            eprintln!("note: no AVX-512 on this CPU, native512 tests skipped");
            return Ok(());
        }
        check(case)?;
    }
}

/// Every flag combination and every tile height on one ragged shape, each `A`
/// layout, with a partial last block.
#[test]
fn every_flag_and_height() {
    if !native512::available() {
        eprintln!("note: no AVX-512 on this CPU, native512 tests skipped");
        return;
    }
    for flags in 0..32 {
        for mr in 1..=MR {
            for (layout, nr) in [
                (Layout::RowMajor, 32),
                (Layout::Transposed, 17),
                (Layout::Contiguous, 16),
                (Layout::General, 5),
                (Layout::Blocked(32), 31),
                (Layout::Blocked(64), 32),
                (Layout::Blocked(128), 9),
            ] {
                let case = Case {
                    mr,
                    nr,
                    k: 37,
                    kb_len: 10,
                    layout,
                    pads: (1, 3, 7),
                    ldb_pad: 3,
                    ldc_pad: 2,
                    flags,
                    specials: flags % 3 == 0,
                    seed: (flags as u64) * 100 + mr as u64,
                };
                if let Err(e) = check(case.clone()) {
                    panic!("{case:?}: {e}");
                }
            }
        }
    }
}

/// The symbol and the contract constants the loop nest relies on.
#[test]
fn symbol_and_detection() {
    assert_eq!(native512::UKERNEL_SYMBOL, "dlrm_gemm_ukernel_avx512_12x32");
    assert_eq!(
        native512::ukernel_ptr().is_some(),
        native512::available(),
        "a pointer exactly when the CPU can run it"
    );
}
