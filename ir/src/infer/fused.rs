//! Shape and dtype inference of the fused and blocked ops the e-graph and the
//! precision pass introduce (blocked layouts, `brgemm` and its gradients, fused
//! loss and updates). Same rules as `infer`: plain messages, the caller attaches
//! the node.

use super::{
    R, expect_arity, expect_bags, expect_dim, expect_float, expect_int, expect_rank,
    expect_same_shape, float_result,
};
use crate::op::{Act, Op};
use crate::types::{DType, Dim, TensorType};

/// `ceil(n / b)`; `b` must be positive.
fn blocks(what: &str, n: usize, b: usize) -> R<usize> {
    if b == 0 {
        return Err(format!("{what}: block size must be positive"));
    }
    Ok(n.div_ceil(b))
}

pub(super) fn fixed_dim(what: &str, d: &Dim) -> R<usize> {
    d.fixed()
        .ok_or_else(|| format!("{what} must be a fixed dimension, got {d}"))
}

/// Checks that `n` unpadded entries fit `nb` blocks of `b` exactly (the last block
/// not empty).
fn fits_blocks(what: &str, n: usize, nb: usize, b: usize) -> R<()> {
    if nb == blocks(what, n, b)? {
        Ok(())
    } else {
        Err(format!(
            "{what}: {n} entries need {} blocks of {b}, got {nb}",
            n.div_ceil(b)
        ))
    }
}

/// The operands `(dy, y, last)` of `brgemm_dgrad`/`brgemm_wgrad`: `act=none` takes
/// `(dy, last)` (y is not needed; dy stands for it), the others `(dy, y, last)`.
fn dy_y_last<'a>(
    op: &Op,
    act: crate::op::Act,
    ins: &[&'a TensorType],
) -> R<(&'a TensorType, &'a TensorType, &'a TensorType)> {
    if act == crate::op::Act::None {
        expect_arity(op, ins, &[2])?;
        Ok((ins[0], ins[0], ins[1]))
    } else {
        expect_arity(op, ins, &[3])?;
        Ok((ins[0], ins[1], ins[2]))
    }
}

/// Result types of the fused and blocked ops (see their docs in `op.rs`).
pub(super) fn infer_fused(op: &Op, ins: &[&TensorType]) -> R<Vec<TensorType>> {
    let f = Dim::Fixed;
    match op {
        Op::BlockAct { bk, dtype } => {
            expect_arity(op, ins, &[1])?;
            let x = ins[0];
            expect_rank("x", x, 2)?;
            expect_float("x", x)?;
            let k = fixed_dim("x features", &x.shape[1])?;
            let kb = blocks("block_act", k, *bk)?;
            Ok(vec![TensorType::new(
                *dtype,
                [f(kb), x.shape[0].clone(), f(*bk)],
            )])
        }
        Op::UnblockAct { k, dtype } => {
            expect_arity(op, ins, &[1])?;
            let xb = ins[0];
            expect_rank("blocked x", xb, 3)?;
            expect_float("blocked x", xb)?;
            let kb = fixed_dim("blocks", &xb.shape[0])?;
            let bk = fixed_dim("block width", &xb.shape[2])?;
            fits_blocks("unblock_act", *k, kb, bk)?;
            Ok(vec![TensorType::new(*dtype, [xb.shape[1].clone(), f(*k)])])
        }
        Op::BlockWeight { bn, bk } => {
            expect_arity(op, ins, &[1])?;
            let w = ins[0];
            expect_rank("weight", w, 2)?;
            expect_float("weight", w)?;
            let n = fixed_dim("weight rows", &w.shape[0])?;
            let k = fixed_dim("weight columns", &w.shape[1])?;
            Ok(vec![TensorType::new(
                w.dtype,
                [
                    f(blocks("block_weight", n, *bn)?),
                    f(blocks("block_weight", k, *bk)?),
                    f(*bk),
                    f(*bn),
                ],
            )])
        }
        Op::UnblockWeight { n, k } => {
            expect_arity(op, ins, &[1])?;
            let wb = ins[0];
            expect_rank("blocked weight", wb, 4)?;
            expect_float("blocked weight", wb)?;
            let d: Vec<usize> = wb
                .shape
                .iter()
                .map(|d| fixed_dim("blocked weight", d))
                .collect::<R<_>>()?;
            fits_blocks("unblock_weight rows", *n, d[0], d[3])?;
            fits_blocks("unblock_weight columns", *k, d[1], d[2])?;
            Ok(vec![TensorType::new(wb.dtype, [f(*n), f(*k)])])
        }
        Op::Brgemm { .. } => brgemm(op, ins),
        Op::BrgemmDgrad { act, mask, dtype } => brgemm_dgrad(op, *act, *mask, *dtype, ins),
        Op::BrgemmWgrad { act, n } => brgemm_wgrad(op, *act, *n, ins),
        Op::BceLogits { .. } => {
            expect_arity(op, ins, &[2])?;
            expect_float("logits", ins[0])?;
            expect_float("label", ins[1])?;
            expect_same_shape("logits", ins[0], "label", ins[1])?;
            Ok(vec![TensorType::scalar_f32()])
        }
        Op::BceLogitsGrad { .. } => {
            expect_arity(op, ins, &[2])?;
            expect_float("logits", ins[0])?;
            expect_float("label", ins[1])?;
            expect_same_shape("logits", ins[0], "label", ins[1])?;
            Ok(vec![ins[0].with_dtype(DType::F32)])
        }
        Op::SplitSgd { .. } | Op::EmbeddingUpdate { .. } | Op::SplitEmbeddingUpdate { .. } => {
            updates(op, ins)
        }
        other => Err(format!(
            "internal: `{}` is not a fused op",
            other.mnemonic()
        )),
    }
}

/// `brgemm(xb, wb[, b])`: the blocked forward layer (see [`Op::Brgemm`]).
fn brgemm(op: &Op, ins: &[&TensorType]) -> R<Vec<TensorType>> {
    expect_arity(op, ins, &[2, 3])?;
    let (xb, wb) = (ins[0], ins[1]);
    expect_rank("blocked x", xb, 3)?;
    expect_rank("blocked weight", wb, 4)?;
    for (n, t) in [("blocked x", xb), ("blocked weight", wb)] {
        expect_float(n, t)?;
    }
    expect_dim(
        "x blocks vs weight column blocks",
        &xb.shape[0],
        &wb.shape[1],
    )?;
    expect_dim("x block width vs weight bk", &xb.shape[2], &wb.shape[2])?;
    let nb = fixed_dim("weight row blocks", &wb.shape[0])?;
    let bn = fixed_dim("weight bn", &wb.shape[3])?;
    if let Some(b) = ins.get(2) {
        expect_rank("bias", b, 1)?;
        expect_float("bias", b)?;
        let n = fixed_dim("bias length", &b.shape[0])?;
        fits_blocks("brgemm bias", n, nb, bn)?;
    }
    Ok(vec![TensorType::new(
        float_result(&[xb, wb]),
        [Dim::Fixed(nb), xb.shape[1].clone(), Dim::Fixed(bn)],
    )])
}

/// `brgemm_dgrad(dy[, y], wb[, xb])` (see [`Op::BrgemmDgrad`]).
fn brgemm_dgrad(
    op: &Op,
    act: Act,
    mask: Act,
    dtype: DType,
    ins: &[&TensorType],
) -> R<Vec<TensorType>> {
    let (ins, xb) = match mask {
        Act::None => (ins, None),
        _ => match ins.split_last() {
            Some((xb, rest)) => (rest, Some(*xb)),
            None => (ins, None),
        },
    };
    let (dy, y, wb) = dy_y_last(op, act, ins)?;
    expect_rank("blocked dy", dy, 3)?;
    expect_rank("blocked weight", wb, 4)?;
    expect_float("blocked dy", dy)?;
    expect_float("blocked y", y)?;
    expect_same_shape("blocked dy", dy, "blocked y", y)?;
    expect_dim("dy blocks vs weight row blocks", &dy.shape[0], &wb.shape[0])?;
    expect_dim("dy block width vs weight bn", &dy.shape[2], &wb.shape[3])?;
    expect_float("blocked weight", wb)?;
    if !dtype.is_float() {
        return Err(format!(
            "brgemm_dgrad dtype must be f32 or bf16, got {dtype}"
        ));
    }
    let dx = TensorType::new(
        dtype,
        [
            wb.shape[1].clone(),
            dy.shape[1].clone(),
            wb.shape[2].clone(),
        ],
    );
    if let Some(xb) = xb {
        expect_rank("blocked x (mask)", xb, 3)?;
        expect_float("blocked x (mask)", xb)?;
        expect_same_shape("blocked x (mask)", xb, "the result", &dx)?;
    }
    Ok(vec![dx])
}

/// `brgemm_wgrad(dy[, y], xb)` (see [`Op::BrgemmWgrad`]).
fn brgemm_wgrad(op: &Op, act: Act, n: usize, ins: &[&TensorType]) -> R<Vec<TensorType>> {
    let f = Dim::Fixed;
    let (dy, y, xb) = dy_y_last(op, act, ins)?;
    expect_rank("blocked dy", dy, 3)?;
    expect_rank("blocked x", xb, 3)?;
    expect_float("blocked dy", dy)?;
    expect_float("blocked y", y)?;
    expect_float("blocked x", xb)?;
    expect_same_shape("blocked dy", dy, "blocked y", y)?;
    expect_dim("dy vs x samples", &dy.shape[1], &xb.shape[1])?;
    let nb = fixed_dim("dy blocks", &dy.shape[0])?;
    let bn = fixed_dim("dy block width", &dy.shape[2])?;
    fits_blocks("brgemm_wgrad n", n, nb, bn)?;
    Ok(vec![
        TensorType::new(
            DType::F32,
            [
                dy.shape[0].clone(),
                xb.shape[0].clone(),
                xb.shape[2].clone(),
                dy.shape[2].clone(),
            ],
        ),
        TensorType::new(DType::F32, [f(n)]),
    ])
}

/// The fused and split updates: `split_sgd`, `embedding_update`,
/// `split_embedding_update` (see their docs in `op.rs`).
fn updates(op: &Op, ins: &[&TensorType]) -> R<Vec<TensorType>> {
    match op {
        Op::SplitSgd { .. } => {
            expect_arity(op, ins, &[3])?;
            let (hi, lo, g) = (ins[0], ins[1], ins[2]);
            for (what, t) in [("high half", hi), ("low half", lo)] {
                if t.dtype != DType::BF16 {
                    return Err(format!("split_sgd {what} must be bf16, got {t}"));
                }
            }
            expect_float("gradient", g)?;
            expect_same_shape("high half", hi, "low half", lo)?;
            expect_same_shape("weight", hi, "gradient", g)?;
            Ok(vec![hi.clone(), lo.clone()])
        }
        Op::EmbeddingUpdate { .. } => {
            expect_arity(op, ins, &[3, 4])?;
            let (table, dy) = (ins[0], ins[1]);
            expect_rank("table", table, 2)?;
            expect_float("table", table)?;
            expect_rank("dy", dy, 2)?;
            expect_float("dy", dy)?;
            expect_dim("dy width vs table width", &dy.shape[1], &table.shape[1])?;
            expect_int("indices", ins[2])?;
            if ins.len() == 3 {
                expect_rank("indices (fixed pooling)", ins[2], 2)?;
                expect_dim("indices samples", &ins[2].shape[0], &dy.shape[0])?;
            } else {
                expect_rank("indices (with offsets)", ins[2], 1)?;
                expect_int("offsets", ins[3])?;
                expect_rank("offsets", ins[3], 1)?;
                expect_bags(ins[2], ins[3])?;
                expect_dim("offsets samples", &ins[3].shape[0], &dy.shape[0])?;
            }
            Ok(vec![table.clone()])
        }
        Op::SplitEmbeddingUpdate { mode, lr } => {
            expect_arity(op, ins, &[4, 5])?;
            let (hi, lo) = (ins[0], ins[1]);
            for (what, t) in [("high half", hi), ("low half", lo)] {
                if t.dtype != DType::BF16 {
                    return Err(format!(
                        "split_embedding_update {what} must be bf16, got {t}"
                    ));
                }
            }
            expect_same_shape("high half", hi, "low half", lo)?;
            let mut rest = vec![hi];
            rest.extend_from_slice(&ins[2..]);
            let fused = Op::EmbeddingUpdate {
                mode: *mode,
                lr: *lr,
            };
            infer_fused(&fused, &rest)?;
            Ok(vec![hi.clone(), lo.clone()])
        }
        other => Err(format!(
            "internal: `{}` is not a fused update",
            other.mnemonic()
        )),
    }
}
