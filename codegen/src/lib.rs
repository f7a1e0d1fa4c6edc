//! dlrm-codegen: dlrmc's kernels.
//!
//! - [`jit`]: Cranelift JIT kernels, one per op signature, cached process-wide
//!   ([`Jit::global`]): a blocked batch-reduce GEMM core with fused bias/relu
//!   epilogues (linear, dgrad, wgrad, and the blocked `brgemm` family; f32 and
//!   bf16 storage) whose tiles are a
//!   pure-Cranelift f32x4 FMA micro-kernel or a native AVX2+FMA micro-kernel
//!   called through a JIT symbol ([`KernelChoice`]); the `linear_db` bias
//!   gradient; embedding bags and their row gradient (`embedding_bag_grad`);
//!   dot and cat interactions; the `block_act`/`unblock_act` layout copies; the
//!   `bce_logits` and `bce` losses and their gradients; elementwise ops. Entry:
//!   [`jit::try_eval`].
//! - [`reference`](mod@reference): the plain-Rust *reference kernels* (rayon + `matrixmultiply`;
//!   the blocked GEMM family bitwise equal to the interpreter),
//!   the JIT's oracle and fallback, and the in-place optimizer updates including
//!   the SC20 race-free sparse update. Entry: [`try_eval`].
//! - [`update`]: the in-place optimizer updates (JIT kernel, else reference).
//! - [`modules`]: the kernels of the module ops (`dlrm_ir::ops`), one registry
//!   line per op, which the three above consult.
//! - [`work`]: flops and bytes of an op execution (the `--bench` table).
//!
//! Every kernel computes what `dlrm_ir::interp::eval_op` defines (up to float
//! reassociation for GEMMs and dot products; see each module); the tests check
//! it. Callers ask [`jit::try_eval`], then [`try_eval`], and fall back to the
//! interpreter when both answer `None`.

#![warn(missing_docs)]
// Module docs link private helpers; the docs are built with --document-private-items.
#![allow(rustdoc::private_intra_doc_links)]

pub mod jit;
mod modules;
pub mod reference;
pub mod update;
pub mod work;

pub use jit::{Jit, JitError, JitOptions, KernelChoice};
pub use reference::{
    Hyper, KernelError, Rows, sgd_in_place, sparse_sgd_in_place, try_eval, try_eval_instance,
};
pub use update::{in_place_operands, update_in_place, update_in_place_instance};
