//! The printer: a graph to its canonical text.
//!
//! Canonical layout (what [`super::parse()`] reads back to an equal graph): the
//! `graph @name {` line; then one line per input, parameter, node (in order), output
//! and update, each indented by two spaces; then `}` and a newline. Attributes come
//! in [`crate::Op::attrs`] order; an op without attributes prints no braces. The
//! printer does not check names: a name outside the text form's character set
//! (see [`super::is_value_name`]) prints but does not parse back.

use crate::graph::{Graph, ValueId};
use std::fmt::{self, Write};

/// Displays a graph in the canonical text form.
pub(crate) struct Printer<'a>(pub &'a Graph);

fn typed(f: &mut fmt::Formatter<'_>, g: &Graph, v: ValueId) -> fmt::Result {
    write!(f, "%{}: {}", g.name_of(v), g.ty(v))
}

impl fmt::Display for Printer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = self.0;
        writeln!(f, "graph @{} {{", g.name)?;
        for &v in g.inputs() {
            f.write_str("  input ")?;
            typed(f, g, v)?;
            f.write_char('\n')?;
        }
        for &v in g.params() {
            f.write_str("  param ")?;
            typed(f, g, v)?;
            f.write_char('\n')?;
        }
        for node in g.nodes() {
            f.write_str("  ")?;
            for (k, &v) in node.outputs.iter().enumerate() {
                if k > 0 {
                    f.write_str(", ")?;
                }
                typed(f, g, v)?;
            }
            write!(f, " = {}", node.op.mnemonic())?;
            for (i, &v) in node.inputs.iter().enumerate() {
                f.write_str(if i == 0 { " " } else { ", " })?;
                write!(f, "%{}", g.name_of(v))?;
            }
            let attrs = node.op.attrs();
            if !attrs.is_empty() {
                f.write_str(" {")?;
                for (i, (key, value)) in attrs.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{key}={value}")?;
                }
                f.write_char('}')?;
            }
            f.write_char('\n')?;
        }
        for &v in g.outputs() {
            writeln!(f, "  output %{}", g.name_of(v))?;
        }
        for u in g.updates() {
            writeln!(
                f,
                "  update %{} <- %{}",
                g.name_of(u.param),
                g.name_of(u.value)
            )?;
        }
        f.write_str("}\n")
    }
}
