//! Shape and dtype inference of the feature interaction and its gradient.
//! Same rules as `infer`: plain messages, the caller attaches the node.

use super::{R, expect_dim, expect_float, expect_rank, float_result};
use crate::op::{InteractionKind, Op};
use crate::types::{DType, Dim, TensorType};

/// The result types of `interaction` and `interaction_grad`.
pub(super) fn infer_interaction(op: &Op, ins: &[&TensorType]) -> R<Vec<TensorType>> {
    match op {
        Op::Interaction {
            kind,
            self_interaction,
        } => {
            if ins.is_empty() {
                return Err("`interaction` needs at least the dense operand".into());
            }
            let widths = interaction_operands(ins, *kind)?;
            let w = widths.map(|ws| interaction_width(*kind, *self_interaction, &ws));
            let width = match w {
                Some(w) => Dim::Fixed(w),
                None => return Err("interaction operands need fixed feature widths".into()),
            };
            Ok(vec![TensorType::new(
                float_result(ins),
                [ins[0].shape[0].clone(), width],
            )])
        }
        Op::InteractionGrad {
            kind,
            self_interaction,
        } => {
            if ins.len() < 2 {
                return Err("`interaction_grad` needs dr and at least the dense operand".into());
            }
            let fwd = &ins[1..];
            let widths = interaction_operands(fwd, *kind)?
                .ok_or("interaction operands need fixed feature widths")?;
            let width = interaction_width(*kind, *self_interaction, &widths);
            let dr = ins[0];
            expect_rank("dr", dr, 2)?;
            expect_dim("dr samples", &dr.shape[0], &fwd[0].shape[0])?;
            expect_dim("dr width", &dr.shape[1], &Dim::Fixed(width))?;
            Ok(fwd.iter().map(|t| t.with_dtype(DType::F32)).collect())
        }
        _ => Err(format!(
            "internal: `{}` is not an interaction",
            op.mnemonic()
        )),
    }
}

/// Width of the interaction output for `f` vectors of dimension `d` (saturating:
/// absurd widths give `usize::MAX` rather than overflowing).
pub fn interaction_width(kind: InteractionKind, self_interaction: bool, widths: &[usize]) -> usize {
    match kind {
        InteractionKind::Cat => widths.iter().fold(0usize, |a, &w| a.saturating_add(w)),
        InteractionKind::Dot => {
            let f = widths.len();
            let pairs = if self_interaction {
                f * (f + 1) / 2
            } else {
                f * (f - 1) / 2
            };
            widths[0].saturating_add(pairs)
        }
    }
}

/// Checks interaction operands; returns the feature widths when all are fixed.
fn interaction_operands(ins: &[&TensorType], kind: InteractionKind) -> R<Option<Vec<usize>>> {
    let s = &ins[0]
        .shape
        .first()
        .cloned()
        .ok_or("interaction operands must have rank 2")?;
    let mut widths = Vec::with_capacity(ins.len());
    for (i, t) in ins.iter().enumerate() {
        expect_rank(&format!("interaction operand {i}"), t, 2)?;
        expect_float(&format!("interaction operand {i}"), t)?;
        expect_dim(&format!("interaction operand {i} samples"), &t.shape[0], s)?;
        match t.shape[1].fixed() {
            Some(w) => widths.push(w),
            None => return Ok(None),
        }
    }
    if kind == InteractionKind::Dot && widths.iter().any(|&w| w != widths[0]) {
        return Err(format!(
            "dot interaction needs equal widths (bottom MLP output = embedding dim), got {widths:?}"
        ));
    }
    Ok(Some(widths))
}
