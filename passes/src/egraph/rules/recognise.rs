//! Theme `recognise`: DLRM-level ops from their pieces.
//!
//! - `fuse-linear-relu`, `fuse-linear-sigmoid`: an activation after a plain
//!   `linear` becomes the linear's epilogue.
//!
//! (matmul + add(bias) -> linear, gemm with transB, and concat + batched matmul +
//! lower-triangle gather -> interaction need the generic ONNX ops, which this
//! branch does not have yet.)

use super::super::lang::{Dl, Types};
use egg::{Rewrite, rewrite};

/// The rules of this theme.
pub fn rules() -> Vec<Rewrite<Dl, Types>> {
    vec![
        rewrite!("fuse-linear-relu";    "(relu (linear act=none ?x ?w ?b))"    => "(linear act=relu ?x ?w ?b)"),
        rewrite!("fuse-linear-sigmoid"; "(sigmoid (linear act=none ?x ?w ?b))" => "(linear act=sigmoid ?x ?w ?b)"),
    ]
}
