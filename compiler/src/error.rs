//! Errors of the compiler driver; each names what was being done and wraps
//! the failing crate's own error as its source.

use std::path::PathBuf;

/// An error of [`crate::model`] or [`mod@crate::compile`] (the `dlrmc` binary's
/// other commands use it too).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The JSON model description is invalid (the error names file and field).
    #[error(transparent)]
    Json(#[from] dlrm_json::Error),
    /// The ONNX model could not be imported.
    #[error(transparent)]
    Onnx(#[from] dlrm_onnx::OnnxError),
    /// The model file's extension names no frontend.
    #[error("{}: unknown model format (expected a `.json` description or an `.onnx` model)", path.display())]
    UnknownFormat {
        /// The model file.
        path: PathBuf,
    },
    /// A pass failed on one of the plan's graphs.
    #[error("compiling the {graph} graph")]
    Compile {
        /// `infer` or `train`.
        graph: &'static str,
        /// The pass error (names the pass and the node).
        #[source]
        source: Box<dlrm_passes::PassError>,
    },
    /// A plan's training setup names something this build cannot do.
    #[error("plan training setup: {0}")]
    Training(String),
    /// Running the plan, placing or partitioning it for N ranks, or measuring or
    /// reading this machine's rates ([`dlrm_runtime::calibrate`]) failed.
    #[error(transparent)]
    Runtime(#[from] dlrm_runtime::RuntimeError),
    /// Options that cannot run.
    #[error("{0}")]
    Options(String),
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
