//! One node. Each node runs with a codegen kernel ([`dlrm_codegen::try_eval_instance`];
//! with the JIT backend first [`dlrm_codegen::jit::try_eval_instance`], both on the
//! node's instance under the step's binding, `preflight`) when there is one,
//! else with the reference interpreter ([`dlrm_ir::interp::eval_op`]); collectives
//! always go through `eval_op` with the rank's communicator (here when they run
//! inline, else on the progress thread, [`super::collectives`]). The node's op,
//! operands and result types are borrowed from the graph; the step's learning
//! rate goes beside the op to the update kernels
//! ([`dlrm_codegen::update_in_place_instance`]), and into a copy of the op only
//! for an update without an instance or an in-place kernel.
//!
//! The kernel that answered a node (JIT, reference kernel or interpreter) and the
//! node's cost are kept per node ([`super::Resolved`]) until its instance is rebuilt
//! under a new binding or the backend changes: later steps call that kernel
//! directly and do not recompute the cost.
//!
//! Optimizer updates (`sgd`, `split_sgd`, `sparse_sgd`, `embedding_update`,
//! `split_embedding_update`) run *in place* on the parameter storage
//! ([`dlrm_codegen::update_in_place_instance`] on the node's instance: a JIT
//! kernel with the JIT backend, else the reference kernel): when an update node is
//! the last use of its parameter(s) (both halves for the Split-SGD-BF16 ops) and
//! the graph's update list gives them new values, the parameters' tensors are
//! moved into the node's results, updated there, and moved back into the parameter
//! slots by the update list at the end of the step — no copy of a table per step. (An update chain
//! `t1 = sparse_sgd(t, ..); t2 = sparse_sgd(t1, ..)` moves the same storage along.)
//! Otherwise the operand is copied first, which is always correct.

use super::{Backend, Executor, Resolved, Route};
use crate::error::Result;
use dlrm_codegen::reference::KResult;
use dlrm_codegen::work::{Cost, op_cost};
use dlrm_ir::interp::{EvalCtx, eval_op};
use dlrm_ir::{Communicator, Def, NodeInstance, Op, Tensor, TensorType, ValueId};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

/// An in-place update's run: its storage, its result and its cost (`None`
/// when its operands were missing).
pub(super) struct Updated {
    ws: Vec<Tensor>,
    res: Result<()>,
    cost: Option<Cost>,
}

/// A node's evaluation: its results, cost and the kernel that answered.
pub(super) struct Ran {
    outs: Vec<Tensor>,
    cost: Cost,
    route: Route,
}

impl Executor {
    pub(super) fn run_node(
        &mut self,
        n: usize,
        syms: &HashMap<String, usize>,
        comm: &dyn Communicator,
    ) -> Result<(Vec<Tensor>, Cost)> {
        // Borrowed from the shared graph: no copy of the node per step.
        let (graph, out_types) = (Arc::clone(&self.graph), Arc::clone(&self.out_types));
        let (node, out_types) = (&graph.nodes()[n], &out_types[n][..]);
        let (op, ins_ids) = (&node.op, &node.inputs[..]);
        if op.is_update() {
            return self.run_update(n, op, ins_ids, out_types, syms, comm);
        }
        match self.eval_node(n, syms, Some(comm))? {
            Some(ran) => Ok(self.resolve(n, ran)),
            None => Err(self.node_err(n, "internal: the interpreter did not run".into())),
        }
    }

    /// Evaluates node `n` (not an update) on its operands: its kernel, else
    /// the interpreter with `comm`; `None` when no kernel answers and there is
    /// no `comm` (the caller runs the node itself). Reads the executor only, so
    /// that independent nodes may run side by side.
    pub(super) fn eval_node(
        &self,
        n: usize,
        syms: &HashMap<String, usize>,
        comm: Option<&dyn Communicator>,
    ) -> Result<Option<Ran>> {
        let (node, out_types) = (&self.graph.nodes()[n], &self.out_types[n][..]);
        let (op, ins_ids) = (&node.op, &node.inputs[..]);
        let known = self.resolved.get(n).copied().unwrap_or_default();
        let ins = self.operands(n, ins_ids)?;
        let inst = self.instances.1.get(n).and_then(Option::as_ref);
        let (res, route) = if op.is_collective() {
            (None, Route::Interp)
        } else {
            self.kernel(known.route, op, inst, &ins, out_types, syms)
        };
        let outs = match (res, comm) {
            (Some(r), _) => r.map_err(|e| self.node_err(n, self.with_table(op, ins_ids, e))),
            (None, Some(comm)) => {
                let ctx = EvalCtx { syms, comm };
                eval_op(op, &ins, out_types, &ctx).map_err(|e| self.node_err(n, e))
            }
            (None, None) => return Ok(None),
        }?;
        let cost = known
            .cost
            .unwrap_or_else(|| op_cost(op, &ins, &outs.iter().collect::<Vec<_>>()));
        Ok(Some(Ran { outs, cost, route }))
    }

    /// Keeps node `n`'s route and cost for the next steps; returns its results
    /// and cost.
    pub(super) fn resolve(&mut self, n: usize, ran: Ran) -> (Vec<Tensor>, Cost) {
        if let Some(r) = self.resolved.get_mut(n) {
            *r = Resolved {
                route: ran.route,
                cost: Some(ran.cost),
            };
        }
        (ran.outs, ran.cost)
    }

    /// Whether node `n` ran with a kernel under the instances' binding (so it
    /// runs without the interpreter, and without a communicator).
    pub(super) fn kernel_resolved(&self, n: usize) -> bool {
        self.resolved
            .get(n)
            .is_some_and(|r| matches!(r.route, Route::Jit | Route::Reference))
    }

    /// The node's kernel: by `route` when it was resolved on an earlier run, else
    /// the JIT (with that backend), then the reference kernel; `None` for the
    /// interpreter. Returns the route that answered. On an instance under the
    /// step's binding the call checks its operands against it, and the kernels
    /// re-derive no shape; without one the call verifies the operands it is given.
    fn kernel(
        &self,
        route: Route,
        op: &Op,
        inst: Option<&NodeInstance>,
        ins: &[&Tensor],
        out_types: &[TensorType],
        syms: &HashMap<String, usize>,
    ) -> (Option<KResult<Vec<Tensor>>>, Route) {
        let jit = || match (self.backend, inst) {
            (Backend::Reference, _) => None,
            (Backend::Jit, Some(inst)) => {
                dlrm_codegen::jit::try_eval_instance(inst, ins, out_types, syms, &self.jit)
            }
            (Backend::Jit, None) => {
                dlrm_codegen::jit::try_eval(op, ins, out_types, syms, &self.jit)
            }
        };
        let reference = || match inst {
            Some(inst) => dlrm_codegen::try_eval_instance(inst, ins, out_types, syms),
            None => dlrm_codegen::try_eval(op, ins, out_types, syms),
        };
        // A resolved route that no longer answers falls through to the rest.
        if route == Route::Interp {
            return (None, Route::Interp);
        }
        if matches!(route, Route::Unknown | Route::Jit)
            && let Some(r) = jit()
        {
            return (Some(r), Route::Jit);
        }
        match reference() {
            Some(r) => (Some(r), Route::Reference),
            None => (None, Route::Interp),
        }
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
    /// `0..k`, moved when they die here, else copied), see the module docs. `op`
    /// is the graph's; the step's learning rate goes beside it to the kernels.
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
        if !self.updates_in_place(n) {
            // The op with the step's rate.
            let with_lr = match self.lr {
                Some(lr) => Cow::Owned(op.with_lr(lr)),
                None => Cow::Borrowed(op),
            };
            let ins = self.operands(n, ids)?;
            let ctx = EvalCtx { syms, comm };
            let outs = eval_op(&with_lr, &ins, out_types, &ctx).map_err(|e| self.node_err(n, e))?;
            let cost = op_cost(op, &ins, &outs.iter().collect::<Vec<_>>());
            return Ok((outs, cost));
        }
        let ws = self.take_storage(n, &ids[..k])?;
        let done = self.update_kernel(n, ws);
        self.finish_update(n, done)
    }

    /// Whether update node `n` runs in place on its storage operands (see
    /// [`Executor::run_update`]).
    pub(super) fn updates_in_place(&self, n: usize) -> bool {
        let (node, out_types) = (&self.graph.nodes()[n], &self.out_types[n][..]);
        let ids = &node.inputs[..];
        let k = dlrm_codegen::in_place_operands(&node.op).unwrap_or(0);
        k > 0
            && ids.len() > k
            && out_types.len() == k
            && (0..k).all(|i| self.value(ids[i]).map(|t| t.dtype()) == Some(out_types[i].dtype))
    }

    /// The storage operands `ids` of update node `n`: moved out when they die
    /// there, else copied; on an error, those taken are put back.
    pub(super) fn take_storage(&mut self, n: usize, ids: &[ValueId]) -> Result<Vec<Tensor>> {
        let mut ws: Vec<Tensor> = Vec::with_capacity(ids.len());
        for &w_id in ids {
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
        Ok(ws)
    }

    /// Runs update node `n`'s in-place kernel on its storage `ws` (taken by
    /// [`Executor::take_storage`]) and its other operands. Reads the executor
    /// only, so that updates of different tables may run side by side.
    pub(super) fn update_kernel(&self, n: usize, mut ws: Vec<Tensor>) -> Updated {
        let op = &self.graph.nodes()[n].op;
        let ids = &self.graph.nodes()[n].inputs[..];
        let k = ws.len();
        let rest = match self.operands(n, &ids[k..]) {
            Ok(r) => r,
            Err(e) => {
                return Updated {
                    ws,
                    res: Err(e),
                    cost: None,
                };
            }
        };
        let jit = (self.backend == Backend::Jit).then_some(&self.jit);
        // The node's instance under this binding (the step's rate replaces the
        // op's); without one, the call verifies the operands it is given.
        let res = match self.instances.1.get(n).and_then(Option::as_ref) {
            Some(inst) => {
                dlrm_codegen::update_in_place_instance(inst, self.lr, &mut ws, &rest, jit)
            }
            None => {
                let op = match self.lr {
                    Some(lr) => Cow::Owned(op.with_lr(lr)),
                    None => Cow::Borrowed(op),
                };
                dlrm_codegen::update_in_place(&op, &mut ws, &rest, jit)
            }
        }
        .unwrap_or_else(|| {
            Err(dlrm_codegen::KernelError::Shape {
                op: op.mnemonic(),
                reason: format!("no in-place kernel for {} operands", ids.len()),
            })
        })
        .map_err(|e| self.node_err(n, self.with_table(op, ids, e)));
        let cost = self
            .resolved
            .get(n)
            .and_then(|r| r.cost)
            .unwrap_or_else(|| {
                let mut all: Vec<&Tensor> = ws.iter().collect();
                all.extend(rest.iter().copied());
                op_cost(op, &all, &ws.iter().collect::<Vec<_>>())
            });
        Updated {
            ws,
            res,
            cost: Some(cost),
        }
    }

    /// The end of an in-place update: its cost kept for the next steps, and
    /// the updated storage as its results; on an error the storage (intact:
    /// the kernels validate before writing) is put back.
    pub(super) fn finish_update(&mut self, n: usize, done: Updated) -> Result<(Vec<Tensor>, Cost)> {
        let Updated { ws, res, cost } = done;
        if let (Some(r), Some(c)) = (self.resolved.get_mut(n), cost) {
            r.cost = Some(c);
        }
        match res {
            Ok(()) => Ok((ws, cost.unwrap_or_default())),
            Err(e) => {
                let k = ws.len();
                let ids = self.graph.nodes()[n].inputs[..k].to_vec();
                self.put_back_all(n, &ids, ws);
                Err(e)
            }
        }
    }

    /// A kernel error's text; for an index out of range in an embedding op, with
    /// the table's name (operand 0 of `embedding_bag`, `sparse_sgd`, the fused
    /// updates and their row-shard forms).
    fn with_table(&self, op: &Op, ids: &[ValueId], e: dlrm_codegen::KernelError) -> String {
        let on_table = op.bag_form().is_some()
            || matches!(
                op,
                Op::SparseSgd { .. }
                    | Op::EmbeddingUpdate { .. }
                    | Op::SplitEmbeddingUpdate { .. }
                    | Op::EmbeddingBagRows { .. }
                    | Op::SparseSgdRows { .. }
                    | Op::EmbeddingUpdateRows { .. }
                    | Op::SplitEmbeddingUpdateRows { .. }
            );
        match (&e, ids.first()) {
            (dlrm_codegen::KernelError::IndexOutOfRange { .. }, Some(&t)) if on_table => {
                format!("table %{}: {e}", self.graph.name_of(t))
            }
            _ => e.to_string(),
        }
    }

    pub(super) fn put_back_all(&mut self, n: usize, ids: &[ValueId], ts: Vec<Tensor>) {
        for (&v, t) in ids.iter().zip(ts) {
            self.put_back(n, v, t);
        }
    }

    fn put_back(&mut self, n: usize, v: ValueId, t: Tensor) {
        if !self.may_move[n] {
            return;
        }
        match self.graph.value(v).def {
            Def::Param(p) => self.params[p] = Some(Arc::new(t)),
            _ => self.slots[v.index()] = Some(t),
        }
    }
}
