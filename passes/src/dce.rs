//! Dead-code elimination (pass id `dce`).
//!
//! Removes every node none of whose results reaches a graph output or a state update
//! (the updated parameter's new value). The graph's interface is kept as it is: all
//! inputs and all parameters stay, in their order, used or not — a runtime binds
//! inputs and parameters by name, and dropping one would change what it must feed.
//! Value names and types are kept verbatim; the surviving nodes keep their order.

use crate::{Pass, PassError, Result};
use dlrm_ir::{Graph, ValueId};

/// The dead-code elimination pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct Dce;

/// The pass id.
pub const ID: &str = "dce";

impl Pass for Dce {
    fn id(&self) -> &'static str {
        ID
    }

    fn run(&self, g: Graph) -> Result<Graph> {
        dce(&g)
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
    let err = PassError::ir(ID);
    let mut out = Graph::new(g.name.clone());
    let mut map: Vec<Option<ValueId>> = vec![None; g.values().len()];
    for &v in g.inputs() {
        map[v.index()] = Some(out.add_input(g.name_of(v), g.ty(v).clone()).map_err(&err)?);
    }
    for &v in g.params() {
        map[v.index()] = Some(out.add_param(g.name_of(v), g.ty(v).clone()).map_err(&err)?);
    }
    let get = |map: &[Option<ValueId>], v: ValueId| {
        map[v.index()].ok_or_else(|| PassError::Graph {
            pass: ID.to_string(),
            graph: g.name.clone(),
            reason: format!("value %{} is used but its node was removed", g.name_of(v)),
        })
    };
    for (n, node) in g.nodes().iter().enumerate() {
        if !live[n] {
            continue;
        }
        let inputs = node
            .inputs
            .iter()
            .map(|&v| get(&map, v))
            .collect::<Result<Vec<_>>>()?;
        let results = node
            .outputs
            .iter()
            .map(|&v| (g.name_of(v).to_string(), g.ty(v).clone()))
            .collect();
        let new = out
            .push_node_unchecked(node.op.clone(), inputs, results)
            .map_err(&err)?;
        for (&old, new) in node.outputs.iter().zip(new) {
            map[old.index()] = Some(new);
        }
    }
    let outputs = g
        .outputs()
        .iter()
        .map(|&v| get(&map, v))
        .collect::<Result<Vec<_>>>()?;
    out.set_outputs(outputs);
    for u in g.updates() {
        let (p, v) = (get(&map, u.param)?, get(&map, u.value)?);
        out.add_update(p, v).map_err(&err)?;
    }
    Ok(out)
}
