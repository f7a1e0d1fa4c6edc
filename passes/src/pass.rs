//! The [`Pass`] trait: one graph-to-graph transformation with a stable id, and
//! what a run of it returns ([`Ran`]: the graph and the pass's statistics).
//!
//! A pass receives a verified graph and returns a new graph; the pipeline verifies
//! the result and reports failures with the pass id, and stores the statistics in
//! the pass's [`crate::PassRecord`]. Passes are pure: running one twice on equal
//! graphs gives equal graphs.

use crate::Result;
use crate::egraph::EgraphStats;
use dlrm_ir::{Graph, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Parameters with their values, in the graph's parameter order: what a pass
/// that changes parameters (layout, dtype, Split-SGD low halves) transforms
/// alongside the graph.
pub type Params = Vec<(String, Tensor)>;

/// A graph transformation.
pub trait Pass {
    /// The pass id, as listed in [`crate::pipeline::PASSES`] or
    /// [`crate::pipeline::RANK_PASSES`] and accepted by `--dump-ir`.
    fn id(&self) -> &'static str;
    /// Transforms the graph and, when given, the parameter tensors (for passes that
    /// change a parameter's layout or dtype, or add parameters; the others leave
    /// them alone).
    fn run(&self, g: Graph, params: Option<&mut Params>) -> Result<Ran>;
}

/// What a pass reports beyond its graph (all empty for most passes).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PassStats {
    /// The e-graph's report (passes `fuse` and `canon`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egraph: Option<EgraphStats>,
    /// Named counts of what the pass did (e.g. `fuse-dgrad-mask`'s `masked`: the
    /// `brgemm_dgrad`s that took the mask).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counts: BTreeMap<String, usize>,
}

/// The result of [`Pass::run`].
#[derive(Clone, Debug)]
pub struct Ran {
    /// The transformed graph.
    pub graph: Graph,
    /// What the pass reports for the pass log.
    pub stats: PassStats,
}

impl Ran {
    /// `graph` with one named count.
    pub fn counted(graph: Graph, name: &str, n: usize) -> Ran {
        let mut stats = PassStats::default();
        stats.counts.insert(name.to_string(), n);
        Ran { graph, stats }
    }
}

impl From<Graph> for Ran {
    /// A graph without statistics.
    fn from(graph: Graph) -> Ran {
        Ran {
            graph,
            stats: PassStats::default(),
        }
    }
}
