//! Collectives in flight: while a rank computes, a progress thread runs its
//! collective nodes (SC20's "framework MPI progression", Aluminum's overlap).
//!
//! The executor hands each collective node, with its operands, to [`serve`] when the
//! node is reached in the (scheduled, see `dlrm_passes::schedule`) order, and waits
//! for the results only when a later node uses them. [`serve`] runs the requests one
//! at a time in issue order, so every rank still issues its collectives in the same
//! order; the semantics are the interpreter's (`dlrm_ir::interp::eval_op`), exactly
//! as without overlap.
//!
//! Failure: a request that fails returns its error to the waiting node; the executor
//! aborts the group when its own thread fails, which wakes a progress thread blocked
//! in a collective, so no rank hangs (see `Executor::step`).

use dlrm_codegen::work::{Cost, op_cost};
use dlrm_ir::interp::{EvalCtx, eval_op};
use dlrm_ir::{Communicator, Op, Tensor, TensorType};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant};

/// A collective node handed to the progress thread.
pub(crate) struct Request {
    pub op: Op,
    pub ins: Vec<Tensor>,
    pub out_types: Vec<TensorType>,
    pub reply: Sender<Done>,
}

/// A finished collective.
pub(crate) struct Done {
    pub outs: std::result::Result<Vec<Tensor>, String>,
    pub cost: Cost,
    /// Time the collective took on the progress thread.
    pub busy: Duration,
}

/// Runs the requests of one step in order until the sender is dropped.
pub(crate) fn serve(rx: Receiver<Request>, syms: &HashMap<String, usize>, comm: &dyn Communicator) {
    let ctx = EvalCtx { syms, comm };
    for req in rx {
        let t0 = Instant::now();
        let refs: Vec<&Tensor> = req.ins.iter().collect();
        let outs = eval_op(&req.op, &refs, &req.out_types, &ctx);
        let cost = match &outs {
            Ok(o) => op_cost(&req.op, &refs, &o.iter().collect::<Vec<_>>()),
            Err(_) => Cost::default(),
        };
        // The executor may have stopped waiting (it failed): nothing to deliver.
        let _ = req.reply.send(Done {
            outs,
            cost,
            busy: t0.elapsed(),
        });
    }
}

/// Where a rank's collective time went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CommTimes {
    /// Seconds the collectives took (in flight, on the progress thread or inline).
    pub busy_s: f64,
    /// Seconds the rank's compute thread was blocked on them (the exposed part).
    pub exposed_s: f64,
}

impl CommTimes {
    /// The fraction of collective time hidden behind compute (0 without overlap).
    pub fn hidden_fraction(&self) -> f64 {
        if self.busy_s > 0.0 {
            ((self.busy_s - self.exposed_s) / self.busy_s).clamp(0.0, 1.0)
        } else {
            0.0
        }
    }
}
