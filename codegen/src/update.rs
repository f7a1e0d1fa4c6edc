//! In-place parameter updates (the optimizer ops `sgd`, `split_sgd`, `sparse_sgd`,
//! `embedding_update`, `split_embedding_update`, and the row-shard forms
//! `sparse_sgd_rows`, `embedding_update_rows`, `split_embedding_update_rows`; the
//! Adagrad updates `adagrad`, `sparse_adagrad`, `embedding_update_adagrad`,
//! `embedding_update_adagrad_rows`; the module updates `split_adagrad` and
//! `split_embedding_update_adagrad`, [`crate::reference::split_adagrad`], their
//! kernels found in the module registry, [`crate::modules`])
//! with the best kernel there is: a
//! JIT kernel when the caller allows it and one exists for these dtypes, else the
//! reference kernel ([`crate::reference::optim`]).
//!
//! The updated parameters are operands `0..k` of the op (`k` from
//! [`in_place_operands`]: 2 for the Split-SGD-BF16 ops, whose operands 0 and 1 are
//! the high and low halves, and for the Adagrad ops, whose operands 0 and 1 are the
//! weight and its accumulator; 3 for the Split-Adagrad ops (high half, low half,
//! accumulator); else 1); they are modified in place and are the op's
//! `k` results. The operands are checked against the update's [`NodeInstance`]
//! ([`NodeInstance::bind_mut`]: shapes and dtypes verified once by the op's shape
//! rule, each buffer's length per call); every kernel then validates the data
//! (every index, offsets) before writing: on error the parameters are
//! unchanged. A `sparse_sgd` / `sparse_adagrad` given the bounds of a
//! `last_offset` bag is
//! applied to the indices inside them only ([`dlrm_ir::interp::narrow_to_bags`]).

use crate::jit::{self, JitOptions};
use crate::reference::{self, Hyper, KResult, KernelError, Rows, instance_err};
use dlrm_ir::{CheckedMut, Dim, NodeInstance, Op, Tensor, TensorType};
use std::collections::HashMap;

/// How many leading operands of `op` are updated in place (and are its results);
/// `None` for an op that is not an in-place update ([`Op::in_place_operands`]).
pub fn in_place_operands(op: &Op) -> Option<usize> {
    op.in_place_operands()
}

/// Applies the update `op` to `params` (its first [`in_place_operands`] operands)
/// given the remaining operands `rest`. `jit`: use JIT kernels where there are
/// some (`None`: reference kernels only). `None` when `op` is not an in-place
/// update or the counts do not fit it (the caller uses the interpreter).
///
/// A call outside a plan: the op's instance for these operands is verified first
/// ([`NodeInstance::of_operands`]); a plan that keeps its instances calls
/// [`update_in_place_instance`].
pub fn update_in_place(
    op: &Op,
    params: &mut [Tensor],
    rest: &[&Tensor],
    jit: Option<&JitOptions>,
) -> Option<KResult<()>> {
    if in_place_operands(op)? != params.len() {
        return None;
    }
    match instance_of(op, params, rest) {
        Ok(inst) => update_in_place_instance(&inst, None, params, rest, jit),
        Err(reason) => Some(Err(instance_err(op, reason))),
    }
}

/// The instance of the update `op` for these operands: its results are the
/// parameters, of their own types.
fn instance_of(op: &Op, params: &[Tensor], rest: &[&Tensor]) -> Result<NodeInstance, String> {
    let all: Vec<&Tensor> = params.iter().chain(rest.iter().copied()).collect();
    let outs: Vec<TensorType> = params
        .iter()
        .map(|t| TensorType::new(t.dtype(), t.shape.iter().map(|&d| Dim::Fixed(d))))
        .collect();
    NodeInstance::of_operands(op, &all, &outs, &HashMap::new())
}

/// [`update_in_place`] with the update node's verified instance (built once per
/// symbol binding): the parameters and operands are checked against it
/// ([`NodeInstance::bind_mut`], the one check of each call), then the kernel runs
/// on the checked operands without re-deriving the op's shape rule. `lr`: the
/// step's learning rate, replacing the op's ([`Op::with_lr`]).
///
/// A `sparse_sgd` / `sparse_adagrad` given the bounds of a `last_offset` bag is
/// applied to the indices inside them only: the operands are checked against
/// the instance as given, then narrowed to the bags
/// ([`dlrm_ir::interp::narrow_to_bags`]: the bounds are data, so the narrowed
/// indices' length differs per call), and the narrowed call verifies its own
/// instance ([`NodeInstance::of_operands`], per call: three operands).
pub fn update_in_place_instance(
    inst: &NodeInstance,
    lr: Option<f32>,
    params: &mut [Tensor],
    rest: &[&Tensor],
    jit: Option<&JitOptions>,
) -> Option<KResult<()>> {
    let op = match lr {
        Some(lr) => inst.op().with_lr(lr),
        None => inst.op().clone(),
    };
    if in_place_operands(&op)? != params.len() {
        return None;
    }
    let mut c = match inst.bind_mut(params, rest) {
        Ok(c) => c,
        Err(reason) => return Some(Err(instance_err(&op, reason))),
    };
    if let (Op::SparseSgd { .. } | Op::SparseAdagrad { .. }, [idx, g, bounds]) = (&op, rest) {
        // A `last_offset` bag's bounds: only the indices the bag reads are
        // applied (the others are checked by no one and touch no row).
        let (i, g) = match dlrm_ir::interp::narrow_to_bags(idx, g, bounds) {
            Ok(narrowed) => narrowed,
            Err(reason) => return Some(Err(instance_err(&op, reason))),
        };
        let narrowed = match instance_of(&op, params, &[&i, &g]) {
            Ok(n) => n,
            Err(reason) => return Some(Err(instance_err(&op, reason))),
        };
        return update_in_place_instance(&narrowed, None, params, &[&i, &g], jit);
    }
    if let Op::Module(m) = &op {
        return crate::modules::update(m, &mut c, jit.is_some());
    }
    if jit.is_some()
        && let Some(r) = jit::sparse::update_in_place(&op, &mut c)
            .or_else(|| jit::adagrad::update_in_place(&op, &mut c))
    {
        return Some(r);
    }
    reference(&op, &mut c)
}

/// The update `op` on checked operands with the reference kernels (`None`: not
/// an update with a reference kernel).
fn reference(op: &Op, c: &mut CheckedMut<'_>) -> Option<KResult<()>> {
    use reference::{adagrad, optim};
    let rows = rows_of(op);
    Some(match *op {
        Op::Sgd { lr } => optim::sgd(c, lr),
        Op::SplitSgd { lr } => optim::split_sgd(c, lr),
        Op::SparseSgd { lr } | Op::SparseSgdRows { lr, .. } => optim::sparse_sgd(c, rows, lr),
        Op::EmbeddingUpdate { mode, lr } | Op::EmbeddingUpdateRows { mode, lr, .. } => {
            optim::embedding_update(c, rows, mode, lr)
        }
        Op::SplitEmbeddingUpdate { mode, lr } | Op::SplitEmbeddingUpdateRows { mode, lr, .. } => {
            optim::split_embedding_update(c, rows, mode, lr)
        }
        Op::Adagrad {
            lr,
            eps,
            wd,
            rowwise,
        } => adagrad::adagrad(c, Hyper { lr, eps, rowwise }, wd),
        Op::SparseAdagrad { lr, eps, rowwise } => {
            let h = Hyper { lr, eps, rowwise };
            adagrad::sparse_adagrad(c, Rows::All, h, &adagrad::reference_row(h))
        }
        _ => {
            let (mode, h) = op.embedding_adagrad()?;
            adagrad::embedding_update_adagrad(c, rows, mode, h, &adagrad::reference_row(h))
        }
    })
}

/// [`update_in_place`] with the reference kernels, for the public single-update
/// wrappers ([`reference::sgd_in_place`], [`reference::sparse_sgd_in_place`]).
pub(crate) fn reference_in_place(op: &Op, params: &mut [Tensor], rest: &[&Tensor]) -> KResult<()> {
    update_in_place(op, params, rest, None).unwrap_or_else(|| {
        Err(KernelError::Shape {
            op: op.mnemonic(),
            reason: format!("no in-place kernel for {} parameters", params.len()),
        })
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
