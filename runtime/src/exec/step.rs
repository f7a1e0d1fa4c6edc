//! One step ([`Executor::step`]): the step's buffers are checked and its inputs
//! bound ([`super::preflight`]), every node is evaluated in order — each node's
//! values dropped after their last use, collectives handed to the progress thread
//! when they overlap ([`super::collectives`]), runs of independent bag forwards
//! (once their kernels are known) and of in-place updates side by side (one
//! parallel loop for the run, not one per table: dlrm-small's 8 bags at batch
//! 2048 took 0.34-0.36 ms a step instead of 0.43-0.46, dlrm-mlperf's 26 table
//! updates 2.2 ms instead of 2.6, `dlrm-run --bench`, 2026-11-29, AMD EPYC Zen 5
//! class, 2 threads, interleaved) — then the outputs are taken (copied
//! when an update or a later output still needs the value) and the update list's
//! new values move into the parameter slots. After a failed step the executor
//! refuses to run again (its parameters may have been moved out mid-step).

use super::Executor;
use super::collectives::AbortOnFailure;
use crate::error::{Result, RuntimeError};
use crate::progress::{self, Done, Request};
use dlrm_ir::{Communicator, Def, Op, Tensor, ValueId};
use rayon::prelude::*;
use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant};

impl Executor {
    /// Runs one step: binds `inputs` (exactly the graph's inputs), evaluates every
    /// node, applies the updates to the parameters, and returns the outputs in
    /// order. `syms` must bind every symbol the graph uses. The step's buffers are
    /// checked first ([`Executor::check_buffers`]), and the nodes instantiated for
    /// `syms` ([`Executor::instantiate`]).
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
        let result = self.check_buffers(syms).and_then(|()| {
            self.instantiate(syms);
            self.run_step(inputs, syms, comm)
        });
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
                self.params[p] = Some(std::sync::Arc::new(t));
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
        let mut n = 0;
        while n < self.graph.nodes().len() {
            let end = self.side_by_side(n);
            for m in n..end {
                for i in 0..self.graph.nodes()[m].inputs.len() {
                    let v = self.graph.nodes()[m].inputs[i];
                    if let Some(c) = in_flight[v.index()] {
                        self.finish(c, &mut replies, &mut in_flight)?;
                    }
                }
            }
            if end > n + 1 {
                if self.graph.nodes()[n].op.is_update() {
                    self.update_side_by_side(n..end)?;
                } else {
                    self.run_side_by_side(n..end, syms, comm)?;
                }
                n = end;
                continue;
            }
            if let (Some(tx), true) = (progress, self.graph.nodes()[n].op.is_collective()) {
                self.start(n, tx, &mut replies, &mut in_flight)?;
                n += 1;
                continue;
            }
            let t0 = Instant::now();
            let (outs, cost) = self.run_node(n, syms, comm)?;
            self.store(n, outs)?;
            self.account(n, t0.elapsed(), cost);
            n += 1;
        }
        while let Some((&c, _)) = replies.first_key_value() {
            self.finish(c, &mut replies, &mut in_flight)?;
        }
        Ok(())
    }

    /// The end of the run of nodes from `n` that may run side by side, one
    /// kind of node in a run: bag forwards already resolved to a kernel, or
    /// optimizer updates in place (a table update takes some tens of
    /// microseconds at serving and training batches, much of it the start and
    /// end of its parallel loop; or a layer's weight and bias). A node joins
    /// when it reads no result of the run's nodes and, for updates, shares no
    /// value with them where either side updates it (its storage operands).
    /// `n + 1` when there is no such run.
    fn side_by_side(&self, n: usize) -> usize {
        let nodes = self.graph.nodes();
        let kind = |m: usize| match nodes[m].op {
            Op::EmbeddingBag { .. } | Op::EmbeddingBagRows { .. } | Op::EmbeddingBagWeighted
                if self.kernel_resolved(m) =>
            {
                Some(false)
            }
            ref op if op.is_update() && self.updates_in_place(m) => Some(true),
            _ => None,
        };
        // The operands an update node writes (none for a bag).
        let storage = |m: usize| {
            let k = dlrm_codegen::in_place_operands(&nodes[m].op).unwrap_or(0);
            &nodes[m].inputs[..k.min(nodes[m].inputs.len())]
        };
        let Some(first) = kind(n) else {
            return n + 1;
        };
        let independent = |end: usize| {
            let ins = &nodes[end].inputs;
            (n..end).all(|k| {
                !ins.iter().any(|v| nodes[k].outputs.contains(v))
                    && !storage(end).iter().any(|v| nodes[k].inputs.contains(v))
                    && !storage(k).iter().any(|v| ins.contains(v))
            })
        };
        let mut end = n + 1;
        while end < nodes.len() && kind(end) == Some(first) && independent(end) {
            end += 1;
        }
        end
    }

    /// Runs the in-place updates `run` side by side: each one's storage taken
    /// in turn ([`Executor::take_storage`]), the kernels one rayon task each,
    /// then each one's end in turn ([`Executor::finish_update`]); timed as
    /// [`Executor::run_side_by_side`]. On an error the other updates still
    /// end (their results stored, or their storage put back) before the
    /// first error returns.
    fn update_side_by_side(&mut self, run: std::ops::Range<usize>) -> Result<()> {
        let t0 = Instant::now();
        let mut taken = Vec::with_capacity(run.len());
        for m in run {
            let node = &self.graph.nodes()[m];
            let k = dlrm_codegen::in_place_operands(&node.op).unwrap_or(0);
            let ids = node.inputs[..k].to_vec();
            match self.take_storage(m, &ids) {
                Ok(ws) => taken.push((m, ws)),
                Err(e) => {
                    for (m, ws) in taken {
                        let ids = self.graph.nodes()[m].inputs[..ws.len()].to_vec();
                        self.put_back_all(m, &ids, ws);
                    }
                    return Err(e);
                }
            }
        }
        let this = &*self;
        let done: Vec<(usize, super::nodes::Updated, Duration)> = taken
            .into_par_iter()
            .map(|(m, ws)| {
                let t = Instant::now();
                (m, this.update_kernel(m, ws), t.elapsed())
            })
            .collect();
        let wall = t0.elapsed();
        let own: Duration = done.iter().map(|d| d.2).sum();
        let mut first_err = None;
        for (m, d, t) in done {
            let stored = self
                .finish_update(m, d)
                .and_then(|(outs, cost)| self.store(m, outs).map(|()| cost));
            match stored {
                Ok(cost) => self.account(m, share_of(wall, t, own), cost),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Runs nodes `run` side by side, one rayon task each (each kernel's own
    /// parallel loop inside it, so idle threads take its blocks): one start and
    /// end of a parallel loop for the run, not one per node. Each node's time
    /// is its share of the run's, in proportion to its own. A node whose
    /// kernel no longer answers runs after the others, on its own, as
    /// [`Executor::run_node`] runs it.
    fn run_side_by_side(
        &mut self,
        run: std::ops::Range<usize>,
        syms: &HashMap<String, usize>,
        comm: &dyn Communicator,
    ) -> Result<()> {
        let t0 = Instant::now();
        let this = &*self;
        let ran: Vec<(Result<Option<super::nodes::Ran>>, Duration)> = run
            .clone()
            .into_par_iter()
            .map(|m| {
                let t = Instant::now();
                (this.eval_node(m, syms, None), t.elapsed())
            })
            .collect();
        let wall = t0.elapsed();
        let own: Duration = ran.iter().map(|(_, t)| *t).sum();
        for (m, (r, t)) in run.zip(ran) {
            let ((outs, cost), took) = match r? {
                Some(ran) => (self.resolve(m, ran), share_of(wall, t, own)),
                None => {
                    let t0 = Instant::now();
                    let done = self.run_node(m, syms, comm)?;
                    (done, t0.elapsed())
                }
            };
            self.store(m, outs)?;
            self.account(m, took, cost);
        }
        Ok(())
    }

    /// Puts node `n`'s results into their slots and drops the values whose
    /// last use it was.
    fn store(&mut self, n: usize, outs: Vec<Tensor>) -> Result<()> {
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
        for i in 0..self.free_after[n].len() {
            let v = self.free_after[n][i];
            self.slots[v.index()] = None;
        }
        Ok(())
    }

    /// Adds node `n`'s time `took` and `cost` to its op's and its own timers.
    fn account(&mut self, n: usize, took: Duration, cost: dlrm_codegen::work::Cost) {
        let mnemonic = self.graph.nodes()[n].op.mnemonic();
        let bf16_flops = if super::timing::bf16_product(&self.graph, n) {
            cost.flops
        } else {
            0.0
        };
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
            e.bf16_flops += bf16_flops;
        }
    }
}

/// A node's share of a side-by-side run's `wall` time: in proportion to its
/// own time `t` of the run's total `own`.
fn share_of(wall: Duration, t: Duration, own: Duration) -> Duration {
    if own.is_zero() {
        Duration::ZERO
    } else {
        wall.mul_f64(t.as_secs_f64() / own.as_secs_f64())
    }
}
