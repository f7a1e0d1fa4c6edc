//! The GEMM core: a JIT-compiled, register-blocked batch-reduce GEMM loop nest.
//!
//! One kernel computes `C[m×n] = epilogue(A[m×k] · B[k×n])` for a fixed
//! [`GemmSpec`] (shapes, strides, dtypes, epilogue and micro-kernel are all
//! compile-time constants of the generated code):
//! - `A` is strided: element `(i, kk)` at `a[i·lda + kk·acs]` (row-major `acs = 1`,
//!   or a transposed view `lda = 1` as in wgrad, so no transpose copy), or in the
//!   batch-reduce form `a[i·lda + (kk / kb)·a_blk + (kk % kb)·acs]` (a blocked
//!   activation `[Kb][S][bk]` read in place, one block after another), or packed
//!   per row block into tiles ([`GemmSpec::pack_a`]); f32 or bf16 widened exactly
//!   in registers;
//! - `B` is either *packed* ([`pack_b`]) into `⌈n/nr⌉` panels of `k` rows × `nr` f32
//!   columns, zero-padded, or read *in place* with row stride `ldb`
//!   ([`BLayout`]) — the blocked weight layout `[N/bn][K][bn]` of SC20 is one
//!   `k × bn` matrix per N block: one output block is one batch-reduce over the K
//!   blocks, with its epilogue applied while the block is in registers;
//! - the epilogue adds an f32 bias (packed to `⌈n/nr⌉·nr`, or `n` in place), applies relu
//!   (`x > 0 || x is NaN ? x : 0`, NaN kept as the interpreter keeps it), and stores to `C` (row stride `ldc`) as f32 or bf16 (round
//!   to nearest even, NaN kept NaN).
//!
//! Loop nest (per call: rows `0..rows` of the given `A`/`C` row block, panels
//! `p0..p1`): row blocks of `MC` rows (so the `A` block stays in L2) → panels
//! (the `k×nr` panel stays in L1/L2) → tiles of `mr` rows. Each tile is the
//! micro-kernel: [`Micro::Cranelift`] inlines a `4×8` f32x4-FMA register block
//! (8 accumulators), [`Micro::Native`] calls the AVX2+FMA `6×16` kernel
//! ([`micro::avx2`]) through a symbol registered in the JIT module, and
//! [`Micro::Native512`] / [`Micro::Bf16Dot`] the AVX-512 `12×32` ones
//! ([`micro::avx512`], [`micro::avx512bf16`]) and [`Micro::Amx`] the AMX-BF16
//! `32×32` one ([`micro::amx`]): each call passes one pointer to
//! a [`micro::TileArgs`] the generated code fills in a stack slot. Ragged edges
//! are compiled in: the last row tile has `m % mr` rows, the last panel
//! `n % nr` columns (stores masked lane by lane).
//!
//! The FMA micro-kernels sum `k` in order with one FMA per term, so for the same
//! spec they give bitwise-identical results; against the reference (a different
//! association) the difference is float reassociation only. [`Micro::Bf16Dot`]
//! and [`Micro::Amx`] (bf16 `A` and `B`, `B` packed in k pairs) add their exact
//! products in their own order: reassociation again, not the FMA kernels' bits.
//!
//! The runtime-facing entry [`GemmKernel::run`] validates every slice length
//! against the spec before the (unsafe) call and splits rows over rayon tasks:
//! the generated code never sees an unchecked size.

use super::JitError;
use super::micro::{self, BPacking, MicroKernel};
use half::bf16;
pub use operands::{Operand, OutBuf};
use rayon::prelude::*;

/// Element type of a GEMM operand in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elt {
    /// 32-bit float.
    F32,
    /// bf16 storage (widened to f32 on load, rounded to nearest even on store).
    BF16,
}

impl Elt {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Elt::F32 => 4,
            Elt::BF16 => 2,
        }
    }
}

/// Which micro-kernel computes the tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Micro {
    /// Pure Cranelift, 128-bit f32x4 FMA, 4×8 tiles.
    Cranelift,
    /// The native AVX2+FMA 6×16 kernel ([`micro::avx2`]), called from the JIT
    /// loop nest.
    Native,
    /// The native AVX-512 12×32 kernel ([`micro::avx512`]), called from the
    /// JIT loop nest.
    Native512,
    /// The native AVX-512 BF16 12×32 kernel ([`micro::avx512bf16`]:
    /// `vdpbf16ps`, two k steps per instruction), for bf16 `A` and `B`, with `B`
    /// packed in k pairs; called from the JIT loop nest.
    Bf16Dot,
    /// The native AMX-BF16 32×32 kernel ([`micro::amx`]: `tdpbf16ps`, a
    /// 16×16 tile of 32 k steps per instruction), for bf16 `A` and `B`, with
    /// `B` packed in k pairs as for [`Micro::Bf16Dot`]; called from the JIT
    /// loop nest.
    Amx,
}

impl Micro {
    /// The registered native kernel (`None` for Cranelift's, which is inlined).
    pub fn kernel(self) -> Option<&'static MicroKernel> {
        match self {
            Micro::Cranelift => None,
            Micro::Native => Some(&micro::AVX2),
            Micro::Native512 => Some(&micro::AVX512),
            Micro::Bf16Dot => Some(&micro::AVX512_BF16),
            Micro::Amx => Some(&micro::AMX_BF16),
        }
    }

    /// Rows of a tile.
    pub fn mr(self) -> usize {
        self.kernel().map_or(CL_MR, |k| k.mr)
    }

    /// Columns of a tile = columns of a packed B panel.
    pub fn nr(self) -> usize {
        self.kernel().map_or(CL_NR, |k| k.nr)
    }

    /// The micro-kernel's name in messages.
    pub fn name(self) -> &'static str {
        self.kernel().map_or("Cranelift", |k| k.name)
    }

    /// Whether this CPU can run the micro-kernel.
    pub fn available(self) -> bool {
        self.kernel().is_none_or(MicroKernel::available)
    }

    /// How the micro-kernel reads a packed `B` (Cranelift's: f32 rows).
    pub fn b_packing(self) -> BPacking {
        self.kernel().map_or(BPacking::F32, |k| k.b_packing)
    }

    /// Whether the micro-kernel applies a mask in its epilogue
    /// ([`micro::F_MASK`], [`GemmSpec::mask`]; [`MicroKernel::masks`]).
    pub fn masks(self) -> bool {
        self.kernel().is_some_and(|k| k.masks)
    }
}

/// Rows of a Cranelift tile.
pub const CL_MR: usize = 4;
/// Columns of a Cranelift tile (two f32x4 per row).
pub const CL_NR: usize = 8;
/// Unrolling of the Cranelift k loop.
const CL_UNROLL: usize = 4;

/// Everything the generated code is specialised on (the kernel cache's key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmSpec {
    /// Rows of `A` and `C` (the full problem; a call may cover fewer).
    pub m: usize,
    /// Columns of `C`.
    pub n: usize,
    /// The reduction length.
    pub k: usize,
    /// Row stride of `A`, in elements.
    pub lda: usize,
    /// Column (k) stride of `A`, in elements (1 for row-major `A`).
    pub acs: usize,
    /// Row stride of `C`, in elements (`>= n`).
    pub ldc: usize,
    /// `A`'s element type.
    pub a: Elt,
    /// `C`'s element type.
    pub c: Elt,
    /// Add the packed bias.
    pub bias: bool,
    /// Apply relu.
    pub relu: bool,
    /// After the bias and relu, zero each element of `C` whose element of a
    /// mask operand (laid out as `C`, of its element type) is not > 0:
    /// `brgemm_dgrad`'s mask (the previous layer's relu derivative) in the
    /// tile's epilogue, its mask lines prefetched as the tile starts
    /// ([`micro::F_MASK`]; [`GemmKernel::run_block`] passes the
    /// operand). Only where the micro-kernel [`Micro::masks`]
    /// ([`GemmSpec::normalized`] clears it otherwise; the caller then masks).
    pub mask: bool,
    /// The micro-kernel.
    pub micro: Micro,
    /// Pack each row block of `A` into tile-major panels (`[tile][k][mr]`, zero
    /// rows past `m`) before the loop nest runs on it: the micro-kernel then reads
    /// `A` as one contiguous stream instead of `mr` strided rows. Off in the
    /// linear ops: the serial per-block copy measured slower than the strided
    /// reads (`examples/gemm_best`).
    pub pack_a: bool,
    /// Where `B` (and the bias) live.
    pub b: BLayout,
    /// The batch-reduce form of `A` (unpacked only): the reduction runs over
    /// blocks of `kb` steps, block `q` of row `i` starting at element
    /// `i·lda + q·a_blk` (steps `acs` apart inside a block). `kb = 0` (or `>= k`)
    /// is one block: the plain strided `A`. This reads a blocked activation
    /// `[Kb][S][bk]` in place (`lda = bk`, `kb = bk`, `a_blk = S·bk`).
    pub kb: usize,
    /// Elements between consecutive blocks of `A` (see [`GemmSpec::kb`]).
    pub a_blk: usize,
    /// The reduction in chunks of `kc` steps (`0`: one pass over `k`): each
    /// row block runs every panel's tiles on one chunk before the next, the
    /// tiles of later chunks starting from the `C` the earlier ones wrote
    /// ([`micro::F_ACC`]), the bias and relu on the last. A chunk's `B` rows
    /// (`kc × nr`) then stay in L1 across the row block's tiles instead of
    /// streaming from L2 per tile. The sums are unchanged bit for bit (each
    /// element's one accumulator resumes from its stored f32 partial sum).
    /// Native micro-kernels and an f32 `C` only, chunks on batch-reduce block
    /// bounds and k pairs ([`GemmSpec::normalized`] clears it otherwise).
    pub kc: usize,
}

/// Where a GEMM's `B` operand and bias live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BLayout {
    /// Packed by [`pack_b`] into zero-padded `k × nr` panels, the bias by
    /// [`pack_bias`].
    Packed,
    /// In place: `B[kk][j]` at `b[kk·ldb + j]` (f32), the bias as `n` f32 — e.g.
    /// one block `[K][bn]` of the blocked weights. Only when `n` is whole
    /// tiles (the micro-kernels read whole tile rows); [`GemmSpec::normalized`]
    /// falls back to [`BLayout::Packed`] otherwise.
    InPlace {
        /// Row stride of `B`, in f32 (`>= n`).
        ldb: usize,
    },
    /// In place as [`BLayout::InPlace`], the elements bf16, widened as the
    /// micro-kernel loads each row ([`micro::F_B_BF16`]): a bf16 weight
    /// block without a widening copy per call. Only on a micro-kernel that
    /// [`micro::MicroKernel::reads_bf16_b`], with an f32 `A`;
    /// [`GemmSpec::normalized`] falls back to [`BLayout::Packed`] (f32)
    /// otherwise.
    InPlaceBf16 {
        /// Row stride of `B`, in bf16 elements (`>= n`).
        ldb: usize,
    },
}

impl GemmSpec {
    /// The spec as compiled: an in-place `B` whose width is not whole tiles of
    /// this micro-kernel, or whose row stride is below `n`, becomes packed (so
    /// does a bf16 one the micro-kernel cannot read, [`BLayout::InPlaceBf16`]; and
    /// a k-pair kernel's `B` always is, in k pairs, with `A` unpacked:
    /// [`BPacking::KPairs`]); a one-block or packed `A` gets `kb = k`.
    pub fn normalized(self) -> GemmSpec {
        let mut s = self;
        if s.micro.b_packing() == BPacking::KPairs {
            s.b = BLayout::Packed;
            s.pack_a = false;
        }
        if let BLayout::InPlaceBf16 { .. } = s.b
            && !(s.micro.kernel().is_some_and(|k| k.reads_bf16_b) && s.a == Elt::F32)
        {
            s.b = BLayout::Packed;
        }
        if let BLayout::InPlace { ldb } | BLayout::InPlaceBf16 { ldb } = s.b {
            // In place only when `B`'s rows are whole tile rows (`n` a multiple
            // of `nr`): panel `p` starts at column `p·nr`, its rows `ldb`
            // apart (contiguous, as packed, when `n = nr`). Whether a wider
            // `B` is better read in place or packed once per call is timed
            // (`Jit::pick_variant`, `JitOptions::pack_b`).
            if !s.n.is_multiple_of(s.micro.nr()) || ldb < s.n {
                s.b = BLayout::Packed;
            }
        }
        if s.pack_a || s.kb == 0 || s.kb >= s.k {
            s.kb = s.k;
            s.a_blk = 0;
        }
        let pairs = s.micro.b_packing() == BPacking::KPairs;
        let chunkable = s.micro != Micro::Cranelift
            && s.c == Elt::F32
            && s.kc > 0
            && s.kc < s.k
            && (s.kb >= s.k || s.kc.is_multiple_of(s.kb))
            && (!pairs || s.kc.is_multiple_of(2));
        if !chunkable {
            s.kc = 0;
        }
        if !s.micro.masks() {
            s.mask = false;
        }
        s
    }

    /// Whether the kernel reads a packed `B` ([`pack_b`], or
    /// [`micro::avx512bf16::pack_b_pairs_into`] for the k-pair kernels) and
    /// bias ([`pack_bias`]).
    pub fn packed_b(&self) -> bool {
        self.b == BLayout::Packed
    }

    /// Whether the spec can run on a k-pair kernel ([`Micro::Bf16Dot`],
    /// [`Micro::Amx`]: one layout rule): bf16 `A` whose k steps pair up in
    /// memory ([`MicroKernel::fits`]).
    pub fn bf16_dot_fits(&self) -> bool {
        micro::AVX512_BF16.fits(self.a == Elt::BF16, self.k, self.acs, self.kb)
    }

    /// Rows of a packed `B` panel: `k`, or `⌈k/2⌉` k pairs for the k-pair
    /// kernels.
    pub fn b_rows(&self) -> usize {
        self.micro.b_packing().rows(self.k)
    }

    /// Length (f32 words) of a whole packed `B`: `⌈n/nr⌉` panels of
    /// [`GemmSpec::b_rows`] × `nr`.
    pub fn packed_b_len(&self) -> usize {
        self.panels() * self.b_rows() * self.micro.nr()
    }

    /// Bytes of one element of `B` as the kernel reads it (2 for
    /// [`BLayout::InPlaceBf16`], else 4).
    pub fn b_size(&self) -> usize {
        match self.b {
            BLayout::InPlaceBf16 { .. } => 2,
            _ => 4,
        }
    }

    /// (Row stride of `B` in elements, elements between consecutive panels).
    fn b_geom(&self) -> (usize, usize) {
        let nr = self.micro.nr();
        match self.b {
            BLayout::Packed => (nr, self.b_rows() * nr),
            BLayout::InPlace { ldb } | BLayout::InPlaceBf16 { ldb } => (ldb, nr),
        }
    }

    /// Length (f32 words) the kernel reads from `B`.
    pub fn b_len(&self) -> usize {
        if self.k == 0 || self.n == 0 {
            return 0;
        }
        let (ldb, pstride) = self.b_geom();
        (self.panels() - 1) * pstride + (self.b_rows() - 1) * ldb + self.micro.nr()
    }

    /// Length (f32) the kernel reads from the bias.
    pub fn bias_len(&self) -> usize {
        match self.b {
            BLayout::Packed => self.panels() * self.micro.nr(),
            BLayout::InPlace { .. } | BLayout::InPlaceBf16 { .. } => self.n,
        }
    }

    /// Elements of an unpacked `A` that `rows` rows reach (0 if `k = 0`).
    fn a_need(&self, rows: usize) -> usize {
        if self.k == 0 || rows == 0 {
            return 0;
        }
        let kb = self.kb.max(1);
        let blocks = self.k.div_ceil(kb);
        let last = self.k - (blocks - 1) * kb;
        let within = if blocks > 1 { kb } else { last };
        (rows - 1) * self.lda + (blocks - 1) * self.a_blk + (within.max(last) - 1) * self.acs + 1
    }

    /// Number of packed B panels.
    pub fn panels(&self) -> usize {
        self.n.div_ceil(self.micro.nr())
    }

    /// How the generated code addresses `A`: (elements per row index to a tile's
    /// start, row stride inside a tile, k stride). Packed: tile `t` (rows
    /// `t·mr..`) starts at `t·mr·k = i·k`, element `(r, kk)` at `kk·mr + r`.
    fn a_layout(&self) -> (usize, usize, usize) {
        if self.pack_a {
            (self.k, 1, self.micro.mr())
        } else {
            (self.lda, self.lda, self.acs)
        }
    }

    /// Rows per cache block: the `A` block (`MC × k`) fits in about 512 KiB (a
    /// quarter of this machine's L2), a multiple of the tile height.
    fn mc(&self) -> usize {
        let mr = self.micro.mr();
        let k = if self.kc > 0 { self.kc } else { self.k };
        let rows = (512 * 1024) / (k.max(1) * self.a.size());
        (rows / mr).clamp(1, 64) * mr
    }
}

/// `(a, b, c, bias, rows, p0, p1, mask)`: `mask` the bytes from `C` to the
/// mask operand ([`GemmSpec::mask`]; 0 without one).
type GemmFn = unsafe extern "C" fn(*const u8, *const f32, *mut u8, *const f32, i64, i64, i64, i64);

/// A compiled GEMM kernel for one [`GemmSpec`].
#[derive(Clone, Copy, Debug)]
pub struct GemmKernel {
    spec: GemmSpec,
    f: GemmFn,
}

/// Packs `B` (`k × n`, element `(kk, j)` at `src[kk·rs + j·cs]`, f32 or bf16) into
/// `⌈n/nr⌉` panels of `k × nr` f32 (zero-padded columns), in parallel over panels.
pub fn pack_b<E: Copy + Send + Sync + Into<Widen>>(
    src: &[E],
    k: usize,
    n: usize,
    rs: usize,
    cs: usize,
    nr: usize,
) -> Vec<f32> {
    let mut out = vec![0.0f32; n.div_ceil(nr) * k * nr];
    pack_b_into(&mut out, src, (k, n, rs, cs), nr);
    out
}

/// [`pack_b`] into `dst` (`⌈n/nr⌉·k·nr` f32), every element written: the
/// padding columns are set to zero, so `dst` may hold anything before.
pub(crate) fn pack_b_into<E: Copy + Send + Sync + Into<Widen>>(
    dst: &mut [f32],
    src: &[E],
    (k, n, rs, cs): (usize, usize, usize, usize),
    nr: usize,
) {
    assert_eq!(
        dst.len(),
        n.div_ceil(nr) * k * nr,
        "pack_b: destination size"
    );
    if k == 0 || n == 0 {
        return;
    }
    assert!(
        src.len() > (k - 1) * rs + (n - 1) * cs,
        "pack_b: source too short"
    );
    dst.par_chunks_mut(k * nr).enumerate().for_each(|(p, dst)| {
        let j0 = p * nr;
        let cols = nr.min(n - j0);
        if cols < nr {
            dst.fill(0.0);
        }
        if cs == 1 {
            for kk in 0..k {
                let row = &src[kk * rs + j0..kk * rs + j0 + cols];
                for (d, &s) in dst[kk * nr..kk * nr + cols].iter_mut().zip(row) {
                    *d = s.into().0;
                }
            }
        } else {
            for jj in 0..cols {
                let base = (j0 + jj) * cs;
                for kk in 0..k {
                    dst[kk * nr + jj] = src[base + kk * rs].into().0;
                }
            }
        }
    });
}

/// An f32 widened from f32 or bf16 (a helper for [`pack_b`]'s generic source).
#[derive(Clone, Copy, Debug)]
pub struct Widen(pub f32);

impl From<f32> for Widen {
    fn from(v: f32) -> Widen {
        Widen(v)
    }
}

impl From<bf16> for Widen {
    fn from(v: bf16) -> Widen {
        Widen(v.to_f32())
    }
}

/// The bias padded to whole panels, as f32.
pub fn pack_bias(bias: &[f32], nr: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; bias.len().div_ceil(nr) * nr];
    out[..bias.len()].copy_from_slice(bias);
    out
}

impl GemmKernel {
    /// The spec this kernel was compiled for.
    pub fn spec(&self) -> &GemmSpec {
        &self.spec
    }

    /// Runs the whole GEMM, parallel over row blocks: `a` holds `A` (`m` rows of
    /// stride `lda`), `bp` the packed `B`, `bias` the packed bias (iff the spec has
    /// one), `c` receives `C` (`m` rows of stride `ldc`). Every length is checked
    /// against the spec first (a mismatch is an error, nothing is written).
    pub fn run(
        &self,
        a: Operand<'_>,
        bp: &[f32],
        bias: Option<&[f32]>,
        c: OutBuf<'_>,
    ) -> Result<(), JitError> {
        let s = &self.spec;
        let bad = |what: String| JitError::Args {
            kernel: format!("{s:?}"),
            reason: what,
        };
        if a.elt() != s.a || c.elt() != s.c {
            return Err(bad("operand dtypes differ from the spec".into()));
        }
        if s.mask {
            return Err(bad(
                "a masked spec runs through run_block, with its mask".into()
            ));
        }
        if s.m == 0 || s.n == 0 {
            return Ok(());
        }
        if s.ldc < s.n {
            return Err(bad("C's row stride is below its row length".into()));
        }
        let a_need = s.a_need(s.m);
        if s.k > 0 && a.len() < a_need {
            return Err(bad(format!("A holds {} elements, needs {a_need}", a.len())));
        }
        check_b_bias(s, Operand::F32(bp), bias).map_err(bad)?;
        let c_need = (s.m - 1) * s.ldc + s.n;
        if c.len() < c_need {
            return Err(bad(format!("C holds {} elements, needs {c_need}", c.len())));
        }
        let mr = s.micro.mr();
        // Row blocks: about two per thread, whole tiles, at least 4 tiles.
        let threads = rayon::current_num_threads().max(1);
        let rb = s.m.div_ceil(2 * threads).div_ceil(mr).max(4) * mr;
        let (lda, ldc, panels) = (s.lda, s.ldc, s.panels() as i64);
        let bias_ptr = bias.map_or(std::ptr::null(), <[f32]>::as_ptr);
        let bias_addr = bias_ptr as usize;
        let f = self.f;
        let run_block = |blk: usize, cptr: *mut u8, rows: usize| {
            let r0 = blk * rb;
            // The packed copy of this block's rows (kept alive across the call).
            let packed = if s.pack_a && s.k > 0 {
                Some(match a {
                    Operand::F32(v) => Packed::F32(pack_a_block(v, *s, r0, rows)),
                    Operand::BF16(v) => Packed::BF16(pack_a_block(v, *s, r0, rows)),
                })
            } else {
                None
            };
            let aptr = match (&packed, s.k > 0) {
                (Some(Packed::F32(v)), _) => v.as_ptr().cast(),
                (Some(Packed::BF16(v)), _) => v.as_ptr().cast(),
                (None, true) => a.ptr_at(r0 * lda),
                (None, false) => bp.as_ptr().cast(),
            };
            // SAFETY: `rows` rows starting at row r0 of A (checked above: the
            // last element read, (m-1)·lda + (k-1)·acs, is inside `a`; a packed
            // block holds ⌈rows/mr⌉·mr·k elements, all the packed layout reads)
            // and of C (`cptr` is this
            // block's own disjoint chunk of C, covering `rows` rows of stride ldc
            // up to column n); `rows` is a multiple of the tile height except for
            // the last block, whose remainder is m % mr as compiled; panels 0..
            // panels of the packed B and bias were checked above. The generated
            // code touches exactly these ranges (module docs).
            unsafe {
                f(
                    aptr,
                    bp.as_ptr(),
                    cptr,
                    bias_addr as *const f32,
                    rows as i64,
                    0,
                    panels,
                    0,
                );
            }
        };
        // Chunks of rb rows of C; the last chunk may end at column n of its last
        // row (c may be shorter than m·ldc).
        c.prefix(c_need)
            .chunks(rb * ldc)
            .into_par_iter()
            .enumerate()
            .for_each(|(blk, mut ch)| {
                let rows = ch.len().div_ceil(ldc);
                run_block(blk, ch.as_mut_ptr(), rows);
            });
        Ok(())
    }
}

impl GemmKernel {
    /// Runs one output block of `rows` rows on the calling thread: `a` holds the
    /// block's `A` — with [`GemmSpec::pack_a`], `⌈rows/mr⌉` tiles the caller
    /// packed (`[tile][k][mr]`); otherwise `A` from the block's first row in the
    /// spec's strided (batch-reduce) layout — `bp` the `B` operand (packed panels
    /// or in place, as the spec's [`BLayout`] says), `bias` the bias (iff the spec
    /// has one), and `c` receives `rows` rows of stride `ldc` (up to column `n`
    /// of the last). `rows` must be at most `m` and a multiple of the tile
    /// height, or have the compiled remainder `m % mr`. Every length is checked
    /// first (a mismatch is an error, nothing is written). The blocked GEMM ops
    /// ([`super::brgemm`]) split their outputs into such blocks, one rayon task
    /// each. `mask` is the mask operand of a spec with [`GemmSpec::mask`]
    /// (`Some` exactly then): laid out as `c` (the same element type, rows
    /// `ldc` apart, from the block's first row), covering as many elements as
    /// the block of `C` it masks.
    pub fn run_block(
        &self,
        a: Operand<'_>,
        bp: &[f32],
        bias: Option<&[f32]>,
        c: OutBuf<'_>,
        rows: usize,
        mask: Option<Operand<'_>>,
    ) -> Result<(), JitError> {
        self.run_block_b(a, Operand::F32(bp), bias, c, rows, mask)
    }

    /// [`GemmKernel::run_block`] with `B` of either element type: bf16
    /// exactly when the spec reads it so ([`BLayout::InPlaceBf16`]).
    pub fn run_block_b(
        &self,
        a: Operand<'_>,
        bp: Operand<'_>,
        bias: Option<&[f32]>,
        c: OutBuf<'_>,
        rows: usize,
        mask: Option<Operand<'_>>,
    ) -> Result<(), JitError> {
        let s = &self.spec;
        let bad = |what: String| JitError::Args {
            kernel: format!("{s:?}"),
            reason: what,
        };
        if a.elt() != s.a || c.elt() != s.c || mask.is_some_and(|m| m.elt() != s.c) {
            return Err(bad("operand dtypes differ from the spec".into()));
        }
        if mask.is_some() != s.mask {
            return Err(bad("mask presence differs from the spec".into()));
        }
        if rows == 0 || s.n == 0 {
            return Ok(());
        }
        let mr = s.micro.mr();
        if rows > s.m || (!rows.is_multiple_of(mr) && rows % mr != s.m % mr) {
            return Err(bad(format!(
                "{rows} rows: not whole tiles nor the compiled remainder"
            )));
        }
        if s.ldc < s.n {
            return Err(bad("C's row stride is below its row length".into()));
        }
        let a_need = if s.pack_a {
            rows.div_ceil(mr) * mr * s.k
        } else {
            s.a_need(rows)
        };
        if s.k > 0 && a.len() < a_need {
            return Err(bad(format!("A holds {} elements, needs {a_need}", a.len())));
        }
        check_b_bias(s, bp, bias).map_err(bad)?;
        let c_need = (rows - 1) * s.ldc + s.n;
        if c.len() < c_need {
            return Err(bad(format!("C holds {} elements, needs {c_need}", c.len())));
        }
        let bptr = bp.ptr_at(0);
        let aptr = if s.k > 0 { a.ptr_at(0) } else { bptr };
        if let Some(m) = mask
            && m.len() < c_need
        {
            return Err(bad(format!(
                "the mask holds {} elements, needs {c_need}",
                m.len()
            )));
        }
        let mut c = c;
        let cptr = c.as_mut_ptr();
        let bias_ptr = bias.map_or(std::ptr::null(), <[f32]>::as_ptr);
        // Bytes from C to the mask (any two addresses differ by less than
        // isize::MAX bytes: every allocation is at most that).
        let mask_off = mask.map_or(0, |m| (m.ptr_at(0) as isize).wrapping_sub(cptr as isize));
        // SAFETY: checked above: `a` holds the ⌈rows/mr⌉ packed tiles or the
        // `rows` strided rows the code reads, `bp` every panel `0..panels` as
        // laid out (`b_len`), the bias (if any) `bias_len` f32, and `c` the `rows` rows of stride ldc up to column n it
        // writes, and the mask (with `GemmSpec::mask`) as many elements laid
        // out as C, read at the offsets of the C elements written; `rows` is
        // whole tiles or ends with the compiled remainder tile. The generated
        // code touches exactly these ranges (module docs).
        unsafe {
            (self.f)(
                aptr,
                bptr.cast(),
                cptr,
                bias_ptr,
                rows as i64,
                0,
                s.panels() as i64,
                mask_off as i64,
            );
        }
        Ok(())
    }
}

/// Checks that `bp` and `bias` cover what a kernel of spec `s` reads, and
/// that `bp` has the element type it reads.
fn check_b_bias(s: &GemmSpec, bp: Operand<'_>, bias: Option<&[f32]>) -> Result<(), String> {
    let want = if s.b_size() == 2 { Elt::BF16 } else { Elt::F32 };
    if bp.elt() != want {
        return Err(format!("B holds {:?}, the kernel reads {want:?}", bp.elt()));
    }
    if bp.len() < s.b_len() {
        return Err(format!(
            "B holds {} elements, the kernel reads {}",
            bp.len(),
            s.b_len()
        ));
    }
    match (s.bias, bias) {
        (true, Some(b)) if b.len() >= s.bias_len() => Ok(()),
        (false, None) => Ok(()),
        _ => Err("bias presence or length differs from the spec".into()),
    }
}

/// A packed row block of `A`.
enum Packed {
    F32(Vec<f32>),
    BF16(Vec<bf16>),
}

/// Rows `r0..r0+rows` of `A` in tile-major panels `[tile][k][mr]`, rows past the
/// block zero.
fn pack_a_block<T: Copy + Default>(a: &[T], s: GemmSpec, r0: usize, rows: usize) -> Vec<T> {
    let mr = s.micro.mr();
    let tiles = rows.div_ceil(mr);
    let mut out = vec![T::default(); tiles * mr * s.k];
    for t in 0..tiles {
        let dst = &mut out[t * mr * s.k..(t + 1) * mr * s.k];
        let live = mr.min(rows - t * mr);
        let base = (r0 + t * mr) * s.lda;
        if s.acs == 1 {
            for r in 0..live {
                let row = &a[base + r * s.lda..base + r * s.lda + s.k];
                for (kk, &v) in row.iter().enumerate() {
                    dst[kk * mr + r] = v;
                }
            }
        } else {
            // A transposed view (e.g. dzᵀ): the tile's rows are adjacent in memory
            // for each kk, so read them k by k.
            for kk in 0..s.k {
                for r in 0..live {
                    dst[kk * mr + r] = a[base + r * s.lda + kk * s.acs];
                }
            }
        }
    }
    out
}

mod codegen;
mod operands;
pub(crate) use codegen::compile;
