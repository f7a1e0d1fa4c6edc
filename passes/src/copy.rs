//! Copying a graph with a chosen subset and order of its nodes: the common core of
//! dead-code elimination (a subset, order kept) and scheduling (all nodes, a new
//! order).
//!
//! The copy keeps the graph's interface exactly (all inputs and parameters, in
//! order; the outputs and updates) and every value's name and type verbatim. A node
//! whose operand is not defined earlier in the new order, or an output or update
//! whose value was left out, is an error naming the value.

use crate::{PassError, Result};
use dlrm_ir::{Graph, ValueId};

/// `g` with the nodes `order` (indices into `g.nodes()`, each at most once), in that
/// order. `pass` names the pass in errors.
pub(crate) fn copy_nodes(
    g: &Graph,
    order: impl IntoIterator<Item = usize>,
    pass: &str,
) -> Result<Graph> {
    let err = PassError::ir(pass);
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
            pass: pass.to_string(),
            graph: g.name.clone(),
            reason: format!("value %{} is used but not defined before", g.name_of(v)),
        })
    };
    for n in order {
        let node = &g.nodes()[n];
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
