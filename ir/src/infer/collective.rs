//! Shape and dtype inference of the collectives (`all_reduce`, `all_to_all`).
//! Same rules as `infer`: plain messages, the caller attaches the node.

use super::R;
use crate::op::{A2aDir, Op};
use crate::types::{DType, Dim, TensorType};

/// The result types of a collective.
pub(super) fn infer_collective(
    op: &Op,
    ins: &[&TensorType],
    declared: &[TensorType],
) -> R<Vec<TensorType>> {
    match op {
        Op::AllReduce => {
            for (i, t) in ins.iter().enumerate() {
                if t.dtype != DType::F32 {
                    return Err(format!("all_reduce operand {i} must be f32, got {t}"));
                }
            }
            Ok(ins.iter().map(|t| (*t).clone()).collect())
        }
        Op::AllToAll { dir, counts, rank } => infer_all_to_all(*dir, counts, *rank, ins, declared),
        _ => Err(format!("internal: `{}` is not a collective", op.mnemonic())),
    }
}

fn infer_all_to_all(
    dir: A2aDir,
    counts: &[usize],
    rank: usize,
    ins: &[&TensorType],
    declared: &[TensorType],
) -> R<Vec<TensorType>> {
    if rank >= counts.len() {
        return Err(format!(
            "rank {rank} out of range for {} ranks",
            counts.len()
        ));
    }
    let total = counts
        .iter()
        .try_fold(0usize, |a, &c| a.checked_add(c))
        .ok_or("all_to_all counts overflow")?;
    let own_start: usize = counts[..rank].iter().sum();
    let own = counts[rank];
    let (n_in, n_out, from, to) = match dir {
        A2aDir::Scatter => (own, total, Dim::global(), Dim::batch()),
        A2aDir::Gather => (total, own, Dim::batch(), Dim::global()),
    };
    if ins.len() != n_in {
        return Err(format!(
            "all_to_all {dir:?} on rank {rank} takes {n_in} operands, got {}",
            ins.len()
        ));
    }
    for (i, t) in ins.iter().enumerate() {
        if t.shape.first() != Some(&from) {
            return Err(format!(
                "all_to_all operand {i} {t} must have leading dimension {from}"
            ));
        }
    }
    let retag = |t: &TensorType, d: &Dim| {
        let mut t = t.clone();
        t.shape[0] = d.clone();
        t
    };
    match dir {
        A2aDir::Scatter => {
            if declared.len() != n_out {
                return Err(format!(
                    "all_to_all scatter must declare {n_out} result types (the owners' tensors), got {}",
                    declared.len()
                ));
            }
            for (i, t) in declared.iter().enumerate() {
                if t.shape.first() != Some(&to) {
                    return Err(format!(
                        "all_to_all result {i} {t} must have leading dimension {to}"
                    ));
                }
            }
            for k in 0..own {
                let want = retag(ins[k], &to);
                if declared[own_start + k] != want {
                    return Err(format!(
                        "all_to_all result {} is this rank's operand {k}: expected {want}, got {}",
                        own_start + k,
                        declared[own_start + k]
                    ));
                }
            }
            Ok(declared.to_vec())
        }
        A2aDir::Gather => Ok((0..own).map(|k| retag(ins[own_start + k], &to)).collect()),
    }
}
