//! In-place parameter updates (the optimizer ops `sgd`, `split_sgd`, `sparse_sgd`,
//! `embedding_update`, `split_embedding_update`, and the row-shard forms
//! `sparse_sgd_rows`, `embedding_update_rows`, `split_embedding_update_rows`; the
//! Adagrad updates `adagrad`, `sparse_adagrad`, `embedding_update_adagrad`,
//! `embedding_update_adagrad_rows`)
//! with the best kernel there is: a
//! JIT kernel when the caller allows it and one exists for these dtypes, else the
//! reference kernel ([`crate::kernels::optim`]).
//!
//! The updated parameters are operands `0..k` of the op (`k` from
//! [`in_place_operands`]: 2 for the Split-SGD-BF16 ops, whose operands 0 and 1 are
//! the high and low halves, and for the Adagrad ops, whose operands 0 and 1 are the
//! weight and its accumulator; else 1); they are modified in place and are the op's
//! `k` results. Every kernel validates all operands (shapes, dtypes, every index,
//! offsets) before writing: on error the parameters are unchanged. A
//! `sparse_sgd` / `sparse_adagrad` given the bounds of a `last_offset` bag is
//! applied to the indices inside them only ([`dlrm_ir::interp::narrow_to_bags`]).

use crate::jit::{self, JitOptions};
use crate::kernels::{self, Hyper, KResult, KernelError, Rows};
use dlrm_ir::{Op, Tensor};

/// How many leading operands of `op` are updated in place (and are its results);
/// `None` for an op that is not an in-place update ([`Op::in_place_operands`]).
pub fn in_place_operands(op: &Op) -> Option<usize> {
    op.in_place_operands()
}

/// Applies the update `op` to `params` (its first [`in_place_operands`] operands)
/// given the remaining operands `rest`. `jit`: use JIT kernels where there are
/// some (`None`: reference kernels only). `None` when `op` is not an in-place
/// update or the counts do not fit it (the caller uses the interpreter).
pub fn update_in_place(
    op: &Op,
    params: &mut [Tensor],
    rest: &[&Tensor],
    jit: Option<&JitOptions>,
) -> Option<KResult<()>> {
    let k = in_place_operands(op)?;
    if params.len() != k {
        return None;
    }
    if let (Op::SparseSgd { .. } | Op::SparseAdagrad { .. }, [idx, g, bounds]) = (op, rest) {
        // A `last_offset` bag's bounds: only the indices the bag reads are
        // applied (the others are checked by no one and touch no row).
        return match dlrm_ir::interp::narrow_to_bags(idx, g, bounds) {
            Ok((i, g)) => update_in_place(op, params, &[&i, &g], jit),
            Err(reason) => Some(Err(KernelError::Shape {
                op: op.mnemonic(),
                reason,
            })),
        };
    }
    let arity = |allowed: &[usize]| -> KResult<()> {
        if allowed.contains(&(rest.len() + k)) {
            Ok(())
        } else {
            Err(KernelError::Shape {
                op: op.mnemonic(),
                reason: format!("takes {allowed:?} operands, got {}", rest.len() + k),
            })
        }
    };
    if jit.is_some()
        && let Some(r) = jit::sparse::update_in_place(op, params, rest)
            .or_else(|| jit::adagrad::update_in_place(op, params, rest))
    {
        return Some(r);
    }
    Some(match (op, params) {
        (Op::Sgd { lr }, [w]) => arity(&[2]).and_then(|()| kernels::sgd_in_place(w, rest[0], *lr)),
        (Op::SplitSgd { lr }, [hi, lo]) => {
            arity(&[3]).and_then(|()| kernels::split_sgd_in_place(hi, lo, rest[0], *lr))
        }
        (Op::SparseSgd { lr } | Op::SparseSgdRows { lr, .. }, [t]) => arity(&[3])
            .and_then(|()| kernels::sparse_sgd_in_place(t, rows_of(op), rest[0], rest[1], *lr)),
        (Op::EmbeddingUpdate { mode, lr } | Op::EmbeddingUpdateRows { mode, lr, .. }, [t]) => {
            arity(&[3, 4]).and_then(|()| {
                kernels::embedding_update_in_place(
                    t,
                    rows_of(op),
                    *mode,
                    rest[0],
                    rest[1],
                    rest.get(2).copied(),
                    *lr,
                )
            })
        }
        (
            Op::SplitEmbeddingUpdate { mode, lr } | Op::SplitEmbeddingUpdateRows { mode, lr, .. },
            [hi, lo],
        ) => arity(&[4, 5]).and_then(|()| {
            kernels::split_embedding_update_in_place(
                hi,
                lo,
                rows_of(op),
                *mode,
                rest[0],
                rest[1],
                rest.get(2).copied(),
                *lr,
            )
        }),
        (
            &Op::Adagrad {
                lr,
                eps,
                wd,
                rowwise,
            },
            [w, acc],
        ) => arity(&[3]).and_then(|()| {
            kernels::adagrad_in_place(w, acc, rest[0], Hyper { lr, eps, rowwise }, wd)
        }),
        (&Op::SparseAdagrad { lr, eps, rowwise }, [t, acc]) => arity(&[4]).and_then(|()| {
            kernels::sparse_adagrad_in_place(
                t,
                acc,
                Rows::All,
                rest[0],
                rest[1],
                Hyper { lr, eps, rowwise },
            )
        }),
        (
            &Op::EmbeddingUpdateAdagrad {
                mode,
                lr,
                eps,
                rowwise,
            }
            | &Op::EmbeddingUpdateAdagradRows {
                mode,
                lr,
                eps,
                rowwise,
                ..
            },
            [t, acc],
        ) => arity(&[4, 5]).and_then(|()| {
            kernels::embedding_update_adagrad_in_place(
                t,
                acc,
                rows_of(op),
                mode,
                rest[0],
                rest[1],
                rest.get(2).copied(),
                Hyper { lr, eps, rowwise },
            )
        }),
        _ => return None,
    })
}

/// The table rows an embedding update's parameter holds: a shard for the
/// `*_rows` ops, else the whole table.
pub(crate) fn rows_of(op: &Op) -> Rows {
    match *op {
        Op::SparseSgdRows { lo, rows, .. }
        | Op::EmbeddingUpdateRows { lo, rows, .. }
        | Op::SplitEmbeddingUpdateRows { lo, rows, .. }
        | Op::EmbeddingUpdateAdagradRows { lo, rows, .. } => Rows::Shard {
            first: lo,
            total: rows,
        },
        _ => Rows::All,
    }
}
