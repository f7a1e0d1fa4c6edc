//! The op registry: ONNX `(domain, op_type)` to builder functions, split by theme
//! (`math`: arithmetic, matrix products, reductions, casts; `nn`: activations and
//! `Gemm`; `array`: shapes, indexing, constants; `control`: `If`, `Loop` and the
//! sequence ops of the EmbeddingBag loops, the segment-sum bag of exports).
//! Builders read attributes through [`crate::attrs::Attrs`] and operands through
//! the import context, and return one value per node output.

mod array;
mod control;
mod math;
mod nn;

use crate::import::{Ctx, NodeCx, NodeErr, Val};
pub(crate) use array::{dim_sym, numel_sym, sym_dim};
use std::collections::HashMap;

/// A builder's result: one value per output (missing trailing outputs are unbound).
pub(crate) type Built = Result<Vec<Val>, NodeErr>;

/// An op builder.
pub(crate) type Builder = fn(&mut Ctx<'_>, &NodeCx<'_>) -> Built;

/// Every supported op of the default domain (`""` / `ai.onnx`).
pub(crate) fn registry() -> HashMap<&'static str, Builder> {
    let mut r: HashMap<&'static str, Builder> = HashMap::new();
    math::register(&mut r);
    nn::register(&mut r);
    array::register(&mut r);
    control::register(&mut r);
    r
}

/// A node no builder takes, as the op module that imports it
/// ([`dlrm_ir::module::onnx_import`]; its operands are the node's inputs, in
/// order), `None` when no module does.
pub(crate) fn module(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Option<Built> {
    let domain = n.proto.domain.as_deref().unwrap_or("");
    let node = dlrm_ir::module::OnnxNode {
        op_type: n.op_type().to_string(),
        domain: domain.to_string(),
        opset: cx.opset(domain),
        attrs: n.attrs.onnx(),
    };
    let op = match dlrm_ir::module::onnx_import(&node)? {
        Ok(op) => op,
        Err(reason) => return Some(Err(reason.into())),
    };
    Some((|| {
        let ins = (0..n.n_inputs())
            .map(|k| cx.input(n, k))
            .collect::<Result<Vec<_>, _>>()?;
        let names: Vec<String> = (0..n.proto.output.len()).map(|k| n.out_name(k)).collect();
        Ok(cx.emit_all(op, &ins, &names)?)
    })())
}

/// An ONNX axis (negative counts from the end) for a value of rank `rank`.
pub(crate) fn norm_axis(axis: i64, rank: usize) -> Result<usize, String> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    usize::try_from(a)
        .ok()
        .filter(|&a| a < rank)
        .ok_or_else(|| format!("axis {axis} is out of range for rank {rank}"))
}

/// Normalised, sorted, distinct axes.
pub(crate) fn norm_axes(axes: &[i64], rank: usize) -> Result<Vec<usize>, String> {
    let mut out = axes
        .iter()
        .map(|&a| norm_axis(a, rank))
        .collect::<Result<Vec<_>, _>>()?;
    out.sort_unstable();
    let n = out.len();
    out.dedup();
    if out.len() != n {
        return Err(format!("axes {axes:?} repeat an axis"));
    }
    Ok(out)
}

/// Axes given as an attribute (older opsets) or as input `k` (newer), if any.
pub(crate) fn axes_of(cx: &Ctx<'_>, n: &NodeCx<'_>, k: usize) -> Result<Option<Vec<i64>>, NodeErr> {
    if let Some(a) = n.attrs.ints("axes") {
        return Ok(Some(a));
    }
    match cx.opt_input(n, k)? {
        Some(v) => Ok(Some(cx.const_ints(&v, "axes")?)),
        None => Ok(None),
    }
}
