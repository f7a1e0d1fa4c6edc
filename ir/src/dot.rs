//! Graphviz export (being written).
use crate::Graph;

/// Graphviz DOT text of a graph.
pub fn to_dot(g: &Graph) -> String {
    let _ = g;
    unimplemented!("dot export being written")
}
