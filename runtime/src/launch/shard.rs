//! The sharding planner applied to a plan ([`dlrm_passes::shard`]): the tables and
//! dense profile of the plan's graphs, the [`ShardPlan`] for N ranks (shared by
//! `dlrm-run`, `dlrmc compile --dump-ir partition` and `dlrmc plan-shards`, so
//! all three place identically), and the `plan-shards` report.
//!
//! The placement is computed once per plan from its training graph (the inference
//! graph when there is none; both have the same tables, and the planner depends on
//! nothing else) and applied to both graphs.

use crate::error::{Result, RuntimeError};
use crate::plan::Plan;
use dlrm_ir::Graph;
use dlrm_passes::partition::{Partitioned, TableInfo, tables};
use dlrm_passes::pipeline;
use dlrm_passes::shard::{
    self, DEFAULT_MEM_PER_RANK, DenseProfile, Machine, MemoryAccount, MemoryJob, Network,
    Prediction, ScalePoint,
};
use dlrm_passes::{DEFAULT_BUCKET_BYTES, PlannerOptions, ShardPlan};
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
    /// Where `network` and `machine` come from.
    pub rates: Rates,
}

impl Default for ShardSettings {
    fn default() -> ShardSettings {
        ShardSettings {
            mem_per_rank: DEFAULT_MEM_PER_RANK,
            network: Network::default(),
            machine: Machine::default(),
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            rates: Rates::Default,
        }
    }
}

/// Where the planner's machine and network rates come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rates {
    /// The built-in guesses ([`Machine::default`], [`Network::default`]).
    #[default]
    Default,
    /// Measured on this machine by `dlrmc calibrate` (read by the command line and
    /// given here as plain rates).
    Calibrated,
    /// `--machine` and `--network` (or one of them, the other calibrated or the
    /// default).
    Flags,
}

impl std::fmt::Display for Rates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Rates::Default => "built-in guesses: measure them with `dlrmc calibrate`",
            Rates::Calibrated => "measured by `dlrmc calibrate`",
            Rates::Flags => "from --machine/--network",
        })
    }
}

impl ShardSettings {
    /// The planner options for `ranks` ranks and a global batch (nothing reserved
    /// besides tables; [`planner_options`] reserves the rest of a plan's ranks).
    pub fn options(&self, ranks: usize, global_batch: usize) -> PlannerOptions {
        PlannerOptions {
            ranks,
            global_batch,
            mem_per_rank: self.mem_per_rank,
            reserved_per_rank: 0,
            network: self.network,
            machine: self.machine,
        }
    }
}

fn planner_err(graph: &'static str, ranks: usize, e: dlrm_passes::PassError) -> RuntimeError {
    RuntimeError::Partition {
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

/// What the memory account of a rank sets aside besides its tables, estimated on
/// the unpartitioned graph `g` at the local batch `ceil(G/R)`: dense parameters
/// and their state, activations, gradients and inputs (its table parts left out).
pub fn reserved_per_rank(g: &Graph, ranks: usize, global_batch: usize) -> u64 {
    let job = MemoryJob {
        global_batch: global_batch.div_ceil(ranks.max(1)),
        ranks: 1,
        prefetch: 0,
    };
    let a = shard::account(g, 0, &job);
    let table_state: u64 = a.tables.iter().map(|t| t.state_bytes).sum();
    a.total.saturating_sub(a.table_bytes + table_state)
}

/// The planner options the placement uses on `ranks` ranks: `settings`', tables
/// (with their optimizer state) placed in `--mem-per-rank`, nothing reserved, so a
/// budget of a few KiB still forces row-wise splits (the tests do). The rest of
/// each rank is judged afterwards, on the partitioned graphs ([`super::memory`]);
/// the suggestions reserve it ([`reserved_per_rank`]).
pub fn planner_options(
    _g: &Graph,
    ranks: usize,
    global_batch: usize,
    settings: &ShardSettings,
) -> PlannerOptions {
    settings.options(ranks, global_batch)
}

/// The placement of the plan's tables on `ranks` ranks for a global batch.
pub fn shard_plan(
    plan: &Plan,
    ranks: usize,
    global_batch: usize,
    settings: &ShardSettings,
) -> Result<ShardPlan> {
    let (which, g) = source(plan);
    let ts = plan_tables(plan)?;
    shard::plan(&ts, &planner_options(g, ranks, global_batch, settings))
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

/// Partitions the plan's graphs (inference, then training) for `ranks` ranks, the
/// tables placed at the plan's batch size, calling `on_pass(graph, pass, rank,
/// g)` with each rank's graph after the `partition` pass and after each per-rank
/// pass; `graph` is `infer` or `train` (`dlrmc compile --dump-ir` of these stages).
pub fn partition_plan_observed(
    plan: &Plan,
    ranks: usize,
    settings: &ShardSettings,
    on_pass: &mut dyn FnMut(&'static str, &str, usize, &Graph),
) -> Result<()> {
    let sp = shard_plan(plan, ranks, plan.training.batch_size.max(ranks), settings)?;
    let graphs = [("infer", Some(&plan.infer)), ("train", plan.train.as_ref())];
    for (which, g) in graphs {
        let Some(g) = g else { continue };
        let mut observe = |pass: &str, r: usize, pg: &Graph| on_pass(which, pass, r, pg);
        partition_observed(g, which, &sp, settings.bucket_bytes, &mut observe)?;
    }
    Ok(())
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
    /// Where the machine and network rates came from.
    pub rates: Rates,
    /// Every rank's memory account ([`dlrm_passes::shard::memory`]).
    pub memory: Vec<MemoryAccount>,
}

/// The graphs of a plan, for planning without its parameters.
#[derive(Clone, Copy, Debug)]
pub struct PlanGraphs<'a> {
    /// The plan's name.
    pub name: &'a str,
    /// The inference graph.
    pub infer: &'a Graph,
    /// The training graph, if the plan trains.
    pub train: Option<&'a Graph>,
    /// The plan's batch size.
    pub batch_size: usize,
    /// Its precision (`fp32`, `bf16`, ...).
    pub precision: &'a str,
}

impl<'a> PlanGraphs<'a> {
    /// The graphs of `plan`.
    pub fn of(plan: &'a Plan) -> PlanGraphs<'a> {
        PlanGraphs {
            name: &plan.name,
            infer: &plan.infer,
            train: plan.train.as_ref(),
            batch_size: plan.training.batch_size,
            precision: &plan.precision,
        }
    }
}

/// Plans the shards of `plan` for `ranks` ranks and predicts the step, the scaling
/// curve (training if the plan trains, else inference) and every rank's memory;
/// refuses a plan whose largest rank does not fit `settings.mem_per_rank`
/// ([`super::memory`]).
pub fn plan_shards(
    plan: &Plan,
    ranks: usize,
    global_batch: Option<usize>,
    settings: &ShardSettings,
) -> Result<ShardReport> {
    plan_shards_graphs(PlanGraphs::of(plan), ranks, global_batch, settings)
}

/// [`plan_shards`] on a plan's graphs alone (no parameter data).
pub fn plan_shards_graphs(
    pg: PlanGraphs<'_>,
    ranks: usize,
    global_batch: Option<usize>,
    settings: &ShardSettings,
) -> Result<ShardReport> {
    if ranks == 0 {
        return Err(RuntimeError::Options("--ranks must be at least 1".into()));
    }
    dlrm_passes::shard::check_rank_count(ranks).map_err(RuntimeError::Options)?;
    let batch = global_batch.unwrap_or(pg.batch_size);
    if batch < ranks {
        return Err(RuntimeError::Options(format!(
            "--ranks {ranks} is more than the global batch of {batch} samples: every rank \
             needs at least one sample (lower --ranks or raise --batch-size)"
        )));
    }
    let (which, g) = match pg.train {
        Some(t) => ("train", t),
        None => ("infer", pg.infer),
    };
    let ts = tables(g).map_err(|e| planner_err(which, 1, e))?;
    let dense = DenseProfile::of(g);
    let opts = planner_options(g, ranks, batch, settings);
    let want = super::memory::Want {
        graph: g,
        tables: &ts,
        ranks,
        global_batch: batch,
        settings,
        budget: settings.mem_per_rank,
        train: pg.train.is_some(),
        precision: pg.precision,
        per_machine: None,
    };
    let budget = super::memory::Budget::given(settings.mem_per_rank);
    let job = MemoryJob {
        global_batch: batch,
        ranks,
        prefetch: 0,
    };
    let sp = match shard::plan(&ts, &opts) {
        Ok(sp) => sp,
        Err(e) if ranks == 1 => {
            // One rank holds everything: the account says what does not fit.
            let accounts = super::memory::rank_accounts(
                pg.train.map(std::slice::from_ref),
                std::slice::from_ref(pg.infer),
                &job,
            );
            super::memory::check(&accounts, &budget, &want)?;
            return Err(planner_err(which, ranks, e));
        }
        Err(e) => return Err(super::memory::placement_refusal(&e, &want)),
    };
    let memory = if ranks == 1 {
        super::memory::rank_accounts(
            pg.train.map(std::slice::from_ref),
            std::slice::from_ref(pg.infer),
            &job,
        )
    } else {
        let part = partition_graph(g, which, &sp, settings.bucket_bytes)?;
        let infer = match pg.train {
            Some(_) => partition_graph(pg.infer, "infer", &sp, settings.bucket_bytes)?.graphs,
            None => part.graphs.clone(),
        };
        let train = pg.train.map(|_| part.graphs);
        super::memory::rank_accounts(train.as_deref(), &infer, &job)
    };
    super::memory::check(&memory, &budget, &want)?;
    let prediction = shard::predict(&ts, &dense, &sp, &opts);
    let scaling = shard::scaling(&ts, &dense, &opts).map_err(|e| planner_err(which, ranks, e))?;
    Ok(ShardReport {
        plan: pg.name.to_string(),
        prediction,
        scaling,
        options: opts,
        rates: settings.rates,
        memory,
    })
}

impl std::fmt::Display for ShardReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let o = &self.options;
        writeln!(
            f,
            "plan `{}`: network {:.3} µs, {:.3} GB/s; machine {:.2} GFLOP/s, {:.3} GB/s per rank \
             ({}); {} of memory per rank ({} of it for the rest of the rank, the rest for \
             tables)",
            self.plan,
            o.network.latency_us,
            o.network.gbps,
            o.machine.gflops,
            o.machine.mem_gbps,
            self.rates,
            shard::human(o.mem_per_rank),
            shard::human(o.reserved_per_rank),
        )?;
        write!(f, "{}", self.prediction)?;
        writeln!(
            f,
            "\nmemory per rank (MiB, local batch {}):",
            self.memory.first().map_or(0, |a| a.local_batch)
        )?;
        write!(f, "{}", shard::memory_table(&self.memory, o.mem_per_rank))?;
        writeln!(
            f,
            "\npredicted scaling (strong: global batch {}; weak: {} samples per rank):",
            o.global_batch,
            (o.global_batch / o.ranks.max(1)).max(1)
        )?;
        write!(f, "{}", shard::scaling_table(&self.scaling))
    }
}
