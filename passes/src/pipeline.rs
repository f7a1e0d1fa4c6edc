//! The pass pipeline: the order of the passes in one place, and the driver.
//!
//! `PIPELINE` is the one table of the passes: each pass's id, when it runs and
//! how it is made; [`PASSES`] lists the ids in that fixed order: `canon` (the DLRM ops of an
//! imported model's generic ops, when [`PipelineOptions::canon`] is set),
//! `autodiff` (training only), `contract-cross` (DCN-v2's cross layers as blocked
//! GEMMs), `save-activations` (training only: forward intermediates kept for
//! module ops' gradients, where `contract-cross` did not run), `fuse` (the e-graph), `fuse-dgrad-mask` (the
//! rewrite extraction cannot choose), `layout` (blocked weights), `precision`
//! (bf16 / mixed only), `fuse-cross-epilogue` (the cross layers' elementwise steps
//! in their GEMMs' epilogues, once the dtypes are final), `dce`; `contract-cross`,
//! `fuse`, `fuse-dgrad-mask`, `layout`, `precision` and `fuse-cross-epilogue`
//! run only when [`PipelineOptions::optimize`] is set. Passes that change
//! parameters (layout, dtype, Split-SGD low halves) transform the parameter tensors
//! given to [`compile_params`]; [`compile`] transforms only the graph.
//! [`run_passes`] runs an explicit list of passes (the `dlrmc opt` golden-test
//! tool).
//!
//! [`compile`] verifies its input, runs the passes, verifies after each one (an
//! invalid result is an error naming the pass), calls an observer after the input
//! and after each pass (the hook behind `--dump-ir`), and logs per-pass wall time,
//! node counts and the statistics each pass returns ([`crate::Ran`]: the e-graph's
//! size, iterations and stop reason, named counts) in a [`PassLog`] that can be
//! stored in a plan manifest.
//!
//! For N ranks, [`partition`] (run later, per rank count) splits the compiled graph
//! with the `partition` pass ([`crate::partition::rank_graphs`]), then runs the
//! per-rank passes [`RANK_PASSES`] — `bucket` (gradient all-reduce buckets),
//! `schedule` (collectives early, updates late) — on every rank's graph, verifying
//! each result and calling an observer after each stage, as [`compile`] does.
//!
//! IR dump stages are `input`, the pass ids, `partition` and the per-rank pass ids;
//! [`DumpSpec::parse`] validates a `--dump-ir` value against them.

use crate::autodiff::{self, Autodiff};
use crate::bucket::{self, Bucket};
use crate::cross::{self, ContractCross};
use crate::cross_epilogue::{self, FuseCrossEpilogue};
use crate::dce::{self, Dce};
use crate::egraph::canon::{self, Canon};
use crate::egraph::{self, EgraphStats, Fuse, FuseOptions, Limits};
use crate::interaction_layout::{self, FuseInteractionLayout};
use crate::layout::{self, Layout};
use crate::mask::{self, FuseDgradMask};
use crate::partition::Partitioned;
use crate::precision::{self, PrecisionPass};
use crate::saved::{self, SaveActivations};
use crate::schedule::{self, Schedule};
use crate::shard::ShardPlan;
use crate::{Pass, PassError, Result, TrainConfig};
use dlrm_ir::{Graph, verify};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::time::Instant;

/// When a pass of the pipeline runs, by the [`PipelineOptions`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum When {
    /// Always.
    Always,
    /// With [`PipelineOptions::canon`] (an imported model's generic ops).
    Canon,
    /// For the training step ([`PipelineOptions::train`]).
    Train,
    /// With [`PipelineOptions::optimize`].
    Optimize,
    /// Optimising to a precision other than fp32.
    LowPrecision,
}

impl When {
    fn applies(self, o: &PipelineOptions) -> bool {
        match self {
            When::Always => true,
            When::Canon => o.canon,
            When::Train => o.train.is_some(),
            When::Optimize => o.optimize,
            When::LowPrecision => o.optimize && o.precision != Precision::Fp32,
        }
    }
}

/// One pass of the pipeline: its id (the `--dump-ir` stage), when it runs, and
/// how it is made for the options (`None`: it cannot run with them).
struct Stage {
    id: &'static str,
    when: When,
    make: fn(&PipelineOptions) -> Option<Box<dyn Pass>>,
}

/// The pipeline, in order: the one place a pass is listed.
const PIPELINE: [Stage; 11] = [
    Stage {
        id: canon::ID,
        when: When::Canon,
        make: |o| Some(Box::new(Canon { limits: o.limits })),
    },
    Stage {
        id: autodiff::ID,
        when: When::Train,
        make: |o| {
            o.train
                .map(|cfg| Box::new(Autodiff { cfg }) as Box<dyn Pass>)
        },
    },
    Stage {
        id: cross::ID,
        when: When::Optimize,
        make: |o| Some(Box::new(ContractCross { block: o.block })),
    },
    Stage {
        id: saved::ID,
        when: When::Train,
        make: |_| Some(Box::new(SaveActivations)),
    },
    Stage {
        id: egraph::ID,
        when: When::Optimize,
        make: |o| {
            Some(Box::new(Fuse {
                opts: o.fuse_options(),
            }))
        },
    },
    Stage {
        id: mask::ID,
        when: When::Optimize,
        make: |_| Some(Box::new(FuseDgradMask)),
    },
    Stage {
        id: layout::ID,
        when: When::Optimize,
        make: |_| Some(Box::new(Layout)),
    },
    Stage {
        id: precision::ID,
        when: When::LowPrecision,
        make: |o| {
            Some(Box::new(PrecisionPass {
                precision: o.precision,
            }))
        },
    },
    Stage {
        id: cross_epilogue::ID,
        when: When::Optimize,
        make: |_| Some(Box::new(FuseCrossEpilogue)),
    },
    Stage {
        id: interaction_layout::ID,
        when: When::Optimize,
        make: |_| Some(Box::new(FuseInteractionLayout)),
    },
    Stage {
        id: dce::ID,
        when: When::Always,
        make: |_| Some(Box::new(Dce)),
    },
];

/// A per-rank pass: its id and how it is made for a bucket size.
struct RankStage {
    id: &'static str,
    make: fn(u64) -> Box<dyn Pass>,
}

/// The per-rank passes [`partition`] runs on each rank's graph after the
/// `partition` pass, in order.
const RANK_PIPELINE: [RankStage; 2] = [
    RankStage {
        id: bucket::ID,
        make: |bytes| Box::new(Bucket { bytes }),
    },
    RankStage {
        id: schedule::ID,
        make: |_| Box::new(Schedule),
    },
];

/// The ids of a table's stages, in order.
macro_rules! ids_of {
    ($table:expr, $n:expr) => {{
        let mut out = [""; $n];
        let mut i = 0;
        while i < $n {
            out[i] = $table[i].id;
            i += 1;
        }
        out
    }};
}

/// Every pass id, in the order the pipeline runs them (`PIPELINE`'s).
pub const PASSES: [&str; PIPELINE.len()] = ids_of!(PIPELINE, PIPELINE.len());

/// Every per-rank pass id, in the order [`partition`] runs them on each rank's
/// graph after the `partition` pass.
pub const RANK_PASSES: [&str; RANK_PIPELINE.len()] = ids_of!(RANK_PIPELINE, RANK_PIPELINE.len());

pub use crate::pass::Params;

pub use crate::precision::Precision;

/// The dump stage of the pipeline's input.
pub const INPUT: &str = "input";

/// The dump stage of the per-rank graphs right after partitioning (see [`partition`]).
pub const PARTITION: &str = "partition";

/// What the pipeline builds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PipelineOptions {
    /// `Some`: the training step (autodiff with this loss and learning rate);
    /// `None`: the inference graph.
    pub train: Option<TrainConfig>,
    /// Run the optimisations (`fuse`, `layout`, `precision`).
    #[serde(default)]
    pub optimize: bool,
    /// Storage precision (`precision` pass; needs `optimize`).
    #[serde(default)]
    pub precision: Precision,
    /// Force one block size for the blocked GEMMs (capped at each dimension);
    /// `None`: the cost model chooses per dimension.
    #[serde(default)]
    pub block: Option<usize>,
    /// Fuse the embedding backward and its sparse SGD into `embedding_update`.
    #[serde(default)]
    pub fuse_embedding: bool,
    /// E-graph runner limits.
    #[serde(default)]
    pub limits: Limits,
    /// Run `canon` first (set it for imported models with generic ops, see
    /// [`canon::applies`]).
    #[serde(default)]
    pub canon: bool,
}

impl PipelineOptions {
    /// The optimised pipeline (fp32, embedding update fused) for training (`Some`)
    /// or inference.
    pub fn optimized(train: Option<TrainConfig>) -> Self {
        PipelineOptions {
            train,
            optimize: true,
            fuse_embedding: true,
            ..Default::default()
        }
    }

    /// The e-graph options these pipeline options imply.
    pub fn fuse_options(&self) -> FuseOptions {
        let mut f = FuseOptions {
            limits: self.limits,
            ..Default::default()
        };
        f.rules.block = self.block;
        f.rules.fuse_embedding = self.fuse_embedding;
        f
    }
}

/// The pass ids [`compile`] runs for `opts`, in order.
pub fn pass_ids_for(opts: &PipelineOptions) -> Vec<&'static str> {
    PIPELINE
        .iter()
        .filter(|s| s.when.applies(opts))
        .map(|s| s.id)
        .collect()
}

/// Instantiates pass `id` for `opts` (`None` if the id is unknown or the pass does
/// not apply, e.g. autodiff without a training configuration).
fn make_pass(id: &str, opts: &PipelineOptions) -> Option<Box<dyn Pass>> {
    (PIPELINE.iter().find(|s| s.id == id)?.make)(opts)
}

/// One pass's entry in the log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PassRecord {
    /// The pass id.
    pub id: String,
    /// Wall time of the pass (verification excluded), in milliseconds.
    pub wall_ms: f64,
    /// Node count before the pass.
    pub nodes_before: usize,
    /// Node count after the pass.
    pub nodes_after: usize,
    /// The e-graph's report (passes `fuse` and `canon`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egraph: Option<EgraphStats>,
    /// The pass's named counts (see [`crate::PassStats::counts`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counts: BTreeMap<String, usize>,
}

/// What the pipeline did, pass by pass.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PassLog {
    /// One record per pass run, in order.
    pub passes: Vec<PassRecord>,
}

impl fmt::Display for PassLog {
    /// A table: pass, wall time, node counts before and after.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<12} {:>10} {:>8} {:>8}",
            "pass", "ms", "before", "after"
        )?;
        for r in &self.passes {
            writeln!(
                f,
                "{:<12} {:>10.3} {:>8} {:>8}",
                r.id, r.wall_ms, r.nodes_before, r.nodes_after
            )?;
            if let Some(e) = &r.egraph {
                let rules: Vec<String> = e
                    .rules_applied
                    .iter()
                    .map(|(k, n)| format!("{k}:{n}"))
                    .collect();
                writeln!(
                    f,
                    "  e-graph: {} e-nodes, {} e-classes, {} iterations, stop: {}, cost {:.0} -> {:.0}",
                    e.nodes, e.classes, e.iterations, e.stop_reason, e.cost_before, e.cost_after
                )?;
                writeln!(f, "  rules: {}", rules.join(" "))?;
            }
            if !r.counts.is_empty() {
                let counts: Vec<String> =
                    r.counts.iter().map(|(k, n)| format!("{k}: {n}")).collect();
                writeln!(f, "  {}", counts.join(", "))?;
            }
        }
        Ok(())
    }
}

/// A compiled graph with its parameters and the pass log.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The final graph.
    pub graph: Graph,
    /// The parameters, transformed by the passes (same order as the graph's).
    pub params: Params,
    /// What each pass did.
    pub log: PassLog,
}

/// Runs the pipeline on `g` (see the module docs). `on_pass` sees the input graph
/// (stage `input`) and the graph after each pass (stage = pass id). Parameter types
/// may change (blocked, bf16) but no tensor is transformed: use [`compile_params`]
/// to run the result.
pub fn compile(
    g: Graph,
    opts: &PipelineOptions,
    on_pass: &mut dyn FnMut(&str, &Graph),
) -> Result<(Graph, PassLog)> {
    let ids = pass_ids_for(opts);
    let (g, log) = run_list(g, &ids, opts, None, on_pass)?;
    Ok((g, log))
}

/// [`compile`], transforming the parameter tensors alongside the graph.
pub fn compile_params(
    g: Graph,
    params: Params,
    opts: &PipelineOptions,
    on_pass: &mut dyn FnMut(&str, &Graph),
) -> Result<Compiled> {
    let ids = pass_ids_for(opts);
    let mut params = params;
    let (graph, log) = run_list(g, &ids, opts, Some(&mut params), on_pass)?;
    // Keep the graph's parameter order.
    let mut ordered = Vec::with_capacity(params.len());
    for (name, _) in graph.param_types() {
        if let Some(i) = params.iter().position(|(n, _)| n == name) {
            ordered.push(params.swap_remove(i));
        }
    }
    Ok(Compiled {
        graph,
        params: ordered,
        log,
    })
}

/// Runs the passes `ids` in the given order on `g` (the `dlrmc opt FILE.ir --passes
/// a,b,c` tool). Unknown ids are an error listing the valid ones; `autodiff` needs
/// `opts.train`.
pub fn run_passes(g: &Graph, ids: &[&str], opts: &PipelineOptions) -> Result<(Graph, PassLog)> {
    run_passes_with(g, ids, opts, None)
}

/// [`run_passes`] with parameter tensors (transformed alongside the graph; `canon`
/// reads its constants from them).
pub fn run_passes_with(
    g: &Graph,
    ids: &[&str],
    opts: &PipelineOptions,
    params: Option<&mut Params>,
) -> Result<(Graph, PassLog)> {
    let mut valid = Vec::new();
    for id in ids {
        match PASSES.iter().find(|&&p| p == *id) {
            Some(&p) => valid.push(p),
            None => {
                return Err(PassError::UnknownStage {
                    got: id.to_string(),
                    valid: PASSES.iter().map(|s| s.to_string()).collect(),
                });
            }
        }
    }
    if valid.contains(&autodiff::ID) && opts.train.is_none() {
        return Err(PassError::Arg {
            pass: autodiff::ID.into(),
            reason: "autodiff needs a training configuration".into(),
        });
    }
    run_list(g.clone(), &valid, opts, params, &mut |_, _| {})
}

fn run_list(
    g: Graph,
    ids: &[&'static str],
    opts: &PipelineOptions,
    mut params: Option<&mut Params>,
    on_pass: &mut dyn FnMut(&str, &Graph),
) -> Result<(Graph, PassLog)> {
    verify(&g).map_err(|source| PassError::Verify {
        after: INPUT.to_string(),
        source,
    })?;
    on_pass(INPUT, &g);
    let mut g = g;
    let mut log = PassLog::default();
    for &id in ids {
        let Some(pass) = make_pass(id, opts) else {
            continue;
        };
        let (out, record) = run_one(pass.as_ref(), g, params.as_deref_mut(), id)?;
        g = out;
        on_pass(id, &g);
        log.passes.push(record);
    }
    Ok((g, log))
}

/// Runs `pass` on `g`, times it and verifies the result (`stage` names it in the
/// error).
fn run_one(
    pass: &dyn Pass,
    g: Graph,
    params: Option<&mut Params>,
    stage: &str,
) -> Result<(Graph, PassRecord)> {
    let nodes_before = g.nodes().len();
    let start = Instant::now();
    let ran = pass.run(g, params)?;
    let wall_ms = start.elapsed().as_secs_f64() * 1e3;
    verify(&ran.graph).map_err(|source| PassError::Verify {
        after: stage.to_string(),
        source,
    })?;
    let record = PassRecord {
        id: pass.id().to_string(),
        wall_ms,
        nodes_before,
        nodes_after: ran.graph.nodes().len(),
        egraph: ran.stats.egraph,
        counts: ran.stats.counts,
    };
    Ok((ran.graph, record))
}

/// Partitions `g` for the ranks of `plan` (the `partition` pass,
/// [`crate::partition::rank_graphs`]), then runs the [`RANK_PASSES`] on every rank's
/// graph, `bucket` with buckets of `bucket_bytes` (0: one `all_reduce` per
/// gradient). Every result is verified (an error names the pass and the rank);
/// `on_pass(stage, rank, graph)` sees each rank's graph after `partition`, then
/// after each per-rank pass (all ranks of one pass before the next pass).
pub fn partition(
    g: &Graph,
    plan: &ShardPlan,
    bucket_bytes: u64,
    on_pass: &mut dyn FnMut(&str, usize, &Graph),
) -> Result<Partitioned> {
    let mut p = crate::partition::rank_graphs(g, plan)?;
    for (r, rg) in p.graphs.iter().enumerate() {
        on_pass(PARTITION, r, rg);
    }
    for stage in &RANK_PIPELINE {
        let (id, pass) = (stage.id, (stage.make)(bucket_bytes));
        let graphs = std::mem::take(&mut p.graphs);
        for (r, rg) in graphs.into_iter().enumerate() {
            let stage = format!("{id} (rank {r})");
            let (out, _) = run_one(pass.as_ref(), rg, None, &stage)?;
            on_pass(id, r, &out);
            p.graphs.push(out);
        }
    }
    Ok(p)
}

/// Every valid IR dump stage: `input`, the pass ids in order, `partition`, the
/// per-rank pass ids in order.
pub fn dump_stages() -> Vec<&'static str> {
    let mut v = vec![INPUT];
    v.extend_from_slice(&PASSES);
    v.push(PARTITION);
    v.extend_from_slice(&RANK_PASSES);
    v
}

/// Which stages a `--dump-ir` option asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DumpSpec {
    /// Every stage.
    All,
    /// The listed stages.
    Only(Vec<&'static str>),
}

impl DumpSpec {
    /// Parses `all` or a comma-separated list of stages (see [`dump_stages`]);
    /// anything else is an error listing the valid stages.
    pub fn parse(spec: &str) -> Result<DumpSpec> {
        let spec = spec.trim();
        if spec == "all" {
            return Ok(DumpSpec::All);
        }
        let stages = dump_stages();
        let mut out = Vec::new();
        for part in spec.split(',').map(str::trim) {
            match stages.iter().find(|&&s| s == part) {
                Some(&s) => out.push(s),
                None => {
                    let mut valid = vec!["all".to_string()];
                    valid.extend(stages.iter().map(|s| s.to_string()));
                    return Err(PassError::UnknownStage {
                        got: part.to_string(),
                        valid,
                    });
                }
            }
        }
        Ok(DumpSpec::Only(out))
    }

    /// True if stage `id` is to be dumped.
    pub fn wants(&self, id: &str) -> bool {
        match self {
            DumpSpec::All => true,
            DumpSpec::Only(ids) => ids.contains(&id),
        }
    }
}
