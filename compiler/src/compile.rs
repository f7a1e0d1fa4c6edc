//! `dlrmc compile`: a model through the pass pipeline into a plan.
//!
//! The inference graph is the forward graph through the inference pipeline; the
//! training graph (unless `infer_only`) is the same forward graph through the
//! training pipeline (autodiff adds the loss, backward and optimizer). Both pass
//! logs are stored in the plan's manifest. The observer sees every stage of both
//! pipelines, labelled by a [`Stage`], which is how `--dump-ir` prints the IR after
//! any pass; partitioning for N ranks and the per-rank passes happen at run time,
//! and [`partition_stages`] shows them at compile time for a dump.
//!
//! A model with generic ops (an imported ONNX model) runs the `canon` pass first in
//! both pipelines, so that autodiff sees DLRM ops; where generic ops without a
//! gradient remain, compiling the training graph fails naming the node and op
//! (`--infer-only` still compiles the inference plan).

use crate::error::{Error, Result};
use crate::model::Model;
use dlrm_ir::{Def, Graph, Op, ParamValue};
use dlrm_passes::pipeline::{self, PipelineOptions, Precision};
use dlrm_passes::{LossKind, TrainConfig};
use dlrm_runtime::launch::shard::{ShardSettings, partition_plan_observed};
use dlrm_runtime::plan::Plan;
use std::fmt;

/// Which graph a dumped stage belongs to and after which pass it was taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stage {
    /// `infer` or `train`.
    pub graph: &'static str,
    /// A pass id (per-rank passes too), [`pipeline::INPUT`] or
    /// [`pipeline::PARTITION`].
    pub pass: String,
    /// For partition stages: `(rank, ranks)`.
    pub rank: Option<(usize, usize)>,
}

impl Stage {
    /// The stage after pass `pass` of graph `graph`.
    pub fn after(graph: &'static str, pass: &str) -> Stage {
        Stage {
            graph,
            pass: pass.to_string(),
            rank: None,
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.rank {
            Some((r, n)) => write!(f, "{}: after {} (rank {r} of {n})", self.graph, self.pass),
            None => write!(f, "{}: after {}", self.graph, self.pass),
        }
    }
}

/// What to compile.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CompileOptions {
    /// Build only the inference graph (the plan cannot train).
    pub infer_only: bool,
    /// Run the optimising passes (e-graph fusion into blocked GEMMs, layout,
    /// precision); `false` keeps the graphs as autodiff leaves them (`-O0`).
    pub optimize: bool,
    /// Storage precision (needs `optimize` for anything but fp32).
    pub precision: Precision,
    /// One GEMM block size for every dimension; `None`: the cost model chooses.
    pub block: Option<usize>,
}

impl Default for CompileOptions {
    fn default() -> CompileOptions {
        CompileOptions {
            infer_only: false,
            optimize: true,
            precision: Precision::Fp32,
            block: None,
        }
    }
}

impl CompileOptions {
    fn pipeline(&self, train: Option<TrainConfig>, canon: bool) -> PipelineOptions {
        let base = if self.optimize {
            PipelineOptions::optimized(train)
        } else {
            PipelineOptions {
                train,
                ..PipelineOptions::default()
            }
        };
        PipelineOptions {
            precision: self.precision,
            block: self.block,
            canon,
            ..base
        }
    }
}

fn loss_kind(name: &str) -> Result<LossKind> {
    Ok(match name {
        "bce" => LossKind::Bce,
        "mse" => LossKind::Mse,
        other => {
            return Err(Error::Training(format!(
                "unknown loss `{other}` (expected bce or mse)"
            )));
        }
    })
}

/// A pass log as JSON (a plain data struct: serialisation cannot fail).
fn log_json(log: &pipeline::PassLog) -> serde_json::Value {
    serde_json::to_value(log).unwrap_or(serde_json::Value::Null)
}

/// Compiles `model` into a plan, calling `on_stage` after the input and after
/// every pass of each pipeline.
///
/// Both pipelines transform the parameters (blocked layouts, bf16 storage, the
/// Split-SGD low halves); the plan stores one set, so a parameter both graphs use
/// must come out of both with one layout, which is checked ([`merge_params`]).
/// Described parameters (a JSON model's tables) stay described: the passes derive
/// their bf16 parts and accumulators as descriptions
/// ([`dlrm_passes::compile_values`]), so a 100 GB model compiles without creating
/// its tables.
pub fn compile(
    model: Model,
    opts: &CompileOptions,
    on_stage: &mut dyn FnMut(&Stage, &Graph),
) -> Result<Plan> {
    if opts.precision != Precision::Fp32 && !opts.optimize {
        return Err(Error::Options(format!(
            "--precision {} needs the optimising passes (drop -O0)",
            opts.precision
        )));
    }
    let Model {
        graph,
        params,
        training,
        optimizer,
        infer_only,
        label,
        ..
    } = model;
    let name = graph.name.clone();
    // Every bag layout to per-table bag inputs, before both pipelines.
    let dlrm_passes::Canonical {
        graph,
        params,
        contract,
    } = dlrm_passes::canonical_bags(graph, params).map_err(|source| Error::Compile {
        graph: "infer",
        source: Box::new(source),
    })?;
    let canon = dlrm_passes::egraph::canon::applies(&graph);
    let infer = dlrm_passes::compile_values(
        graph.clone(),
        params.clone(),
        &opts.pipeline(None, canon),
        &mut |p, g| on_stage(&Stage::after("infer", p), g),
    )
    .map_err(|source| Error::Compile {
        graph: "infer",
        source: Box::new(source),
    })?;

    let mut logs = serde_json::Map::new();
    logs.insert("infer".into(), log_json(&infer.log));
    let (train, params) = if opts.infer_only || infer_only.is_some() {
        (None, infer.params)
    } else {
        let cfg = TrainConfig {
            loss: loss_kind(&training.loss)?,
            lr: training.learning_rate,
            optimizer,
        };
        let train = dlrm_passes::compile_values(
            graph,
            params,
            &opts.pipeline(Some(cfg), canon),
            &mut |p, g| on_stage(&Stage::after("train", p), g),
        )
        .map_err(|source| Error::Compile {
            graph: "train",
            source: Box::new(source),
        })?;
        logs.insert("train".into(), log_json(&train.log));
        let params = merge_params(train.params, infer.params)?;
        let graph = match &label {
            Some(l) => name_label(&train.graph, l)?,
            None => train.graph,
        };
        (Some(graph), params)
    };
    Ok(Plan {
        name,
        infer: infer.graph,
        train,
        params,
        training,
        precision: opts.precision.to_string(),
        pass_log: serde_json::Value::Object(logs),
        contract,
    })
}

/// A plan's graphs without its parameters ([`compile_graphs`]).
#[derive(Clone, Debug)]
pub struct PlanGraphsOwned {
    /// The model's name.
    pub name: String,
    /// The inference graph.
    pub infer: Graph,
    /// The training graph (`None` with `infer_only`).
    pub train: Option<Graph>,
    /// The description's batch size.
    pub batch_size: usize,
    /// The storage precision.
    pub precision: String,
}

/// Compiles the graphs of a JSON model description as [`compile`] would, without
/// creating any parameter (the pipeline on graphs alone): for planning a model too
/// large to materialise here (`dlrmc plan-shards model.json`).
pub fn compile_graphs(path: &std::path::Path, opts: &CompileOptions) -> Result<PlanGraphsOwned> {
    if opts.precision != Precision::Fp32 && !opts.optimize {
        return Err(Error::Options(format!(
            "--precision {} needs the optimising passes (drop -O0)",
            opts.precision
        )));
    }
    let spec = dlrm_json::ModelSpec::load(path)?;
    let graph = spec.graph()?;
    let t = spec.training();
    let canon = dlrm_passes::egraph::canon::applies(&graph);
    let none = &mut |_: &str, _: &Graph| {};
    let (infer, _) =
        pipeline::compile(graph.clone(), &opts.pipeline(None, canon), none).map_err(|source| {
            Error::Compile {
                graph: "infer",
                source: Box::new(source),
            }
        })?;
    let train = if opts.infer_only {
        None
    } else {
        let cfg = TrainConfig {
            loss: match t.loss {
                dlrm_json::Loss::Bce => LossKind::Bce,
                dlrm_json::Loss::Mse => LossKind::Mse,
            },
            lr: t.learning_rate,
            optimizer: crate::model::passes_optimizer(t.optimizer),
        };
        let (g, _) =
            pipeline::compile(graph, &opts.pipeline(Some(cfg), canon), none).map_err(|source| {
                Error::Compile {
                    graph: "train",
                    source: Box::new(source),
                }
            })?;
        Some(g)
    };
    Ok(PlanGraphsOwned {
        name: spec.name.clone(),
        infer,
        train,
        batch_size: t.batch_size,
        precision: opts.precision.to_string(),
    })
}

/// The training graph with its label input (the loss's second operand) renamed
/// to `label`.
fn name_label(g: &Graph, label: &str) -> Result<Graph> {
    let from = g
        .nodes()
        .iter()
        .filter(|n| matches!(n.op, Op::Bce { .. } | Op::BceLogits { .. } | Op::Mse { .. }))
        .filter_map(|n| n.inputs.get(1).copied())
        .find(|&y| matches!(g.value(y).def, Def::Input(_)))
        .map(|y| g.name_of(y).to_string())
        .ok_or_else(|| Error::Training("the training graph has no label input".into()))?;
    crate::model::rebuild(g, None, &|n| {
        if n == from {
            label.to_string()
        } else {
            n.to_string()
        }
    })
    .map_err(|e| Error::Training(format!("naming the label input `{label}`: {e}")))
}

/// The training graph's parameters, then any the inference graph alone uses. A
/// parameter in both must have one dtype and shape; the training graph's value
/// wins (under Split-SGD-BF16 the bf16 weight is the truncated high half of the f32
/// master, where the inference pipeline alone would round to nearest).
fn merge_params(
    train: Vec<(String, ParamValue)>,
    infer: Vec<(String, ParamValue)>,
) -> Result<Vec<(String, ParamValue)>> {
    let mut out = train;
    for (name, t) in infer {
        match out.iter().find(|(n, _)| *n == name) {
            Some((_, u)) if u.dtype() == t.dtype() && u.shape() == t.shape() => {}
            Some((_, u)) => {
                return Err(Error::Training(format!(
                    "parameter `{name}` is {:?}{:?} in the training graph but {:?}{:?} \
                     in the inference graph",
                    u.dtype(),
                    u.shape(),
                    t.dtype(),
                    t.shape()
                )));
            }
            None => out.push((name, t)),
        }
    }
    Ok(out)
}

/// Partitions the plan's graphs for `ranks` ranks, with the tables placed by the
/// sharding planner ([`partition_plan_observed`]; the plan's batch size), and calls
/// `on_stage` with each rank's graph after the `partition` pass and after each
/// per-rank pass ([`pipeline::RANK_PASSES`]: the dump stages `partition`, `bucket`,
/// `schedule`).
pub fn partition_stages(
    plan: &Plan,
    ranks: usize,
    settings: &ShardSettings,
    on_stage: &mut dyn FnMut(&Stage, &Graph),
) -> Result<()> {
    partition_plan_observed(plan, ranks, settings, &mut |graph, pass, r, g| {
        let stage = Stage {
            graph,
            pass: pass.to_string(),
            rank: Some((r, ranks)),
        };
        on_stage(&stage, g);
    })?;
    Ok(())
}
