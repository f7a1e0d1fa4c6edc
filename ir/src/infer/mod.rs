//! Shape and dtype inference: the result types of every op from its operand types.
//!
//! [`infer`] is the single source of truth used by the graph builder and the
//! verifier. Errors are plain messages; callers attach the node.

use crate::op::Op;
use crate::op::family::{fused_ops, generic_ops};
use crate::types::{DType, Dim, TensorType};

mod collective;
mod dense;
mod embedding;
mod fused;
mod generic;
mod interaction;
mod loss;
mod optim;
mod shape;

use embedding::{expect_bags, shard_range};
use fused::infer_fused;
pub use interaction::interaction_width;

type R<T> = Result<T, String>;

fn expect_arity(op: &Op, ins: &[&TensorType], allowed: &[usize]) -> R<()> {
    if allowed.contains(&ins.len()) {
        return Ok(());
    }
    let want: Vec<String> = allowed.iter().map(|n| n.to_string()).collect();
    Err(format!(
        "`{}` takes {} operands, got {}",
        op.mnemonic(),
        want.join(" or "),
        ins.len()
    ))
}

fn expect_rank(what: &str, t: &TensorType, rank: usize) -> R<()> {
    if t.rank() == rank {
        Ok(())
    } else {
        Err(format!("{what} must have rank {rank}, got {t}"))
    }
}

fn expect_float(what: &str, t: &TensorType) -> R<()> {
    if t.dtype.is_float() {
        Ok(())
    } else {
        Err(format!("{what} must be f32 or bf16, got {t}"))
    }
}

fn expect_int(what: &str, t: &TensorType) -> R<()> {
    if t.dtype.is_int() {
        Ok(())
    } else {
        Err(format!("{what} must be i64 or i32, got {t}"))
    }
}

fn expect_dim(what: &str, got: &Dim, want: &Dim) -> R<()> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: expected {want}, got {got}"))
    }
}

fn expect_same_shape(a_what: &str, a: &TensorType, b_what: &str, b: &TensorType) -> R<()> {
    if a.shape == b.shape {
        Ok(())
    } else {
        Err(format!(
            "{a_what} {a} and {b_what} {b} must have the same shape"
        ))
    }
}

/// The f32 result type of a computation over operands of these dtypes: bf16 only
/// when every float operand is bf16.
fn float_result(ts: &[&TensorType]) -> DType {
    if ts
        .iter()
        .filter(|t| t.dtype.is_float())
        .all(|t| t.dtype == DType::BF16)
    {
        DType::BF16
    } else {
        DType::F32
    }
}
/// Infers the result types of `op` applied to operands of types `ins`.
///
/// `declared` is the list of result types written in the graph; it is consulted
/// only by ops whose results cannot be derived from this rank's operands
/// ([`Op::AllToAll`] scatter: the other ranks' tensors), and checked against what
/// can be derived.
pub fn infer(op: &Op, ins: &[&TensorType], declared: &[TensorType]) -> R<Vec<TensorType>> {
    match op {
        Op::Module(m) => m.def().infer(m, ins),
        Op::EmbeddingBag { .. } | Op::EmbeddingBagGrad { .. } => {
            embedding::infer_embedding(op, ins)
        }
        Op::Linear { .. }
        | Op::Relu
        | Op::Sigmoid
        | Op::Add
        | Op::ReluGrad
        | Op::SigmoidGrad
        | Op::LinearDx
        | Op::LinearDw
        | Op::LinearDb => dense::infer_dense(op, ins),
        Op::Interaction { .. } | Op::InteractionGrad { .. } => {
            interaction::infer_interaction(op, ins)
        }
        Op::Concat { .. } | Op::Split { .. } | Op::Reshape { .. } => shape::infer_shape_op(op, ins),
        Op::Bce { .. } | Op::Mse { .. } | Op::BceGrad { .. } | Op::MseGrad { .. } => {
            loss::infer_loss(op, ins)
        }
        Op::Sgd { .. } | Op::SparseSgd { .. } | Op::SparseSgdRows { .. } => {
            optim::infer_sgd(op, ins, declared)
        }
        Op::Adagrad { .. }
        | Op::SparseAdagrad { .. }
        | Op::EmbeddingUpdateAdagrad { .. }
        | Op::EmbeddingUpdateAdagradRows { .. } => optim::infer_adagrad(op, ins),
        Op::AllReduce | Op::AllToAll { .. } => collective::infer_collective(op, ins, declared),
        // ---- fused / blocked ops (e-graph, precision)
        fused_ops!() => infer_fused(op, ins),
        // ---- sharded embeddings
        Op::EmbeddingBagRows { .. }
        | Op::SplitEmbeddingUpdateRows { .. }
        | Op::EmbeddingUpdateRows { .. }
        | Op::EmbeddingGradDense { .. } => embedding::infer_sharded(op, ins, declared),
        // ---- generic ops (ONNX import)
        generic_ops!() | Op::OffsetsFromLengths { .. } => generic::infer_generic(op, ins),
    }
}
