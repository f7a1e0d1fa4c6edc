//! Training checkpoints: the whole training state of a run on disk, stored by
//! parameter (not by rank), so a run resumes bit for bit — at the same rank count —
//! or at any other rank count.
//!
//! ```text
//! DIR/                         the checkpoint root (`dlrm-run --checkpoint DIR`)
//!   latest                     the name of the newest complete checkpoint + "\n"
//!                              (written atomically after it is renamed in)
//!   step-000000100/            one checkpoint: the state after step 100
//!     manifest.json            format "dlrmc-checkpoint", version 1: model name, the
//!                              plan's identity (sha256 of its graphs' text), step,
//!                              seed, global batch, data position, the learning-rate
//!                              settings (opaque JSON), the files and every tensor
//!                              with its pieces (file, tensor key, rows, sha256)
//!     infer.ir, train.ir       the plan's graphs: a checkpoint is a self-contained
//!                              plan (`dlrm-run CKPT --infer`, `dlrmc inspect CKPT`)
//!     part-<rank>.safetensors  the pieces one rank wrote
//!   .step-000000200.tmp/       a write in progress (or one killed mid-write)
//! ```
//!
//! Invariants:
//! - **By parameter.** The manifest lists every parameter of the unpartitioned
//!   plan (weights, Split-SGD-BF16 low halves `<t>.lo`, Adagrad accumulators
//!   `<p>.acc`) with its full shape; a parameter is stored as pieces, each a
//!   contiguous row range `lo..hi` of it (rows: the first dimension) in one
//!   safetensors file. A row-shard parameter `<table>.rows<lo>_<hi>` of a
//!   partitioned graph ([`RowPiece`]) is rows `lo..hi` of `<table>`; a whole
//!   parameter is rows `0..rows`. Pieces cover each parameter exactly, in order.
//! - **Per-rank writes.** Each rank writes only the pieces it holds into its own
//!   `part-<rank>.safetensors`: its row shards and owned tables, and the replicated
//!   parameters (MLP weights, data-parallel tables) of which it is the lowest
//!   holding rank. No table is gathered to one rank. The ranks send their pieces'
//!   sha256s to rank 0 through the communicator; rank 0 writes the graphs and the
//!   manifest. Under MPI every process must see the same `DIR` (a shared file
//!   system).
//! - **Checksums.** Every byte of a part file is covered: each piece's data by its
//!   sha256, the safetensors header by the file's `header_sha256`. Reading checks
//!   every piece it uses, the headers, and the graphs' sha256.
//! - **Atomic.** A checkpoint is written into `DIR/.step-<n>.tmp/` (every file and
//!   the directory fsynced), renamed to `DIR/step-<n>/` (replacing one of the same
//!   step), then `latest` is rewritten atomically and checkpoints beyond the newest
//!   `keep` are removed. A write killed at any point leaves the previous checkpoint
//!   and `latest` intact; a leftover `.tmp` directory is never read and is removed
//!   by the next write of that step.
//! - **On demand.** A checkpoint read as a plan to run
//!   ([`Checkpoint::to_plan_on_demand`]) reads nothing when opened: its parameters
//!   are [`dlrm_ir::OnDemand`] values, and each rank reads only the parameters and
//!   rows it holds, once, from the mapped part files. [`Checkpoint::to_plan`] reads
//!   every parameter (export, inspection).
//! - **Resume.** The state after step `s` resumes at step `s + 1`: the data of
//!   step `k` is a pure function of (seed, k) (synthetic data, or a dataset's
//!   [`crate::Position`]), the executor's step counter is set, and the parameters
//!   (with optimizer state) are the only other state a step reads, so the resumed
//!   losses equal the uninterrupted run's bit for bit at the same rank count.

mod read;
mod write;

pub use read::{
    Checkpoint, is_checkpoint, read_checkpoint, read_manifest, read_plan_or_checkpoint, resolve,
};
pub(crate) use write::Writer;
pub use write::{CheckpointSpec, CheckpointWritten, RunInfo};

use crate::plan::{GraphFiles, Training};
use dlrm_ir::contract::InputContract;
use serde::{Deserialize, Serialize};

/// The manifest's `format` value.
pub const FORMAT: &str = "dlrmc-checkpoint";
/// The manifest version this crate writes and reads (a newer one is refused).
pub const VERSION: u32 = 1;
/// The pointer file naming the newest complete checkpoint of a root.
pub const LATEST_FILE: &str = "latest";

/// The directory name of the checkpoint after `step`: `step-000000100`.
pub fn step_dir_name(step: u64) -> String {
    format!("step-{step:09}")
}

/// The step of a checkpoint directory name (`step-<n>`), if it is one.
pub fn parse_step_dir(name: &str) -> Option<u64> {
    name.strip_prefix("step-")?.parse().ok()
}

/// A parameter of a partitioned graph that holds rows `lo..hi` of a full parameter
/// (`<table>.rows<lo>_<hi>`, the partition pass's row shards).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowPiece {
    /// The rank graph's parameter name.
    pub param: String,
    /// The full parameter it is part of.
    pub table: String,
    /// First row.
    pub lo: usize,
    /// One past the last row.
    pub hi: usize,
}

/// The plan a checkpoint continues: enough to run it as a plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanInfo {
    /// sha256 of the graphs' text forms (`infer.ir`, then `train.ir`): the plan's
    /// identity ([`plan_identity`]).
    pub sha256: String,
    /// Precision policy, e.g. `fp32`.
    pub precision: String,
    /// Training hyper-parameters of the plan.
    pub training: Training,
    /// The compiler's pass log (opaque).
    pub pass_log: serde_json::Value,
    /// The graph files in the checkpoint directory.
    pub graphs: GraphFiles,
    /// The model's input contract (absent: the identity).
    #[serde(default, skip_serializing_if = "InputContract::is_identity")]
    pub contract: InputContract,
}

/// Where the data stream stands: the data of step `k` is a pure function of the
/// seed and `k`, so the step is the position; a dataset's epoch and batch are
/// recorded for people and checks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DataPosition {
    /// `synthetic` or `dataset`.
    pub source: String,
    /// The dataset's path, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<String>,
    /// The dataset's training split, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_split: Option<String>,
    /// The data step the next training step reads (0-based: step `s + 1` reads
    /// data step `s`).
    pub next_data_step: u64,
    /// The dataset's epoch of that data step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    /// The batch within that epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<u64>,
}

/// One file of part data.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PartFile {
    /// File name inside the checkpoint directory.
    pub file: String,
    /// Size in bytes.
    pub bytes: u64,
    /// sha256 of the safetensors header (the 8-byte length and the JSON).
    pub header_sha256: String,
    /// The rank that wrote it.
    pub rank: usize,
}

/// One stored piece of a parameter: rows `rows[0]..rows[1]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Piece {
    /// The file holding it.
    pub file: String,
    /// The tensor's key in that file.
    pub tensor: String,
    /// The row range `[lo, hi)`.
    pub rows: [usize; 2],
    /// sha256 of the piece's data bytes (little-endian elements).
    pub sha256: String,
}

/// One parameter of the plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorEntry {
    /// The parameter's name in the unpartitioned plan.
    pub name: String,
    /// Element type mnemonic (`f32`, `bf16`, `i64`, `i32`).
    pub dtype: String,
    /// The full shape.
    pub shape: Vec<usize>,
    /// Its pieces, in row order, covering rows `0..shape[0]` exactly.
    pub pieces: Vec<Piece>,
}

impl TensorEntry {
    /// Rows (the first dimension; 1 for a scalar).
    pub fn rows(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }
}

/// The contents of `manifest.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`VERSION`] when written by this crate.
    pub version: u32,
    /// The model's name.
    pub name: String,
    /// Who wrote it, e.g. `dlrm-runtime 0.1.0`.
    pub created_by: String,
    /// The training steps done: the run resumes at `step + 1`.
    pub step: u64,
    /// The last step of the run that wrote it (`--iters`): a resumed run without
    /// `--iters` runs to it.
    #[serde(default)]
    pub last_step: u64,
    /// The data seed.
    pub seed: u64,
    /// The global batch.
    pub global_batch: usize,
    /// The rank count of the run that wrote it (informational: any rank count
    /// loads it).
    pub ranks: usize,
    /// The data position.
    pub data: DataPosition,
    /// The run's learning-rate schedule (a pure function of the step, so the step
    /// is its position); `null`: every update at the rate it was compiled with. A
    /// resumed run continues with it unless `dlrm-run --lr`/`--lr-*` say otherwise.
    #[serde(default)]
    pub lr_schedule: Option<crate::lr_schedule::LrSchedule>,
    /// The plan.
    pub plan: PlanInfo,
    /// The part files.
    pub files: Vec<PartFile>,
    /// Every parameter, in the plan's order.
    pub tensors: Vec<TensorEntry>,
}

/// The identity of a plan's graphs: sha256 of the inference graph's text, a
/// newline, and the training graph's text (empty if none).
pub fn plan_identity(infer: &dlrm_ir::Graph, train: Option<&dlrm_ir::Graph>) -> String {
    let mut text = dlrm_ir::text::print(infer);
    text.push('\n');
    if let Some(t) = train {
        text.push_str(&dlrm_ir::text::print(t));
    }
    dlrm_data::durable::sha256_hex(text.as_bytes())
}
