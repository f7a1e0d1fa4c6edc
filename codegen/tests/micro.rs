//! The micro-kernel battery: the same checks on every kernel of the registry
//! ([`micro::KERNELS`]), each through its registered entry and one
//! [`TileArgs`], skipped with a note on CPUs without the kernel's features.
//!
//! Every kernel is checked against a scalar reference of the tile formula, on
//! random ragged tiles (`mr`, `nr`), `k` with random batch-reduce blocks (the
//! last one partial), f32/bf16 `A` and `C`, every flag combination, elements of
//! `A` outside the tile NaN (a kernel that used one would show it) and `C`
//! outside the tile checked untouched:
//! - the kernels that read f32 `B` rows ([`BPacking::F32`]: one FMA per term in
//!   `k` order) bit for bit against a `mul_add` reference from `0.0` or the
//!   `F_ACC` start, on row-major, transposed, contiguous, general strided and
//!   blocked (widths 32/64/96/128/160/192) `A`, `B` rows padded with NaN garbage in the
//!   lanes past `nr`, special values (NaN, ±inf, -0); and bit for bit against
//!   each other kernel of that kind on the part of the tile both express;
//!   a kernel that reads a bf16 `B` in place (`F_B_BF16`, f32 `A`) bit for
//!   bit against itself on the f32 `B` of the same values;
//! - the kernels that read `B` in k pairs ([`BPacking::KPairs`]: the AVX-512
//!   BF16 dot product and the AMX-BF16 tiles) against an f64 reference,
//!   within 1e-5 of the sum of the terms' magnitudes (plus a bf16 step for
//!   bf16 `C`), NaN for NaN, on bf16 `A` row-major per block, `k` odd and
//!   even, one block, blocks of even length and of 32/64/96 steps, the
//!   blocked widths 32/64/96/128/160/192 and other row strides, full and ragged tiles,
//!   some `A` elements NaN; plus their packing and layout rules. Why a
//!   tolerance: the products of two bf16 are exact in f32, but `vdpbf16ps`
//!   adds the two of a pair into the accumulator in its own order and
//!   `tdpbf16ps` sums 32 k steps in the hardware's order (Intel's pseudocode
//!   adds them one by one; on this CPU about 10% of random sums differed in
//!   the last bit from a sequential `mul_add` and from pairwise sums); both
//!   treat denormal inputs as zero and flush denormal results, which the
//!   reference does not. With `k < 300`, values in [-1, 1) and no denormals,
//!   the rounding errors (about √k·2⁻²⁴ of the magnitudes, at worst k·2⁻²⁴)
//!   stay under 1e-5 of the magnitudes in practice.

use dlrm_codegen::jit::micro::{
    self, BPacking, F_A_BF16, F_ACC, F_B_BF16, F_BIAS, F_C_BF16, F_MASK, F_RELU, MicroKernel,
    TileArgs,
};
use half::bf16;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;

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

/// Whether the CPU runs `kern`; prints the skip note otherwise.
fn runs(kern: &MicroKernel) -> bool {
    let ok = kern.available();
    if !ok {
        let feats: Vec<&str> = (kern.features.iter())
            .filter(|f| !f.detected())
            .map(|f| f.name())
            .collect();
        eprintln!(
            "note: this CPU lacks {} for the {} micro-kernel: its tests skipped",
            feats.join("+"),
            kern.name
        );
    }
    ok
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
    /// used: a blocked activation, whose widths 32 to 192 the kernels
    /// read in place with the stride a constant.
    Blocked(usize),
    /// Given strides `(lda, a_blk)`, `acs = 1` (the k-pair kernel's cases).
    Strided(usize, usize),
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
            Layout::Strided(lda, a_blk) => (lda, 1, a_blk),
        }
    }

    /// The element index of `A(r, kk)`.
    fn a_index(&self, r: usize, kk: usize) -> usize {
        let (lda, acs, a_blk) = self.strides();
        r * lda + (kk / self.kb_len) * a_blk + (kk % self.kb_len) * acs
    }
}

/// Random cases for an FMA kernel ([`BPacking::F32`]) of tile `mr × nr`.
fn fma_cases(mr: usize, nr: usize) -> impl Strategy<Value = Case> {
    (
        1..=mr,
        1..=nr,
        0usize..300,
        any::<u64>(),
        prop_oneof![
            Just(Layout::RowMajor),
            Just(Layout::Transposed),
            Just(Layout::Contiguous),
            Just(Layout::General),
            prop_oneof![
                Just(32usize),
                Just(64),
                Just(96),
                Just(128),
                Just(160),
                Just(192)
            ]
            .prop_map(Layout::Blocked)
        ],
        (0usize..5, 0usize..40, 0usize..60),
        (0usize..3, 0usize..5),
        0u32..64,
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

/// Random cases for a k-pair kernel ([`BPacking::KPairs`]) of tile `mr × nr`:
/// bf16 `A`, row-major per block, one block, blocks of an even length, or
/// blocks of 32, 64 or 96 steps (the AMX kernel's in-place chunks); the full
/// tile height a third of the time; with `specials`, some `A` elements NaN.
fn pair_cases(mr: usize, nr: usize) -> impl Strategy<Value = Case> {
    (
        prop_oneof![Just(mr), 1..=mr],
        1..=nr,
        0usize..300,
        (0u8..3, 1usize..40),
        prop_oneof![
            Just(0usize),
            Just(32),
            Just(64),
            Just(96),
            Just(128),
            Just(160),
            Just(192),
            1usize..9
        ],
        (0usize..50, 0usize..3),
        0u32..64,
        any::<bool>(),
        0u64..1_000_000,
    )
        .prop_map(
            |(mr, nr, k, (blocks, half), width, (blk_pad, ldc_pad), flags, specials, seed)| {
                let kb_len = match blocks {
                    _ if k == 0 => 1,
                    0 => k,
                    1 => (2 * half).min(k.max(2)),
                    _ => 32 * (1 + half % 3),
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
                    layout: Layout::Strided(lda, mr * lda + blk_pad),
                    pads: (0, 0, 0),
                    ldb_pad: 0,
                    ldc_pad,
                    flags: (flags & (F_BIAS | F_RELU | F_C_BF16 | F_ACC | F_MASK)) | F_A_BF16,
                    specials,
                    seed,
                }
            },
        )
}

/// The case strategy for `kern`'s kind.
fn cases(kern: &MicroKernel) -> BoxedStrategy<Case> {
    let masks = kern.masks;
    let without_mask = move |mut c: Case| {
        if !masks {
            c.flags &= !F_MASK;
        }
        c
    };
    match kern.b_packing {
        BPacking::F32 => fma_cases(kern.mr, kern.nr).prop_map(without_mask).boxed(),
        BPacking::KPairs => pair_cases(kern.mr, kern.nr).prop_map(without_mask).boxed(),
    }
}

/// Whether [`F_MASK`] keeps an element whose mask element is `m`: `m > 0`
/// (NaN: not).
fn kept(m: f32) -> bool {
    m.partial_cmp(&0.0) == Some(std::cmp::Ordering::Greater)
}

/// Bitwise equal, or both NaN (NaN payloads may differ between the hardware FMA
/// and the reference's `mul_add`).
fn same(x: f32, y: f32) -> bool {
    x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
}

/// The buffers of one case for one kernel, and the kernels' runs on them.
struct Problem {
    case: Case,
    /// `A` as f32 (the bf16 case: values already rounded to bf16, so widening is
    /// exact); elements outside the tile NaN.
    a: Vec<f32>,
    a_bf: Vec<bf16>,
    /// `B` as the kernel reads it: `F32`, `k` rows `ldb` apart, NaN in lanes
    /// `>= nr`; `KPairs`, `⌈k/2⌉` rows of `nr_kernel` words of k pairs (at
    /// least one row).
    b: Vec<f32>,
    ldb: usize,
    /// `B` as `k × nr` f32 values (row stride `ldb_vals`), for the reference.
    b_vals: Vec<f32>,
    ldb_vals: usize,
    /// The kernel's `nr` readable floats, NaN past the tile (F32 kind).
    bias: Vec<f32>,
    /// `C` before the call: the `F_ACC` start values in the tile (bf16-exact
    /// with `F_C_BF16`), sentinels around.
    c0: Vec<f32>,
    ldc: usize,
    /// The [`F_MASK`] operand, laid out as `c0` (bf16-exact): positive,
    /// negative, ±0, ±inf and NaN elements.
    mask: Vec<f32>,
}

impl Problem {
    fn new(kern: &MicroKernel, case: Case) -> Problem {
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
        // A k-pair kernel's specials: some `A` elements NaN (infinities could
        // meet zeros of the padding: the reference would not say which NaN).
        let pairs = kern.b_packing == BPacking::KPairs;
        let mut av = vals(case.seed, case.mr * case.k, case.specials && !pairs);
        if pairs && case.specials {
            for x in av.iter_mut().step_by(41) {
                *x = f32::NAN;
            }
        }
        for r in 0..case.mr {
            for kk in 0..case.k {
                let v = av[r * case.k + kk];
                a[case.a_index(r, kk)] = if abf { bf16::from_f32(v).to_f32() } else { v };
            }
        }
        let a_bf = a.iter().map(|&x| bf16::from_f32(x)).collect();
        let (b, ldb, b_vals, ldb_vals) = match kern.b_packing {
            BPacking::F32 => {
                let ldb = kern.nr + case.ldb_pad;
                let mut b = vals(case.seed + 1, case.k * ldb, false);
                for row in b.chunks_mut(ldb) {
                    for x in &mut row[case.nr..] {
                        *x = f32::NAN;
                    }
                }
                (b.clone(), ldb, b, ldb)
            }
            BPacking::KPairs => {
                // k × nr bf16, packed into one panel of the kernel's width.
                let (k, nr) = (case.k, case.nr);
                let bv: Vec<bf16> = vals(case.seed + 1, k * nr, false)
                    .into_iter()
                    .map(bf16::from_f32)
                    .collect();
                let mut bp = vec![0.0f32; k.div_ceil(2) * kern.nr];
                micro::avx512bf16::pack_b_pairs_into(&mut bp, &bv, (k, nr, nr, 1), kern.nr);
                if k == 0 {
                    bp.resize(kern.nr, 0.0);
                }
                let b_vals = bv.iter().map(|x| x.to_f32()).collect();
                (bp, kern.nr, b_vals, nr)
            }
        };
        let mut bias = vals(case.seed + 2, kern.nr, case.specials && !pairs);
        if kern.b_packing == BPacking::F32 {
            for x in &mut bias[case.nr..] {
                *x = f32::NAN;
            }
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
        let specials = [
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1e-30,
            -1e-30,
        ];
        let mask = vals(case.seed + 4, c0.len(), false)
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                bf16::from_f32(if i % 5 == 0 {
                    specials[i / 5 % specials.len()]
                } else {
                    v
                })
                .to_f32()
            })
            .collect();
        Problem {
            case,
            a,
            a_bf,
            b,
            ldb,
            b_vals,
            ldb_vals,
            bias,
            c0,
            ldc,
            mask,
        }
    }

    /// The expected `C` buffer (as f32; bf16 values widened) of an FMA kernel.
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
                    acc =
                        self.a[c.a_index(r, kk)].mul_add(self.b_vals[kk * self.ldb_vals + j], acc);
                }
                if c.flags & F_BIAS != 0 {
                    acc += self.bias[j];
                }
                if c.flags & F_RELU != 0 {
                    acc = if acc > 0.0 || acc.is_nan() { acc } else { 0.0 };
                }
                if c.flags & F_MASK != 0 && !kept(self.mask[r * self.ldc + j]) {
                    acc = 0.0;
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

    /// Runs `kern` on the `mr × nr` corner of the case's tile (on a fresh copy
    /// of `c0` in the case's `C` type) with `flags`, returns the buffer as f32.
    fn run(&self, kern: &MicroKernel, tile: (usize, usize), flags: u32) -> Vec<f32> {
        self.run_b(kern, tile, flags, self.b.as_ptr())
    }

    /// [`Problem::run`] with `B` at `b` (its rows `ldb` elements apart: bf16
    /// with [`F_B_BF16`]).
    fn run_b(
        &self,
        kern: &MicroKernel,
        (mr, nr): (usize, usize),
        flags: u32,
        b: *const f32,
    ) -> Vec<f32> {
        let c = &self.case;
        let (lda, acs, a_blk) = c.strides();
        let mask_bf: Vec<bf16> = self.mask.iter().map(|&x| bf16::from_f32(x)).collect();
        let call = |cp: *mut u8| {
            let mp: *const u8 = if c.flags & F_C_BF16 != 0 {
                mask_bf.as_ptr().cast()
            } else {
                self.mask.as_ptr().cast()
            };
            let args = TileArgs {
                a: self.a_ptr(),
                b,
                c: cp,
                bias: self.bias.as_ptr(),
                k: c.k,
                lda,
                acs,
                ldc: self.ldc,
                ldb: self.ldb,
                kb: c.kb_len,
                a_blk,
                mr,
                nr,
                flags,
                mask: (mp as isize).wrapping_sub(cp as isize),
            };
            // SAFETY: the buffers cover the tile as the kernels require (A by
            // construction of `alen`, the B rows `ldb` apart with the kernel's
            // `nr` words each, its `nr` bias floats, the C tile `ldc` apart,
            // the mask laid out as C);
            // the callers checked the CPU features and the layout.
            unsafe { kern.call(&args) }
        };
        if c.flags & F_C_BF16 != 0 {
            let mut cb: Vec<bf16> = self.c0.iter().map(|&x| bf16::from_f32(x)).collect();
            call(cb.as_mut_ptr().cast());
            cb.iter().map(|x| x.to_f32()).collect()
        } else {
            let mut cf = self.c0.clone();
            call(cf.as_mut_ptr().cast());
            cf
        }
    }
}

/// An FMA kernel against the bitwise reference, and against every other
/// available FMA kernel that can read the same `B` rows on the common corner.
fn check_fma(kern: &MicroKernel, case: Case) -> Result<(), TestCaseError> {
    let p = Problem::new(kern, case);
    let c = &p.case;
    let want = p.reference();
    let got = p.run(kern, (c.mr, c.nr), c.flags);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        prop_assert!(
            same(*g, *w),
            "{}: C[{}] (row {}, col {}): got {:e}, want {:e}",
            kern.name,
            i,
            i / p.ldc,
            i % p.ldc,
            g,
            w
        );
    }
    for other in micro::KERNELS {
        if other.name == kern.name
            || other.b_packing != BPacking::F32
            || !other.available()
            || other.nr > p.ldb
            || (c.flags & F_MASK != 0 && !other.masks)
        {
            continue;
        }
        let (mr, nr) = (c.mr.min(other.mr), c.nr.min(other.nr));
        let theirs = p.run(other, (mr, nr), c.flags);
        for r in 0..mr {
            for j in 0..nr {
                let i = r * p.ldc + j;
                prop_assert!(
                    same(got[i], theirs[i]),
                    "{} vs {} at ({}, {}): {:e} vs {:e}",
                    kern.name,
                    other.name,
                    r,
                    j,
                    got[i],
                    theirs[i]
                );
            }
        }
    }
    Ok(())
}

/// A k-pair kernel against the f64 reference (within reassociation), `C`
/// outside the tile untouched.
fn check_pairs(kern: &MicroKernel, case: Case) -> Result<(), TestCaseError> {
    let p = Problem::new(kern, case);
    let c = &p.case;
    let (mr, nr, k) = (c.mr, c.nr, c.k);
    let cbf = c.flags & F_C_BF16 != 0;
    let got = p.run(kern, (mr, nr), c.flags);
    for r in 0..=mr {
        for j in 0..p.ldc {
            let i = r * p.ldc + j;
            if r == mr || j >= nr {
                prop_assert_eq!(
                    got[i].to_bits(),
                    p.c0[i].to_bits(),
                    "{:?}: C outside the tile at {},{}",
                    c,
                    r,
                    j
                );
                continue;
            }
            let mut sum = 0.0f64;
            let mut mag = 0.0f64;
            if c.flags & F_ACC != 0 {
                sum += f64::from(p.c0[i]);
                mag += f64::from(p.c0[i]).abs();
            }
            for kk in 0..k {
                let t = f64::from(p.a[c.a_index(r, kk)]) * f64::from(p.b_vals[kk * p.ldb_vals + j]);
                sum += t;
                mag += t.abs();
            }
            if c.flags & F_BIAS != 0 {
                sum += f64::from(p.bias[j]);
                mag += f64::from(p.bias[j]).abs();
            }
            if c.flags & F_RELU != 0 && sum <= 0.0 {
                sum = 0.0;
            }
            let g = f64::from(got[i]);
            if c.flags & F_MASK != 0 && !kept(p.mask[i]) {
                // Masked: +0 whatever the sum (NaN included).
                prop_assert_eq!(got[i].to_bits(), 0, "{:?}: C[{}][{}] masked", c, r, j);
                continue;
            }
            if sum.is_nan() {
                // A NaN of `A` in the row (kept through relu and bf16).
                prop_assert!(g.is_nan(), "{:?}: C[{}][{}] = {}, want NaN", c, r, j, g);
                continue;
            }
            let tol = 1e-5 * mag + if cbf { sum.abs() / 128.0 } else { 0.0 } + 1e-30;
            prop_assert!(
                (g - sum).abs() <= tol,
                "{:?}: C[{}][{}] = {}, want {} (tolerance {})",
                c,
                r,
                j,
                g,
                sum,
                tol
            );
        }
    }
    Ok(())
}

/// A kernel that reads a bf16 `B` in place ([`F_B_BF16`], with an f32 `A`):
/// the bits it gives on the f32 `B` of the same (bf16-exact) values, the
/// garbage lanes past `nr` too.
fn check_bf16_b(kern: &MicroKernel, case: Case) -> Result<(), TestCaseError> {
    let mut p = Problem::new(kern, case);
    for x in &mut p.b {
        *x = bf16::from_f32(*x).to_f32();
    }
    let b16: Vec<bf16> = p.b.iter().map(|&x| bf16::from_f32(x)).collect();
    let c = &p.case;
    let want = p.run(kern, (c.mr, c.nr), c.flags);
    let got = p.run_b(kern, (c.mr, c.nr), c.flags | F_B_BF16, b16.as_ptr().cast());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        prop_assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "{} with bf16 B: C[{}]: got {:e}, want {:e}",
            kern.name,
            i,
            g,
            w
        );
    }
    Ok(())
}

/// One case on `kern`, by its kind (and with a bf16 `B` where the kernel
/// reads one and `A` is f32).
fn check(kern: &MicroKernel, case: Case) -> Result<(), TestCaseError> {
    let bf16_b = kern.reads_bf16_b && case.flags & F_A_BF16 == 0;
    match kern.b_packing {
        BPacking::F32 if bf16_b => {
            check_fma(kern, case.clone())?;
            check_bf16_b(kern, case)
        }
        BPacking::F32 => check_fma(kern, case),
        BPacking::KPairs => check_pairs(kern, case),
    }
}

/// Every flag combination and every tile height on a few ragged shapes, with
/// a partial last block: each `A` layout for an FMA kernel, row-major bf16
/// blocks (blocked widths and others) for a k-pair one.
fn every_flag_and_height(kern: &MicroKernel) {
    let half = kern.nr / 2;
    let shapes: Vec<(Layout, usize)> = match kern.b_packing {
        BPacking::F32 => vec![
            (Layout::RowMajor, kern.nr),
            (Layout::Transposed, half + 1),
            (Layout::Contiguous, half),
            (Layout::General, 5),
            (Layout::Blocked(32), kern.nr - 1),
            (Layout::Blocked(64), kern.nr),
            (Layout::Blocked(128), 9),
        ],
        BPacking::KPairs => vec![
            (Layout::Strided(32, 32 * 12 + 3), kern.nr),
            (Layout::Strided(64, 64 * 12), half + 1),
            (Layout::Strided(128, 128 * 12 + 1), 9),
            (Layout::Strided(13, 13 * 12 + 5), kern.nr - 1),
        ],
    };
    // (k, kb_len): a partial last block; for a k-pair kernel also blocks of
    // 32 steps with an odd tail, and one block of whole 32-step chunks.
    let ks: &[(usize, usize)] = match kern.b_packing {
        BPacking::F32 => &[(37, 10)],
        BPacking::KPairs => &[(37, 10), (71, 32), (64, 64)],
    };
    let all = if kern.masks { 64 } else { 32 };
    for flags in 0..all {
        let flags = match kern.b_packing {
            BPacking::F32 => flags,
            BPacking::KPairs => flags | F_A_BF16,
        };
        for mr in 1..=kern.mr {
            for (&(layout, nr), &(k, kb_len)) in
                shapes.iter().flat_map(|s| ks.iter().map(move |kk| (s, kk)))
            {
                let case = Case {
                    mr,
                    nr,
                    k,
                    kb_len,
                    layout,
                    pads: (1, 3, 7),
                    ldb_pad: 3,
                    ldc_pad: 2,
                    flags,
                    specials: flags % 3 == 0,
                    seed: u64::from(flags) * 100 + mr as u64,
                };
                if let Err(e) = check(kern, case.clone()) {
                    panic!("{}: {case:?}: {e}", kern.name);
                }
            }
        }
    }
}

/// The registry row's contract with the loop nest.
fn registry_row(kern: &MicroKernel) {
    assert!(kern.mr >= 1 && kern.nr >= 1, "{}: an empty tile", kern.name);
    assert_eq!(
        kern.entry_ptr().is_some(),
        kern.available(),
        "{}: a pointer exactly when the CPU can run it",
        kern.name
    );
    assert!(
        kern.symbol.starts_with("dlrm_gemm_ukernel_")
            && kern.symbol.ends_with(&format!("_{}x{}", kern.mr, kern.nr)),
        "{}: the symbol {} names the tile",
        kern.name,
        kern.symbol
    );
    assert!(!kern.features.is_empty(), "{}: no CPU feature", kern.name);
}

/// The battery of each named registry row: one module of tests per kernel.
macro_rules! battery {
    ($($module:ident => $kernel:expr),* $(,)?) => {
        $(mod $module {
            use super::*;

            fn kern() -> &'static MicroKernel {
                $kernel
            }

            /// The kernel gives the reference's `C` (bit for bit for the FMA
            /// kernels, NaN for NaN) and writes nothing outside the tile, on
            /// 400 random cases.
            #[test]
            fn matches_the_reference() {
                if !runs(kern()) {
                    return;
                }
                let mut runner = TestRunner::new(ProptestConfig::with_cases(400));
                if let Err(e) = runner.run(&cases(kern()), |case| check(kern(), case)) {
                    panic!("{}: {e}", kern().name);
                }
            }

            #[test]
            fn every_flag_and_height() {
                if runs(kern()) {
                    super::every_flag_and_height(kern());
                }
            }

            #[test]
            fn registry_row() {
                super::registry_row(kern());
            }
        })*

        /// Every registered kernel has a battery here.
        #[test]
        fn every_registered_kernel_has_a_battery() {
            let tested = [$($kernel.name),*];
            for k in micro::KERNELS {
                assert!(tested.contains(&k.name), "{}: no battery", k.name);
            }
            assert_eq!(tested.len(), micro::KERNELS.len());
        }
    };
}

battery! {
    avx2 => &micro::AVX2,
    avx512 => &micro::AVX512,
    avx512bf16 => &micro::AVX512_BF16,
    amxbf16 => &micro::AMX_BF16,
}

/// The symbols the JIT modules import (stable names: other tools grep them).
#[test]
fn symbols() {
    assert_eq!(micro::AVX2.symbol, "dlrm_gemm_ukernel_avx2_6x16");
    assert_eq!(micro::AVX512.symbol, "dlrm_gemm_ukernel_avx512_12x32");
    assert_eq!(
        micro::AVX512_BF16.symbol,
        "dlrm_gemm_ukernel_avx512bf16_12x32"
    );
    assert_eq!(micro::AMX_BF16.symbol, "dlrm_gemm_ukernel_amxbf16_32x32");
}

/// The k-pair kernel's `A` rule: pairs never straddle two blocks (even blocks,
/// or one block), row-major within a block, bf16.
#[test]
fn k_pair_layout_rules() {
    use micro::avx512bf16::fits;
    assert!(fits(64, 1, 32) && fits(13, 1, 13) && fits(13, 1, 0));
    assert!(!fits(64, 1, 13) && !fits(64, 2, 32));
    for k in [&micro::AVX512_BF16, &micro::AMX_BF16] {
        assert!(k.fits(true, 64, 1, 32) && !k.fits(false, 64, 1, 32));
        assert!(k.fits(true, 71, 1, 10) && !k.fits(true, 71, 1, 11));
    }
    assert!(micro::AVX2.fits(false, 64, 3, 7) && micro::AVX512.fits(true, 64, 3, 7));
}

#[test]
fn pair_packing_puts_even_steps_low_and_pads_with_zero() {
    // k = 3, n = 2 (row-major), one panel of 4 columns.
    let b: Vec<bf16> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]
        .iter()
        .map(|&x| bf16::from_f32(x))
        .collect();
    let mut dst = vec![f32::NAN; 2 * 4];
    micro::avx512bf16::pack_b_pairs_into(&mut dst, &b, (3, 2, 2, 1), 4);
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
    assert_eq!(BPacking::KPairs.rows(3), 2);
    assert_eq!(BPacking::F32.rows(3), 3);
}

#[test]
fn pair_packing_of_rows_matches_packing_of_columns() {
    // The same `k × n` matrix row-major (`cs = 1`: the slice path) and
    // transposed (`rs = 1`: the general one), odd and even k, ragged panels.
    for (k, n, nr) in [
        (1, 1, 32),
        (3, 5, 32),
        (64, 64, 32),
        (37, 70, 32),
        (10, 33, 16),
    ] {
        let v = vals(k as u64 * 7 + n as u64, k * n, true);
        let rows: Vec<bf16> = v.iter().map(|&x| bf16::from_f32(x)).collect();
        let cols: Vec<bf16> = (0..n * k).map(|i| rows[(i % k) * n + i / k]).collect();
        let len = n.div_ceil(nr) * k.div_ceil(2) * nr;
        let (mut a, mut b) = (vec![f32::NAN; len], vec![f32::NAN; len]);
        micro::avx512bf16::pack_b_pairs_into(&mut a, &rows, (k, n, n, 1), nr);
        micro::avx512bf16::pack_b_pairs_into(&mut b, &cols, (k, n, 1, k), nr);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&b), "k {k} n {n} nr {nr}");
    }
}

/// A bf16 `C` of subnormal values is rounded as `half` rounds them, bit for
/// bit, on every FMA kernel: the AVX-512 store's `vcvtneps2bf16` flushes
/// subnormal inputs to zero, so a vector holding one must take the integer
/// rounding. Row 0 of the tile is normal-sized, the others' sums (37 products
/// of 1e-20 by 1e-20) subnormal.
#[test]
fn bf16_c_keeps_subnormal_results() {
    for kern in micro::KERNELS
        .iter()
        .filter(|k| k.b_packing == BPacking::F32 && k.available())
    {
        let case = Case {
            mr: kern.mr,
            nr: kern.nr,
            k: 37,
            kb_len: 10,
            layout: Layout::RowMajor,
            pads: (1, 3, 7),
            ldb_pad: 3,
            ldc_pad: 2,
            flags: F_C_BF16,
            specials: false,
            seed: 5,
        };
        let mut p = Problem::new(kern, case.clone());
        for r in 0..case.mr {
            for kk in 0..case.k {
                let i = case.a_index(r, kk);
                p.a[i] = if r == 0 { 0.5 } else { 1e-20 };
                p.a_bf[i] = bf16::from_f32(p.a[i]);
            }
        }
        for row in 0..case.k {
            for j in 0..case.nr {
                p.b[row * p.ldb + j] = 1e-20;
                p.b_vals[row * p.ldb_vals + j] = 1e-20;
            }
        }
        let want = p.reference();
        let tiny = want
            .iter()
            .filter(|x| x.is_subnormal() && **x != 0.0)
            .count();
        assert!(tiny > 0, "{}: no subnormal result to check", kern.name);
        let got = p.run(kern, (case.mr, case.nr), case.flags);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(same(*g, *w), "{}: C[{i}]: got {g:e}, want {w:e}", kern.name);
        }
    }
}
