//! dlrmc: the command line behind the `dlrmc` and `dlrm-run` binaries.
//!
//! The binaries parse arguments and print; what computes is in the libraries, so
//! the end-to-end tests drive the same code:
//!
//! - the compiler driver is [`dlrm_compiler`]: [`model`] (read a model file, JSON
//!   description or ONNX, with overrides), [`mod@compile`] (the pass pipelines into
//!   a [`dlrm_runtime::plan::Plan`], an observer after every pass for `--dump-ir`)
//!   and the data of [`inspect`], re-exported here under their old paths
//!   (`dlrmc::compile::compile`, `dlrmc::model::load_model`, ...);
//! - running a plan on N ranks (placement, partitioning, the memory check, the
//!   job) is the runtime's ([`dlrm_runtime::launch`], [`dlrm_runtime::Trainer`]),
//!   and so is measuring this machine's rates ([`calibrate`], re-exported).
//!
//! What stays here is argument parsing and output formatting:
//!
//! - [`inspect`]: `dlrmc inspect`'s text of a plan's summary;
//! - [`planner`]: the sharding planner's flags, which make the runtime's
//!   [`dlrm_runtime::ShardSettings`];
//! - [`data_cmd`]: the `dlrmc data` subcommands (convert, inspect, generate) over
//!   `dlrm-data`;
//! - [`console`]: what `dlrm-run` shows while a job runs and its closing line;
//! - [`plot`]: `dlrmc plot`'s SVG of learning curves.

#![warn(missing_docs)]
// Module docs link private helpers; the docs are built with --document-private-items.
#![allow(rustdoc::private_intra_doc_links)]

pub mod console;
pub mod data_cmd;
pub mod inspect;
pub mod planner;
pub mod plot;

pub use dlrm_compiler::{CompileOptions, Error, Model, Result, Stage, compile, load_model, model};
pub use dlrm_runtime::calibrate;
pub use inspect::Inspection;
