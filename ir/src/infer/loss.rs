//! Shape and dtype inference of the losses and their gradients. Same rules as
//! `infer`: plain messages, the caller attaches the node.

use super::{R, expect_arity, expect_float, expect_same_shape};
use crate::op::Op;
use crate::types::{DType, TensorType};

/// The result types of a loss or of its gradient.
pub(super) fn infer_loss(op: &Op, ins: &[&TensorType]) -> R<Vec<TensorType>> {
    match op {
        Op::Bce { .. } | Op::Mse { .. } => {
            expect_arity(op, ins, &[2])?;
            expect_float("prediction", ins[0])?;
            expect_float("label", ins[1])?;
            expect_same_shape("prediction", ins[0], "label", ins[1])?;
            Ok(vec![TensorType::scalar_f32()])
        }
        Op::BceGrad { .. } | Op::MseGrad { .. } => {
            expect_arity(op, ins, &[2])?;
            expect_float("prediction", ins[0])?;
            expect_float("label", ins[1])?;
            expect_same_shape("prediction", ins[0], "label", ins[1])?;
            Ok(vec![ins[0].with_dtype(DType::F32)])
        }
        _ => Err(format!("internal: `{}` is not a loss", op.mnemonic())),
    }
}
