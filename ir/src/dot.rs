//! Graphviz export (being written).
