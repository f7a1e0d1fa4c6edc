//! Overlap ([`Executor::set_overlap`], on by default): with more than one rank, a
//! progress thread ([`crate::progress`]) runs the collective nodes in issue order
//! while this thread goes on with the nodes that do not need their results; a node
//! that does waits for them. Here: handing a collective to the progress thread
//! (its operands moved when they die there, else copied), awaiting its results,
//! and waking the progress thread if the computing thread panics. Without overlap,
//! collectives run inline, as nodes ([`super::nodes`]).

use super::Executor;
use crate::error::Result;
use crate::progress::{Done, Request};
use dlrm_ir::{Communicator, Def};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::Instant;

impl Executor {
    /// Hands collective node `n` to the progress thread: operands that die here are
    /// moved, others copied.
    pub(super) fn start(
        &mut self,
        n: usize,
        tx: &Sender<Request>,
        replies: &mut BTreeMap<usize, Receiver<Done>>,
        in_flight: &mut [Option<usize>],
    ) -> Result<()> {
        let t0 = Instant::now();
        // The op and result types go to the progress thread; the rest is borrowed.
        let graph = Arc::clone(&self.graph);
        let node = &graph.nodes()[n];
        let (ids, outs) = (&node.inputs, &node.outputs);
        let (op, out_types) = (node.op.clone(), self.out_types[n].clone());
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
        for &v in outs {
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
    pub(super) fn finish(
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
}

/// Aborts the group when dropped during a panic of the computing thread, so that a
/// progress thread waiting in a collective is woken before the scope joins it.
pub(super) struct AbortOnFailure<'a>(pub(super) &'a dyn Communicator);

impl Drop for AbortOnFailure<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0
                .abort("panicked while its collectives were in flight");
        }
    }
}
