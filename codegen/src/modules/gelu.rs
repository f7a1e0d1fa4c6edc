//! The kernels of `gelu` and `gelu_grad` (`dlrm_ir::ops::gelu`, whose doc is
//! the specification): per element, the module's own scalar definitions
//! ([`gelu1`], [`gelu_grad1`]), so every kernel equals the interpreter bit for
//! bit. The reference kernels run on f32 operands and results
//! ([`elementwise`]); the JIT kernels (f32 or bf16 storage) call the same
//! functions through a JIT symbol ([`loss::map`]).

use crate::jit::loss::{self, Scalar};
use crate::jit::{Jit, JitOptions};
use crate::reference::{KResult, elementwise};
use dlrm_ir::module::ModOp;
use dlrm_ir::ops::gelu::{gelu_grad1, gelu1};
use dlrm_ir::{Checked, Tensor, TensorType};

extern "C" fn gelu_c(x: f32) -> f32 {
    gelu1(x)
}

extern "C" fn gelu_grad_c(dy: f32, x: f32) -> f32 {
    gelu_grad1(dy, x)
}

/// `gelu` with the reference elementwise map.
pub(crate) fn gelu(_: &ModOp, c: &Checked<'_>) -> Option<KResult<Vec<Tensor>>> {
    Some(elementwise::unary(c, gelu1)?.map(|t| vec![t]))
}

/// `gelu_grad` with the reference elementwise map.
pub(crate) fn gelu_grad(_: &ModOp, c: &Checked<'_>) -> Option<KResult<Vec<Tensor>>> {
    Some(elementwise::binary(c, gelu_grad1)?.map(|t| vec![t]))
}

/// `gelu` with the JIT's pointwise kernel.
pub(crate) fn gelu_jit(
    jit: &Jit,
    _: &ModOp,
    c: &Checked<'_>,
    out_types: &[TensorType],
    _: &JitOptions,
) -> Option<KResult<Vec<Tensor>>> {
    loss::map(jit, c, out_types, Scalar::Unary(gelu_c))
}

/// `gelu_grad` with the JIT's pointwise kernel.
pub(crate) fn gelu_grad_jit(
    jit: &Jit,
    _: &ModOp,
    c: &Checked<'_>,
    out_types: &[TensorType],
    _: &JitOptions,
) -> Option<KResult<Vec<Tensor>>> {
    loss::map(jit, c, out_types, Scalar::Binary(gelu_grad_c))
}
