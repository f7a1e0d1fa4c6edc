//! The native GEMM micro-kernels as a table: one argument struct, one registry.
//!
//! A micro-kernel computes one tile of `C = epilogue(A · B)`; the JIT loop nest
//! ([`super::gemm`]) does the cache blocking, the panel loop and the ragged
//! edges, and calls a micro-kernel per tile through a symbol registered in its
//! JIT module.
//!
//! # The ABI
//! Every micro-kernel has the type [`UkernelFn`]: `unsafe extern "C" fn(*const
//! TileArgs)`. [`TileArgs`] is `#[repr(C)]` and is the only statement of the
//! call's layout: the kernels read it, and the generated code writes it into a
//! stack slot at the field offsets `std::mem::offset_of!` gives for it (the
//! fields constant for a compiled GEMM once at entry, the tile's pointers and
//! size before each call), then passes the slot's address. A field added,
//! removed or retyped here changes both sides at once. The tile's semantics
//! (common to all kernels; [`TileArgs`] documents each field):
//! `C[r][j] = act(bias[j] + Σ_kk A(r, kk) · B(kk, j))` for `r < mr`, `j < nr`,
//! with `A(r, kk) = a[r·lda + (kk / kb)·a_blk + (kk % kb)·acs]` (f32, or bf16
//! widened exactly with [`F_A_BF16`]), `B` rows `ldb` words apart in the
//! kernel's [`BPacking`], the accumulators starting at 0 (or at `C` with
//! [`F_ACC`]), then [`F_BIAS`], [`F_RELU`] (`x > 0 || x is NaN ? x : 0`),
//! [`F_MASK`] (AVX-512 family only), and `C` stored as f32 or bf16
//! ([`F_C_BF16`]: nearest even, NaN kept NaN). Only the `mr × nr` tile of `C`
//! is written and nothing outside the tiles of `A` (and of the mask) is read.
//!
//! # The registry
//! [`KERNELS`] lists every native micro-kernel as a [`MicroKernel`]: its name
//! (in messages and metrics), its JIT symbol, its tile `mr × nr` (the largest
//! it takes; the loop nest calls it with smaller ragged tiles too), the CPU
//! features it needs (detected at run time: [`MicroKernel::available`]), its
//! entry and the packing of `B` it reads. [`super::gemm::Micro`] names the
//! kernels the GEMM can pick (with the inlined Cranelift one, which is no
//! call and not in the table) and reads everything else from here. The test
//! battery (`tests/micro.rs`) runs the same checks on every registered kernel
//! this CPU can run, and skips the others with a note.
//!
//! # Adding a kernel
//! 1. Write it in its own file here: an `unsafe extern "C" fn ukernel(t: *const
//!    TileArgs)` (on other architectures, `pub use super::unsupported as
//!    ukernel;`), with its inner functions under `#[target_feature]` for exactly
//!    the features its registry row lists.
//! 2. Add a `pub static` [`MicroKernel`] row and list it in [`KERNELS`].
//! 3. Add a [`super::gemm::Micro`] variant mapped to it
//!    ([`super::gemm::Micro::kernel`]) and, if the GEMM should time it under
//!    `auto`, a candidate in `Jit::pick_variant`.
//! 4. Add it to the `battery!` list in `tests/micro.rs` (a test fails while a
//!    registered kernel has no battery).

pub mod amx;
pub mod avx2;
pub mod avx512;
pub mod avx512bf16;
pub mod probe;

/// Flag: `A` holds bf16.
pub const F_A_BF16: u32 = 1;
/// Flag: `C` holds bf16.
pub const F_C_BF16: u32 = 2;
/// Flag: add the bias.
pub const F_BIAS: u32 = 4;
/// Flag: apply relu.
pub const F_RELU: u32 = 8;
/// Flag: start from the values in `C` (accumulate) instead of 0, so that a
/// loop nest may split `k` into chunks and get the one-pass result bit for bit
/// (f32 `C`; bf16 `C` is widened exactly).
pub const F_ACC: u32 = 16;
/// Flag: after the bias and relu, zero each element whose mask element is not
/// greater than 0 (NaN is not): relu's derivative of the mask, as
/// `brgemm_dgrad` applies the previous layer's. The mask has `C`'s layout and
/// element type, `mask` bytes from `C` ([`TileArgs::mask`]). The AVX-512
/// kernels' epilogue ([`avx512::finish`]: AVX-512, AVX-512 BF16, AMX-BF16)
/// honours it; [`MicroKernel::masks`] says which.
pub const F_MASK: u32 = 32;
/// Flag: `B` holds bf16 (the row stride `ldb` then counts bf16 elements),
/// widened exactly as each row is loaded: a bf16 weight block read in place
/// instead of packed to f32 per call. The AVX-512 kernel only, with an f32
/// `A` ([`MicroKernel::reads_bf16_b`]).
pub const F_B_BF16: u32 = 64;

/// The arguments of one micro-kernel call: one tile (the module docs give the
/// formula). Strides and lengths are in elements of the operand's type (`B`'s
/// in 32-bit words).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TileArgs {
    /// `A`'s first element of the tile (f32, or bf16 with [`F_A_BF16`]).
    pub a: *const u8,
    /// `B`'s first row: `k` rows (`⌈k/2⌉` rows of k pairs for
    /// [`BPacking::KPairs`]) of the kernel's `nr` readable words, `ldb` apart
    /// (bf16 elements with [`F_B_BF16`]: the pointer is then to bf16).
    pub b: *const f32,
    /// `C`'s first element of the tile (f32, or bf16 with [`F_C_BF16`]).
    pub c: *mut u8,
    /// The bias (the kernel's `nr` readable f32) when [`F_BIAS`] is set.
    pub bias: *const f32,
    /// The reduction length.
    pub k: usize,
    /// Row stride of `A`.
    pub lda: usize,
    /// k stride of `A` inside a batch-reduce block.
    pub acs: usize,
    /// Row stride of `C`.
    pub ldc: usize,
    /// Row stride of `B`, in words.
    pub ldb: usize,
    /// k steps per batch-reduce block of `A` (`>= 1`; `>= k`: one block).
    pub kb: usize,
    /// Elements between consecutive blocks of `A`.
    pub a_blk: usize,
    /// Rows of the tile: `1..=` the kernel's `mr`.
    pub mr: usize,
    /// Columns of the tile: `1..=` the kernel's `nr`.
    pub nr: usize,
    /// `F_*` flags.
    pub flags: u32,
    /// With [`F_MASK`]: bytes from each element of `C` to its mask element
    /// (the mask laid out as `C`, in its element type).
    pub mask: isize,
}

impl TileArgs {
    /// The arguments at `t`, read field by field. The generated loop nest
    /// writes them field by field just before the call; a copy of the whole
    /// struct in 16-byte moves would load across two of those stores, which
    /// the CPU cannot forward (each call then waits for the stores to reach
    /// the cache: 5% of a bf16 dlrm-mlperf step in the AVX-512 BF16 kernel's
    /// entry).
    ///
    /// # Safety
    /// `t` points to a readable `TileArgs`.
    #[inline(always)]
    pub unsafe fn read(t: *const TileArgs) -> TileArgs {
        // SAFETY: the caller's contract; volatile reads keep each field's load
        // its own (not merged into wider moves).
        unsafe {
            macro_rules! field {
                ($f:ident) => {
                    std::ptr::read_volatile(std::ptr::addr_of!((*t).$f))
                };
            }
            TileArgs {
                a: field!(a),
                b: field!(b),
                c: field!(c),
                bias: field!(bias),
                k: field!(k),
                lda: field!(lda),
                acs: field!(acs),
                ldc: field!(ldc),
                ldb: field!(ldb),
                kb: field!(kb),
                a_blk: field!(a_blk),
                mr: field!(mr),
                nr: field!(nr),
                flags: field!(flags),
                mask: field!(mask),
            }
        }
    }
}

/// A micro-kernel entry.
///
/// # Safety (for the caller)
/// `args` points to a [`TileArgs`] whose pointers cover the ranges the tile
/// formula reaches (module docs), `1 <= mr`, `1 <= nr` within the kernel's
/// tile, the layout is one the kernel takes ([`MicroKernel::fits`]), and the
/// CPU has the kernel's features ([`MicroKernel::available`]). The kernel only
/// reads `*args`.
pub type UkernelFn = unsafe extern "C" fn(args: *const TileArgs);

/// The entry registered for every kernel on architectures without them (never
/// called: no kernel is available there).
#[cfg(not(target_arch = "x86_64"))]
pub unsafe extern "C" fn unsupported(_: *const TileArgs) {}

/// A CPU feature a micro-kernel needs, detected at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feature {
    /// x86-64 AVX2.
    Avx2,
    /// x86-64 FMA3.
    Fma,
    /// x86-64 AVX-512 Foundation.
    Avx512F,
    /// x86-64 AVX-512 Byte and Word.
    Avx512Bw,
    /// x86-64 AVX-512 Vector Length.
    Avx512Vl,
    /// x86-64 AVX-512 Doubleword and Quadword (`vfpclassps`).
    Avx512Dq,
    /// x86-64 AVX-512 BF16 (`vdpbf16ps`).
    Avx512Bf16,
    /// x86-64 AMX-TILE (the tile registers), with the OS's tile state
    /// enabled for this process ([`amx::tile_state_ready`]).
    AmxTile,
    /// x86-64 AMX-BF16 (`tdpbf16ps`), with AMX-TILE usable.
    AmxBf16,
}

impl Feature {
    /// The feature's name, as `#[target_feature]` and
    /// `is_x86_feature_detected!` spell it.
    pub fn name(self) -> &'static str {
        match self {
            Feature::Avx2 => "avx2",
            Feature::Fma => "fma",
            Feature::Avx512F => "avx512f",
            Feature::Avx512Bw => "avx512bw",
            Feature::Avx512Vl => "avx512vl",
            Feature::Avx512Dq => "avx512dq",
            Feature::Avx512Bf16 => "avx512bf16",
            Feature::AmxTile => "amx-tile",
            Feature::AmxBf16 => "amx-bf16",
        }
    }

    /// Whether this CPU has it (for AMX: and the OS lets this process use
    /// the tiles, asked once: [`amx::tile_state_ready`]).
    pub fn detected(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Feature::Avx2 => std::is_x86_feature_detected!("avx2"),
                Feature::Fma => std::is_x86_feature_detected!("fma"),
                Feature::Avx512F => std::is_x86_feature_detected!("avx512f"),
                Feature::Avx512Bw => std::is_x86_feature_detected!("avx512bw"),
                Feature::Avx512Vl => std::is_x86_feature_detected!("avx512vl"),
                Feature::Avx512Dq => std::is_x86_feature_detected!("avx512dq"),
                Feature::Avx512Bf16 => std::is_x86_feature_detected!("avx512bf16"),
                Feature::AmxTile => amx::tile_state_ready().0,
                Feature::AmxBf16 => amx::tile_state_ready().1,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }
}

/// How a kernel reads `B` (and so how the callers pack it), and with it the
/// kernel's arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BPacking {
    /// `k` rows of f32 ([`super::gemm::pack_b`]'s panels, or the weights in
    /// place); the kernel sums `k` in order with one fused multiply-add per
    /// term, so all such kernels agree bit for bit; `A` f32 or bf16, any
    /// strides.
    F32,
    /// `⌈k/2⌉` rows of 32-bit words, each two bf16 of consecutive k steps
    /// ([`avx512bf16::pack_b_pairs_into`]); the kernel adds the exact products
    /// in its own order (two k steps at a time for `vdpbf16ps`, the
    /// hardware's order for `tdpbf16ps`: reassociation, not the FMA kernels'
    /// bits); `A` bf16 with the k steps of a pair adjacent
    /// ([`avx512bf16::fits`]). The AVX-512 BF16 and the AMX-BF16 kernels.
    KPairs,
}

impl BPacking {
    /// Rows of a `B` panel for a reduction of length `k`.
    pub fn rows(self, k: usize) -> usize {
        match self {
            BPacking::F32 => k,
            BPacking::KPairs => k.div_ceil(2),
        }
    }
}

/// One registered micro-kernel.
#[derive(Debug)]
pub struct MicroKernel {
    /// Its name in messages and metrics.
    pub name: &'static str,
    /// The symbol under which its entry is registered in JIT modules.
    pub symbol: &'static str,
    /// Rows of a full tile.
    pub mr: usize,
    /// Columns of a full tile (and of a packed `B` panel).
    pub nr: usize,
    /// The CPU features it needs.
    pub features: &'static [Feature],
    /// The entry.
    pub entry: UkernelFn,
    /// How it reads `B`.
    pub b_packing: BPacking,
    /// Whether its epilogue applies [`F_MASK`].
    pub masks: bool,
    /// Whether it reads a bf16 `B` in place ([`F_B_BF16`], with an f32 `A`).
    pub reads_bf16_b: bool,
}

impl MicroKernel {
    /// Whether this CPU has every feature the kernel needs.
    pub fn available(&self) -> bool {
        self.features.iter().all(|f| f.detected())
    }

    /// The entry's address, if this CPU can run it (the JIT registers it as
    /// [`MicroKernel::symbol`] only then).
    pub fn entry_ptr(&self) -> Option<*const u8> {
        self.available().then_some(self.entry as *const u8)
    }

    /// Whether the kernel takes an `A` of this type and layout: any for
    /// [`BPacking::F32`]; bf16 with paired k steps ([`avx512bf16::fits`]) for
    /// [`BPacking::KPairs`].
    pub fn fits(&self, a_bf16: bool, k: usize, acs: usize, kb: usize) -> bool {
        match self.b_packing {
            BPacking::F32 => true,
            BPacking::KPairs => a_bf16 && avx512bf16::fits(k, acs, kb),
        }
    }

    /// Runs one tile.
    ///
    /// # Safety
    /// [`UkernelFn`]'s contract for `args`.
    pub unsafe fn call(&self, args: &TileArgs) {
        // SAFETY: forwarded.
        unsafe { (self.entry)(args) }
    }
}

/// The AVX2+FMA `6×16` kernel ([`avx2`]).
pub static AVX2: MicroKernel = MicroKernel {
    name: "AVX2+FMA",
    symbol: "dlrm_gemm_ukernel_avx2_6x16",
    mr: avx2::MR,
    nr: avx2::NR,
    features: &[Feature::Avx2, Feature::Fma],
    entry: avx2::ukernel,
    b_packing: BPacking::F32,
    masks: false,
    reads_bf16_b: false,
};

/// The AVX-512 `12×32` kernel ([`avx512`]).
pub static AVX512: MicroKernel = MicroKernel {
    name: "AVX-512",
    symbol: "dlrm_gemm_ukernel_avx512_12x32",
    mr: avx512::MR,
    nr: avx512::NR,
    features: &[Feature::Avx512F, Feature::Avx512Bw, Feature::Avx512Vl],
    entry: avx512::ukernel,
    b_packing: BPacking::F32,
    masks: true,
    reads_bf16_b: true,
};

/// The AVX-512 BF16 `12×32` kernel ([`avx512bf16`]: `vdpbf16ps`).
pub static AVX512_BF16: MicroKernel = MicroKernel {
    name: "AVX-512 BF16",
    symbol: "dlrm_gemm_ukernel_avx512bf16_12x32",
    mr: avx512::MR,
    nr: avx512::NR,
    features: &[
        Feature::Avx512F,
        Feature::Avx512Bw,
        Feature::Avx512Vl,
        Feature::Avx512Dq,
        Feature::Avx512Bf16,
    ],
    entry: avx512bf16::ukernel,
    b_packing: BPacking::KPairs,
    masks: true,
    reads_bf16_b: false,
};

/// The AMX-BF16 `32×32` kernel ([`amx`]: `tdpbf16ps`; its epilogue is
/// AVX-512's).
pub static AMX_BF16: MicroKernel = MicroKernel {
    name: "AMX-BF16",
    symbol: "dlrm_gemm_ukernel_amxbf16_32x32",
    mr: amx::MR,
    nr: amx::NR,
    features: &[
        Feature::Avx512F,
        Feature::Avx512Bw,
        Feature::Avx512Vl,
        Feature::AmxTile,
        Feature::AmxBf16,
    ],
    entry: amx::ukernel,
    b_packing: BPacking::KPairs,
    masks: true,
    reads_bf16_b: false,
};

/// Every registered micro-kernel.
pub static KERNELS: [&MicroKernel; 4] = [&AVX2, &AVX512, &AVX512_BF16, &AMX_BF16];
