//! The [`Pass`] trait: one graph-to-graph transformation with a stable id.
//!
//! A pass receives a verified graph and returns a new graph; the pipeline verifies
//! the result and reports failures with the pass id. Passes are pure: running one
//! twice on equal graphs gives equal graphs.

use crate::Result;
use crate::pipeline::Params;
use dlrm_ir::Graph;

/// A graph transformation.
pub trait Pass {
    /// The pass id, as listed in [`crate::pipeline::PASSES`] and accepted by `--dump-ir`.
    fn id(&self) -> &'static str;
    /// Transforms the graph.
    fn run(&self, g: Graph) -> Result<Graph>;
    /// Transforms the graph and, when given, the parameter tensors (for passes that
    /// change a parameter's layout or dtype, or add parameters). The default
    /// leaves the parameters alone.
    fn run_with(&self, g: Graph, params: Option<&mut Params>) -> Result<Graph> {
        let _ = params;
        self.run(g)
    }
}
