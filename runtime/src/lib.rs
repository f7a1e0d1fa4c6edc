//! dlrm-runtime: runs dlrmc plans.
//!
//! - [`calibrate`]: this machine's rates for the sharding planner (GEMM GFLOP/s,
//!   embedding-gather GB/s, all-to-all latency and bandwidth), measured with the
//!   JIT kernels and the communicators, kept in a file the planner reads;
//! - [`plan`]: plans on disk (a directory: manifest, graphs in IR text, safetensors
//!   weights), written atomically, read with checksums;
//! - [`checkpoint`]: training checkpoints (by parameter, per-rank writes, atomic,
//!   checksummed) and resume at any rank count;
//! - [`synthetic`]: deterministic synthetic data that a DLRM can learn, identical
//!   whatever the rank count;
//! - [`dataset`]: a `.ds` dataset (dlrm-data) as a plan's data: schema mapping,
//!   deterministic block shuffle, rank slices; [`source`] puts both behind one
//!   interface, and a loader thread per rank prefetches a dataset's batches;
//! - [`exec`]: the per-rank [`Executor`] (codegen kernels, interpreter fallback,
//!   in-place optimizer updates, per-op timers, collectives overlapped with compute);
//! - [`progress`]: the progress thread that runs a rank's collectives in flight;
//! - [`driver`]: N ranks as threads with a [`LocalGroup`] communicator, or this
//!   process's one rank with any communicator ([`run_rank`]), training or
//!   inference, then held-out evaluation ([`run`] -> [`Report`]);
//! - [`MpiComm`]: one rank per MPI process (`mpirun`), with the `mpi` cargo
//!   feature; without it a stand-in whose [`MpiComm::init`] is a clear error;
//! - [`lr_schedule`]: learning-rate schedules ([`LrSchedule`]): each training step's
//!   rate as a pure function of the step, handed to the executor per step;
//! - [`metrics`]: AUC, log loss, accuracy, normalized entropy and the JSON-lines
//!   metrics file;
//! - [`launch`]: a plan placed and partitioned for N ranks ([`launch::shard`]: the
//!   sharding planner on a plan), every rank's memory checked against its budget
//!   ([`launch::memory`]), as the driver's [`Job`] ([`job_for`]), run on threads
//!   or as one rank of a process group ([`run_job`]);
//! - [`trainer`]: a plan trained from Rust ([`Trainer`]: loaded once, options
//!   through a builder, placed, checked and run on N ranks);
//! - [`session`]: a plan served from Rust ([`Session`]: loaded once, inputs in the
//!   model's own names, called many times).
//!
//! Errors are one [`RuntimeError`] enum with structured fields (file, rank, step,
//! node); [`Result`] is its alias.

#![warn(missing_docs)]
// Module docs link private helpers; the docs are built with --document-private-items.
#![allow(rustdoc::private_intra_doc_links)]

pub mod calibrate;
pub mod checkpoint;
pub mod dataset;
pub mod driver;
mod error;
pub mod exec;
pub mod launch;
pub mod lr_schedule;
pub mod metrics;
#[cfg(feature = "mpi")]
mod mpi_comm;
#[cfg(not(feature = "mpi"))]
#[path = "mpi_stub.rs"]
mod mpi_comm;
pub mod plan;
mod prefetch;
pub mod progress;
pub mod roofline;
pub mod session;
pub mod source;
pub mod synthetic;
pub mod trainer;

pub use dataset::{DataConfig, DatasetSource, LoaderBench, OnNonFinite, Position, bench_loader};
pub use dlrm_ir::{AllReduceAlgo, Communicator, LocalComm, LocalGroup};
pub use driver::{
    BestAuc, Event, Job, Mode, Report, RunSettings, WaitPolicy, run, run_rank, run_with_params,
};
pub use error::{Result, RuntimeError};
pub use exec::{Backend, Executor, KernelChoice, OpTime};
pub use launch::shard::{ShardSettings, plan_shards};
pub use launch::{CheckpointOptions, Comm, Ranks, RunOptions, infer_once, job_for, run_job};
pub use lr_schedule::{LrPolicy, LrSchedule};
pub use metrics::{EvalMetrics, MetricsWriter, accuracy, auc, log_loss, normalized_entropy};
pub use mpi_comm::MpiComm;
pub use plan::{Plan, QuantizeReport, Training, read_manifest, read_plan, write_plan};
pub use progress::CommTimes;
pub use session::Session;
pub use source::{EvalSet, Source};
pub use synthetic::{DataSchema, SyntheticData, eval_step};
pub use trainer::Trainer;
