//! The runtime's error type: structured fields (file, rank, step, node) so that
//! every failure says where it happened.

use dlrm_ir::IrError;
use std::path::PathBuf;
use thiserror::Error;

/// Errors of plans, data, execution and the multi-rank driver.
#[derive(Debug, Error)]
pub enum RuntimeError {
    /// A file or directory operation failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A plan directory is missing, malformed, or not a plan.
    #[error("plan {}: {reason}", path.display())]
    Plan {
        /// The plan directory (or the file in it).
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A checkpoint (or checkpoint root) is missing, incomplete, corrupted, from
    /// another version, or cannot be written.
    #[error("checkpoint {}: {reason}", path.display())]
    Checkpoint {
        /// The checkpoint directory or file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A plan file's contents do not match the checksum in the manifest.
    #[error("{}: checksum mismatch (manifest says sha256 {expected}, file has {actual}): the file is corrupted or was modified", file.display())]
    Checksum {
        /// The corrupted file.
        file: PathBuf,
        /// The manifest's sha256.
        expected: String,
        /// The file's actual sha256.
        actual: String,
    },
    /// A graph file does not parse or verify.
    #[error("{}: {source}", file.display())]
    Parse {
        /// The IR file.
        file: PathBuf,
        /// The parser's (or verifier's) error, with line and column.
        source: IrError,
    },
    /// A parameter is missing or does not match its declared type.
    #[error("parameter `{name}`: {reason}")]
    Param {
        /// The parameter's name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// An input of a rank's graph is missing, unknown, or does not match its type.
    #[error("rank {rank}, step {step}: input `{name}`: {reason}")]
    Input {
        /// The rank.
        rank: usize,
        /// The step.
        step: u64,
        /// The input's name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A node failed while a rank executed it.
    #[error("rank {rank}, step {step}: node {node} (`{op}`): {reason}")]
    Node {
        /// The rank.
        rank: usize,
        /// The step.
        step: u64,
        /// The node: index and first result, e.g. `#3 %bot.0`.
        node: String,
        /// The op mnemonic.
        op: String,
        /// What went wrong.
        reason: String,
    },
    /// The training loss became NaN or infinite.
    #[error("rank {rank}: loss became {value} at step {step}")]
    NonFinite {
        /// The rank that saw it (every rank sees the same global loss).
        rank: usize,
        /// The step.
        step: u64,
        /// The loss value (NaN or ±inf).
        value: f32,
    },
    /// The synthetic data generator cannot serve a graph.
    #[error("data: {reason}")]
    Data {
        /// What is wrong.
        reason: String,
    },
    /// A dataset that does not fit the plan (dense width, table count, a table's
    /// rows, a split), or a bad value in it.
    #[error("dataset {}: {reason}", path.display())]
    Dataset {
        /// The dataset directory (or the file in it).
        path: PathBuf,
        /// What differs.
        reason: String,
    },
    /// A dataset that cannot be opened or verified (a missing file, a checksum).
    #[error(transparent)]
    DataFile(#[from] dlrm_data::DataError),
    /// A rank failed outside a node (setup, data, a panic) or the group aborted.
    #[error("rank {rank}{}: {reason}", step.map(|s| format!(", step {s}")).unwrap_or_default())]
    Rank {
        /// The rank.
        rank: usize,
        /// The step, when the failure happened in one.
        step: Option<u64>,
        /// What happened.
        reason: String,
    },
    /// A job is inconsistent (rank count, graphs, batch size).
    #[error("job: {reason}")]
    Job {
        /// What is wrong.
        reason: String,
    },
    /// A learning rate or a learning-rate schedule that cannot be used (negative,
    /// NaN, inconsistent steps; see [`crate::lr_schedule`]).
    #[error("learning rate: {reason}")]
    LearningRate {
        /// What is wrong.
        reason: String,
    },
    /// Placing the tables or partitioning a graph for N ranks failed
    /// ([`crate::launch::shard`]).
    #[error("partitioning the {graph} graph for {ranks} rank{}", if *.ranks == 1 { "" } else { "s" })]
    Partition {
        /// `infer` or `train`.
        graph: &'static str,
        /// Rank count.
        ranks: usize,
        /// The planner's or partition pass's error.
        #[source]
        source: Box<dlrm_passes::PassError>,
    },
    /// Options that cannot run (rank count, step count, batch size, mode, a
    /// checkpoint to resume that does not continue this run); the message names
    /// the `dlrm-run` flag.
    #[error("{0}")]
    Options(String),
    /// The job does not fit the memory budget (refused before allocating;
    /// [`crate::launch::memory`]).
    #[error("not enough memory: {0}")]
    Memory(String),
    /// A metrics file (`dlrm-run --metrics`) that cannot be read back
    /// ([`crate::metrics::read_curves`]).
    #[error("metrics file {}: {reason}", path.display())]
    Metrics {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Measuring this machine's rates, or reading or writing their file
    /// ([`crate::calibrate`]), failed.
    #[error("calibration: {0}")]
    Calibration(String),
    /// `--comm mpi` in a build without the `mpi` cargo feature.
    #[error("built without MPI support; rebuild with `--features mpi`")]
    NoMpi,
    /// MPI could not be set up (e.g. initialised twice).
    #[error("MPI: {reason}")]
    Mpi {
        /// What is wrong.
        reason: String,
    },
    /// An IR error (e.g. from a verifier or the interpreter).
    #[error(transparent)]
    Ir(#[from] IrError),
}

impl RuntimeError {
    /// True for errors that are only the echo of another rank's failure (a
    /// collective aborted by a peer): the driver reports the original instead.
    pub fn is_peer_abort(&self) -> bool {
        match self {
            RuntimeError::Node { reason, .. } | RuntimeError::Rank { reason, .. } => {
                reason.contains("communication:") || reason.contains("group aborted")
            }
            RuntimeError::Ir(IrError::Comm(_)) => true,
            _ => false,
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        RuntimeError::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn plan(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        RuntimeError::Plan {
            path: path.into(),
            reason: reason.into(),
        }
    }
}

/// Result alias of the runtime.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;
