//! Saved activations (pass id `save-activations`, training graphs): a forward op
//! whose gradient recomputes intermediates of the forward is replaced, with its
//! gradient, by a pair that keeps them: `cross` and the `cross_grad` of the same
//! operands become `cross_save` (which also returns `z` and `w`) and
//! `cross_grad_saved` (which takes them), saving a third of the layer's backward
//! flops (`dlrm_ir::ops::cross_saved`). The results are bit for bit those of the
//! recomputing pair; every other node, and every name, is kept.
//!
//! A `cross_grad` whose operands are not those of a `cross` node (an imported
//! graph's own gradient, say) is left as it is.

use crate::pass::Params;
use crate::{Pass, PassError, Ran, Result};
use dlrm_ir::module::{ModOp, rebuild};
use dlrm_ir::{Graph, ValueId};
use std::collections::HashMap;

/// The pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct SaveActivations;

/// The pass id.
pub const ID: &str = "save-activations";

impl Pass for SaveActivations {
    fn id(&self) -> &'static str {
        ID
    }

    fn run(&self, g: Graph, _params: Option<&mut Params>) -> Result<Ran> {
        Ok(save(&g)?.into())
    }
}

/// `g` with each `cross` / `cross_grad` pair replaced (see the module docs).
pub fn save(g: &Graph) -> Result<Graph> {
    let nodes = g.nodes();
    let forward: HashMap<&[ValueId], usize> = (0..nodes.len())
        .filter(|&n| nodes[n].op.is_module("cross"))
        .map(|n| (nodes[n].inputs.as_slice(), n))
        .collect();
    // grad node -> its forward node
    let pairs: HashMap<usize, usize> = (0..nodes.len())
        .filter(|&n| nodes[n].op.is_module("cross_grad"))
        .filter_map(|n| Some((n, *forward.get(&nodes[n].inputs[1..])?)))
        .collect();
    if pairs.is_empty() {
        return Ok(g.clone());
    }
    let saving: std::collections::HashSet<usize> = pairs.values().copied().collect();
    let mut saved: HashMap<usize, (ValueId, ValueId)> = HashMap::new();
    rebuild(g, &mut |n, _node, out, ins, names| {
        if saving.contains(&n) {
            let (z, w) = (
                format!("{}.saved.z", names[0]),
                format!("{}.saved.w", names[0]),
            );
            let r = out.add_node(ModOp::op("cross_save"), ins, &[names[0], &z, &w]);
            if let Ok(rs) = &r {
                saved.insert(n, (rs[1], rs[2]));
            }
            return Some(r.map(|rs| vec![rs[0]]));
        }
        let &(z, w) = saved.get(pairs.get(&n)?)?;
        let operands = [ins[0], ins[1], ins[2], ins[3], ins[4], z, w];
        Some(out.add_node(ModOp::op("cross_grad_saved"), &operands, names))
    })
    .map_err(PassError::ir(ID))
}
