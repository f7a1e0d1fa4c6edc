//! The one text form of graphs: printer and parser (grammar in `docs/ir.md`).
//!
//! ```text
//! graph @tiny {
//!   input %x: f32[B,4]
//!   param %w: f32[8,4]
//!   param %b: f32[8]
//!   %h: f32[B,8] = linear %x, %w, %b {act=relu}
//!   output %h
//! }
//! ```
//!
//! Invariants: for every graph `g` whose names fit the character sets below,
//! `parse(&print(&g)) == Ok(g)` (structural equality, floats bit-exact), and
//! `print(&parse(s)?) == s` for canonical text `s`. Parse errors are
//! [`crate::IrError::Parse`] with a 1-based line and column; a graph that parses is
//! then verified and verifier errors are returned unchanged. No input makes the
//! parser panic.

mod lexer;
mod parse;
mod print;

use crate::{Graph, IrError, Result, verify};

/// Prints a graph in the canonical text form (ends with a newline).
pub fn print(g: &Graph) -> String {
    print::Printer(g).to_string()
}

/// Prints several graphs (e.g. one per rank) separated by blank lines; the result
/// reads back with [`parse_module`].
pub fn print_module(graphs: &[Graph]) -> String {
    graphs.iter().map(print).collect::<Vec<_>>().join("\n")
}

/// Parses the text form of exactly one graph; errors carry line and column. The
/// result is verified.
pub fn parse(src: &str) -> Result<Graph> {
    let mut graphs = parse::parse_graphs(src)?;
    match graphs.len() {
        1 => {
            let (g, _) = graphs.remove(0);
            verify(&g)?;
            Ok(g)
        }
        0 => {
            let end = lexer::lex(src).pop();
            let (line, col) = end.map_or((1, 1), |t| (t.line, t.col));
            Err(IrError::Parse {
                line,
                col,
                reason: "expected `graph`, found end of input".into(),
            })
        }
        n => {
            let (line, col) = graphs[1].1;
            Err(IrError::Parse {
                line,
                col,
                reason: format!(
                    "expected one graph, found {n} (use `parse_module` for several graphs)"
                ),
            })
        }
    }
}

/// Parses a file holding several graphs (e.g. one per rank), in order; a file with
/// no graph gives an empty list. Every graph is parsed before any is verified; a
/// verifier error on a node says which graph it is in.
pub fn parse_module(src: &str) -> Result<Vec<Graph>> {
    let graphs: Vec<Graph> = parse::parse_graphs(src)?
        .into_iter()
        .map(|(g, _)| g)
        .collect();
    for g in &graphs {
        verify(g).map_err(|e| match e {
            IrError::Node { node, op, reason } => IrError::Node {
                node,
                op,
                reason: format!("{reason} (in graph `{}`)", g.name),
            },
            other => other,
        })?;
    }
    Ok(graphs)
}

/// True if `name` can be written as a value name `%name`: one or more of
/// `A-Z a-z 0-9 _ .`.
pub fn is_value_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(lexer::is_value_char)
}

/// True if `name` can be written as a graph name `@name`: one or more of
/// `A-Z a-z 0-9 _ . -`.
pub fn is_graph_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(lexer::is_graph_char)
}
