//! The passes crate's error type: every error names the pass it comes from and,
//! where there is one, the node (index and first result, as [`dlrm_ir::Graph::node_label`]).

use dlrm_ir::IrError;
use thiserror::Error;

/// Errors from running passes, the pipeline or the partitioner.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum PassError {
    /// An IR operation (building a node, verifying) failed inside a pass.
    #[error("while running pass `{pass}`: {source}")]
    Ir {
        /// The pass id (`autodiff`, `dce`, `partition`, ...).
        pass: String,
        /// The IR error.
        #[source]
        source: IrError,
    },
    /// The graph a pass produced (or the pipeline's input, `after = "input"`) does not
    /// verify.
    #[error("graph invalid after `{after}`: {source}")]
    Verify {
        /// `input` or the id of the pass that produced the graph.
        after: String,
        /// The verifier's error.
        #[source]
        source: IrError,
    },
    /// A node the pass cannot handle.
    #[error("{pass}: node {node} (`{op}`): {reason}")]
    Node {
        /// The pass id.
        pass: String,
        /// The node: index and first result, e.g. `#3 %bot.0`.
        node: String,
        /// The op mnemonic.
        op: String,
        /// What is wrong or unsupported.
        reason: String,
    },
    /// The graph as a whole does not fit the pass (missing output, bad structure, ...).
    #[error("{pass}: graph `{graph}`: {reason}")]
    Graph {
        /// The pass id.
        pass: String,
        /// The graph's name.
        graph: String,
        /// What is wrong.
        reason: String,
    },
    /// A bad argument (e.g. zero ranks).
    #[error("{pass}: {reason}")]
    Arg {
        /// The pass id or API.
        pass: String,
        /// What is wrong.
        reason: String,
    },
    /// An IR dump stage that no pass has.
    #[error("unknown IR dump stage `{got}` (valid: {})", valid.join(", "))]
    UnknownStage {
        /// What was asked for.
        got: String,
        /// Every valid stage (`all` included).
        valid: Vec<String>,
    },
}

impl PassError {
    /// Wraps an IR error with the pass it happened in.
    pub fn ir(pass: &str) -> impl Fn(IrError) -> PassError + Copy + '_ {
        move |source| PassError::Ir {
            pass: pass.to_string(),
            source,
        }
    }
}

/// Result alias for the passes crate.
pub type Result<T, E = PassError> = std::result::Result<T, E>;
