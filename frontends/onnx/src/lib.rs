//! dlrm-onnx: the ONNX frontend (import of `.onnx` models into an `ir::Graph`).
//!
//! Not implemented yet (issue 6). The crate exists so the workspace layout of
//! `DESIGN.md` is in place and the binaries can report a clear error for `.onnx`
//! input instead of failing in an unexpected way.

#![warn(missing_docs)]

use std::path::Path;

/// Errors of the ONNX frontend.
#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    /// ONNX import is not available in this build.
    #[error(
        "{path}: ONNX import is not implemented yet; describe the model in JSON (see examples/)"
    )]
    NotImplemented {
        /// The model file.
        path: String,
    },
}

/// Imports an ONNX model. Always fails for now with [`OnnxError::NotImplemented`].
pub fn load(path: &Path) -> Result<dlrm_ir::Graph, OnnxError> {
    Err(OnnxError::NotImplemented {
        path: path.display().to_string(),
    })
}
