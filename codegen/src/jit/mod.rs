//! The Cranelift JIT: kernels generated per op signature, cached, called through a
//! C ABI of pointers and sizes.
//!
//! - [`Jit`] owns the target ISA (`cranelift-native`, `opt_level=speed`), one JIT
//!   module per compiled kernel (kept alive for the process: the code is never
//!   freed while a function pointer to it exists) and the kernel cache, keyed by
//!   the full signature of the generated code ([`gemm::GemmSpec`]: shapes,
//!   strides, dtypes, epilogue, micro-kernel). [`Jit::global`] is the process-wide
//!   instance the runtime uses, so every rank thread shares compiled kernels.
//! - [`gemm`]: the blocked batch-reduce GEMM core with fused epilogues;
//!   [`linear`] maps `linear`, `linear_dx`, `linear_dw` onto it, and
//!   [`brgemm`] the blocked `brgemm`, `brgemm_dgrad`, `brgemm_wgrad` (operands
//!   packed once per call, `act'` and the bias gradient fused into the packing).
//! - [`micro`]: the native micro-kernels the GEMM loop nest calls per tile, as a
//!   table: one `#[repr(C)]` argument struct, one registry (name, tile, CPU
//!   features, entry, `B` packing). [`micro::avx2`] is the AVX2+FMA kernel,
//!   [`micro::avx512`] its AVX-512 sibling (12×32 tiles, batch-reduce `A`, chosen
//!   at run time), [`micro::avx512bf16`] the AVX-512 BF16 one (`vdpbf16ps`:
//!   two k steps per instruction, for bf16 `A` and `B`) and [`micro::amx`] the
//!   AMX-BF16 one (`tdpbf16ps`: 32×32 tiles, for bf16 `A` and `B`, the same
//!   packed `B`).
//! - [`reduce`]: `linear_db` (the bias gradient: column sums over the samples,
//!   parallel over column blocks, on the embedding bag's row sum), and the
//!   weighted column sums of `brgemm_wgrad` with one-column blocks.
//! - [`embedding`], [`sparse`], [`interaction`], [`elementwise`]: embedding bag
//!   forward (whole tables, and row shards: `embedding_bag_rows`) and
//!   `embedding_bag_grad` (each bag's `dy` row, or its mean share, copied to the
//!   bag's gradient rows), the race-free sparse updates (whole tables and row
//!   shards, the `*_rows` ops; `embedding_grad_dense` as an update of a zero
//!   table) and dense optimizer updates, dot interaction forward and backward,
//!   elementwise ops. The bag forward and the sparse updates fetch the rows a
//!   few lookups ahead through a native prefetch call ([`prefetch`]).
//! - [`layout`]: one strided row copy (f32/bf16 in any mix, zero padding) for
//!   `block_act`, `unblock_act` and the `cat` interaction forward and backward.
//! - [`loss`]: `bce_logits`, `bce_logits_grad`, `bce`, `bce_grad`, `mse`,
//!   `mse_grad`, `sigmoid` and the elementwise module ops' maps
//!   ([`loss::map`]), calling Rust's `f32::exp`, `f32::ln_1p` and `f32::ln` and
//!   the ops' own scalar functions through JIT symbols (bitwise the reference's
//!   and the interpreter's results).
//! - [`native_dot`]: the dot interaction on AVX-512 (f32 arithmetic; bf16
//!   operands widened in registers, bf16 results rounded after it), forward and
//!   backward, run instead of the Cranelift kernels under `Auto`, `Avx512`,
//!   `Avx512Bf16` and `AmxBf16` where the CPU has it (the backward's sums bit
//!   for bit the same, the forward's in 16 lanes, not 4).
//! - [`KernelChoice`]: which micro-kernel GEMMs use; `Auto` times the candidates
//!   on the first call of each shape and keeps the fastest.
//!
//! Safety model: every call reaches the kernels through [`try_eval_instance`],
//! which binds the operands to the node's [`NodeInstance`]
//! ([`NodeInstance::bind`]: each buffer's length equals its verified shape's
//! element count, in release builds too) — written once, in the call path, not
//! per kernel. The Rust wrappers then derive every size from those checked
//! shapes, check the element types (and the GEMM core each slice) against the
//! spec the code was compiled for, and every embedding index against its table
//! (data) before the call; the generated code itself does no bounds checks and
//! never sees an unchecked index or size.

pub mod adagrad;
pub mod brgemm;
pub(crate) mod buffers;
mod clif;
pub mod elementwise;
pub mod embedding;
pub mod gemm;
mod gemm_spec;
pub mod interaction;
pub mod layout;
pub mod linear;
pub mod loss;
pub mod micro;
pub mod native_dot;
mod pack;
#[cfg(test)]
mod pick_tests;
mod prefetch;
mod race;
pub mod reduce;
pub mod rows;
mod sched;
pub mod sparse;

use crate::reference::{KResult, Rows};
use cranelift_codegen::ir::{AbiParam, InstBuilder, Value, types};
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module};
use dlrm_ir::{Checked, InteractionKind, NodeInstance, Op, Pool, Tensor, TensorType};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;
use thiserror::Error;

/// Errors of the JIT itself (code generation, or a kernel called with arguments
/// that do not fit its spec — a bug in the caller, reported instead of run).
#[derive(Debug, Error, Clone, PartialEq)]
pub enum JitError {
    /// Cranelift rejected the generated code or the module failed.
    #[error("JIT compilation failed: {0}")]
    Codegen(String),
    /// A kernel's arguments do not fit the spec it was compiled for.
    #[error("kernel {kernel}: {reason}")]
    Args {
        /// The kernel's spec.
        kernel: String,
        /// What does not fit.
        reason: String,
    },
    /// The requested micro-kernel cannot run on this CPU.
    #[error("the native {0} micro-kernel is not available on this CPU")]
    NoNative(&'static str),
}

impl JitError {
    pub(crate) fn module(e: impl std::fmt::Display) -> JitError {
        JitError::Codegen(e.to_string())
    }
}

/// Which GEMM micro-kernel to use (`--kernels
/// cranelift|native|avx512|avx512bf16|amxbf16|auto`); under `Avx512`,
/// `Avx512Bf16`, `AmxBf16` and `Auto` the dot interaction (forward and
/// backward, any element types) runs on AVX-512 too ([`native_dot`]), where
/// the CPU has it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KernelChoice {
    /// Pure Cranelift (128-bit f32x4 FMA).
    Cranelift,
    /// The native AVX2+FMA micro-kernel called from the JIT loop nest.
    Native,
    /// The native AVX-512 micro-kernel called from the JIT loop nest.
    Avx512,
    /// The AVX-512 BF16 micro-kernel ([`micro::avx512bf16`]) for GEMMs whose
    /// operands are both bf16, the AVX-512 one for the others.
    Avx512Bf16,
    /// The AMX-BF16 micro-kernel ([`micro::amx`]) for GEMMs whose operands
    /// are both bf16, the AVX-512 one for the others.
    AmxBf16,
    /// Per shape, the fastest of those this CPU can run (timed on the first
    /// call); GEMMs whose operands are both bf16 run on the AMX-BF16 kernel
    /// where the CPU and OS allow it, else on the AVX-512 BF16 one where the
    /// CPU has it and it pays ([`micro::probe::bf16_dot_pays`]), else on the
    /// timed FMA kernels (the k-pair kernels are not timed against those:
    /// their sums are neither the FMA kernels' bits nor each other's, so a
    /// timing race must not choose the numbers).
    #[default]
    Auto,
}

impl KernelChoice {
    /// Parses `cranelift`, `native`, `avx512`, `avx512bf16`, `amxbf16` or
    /// `auto`.
    pub fn parse(s: &str) -> Option<KernelChoice> {
        match s {
            "cranelift" => Some(KernelChoice::Cranelift),
            "native" => Some(KernelChoice::Native),
            "avx512" => Some(KernelChoice::Avx512),
            "avx512bf16" => Some(KernelChoice::Avx512Bf16),
            "amxbf16" => Some(KernelChoice::AmxBf16),
            "auto" => Some(KernelChoice::Auto),
            _ => None,
        }
    }

    /// The spelling accepted by [`KernelChoice::parse`].
    pub fn name(self) -> &'static str {
        match self {
            KernelChoice::Cranelift => "cranelift",
            KernelChoice::Native => "native",
            KernelChoice::Avx512 => "avx512",
            KernelChoice::Avx512Bf16 => "avx512bf16",
            KernelChoice::AmxBf16 => "amxbf16",
            KernelChoice::Auto => "auto",
        }
    }
}

/// Options of a JIT evaluation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct JitOptions {
    /// GEMM micro-kernel choice.
    pub kernels: KernelChoice,
    /// Whether the blocked GEMM ops (`brgemm`, `brgemm_dgrad`) pack each row
    /// chunk of `A` once for all output blocks (`Some(true)`), read `A` in
    /// place (`Some(false)`), or time both per shape (`None`, the default).
    pub pack_a: Option<bool>,
    /// Whether GEMMs with a long reduction and an f32 result run it in
    /// chunks that keep `B`'s rows in L1 ([`gemm::GemmSpec::kc`]): always
    /// where they can (`Some(true)`), never (`Some(false)`), or timed per
    /// shape (`None`, the default). Every choice gives the same bits.
    pub chunk_k: Option<bool>,
    /// Whether the blocked GEMM ops read a bf16 `A` in place from an f32
    /// copy of each row chunk, widened once for all output blocks
    /// (`Some(true)`, [`gemm::GemmSpec::widened`]), widen it per tile and
    /// output block (`Some(false)`), or time both per shape (`None`, the
    /// default; `DLRM_JIT_WIDEN=0|1` then forces either). The same bits
    /// either way.
    pub widen_a: Option<bool>,
    /// Whether a GEMM whose f32 `B` could be read in place across several
    /// panels (a blocked layer's weight block `[K][bn]` with `bn` more than
    /// one tile wide: 64 columns against the AVX-512 kernel's 32) packs it
    /// once per call instead (`Some(true)`), reads it in place
    /// (`Some(false)`), or times both per shape (`None`, the default;
    /// `DLRM_JIT_PACK_B=0|1` then forces either). Packing costs a pass over
    /// the weights every call, most of a layer's time at serving batches;
    /// in place, each panel's rows are `bn` floats apart. The same bits
    /// either way.
    pub pack_b: Option<bool>,
}

/// Compilation statistics of a [`Jit`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct JitStats {
    /// Kernels compiled.
    pub compiled: usize,
    /// Total compile time, in seconds.
    pub compile_s: f64,
    /// Cache hits.
    pub hits: u64,
}

/// The kernel kinds of the cache, each declared once: its accessor on [`Jit`]
/// (compiled on first use of a spec, then shared), its spec, its compiled
/// kernel and the function that compiles it. Generates [`Key`], [`Compiled`]
/// and the accessors.
macro_rules! kernel_kinds {
    ($($(#[$doc:meta])* $vis:vis fn $name:ident => $variant:ident($spec:ty) -> $kernel:ty = $compile:path;)*) => {
        /// A key of any cached kernel.
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        pub(crate) enum Key {
            $($variant($spec),)*
        }

        /// Any cached kernel.
        #[derive(Clone, Copy, Debug)]
        pub(crate) enum Compiled {
            $($variant($kernel),)*
        }

        impl Jit {
            $(
                $(#[$doc])*
                $vis fn $name(&self, spec: $spec) -> Result<$kernel, JitError> {
                    match self.cached(Key::$variant(spec), || $compile(self, spec).map(Compiled::$variant))? {
                        Compiled::$variant(k) => Ok(k),
                        #[allow(unreachable_patterns)]
                        _ => Err(JitError::Codegen("cache entry of the wrong kind".into())),
                    }
                }
            )*
        }
    };
}

kernel_kinds! {
    /// The GEMM kernel for a normalized spec (see [`Jit::gemm`]).
    fn gemm_normalized => Gemm(gemm::GemmSpec) -> gemm::GemmKernel = gemm::compile;
    /// The elementwise kernel for `spec`.
    pub fn elementwise => Elementwise(elementwise::EwSpec) -> elementwise::EwKernel = elementwise::compile;
    /// The embedding-bag kernel (forward or backward) for `spec`.
    pub fn embedding => Embedding(embedding::BagSpec) -> embedding::BagKernel = embedding::compile;
    /// The sparse (embedding) update kernel for `spec`.
    pub fn sparse => Sparse(sparse::SparseSpec) -> sparse::SparseKernel = sparse::compile_sparse;
    /// The dense update kernel for `spec`.
    pub fn dense => Dense(sparse::DenseSpec) -> sparse::DenseKernel = sparse::compile_dense;
    /// The Adagrad update kernel for `spec`.
    pub fn adagrad => Adagrad(adagrad::AdagradSpec) -> adagrad::AdagradKernel = adagrad::compile;
    /// The dot-interaction kernel (forward or backward) for `spec`.
    pub fn interaction => Interaction(interaction::DotSpec) -> interaction::DotKernel = interaction::compile;
    /// The row-copy kernel (`block_act`, `unblock_act`, `cat`) for `spec`.
    pub fn copy => Copy(layout::CopySpec) -> layout::CopyKernel = layout::compile;
    /// The loss kernel (`bce_logits`, `bce`, `mse`, their gradients, and
    /// `sigmoid`) for `spec`.
    pub fn loss => Loss(loss::LossSpec) -> loss::LossKernel = loss::compile;
    /// The column-sum kernel (`linear_db`; weighted: one-column `brgemm_wgrad`)
    /// for `spec`.
    pub fn db => Db(reduce::DbSpec) -> reduce::DbKernel = reduce::compile;
    /// The row-dot kernel (`brgemm` with one-column blocks) for `spec`.
    pub fn row_dot => RowDot(reduce::RowDotSpec) -> reduce::RowDotKernel = reduce::compile_row_dot;
}

/// [`Jit::pick_variant`]'s remembered picks.
type AutoPicks = HashMap<(gemm::GemmSpec, bool, JitOptions), gemm::GemmSpec>;

/// The JIT: ISA, modules and kernel cache (see the module docs).
pub struct Jit {
    isa: OwnedTargetIsa,
    /// The same target without the e-graph optimizer (`opt_level=none`): keeps
    /// the emitted instruction order, which the register-blocked kernels (the
    /// Cranelift GEMM micro-kernel, the interaction) rely on: the optimizer
    /// sinks every pure op of an unrolled block below all of its loads, which
    /// spills the accumulators ([`Jit::in_order_module`]).
    isa_in_order: OwnedTargetIsa,
    modules: Mutex<Vec<JITModule>>,
    cache: Mutex<HashMap<Key, Compiled>>,
    /// Picks per GEMM spec (its micro field set to Cranelift), packability
    /// and options: timed, or the only candidate.
    auto: Mutex<AutoPicks>,
    stats: Mutex<JitStats>,
}

impl Jit {
    /// A JIT for the host CPU (`cranelift-native` ISA, `opt_level=speed`).
    pub fn new() -> Result<Jit, JitError> {
        let make = |opt: &str| -> Result<OwnedTargetIsa, JitError> {
            let mut fb = settings::builder();
            for (k, v) in [
                ("opt_level", opt),
                ("use_colocated_libcalls", "false"),
                ("is_pic", "false"),
            ] {
                fb.set(k, v).map_err(JitError::module)?;
            }
            cranelift_native::builder()
                .map_err(JitError::module)?
                .finish(settings::Flags::new(fb))
                .map_err(JitError::module)
        };
        Ok(Jit {
            isa: make("speed")?,
            isa_in_order: make("none")?,
            modules: Mutex::new(Vec::new()),
            cache: Mutex::new(HashMap::new()),
            auto: Mutex::new(HashMap::new()),
            stats: Mutex::new(JitStats::default()),
        })
    }

    /// The process-wide JIT (created on first use).
    pub fn global() -> Result<&'static Jit, JitError> {
        static JIT: OnceLock<Result<Jit, JitError>> = OnceLock::new();
        JIT.get_or_init(Jit::new).as_ref().map_err(Clone::clone)
    }

    /// Compilation statistics so far.
    pub fn stats(&self) -> JitStats {
        *lock(&self.stats)
    }

    /// A fresh module (no micro-kernel symbol registered).
    pub(crate) fn new_module(&self) -> Result<JITModule, JitError> {
        self.module_with(gemm::Micro::Cranelift, false)
    }

    /// A fresh module (no micro-kernel symbol registered) on the ISA without the
    /// e-graph optimizer: for generators that interleave each load with the
    /// multiply-adds that use it and need that order kept. With the optimizer,
    /// the interaction's backward kept all 64 loads of a 32-column chunk live
    /// before its FMAs and spilled them (`DLRM_JIT_DISASM`: 1,229 stack accesses
    /// against 257 in order; `interaction_grad` 1.7–2.2 against 1.2–1.4 ms per
    /// step in 3 interleaved `--bench` runs).
    pub(crate) fn in_order_module(&self) -> Result<JITModule, JitError> {
        self.module_with(gemm::Micro::Cranelift, true)
    }

    /// A fresh module; `in_order` selects the ISA without the e-graph optimizer.
    pub(crate) fn module_with(
        &self,
        micro: gemm::Micro,
        in_order: bool,
    ) -> Result<JITModule, JitError> {
        let isa = if in_order {
            self.isa_in_order.clone()
        } else {
            self.isa.clone()
        };
        let symbol = match micro.kernel() {
            None => None,
            Some(k) => Some((k.symbol, k.entry_ptr().ok_or(JitError::NoNative(k.name))?)),
        };
        Ok(module_of(isa, symbol.as_slice()))
    }

    /// A fresh module (optimizing ISA) in which each `(name, address)` of
    /// `symbols` is a symbol the generated code may import (functions with the C
    /// call convention, alive for the process).
    pub(crate) fn module_with_symbols(
        &self,
        symbols: &[(&str, *const u8)],
    ) -> Result<JITModule, JitError> {
        Ok(module_of(self.isa.clone(), symbols))
    }

    /// Generates the exported function `name` in `module` (fresh from
    /// [`Jit::new_module`] or [`Jit::module_with`], with any imports the body
    /// calls already declared), finalizes it (see [`Jit::define_and_finalize`])
    /// and returns its address.
    ///
    /// The signature is `ptrs` pointer parameters, then one parameter of each of
    /// `scalars`, no results, the platform's default call convention (C).
    /// `body(module, b, params)` emits the code from the entry block, whose
    /// parameters are `params` (one per function parameter, in order), and
    /// leaves `b` in an open block: the `return` is appended here. The caller
    /// transmutes the address to the `extern "C"` fn type of that signature.
    pub(crate) fn compile_fn(
        &self,
        mut module: JITModule,
        name: &str,
        ptrs: usize,
        scalars: &[types::Type],
        body: impl FnOnce(&mut JITModule, &mut FunctionBuilder<'_>, &[Value]),
    ) -> Result<*const u8, JitError> {
        let ptr = module.target_config().pointer_type();
        let mut sig = module.make_signature();
        sig.params.extend((0..ptrs).map(|_| AbiParam::new(ptr)));
        sig.params.extend(scalars.iter().map(|&t| AbiParam::new(t)));
        let id = module
            .declare_function(name, Linkage::Export, &sig)
            .map_err(JitError::module)?;
        let mut ctx = module.make_context();
        ctx.func.signature = sig;
        let mut fctx = FunctionBuilderContext::new();
        {
            let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
            let entry = b.create_block();
            b.append_block_params_for_function_params(entry);
            b.switch_to_block(entry);
            let params = b.block_params(entry).to_vec();
            body(&mut module, &mut b, &params);
            b.ins().return_(&[]);
            b.seal_all_blocks();
            b.finalize(module.target_config());
        }
        self.define_and_finalize(module, id, &mut ctx)
    }

    /// Defines `id` from `ctx`, finalizes the module, keeps it alive and returns
    /// the function's address.
    fn define_and_finalize(
        &self,
        mut module: JITModule,
        id: FuncId,
        ctx: &mut cranelift_codegen::Context,
    ) -> Result<*const u8, JitError> {
        let disasm = std::env::var_os("DLRM_JIT_DISASM").is_some();
        if disasm {
            ctx.set_disasm(true);
        }
        module
            .define_function(id, ctx)
            .map_err(|e| JitError::Codegen(format!("{e:?}")))?;
        if disasm && let Some(code) = ctx.compiled_code() {
            eprintln!("{}", code.vcode.as_deref().unwrap_or("(no disassembly)"));
        }
        module.clear_context(ctx);
        module.finalize_definitions().map_err(JitError::module)?;
        let f = module.get_finalized_function(id);
        lock(&self.modules).push(module);
        Ok(f)
    }

    fn cached(
        &self,
        key: Key,
        build: impl FnOnce() -> Result<Compiled, JitError>,
    ) -> Result<Compiled, JitError> {
        if let Some(k) = lock(&self.cache).get(&key) {
            lock(&self.stats).hits += 1;
            return Ok(*k);
        }
        // Compile outside the cache lock (another thread may compile the same
        // key meanwhile; the first insert wins, both are valid).
        let t0 = Instant::now();
        let k = build()?;
        {
            let mut st = lock(&self.stats);
            st.compiled += 1;
            st.compile_s += t0.elapsed().as_secs_f64();
        }
        Ok(*lock(&self.cache).entry(key).or_insert(k))
    }

    /// The GEMM kernel for `spec` (compiled on first use).
    /// The spec is [`gemm::GemmSpec::normalized`] first: read the compiled
    /// kernel's [`gemm::GemmKernel::spec`] for the operand layouts it expects.
    pub fn gemm(&self, spec: gemm::GemmSpec) -> Result<gemm::GemmKernel, JitError> {
        let spec = spec.normalized();
        if !spec.micro.available() {
            return Err(JitError::NoNative(spec.micro.name()));
        }
        if spec.micro.b_packing() == micro::BPacking::KPairs && !spec.bf16_dot_fits() {
            return Err(JitError::Args {
                kernel: format!("{spec:?}"),
                reason: "the BF16 micro-kernels need bf16 A with paired k steps".into(),
            });
        }
        self.gemm_normalized(spec)
    }

    /// The spec to compile for `spec` under `opts`: its micro-kernel
    /// ([`JitOptions::kernels`]) and, when `packable` (the caller can pack `A`
    /// itself: [`gemm::GemmSpec::pack_a`] with `A` widened to f32), whether to
    /// pack ([`JitOptions::pack_a`]). `bf16_b`: `B` is bf16 in memory, so the
    /// k-pair kernels (AVX-512 BF16, AMX-BF16: `B` packed in k pairs) compute
    /// exact products; for such a spec whose `A` fits them, `Avx512Bf16` and
    /// `AmxBf16` force their kernel, and `Auto` picks AMX-BF16 where available,
    /// else AVX-512 BF16 where it pays ([`micro::probe::bf16_dot_pays`]: on
    /// Intel Xeons it runs at half the FMA kernels' rate), else times the FMA
    /// kernels as for f32. The k-pair kernels are not timed: their sums differ
    /// from the FMA kernels' and from each other's in the last bits, so a
    /// timing race between them would make a run's numbers differ from one
    /// process to the next (a resumed run must repeat the uninterrupted one
    /// bit for bit); the timed candidates below all give the same bits. With
    /// more than one candidate, `trial` runs each once (a warm-up, timed),
    /// then those within [`race::PRUNE`] of the fastest three or more times, taking
    /// turns, on the first call of a shape, and the fastest is remembered (a
    /// chunked one only by [`race::CHUNK_MARGIN`] over its unchunked twin:
    /// [`race::race_winner`]).
    pub(crate) fn pick_variant(
        &self,
        spec: gemm::GemmSpec,
        opts: &JitOptions,
        (packable, bf16_b): (bool, bool),
        trial: &mut dyn FnMut(gemm::GemmKernel) -> Result<(), JitError>,
    ) -> Result<gemm::GemmSpec, JitError> {
        use gemm::Micro;
        let key = gemm::GemmSpec {
            micro: Micro::Cranelift,
            ..spec
        };
        let pick_key = (key, packable, *opts);
        let picked = |s: gemm::GemmSpec| {
            lock(&self.auto).insert(pick_key, s);
            Ok(s)
        };
        let k_pairs = bf16_b && spec.bf16_dot_fits();
        let forced = match opts.kernels {
            KernelChoice::Avx512Bf16 => Some(Micro::Bf16Dot),
            KernelChoice::AmxBf16 => Some(Micro::Amx),
            KernelChoice::Auto if k_pairs => [Micro::Amx, Micro::Bf16Dot]
                .into_iter()
                .find(|&m| m.available() && (m != Micro::Bf16Dot || micro::probe::bf16_dot_pays())),
            _ => None,
        };
        if let Some(m) = forced
            && !m.available()
        {
            return Err(JitError::NoNative(m.name()));
        }
        // A k-pair kernel is chosen, not timed; only its reduction chunks
        // (the same bits) are.
        let k_pair = forced.filter(|_| k_pairs);
        let micros: Vec<Micro> = match opts.kernels {
            _ if k_pair.is_some() => k_pair.into_iter().collect(),
            KernelChoice::Cranelift => vec![Micro::Cranelift],
            KernelChoice::Native => vec![Micro::Native],
            KernelChoice::Avx512 | KernelChoice::Avx512Bf16 | KernelChoice::AmxBf16 => {
                vec![Micro::Native512]
            }
            KernelChoice::Auto => [Micro::Cranelift, Micro::Native, Micro::Native512]
                .into_iter()
                .filter(|m| m.available())
                .collect(),
        };
        if let Some(m) = micros.iter().find(|m| !m.available()) {
            return Err(JitError::NoNative(m.name()));
        }
        let pack_a = env_choice(opts.pack_a, "DLRM_JIT_PACK_A");
        let packs: &[bool] = match (packable && !spec.pack_a && k_pair.is_none(), pack_a) {
            (false, _) => &[false],
            (true, None) => &[false, true],
            (true, Some(true)) => &[true],
            (true, Some(false)) => &[false],
        };
        let chunk_k = env_choice(opts.chunk_k, "DLRM_JIT_CHUNK_K");
        // A bf16 blocked `A` read in place may also be widened once per row
        // chunk (`GemmSpec::widened`, `JitOptions::widen_a`).
        let widen = env_choice(opts.widen_a, "DLRM_JIT_WIDEN");
        let pack_b = env_choice(opts.pack_b, "DLRM_JIT_PACK_B");
        let mut candidates = Vec::new();
        for &micro in &micros {
            for &pack in packs {
                let plain = gemm::GemmSpec { micro, ..spec };
                let widened = plain
                    .widened(micro.mr())
                    .filter(|_| packable && k_pair.is_none());
                let forms = match (pack, widened, widen) {
                    (true, ..) => vec![gemm::GemmSpec {
                        micro,
                        pack_a: true,
                        a: gemm::Elt::F32,
                        ..spec
                    }],
                    (false, Some(w), Some(true)) => vec![w],
                    (false, Some(w), None) => vec![plain, w],
                    (false, ..) => vec![plain],
                };
                for c in forms.into_iter().flat_map(|c| race::b_forms(c, pack_b)) {
                    candidates.push(c);
                    // The same in reduction chunks (the same sums, bit for bit).
                    let kc = c.normalized().chunk_for();
                    if kc > 0 && chunk_k != Some(false) {
                        candidates.push(gemm::GemmSpec { kc, ..c });
                    }
                }
            }
        }
        if chunk_k == Some(true) {
            let chunked: Vec<_> = candidates.iter().copied().filter(|c| c.kc > 0).collect();
            if !chunked.is_empty() {
                candidates = chunked;
            }
        }
        if let [only] = candidates[..] {
            return picked(only);
        }
        if let Some(&s) = lock(&self.auto).get(&pick_key) {
            return Ok(s);
        }
        picked(self.race(&candidates, trial)?)
    }

    /// How many GEMM shapes [`Jit::pick_variant`] has given to each
    /// micro-kernel so far (timed picks and forced ones alike), by name, with
    /// `A` packed or widened per row chunk, a weight block packed per call
    /// and the reduction in chunks counted apart:
    /// e.g. `("AVX-512, A packed, B packed, k chunks", 3)`.
    pub fn gemm_picks(&self) -> Vec<(String, usize)> {
        let mut counts = std::collections::BTreeMap::new();
        for ((key, ..), s) in lock(&self.auto).iter() {
            *counts.entry(race::form_name(*s, *key)).or_insert(0) += 1;
        }
        counts.into_iter().collect()
    }
}

/// `choice`, or where the options leave it open, `var=0|1` from the
/// environment (`DLRM_JIT_PACK_A`, `DLRM_JIT_CHUNK_K`, `DLRM_JIT_WIDEN`,
/// `DLRM_JIT_PACK_B`: to
/// compare [`Jit::pick_variant`]'s forms in a whole run).
fn env_choice(choice: Option<bool>, var: &str) -> Option<bool> {
    choice.or_else(|| match std::env::var(var).as_deref() {
        Ok("0") => Some(false),
        Ok("1") => Some(true),
        _ => None,
    })
}

/// A JIT module for `isa` with `symbols` registered.
fn module_of(isa: OwnedTargetIsa, symbols: &[(&str, *const u8)]) -> JITModule {
    let mut jb = JITBuilder::with_isa(isa, cranelift_module::default_libcall_names());
    for &(name, p) in symbols {
        jb.symbol(name, p);
    }
    JITModule::new(jb)
}

/// Locks a mutex, recovering from poisoning (the data are caches: a panic in
/// another thread leaves them consistent).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Evaluates `op` with JIT kernels, if there are some for this op and these
/// dtypes; `None` means "no JIT kernel" (the caller uses the reference kernels,
/// then the interpreter). Same contract as [`crate::try_eval`]: errors (shapes,
/// out-of-range indices naming the sample) are found before any output exists.
/// The op's instance for these operands is verified first
/// ([`NodeInstance::of_operands`], only for an op with a JIT kernel); a plan
/// that keeps its instances calls [`try_eval_instance`].
pub fn try_eval(
    op: &Op,
    inputs: &[&Tensor],
    out_types: &[TensorType],
    syms: &HashMap<String, usize>,
    opts: &JitOptions,
) -> Option<KResult<Vec<Tensor>>> {
    let slot = std::cell::OnceCell::new();
    dispatch(op, out_types, syms, opts, || {
        let inst = NodeInstance::of_operands(op, inputs, out_types, syms)
            .map_err(|reason| crate::reference::instance_err(op, reason))?;
        crate::reference::bind(slot.get_or_init(|| inst), inputs)
    })
}

/// [`try_eval`] with the node's verified instance (built once per symbol
/// binding). The operands are checked against it first ([`NodeInstance::bind`]:
/// dtypes, shapes and every buffer's length, the one check of the call in front
/// of the generated code); the kernels then take the
/// [`Checked`] operands.
pub fn try_eval_instance(
    inst: &NodeInstance,
    inputs: &[&Tensor],
    out_types: &[TensorType],
    syms: &HashMap<String, usize>,
    opts: &JitOptions,
) -> Option<KResult<Vec<Tensor>>> {
    dispatch(inst.op(), out_types, syms, opts, || {
        crate::reference::bind(inst, inputs)
    })
}

/// The JIT kernel of `op` on the operands `bind` checks, called only for an op
/// that has one (`None`: no JIT kernel for this op or these dtypes, or no JIT on
/// this machine). Its match is the one list of the ops the JIT covers.
fn dispatch<'a>(
    op: &Op,
    out_types: &[TensorType],
    syms: &HashMap<String, usize>,
    opts: &JitOptions,
    bind: impl FnOnce() -> KResult<Checked<'a>>,
) -> Option<KResult<Vec<Tensor>>> {
    // `$c`: the checked operands and `$jit` the JIT (bound and fetched here, so
    // only for an op with a kernel).
    macro_rules! checked {
        (($jit:ident, $c:ident) => $run:expr) => {{
            let $jit = Jit::global().ok()?;
            let $c = match bind() {
                Ok(c) => c,
                Err(e) => return Some(Err(e)),
            };
            let $c = &$c;
            $run
        }};
    }
    let res = match op {
        Op::Linear { act } => checked!((jit, c) => linear::linear(jit, opts, *act, c, out_types)),
        Op::LinearDx => checked!((jit, c) => linear::linear_dx(jit, opts, c, out_types)),
        Op::LinearDw => checked!((jit, c) => linear::linear_dw(jit, opts, c, out_types)),
        Op::LinearDb => checked!((jit, c) => reduce::linear_db(jit, c, out_types)),
        Op::Brgemm { .. } | Op::BrgemmDgrad { .. } | Op::BrgemmWgrad { .. } => {
            checked!((jit, c) => brgemm::eval(jit, opts, c, out_types))
        }
        Op::EmbeddingBag { mode, last_offset } => checked!((jit, c) => {
            embedding::embedding_bag(jit, (*mode, false, *last_offset), Rows::All, c, out_types)
        }),
        // A module op's JIT kernel, from the registry (`None`: the reference
        // kernel, then the interpreter).
        Op::Module(m) => {
            let run = crate::modules::jit(m)?;
            checked!((jit, c) => run(jit, m, c, out_types, opts))
        }
        Op::EmbeddingBagWeighted => checked!((jit, c) => {
            embedding::embedding_bag(jit, (Pool::Sum, true, false), Rows::All, c, out_types)
        }),
        Op::EmbeddingBagRows { mode, lo, rows } => checked!((jit, c) => {
            let shard = Rows::Shard {
                first: *lo,
                total: *rows,
            };
            embedding::embedding_bag(jit, (*mode, false, false), shard, c, out_types)
        }),
        Op::EmbeddingGradDense { mode, rows } => checked!((jit, c) => {
            sparse::embedding_grad_dense(jit, *mode, *rows, c, out_types)
        }),
        Op::EmbeddingBagGrad { mode, last_offset } => checked!((jit, c) => {
            embedding::embedding_bag_grad(jit, (*mode, *last_offset), c, out_types)
        }),
        Op::Relu | Op::ReluGrad | Op::SigmoidGrad | Op::Add => {
            checked!((jit, c) => elementwise::eval(jit, c, out_types))
        }
        Op::Interaction {
            kind: InteractionKind::Cat,
            ..
        }
        | Op::InteractionGrad {
            kind: InteractionKind::Cat,
            ..
        }
        | Op::BlockAct { .. }
        | Op::UnblockAct { .. } => checked!((jit, c) => layout::eval(jit, c, out_types)),
        Op::Interaction { .. } | Op::InteractionGrad { .. } => {
            checked!((jit, c) => interaction::eval(jit, opts, c, out_types))
        }
        Op::BceLogits { .. }
        | Op::BceLogitsGrad { .. }
        | Op::Bce { .. }
        | Op::BceGrad { .. }
        | Op::Mse { .. }
        | Op::MseGrad { .. }
        | Op::Sigmoid => checked!((jit, c) => loss::eval(jit, c, out_types, syms)),
        _ => None,
    }?;
    Some(res.and_then(|outs| crate::reference::check_results(op, outs, out_types, syms)))
}
