//! Graphviz export: a graph as a readable `digraph` for pictures
//! (`dot -Tsvg graph.dot > graph.svg`).
//!
//! Layout of the output:
//! - inputs are blue `invhouse` shapes, parameters grey `note` shapes; both show
//!   their type (a parameter of 1 MiB or more also its size);
//! - one rounded box per node, labelled `%result = mnemonic` and its attributes;
//!   collectives are orange with a thick red border, optimizer updates green;
//! - one edge per operand use, labelled with the value's type (and its name when
//!   the producer has several results);
//! - each graph output is a double oval `output %name` fed by one edge; each update
//!   is a dashed edge from the new value to its parameter.
//!
//! Invariants: every identifier and label is quoted or generated (`v<id>`, `n<index>`,
//! `out<index>`), and labels escape `\` and `"`, so any name gives valid DOT.

use crate::graph::{Def, Graph, ValueId};
use std::fmt::Write;

/// Escapes a string for a double-quoted DOT string; newlines become `\n`.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// The DOT node that produces a value (`missing` for an id outside the value table,
/// so that even a broken graph can be drawn).
fn source(g: &Graph, v: ValueId) -> String {
    match g.values().get(v.index()).map(|val| val.def) {
        Some(Def::Node(n, _)) => format!("n{n}"),
        Some(Def::Input(_) | Def::Param(_)) => format!("v{}", v.0),
        None => "missing".to_string(),
    }
}

/// An edge label: the type, with the name when the producer has several results.
fn edge_label(g: &Graph, v: ValueId) -> String {
    let Some(val) = g.values().get(v.index()) else {
        return format!("missing value {}", v.0);
    };
    match val.def {
        Def::Node(n, _) if g.nodes().get(n).is_some_and(|node| node.outputs.len() > 1) => {
            format!("%{}: {}", val.name, val.ty)
        }
        _ => val.ty.to_string(),
    }
}

/// A value's `%name` for labels.
fn name(g: &Graph, v: ValueId) -> String {
    match g.values().get(v.index()) {
        Some(val) => format!("%{}", val.name),
        None => format!("<missing value {}>", v.0),
    }
}

fn size_note(g: &Graph, v: ValueId) -> Option<String> {
    let ty = g.ty(v);
    // Checked: a type may have absurd dimensions (the drawing must not panic).
    let bytes = ty
        .shape
        .iter()
        .try_fold(ty.dtype.size_bytes(), |acc, dim| {
            acc.checked_mul(dim.fixed()?)
        })?;
    (bytes >= 1 << 20).then(|| format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64))
}

/// Graphviz DOT text of a graph.
pub fn to_dot(g: &Graph) -> String {
    let mut s = String::new();
    // Writing to a String cannot fail.
    let _ = write_dot(&mut s, g);
    s
}

fn write_dot(s: &mut String, g: &Graph) -> std::fmt::Result {
    writeln!(s, "digraph \"{}\" {{", esc(&g.name))?;
    writeln!(
        s,
        "  graph [rankdir=TB, labelloc=t, fontname=\"Helvetica\", label=\"@{}\"];",
        esc(&g.name)
    )?;
    writeln!(s, "  node [fontname=\"Helvetica\", fontsize=10];")?;
    writeln!(
        s,
        "  edge [fontname=\"Helvetica\", fontsize=8, color=gray40];"
    )?;
    for &v in g.inputs() {
        let label = format!("%{}\n{}", g.name_of(v), g.ty(v));
        writeln!(
            s,
            "  v{} [label=\"{}\", shape=invhouse, style=filled, fillcolor=\"#dbeafe\"];",
            v.0,
            esc(&label)
        )?;
    }
    for &v in g.params() {
        let mut label = format!("%{}\n{}", g.name_of(v), g.ty(v));
        if let Some(note) = size_note(g, v) {
            label.push('\n');
            label.push_str(&note);
        }
        writeln!(
            s,
            "  v{} [label=\"{}\", shape=note, style=filled, fillcolor=gray90, color=gray60, \
             fontcolor=gray30];",
            v.0,
            esc(&label)
        )?;
    }
    for (n, node) in g.nodes().iter().enumerate() {
        let results: Vec<String> = node.outputs.iter().map(|&v| name(g, v)).collect();
        let mut label = format!("{} = {}", results.join(", "), node.op.mnemonic());
        let attrs: Vec<String> = node
            .op
            .attrs()
            .iter()
            .map(|(k, a)| format!("{k}={a}"))
            .collect();
        if !attrs.is_empty() {
            label.push('\n');
            label.push_str(&attrs.join(", "));
        }
        let style = if node.op.is_collective() {
            "fillcolor=\"#fdba74\", color=red3, penwidth=2"
        } else if node.op.is_update() {
            "fillcolor=\"#bbf7d0\""
        } else {
            "fillcolor=white"
        };
        writeln!(
            s,
            "  n{n} [label=\"{}\", shape=box, style=\"rounded,filled\", {style}];",
            esc(&label)
        )?;
        for &v in &node.inputs {
            writeln!(
                s,
                "  {} -> n{n} [label=\"{}\"];",
                source(g, v),
                esc(&edge_label(g, v))
            )?;
        }
    }
    for (i, &v) in g.outputs().iter().enumerate() {
        let label = format!("output {}", name(g, v));
        writeln!(
            s,
            "  out{i} [label=\"{}\", shape=oval, peripheries=2, style=filled, \
             fillcolor=\"#fef08a\"];",
            esc(&label)
        )?;
        writeln!(
            s,
            "  {} -> out{i} [label=\"{}\"];",
            source(g, v),
            esc(&edge_label(g, v))
        )?;
    }
    for u in g.updates() {
        writeln!(
            s,
            "  {} -> {} [label=\"update\", style=dashed, color=\"#16a34a\", constraint=false];",
            source(g, u.value),
            source(g, u.param)
        )?;
    }
    s.push_str("}\n");
    Ok(())
}
