//! The JIT kernels of `interaction_blocked` and `interaction_grad_blocked`
//! (`dlrm_ir::ops::interaction_blocked`, whose doc is the specification): the
//! dot interaction's kernels writing their rows straight into the result's
//! column blocks ([`crate::jit::interaction::eval_blocked`]), where the
//! result's dtype is the interaction's own (what `fuse-interaction-layout`
//! fuses; other dtype mixes run on the interpreter's definition), and reading
//! the gradient's rows from its blocks
//! ([`crate::jit::interaction::eval_grad_blocked`]).

use crate::jit::{Jit, JitOptions};
use crate::reference::KResult;
use dlrm_ir::module::ModOp;
use dlrm_ir::ops::interaction_blocked::{attrs_of, grad_self, interaction_dtype};
use dlrm_ir::{Checked, Tensor, TensorType};

pub(crate) fn interaction_blocked_jit(
    jit: &Jit,
    op: &ModOp,
    c: &Checked<'_>,
    _: &[TensorType],
    opts: &JitOptions,
) -> Option<KResult<Vec<Tensor>>> {
    let (self_interaction, bk, dtype) = attrs_of(op);
    let ins = c.inputs();
    if interaction_dtype(ins) != dtype {
        return None;
    }
    crate::jit::interaction::eval_blocked(jit, opts, ins, (self_interaction, bk), dtype)
        .map(|r| r.map(|t| vec![t]))
}

pub(crate) fn interaction_grad_blocked_jit(
    jit: &Jit,
    op: &ModOp,
    c: &Checked<'_>,
    out_types: &[TensorType],
    opts: &JitOptions,
) -> Option<KResult<Vec<Tensor>>> {
    let out = out_types.first()?.dtype;
    if out_types.iter().any(|t| t.dtype != out) {
        return None;
    }
    crate::jit::interaction::eval_grad_blocked(jit, opts, c.inputs(), grad_self(op), out)
}
