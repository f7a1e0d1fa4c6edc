//! The op families whose shape rules and interpreter each live in one module
//! (`infer/fused.rs` and `interp/fused.rs`, `infer/generic.rs` and
//! `interp/generic.rs`): each family is listed once, as a pattern, and both
//! `infer` and the interpreter's dispatch route it with that pattern. An op
//! joins a family here; the matches stay exhaustive. The collectives are a
//! family too ([`Op::is_collective`]).

use super::Op;

impl Op {
    /// True for ops that exchange data between ranks.
    pub fn is_collective(&self) -> bool {
        matches!(self, Op::AllReduce | Op::AllToAll { .. })
    }
}

/// The fused and blocked ops the e-graph and `precision` introduce (shape rules
/// in `infer_fused`, interpreter in `interp::fused`); their row-shard forms are
/// routed apart.
macro_rules! fused_ops {
    () => {
        $crate::Op::BlockAct { .. }
            | $crate::Op::UnblockAct { .. }
            | $crate::Op::BlockWeight { .. }
            | $crate::Op::UnblockWeight { .. }
            | $crate::Op::Brgemm { .. }
            | $crate::Op::BrgemmDgrad { .. }
            | $crate::Op::BrgemmWgrad { .. }
            | $crate::Op::BceLogits { .. }
            | $crate::Op::BceLogitsGrad { .. }
            | $crate::Op::SplitSgd { .. }
            | $crate::Op::EmbeddingUpdate { .. }
            | $crate::Op::SplitEmbeddingUpdate { .. }
    };
}

/// The generic ops of the ONNX import (shape rules in `infer_generic`,
/// interpreter in `interp::generic`).
macro_rules! generic_ops {
    () => {
        $crate::Op::MatMul
            | $crate::Op::Binary { .. }
            | $crate::Op::Transpose { .. }
            | $crate::Op::Gather { .. }
            | $crate::Op::GatherElements { .. }
            | $crate::Op::GatherNd { .. }
            | $crate::Op::Slice { .. }
            | $crate::Op::Reduce { .. }
            | $crate::Op::Cast { .. }
            | $crate::Op::EmbeddingBagWeighted
    };
}

pub(crate) use {fused_ops, generic_ops};
