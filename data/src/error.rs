//! The data crate's error.

use std::path::PathBuf;

/// A data error: where (file, and line or record when there is one) and why.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// An I/O failure on a file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// A dataset that does not match its manifest, or a malformed manifest.
    #[error("dataset {path}: {reason}")]
    Dataset {
        /// The dataset directory (or the file in it).
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A bad value in an input file.
    #[error("{path}:{line}: {reason}")]
    Input {
        /// The input file.
        path: PathBuf,
        /// The 1-based line (or record) number.
        line: u64,
        /// What is wrong (naming the field).
        reason: String,
    },
    /// A bad record in a binary input file.
    #[error("{path}: record {record}: {reason}")]
    Record {
        /// The input file.
        path: PathBuf,
        /// The 1-based record number.
        record: u64,
        /// What is wrong (naming the field).
        reason: String,
    },
    /// An input file with no data at all.
    #[error("{path}: the file is empty (no {what})")]
    Empty {
        /// The input file.
        path: PathBuf,
        /// `lines` or `records`.
        what: &'static str,
    },
    /// A request the data cannot serve (a wrong split name, a row beyond the data).
    #[error("{0}")]
    Usage(String),
}

/// The data crate's result.
pub type Result<T, E = DataError> = std::result::Result<T, E>;

impl DataError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> DataError {
        DataError::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn dataset(path: impl Into<PathBuf>, reason: impl Into<String>) -> DataError {
        DataError::Dataset {
            path: path.into(),
            reason: reason.into(),
        }
    }
}
