//! Module ops (`dlrm_ir::ops`) as their native ONNX node
//! ([`dlrm_ir::module::OpModule::onnx`]) at the exported opset. A module op
//! without one at that opset is decomposed into primitive ops before lowering
//! ([`keeps`]), except a whole-table bag (`bags.rs` writes it).

use super::super::builder::A;
use super::{Fail, Lower, Repr};
use dlrm_ir::module::{ModOp, ONNX_DEFAULT_DOMAIN, OnnxAttr, OnnxNode};
use dlrm_ir::{Node, Op};

/// The native ONNX node of `m` when the model is written at `opset` (of the
/// default domain): from the node's own opset on for a standard op, always
/// for a custom domain's (the model imports that domain at the node's
/// version).
pub(crate) fn native(m: &ModOp, opset: i64) -> Option<OnnxNode> {
    m.onnx()
        .filter(|n| !n.in_default_domain() || opset >= n.opset)
}

/// Whether the exporter writes `m` itself at `opset` (a native node, or a bag),
/// rather than its decomposition.
pub(crate) fn keeps(m: &ModOp, opset: i64) -> bool {
    native(m, opset).is_some() || Op::Module(m.clone()).bag_form().is_some()
}

/// An attribute value as the builder writes it.
fn attr(name: &str, a: &OnnxAttr) -> Result<A, Fail> {
    Ok(match a {
        OnnxAttr::Int(i) => A::Int(*i),
        OnnxAttr::Float(f) => A::Float(*f),
        OnnxAttr::Str(s) => A::Text(s.clone()),
        OnnxAttr::Ints(v) => A::Ints(v.clone()),
        OnnxAttr::Floats(v) => A::Floats(v.clone()),
        OnnxAttr::Other => return Err(format!("attribute `{name}` has no value to write")),
    })
}

impl Lower<'_, '_> {
    /// Module op `m` at `node` as its native ONNX node, one output per result,
    /// each rounded to its result's dtype.
    pub(super) fn module(&mut self, node: &Node, m: &ModOp) -> Result<(), Fail> {
        let Some(onnx) = native(m, self.b.opset) else {
            return Err(format!(
                "`{}` has no ONNX node at opset {} and was not decomposed",
                m.mnemonic(),
                self.b.opset
            ));
        };
        let ins = node
            .inputs
            .iter()
            .map(|&v| self.plain(v))
            .collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<&str> = ins.iter().map(String::as_str).collect();
        let attrs = onnx
            .attrs
            .iter()
            .map(|(k, a)| Ok((k.as_str(), attr(k, a)?)))
            .collect::<Result<Vec<_>, Fail>>()?;
        let first = node.outputs.first().ok_or("a node without results")?;
        let hint = self.g.name_of(*first).to_string();
        let domain = match onnx.in_default_domain() {
            true => ONNX_DEFAULT_DOMAIN,
            false => &onnx.domain,
        };
        let outs = self.b.node_in(
            domain,
            &onnx.op_type,
            &refs,
            attrs,
            &hint,
            node.outputs.len(),
        );
        for (&v, y) in node.outputs.iter().zip(outs) {
            let (dtype, hint) = (self.g.ty(v).dtype, self.g.name_of(v).to_string());
            let y = self.round(y, dtype, &hint);
            self.set(v, Repr::Plain(y));
        }
        Ok(())
    }
}
