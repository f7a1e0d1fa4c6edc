//! What a plan (or a checkpoint) holds: the data of `dlrmc inspect`, which the
//! binary prints as text (`dlrmc::inspect`) or JSON (this module's [`Serialize`]).
//!
//! The top-level `ops`, `params`, `param_bytes` and `flops_per_sample` describe the
//! graph the plan runs by default: the training graph if the plan has one, else the
//! inference graph. `graphs` gives the statistics of each graph separately, and
//! `pass_log` is the compile's pass log from the manifest, `inputs` the input
//! contract: each graph input's role and, for a model whose bags come in another
//! layout, the model's own inputs and where each graph input comes from.

use dlrm_ir::contract::{Layout, Role, roles};
use dlrm_passes::GraphStats;
use dlrm_runtime::checkpoint::Checkpoint;
use dlrm_runtime::plan::{Plan, Training};
use serde::Serialize;
use std::collections::BTreeMap;

/// The summary of a plan.
#[derive(Clone, Debug, Serialize)]
pub struct Inspection {
    /// The plan's name.
    pub name: String,
    /// `train` if the plan can train, else `infer`: the graph the top-level
    /// statistics describe.
    pub default_graph: &'static str,
    /// Storage precision policy.
    pub precision: String,
    /// Training setup recorded in the plan.
    pub training: Training,
    /// Statistics of the default graph.
    #[serde(flatten)]
    pub stats: GraphStats,
    /// Statistics per graph (`infer`, `train`).
    pub graphs: BTreeMap<&'static str, GraphStats>,
    /// The compile's pass log.
    pub pass_log: serde_json::Value,
    /// The input contract: the model's own inputs and the graph's.
    pub inputs: InputsSummary,
    /// For a checkpoint: where its run stands and how it is stored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointSummary>,
}

/// The plan's input contract as `dlrmc inspect` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct InputsSummary {
    /// The bag layout the model takes.
    pub layout: Layout,
    /// The model's own inputs (name, type) when they differ from the graph's.
    pub model_inputs: Vec<(String, String)>,
    /// Each input of the default graph: name, type, role, and where it comes from
    /// (`None`: it is a model input itself).
    pub graph_inputs: Vec<GraphInput>,
}

/// One input of a compiled graph.
#[derive(Clone, Debug, Serialize)]
pub struct GraphInput {
    /// Its name.
    pub name: String,
    /// Its type.
    pub ty: String,
    /// What it is for.
    pub role: Role,
    /// How it is computed from the model's inputs, if it is not one of them.
    pub from: Option<String>,
}

impl InputsSummary {
    fn of(plan: &Plan) -> InputsSummary {
        let g = plan.train.as_ref().unwrap_or(&plan.infer);
        let c = &plan.contract;
        let graph_inputs = roles(g)
            .into_iter()
            .zip(g.inputs())
            .map(|((name, role), &v)| GraphInput {
                from: c
                    .canonical
                    .iter()
                    .find(|x| x.name == name)
                    .map(|x| x.source.to_string()),
                ty: g.ty(v).to_string(),
                name,
                role,
            })
            .collect();
        InputsSummary {
            layout: c.layout,
            model_inputs: c
                .model_inputs
                .iter()
                .filter(|_| !c.is_identity())
                .map(|m| (m.name.clone(), m.ty.clone()))
                .collect(),
            graph_inputs,
        }
    }
}

/// What `dlrmc inspect CKPT` adds for a checkpoint.
#[derive(Clone, Debug, Serialize)]
pub struct CheckpointSummary {
    /// The checkpoint directory.
    pub path: String,
    /// Training steps done.
    pub step: u64,
    /// The last step of the run that wrote it.
    pub last_step: u64,
    /// Data seed.
    pub seed: u64,
    /// Global batch.
    pub global_batch: usize,
    /// Ranks of the run that wrote it.
    pub ranks: usize,
    /// The data position.
    pub data: dlrm_runtime::checkpoint::DataPosition,
    /// The learning-rate schedule recorded (`None`: the compiled rates).
    pub lr_schedule: Option<dlrm_runtime::lr_schedule::LrSchedule>,
    /// The plan's identity (sha256 of its graphs).
    pub plan_sha256: String,
    /// Part files and their bytes.
    pub files: Vec<(String, u64)>,
    /// Parameters stored and their pieces.
    pub tensors: usize,
    /// Pieces in all.
    pub pieces: usize,
}

impl Inspection {
    /// Inspects `plan`.
    pub fn of(plan: &Plan) -> Inspection {
        let mut graphs = BTreeMap::new();
        graphs.insert("infer", GraphStats::of(&plan.infer));
        if let Some(t) = &plan.train {
            graphs.insert("train", GraphStats::of(t));
        }
        let default_graph = if plan.train.is_some() {
            "train"
        } else {
            "infer"
        };
        Inspection {
            name: plan.name.clone(),
            default_graph,
            precision: plan.precision.clone(),
            training: plan.training.clone(),
            stats: graphs[default_graph].clone(),
            graphs,
            pass_log: plan.pass_log.clone(),
            inputs: InputsSummary::of(plan),
            checkpoint: None,
        }
    }

    /// Inspects a checkpoint (`plan` is its graphs with the trained parameters).
    pub fn of_checkpoint(plan: &Plan, c: &Checkpoint) -> Inspection {
        let m = c.manifest();
        let mut i = Inspection::of(plan);
        i.checkpoint = Some(CheckpointSummary {
            path: c.dir().display().to_string(),
            step: m.step,
            last_step: m.last_step,
            seed: m.seed,
            global_batch: m.global_batch,
            ranks: m.ranks,
            data: m.data.clone(),
            lr_schedule: m.lr_schedule,
            plan_sha256: m.plan.sha256.clone(),
            files: m.files.iter().map(|f| (f.file.clone(), f.bytes)).collect(),
            tensors: m.tensors.len(),
            pieces: m.tensors.iter().map(|t| t.pieces.len()).sum(),
        });
        i
    }
}
