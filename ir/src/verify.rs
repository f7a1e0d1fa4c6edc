//! The verifier: structural and type checks of a whole graph.
//!
//! Run after every pass. Errors name the node (index and first result) and the op.

use crate::error::{IrError, Result};
use crate::graph::{Def, Graph};
use crate::infer::infer;
use crate::types::TensorType;

/// Checks every invariant listed on [`Graph`]; returns the first violation.
pub fn verify(g: &Graph) -> Result<()> {
    let graph_err = |reason: String| IrError::Graph {
        graph: g.name.clone(),
        reason,
    };
    let nvals = g.values().len();
    let mut defined = vec![false; nvals];
    for &v in g.inputs().iter().chain(g.params()) {
        defined[v.index()] = true;
    }
    for (n, node) in g.nodes().iter().enumerate() {
        let node_err = |reason: String| IrError::Node {
            node: g.node_label(n),
            op: node.op.mnemonic().to_string(),
            reason,
        };
        for (i, &v) in node.inputs.iter().enumerate() {
            if v.index() >= nvals {
                return Err(node_err(format!("operand {i} does not exist")));
            }
            if !defined[v.index()] {
                return Err(node_err(format!(
                    "operand {i} %{} is used before it is defined",
                    g.name_of(v)
                )));
            }
        }
        for (k, &v) in node.outputs.iter().enumerate() {
            if g.value(v).def != Def::Node(n, k) {
                return Err(node_err(format!(
                    "result %{} is defined elsewhere",
                    g.name_of(v)
                )));
            }
            if defined[v.index()] {
                return Err(node_err(format!(
                    "result %{} is defined twice",
                    g.name_of(v)
                )));
            }
        }
        let in_tys: Vec<&TensorType> = node.inputs.iter().map(|&v| g.ty(v)).collect();
        let declared: Vec<TensorType> = node.outputs.iter().map(|&v| g.ty(v).clone()).collect();
        let inferred = infer(&node.op, &in_tys, &declared).map_err(node_err)?;
        if inferred.len() != declared.len() {
            return Err(node_err(format!(
                "has {} results, the op gives {}",
                declared.len(),
                inferred.len()
            )));
        }
        for (k, (want, got)) in inferred.iter().zip(&declared).enumerate() {
            if want != got {
                return Err(node_err(format!(
                    "result {k} %{} is declared {got} but the op gives {want}",
                    g.name_of(node.outputs[k])
                )));
            }
        }
        for &v in &node.outputs {
            defined[v.index()] = true;
        }
    }
    for (i, v) in g.values().iter().enumerate() {
        if !defined[i] {
            return Err(graph_err(format!("value %{} is never defined", v.name)));
        }
    }
    for &o in g.outputs() {
        if o.index() >= nvals {
            return Err(graph_err("an output does not exist".into()));
        }
    }
    let mut updated = vec![false; nvals];
    for u in g.updates() {
        if !matches!(g.value(u.param).def, Def::Param(_)) {
            return Err(graph_err(format!(
                "update target %{} is not a parameter",
                g.name_of(u.param)
            )));
        }
        if updated[u.param.index()] {
            return Err(graph_err(format!(
                "parameter %{} is updated twice",
                g.name_of(u.param)
            )));
        }
        updated[u.param.index()] = true;
        if g.ty(u.param) != g.ty(u.value) {
            return Err(graph_err(format!(
                "update of %{} ({}) by %{} ({}): types differ",
                g.name_of(u.param),
                g.ty(u.param),
                g.name_of(u.value),
                g.ty(u.value)
            )));
        }
    }
    Ok(())
}
