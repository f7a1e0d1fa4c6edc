//! Optimizer updates as the executor, the learning-rate schedule and the passes
//! see them: one table of which ops are updates, their rate, their in-place
//! state and where their gradient comes from. An op of [`Op`] answers here by
//! its variant; a module op ([`Op::Module`]) through its
//! [`OpModule::update`](crate::module::OpModule::update) hook.

use super::{Attr, Op, Pool};
use crate::module::UpdateGrad;

/// What a state operand of an update holds ([`Op::state_operands`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// The low 16 bits of a Split-SGD-BF16 f32 master (bf16-typed raw bits).
    LowHalf,
    /// An Adagrad accumulator (f32; per element, or per row when row-wise).
    Accumulator,
}

/// A fused embedding update (the table's rows updated from the bags' output
/// gradient, [`Op::bag_update`]): operand `dy` is the bags' output gradient,
/// the operands after it are the bags' `indices[, offsets]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BagUpdate {
    /// The forward bags' pooling.
    pub mode: Pool,
    /// The operand index of `dy` (after the table and its state).
    pub dy: usize,
    /// `(lo, rows)`: the parameter holds rows `lo .. lo+Rs` of a table of `rows`
    /// rows (a row-shard form, or a module update, whose whole table is the shard
    /// `(0, R)`); `None` for the whole-table forms of [`Op`].
    pub shard: Option<(usize, usize)>,
}

impl Op {
    /// The learning rate of an optimizer update ([`Op::is_update`]), `None` for
    /// every other op.
    ///
    /// The attribute is the rate the graph was compiled with (the *base* rate). A
    /// run may give each training step its own rate (a schedule, `dlrm-run --lr`):
    /// the executor then runs every update of the step as if its `lr` attribute
    /// were the step's rate ([`Op::with_lr`]), so the meaning of each update op is
    /// unchanged and no graph is recompiled.
    pub fn lr(&self) -> Option<f32> {
        match *self {
            Op::Sgd { lr }
            | Op::SparseSgd { lr }
            | Op::Adagrad { lr, .. }
            | Op::SparseAdagrad { lr, .. }
            | Op::SplitSgd { lr }
            | Op::EmbeddingUpdate { lr, .. }
            | Op::SplitEmbeddingUpdate { lr, .. }
            | Op::EmbeddingUpdateAdagrad { lr, .. }
            | Op::SparseSgdRows { lr, .. }
            | Op::EmbeddingUpdateRows { lr, .. }
            | Op::SplitEmbeddingUpdateRows { lr, .. }
            | Op::EmbeddingUpdateAdagradRows { lr, .. } => Some(lr),
            Op::Module(ref m) => m.update().map(|u| u.lr),
            _ => None,
        }
    }

    /// This op with its learning rate replaced by `lr` (an update; any other op is
    /// returned unchanged): how a step's scheduled rate reaches the kernels and the
    /// interpreter (see [`Op::lr`]). A module update's rate is its attribute `lr`.
    pub fn with_lr(&self, lr: f32) -> Op {
        let mut op = self.clone();
        match &mut op {
            Op::Sgd { lr: l }
            | Op::SparseSgd { lr: l }
            | Op::Adagrad { lr: l, .. }
            | Op::SparseAdagrad { lr: l, .. }
            | Op::SplitSgd { lr: l }
            | Op::EmbeddingUpdate { lr: l, .. }
            | Op::SplitEmbeddingUpdate { lr: l, .. }
            | Op::EmbeddingUpdateAdagrad { lr: l, .. }
            | Op::SparseSgdRows { lr: l, .. }
            | Op::EmbeddingUpdateRows { lr: l, .. }
            | Op::SplitEmbeddingUpdateRows { lr: l, .. }
            | Op::EmbeddingUpdateAdagradRows { lr: l, .. } => *l = lr,
            Op::Module(m) if m.update().is_some() => {
                if let Ok(n) = m.with_attr("lr", Attr::Float(lr)) {
                    *m = n;
                }
            }
            _ => {}
        }
        op
    }

    /// True for optimizer updates (their result replaces a parameter).
    pub fn is_update(&self) -> bool {
        match self {
            Op::Sgd { .. }
            | Op::SparseSgd { .. }
            | Op::Adagrad { .. }
            | Op::SparseAdagrad { .. }
            // ---- fused / blocked ops (e-graph, precision)
            | Op::SplitSgd { .. }
            | Op::EmbeddingUpdate { .. }
            | Op::SplitEmbeddingUpdate { .. }
            | Op::EmbeddingUpdateAdagrad { .. }
            // ---- sharded embeddings
            | Op::SparseSgdRows { .. }
            | Op::EmbeddingUpdateRows { .. }
            | Op::SplitEmbeddingUpdateRows { .. }
            | Op::EmbeddingUpdateAdagradRows { .. } => true,
            Op::Module(m) => m.update().is_some(),
            _ => false,
        }
    }

    /// The optimizer state an update keeps beside its parameter: for each state
    /// operand, its index and what it holds (empty for plain SGD updates and
    /// every other op). An update's first `1 + len` operands (the parameter,
    /// operand 0, then its states, operands `1..=len` in order) are updated in
    /// place and are its results ([`Op::in_place_operands`]). The executor, the
    /// memory account and the sharding planner read this one table.
    pub fn state_operands(&self) -> Vec<(usize, State)> {
        match self {
            Op::SplitSgd { .. }
            | Op::SplitEmbeddingUpdate { .. }
            | Op::SplitEmbeddingUpdateRows { .. } => vec![(1, State::LowHalf)],
            Op::Adagrad { .. }
            | Op::SparseAdagrad { .. }
            | Op::EmbeddingUpdateAdagrad { .. }
            | Op::EmbeddingUpdateAdagradRows { .. } => vec![(1, State::Accumulator)],
            Op::Module(m) => m.update().map_or_else(Vec::new, |u| {
                u.states
                    .iter()
                    .enumerate()
                    .map(|(i, &s)| (1 + i, s))
                    .collect()
            }),
            _ => Vec::new(),
        }
    }

    /// How many leading operands of an update are updated in place (and are its
    /// results): the parameter and its states ([`Op::state_operands`]); `None` for
    /// an op that is not an update.
    pub fn in_place_operands(&self) -> Option<usize> {
        if !self.is_update() {
            return None;
        }
        Some(1 + self.state_operands().len())
    }

    /// The operand holding the dense gradient of a dense update (`sgd`,
    /// `split_sgd`, `adagrad`, a module's [`UpdateGrad::Dense`]): the one the
    /// data-parallel partition all-reduces. `None` for every other op.
    pub fn dense_grad_operand(&self) -> Option<usize> {
        match self {
            Op::Sgd { .. } => Some(1),
            Op::SplitSgd { .. } | Op::Adagrad { .. } => Some(2),
            Op::Module(m) => match m.update()?.grad {
                UpdateGrad::Dense(k) => Some(k),
                UpdateGrad::Bags { .. } => None,
            },
            _ => None,
        }
    }

    /// The fused embedding update this op is (`embedding_update`,
    /// `split_embedding_update`, `embedding_update_adagrad`, their row-shard
    /// forms, a module's [`UpdateGrad::Bags`]); `None` for any other op.
    pub fn bag_update(&self) -> Option<BagUpdate> {
        let plain = |mode, dy| BagUpdate {
            mode,
            dy,
            shard: None,
        };
        let shard = |mode, dy, lo, rows| BagUpdate {
            mode,
            dy,
            shard: Some((lo, rows)),
        };
        match *self {
            Op::EmbeddingUpdate { mode, .. } => Some(plain(mode, 1)),
            Op::SplitEmbeddingUpdate { mode, .. } | Op::EmbeddingUpdateAdagrad { mode, .. } => {
                Some(plain(mode, 2))
            }
            Op::EmbeddingUpdateRows { mode, lo, rows, .. } => Some(shard(mode, 1, lo, rows)),
            Op::SplitEmbeddingUpdateRows { mode, lo, rows, .. }
            | Op::EmbeddingUpdateAdagradRows { mode, lo, rows, .. } => {
                Some(shard(mode, 2, lo, rows))
            }
            Op::Module(ref m) => {
                let u = m.update()?;
                match u.grad {
                    UpdateGrad::Bags { mode, lo, rows } => {
                        Some(shard(mode, 1 + u.states.len(), lo, rows))
                    }
                    UpdateGrad::Dense(_) => None,
                }
            }
            _ => None,
        }
    }

    /// A module embedding update ([`UpdateGrad::Bags`]) on the row shard `lo ..
    /// lo+Rs` of a table of `rows` rows (its attributes `lo` and `rows`
    /// replaced); `None` for any other op (the row-shard forms of [`Op`]'s
    /// updates are variants of their own).
    pub fn with_rows(&self, lo: usize, rows: usize) -> Option<Op> {
        let Op::Module(m) = self else { return None };
        let Some(UpdateGrad::Bags { .. }) = m.update().map(|u| u.grad) else {
            return None;
        };
        let m = m
            .with_attr("lo", Attr::Int(lo as i64))
            .and_then(|m| m.with_attr("rows", Attr::Int(rows as i64)))
            .ok()?;
        Some(Op::Module(m))
    }
}
