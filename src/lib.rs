//! dlrmc: the command line behind the `dlrmc` and `dlrm-run` binaries.
//!
//! The binaries parse arguments and print; the compiler's steps are here, so the
//! end-to-end tests drive the same code, and running a plan on N ranks (placement,
//! partitioning, the memory check, the job) is the runtime's
//! ([`dlrm_runtime::launch`], [`dlrm_runtime::Trainer`]):
//!
//! - [`model`]: read a model file (JSON description or ONNX) into a forward graph,
//!   initial parameters and training defaults;
//! - [`mod@compile`]: run the pass pipeline for inference and (optionally) training and
//!   assemble a [`dlrm_runtime::plan::Plan`], calling an observer after every pass
//!   (the `--dump-ir` hook);
//! - [`inspect`]: the summary of a plan that `dlrmc inspect` prints;
//! - [`planner`]: the sharding planner's flags, which make the runtime's
//!   [`dlrm_runtime::ShardSettings`] (with the rates of [`calibrate`]'s file: the
//!   runtime's, which measures them, re-exported);
//! - [`data_cmd`]: the `dlrmc data` subcommands (convert, inspect, generate).

#![warn(missing_docs)]
// Module docs link private helpers; the docs are built with --document-private-items.
#![allow(rustdoc::private_intra_doc_links)]

pub mod compile;
pub mod console;
pub mod data_cmd;
mod error;
pub mod inspect;
pub mod model;
pub mod planner;
pub mod plot;

pub use compile::{CompileOptions, Stage, compile};
pub use dlrm_runtime::calibrate;
pub use error::{Error, Result};
pub use inspect::Inspection;
pub use model::{Model, load_model};
