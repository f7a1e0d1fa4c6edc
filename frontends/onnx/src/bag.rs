//! Lowering of the EmbeddingBag `Loop`s (to come).

use crate::import::{Ctx, NodeCx};
use crate::ops::Built;

/// Lowers a `Loop` node.
pub(crate) fn lower_loop(_cx: &mut Ctx<'_>, _n: &NodeCx<'_>) -> Built {
    Err("only the EmbeddingBag loops of PyTorch's exporters are supported".into())
}
