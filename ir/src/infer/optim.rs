//! Shape and dtype inference of the Adagrad updates (`adagrad`, `sparse_adagrad`,
//! `embedding_update_adagrad` and its row-shard form). Same rules as `infer`:
//! plain messages, the caller attaches the node.
//!
//! Adagrad state is f32: the weight (or table) and its accumulator must be f32; a
//! bf16 one is refused with "not supported yet" (a bf16 parameter trained by
//! Adagrad is a Split-Adagrad op's, `ir/src/ops/split_adagrad.rs`).

use super::{
    R, expect_arity, expect_dim, expect_float, expect_int, expect_rank, expect_same_shape,
};
use super::{infer, infer_fused, shard_range};
use crate::op::{Op, Pool};
use crate::types::{DType, TensorType};

/// The result types of an Adagrad update op.
pub(super) fn infer_adagrad(op: &Op, ins: &[&TensorType]) -> R<Vec<TensorType>> {
    match *op {
        Op::Adagrad { rowwise, .. } => {
            expect_arity(op, ins, &[3])?;
            let (w, acc, g) = (ins[0], ins[1], ins[2]);
            f32_state("weight", w)?;
            expect_float("gradient", g)?;
            expect_same_shape("weight", w, "gradient", g)?;
            accumulator(w, acc, rowwise)?;
            Ok(vec![w.clone(), acc.clone()])
        }
        Op::SparseAdagrad { rowwise, .. } => {
            expect_arity(op, ins, &[4, 5])?;
            let (table, acc, idx, g) = (ins[0], ins[1], ins[2], ins[3]);
            if let Some(b) = ins.get(4) {
                bag_bounds(idx, b)?;
            }
            expect_rank("table", table, 2)?;
            f32_state("table", table)?;
            accumulator(table, acc, rowwise)?;
            expect_int("indices", idx)?;
            row_gradient(table, idx, g)?;
            expect_float("row gradient", g)?;
            Ok(vec![table.clone(), acc.clone()])
        }
        Op::EmbeddingUpdateAdagrad { mode, rowwise, .. } => fused(op, mode, rowwise, ins),
        Op::EmbeddingUpdateAdagradRows {
            mode,
            rowwise,
            lo,
            rows,
            ..
        } => {
            shard_range(op, ins, lo, rows)?;
            fused(op, mode, rowwise, ins)
        }
        _ => Err(format!(
            "internal: `{}` is not an Adagrad update",
            op.mnemonic()
        )),
    }
}

/// `embedding_update_adagrad(table, acc, dy, indices[, offsets])`: the accumulator,
/// then `embedding_update`'s rule on the other operands.
fn fused(op: &Op, mode: Pool, rowwise: bool, ins: &[&TensorType]) -> R<Vec<TensorType>> {
    expect_arity(op, ins, &[4, 5])?;
    let (table, acc) = (ins[0], ins[1]);
    expect_rank("table", table, 2)?;
    f32_state("table", table)?;
    accumulator(table, acc, rowwise)?;
    let mut rest = vec![table];
    rest.extend_from_slice(&ins[2..]);
    infer_fused(&Op::EmbeddingUpdate { mode, lr: 0.0 }, &rest)?;
    Ok(vec![table.clone(), acc.clone()])
}

/// A weight or table updated by Adagrad must be f32.
fn f32_state(what: &str, t: &TensorType) -> R<()> {
    match t.dtype {
        DType::F32 => Ok(()),
        DType::BF16 => Err(format!(
            "adagrad with a bf16 {what} ({t}) is not supported yet (use fp32 storage, or \
             Split-Adagrad: split_adagrad, split_embedding_update_adagrad)"
        )),
        _ => Err(format!("{what} must be f32, got {t}")),
    }
}

/// The accumulator of `w`: f32, shaped like `w`, or `[R]` for a row-wise `w[R, D]`.
fn accumulator(w: &TensorType, acc: &TensorType, rowwise: bool) -> R<()> {
    if acc.dtype != DType::F32 {
        return Err(format!("the accumulator must be f32, got {acc}"));
    }
    if rowwise {
        expect_rank("a row-wise weight", w, 2)?;
        expect_rank("a row-wise accumulator", acc, 1)?;
        expect_dim("accumulator rows", &acc.shape[0], &w.shape[0])
    } else {
        expect_same_shape("weight", w, "accumulator", acc)
    }
}

/// The optional last operand of `sparse_sgd` / `sparse_adagrad`: the offsets
/// `[S+1]` of the `last_offset` bag over the indices `[N]`, whose range the update
/// is restricted to.
pub(super) fn bag_bounds(idx: &TensorType, bounds: &TensorType) -> R<()> {
    expect_int("bag bounds", bounds)?;
    if idx.rank() != 1 || bounds.rank() != 1 {
        return Err(format!(
            "bag bounds {bounds} need indices[N] and bounds[S+1], got indices {idx}"
        ));
    }
    Ok(())
}

/// The result types of an SGD update op.
pub(super) fn infer_sgd(
    op: &Op,
    ins: &[&TensorType],
    declared: &[TensorType],
) -> R<Vec<TensorType>> {
    match op {
        Op::Sgd { .. } => {
            expect_arity(op, ins, &[2])?;
            expect_float("weight", ins[0])?;
            expect_float("gradient", ins[1])?;
            expect_same_shape("weight", ins[0], "gradient", ins[1])?;
            Ok(vec![ins[0].clone()])
        }
        Op::SparseSgd { .. } => {
            expect_arity(op, ins, &[3, 4])?;
            let (table, idx, g) = (ins[0], ins[1], ins[2]);
            if let Some(b) = ins.get(3) {
                bag_bounds(idx, b)?;
            }
            expect_rank("table", table, 2)?;
            expect_float("table", table)?;
            expect_int("indices", idx)?;
            row_gradient(table, idx, g)?;
            Ok(vec![table.clone()])
        }
        Op::SparseSgdRows { lr, lo, rows } => {
            shard_range(op, ins, *lo, *rows)?;
            infer(&Op::SparseSgd { lr: *lr }, ins, declared)
        }
        _ => Err(format!(
            "internal: `{}` is not an SGD update",
            op.mnemonic()
        )),
    }
}

/// A sparse update's row gradient: one row of the table's width per index
/// (`indices` shape, then the width).
fn row_gradient(table: &TensorType, idx: &TensorType, g: &TensorType) -> R<()> {
    let mut want = idx.shape.clone();
    want.push(table.shape[1].clone());
    if g.shape == want {
        return Ok(());
    }
    Err(format!(
        "row gradient {g} must have shape [{}] (indices shape then the table width)",
        want.iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(",")
    ))
}
