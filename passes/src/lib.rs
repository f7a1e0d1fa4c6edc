//! dlrm-passes: every graph-to-graph transformation of dlrmc and the pass manager.
//!
//! - [`pipeline`]: the pass order in one place ([`pipeline::PASSES`]), [`compile`] runs
//!   it, verifying the graph after every pass and logging per-pass timings;
//! - [`autodiff`]: the training step (loss, reverse-mode backward, SGD updates);
//! - [`egraph`]: the e-graphs: canonicalisation of imported models (pass `canon`:
//!   embedding bags, `linear`, interactions from generic ops) and the optimisation
//!   (pass `fuse`): linear layers as blocked
//!   batch-reduce GEMMs (`brgemm`) with fused epilogues and backward, the stable
//!   BCE on logits, the fused embedding update; cost-model extraction;
//! - [`layout`]: blocked weight storage; [`precision`]: bf16 / mixed storage with
//!   Split-SGD-BF16;
//! - [`saved`]: pass `save-activations`, after `autodiff` (a module op's forward
//!   keeps what its gradient would recompute: `cross_save` / `cross_grad_saved`);
//! - [`dce`]: dead-code elimination;
//! - [`mod@partition`]: one graph per rank for hybrid-parallel execution (tables placed
//!   as a [`ShardPlan`] says, `all_to_all` for embeddings, `all_reduce` for dense
//!   gradients);
//! - [`mask`]: pass `fuse-dgrad-mask`, after `fuse` (an activation's gradient
//!   computed once, in the epilogue of the GEMM that produces its operand);
//! - [`cross_epilogue`]: pass `fuse-cross-epilogue`, after `precision` (DCN-v2's
//!   elementwise cross steps in the epilogues of the cross layers' GEMMs);
//! - [`interaction_layout`]: pass `fuse-interaction-layout`, after
//!   `fuse-cross-epilogue` (a dot interaction written straight in the blocked
//!   layout of the GEMM that reads it);
//! - [`mod@bucket`]: dense-gradient `all_reduce`s fused into buckets (DDP style), a
//!   per-rank pass ([`pipeline::RANK_PASSES`]) run on every rank's graph after
//!   `partition`;
//! - [`mod@schedule`]: communication-aware node order (collectives early, updates late),
//!   the per-rank pass after `bucket`;
//! - [`shard`]: the sharding planner, the one placement of the tables (table-wise,
//!   row-wise and data-parallel tables chosen by a cost model; predicted step times
//!   and scaling);
//! - [`stats`]: op counts, parameter sizes and FLOPs per sample.
//!
//! Every pass takes a verified graph and returns a verified graph; errors are
//! [`PassError`]s naming the pass and, where there is one, the node.
//!
//! ```
//! use dlrm_ir::{Act, Dim, Graph, Op, TensorType};
//! use dlrm_passes::{LossKind, PipelineOptions, PlannerOptions, TrainConfig};
//! use dlrm_passes::{compile, partition, partition_with, shard};
//!
//! // p = sigmoid(x · wᵀ + b)
//! let mut g = Graph::new("tiny");
//! let x = g.add_input("x", TensorType::f32([Dim::batch(), Dim::Fixed(3)]))?;
//! let w = g.add_param("w", TensorType::f32([Dim::Fixed(1), Dim::Fixed(3)]))?;
//! let b = g.add_param("b", TensorType::f32([Dim::Fixed(1)]))?;
//! let p = g.add(Op::Linear { act: Act::Sigmoid }, &[x, w, b], "p")?;
//! g.add_output(p);
//!
//! let opts = PipelineOptions { train: Some(TrainConfig { loss: LossKind::Bce, lr: 0.1, optimizer: Default::default() }), ..Default::default() };
//! let (train, log) = compile(g, &opts, &mut |_stage, _graph| {})?;
//! assert_eq!(train.updates().len(), 2); // w and b
//! assert_eq!(log.passes.len(), 3); // autodiff, save-activations, dce
//!
//! // Two ranks, the tables (none here) placed by the sharding planner.
//! let plan = shard::plan(&partition::tables(&train)?, &PlannerOptions::new(2, 64))?;
//! let ranks = partition_with(&train, &plan)?;
//! assert_eq!(ranks.graphs[1].name, "tiny.rank1");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

pub mod autodiff;
pub mod bucket;
pub mod canonical_bags;
mod copy;
pub mod cross;
pub mod cross_epilogue;
pub mod dce;
pub mod described;
pub mod egraph;
mod error;
pub mod interaction_layout;
pub mod layout;
pub mod mask;
pub mod partition;
mod pass;
pub mod pipeline;
pub mod precision;
pub mod quantize;
pub mod saved;
pub mod schedule;
pub mod shard;
pub mod stats;

pub use autodiff::Autodiff;
pub use bucket::{Bucket, DEFAULT_BUCKET_BYTES, bucket};
pub use canonical_bags::{Canonical, canonical_bags};
pub use dce::Dce;
pub use described::{CompiledValues, compile_values};
pub use error::{PassError, Result};
pub use partition::{Partitioned, RowShard, TableInfo, partition_buckets, partition_with};
pub use pass::{Pass, PassStats, Ran};
pub use pipeline::{
    Compiled, DumpSpec, PassLog, PassRecord, PipelineOptions, Precision, compile, compile_params,
    run_passes,
};
pub use schedule::{Schedule, schedule};
pub use shard::{PlannerOptions, ShardKind, ShardPlan};
pub use stats::GraphStats;

use serde::{Deserialize, Serialize};

/// The loss a training graph minimises.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LossKind {
    /// Binary cross-entropy on the predicted probability (`bce`).
    Bce,
    /// Mean squared error (`mse`).
    Mse,
}

/// What the autodiff pass needs to build a training step.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// The loss.
    pub loss: LossKind,
    /// The learning rate (dense and sparse updates alike).
    pub lr: f32,
    /// The optimizer (SGD when absent).
    #[serde(default)]
    pub optimizer: Optimizer,
}

/// The optimizer of a training step (see `autodiff` for the ops each emits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Optimizer {
    /// Plain SGD: `sgd` on dense parameters, `sparse_sgd` on tables.
    #[default]
    Sgd,
    /// Adagrad (`torch.optim.Adagrad`): `adagrad` on dense parameters,
    /// `sparse_adagrad` with an accumulator per element on tables.
    Adagrad(AdagradConfig),
    /// Row-wise Adagrad on tables (the reference's `RWSAdagrad`, FBGEMM's
    /// `EXACT_ROWWISE_ADAGRAD`: one accumulator per row), plain Adagrad on dense
    /// parameters (as the reference does).
    RowwiseAdagrad(AdagradConfig),
}

/// Adagrad's hyper-parameters beside the learning rate (PyTorch's names and
/// defaults).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdagradConfig {
    /// Added to the accumulator's root (`eps`, default 1e-10).
    pub eps: f32,
    /// Every accumulator's initial value (`initial_accumulator_value`, default 0).
    pub initial_accumulator_value: f32,
    /// L2 weight decay of the dense parameters (`weight_decay`, default 0): the
    /// gradient becomes `g + wd·w`. Tables get none (PyTorch and the reference
    /// refuse weight decay with sparse gradients).
    pub weight_decay: f32,
}

impl Default for AdagradConfig {
    fn default() -> AdagradConfig {
        AdagradConfig {
            eps: 1e-10,
            initial_accumulator_value: 0.0,
            weight_decay: 0.0,
        }
    }
}

impl Optimizer {
    /// The name used by the JSON spec and `--optimizer`.
    pub fn name(&self) -> &'static str {
        match self {
            Optimizer::Sgd => "sgd",
            Optimizer::Adagrad(_) => "adagrad",
            Optimizer::RowwiseAdagrad(_) => "rowwise_adagrad",
        }
    }
}
