//! dlrm-compiler: the compiler driver behind `dlrmc compile` and `dlrmc inspect`,
//! as a library (the binaries parse arguments and print; the end-to-end tests and
//! `dlrm-serve`'s tests drive the same code):
//!
//! - [`model`]: read a model file (JSON description or ONNX) into a forward graph,
//!   initial parameters and training defaults, with command-line overrides;
//! - [`mod@compile`]: run the pass pipeline for inference and (optionally) training and
//!   assemble a [`dlrm_runtime::plan::Plan`], calling an observer after every pass
//!   (the `--dump-ir` hook);
//! - [`inspect`]: the summary of a plan or checkpoint (the data `dlrmc inspect`
//!   prints).
//!
//! Running a plan on N ranks (placement, partitioning, the memory check, the job)
//! is the runtime's ([`dlrm_runtime::launch`], [`dlrm_runtime::Trainer`]), and so
//! is measuring this machine's rates ([`dlrm_runtime::calibrate`]).

#![warn(missing_docs)]
// Module docs link private helpers; the docs are built with --document-private-items.
#![allow(rustdoc::private_intra_doc_links)]

pub mod compile;
mod error;
pub mod inspect;
pub mod model;

pub use compile::{CompileOptions, Stage, compile};
pub use error::{Error, Result};
pub use inspect::Inspection;
pub use model::{Model, load_model};
