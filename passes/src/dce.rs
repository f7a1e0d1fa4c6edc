//! Dead-code elimination (pass id `dce`).
//!
//! Removes every node none of whose results reaches a graph output or a state update
//! (the updated parameter's new value). The graph's interface is kept as it is: all
//! inputs and all parameters stay, in their order, used or not — a runtime binds
//! inputs and parameters by name, and dropping one would change what it must feed.
//! Value names and types are kept verbatim; the surviving nodes keep their order.

use crate::copy::copy_nodes;
use crate::pass::Params;
use crate::{Pass, Ran, Result};
use dlrm_ir::Graph;

/// The dead-code elimination pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct Dce;

/// The pass id.
pub const ID: &str = "dce";

impl Pass for Dce {
    fn id(&self) -> &'static str {
        ID
    }

    fn run(&self, g: Graph, _params: Option<&mut Params>) -> Result<Ran> {
        Ok(dce(&g)?.into())
    }
}

/// For each node, whether one of its results reaches an output or an update.
pub fn live_nodes(g: &Graph) -> Vec<bool> {
    let mut live_val = vec![false; g.values().len()];
    for &o in g.outputs() {
        live_val[o.index()] = true;
    }
    for u in g.updates() {
        live_val[u.value.index()] = true;
    }
    let mut live = vec![false; g.nodes().len()];
    for (n, node) in g.nodes().iter().enumerate().rev() {
        if node.outputs.iter().any(|v| live_val[v.index()]) {
            live[n] = true;
            for &v in &node.inputs {
                live_val[v.index()] = true;
            }
        }
    }
    live
}

/// Returns `g` without its dead nodes (see the module docs).
pub fn dce(g: &Graph) -> Result<Graph> {
    let live = live_nodes(g);
    copy_nodes(g, (0..live.len()).filter(|&n| live[n]), ID)
}
