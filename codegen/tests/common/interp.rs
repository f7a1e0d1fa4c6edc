//! One op on concrete operands through the reference interpreter: the result
//! types it infers and the results it computes (a panic names the op on any
//! error, these being tests).

use dlrm_ir::interp::{EvalCtx, eval_op};
use dlrm_ir::{Dim, Op, SingleRank, Tensor, TensorType};
use std::collections::HashMap;

/// The fixed-shape type of `t`.
pub fn ty(t: &Tensor) -> TensorType {
    TensorType::new(t.dtype(), t.shape.iter().map(|&d| Dim::Fixed(d)))
}

/// The result types `op` infers from its operands' types.
pub fn out_types(op: &Op, ins: &[&Tensor]) -> Vec<TensorType> {
    let tys: Vec<TensorType> = ins.iter().map(|t| ty(t)).collect();
    let refs: Vec<&TensorType> = tys.iter().collect();
    dlrm_ir::infer(op, &refs, &[]).unwrap_or_else(|e| panic!("infer {op:?}: {e}"))
}

/// `op`'s results by the interpreter, on one rank, with no symbols bound.
pub fn interp(op: &Op, ins: &[&Tensor]) -> Vec<Tensor> {
    let syms = HashMap::new();
    let ctx = EvalCtx {
        syms: &syms,
        comm: &SingleRank,
    };
    eval_op(op, ins, &out_types(op, ins), &ctx).unwrap_or_else(|e| panic!("interp {op:?}: {e}"))
}
