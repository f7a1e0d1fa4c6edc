//! `dlrmc compile`: a model through the pass pipeline into a plan.
//!
//! The inference graph is the forward graph through the inference pipeline; the
//! training graph (unless `infer_only`) is the same forward graph through the
//! training pipeline (autodiff adds the loss, backward and optimizer). Both pass
//! logs are stored in the plan's manifest. The observer sees every stage of both
//! pipelines, labelled by a [`Stage`], which is how `--dump-ir` prints the IR after
//! any pass; partitioning for N ranks happens at run time, and [`partition_stages`]
//! shows it at compile time for a dump.

use crate::error::{Error, Result};
use crate::model::Model;
use dlrm_ir::Graph;
use dlrm_passes::pipeline::{self, PipelineOptions};
use dlrm_passes::{LossKind, TrainConfig};
use dlrm_runtime::plan::Plan;
use std::fmt;

/// Which graph a dumped stage belongs to and after which pass it was taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stage {
    /// `infer` or `train`.
    pub graph: &'static str,
    /// A pass id, [`pipeline::INPUT`] or [`pipeline::PARTITION`].
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
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CompileOptions {
    /// Build only the inference graph (the plan cannot train).
    pub infer_only: bool,
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
pub fn compile(
    model: Model,
    opts: &CompileOptions,
    on_stage: &mut dyn FnMut(&Stage, &Graph),
) -> Result<Plan> {
    let Model {
        graph,
        params,
        training,
        ..
    } = model;
    let name = graph.name.clone();
    let (infer, infer_log) =
        pipeline::compile(graph.clone(), &PipelineOptions::default(), &mut |p, g| {
            on_stage(&Stage::after("infer", p), g)
        })
        .map_err(|source| Error::Compile {
            graph: "infer",
            source: Box::new(source),
        })?;

    let mut logs = serde_json::Map::new();
    logs.insert("infer".into(), log_json(&infer_log));
    let train = if opts.infer_only {
        None
    } else {
        let cfg = TrainConfig {
            loss: loss_kind(&training.loss)?,
            lr: training.learning_rate,
        };
        let (train, train_log) =
            pipeline::compile(graph, &PipelineOptions { train: Some(cfg) }, &mut |p, g| {
                on_stage(&Stage::after("train", p), g)
            })
            .map_err(|source| Error::Compile {
                graph: "train",
                source: Box::new(source),
            })?;
        logs.insert("train".into(), log_json(&train_log));
        Some(train)
    };
    Ok(Plan {
        name,
        infer,
        train,
        params,
        training,
        precision: "fp32".to_string(),
        pass_log: serde_json::Value::Object(logs),
    })
}

/// Partitions the plan's graphs for `ranks` ranks and calls `on_stage` with each
/// rank's graph (the `partition` dump stage).
pub fn partition_stages(
    plan: &Plan,
    ranks: usize,
    on_stage: &mut dyn FnMut(&Stage, &Graph),
) -> Result<()> {
    let graphs = [("infer", Some(&plan.infer)), ("train", plan.train.as_ref())];
    for (which, g) in graphs {
        let Some(g) = g else { continue };
        let parts = dlrm_passes::partition(g, ranks).map_err(|source| Error::Partition {
            graph: which,
            ranks,
            source: Box::new(source),
        })?;
        for (r, pg) in parts.graphs.iter().enumerate() {
            let stage = Stage {
                graph: which,
                pass: pipeline::PARTITION.to_string(),
                rank: Some((r, ranks)),
            };
            on_stage(&stage, pg);
        }
    }
    Ok(())
}
