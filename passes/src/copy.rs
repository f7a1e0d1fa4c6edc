//! Copying a graph with a chosen subset and order of its nodes: the common core of
//! dead-code elimination (a subset, order kept), scheduling (all nodes, a new
//! order) and the `canon` pass's storing of parameters transposed (parameters
//! retyped, some nodes replaced by a value already copied).
//!
//! The copy keeps the graph's interface (all inputs and parameters, in order; the
//! outputs and updates) and every value's name and type verbatim, except where a
//! [`Rewire`] says otherwise. A node whose operand is not defined earlier in the new
//! order, or an output or update whose value was left out, is an error naming the
//! value.

use crate::{PassError, Result};
use dlrm_ir::{Graph, Node, TensorType, ValueId};

/// `g` with the nodes `order` (indices into `g.nodes()`, each at most once), in that
/// order. `pass` names the pass in errors.
pub(crate) fn copy_nodes(
    g: &Graph,
    order: impl IntoIterator<Item = usize>,
    pass: &str,
) -> Result<Graph> {
    copy_rewired(g, order, pass, &Rewire::default())
}

/// A node of `g` to the value of `g` its single result is replaced by.
pub(crate) type Forward<'a> = dyn Fn(&Node) -> Option<ValueId> + 'a;

/// What [`copy_rewired`] changes in the copy.
#[derive(Default)]
pub(crate) struct Rewire<'a> {
    /// New types of some parameters (by value in `g`).
    pub param_types: Vec<(ValueId, TensorType)>,
    /// For a node of `g`, the value of `g` its single result is replaced by (the
    /// node is not copied; its result's users read that value's copy instead).
    pub forward: Option<&'a Forward<'a>>,
}

/// [`copy_nodes`] with the changes of `rw` (see [`Rewire`]).
pub(crate) fn copy_rewired(
    g: &Graph,
    order: impl IntoIterator<Item = usize>,
    pass: &str,
    rw: &Rewire<'_>,
) -> Result<Graph> {
    let err = PassError::ir(pass);
    let mut out = Graph::new(g.name.clone());
    let mut map: Vec<Option<ValueId>> = vec![None; g.values().len()];
    for &v in g.inputs() {
        map[v.index()] = Some(out.add_input(g.name_of(v), g.ty(v).clone()).map_err(&err)?);
    }
    for &v in g.params() {
        let ty = rw
            .param_types
            .iter()
            .find(|(p, _)| *p == v)
            .map_or_else(|| g.ty(v).clone(), |(_, t)| t.clone());
        map[v.index()] = Some(out.add_param(g.name_of(v), ty).map_err(&err)?);
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
        if let (Some(fwd), [o]) = (rw.forward, node.outputs.as_slice())
            && let Some(v) = fwd(node)
        {
            map[o.index()] = Some(get(&map, v)?);
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
