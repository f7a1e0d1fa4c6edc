//! The IR crate's error type.

use thiserror::Error;

/// Errors from building, verifying, parsing or interpreting graphs.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum IrError {
    /// A node's operands do not fit its op (shape, dtype, arity, attributes).
    #[error("node {node} (`{op}`): {reason}")]
    Node {
        /// The node: its index and first result, e.g. `#3 %bot.0`.
        node: String,
        /// The op mnemonic.
        op: String,
        /// What is wrong.
        reason: String,
    },
    /// The graph's structure is wrong (SSA, names, updates, outputs).
    #[error("graph `{graph}`: {reason}")]
    Graph {
        /// The graph's name.
        graph: String,
        /// What is wrong.
        reason: String,
    },
    /// The text form could not be parsed.
    #[error("line {line}, column {col}: {reason}")]
    Parse {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        col: usize,
        /// What was expected or found.
        reason: String,
    },
    /// An op failed while the interpreter ran it (bad index, shape mismatch with the
    /// bound data, a non-finite value where one is not allowed).
    #[error("while running node {node} (`{op}`): {reason}")]
    Eval {
        /// The node, as in [`IrError::Node`].
        node: String,
        /// The op mnemonic.
        op: String,
        /// What went wrong.
        reason: String,
    },
    /// An input or parameter is missing or does not match its declared type.
    #[error("binding `{name}`: {reason}")]
    Binding {
        /// The input or parameter name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A collective failed (a peer rank died or disagreed).
    #[error("communication: {0}")]
    Comm(String),
    /// A tensor could not be allocated (it is larger than this process may hold).
    #[error("`{what}` needs {bytes} bytes: {reason}")]
    Alloc {
        /// What was being allocated (a parameter's name).
        what: String,
        /// The bytes asked for.
        bytes: u128,
        /// Why it failed.
        reason: String,
    },
    /// Inputs in the model's own layout do not fit its input contract.
    #[error("model inputs: {reason}")]
    Contract {
        /// What is wrong, naming the input.
        reason: String,
    },
}

/// Result alias for the IR crate.
pub type Result<T, E = IrError> = std::result::Result<T, E>;
