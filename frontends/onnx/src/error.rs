//! The frontend's error type: every failure names where (file, node name and index,
//! op type, tensor) and why.

use std::path::PathBuf;

/// Result alias of the ONNX frontend.
pub type Result<T, E = OnnxError> = std::result::Result<T, E>;

/// Errors of the ONNX frontend.
#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    /// The model file could not be read.
    #[error("{path}: cannot read: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The bytes are not a valid ONNX protobuf (truncated or corrupt file).
    #[error("{origin}: not a valid ONNX model (truncated or corrupt protobuf): {reason}")]
    Decode {
        /// The file or origin.
        origin: String,
        /// The decoder's message.
        reason: String,
    },
    /// The model is structurally invalid or uses something unsupported outside a node.
    #[error("{origin}: {reason}")]
    Model {
        /// The file or origin.
        origin: String,
        /// What is wrong.
        reason: String,
    },
    /// An initializer or constant tensor could not be read.
    #[error("{origin}: tensor `{tensor}`: {reason}")]
    Tensor {
        /// The file or origin.
        origin: String,
        /// The tensor's name.
        tensor: String,
        /// What is wrong (dtype, size, missing external data file, ...).
        reason: String,
    },
    /// A node could not be imported.
    #[error("{origin}: node #{index} `{name}` ({op}): {reason}")]
    Node {
        /// The file or origin.
        origin: String,
        /// The node's index in its graph (top-level graph order).
        index: usize,
        /// The node's name (or its first output when unnamed).
        name: String,
        /// The op type, with its domain when not the default one.
        op: String,
        /// What is wrong: unsupported op, attribute value, dtype, shape mismatch, ...
        reason: String,
    },
    /// An npz archive could not be read or written.
    #[error("{path}: {reason}")]
    Npz {
        /// The archive.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A file could not be written (export).
    #[error("{path}: cannot write: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The graph cannot be exported as a whole (options, training graph, size).
    #[error("ONNX export: {reason}")]
    Export {
        /// What is wrong.
        reason: String,
    },
    /// A node of the graph has no ONNX form.
    #[error("ONNX export: node {node} ({op}): {reason}")]
    ExportNode {
        /// The node (`#index %first_result`).
        node: String,
        /// The IR op mnemonic.
        op: String,
        /// What is wrong.
        reason: String,
    },
}
