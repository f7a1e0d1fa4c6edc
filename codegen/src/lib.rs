//! dlrm-codegen: dlrmc's kernels.
//!
//! For now this crate holds the plain-Rust *reference kernels* ([`kernels`]): fast,
//! parallel (rayon) implementations of the heavy ops — linear layers and their
//! gradients as `matrixmultiply` GEMMs with a fused bias + activation epilogue,
//! embedding bags, interactions — and the in-place optimizer updates, including the
//! SC20 race-free sparse update. Every kernel computes what `dlrm_ir::interp::eval_op`
//! defines (up to float reassociation for GEMMs and dot products, bitwise for the
//! optimizer updates); the tests check it. The Cranelift JIT comes later and will use
//! these kernels as its oracle.
//!
//! Callers ask [`try_eval`] first and fall back to the interpreter when it answers
//! `None` (an op or dtype without a fast kernel).

#![warn(missing_docs)]

pub mod cost;
pub mod jit;
pub mod kernels;

pub use jit::{Jit, JitError, JitOptions, KernelChoice};
pub use kernels::{KernelError, sgd_in_place, sparse_sgd_in_place, try_eval};
