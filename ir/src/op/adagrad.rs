//! Adagrad's hyper-parameters as its update ops carry them, read in one place
//! for the interpreter and the kernels.

use super::{Op, Pool};

/// Adagrad's hyper-parameters (the dense update's weight decay apart).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdagradHyper {
    /// Learning rate.
    pub lr: f32,
    /// Added to the accumulator's root.
    pub eps: f32,
    /// One accumulator per row.
    pub rowwise: bool,
}

impl Op {
    /// The pooling of the bags a fused Adagrad update differentiates and its
    /// hyper-parameters: `embedding_update_adagrad` and its row-shard form
    /// `embedding_update_adagrad_rows` (whose shard is [`Op`]'s `lo`/`rows`);
    /// `None` for any other op.
    pub fn embedding_adagrad(&self) -> Option<(Pool, AdagradHyper)> {
        match *self {
            Op::EmbeddingUpdateAdagrad {
                mode,
                lr,
                eps,
                rowwise,
            }
            | Op::EmbeddingUpdateAdagradRows {
                mode,
                lr,
                eps,
                rowwise,
                ..
            } => Some((mode, AdagradHyper { lr, eps, rowwise })),
            _ => None,
        }
    }
}
