//! The frontend's error type.
//!
//! Every message starts with the origin (the file path, or the name given to
//! [`crate::from_str`]) and names the offending field when there is one, so that a
//! user can fix the description without reading the code.

use dlrm_ir::IrError;
use thiserror::Error;

/// Errors from reading, parsing, validating or building a model description.
#[derive(Debug, Error)]
pub enum Error {
    /// The file could not be read.
    #[error("{path}: cannot read the model description: {source}")]
    Io {
        /// The path as given.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The text is not valid JSON or does not have the description's form: a syntax
    /// error, an unknown or missing field, a value of the wrong type or an unknown
    /// enum value (these come from serde and carry its line and column).
    #[error("{origin}:{line}:{column}: {}{message}", field_prefix(.field))]
    Json {
        /// The file path or origin name.
        origin: String,
        /// The field being read, e.g. `bottom_mlp[2]`, if serde was inside one.
        field: Option<String>,
        /// 1-based line (0 if unknown).
        line: usize,
        /// 1-based column (0 if unknown).
        column: usize,
        /// serde's message, without its position suffix.
        message: String,
    },
    /// A field has a value the model cannot have (zero sizes, inconsistent widths, ...).
    #[error("{origin}: field `{field}`: {reason}")]
    Invalid {
        /// The file path or origin name.
        origin: String,
        /// The field, e.g. `table_rows[3]` or `learning_rate`.
        field: String,
        /// What is wrong, with the value found.
        reason: String,
    },
    /// Building the IR graph failed. A validated description never gets here; this
    /// would be a bug in the frontend or in the IR's shape inference.
    #[error("{origin}: building the graph of model `{model}`: {source}")]
    Graph {
        /// The file path or origin name.
        origin: String,
        /// The model's name.
        model: String,
        /// The IR's error (boxed: it is large and this variant is rare).
        #[source]
        source: Box<IrError>,
    },
    /// An initial value cannot be created (a parameter larger than this process can
    /// allocate).
    #[error("{origin}: initial values: {cause}")]
    Init {
        /// The file path or origin name.
        origin: String,
        /// The IR's error (naming the parameter and the bytes; shown in the
        /// message, so not a `source`).
        cause: Box<IrError>,
    },
}

fn field_prefix(field: &Option<String>) -> String {
    match field {
        Some(f) => format!("field `{f}`: "),
        None => String::new(),
    }
}

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
