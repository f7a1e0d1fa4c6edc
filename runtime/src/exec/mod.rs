//! The per-rank executor: runs one rank's graph step after step on its own
//! parameter storage.
//!
//! This module holds the [`Executor`] itself: its construction, which checks the
//! parameters against the graph's declarations (dtype, fixed dimensions) and
//! precomputes each value's last use, the nodes whose update may take its
//! operands' storage, and the settings and accessors. Values are dropped right
//! after their last use; graph outputs and update values live to the end of the
//! step. Every error names the rank, the step, and — for node failures — the node
//! (`#n %result`) and its op.
//!
//! Backends ([`Backend`]): `Jit` (the default) runs each node with a Cranelift
//! kernel ([`dlrm_codegen::jit::try_eval`], compiled once per op signature and
//! cached process-wide, GEMM micro-kernel per [`KernelChoice`]), else the reference
//! kernel, else the interpreter; `Reference` skips the JIT.
//!
//! Learning rate ([`Executor::set_lr`]): each update op's `lr` attribute is the
//! rate the graph was compiled with; the driver may set the step's rate (a
//! schedule), which every update of the following steps then runs with instead —
//! in the JIT kernels, the reference kernels and the interpreter alike: the rate
//! goes beside the node's op to the in-place update
//! ([`dlrm_codegen::update_in_place_instance`], which runs its op with it), and
//! into a copy of the op for the other paths. Unset, nothing changes.
//!
//! The rest is by concern:
//! - `preflight`: what is checked before a step's nodes run — the symbol
//!   binding, the inputs against their declared types, that the step's
//!   buffers can be allocated, and each node's instance under the binding
//!   (its concrete operand and result types, verified once by inference);
//! - `step`: one step — the nodes in order, then the outputs and the updates
//!   of the parameters; a failed step poisons the executor;
//! - `nodes`: one node — its kernel, or the interpreter, and the optimizer
//!   updates in place on the parameter storage;
//! - `collectives`: the collectives on a progress thread, overlapped with
//!   compute;
//! - `timing`: the per-op-kind and per-node timers and the collective time.

mod collectives;
mod nodes;
mod preflight;
mod step;
mod timing;

pub use timing::OpTime;

use crate::error::{Result, RuntimeError};
pub use dlrm_codegen::{JitOptions, KernelChoice};
use dlrm_ir::{Def, Graph, NodeInstance, Tensor, TensorType, ValueId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use timing::Acc;

/// Which kernels run the nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Cranelift JIT kernels, falling back to the reference kernels, then to the
    /// interpreter (`--backend jit`, the default).
    #[default]
    Jit,
    /// Reference kernels, then the interpreter (`--backend reference`).
    Reference,
}

impl Backend {
    /// Parses `jit` or `reference`.
    pub fn parse(s: &str) -> Option<Backend> {
        match s {
            "jit" => Some(Backend::Jit),
            "reference" => Some(Backend::Reference),
            _ => None,
        }
    }

    /// The spelling accepted by [`Backend::parse`].
    pub fn name(self) -> &'static str {
        match self {
            Backend::Jit => "jit",
            Backend::Reference => "reference",
        }
    }
}

/// Per node of `graph`: its results' declared types.
fn out_types(graph: &Graph) -> Arc<[Vec<TensorType>]> {
    let node_outs =
        |node: &dlrm_ir::Node| node.outputs.iter().map(|&v| graph.ty(v).clone()).collect();
    graph.nodes().iter().map(node_outs).collect()
}

/// A value's lifetime end: after node `n`, or kept to the end of the step.
const KEEP: usize = usize::MAX;

/// Executes one rank's graph (see the module docs).
pub struct Executor {
    /// Shared so that a step borrows a node (its op, operands and result types)
    /// while it updates the executor.
    graph: Arc<Graph>,
    /// Per node: its results' declared types (shared as the graph is).
    out_types: Arc<[Vec<TensorType>]>,
    rank: usize,
    /// Parameter storage, by parameter position; `None` only while moved mid-step.
    /// Shared with the executors [`Executor::fork`] made (an update takes a
    /// shared parameter by copying it, so none sees another's update).
    params: Vec<Option<Arc<Tensor>>>,
    /// Per value: the last node using it, or [`KEEP`].
    last_use: Vec<usize>,
    /// Per node: values to drop after it.
    free_after: Vec<Vec<ValueId>>,
    /// Per node: may an update node take its operand 0's storage?
    may_move: Vec<bool>,
    /// Scratch value slots (reused across steps).
    slots: Vec<Option<Tensor>>,
    times: BTreeMap<&'static str, Acc>,
    /// Per node: its compute time (collectives on the progress thread excluded).
    node_times: Vec<Acc>,
    backend: Backend,
    jit: JitOptions,
    step: u64,
    /// The learning rate of the next steps' updates (`None`: the graph's own).
    lr: Option<f32>,
    poisoned: Option<String>,
    /// Run collectives on a progress thread (see the module docs).
    overlap: bool,
    /// Collective time: in flight, and blocking this thread.
    comm_busy: Duration,
    comm_exposed: Duration,
    /// The symbol binding [`Executor::check_buffers`] last passed, and per value
    /// the largest size (bytes) checked so far.
    checked: (Option<HashMap<String, usize>>, Vec<u128>),
    /// The symbol binding the node instances were built for, and per node its
    /// verified instance ([`Executor::instantiate`]; `None`: collectives
    /// and nodes verified per call instead).
    instances: (Option<HashMap<String, usize>>, Vec<Option<NodeInstance>>),
    /// Per node: the kernel that ran it and its cost under the instances' binding,
    /// found on its first run and kept until its instance is rebuilt or the backend
    /// changes ([`Resolved`]).
    resolved: Vec<Resolved>,
}

/// Which kernel runs a node, and its cost, under one symbol binding: found on the
/// node's first run (the JIT, else the reference kernel, else the interpreter),
/// then taken directly on every later step.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Resolved {
    route: Route,
    cost: Option<dlrm_codegen::work::Cost>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Route {
    /// Not run yet under this binding.
    #[default]
    Unknown,
    /// A JIT kernel.
    Jit,
    /// A reference kernel (`dlrm_codegen::try_eval`).
    Reference,
    /// The reference interpreter.
    Interp,
}

impl Executor {
    /// An executor for `graph` on rank `rank` with `params`: exactly the parameters
    /// the graph declares, each matching its declared dtype and fixed dimensions.
    pub fn new(graph: Graph, mut params: HashMap<String, Tensor>, rank: usize) -> Result<Executor> {
        let mut storage = Vec::with_capacity(graph.params().len());
        for (name, ty) in graph.param_types() {
            let t = params.remove(name).ok_or_else(|| RuntimeError::Param {
                name: name.to_string(),
                reason: format!(
                    "rank {rank}: declared {ty} by graph `{}` but not given",
                    graph.name
                ),
            })?;
            let fits = t.dtype() == ty.dtype
                && t.shape.len() == ty.shape.len()
                && t.shape
                    .iter()
                    .zip(&ty.shape)
                    .all(|(&n, d)| d.fixed().is_none_or(|f| f == n));
            if !fits || stored_len(&t) != t.numel() {
                return Err(RuntimeError::Param {
                    name: name.to_string(),
                    reason: format!(
                        "rank {rank}: given {}{:?} ({} elements stored) but graph `{}` declares {ty}",
                        t.dtype(),
                        t.shape,
                        stored_len(&t),
                        graph.name
                    ),
                });
            }
            storage.push(Some(Arc::new(t)));
        }
        if let Some(extra) = params.keys().min() {
            return Err(RuntimeError::Param {
                name: extra.clone(),
                reason: format!(
                    "rank {rank}: given but graph `{}` declares no such parameter",
                    graph.name
                ),
            });
        }

        let nvals = graph.values().len();
        let nnodes = graph.nodes().len();
        let mut last_use = vec![0usize; nvals];
        // A value never used dies right after its definition (node index), or at
        // node 0 for unused inputs.
        for (i, v) in graph.values().iter().enumerate() {
            if let Def::Node(n, _) = v.def {
                last_use[i] = n;
            }
        }
        for (n, node) in graph.nodes().iter().enumerate() {
            for &v in &node.inputs {
                last_use[v.index()] = last_use[v.index()].max(n);
            }
        }
        for &o in graph.outputs() {
            last_use[o.index()] = KEEP;
        }
        let mut updated = vec![false; graph.params().len()];
        for u in graph.updates() {
            last_use[u.value.index()] = KEEP;
            if let Def::Param(p) = graph.value(u.param).def {
                updated[p] = true;
            }
        }
        let mut free_after = vec![Vec::new(); graph.nodes().len()];
        for (i, v) in graph.values().iter().enumerate() {
            let lu = last_use[i];
            if lu != KEEP && !matches!(v.def, Def::Param(_)) && lu < free_after.len() {
                free_after[lu].push(ValueId(i as u32));
            }
        }
        let may_move = graph
            .nodes()
            .iter()
            .enumerate()
            .map(|(n, node)| {
                // The operands updated in place (the halves of a split update).
                let Some(k) = dlrm_codegen::in_place_operands(&node.op) else {
                    return false;
                };
                node.inputs.len() > k
                    && node.inputs[..k].iter().all(|&w| {
                        // Each must die here (not used later, not an output, not an
                        // update value) and appear only once among the operands.
                        let once = node.inputs.iter().filter(|&&v| v == w).count() == 1;
                        let dies_here = last_use[w.index()] == n && once;
                        match graph.value(w).def {
                            // A parameter may be moved only if the update list refills it.
                            Def::Param(p) => dies_here && updated[p],
                            _ => dies_here,
                        }
                    })
            })
            .collect();
        Ok(Executor {
            rank,
            params: storage,
            last_use,
            free_after,
            may_move,
            slots: vec![None; nvals],
            out_types: out_types(&graph),
            graph: Arc::new(graph),
            times: BTreeMap::new(),
            node_times: vec![Acc::default(); nnodes],
            backend: Backend::default(),
            jit: JitOptions::default(),
            step: 0,
            lr: None,
            poisoned: None,
            overlap: true,
            comm_busy: Duration::ZERO,
            comm_exposed: Duration::ZERO,
            checked: (None, vec![0; nvals]),
            instances: (None, Vec::new()),
            resolved: Vec::new(),
        })
    }

    /// Selects the backend and the GEMM micro-kernel choice (default: JIT, auto).
    pub fn set_backend(&mut self, backend: Backend, kernels: KernelChoice) {
        self.backend = backend;
        self.jit = JitOptions {
            kernels,
            ..self.jit
        };
        self.resolved.fill(Resolved::default());
    }

    /// Runs collectives on a progress thread, overlapped with compute (default), or
    /// inline.
    pub fn set_overlap(&mut self, overlap: bool) {
        self.overlap = overlap;
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The graph this executor runs.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The rank this executor runs on.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of the next step (used in error messages); starts at 0 and counts
    /// the steps run, unless set with [`Executor::set_step`].
    pub fn next_step(&self) -> u64 {
        self.step
    }

    /// Sets the number of the next step (e.g. to count evaluation batches).
    pub fn set_step(&mut self, step: u64) {
        self.step = step;
    }

    /// Sets the learning rate of the following steps: with `Some(lr)` every
    /// optimizer update runs as if its `lr` attribute were `lr` (the step's rate of
    /// a schedule, [`crate::lr_schedule`]); `None` (the default) keeps the rates the
    /// graph was compiled with. The same value reaches the JIT kernels, the
    /// reference kernels and the interpreter (each runs the update's op with it,
    /// [`dlrm_ir::Op::with_lr`]). A negative or non-finite rate is an error.
    pub fn set_lr(&mut self, lr: Option<f32>) -> Result<()> {
        if let Some(l) = lr
            && !(l.is_finite() && l >= 0.0)
        {
            return Err(RuntimeError::LearningRate {
                reason: format!(
                    "rank {}, step {}: {l} is not a finite rate >= 0",
                    self.rank, self.step
                ),
            });
        }
        self.lr = lr;
        Ok(())
    }

    /// The learning rate set by [`Executor::set_lr`] (`None`: the graph's own).
    pub fn lr(&self) -> Option<f32> {
        self.lr
    }

    /// A parameter's current value.
    pub fn param(&self, name: &str) -> Option<&Tensor> {
        let v = self.graph.find(name)?;
        match self.graph.value(v).def {
            Def::Param(p) => self.params[p].as_deref(),
            _ => None,
        }
    }

    /// The parameters, consuming the executor (e.g. to hand trained parameters to
    /// an inference executor). A poisoned executor may have lost some.
    pub fn into_params(self) -> HashMap<String, Tensor> {
        let names: Vec<String> = self
            .graph
            .params()
            .iter()
            .map(|&v| self.graph.name_of(v).to_string())
            .collect();
        names
            .into_iter()
            .zip(self.params)
            .filter_map(|(n, t)| t.map(|t| (n, Arc::unwrap_or_clone(t))))
            .collect()
    }

    /// A new executor of the same graph over the same parameter storage (one
    /// copy in memory, shared), with this one's backend and settings and its own
    /// step state: e.g. several inference executors serving requests at once. A
    /// step that updates a shared parameter updates a private copy of it. An
    /// executor that lost parameters in a failed step cannot be forked.
    pub fn fork(&self) -> Result<Executor> {
        if let Some(why) = &self.poisoned {
            return Err(RuntimeError::Rank {
                rank: self.rank,
                step: Some(self.step),
                reason: format!("the executor is unusable after an earlier failure: {why}"),
            });
        }
        let nvals = self.slots.len();
        Ok(Executor {
            graph: Arc::clone(&self.graph),
            out_types: Arc::clone(&self.out_types),
            rank: self.rank,
            params: self.params.clone(),
            last_use: self.last_use.clone(),
            free_after: self.free_after.clone(),
            may_move: self.may_move.clone(),
            slots: vec![None; nvals],
            times: BTreeMap::new(),
            node_times: vec![Acc::default(); self.node_times.len()],
            backend: self.backend,
            jit: self.jit,
            step: 0,
            lr: self.lr,
            poisoned: None,
            overlap: self.overlap,
            comm_busy: Duration::ZERO,
            comm_exposed: Duration::ZERO,
            checked: (None, vec![0; nvals]),
            instances: (None, Vec::new()),
            resolved: Vec::new(),
        })
    }

    /// The last node that uses each value ([`usize::MAX`]: kept to the end of the
    /// step), for diagnostics and tests.
    pub fn last_uses(&self) -> &[usize] {
        &self.last_use
    }

    fn node_err(&self, n: usize, reason: String) -> RuntimeError {
        RuntimeError::Node {
            rank: self.rank,
            step: self.step,
            node: self.graph.node_label(n),
            op: self.graph.nodes()[n].op.mnemonic().to_string(),
            reason,
        }
    }

    fn value(&self, v: ValueId) -> Option<&Tensor> {
        match self.graph.value(v).def {
            Def::Param(p) => self.params[p].as_deref(),
            _ => self.slots[v.index()].as_ref(),
        }
    }

    /// Takes value `v`'s tensor out (parameters: their storage).
    fn take(&mut self, v: ValueId) -> Option<Tensor> {
        match self.graph.value(v).def {
            Def::Param(p) => self.params[p].take().map(Arc::unwrap_or_clone),
            _ => self.slots[v.index()].take(),
        }
    }
}

pub(crate) use dlrm_ir::stored_len;
