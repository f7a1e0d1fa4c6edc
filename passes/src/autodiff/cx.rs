//! The gradient rules of module ops ([`dlrm_ir::module`]): the backward graph as the
//! modules see it ([`GradCx`]).

use super::{Ad, ID, node_err};
use crate::{PassError, Result};
use dlrm_ir::module::{GradCx, ModOp};
use dlrm_ir::{Graph, Op, ValueId};

/// One forward node of a module op, seen from its gradient rule.
struct Cx<'a> {
    ad: &'a mut Ad,
    inputs: &'a [ValueId],
    outputs: &'a [ValueId],
    dys: &'a [Option<ValueId>],
}

impl GradCx for Cx<'_> {
    fn inputs(&self) -> &[ValueId] {
        self.inputs
    }

    fn outputs(&self) -> &[ValueId] {
        self.outputs
    }

    fn dy(&self, k: usize) -> Option<ValueId> {
        self.dys.get(k).copied().flatten()
    }

    fn needs(&self, k: usize) -> bool {
        self.inputs.get(k).is_some_and(|v| self.ad.need[v.index()])
    }

    fn hint(&self, k: usize) -> String {
        match self.inputs.get(k) {
            Some(&v) => self.ad.hint(v),
            None => format!("d.operand{k}"),
        }
    }

    fn add(
        &mut self,
        op: Op,
        operands: &[ValueId],
        names: &[&str],
    ) -> dlrm_ir::Result<Vec<ValueId>> {
        self.ad.g.add_node(op, operands, names)
    }

    fn contribute(&mut self, k: usize, grad: ValueId) {
        if let Some(&v) = self.inputs.get(k) {
            self.ad.contribute(v, grad);
        }
    }
}

/// Emits the backward of node `n` of `fwd`, a module op `m`, whose results receive
/// the gradients `dys`.
pub(super) fn backward(
    ad: &mut Ad,
    fwd: &Graph,
    n: usize,
    m: &ModOp,
    dys: &[Option<ValueId>],
) -> Result<()> {
    let node = &fwd.nodes()[n];
    if dys.iter().all(Option::is_none) {
        return Ok(());
    }
    let mut cx = Cx {
        ad,
        inputs: &node.inputs,
        outputs: &node.outputs,
        dys,
    };
    m.def().backward(m, &mut cx).map_err(|e| match e {
        dlrm_ir::IrError::Graph { reason, .. } => node_err(fwd, n, &node.op, reason),
        other => PassError::ir(ID)(other),
    })
}
