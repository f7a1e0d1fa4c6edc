//! Shape and dtype inference of the embedding bags (`embedding_bag` and its
//! gradient) and of their row-shard forms. Same rules as `infer`: plain messages,
//! the caller attaches the node.

use super::fused::{fixed_dim, infer_fused};
use super::{R, expect_arity, expect_dim, expect_float, expect_int, expect_rank, infer};
use crate::dim::DimExpr;
use crate::op::Op;
use crate::types::{DType, Dim, TensorType};

/// The result types of `embedding_bag` and `embedding_bag_grad`.
pub(super) fn infer_embedding(op: &Op, ins: &[&TensorType]) -> R<Vec<TensorType>> {
    match op {
        Op::EmbeddingBag { last_offset, .. } => {
            expect_arity(op, ins, if *last_offset { &[3] } else { &[2, 3] })?;
            let table = ins[0];
            expect_rank("table", table, 2)?;
            expect_float("table", table)?;
            expect_int("indices", ins[1])?;
            let d = table.shape[1].clone();
            let s = if ins.len() == 2 {
                expect_rank("indices (fixed pooling)", ins[1], 2)?;
                ins[1].shape[0].clone()
            } else {
                expect_rank("indices (with offsets)", ins[1], 1)?;
                expect_int("offsets", ins[2])?;
                expect_rank("offsets", ins[2], 1)?;
                if !*last_offset {
                    expect_bags(ins[1], ins[2])?;
                }
                bag_count(&ins[2].shape[0], *last_offset)?
            };
            Ok(vec![TensorType::new(table.dtype, [s, d])])
        }
        Op::EmbeddingBagGrad { last_offset, .. } => {
            expect_arity(op, ins, if *last_offset { &[3, 4] } else { &[2, 3, 4] })?;
            let dy = ins[0];
            expect_rank("dy", dy, 2)?;
            expect_float("dy", dy)?;
            expect_int("indices", ins[1])?;
            let d = dy.shape[1].clone();
            if ins.len() == 2 {
                expect_rank("indices (fixed pooling)", ins[1], 2)?;
                expect_dim("indices samples", &ins[1].shape[0], &dy.shape[0])?;
                let mut shape = ins[1].shape.clone();
                shape.push(d);
                Ok(vec![TensorType::new(DType::F32, shape)])
            } else {
                expect_rank("indices (with offsets)", ins[1], 1)?;
                expect_rank("offsets", ins[2], 1)?;
                expect_int("offsets", ins[2])?;
                if !*last_offset {
                    expect_bags(ins[1], ins[2])?;
                }
                let s = bag_count(&ins[2].shape[0], *last_offset)?;
                expect_dim("offsets samples", &s, &dy.shape[0])?;
                if let Some(w) = ins.get(3) {
                    if matches!(
                        op,
                        Op::EmbeddingBagGrad {
                            mode: crate::Pool::Mean,
                            ..
                        }
                    ) {
                        return Err("per-sample weights need mode sum".into());
                    }
                    expect_rank("weights", w, 1)?;
                    expect_float("weights", w)?;
                    expect_dim("weights", &w.shape[0], &ins[1].shape[0])?;
                }
                Ok(vec![TensorType::new(
                    DType::F32,
                    [ins[1].shape[0].clone(), d],
                )])
            }
        }
        _ => Err(format!(
            "internal: `{}` is not an embedding bag",
            op.mnemonic()
        )),
    }
}

/// The result types of the row-shard forms of the embedding ops.
pub(super) fn infer_sharded(
    op: &Op,
    ins: &[&TensorType],
    declared: &[TensorType],
) -> R<Vec<TensorType>> {
    match op {
        Op::EmbeddingBagRows { mode, lo, rows } => {
            shard_range(op, ins, *lo, *rows)?;
            infer(
                &Op::EmbeddingBag {
                    mode: *mode,
                    last_offset: false,
                },
                ins,
                declared,
            )
        }
        Op::EmbeddingUpdateRows { mode, lr, lo, rows } => {
            shard_range(op, ins, *lo, *rows)?;
            let fused = Op::EmbeddingUpdate {
                mode: *mode,
                lr: *lr,
            };
            infer_fused(&fused, ins)
        }
        Op::SplitEmbeddingUpdateRows { mode, lr, lo, rows } => {
            shard_range(op, ins, *lo, *rows)?;
            let fused = Op::SplitEmbeddingUpdate {
                mode: *mode,
                lr: *lr,
            };
            infer(&fused, ins, declared)
        }
        Op::EmbeddingGradDense { mode, rows } => {
            infer(
                &Op::EmbeddingBagGrad {
                    mode: *mode,
                    last_offset: false,
                },
                ins,
                declared,
            )?;
            let d = ins[0].shape[1].clone();
            Ok(vec![TensorType::new(DType::F32, [Dim::Fixed(*rows), d])])
        }
        // ---- generic ops (ONNX import)
        _ => Err(format!(
            "internal: `{}` is not a sharded embedding op",
            op.mnemonic()
        )),
    }
}

/// The number of bags of an offsets vector of length `len`: `len`, or `len - 1`
/// with `last_offset` (the last entry ends the last bag).
fn bag_count(len: &Dim, last_offset: bool) -> R<Dim> {
    if !last_offset {
        return Ok(len.clone());
    }
    len.to_expr()
        .sub(&DimExpr::int(1))
        .and_then(Dim::from_expr)
        .ok_or_else(|| {
            format!(
                "offsets of length {len} with last_offset need at least one entry (the end of the last bag)"
            )
        })
}

/// Refuses `indices[N]` with empty `offsets` (no bags) when `N > 0`: indices no
/// bag holds. Checked when both lengths are known (always on an instance).
pub(super) fn expect_bags(indices: &TensorType, offsets: &TensorType) -> R<()> {
    match (indices.shape.first(), offsets.shape.first()) {
        (Some(Dim::Fixed(n)), Some(Dim::Fixed(0))) if *n > 0 => {
            Err(format!("{n} indices but no bags (offsets is empty)"))
        }
        _ => Ok(()),
    }
}

/// Checks that a shard (operand 0, `[Rs, D]`) holds rows `lo .. lo+Rs` of a table of
/// `rows` rows.
pub(super) fn shard_range(op: &Op, ins: &[&TensorType], lo: usize, rows: usize) -> R<()> {
    let Some(shard) = ins.first() else {
        return Err(format!(
            "`{}` needs the table shard as operand 0",
            op.mnemonic()
        ));
    };
    expect_rank("table shard", shard, 2)?;
    let rs = fixed_dim("the table shard's rows", &shard.shape[0])?;
    if lo.checked_add(rs).is_none_or(|hi| hi > rows) {
        return Err(format!(
            "the shard {shard} starting at row {lo} does not fit a table of {rows} rows"
        ));
    }
    Ok(())
}
