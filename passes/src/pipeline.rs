//! The pass pipeline: the order of the passes in one place, and the driver.
//!
//! [`PASSES`] lists every pass id in its fixed order; the inference pipeline skips
//! `autodiff`. [`compile`] verifies its input, runs the passes, verifies after each
//! one (an invalid result is an error naming the pass), calls an observer after the
//! input and after each pass (the hook behind `--dump-ir`), and logs per-pass wall
//! time and node counts in a [`PassLog`] that can be stored in a plan manifest.
//!
//! IR dump stages are `input`, the pass ids and `partition` (run later, per rank
//! count, by [`crate::partition()`]); [`DumpSpec::parse`] validates a `--dump-ir`
//! value against them.

use crate::autodiff::{self, Autodiff};
use crate::dce::{self, Dce};
use crate::{Pass, PassError, Result, TrainConfig};
use dlrm_ir::{Graph, verify};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Instant;

/// Every pass id, in the order the pipeline runs them.
pub const PASSES: &[&str] = &[autodiff::ID, dce::ID];

/// The dump stage of the pipeline's input.
pub const INPUT: &str = "input";

/// The dump stage of the per-rank graphs (see [`crate::partition()`]).
pub const PARTITION: &str = "partition";

/// What the pipeline builds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PipelineOptions {
    /// `Some`: the training step (autodiff with this loss and learning rate);
    /// `None`: the inference graph.
    pub train: Option<TrainConfig>,
}

/// The pass ids [`compile`] runs for `opts`, in order.
pub fn pass_ids_for(opts: &PipelineOptions) -> Vec<&'static str> {
    PASSES
        .iter()
        .copied()
        .filter(|&id| id != autodiff::ID || opts.train.is_some())
        .collect()
}

/// Instantiates pass `id` for `opts` (`None` if the id is unknown or the pass does
/// not apply, e.g. autodiff without a training configuration).
fn make_pass(id: &str, opts: &PipelineOptions) -> Option<Box<dyn Pass>> {
    match id {
        autodiff::ID => opts
            .train
            .map(|cfg| Box::new(Autodiff { cfg }) as Box<dyn Pass>),
        dce::ID => Some(Box::new(Dce)),
        _ => None,
    }
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
        }
        Ok(())
    }
}

/// Runs the pipeline on `g` (see the module docs). `on_pass` sees the input graph
/// (stage `input`) and the graph after each pass (stage = pass id).
pub fn compile(
    g: Graph,
    opts: &PipelineOptions,
    on_pass: &mut dyn FnMut(&str, &Graph),
) -> Result<(Graph, PassLog)> {
    verify(&g).map_err(|source| PassError::Verify {
        after: INPUT.to_string(),
        source,
    })?;
    on_pass(INPUT, &g);
    let mut g = g;
    let mut log = PassLog::default();
    for id in pass_ids_for(opts) {
        let Some(pass) = make_pass(id, opts) else {
            continue;
        };
        let nodes_before = g.nodes().len();
        let start = Instant::now();
        g = pass.run(g)?;
        let wall_ms = start.elapsed().as_secs_f64() * 1e3;
        verify(&g).map_err(|source| PassError::Verify {
            after: id.to_string(),
            source,
        })?;
        on_pass(id, &g);
        log.passes.push(PassRecord {
            id: id.to_string(),
            wall_ms,
            nodes_before,
            nodes_after: g.nodes().len(),
        });
    }
    Ok((g, log))
}

/// Every valid IR dump stage: `input`, the pass ids in order, `partition`.
pub fn dump_stages() -> Vec<&'static str> {
    let mut v = vec![INPUT];
    v.extend_from_slice(PASSES);
    v.push(PARTITION);
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
