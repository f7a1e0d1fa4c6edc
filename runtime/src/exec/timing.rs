//! The executor's timers: a per-op-kind timer accumulates the wall time spent in
//! each mnemonic (the node's evaluation plus dropping the values whose last use it
//! is), and a per-node one the compute time of each node (collectives on the
//! progress thread excluded), with the work and traffic of each execution
//! ([`dlrm_codegen::work::op_cost`]) for GFLOP/s and GB/s. The collective time
//! ([`Executor::comm_times`]) is how long the collectives took and how much of
//! that the rank spent blocked.

use super::Executor;
use crate::progress::CommTimes;
use dlrm_codegen::work::Cost;
use serde::Serialize;
use std::time::Duration;

/// Time spent in one op kind, or in one node ([`Executor::node_times`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
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
    /// Total floating-point operations ([`dlrm_codegen::work`] conventions).
    pub flops: f64,
    /// Total bytes moved ([`dlrm_codegen::work`] conventions).
    pub bytes: f64,
    /// The part of `flops` in matrix products whose two matrix operands are
    /// bf16 ([`bf16_product`]): the products a CPU with bf16 dot-product
    /// instructions runs at its bf16 peak (the roofline's bound for them).
    pub bf16_flops: f64,
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

/// Per-op-kind (or per-node) accumulators: calls, time, work.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Acc {
    pub(super) calls: u64,
    pub(super) time: Duration,
    pub(super) cost: Cost,
    pub(super) bf16_flops: f64,
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
            bf16_flops: self.bf16_flops,
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

impl Executor {
    /// Collective time since construction (or the last reset).
    pub fn comm_times(&self) -> CommTimes {
        CommTimes {
            busy_s: self.comm_busy.as_secs_f64(),
            exposed_s: self.comm_exposed.as_secs_f64(),
        }
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
}

/// Whether node `n` of `graph` is a matrix product (the blocked GEMMs, with
/// the cross layers' fused forms, and `linear`'s three products) whose two
/// matrix operands, its first two, are both bf16.
pub(super) fn bf16_product(graph: &dlrm_ir::Graph, n: usize) -> bool {
    use dlrm_ir::{DType, Op};
    let node = &graph.nodes()[n];
    let product = matches!(
        node.op,
        Op::Brgemm { .. }
            | Op::BrgemmDgrad { .. }
            | Op::BrgemmWgrad { .. }
            | Op::Linear { .. }
            | Op::LinearDx
            | Op::LinearDw
    ) || ["cross_brgemm", "cross_brgemm_save", "cross_brgemm_dgrad"]
        .iter()
        .any(|m| node.op.is_module(m));
    product
        && node.inputs.len() >= 2
        && node.inputs[..2]
            .iter()
            .all(|&v| graph.ty(v).dtype == DType::BF16)
}
