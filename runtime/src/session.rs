//! A plan served from Rust: loaded once, then called many times.
//!
//! A [`Session`] reads a plan (or a checkpoint's trained model), creates its
//! parameters once, builds one executor for the inference graph with each node's
//! kernel resolved on the first call of a batch size, and answers
//! [`Session::infer`] calls with arrays in the model's own input names and layout
//! (the plan's [`InputContract`] computes the graph's canonical inputs from them,
//! as ONNX Runtime is fed). One rank, this process's threads.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("tiny.plan");
//! # let tiny = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/dlrm-tiny.json");
//! # let m = dlrm_json::load(tiny)?;
//! # let opts = dlrm_passes::PipelineOptions::default();
//! # let (infer, _) = dlrm_passes::compile(m.graph, &opts, &mut |_, _| {})?;
//! # let params = m.params.into_iter().map(|(n, t)| (n, dlrm_ir::ParamValue::Stored(t))).collect();
//! # let training = dlrm_runtime::Training { loss: "bce".into(), optimizer: "sgd".into(),
//! #     learning_rate: 0.1, batch_size: 4, seed: 1 };
//! # let plan = dlrm_runtime::Plan { name: "tiny".into(), infer, train: None, params, training,
//! #     precision: "fp32".into(), pass_log: serde_json::Value::Null, contract: Default::default() };
//! # dlrm_runtime::write_plan(&path, &plan)?;
//! use dlrm_ir::Tensor;
//! use dlrm_runtime::Session;
//!
//! let mut session = Session::open(&path)?; // a plan or a checkpoint directory
//! for request in 0..3 {
//!     // Random inputs of each request's batch size, in the model's own names.
//!     let inputs = session.example_inputs(1 + request, 7)?;
//!     let outputs: Vec<(String, Tensor)> = session.infer(inputs)?;
//!     assert_eq!(outputs[0].1.shape[0], 1 + request);
//! }
//! // A second session over the same parameters (one copy), e.g. for another thread.
//! let mut other = session.fork()?;
//! let inputs = session.example_inputs(2, 7)?;
//! assert_eq!(other.infer(inputs.clone())?, session.infer(inputs)?);
//! # Ok(())
//! # }
//! ```

use crate::checkpoint::{Checkpoint, is_checkpoint};
use crate::error::{Result, RuntimeError};
use crate::exec::{Backend, Executor, KernelChoice};
use crate::plan::{Plan, read_plan};
use crate::synthetic::{DataSchema, SyntheticData};
use dlrm_ir::contract::{InputContract, ModelInput};
use dlrm_ir::{Graph, SingleRank, Tensor};
use std::collections::HashMap;
use std::path::Path;

/// A loaded inference model (module docs).
pub struct Session {
    name: String,
    contract: InputContract,
    /// The graph's inputs, for requests made by [`Session::example_inputs`].
    schema: Option<DataSchema>,
    graph: Graph,
    exec: Executor,
    outputs: Vec<String>,
}

impl Session {
    /// Loads the plan or checkpoint at `path` (the default backend and kernels).
    pub fn open(path: &Path) -> Result<Session> {
        let plan = if is_checkpoint(path) {
            Checkpoint::open(path)?.to_plan()?
        } else {
            read_plan(path)?
        };
        Session::new(plan, Backend::default(), KernelChoice::default())
    }

    /// A session of `plan`'s inference graph on `backend` with `kernels`; creates
    /// every parameter (fallibly: too large is an error naming it).
    pub fn new(plan: Plan, backend: Backend, kernels: KernelChoice) -> Result<Session> {
        let graph = plan.infer;
        // The inference graph's parameters only: a plan also holds the training
        // state (Adagrad's accumulators, bf16 low halves), which inference never
        // reads and need not be created.
        let declared: std::collections::HashSet<&str> =
            graph.params().iter().map(|&p| graph.name_of(p)).collect();
        let wanted: Vec<(String, dlrm_ir::ParamValue)> = plan
            .params
            .into_iter()
            .filter(|(name, _)| declared.contains(name.as_str()))
            .collect();
        let params = dlrm_ir::init::materialize_all(&wanted)?;
        let outputs = graph
            .outputs()
            .iter()
            .map(|&v| graph.name_of(v).to_string())
            .collect();
        let mut exec = Executor::new(graph.clone(), params.into_iter().collect(), 0)?;
        exec.set_backend(backend, kernels);
        Ok(Session {
            name: plan.name,
            contract: plan.contract,
            schema: None,
            graph,
            exec,
            outputs,
        })
    }

    /// The model's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The model's own inputs (names and types), in its order.
    pub fn model_inputs(&self) -> Vec<ModelInput> {
        if !self.contract.model_inputs.is_empty() {
            return self.contract.model_inputs.clone();
        }
        named(&self.graph, self.graph.inputs())
    }

    /// The outputs' names, in order.
    pub fn output_names(&self) -> &[String] {
        &self.outputs
    }

    /// The outputs' names and types, in order.
    pub fn model_outputs(&self) -> Vec<ModelInput> {
        named(&self.graph, self.graph.outputs())
    }

    /// Runs the model on `inputs` (every model input once, in its own names and
    /// layout; dtypes and shapes checked, the batch size read from them) and
    /// returns the outputs by name.
    pub fn infer(&mut self, inputs: Vec<(String, Tensor)>) -> Result<Vec<(String, Tensor)>> {
        let given = self.graph_inputs(inputs)?;
        self.infer_graph_inputs(given)
    }

    /// The graph's own inputs computed from `inputs` in the model's names and
    /// layout (the first half of [`Session::infer`]: the input contract, every
    /// graph input given once, no NaN or infinite value), for a caller that
    /// combines several requests' graph inputs (a server's batches, by the roles
    /// [`dlrm_ir::contract::roles`] finds in [`Session::graph`]) before running
    /// them with [`Session::infer_graph_inputs`].
    pub fn graph_inputs(&self, inputs: Vec<(String, Tensor)>) -> Result<HashMap<String, Tensor>> {
        let inputs = self.contract.adapt(inputs)?;
        let wanted: Vec<&str> = self
            .graph
            .inputs()
            .iter()
            .map(|&v| self.graph.name_of(v))
            .collect();
        let mut given = HashMap::new();
        for (name, t) in inputs {
            if !wanted.contains(&name.as_str()) {
                return Err(bad_input(format!(
                    "array `{name}` is not an input of the model (its inputs: {})",
                    wanted.join(", ")
                )));
            }
            refuse_nonfinite(&name, &t)?;
            if given.insert(name.clone(), t).is_some() {
                return Err(bad_input(format!("array `{name}` is given twice")));
            }
        }
        if let Some(missing) = wanted.iter().find(|n| !given.contains_key(**n)) {
            return Err(bad_input(format!(
                "no array for the model input `{missing}` (its inputs: {})",
                wanted.join(", ")
            )));
        }
        Ok(given)
    }

    /// Runs the graph on its own inputs (as [`Session::graph_inputs`] makes them;
    /// shapes checked) and returns the outputs by name.
    pub fn infer_graph_inputs(
        &mut self,
        given: HashMap<String, Tensor>,
    ) -> Result<Vec<(String, Tensor)>> {
        let syms = self.exec.bind_symbols(&given)?;
        let values = self.exec.step(given, &syms, &SingleRank)?;
        Ok(self.outputs.iter().cloned().zip(values).collect())
    }

    /// The inference graph (its inputs, their types and roles).
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Another session of the same model over this one's parameters (one copy in
    /// memory, shared; inference never changes them), with its own executor
    /// state, so that several threads run requests at once, each on its own
    /// session. An error if this session's executor failed irrecoverably.
    pub fn fork(&self) -> Result<Session> {
        Ok(Session {
            name: self.name.clone(),
            contract: self.contract.clone(),
            schema: self.schema.clone(),
            graph: self.graph.clone(),
            exec: self.exec.fork()?,
            outputs: self.outputs.clone(),
        })
    }

    /// Synthetic inputs of `batch` samples for this model, as its graph takes
    /// them (a plan whose model inputs are its graph's), from the deterministic
    /// generator with `seed`: for examples, smoke tests and load generators.
    pub fn example_inputs(&mut self, batch: usize, seed: u64) -> Result<Vec<(String, Tensor)>> {
        if !self.contract.is_identity() {
            return Err(bad_input(
                "example inputs are made for models that take their bags per table; \
                 this model takes another layout"
                    .into(),
            ));
        }
        let schema = match &self.schema {
            Some(s) => s.clone(),
            None => DataSchema::from_graph(&self.graph)?,
        };
        self.schema = Some(schema.clone());
        let data = SyntheticData::new(schema, seed);
        let inputs = data.inputs_for(0, batch, 1, 0, &self.graph)?;
        Ok(inputs.into_iter().collect())
    }
}

/// The names and types of values `vs` of `g`.
fn named(g: &Graph, vs: &[dlrm_ir::ValueId]) -> Vec<ModelInput> {
    vs.iter()
        .map(|&v| ModelInput {
            name: g.name_of(v).to_string(),
            ty: g.ty(v).to_string(),
        })
        .collect()
}

fn bad_input(reason: String) -> RuntimeError {
    RuntimeError::Data { reason }
}

/// Refuses an input array with NaN or infinite values, naming the rows (along its
/// first dimension) that hold them: the model would answer them with NaN.
fn refuse_nonfinite(name: &str, t: &Tensor) -> Result<()> {
    let Some(v) = t.as_f32() else {
        return Ok(());
    };
    let Some(first) = v.iter().position(|x| !x.is_finite()) else {
        return Ok(());
    };
    let row_len = v.len() / t.shape.first().copied().unwrap_or(1).max(1);
    let mut rows: Vec<usize> = (first..v.len())
        .filter(|&i| !v[i].is_finite())
        .map(|i| i / row_len.max(1))
        .collect();
    rows.dedup();
    let shown: Vec<String> = rows.iter().take(10).map(|r| r.to_string()).collect();
    Err(bad_input(format!(
        "input array `{name}`: {} row(s) hold NaN or infinite values and are refused: {}{} \
         (row {}: {})",
        rows.len(),
        shown.join(", "),
        if rows.len() > 10 { ", ..." } else { "" },
        rows[0],
        v[first]
    )))
}

#[cfg(test)]
mod tests {
    use super::refuse_nonfinite;
    use dlrm_ir::Tensor;

    #[test]
    fn inputs_with_nan_or_infinite_values_are_refused_naming_the_rows() {
        let mut v = vec![0.5f32; 12];
        v[4] = f32::NAN;
        v[5] = f32::INFINITY;
        v[10] = f32::NEG_INFINITY;
        let e = refuse_nonfinite("dense", &Tensor::f32(vec![4, 3], v))
            .map_or_else(|e| e.to_string(), |()| String::new());
        assert!(
            e.contains("input array `dense`: 2 row(s) hold NaN or infinite values and are refused: 1, 3 (row 1: NaN)"),
            "{e}"
        );
        assert!(refuse_nonfinite("x", &Tensor::f32(vec![2], vec![1.0, -2.0])).is_ok());
        assert!(refuse_nonfinite("i", &Tensor::i64(vec![1], vec![7])).is_ok());
    }
}
