//! The sharding planner applied to a plan ([`dlrm_passes::shard`]): the tables and
//! dense profile of the plan's graphs, the [`ShardPlan`] for N ranks (shared by
//! `dlrm-run`, `dlrmc compile --dump-ir partition` and `dlrmc plan-shards`, so
//! all three place identically), and the `plan-shards` report.
//!
//! The placement is computed once per plan from its training graph (the inference
//! graph when there is none; both have the same tables, and the planner depends on
//! nothing else) and applied to both graphs.

use crate::error::{Error, Result};
use dlrm_ir::Graph;
use dlrm_passes::partition::{Partitioned, TableInfo, tables};
use dlrm_passes::pipeline;
use dlrm_passes::shard::{
    self, DEFAULT_MEM_PER_RANK, DenseProfile, Machine, Network, Prediction, ScalePoint,
};
use dlrm_passes::{DEFAULT_BUCKET_BYTES, PlannerOptions, ShardPlan};
use dlrm_runtime::plan::Plan;
use serde::Serialize;

/// How a plan is split over N ranks: the sharding planner's knobs (`--mem-per-rank`,
/// `--network`, `--machine`) and the gradient all-reduce buckets (`--bucket-bytes`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShardSettings {
    /// Bytes of tables one rank may hold.
    pub mem_per_rank: u64,
    /// Latency and bandwidth between ranks.
    pub network: Network,
    /// One rank's compute and memory rates.
    pub machine: Machine,
    /// Bytes per dense-gradient all-reduce bucket (0: one all-reduce per gradient;
    /// see `dlrm_passes::bucket`).
    pub bucket_bytes: u64,
}

impl Default for ShardSettings {
    fn default() -> ShardSettings {
        ShardSettings {
            mem_per_rank: DEFAULT_MEM_PER_RANK,
            network: Network::default(),
            machine: Machine::default(),
            bucket_bytes: DEFAULT_BUCKET_BYTES,
        }
    }
}

impl ShardSettings {
    /// The planner options for `ranks` ranks and a global batch.
    pub fn options(&self, ranks: usize, global_batch: usize) -> PlannerOptions {
        PlannerOptions {
            ranks,
            global_batch,
            mem_per_rank: self.mem_per_rank,
            network: self.network,
            machine: self.machine,
        }
    }
}

/// Parses a `--bucket-bytes` value: `0` (no buckets) or a byte count such as
/// `1MiB` (as `--mem-per-rank`).
pub fn parse_bucket_bytes(s: &str) -> Result<u64> {
    if s.trim() == "0" {
        return Ok(0);
    }
    shard::parse_bytes(s).map_err(|e| Error::Options(e.to_string()))
}

fn planner_err(graph: &'static str, ranks: usize, e: dlrm_passes::PassError) -> Error {
    Error::Partition {
        graph,
        ranks,
        source: Box::new(e),
    }
}

/// The graph the placement is computed from: training if any, else inference.
fn source(plan: &Plan) -> (&'static str, &Graph) {
    match &plan.train {
        Some(t) => ("train", t),
        None => ("infer", &plan.infer),
    }
}

/// The tables of the plan (cost-model view).
pub fn plan_tables(plan: &Plan) -> Result<Vec<TableInfo>> {
    let (which, g) = source(plan);
    tables(g).map_err(|e| planner_err(which, 1, e))
}

/// The placement of the plan's tables on `ranks` ranks for a global batch.
pub fn shard_plan(
    plan: &Plan,
    ranks: usize,
    global_batch: usize,
    settings: &ShardSettings,
) -> Result<ShardPlan> {
    let (which, _) = source(plan);
    let ts = plan_tables(plan)?;
    shard::plan(&ts, &settings.options(ranks, global_batch))
        .map_err(|e| planner_err(which, ranks, e))
}

/// `g` partitioned as `sp` says, its dense gradients all-reduced in buckets of
/// `bucket_bytes`; `which` names the graph in errors.
pub fn partition_graph(
    g: &Graph,
    which: &'static str,
    sp: &ShardPlan,
    bucket_bytes: u64,
) -> Result<Partitioned> {
    partition_observed(g, which, sp, bucket_bytes, &mut |_, _, _| {})
}

/// [`partition_graph`], calling `on_pass(stage, rank, graph)` after the `partition`
/// pass and after each per-rank pass ([`dlrm_passes::pipeline::partition`]).
pub fn partition_observed(
    g: &Graph,
    which: &'static str,
    sp: &ShardPlan,
    bucket_bytes: u64,
    on_pass: &mut dyn FnMut(&str, usize, &Graph),
) -> Result<Partitioned> {
    pipeline::partition(g, sp, bucket_bytes, on_pass).map_err(|e| planner_err(which, sp.ranks, e))
}

/// What `dlrmc plan-shards` prints.
#[derive(Clone, Debug, Serialize)]
pub struct ShardReport {
    /// The plan's name.
    pub plan: String,
    /// The placement and every rank's predicted step.
    pub prediction: Prediction,
    /// Predicted weak and strong scaling from 1 rank to the asked count.
    pub scaling: Vec<ScalePoint>,
    /// The options used.
    pub options: PlannerOptions,
}

/// Plans the shards of `plan` for `ranks` ranks and predicts the step and the
/// scaling curve (training if the plan trains, else inference).
pub fn plan_shards(
    plan: &Plan,
    ranks: usize,
    global_batch: Option<usize>,
    settings: &ShardSettings,
) -> Result<ShardReport> {
    if ranks == 0 {
        return Err(Error::Options("--ranks must be at least 1".into()));
    }
    let batch = global_batch.unwrap_or(plan.training.batch_size);
    if batch < ranks {
        return Err(Error::Options(format!(
            "--ranks {ranks} is more than the global batch of {batch} samples: every rank \
             needs at least one sample (lower --ranks or raise --batch-size)"
        )));
    }
    let (which, g) = source(plan);
    let ts = plan_tables(plan)?;
    let dense = DenseProfile::of(g);
    let opts = settings.options(ranks, batch);
    let sp = shard::plan(&ts, &opts).map_err(|e| planner_err(which, ranks, e))?;
    let prediction = shard::predict(&ts, &dense, &sp, &opts);
    let scaling = shard::scaling(&ts, &dense, &opts).map_err(|e| planner_err(which, ranks, e))?;
    Ok(ShardReport {
        plan: plan.name.clone(),
        prediction,
        scaling,
        options: opts,
    })
}

impl std::fmt::Display for ShardReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let o = &self.options;
        writeln!(
            f,
            "plan `{}`: network {} µs, {} GB/s; machine {} GFLOP/s, {} GB/s per rank; \
             {:.1} MiB of tables per rank",
            self.plan,
            o.network.latency_us,
            o.network.gbps,
            o.machine.gflops,
            o.machine.mem_gbps,
            o.mem_per_rank as f64 / (1024.0 * 1024.0)
        )?;
        write!(f, "{}", self.prediction)?;
        writeln!(
            f,
            "\npredicted scaling (strong: global batch {}; weak: {} samples per rank):",
            o.global_batch,
            (o.global_batch / o.ranks.max(1)).max(1)
        )?;
        write!(f, "{}", shard::scaling_table(&self.scaling))
    }
}
