//! dlrmc: the orchestration behind the `dlrmc` and `dlrm-run` binaries.
//!
//! The binaries only parse arguments and print; everything they do is here, so the
//! end-to-end tests drive the same code:
//!
//! - [`model`]: read a model file (JSON description or ONNX) into a forward graph,
//!   initial parameters and training defaults;
//! - [`mod@compile`]: run the pass pipeline for inference and (optionally) training and
//!   assemble a [`dlrm_runtime::plan::Plan`], calling an observer after every pass
//!   (the `--dump-ir` hook);
//! - [`inspect`]: the summary of a plan that `dlrmc inspect` prints;
//! - [`launch`]: partition a plan for N ranks, build the runtime's job and run it
//!   on threads or as one rank of an MPI job;
//! - [`shard`]: the sharding planner on a plan (placement, predictions, scaling);
//! - [`memory`]: each rank's memory account, its budget, and the refusal of a job
//!   that does not fit;
//! - [`data_cmd`]: the `dlrmc data` subcommands (convert, inspect, generate).

#![warn(missing_docs)]
// Module docs link private helpers; the docs are built with --document-private-items.
#![allow(rustdoc::private_intra_doc_links)]

pub mod calibrate;
pub mod compile;
pub mod console;
pub mod data_cmd;
mod error;
pub mod inspect;
pub mod launch;
pub mod memory;
pub mod model;
pub mod plot;
pub mod shard;

pub use compile::{CompileOptions, Stage, compile};
pub use error::{Error, Result};
pub use inspect::Inspection;
pub use launch::{Comm, Ranks, RunOptions, RunSettings, job_for, run_job};
pub use model::{Model, load_model};
pub use shard::{ShardSettings, plan_shards};
