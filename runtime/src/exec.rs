//! The per-rank executor: runs one rank's graph step after step on its own
//! parameter storage.
//!
//! Each node runs with a codegen kernel ([`dlrm_codegen::try_eval`]) when there is
//! one, else with the reference interpreter ([`dlrm_ir::interp::eval_op`]);
//! collectives always go through `eval_op` with the rank's communicator.
//! Optimizer updates (`sgd`, `split_sgd`, `sparse_sgd`, `embedding_update`,
//! `split_embedding_update`) run *in place* on the parameter storage
//! ([`dlrm_codegen::update_in_place`]: a JIT kernel with the JIT backend, else the
//! reference kernel): when an update node is the last use of its parameter(s) (both
//! halves for the Split-SGD-BF16 ops) and the graph's update list gives them new
//! values, the parameters' tensors are moved into the node's results, updated
//! there, and moved back into the parameter slots by the update list at the end of
//! the step — no copy of a table per step. (An update chain
//! `t1 = sparse_sgd(t, ..); t2 = sparse_sgd(t1, ..)` moves the same storage along.)
//! Otherwise the operand is copied first, which is always correct.
//!
//! Values are dropped right after their last use (precomputed at construction);
//! graph outputs and update values live to the end of the step. Inputs are checked
//! against their declared types (dtype, fixed dims, bound symbols) like
//! `interp::run`, and so are parameters at construction. Every error names the
//! rank, the step, and — for node failures — the node (`#n %result`) and its op.
//! After a failed step the executor refuses to run again (its parameters may have
//! been moved out mid-step).
//!
//! Learning rate ([`Executor::set_lr`]): each update op's `lr` attribute is the
//! rate the graph was compiled with; the driver may set the step's rate (a
//! schedule), which every update of the following steps then runs with instead —
//! in the JIT kernels, the reference kernels and the interpreter alike, since the
//! node's op is rewritten before it reaches any of them. Unset, nothing changes.
//!
//! Backends ([`Backend`]): `Jit` (the default) runs each node with a Cranelift
//! kernel ([`dlrm_codegen::jit::try_eval`], compiled once per op signature and
//! cached process-wide, GEMM micro-kernel per [`KernelChoice`]), else the reference
//! kernel, else the interpreter; `Reference` skips the JIT.
//!
//! Overlap ([`Executor::set_overlap`], on by default): with more than one rank, a
//! progress thread ([`crate::progress`]) runs the collective nodes in issue order
//! while this thread goes on with the nodes that do not need their results; a node
//! that does waits for them. Without overlap, collectives run inline. Either way
//! [`Executor::comm_times`] tells how long the collectives took and how much of that
//! the rank spent blocked.
//!
//! Memory ([`Executor::check_buffers`]): before the first step under a symbol
//! binding (e.g. a batch size), every buffer of the step that binding sizes (the
//! inputs, each node's results: activations, gradients, all-to-all buffers) is
//! reserved once with [`dlrm_ir::init::try_reserve`] and released, so a buffer this
//! process cannot hold is an error naming the value and its bytes ("`%bot.0`
//! needs N bytes") instead of an abort inside a kernel. The driver runs the check
//! before its loader assembles the first batch. It is a check of each buffer on
//! its own, not of their sum (that is the memory account's, `dlrm-run`'s check
//! before anything is allocated); with the kernel's overcommit an allocation the
//! machine cannot back still succeeds and fails later when touched.
//!
//! A per-op-kind timer accumulates the wall time spent in each mnemonic (the node's
//! evaluation plus dropping the values whose last use it is), with the work and
//! traffic of each execution ([`dlrm_codegen::cost::op_cost`]) for GFLOP/s and
//! GB/s.

use crate::error::{Result, RuntimeError};
use crate::progress::{self, CommTimes, Done, Request};
use dlrm_codegen::cost::{Cost, op_cost};
pub use dlrm_codegen::{JitOptions, KernelChoice};
use dlrm_ir::interp::{EvalCtx, eval_op};
use dlrm_ir::{Communicator, Def, Dim, Graph, Op, Tensor, TensorType, ValueId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant};

/// Time spent in one op kind, or in one node ([`Executor::node_times`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OpTime {
    /// The op mnemonic.
    pub op: String,
    /// For one node: its name (that of its first result).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Number of node executions.
    pub calls: u64,
    /// Total wall time, in seconds.
    pub seconds: f64,
    /// Total floating-point operations ([`dlrm_codegen::cost`] conventions).
    pub flops: f64,
    /// Total bytes moved ([`dlrm_codegen::cost`] conventions).
    pub bytes: f64,
}

impl OpTime {
    /// GFLOP/s over the measured time (0 when no time was measured).
    pub fn gflops(&self) -> f64 {
        if self.seconds > 0.0 {
            self.flops / self.seconds / 1e9
        } else {
            0.0
        }
    }

    /// GB/s over the measured time (0 when no time was measured).
    pub fn gbytes(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes / self.seconds / 1e9
        } else {
            0.0
        }
    }
}

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

/// Per-op-kind (or per-node) accumulators: calls, time, work.
#[derive(Clone, Copy, Debug, Default)]
struct Acc {
    calls: u64,
    time: Duration,
    cost: Cost,
}

impl Acc {
    fn report(&self, op: &str, node: Option<String>) -> OpTime {
        OpTime {
            op: op.to_string(),
            node,
            calls: self.calls,
            seconds: self.time.as_secs_f64(),
            flops: self.cost.flops,
            bytes: self.cost.bytes,
        }
    }
}

/// The `top` most expensive of `v`, most expensive first (ties by name).
fn by_time(mut v: Vec<OpTime>, top: usize) -> Vec<OpTime> {
    v.sort_by(|a, b| {
        (b.seconds.total_cmp(&a.seconds))
            .then_with(|| a.op.cmp(&b.op))
            .then_with(|| a.node.cmp(&b.node))
    });
    v.truncate(top);
    v
}

/// A value's lifetime end: after node `n`, or kept to the end of the step.
const KEEP: usize = usize::MAX;

/// Executes one rank's graph (see the module docs).
pub struct Executor {
    graph: Graph,
    rank: usize,
    /// Parameter storage, by parameter position; `None` only while moved mid-step.
    params: Vec<Option<Tensor>>,
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
            storage.push(Some(t));
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
            graph,
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
        })
    }

    /// Selects the backend and the GEMM micro-kernel choice (default: JIT, auto).
    pub fn set_backend(&mut self, backend: Backend, kernels: KernelChoice) {
        self.backend = backend;
        self.jit = JitOptions {
            kernels,
            ..self.jit
        };
    }

    /// Runs collectives on a progress thread, overlapped with compute (default), or
    /// inline.
    pub fn set_overlap(&mut self, overlap: bool) {
        self.overlap = overlap;
    }

    /// Collective time since construction (or the last reset).
    pub fn comm_times(&self) -> CommTimes {
        CommTimes {
            busy_s: self.comm_busy.as_secs_f64(),
            exposed_s: self.comm_exposed.as_secs_f64(),
        }
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
    /// a schedule, [`crate::schedule`]); `None` (the default) keeps the rates the
    /// graph was compiled with. The same value reaches the JIT kernels, the
    /// reference kernels and the interpreter (the op is rewritten once per node,
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
            Def::Param(p) => self.params[p].as_ref(),
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
            .filter_map(|(n, t)| t.map(|t| (n, t)))
            .collect()
    }

    /// Time spent per op kind since construction (or the last reset), most
    /// expensive first.
    pub fn op_times(&self) -> Vec<OpTime> {
        let v = self
            .times
            .iter()
            .map(|(op, a)| a.report(op, None))
            .collect();
        by_time(v, usize::MAX)
    }

    /// The `top` nodes that took the most time since construction (or the last
    /// reset), most expensive first: where a step's time goes, layer by layer.
    pub fn node_times(&self, top: usize) -> Vec<OpTime> {
        let v = (self.node_times.iter().enumerate())
            .filter(|(_, a)| a.calls > 0)
            .map(|(n, a)| {
                let node = &self.graph.nodes()[n];
                let name = node
                    .outputs
                    .first()
                    .map(|&v| self.graph.name_of(v).to_string());
                a.report(node.op.mnemonic(), name)
            })
            .collect();
        by_time(v, top)
    }

    /// Clears the per-op and per-node timers.
    pub fn reset_timers(&mut self) {
        self.times.clear();
        self.node_times.fill(Acc::default());
        self.comm_busy = Duration::ZERO;
        self.comm_exposed = Duration::ZERO;
    }

    /// Binds the graph's symbols from the shapes of `inputs` and the parameters
    /// (conflicts are errors naming the input). Symbols carried by no input (e.g.
    /// `G` on a rank that owns no table) are absent: the caller adds them.
    pub fn bind_symbols(&self, inputs: &HashMap<String, Tensor>) -> Result<HashMap<String, usize>> {
        let mut syms: HashMap<String, usize> = HashMap::new();
        let g = &self.graph;
        let sources = g
            .inputs()
            .iter()
            .map(|&v| (v, inputs.get(g.name_of(v))))
            .chain(g.params().iter().map(|&v| match g.value(v).def {
                Def::Param(p) => (v, self.params[p].as_ref()),
                _ => (v, None),
            }));
        let mut exprs: Vec<(dlrm_ir::DimExpr, usize)> = Vec::new();
        let mut expr_input = String::new();
        for (v, t) in sources {
            let Some(t) = t else { continue };
            let ty = g.ty(v);
            for (d, &n) in ty.shape.iter().zip(&t.shape) {
                if let Dim::Expr(e) = d {
                    if exprs.is_empty() {
                        expr_input = g.name_of(v).to_string();
                    }
                    exprs.push((e.clone(), n));
                    continue;
                }
                let Dim::Sym(s) = d else { continue };
                match syms.get(s) {
                    None => {
                        syms.insert(s.clone(), n);
                    }
                    Some(&b) if b == n => {}
                    Some(&b) => {
                        return Err(RuntimeError::Input {
                            rank: self.rank,
                            step: self.step,
                            name: g.name_of(v).to_string(),
                            reason: format!("symbol {s} is {n} here but {b} from an earlier input"),
                        });
                    }
                }
            }
        }
        // `B+1 = 8`: solved for a symbol no plain dimension bound, then checked.
        dlrm_ir::dim::bind_exprs(&exprs, &mut syms).map_err(|reason| RuntimeError::Input {
            rank: self.rank,
            step: self.step,
            name: expr_input,
            reason,
        })?;
        Ok(syms)
    }

    /// Checks that each buffer a step under `syms` allocates can be allocated (see
    /// the module docs): every input and node result whose shape `syms` resolves
    /// (but the results of updates in place, which take their operands' storage) is
    /// reserved ([`dlrm_ir::init::try_reserve`]) and released. A buffer that cannot
    /// be is an error naming the rank, the step, the value and its bytes. What
    /// passed is remembered: the same binding again costs a comparison, another one
    /// (a last partial batch, variable bags) reserves only the buffers larger than
    /// before.
    pub fn check_buffers(&mut self, syms: &HashMap<String, usize>) -> Result<()> {
        if self.checked.0.as_ref() == Some(syms) {
            return Ok(());
        }
        let g = &self.graph;
        for (i, v) in g.values().iter().enumerate() {
            // Parameters are held already; an in-place update's results take its
            // operands' storage.
            let in_place = matches!(v.def, Def::Node(n, _) if self.may_move[n]);
            if matches!(v.def, Def::Param(_)) || in_place {
                continue;
            }
            let ty = g.ty(ValueId(i as u32));
            let dims: Option<Vec<u128>> = ty
                .shape
                .iter()
                .map(|d| d.resolve(&|s| syms.get(s).copied()).map(|n| n as u128))
                .collect();
            let Some(dims) = dims else { continue };
            let elems = dims.iter().fold(1u128, |a, &d| a.saturating_mul(d));
            let bytes = elems.saturating_mul(ty.dtype.size_bytes() as u128);
            if bytes <= self.checked.1[i] {
                continue;
            }
            let what = format!("%{}", g.name_of(ValueId(i as u32)));
            dlrm_ir::init::try_reserve::<u8>(&what, bytes).map_err(|e| RuntimeError::Rank {
                rank: self.rank,
                step: Some(self.step),
                reason: e.to_string(),
            })?;
            self.checked.1[i] = bytes;
        }
        self.checked.0 = Some(syms.clone());
        Ok(())
    }

    /// Runs one step: binds `inputs` (exactly the graph's inputs), evaluates every
    /// node, applies the updates to the parameters, and returns the outputs in
    /// order. `syms` must bind every symbol the graph uses. The step's buffers are
    /// checked first ([`Executor::check_buffers`]).
    pub fn step(
        &mut self,
        inputs: HashMap<String, Tensor>,
        syms: &HashMap<String, usize>,
        comm: &dyn Communicator,
    ) -> Result<Vec<Tensor>> {
        if let Some(why) = &self.poisoned {
            return Err(RuntimeError::Rank {
                rank: self.rank,
                step: Some(self.step),
                reason: format!("the executor is unusable after an earlier failure: {why}"),
            });
        }
        let result = self
            .check_buffers(syms)
            .and_then(|()| self.run_step(inputs, syms, comm));
        // Never keep values of a step around.
        self.slots.iter_mut().for_each(|s| *s = None);
        match result {
            Ok(outs) => {
                self.step += 1;
                Ok(outs)
            }
            Err(e) => {
                if self.params.iter().any(Option::is_none) {
                    self.poisoned = Some(e.to_string());
                }
                Err(e)
            }
        }
    }

    fn input_err(&self, name: &str, reason: String) -> RuntimeError {
        RuntimeError::Input {
            rank: self.rank,
            step: self.step,
            name: name.to_string(),
            reason,
        }
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

    fn bind_inputs(
        &mut self,
        mut inputs: HashMap<String, Tensor>,
        syms: &HashMap<String, usize>,
    ) -> Result<()> {
        let bind = |s: &str| syms.get(s).copied();
        for i in 0..self.graph.inputs().len() {
            let v = self.graph.inputs()[i];
            let name = self.graph.name_of(v);
            let ty = self.graph.ty(v);
            let t = inputs
                .remove(name)
                .ok_or_else(|| self.input_err(name, format!("missing (declared {ty})")))?;
            if !t.matches(ty, &bind) || stored_len(&t) != t.numel() {
                return Err(self.input_err(
                    name,
                    format!(
                        "given {}{:?} but declared {ty}{}",
                        t.dtype(),
                        t.shape,
                        fmt_syms(ty, syms)
                    ),
                ));
            }
            self.slots[v.index()] = Some(t);
        }
        if let Some(extra) = inputs.keys().min() {
            return Err(self.input_err(
                extra,
                format!("graph `{}` has no such input", self.graph.name),
            ));
        }
        // Parameters with symbolic dimensions are checked under this binding.
        for (p, &v) in self.graph.params().iter().enumerate() {
            let ty = self.graph.ty(v);
            if ty.shape.iter().all(|d| d.fixed().is_some()) {
                continue;
            }
            if let Some(t) = &self.params[p]
                && !t.matches(ty, &bind)
            {
                return Err(RuntimeError::Param {
                    name: self.graph.name_of(v).to_string(),
                    reason: format!(
                        "rank {}: is {:?} but declared {ty}{}",
                        self.rank,
                        t.shape,
                        fmt_syms(ty, syms)
                    ),
                });
            }
        }
        Ok(())
    }

    fn value(&self, v: ValueId) -> Option<&Tensor> {
        match self.graph.value(v).def {
            Def::Param(p) => self.params[p].as_ref(),
            _ => self.slots[v.index()].as_ref(),
        }
    }

    /// Takes value `v`'s tensor out (parameters: their storage).
    fn take(&mut self, v: ValueId) -> Option<Tensor> {
        match self.graph.value(v).def {
            Def::Param(p) => self.params[p].take(),
            _ => self.slots[v.index()].take(),
        }
    }

    fn run_step(
        &mut self,
        inputs: HashMap<String, Tensor>,
        syms: &HashMap<String, usize>,
        comm: &dyn Communicator,
    ) -> Result<Vec<Tensor>> {
        self.bind_inputs(inputs, syms)?;
        let overlap = self.overlap
            && comm.size() > 1
            && self.graph.nodes().iter().any(|n| n.op.is_collective());
        if overlap {
            std::thread::scope(|s| {
                let (tx, rx) = mpsc::channel();
                let worker = s.spawn(move || progress::serve(rx, syms, comm));
                // A failure (or panic) of this thread must wake the progress thread
                // if it waits in a collective for peers that wait for us.
                let guard = AbortOnFailure(comm);
                let res = self.run_nodes(syms, comm, Some(&tx));
                drop(tx);
                if let Err(e) = &res {
                    comm.abort(&e.to_string());
                }
                drop(guard);
                match worker.join() {
                    Ok(()) => res,
                    Err(_) => res.and(Err(RuntimeError::Rank {
                        rank: self.rank,
                        step: Some(self.step),
                        reason: "the collectives' progress thread panicked".into(),
                    })),
                }
            })?;
        } else {
            self.run_nodes(syms, comm, None)?;
        }
        // Outputs (copied when an update or a later output still needs the value).
        let g = &self.graph;
        let outs_ids: Vec<ValueId> = g.outputs().to_vec();
        let update_values: Vec<ValueId> = g.updates().iter().map(|u| u.value).collect();
        let mut outs = Vec::with_capacity(outs_ids.len());
        for (i, &o) in outs_ids.iter().enumerate() {
            let needed_later = update_values.contains(&o)
                || outs_ids[i + 1..].contains(&o)
                || matches!(self.graph.value(o).def, Def::Param(_));
            let t = if needed_later {
                self.value(o).cloned()
            } else {
                self.take(o)
            };
            outs.push(t.ok_or_else(|| RuntimeError::Rank {
                rank: self.rank,
                step: Some(self.step),
                reason: format!("output %{} has no value", self.graph.name_of(o)),
            })?);
        }
        // Updates: new values move into the parameter slots.
        let updates = self.graph.updates().to_vec();
        let mut new_vals = Vec::with_capacity(updates.len());
        for u in &updates {
            // An update value may be a parameter or used by several updates: copy then.
            let shared = matches!(self.graph.value(u.value).def, Def::Param(_))
                || updates.iter().filter(|w| w.value == u.value).count() > 1;
            let t = if shared {
                self.value(u.value).cloned()
            } else {
                self.take(u.value)
            };
            new_vals.push(t.ok_or_else(|| RuntimeError::Rank {
                rank: self.rank,
                step: Some(self.step),
                reason: format!(
                    "update of %{} by %{}: the value is gone",
                    self.graph.name_of(u.param),
                    self.graph.name_of(u.value)
                ),
            })?);
        }
        for (u, t) in updates.iter().zip(new_vals) {
            if let Def::Param(p) = self.graph.value(u.param).def {
                self.params[p] = Some(t);
            }
        }
        debug_assert!(
            self.params.iter().all(Option::is_some),
            "every parameter slot is filled after a step"
        );
        Ok(outs)
    }

    /// Evaluates every node in order. With `progress`, collectives are handed to the
    /// progress thread and their results awaited at first use (and before return).
    fn run_nodes(
        &mut self,
        syms: &HashMap<String, usize>,
        comm: &dyn Communicator,
        progress: Option<&Sender<Request>>,
    ) -> Result<()> {
        // Per value: the collective node whose results are still in flight.
        let mut in_flight: Vec<Option<usize>> = vec![None; self.graph.values().len()];
        let mut replies: BTreeMap<usize, Receiver<Done>> = BTreeMap::new();
        for n in 0..self.graph.nodes().len() {
            for i in 0..self.graph.nodes()[n].inputs.len() {
                let v = self.graph.nodes()[n].inputs[i];
                if let Some(c) = in_flight[v.index()] {
                    self.finish(c, &mut replies, &mut in_flight)?;
                }
            }
            if let (Some(tx), true) = (progress, self.graph.nodes()[n].op.is_collective()) {
                self.start(n, tx, &mut replies, &mut in_flight)?;
                continue;
            }
            let t0 = Instant::now();
            let (outs, cost) = self.run_node(n, syms, comm)?;
            let node = &self.graph.nodes()[n];
            if outs.len() != node.outputs.len() {
                return Err(self.node_err(
                    n,
                    format!(
                        "produced {} results, the node has {}",
                        outs.len(),
                        node.outputs.len()
                    ),
                ));
            }
            for (k, t) in outs.into_iter().enumerate() {
                let v = self.graph.nodes()[n].outputs[k];
                self.slots[v.index()] = Some(t);
            }
            let mnemonic = self.graph.nodes()[n].op.mnemonic();
            for i in 0..self.free_after[n].len() {
                let v = self.free_after[n][i];
                self.slots[v.index()] = None;
            }
            let took = t0.elapsed();
            if self.graph.nodes()[n].op.is_collective() {
                self.comm_busy += took;
                self.comm_exposed += took;
            }
            for e in [
                self.times.entry(mnemonic).or_default(),
                &mut self.node_times[n],
            ] {
                e.calls += 1;
                e.time += took;
                e.cost.flops += cost.flops;
                e.cost.bytes += cost.bytes;
            }
        }
        while let Some((&c, _)) = replies.first_key_value() {
            self.finish(c, &mut replies, &mut in_flight)?;
        }
        Ok(())
    }

    /// Hands collective node `n` to the progress thread: operands that die here are
    /// moved, others copied.
    fn start(
        &mut self,
        n: usize,
        tx: &Sender<Request>,
        replies: &mut BTreeMap<usize, Receiver<Done>>,
        in_flight: &mut [Option<usize>],
    ) -> Result<()> {
        let t0 = Instant::now();
        let node = &self.graph.nodes()[n];
        let (op, ids, outs) = (node.op.clone(), node.inputs.clone(), node.outputs.clone());
        let out_types = outs.iter().map(|&v| self.graph.ty(v).clone()).collect();
        let mut ins = Vec::with_capacity(ids.len());
        for (i, &v) in ids.iter().enumerate() {
            let movable = self.last_use[v.index()] == n
                && !matches!(self.graph.value(v).def, Def::Param(_))
                && !ids[i + 1..].contains(&v);
            let t = if movable {
                self.take(v)
            } else {
                self.value(v).cloned()
            };
            ins.push(t.ok_or_else(|| {
                self.node_err(
                    n,
                    format!(
                        "operand {i} %{} has no value (moved or freed)",
                        self.graph.name_of(v)
                    ),
                )
            })?);
        }
        let (reply, rx) = mpsc::channel();
        tx.send(Request {
            op,
            ins,
            out_types,
            reply,
        })
        .map_err(|_| self.node_err(n, "the collectives' progress thread is gone".into()))?;
        replies.insert(n, rx);
        for &v in &outs {
            in_flight[v.index()] = Some(n);
        }
        for i in 0..self.free_after[n].len() {
            let v = self.free_after[n][i];
            if in_flight[v.index()].is_none() {
                self.slots[v.index()] = None;
            }
        }
        let e = self
            .times
            .entry(self.graph.nodes()[n].op.mnemonic())
            .or_default();
        e.calls += 1;
        e.time += t0.elapsed();
        Ok(())
    }

    /// Waits for collective node `c` and stores its results.
    fn finish(
        &mut self,
        c: usize,
        replies: &mut BTreeMap<usize, Receiver<Done>>,
        in_flight: &mut [Option<usize>],
    ) -> Result<()> {
        let Some(rx) = replies.remove(&c) else {
            return Ok(());
        };
        let t0 = Instant::now();
        let done = rx
            .recv()
            .map_err(|_| self.node_err(c, "the collectives' progress thread is gone".into()))?;
        let waited = t0.elapsed();
        let outs = done.outs.map_err(|e| self.node_err(c, e))?;
        let ids = self.graph.nodes()[c].outputs.clone();
        if outs.len() != ids.len() {
            return Err(self.node_err(
                c,
                format!(
                    "produced {} results, the node has {}",
                    outs.len(),
                    ids.len()
                ),
            ));
        }
        for (&v, t) in ids.iter().zip(outs) {
            in_flight[v.index()] = None;
            // A result nobody uses died when the node was issued.
            if self.last_use[v.index()] != c {
                self.slots[v.index()] = Some(t);
            }
        }
        self.comm_busy += done.busy;
        self.comm_exposed += waited;
        let e = self
            .times
            .entry(self.graph.nodes()[c].op.mnemonic())
            .or_default();
        e.time += waited;
        e.cost.flops += done.cost.flops;
        e.cost.bytes += done.cost.bytes;
        Ok(())
    }

    fn run_node(
        &mut self,
        n: usize,
        syms: &HashMap<String, usize>,
        comm: &dyn Communicator,
    ) -> Result<(Vec<Tensor>, Cost)> {
        let node = &self.graph.nodes()[n];
        // The step's learning rate reaches every kernel through the op (one place).
        let op = match self.lr {
            Some(lr) if node.op.is_update() => node.op.with_lr(lr),
            _ => node.op.clone(),
        };
        let out_types: Vec<TensorType> = node
            .outputs
            .iter()
            .map(|&v| self.graph.ty(v).clone())
            .collect();
        let ins_ids = node.inputs.clone();
        if op.is_update() {
            return self.run_update(n, &op, &ins_ids, &out_types, syms, comm);
        }
        let ins = self.operands(n, &ins_ids)?;
        let res = if op.is_collective() {
            None
        } else {
            let jit = match self.backend {
                Backend::Jit => dlrm_codegen::jit::try_eval(&op, &ins, &out_types, syms, &self.jit),
                Backend::Reference => None,
            };
            jit.or_else(|| dlrm_codegen::try_eval(&op, &ins, &out_types, syms))
        };
        let outs = match res {
            Some(r) => r.map_err(|e| self.node_err(n, self.with_table(&op, &ins_ids, e))),
            None => {
                let ctx = EvalCtx { syms, comm };
                eval_op(&op, &ins, &out_types, &ctx).map_err(|e| self.node_err(n, e))
            }
        }?;
        let cost = op_cost(&op, &ins, &outs.iter().collect::<Vec<_>>());
        Ok((outs, cost))
    }

    fn operands(&self, n: usize, ids: &[ValueId]) -> Result<Vec<&Tensor>> {
        ids.iter()
            .enumerate()
            .map(|(i, &v)| {
                self.value(v).ok_or_else(|| {
                    self.node_err(
                        n,
                        format!(
                            "operand {i} %{} has no value (moved or freed)",
                            self.graph.name_of(v)
                        ),
                    )
                })
            })
            .collect()
    }

    /// Runs an optimizer update in place on its parameter storage (operands
    /// `0..k`, moved when they die here, else copied), see the module docs.
    fn run_update(
        &mut self,
        n: usize,
        op: &Op,
        ids: &[ValueId],
        out_types: &[TensorType],
        syms: &HashMap<String, usize>,
        comm: &dyn Communicator,
    ) -> Result<(Vec<Tensor>, Cost)> {
        let k = dlrm_codegen::in_place_operands(op).unwrap_or(0);
        // The in-place kernels keep the storage's dtype; the declared results must too.
        let fits = k > 0
            && ids.len() > k
            && out_types.len() == k
            && (0..k).all(|i| self.value(ids[i]).map(|t| t.dtype()) == Some(out_types[i].dtype));
        if !fits {
            let ins = self.operands(n, ids)?;
            let ctx = EvalCtx { syms, comm };
            let outs = eval_op(op, &ins, out_types, &ctx).map_err(|e| self.node_err(n, e))?;
            let cost = op_cost(op, &ins, &outs.iter().collect::<Vec<_>>());
            return Ok((outs, cost));
        }
        let mut ws: Vec<Tensor> = Vec::with_capacity(k);
        for &w_id in &ids[..k] {
            let t = if self.may_move[n] {
                self.take(w_id)
            } else {
                self.value(w_id).cloned()
            };
            match t {
                Some(t) => ws.push(t),
                None => {
                    let err = self.node_err(
                        n,
                        format!("operand %{} has no value", self.graph.name_of(w_id)),
                    );
                    self.put_back_all(n, &ids[..ws.len()], ws);
                    return Err(err);
                }
            }
        }
        let rest = match self.operands(n, &ids[k..]) {
            Ok(r) => r,
            Err(e) => {
                self.put_back_all(n, &ids[..k], ws);
                return Err(e);
            }
        };
        let jit = (self.backend == Backend::Jit).then_some(&self.jit);
        let res = dlrm_codegen::update_in_place(op, &mut ws, &rest, jit).unwrap_or_else(|| {
            Err(dlrm_codegen::KernelError::Shape {
                op: op.mnemonic(),
                reason: format!("no in-place kernel for {} operands", ids.len()),
            })
        });
        let cost = {
            let mut all: Vec<&Tensor> = ws.iter().collect();
            all.extend(rest.iter().copied());
            op_cost(op, &all, &ws.iter().collect::<Vec<_>>())
        };
        match res {
            Ok(()) => Ok((ws, cost)),
            Err(e) => {
                let err = self.node_err(n, self.with_table(op, ids, e));
                // The kernels validate before writing: the storage is intact.
                self.put_back_all(n, &ids[..k], ws);
                Err(err)
            }
        }
    }

    /// A kernel error's text; for an index out of range in an embedding op, with
    /// the table's name (operand 0 of `embedding_bag`, `sparse_sgd`, the fused
    /// updates and their row-shard forms).
    fn with_table(&self, op: &Op, ids: &[ValueId], e: dlrm_codegen::KernelError) -> String {
        match (&e, op, ids.first()) {
            (
                dlrm_codegen::KernelError::IndexOutOfRange { .. },
                Op::EmbeddingBag { .. }
                | Op::EmbeddingBagWeighted
                | Op::SparseSgd { .. }
                | Op::EmbeddingUpdate { .. }
                | Op::SplitEmbeddingUpdate { .. }
                | Op::EmbeddingBagRows { .. }
                | Op::SparseSgdRows { .. }
                | Op::EmbeddingUpdateRows { .. }
                | Op::SplitEmbeddingUpdateRows { .. },
                Some(&t),
            ) => format!("table %{}: {e}", self.graph.name_of(t)),
            _ => e.to_string(),
        }
    }

    fn put_back_all(&mut self, n: usize, ids: &[ValueId], ts: Vec<Tensor>) {
        for (&v, t) in ids.iter().zip(ts) {
            self.put_back(n, v, t);
        }
    }

    fn put_back(&mut self, n: usize, v: ValueId, t: Tensor) {
        if !self.may_move[n] {
            return;
        }
        match self.graph.value(v).def {
            Def::Param(p) => self.params[p] = Some(t),
            _ => self.slots[v.index()] = Some(t),
        }
    }

    /// The last node that uses each value ([`usize::MAX`]: kept to the end of the
    /// step), for diagnostics and tests.
    pub fn last_uses(&self) -> &[usize] {
        &self.last_use
    }
}

/// Aborts the group when dropped during a panic of the computing thread, so that a
/// progress thread waiting in a collective is woken before the scope joins it.
struct AbortOnFailure<'a>(&'a dyn Communicator);

impl Drop for AbortOnFailure<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0
                .abort("panicked while its collectives were in flight");
        }
    }
}

fn fmt_syms(ty: &TensorType, syms: &HashMap<String, usize>) -> String {
    let mut parts: Vec<String> = Vec::new();
    for s in ty.shape.iter().flat_map(Dim::symbols) {
        let p = syms
            .get(s)
            .map_or_else(|| format!("{s} unbound"), |v| format!("{s}={v}"));
        if !parts.contains(&p) {
            parts.push(p);
        }
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" (with {})", parts.join(", "))
    }
}

pub(crate) fn stored_len(t: &Tensor) -> usize {
    match &t.data {
        dlrm_ir::Data::F32(v) => v.len(),
        dlrm_ir::Data::BF16(v) => v.len(),
        dlrm_ir::Data::I64(v) => v.len(),
        dlrm_ir::Data::I32(v) => v.len(),
    }
}
