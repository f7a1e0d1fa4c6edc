//! Shape and dtype inference of the dense ops: `linear` and its gradients, the
//! activations and their gradients, `add`. Same rules as `infer`: plain messages,
//! the caller attaches the node.

use super::{
    R, expect_arity, expect_dim, expect_float, expect_rank, expect_same_shape, float_result,
};
use crate::op::Op;
use crate::types::{DType, TensorType};

/// The result types of a linear, activation or elementwise op, or of its gradient.
pub(super) fn infer_dense(op: &Op, ins: &[&TensorType]) -> R<Vec<TensorType>> {
    match op {
        Op::Linear { .. } => {
            expect_arity(op, ins, &[3])?;
            let (x, w, b) = (ins[0], ins[1], ins[2]);
            expect_rank("x", x, 2)?;
            expect_rank("weight", w, 2)?;
            expect_rank("bias", b, 1)?;
            for (n, t) in [("x", x), ("weight", w), ("bias", b)] {
                expect_float(n, t)?;
            }
            expect_dim("x features vs weight columns", &x.shape[1], &w.shape[1])?;
            expect_dim("bias length vs weight rows", &b.shape[0], &w.shape[0])?;
            Ok(vec![TensorType::new(
                float_result(&[x, w]),
                [x.shape[0].clone(), w.shape[0].clone()],
            )])
        }
        Op::Relu | Op::Sigmoid => {
            expect_arity(op, ins, &[1])?;
            expect_float("operand", ins[0])?;
            Ok(vec![ins[0].clone()])
        }
        Op::Add => {
            expect_arity(op, ins, &[2])?;
            expect_float("a", ins[0])?;
            expect_float("b", ins[1])?;
            expect_same_shape("a", ins[0], "b", ins[1])?;
            Ok(vec![TensorType::new(
                float_result(ins),
                ins[0].shape.clone(),
            )])
        }
        Op::ReluGrad | Op::SigmoidGrad => {
            // Both read the forward output `y`.
            expect_arity(op, ins, &[2])?;
            expect_float("dy", ins[0])?;
            expect_float("y", ins[1])?;
            expect_same_shape("dy", ins[0], "y", ins[1])?;
            Ok(vec![ins[0].clone()])
        }
        Op::LinearDx => {
            expect_arity(op, ins, &[2])?;
            let (dz, w) = (ins[0], ins[1]);
            expect_rank("dz", dz, 2)?;
            expect_rank("weight", w, 2)?;
            expect_dim("dz width vs weight rows", &dz.shape[1], &w.shape[0])?;
            Ok(vec![TensorType::new(
                DType::F32,
                [dz.shape[0].clone(), w.shape[1].clone()],
            )])
        }
        Op::LinearDw => {
            expect_arity(op, ins, &[2])?;
            let (dz, x) = (ins[0], ins[1]);
            expect_rank("dz", dz, 2)?;
            expect_rank("x", x, 2)?;
            expect_dim("dz vs x samples", &dz.shape[0], &x.shape[0])?;
            Ok(vec![TensorType::new(
                DType::F32,
                [dz.shape[1].clone(), x.shape[1].clone()],
            )])
        }
        Op::LinearDb => {
            expect_arity(op, ins, &[1])?;
            expect_rank("dz", ins[0], 2)?;
            Ok(vec![TensorType::new(DType::F32, [ins[0].shape[1].clone()])])
        }
        _ => Err(format!("internal: `{}` is not a dense op", op.mnemonic())),
    }
}
