//! `dlrmc inspect`: what a plan holds.
//!
//! The top-level `ops`, `params`, `param_bytes` and `flops_per_sample` describe the
//! graph the plan runs by default: the training graph if the plan has one, else the
//! inference graph. `graphs` gives the statistics of each graph separately, and
//! `pass_log` is the compile's pass log from the manifest.

use dlrm_passes::GraphStats;
use dlrm_runtime::checkpoint::Checkpoint;
use dlrm_runtime::plan::{Plan, Training};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;

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
    /// For a checkpoint: where its run stands and how it is stored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointSummary>,
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
    pub lr_schedule: Option<dlrm_runtime::schedule::LrSchedule>,
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

fn human_bytes(b: usize) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.training;
        writeln!(f, "plan `{}` ({} precision)", self.name, self.precision)?;
        if let Some(c) = &self.checkpoint {
            let bytes: u64 = c.files.iter().map(|f| f.1).sum();
            writeln!(
                f,
                "checkpoint {}: after step {} of {}, seed {}, global batch {}, written by {} rank{}",
                c.path,
                c.step,
                c.last_step,
                c.seed,
                c.global_batch,
                c.ranks,
                if c.ranks == 1 { "" } else { "s" }
            )?;
            writeln!(
                f,
                "  data: {} (next data step {}), learning rate: {}",
                c.data.source,
                c.data.next_data_step,
                c.lr_schedule.map_or_else(
                    || "the compiled rates".to_string(),
                    |s| serde_json::to_string(&s).unwrap_or_default()
                )
            )?;
            writeln!(
                f,
                "  {} parameters in {} pieces, {} files, {}; plan sha256 {}",
                c.tensors,
                c.pieces,
                c.files.len(),
                human_bytes(bytes as usize),
                c.plan_sha256
            )?;
        }
        writeln!(
            f,
            "training: loss {}, optimizer {}, learning rate {}, batch {}, seed {}",
            t.loss, t.optimizer, t.learning_rate, t.batch_size, t.seed
        )?;
        for (which, s) in &self.graphs {
            let nodes: usize = s.ops.values().sum();
            writeln!(f)?;
            writeln!(
                f,
                "{which} graph: {nodes} nodes, {:.3} MFLOP per sample",
                s.flops_per_sample / 1e6
            )?;
            for (op, n) in &s.ops {
                writeln!(f, "  {op:<22} {n:>6}")?;
            }
        }
        writeln!(f)?;
        writeln!(f, "parameters ({} graph):", self.default_graph)?;
        for (dt, n) in &self.stats.params {
            let bytes = self.stats.param_bytes.get(dt).copied().unwrap_or(0);
            writeln!(f, "  {dt:<6} {n:>14} elements {:>12}", human_bytes(bytes))?;
        }
        Ok(())
    }
}
