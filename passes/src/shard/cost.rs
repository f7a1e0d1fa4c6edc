//! The cost model of one training (or inference) step on N ranks: compute from
//! op FLOPs and bytes at a stated machine rate (roofline: the larger of the two
//! times), communication from an alpha-beta network model.
//!
//! Per iteration, with global batch `G`, `R` ranks and local batch `B = G/R`; a
//! table has `rows`, width `D`, `e` bytes per element, `L` lookups per sample (over
//! its `nb` bags) and a shard of it holds the fraction `f` of its rows:
//! - lookup (forward, on the holder, for all `G` samples): `f·G·L·D·e` row bytes
//!   read, `G·L·8` index bytes, `G·nb·D·4` output bytes; `f·G·L·D` flops;
//! - update (training): the row gradients `G·L·D·4` written and read (the bag
//!   gradient is materialised for every index, a shard skips the rows it does not
//!   hold) and `2·f·G·L·D·e` row bytes (the runtime updates the table in place:
//!   no copy of the shard); `2·f·G·L·D` flops;
//! - data-parallel tables: the lookup for the `B` local samples, the dense gradient
//!   (`rows·D·4` written, `B·L·D·4` added), its all-reduce and a dense `sgd`
//!   (`3·rows·D·e` bytes) on every rank;
//! - `all_to_all` (per direction; training has the forward scatter and the backward
//!   gather): `α·(R-1) + max(sent, received)/β` on each rank, a holder sending
//!   `(G-B)·D·4` per bag it looks up and receiving `B·D·4` for every other bag;
//! - `all_reduce` of `n` bytes: the faster of ring (`2(R-1)·α + 2(R-1)/R·n/β`) and
//!   recursive doubling (`⌈log2 R⌉·(α + n/β)`), as Aluminum chooses by size; one
//!   per dense gradient tensor, plus the loss;
//! - dense part (data parallel, every rank): its FLOPs per sample × `B` at the
//!   machine's rate, plus its parameters read and written (`bwd`+`sgd`: 6× their
//!   bytes in training, 1× in inference) at the memory rate.
//!
//! A rank's time is the sum of its parts (no overlap: collectives are blocking).

use super::{PlannerOptions, parse_pair};
use crate::partition::TableInfo;
use crate::{Result, stats};
use dlrm_ir::{Def, Graph, Op};
use serde::{Deserialize, Serialize};

/// The network: alpha-beta model.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Network {
    /// Per-message latency (alpha), microseconds.
    pub latency_us: f64,
    /// Bandwidth (1/beta), GB/s (10^9 bytes per second) per rank.
    pub gbps: f64,
}

impl Default for Network {
    /// 2 µs, 12.5 GB/s: a 100 Gb/s fabric (InfiniBand EDR class).
    fn default() -> Network {
        Network {
            latency_us: 2.0,
            gbps: 12.5,
        }
    }
}

impl Network {
    /// Parses `latency_us,GBps`, e.g. `2,12.5`.
    pub fn parse(s: &str) -> Result<Network> {
        let (latency_us, gbps) = parse_pair(s, "--network", "2,12.5 (latency µs, GB/s)")?;
        Ok(Network { latency_us, gbps })
    }

    fn alpha(&self) -> f64 {
        self.latency_us * 1e-6
    }

    fn beta(&self) -> f64 {
        1.0 / (self.gbps * 1e9)
    }
}

/// One rank's compute rates.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// Sustained GFLOP/s of one rank (dense GEMM-dominated work).
    pub gflops: f64,
    /// Sustained memory bandwidth of one rank, GB/s (embedding gathers, updates).
    pub mem_gbps: f64,
}

impl Default for Machine {
    /// 20 GFLOP/s and 4 GB/s: one core of the development machine (2-core x86-64
    /// AVX2+FMA) running dlrmc's kernels, calibrated with `dlrm-run --bench`
    /// (docs/planner.md, "Sharding planner").
    fn default() -> Machine {
        Machine {
            gflops: 20.0,
            mem_gbps: 4.0,
        }
    }
}

impl Machine {
    /// Parses `GFLOPs,GBps`, e.g. `20,4`.
    pub fn parse(s: &str) -> Result<Machine> {
        let (gflops, mem_gbps) = parse_pair(s, "--machine", "20,4 (GFLOP/s, GB/s)")?;
        if gflops <= 0.0 {
            return Err(crate::PassError::Arg {
                pass: super::ID.to_string(),
                reason: format!("--machine `{s}`: GFLOP/s must be positive"),
            });
        }
        Ok(Machine { gflops, mem_gbps })
    }

    /// Roofline time of `flops` and `bytes`.
    pub fn time(&self, flops: f64, bytes: f64) -> f64 {
        (flops / (self.gflops * 1e9)).max(bytes / (self.mem_gbps * 1e9))
    }
}

/// The dense (data-parallel) part of a model, for predictions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DenseProfile {
    /// FLOPs per sample of every non-embedding op (forward, and backward in a
    /// training graph).
    pub flops_per_sample: f64,
    /// Bytes of the dense (non-table) parameters.
    pub param_bytes: f64,
    /// Bytes of each dense gradient all-reduced per step (training), in graph order.
    pub grad_bytes: Vec<f64>,
    /// True for a training graph.
    pub train: bool,
}

impl DenseProfile {
    /// The dense profile of an unpartitioned graph.
    pub fn of(g: &Graph) -> DenseProfile {
        let mut p = DenseProfile::default();
        let mut table = vec![false; g.values().len()];
        for node in g.nodes() {
            let table_op = matches!(
                node.op,
                Op::EmbeddingBag { .. } | Op::SparseSgd { .. } | Op::SparseAdagrad { .. }
            ) || node.op.bag_update().is_some();
            if table_op {
                table[node.inputs[0].index()] = true;
                // A low half or an accumulator is table state too.
                for (k, _) in node.op.state_operands() {
                    table[node.inputs[k].index()] = true;
                }
            }
        }
        for (n, node) in g.nodes().iter().enumerate() {
            let sparse = matches!(
                node.op,
                Op::EmbeddingBag { .. }
                    | Op::EmbeddingBagGrad { .. }
                    | Op::SparseSgd { .. }
                    | Op::SparseAdagrad { .. }
            ) || node.op.bag_update().is_some();
            if !sparse {
                p.flops_per_sample += stats::node_flops(g, n);
            }
            if let Some(k) = node.op.dense_grad_operand() {
                p.train = true;
                p.grad_bytes.push(bytes_of(g, node.inputs[k]));
            } else if node.op.is_update() {
                p.train = true;
            }
        }
        for &v in g.params() {
            if !table[v.index()] && matches!(g.value(v).def, Def::Param(_)) {
                p.param_bytes += bytes_of(g, v);
            }
        }
        p
    }
}

/// Bytes of a value with fixed dims (symbols as 1).
fn bytes_of(g: &Graph, v: dlrm_ir::ValueId) -> f64 {
    let t = g.ty(v);
    let n: f64 = t
        .shape
        .iter()
        .map(|d| d.fixed().unwrap_or(1) as f64)
        .product();
    n * t.dtype.size_bytes() as f64
}

/// The cost model for one rank count and global batch.
#[derive(Clone, Debug)]
pub struct CostModel {
    /// The options (ranks, batch, rates).
    pub opts: PlannerOptions,
    /// Training step (updates, backward exchange) or inference.
    pub train: bool,
}

impl CostModel {
    /// The model for `opts`, for a training step or an inference step.
    pub fn new(opts: PlannerOptions, train: bool) -> CostModel {
        CostModel { opts, train }
    }

    fn g(&self) -> f64 {
        self.opts.global_batch as f64
    }

    fn b(&self) -> f64 {
        self.g() / self.opts.ranks.max(1) as f64
    }

    fn r(&self) -> f64 {
        self.opts.ranks.max(1) as f64
    }

    /// Seconds one holder of the fraction `f` of `t`'s rows spends looking up (and,
    /// in training, updating) for the whole global batch.
    pub fn shard_compute(&self, t: &TableInfo, f: f64) -> f64 {
        let m = &self.opts.machine;
        let (g, l, d, e) = (
            self.g(),
            t.lookups_per_sample as f64,
            t.dim as f64,
            t.elem_bytes as f64,
        );
        let nb = t.bags.max(1) as f64;
        let fwd = m.time(
            f * g * l * d,
            f * g * l * d * e + g * l * 8.0 + g * nb * d * 4.0,
        );
        if !self.train {
            return fwd;
        }
        let bwd = m.time(
            2.0 * f * g * l * d,
            2.0 * g * l * d * 4.0 + 2.0 * f * g * l * d * e + g * nb * d * 4.0 + g * l * 8.0,
        );
        fwd + bwd
    }

    /// Bytes one holder of a table-wise or row-wise unit of `t` sends per exchange.
    pub fn unit_send_bytes(&self, t: &TableInfo) -> f64 {
        (self.g() - self.b()) * t.bags.max(1) as f64 * t.dim as f64 * 4.0
    }

    /// Bytes a rank receives per exchange for each bag of `t` it does not hold.
    pub fn unit_recv_bytes(&self, t: &TableInfo) -> f64 {
        self.b() * t.bags.max(1) as f64 * t.dim as f64 * 4.0
    }

    /// Exchanges per step: 2 in training (scatter, gather), 1 in inference.
    pub fn exchanges(&self) -> f64 {
        if self.train { 2.0 } else { 1.0 }
    }

    /// Seconds of the `all_to_all`s of one rank that sends `sent` and receives
    /// `received` bytes per exchange (0 on one rank or with nothing to exchange).
    pub fn all_to_all(&self, sent: f64, received: f64) -> f64 {
        if self.opts.ranks <= 1 || (sent <= 0.0 && received <= 0.0) {
            return 0.0;
        }
        let n = &self.opts.network;
        self.exchanges() * (n.alpha() * (self.r() - 1.0) + sent.max(received) * n.beta())
    }

    /// Seconds of one `all_reduce` of `bytes` (0 on one rank).
    pub fn all_reduce(&self, bytes: f64) -> f64 {
        if self.opts.ranks <= 1 {
            return 0.0;
        }
        let n = &self.opts.network;
        let r = self.r();
        let ring = 2.0 * (r - 1.0) * n.alpha() + 2.0 * (r - 1.0) / r * bytes * n.beta();
        let doubling = r.log2().ceil() * (n.alpha() + bytes * n.beta());
        ring.min(doubling)
    }

    /// Seconds every rank spends on a data-parallel (replicated) `t`: local lookups,
    /// and in training the dense gradient, its all-reduce and the `sgd`. Returns
    /// `(compute, communication)`.
    pub fn replicated(&self, t: &TableInfo) -> (f64, f64) {
        let m = &self.opts.machine;
        let (b, l, d, e) = (
            self.b(),
            t.lookups_per_sample as f64,
            t.dim as f64,
            t.elem_bytes as f64,
        );
        let nb = t.bags.max(1) as f64;
        let fwd = m.time(b * l * d, b * l * d * e + b * l * 8.0 + b * nb * d * 4.0);
        if !self.train {
            return (fwd, 0.0);
        }
        let rows = t.rows as f64;
        let grad = m.time(b * l * d, rows * d * 4.0 + 2.0 * b * l * d * 4.0);
        let sgd = m.time(2.0 * rows * d, 3.0 * rows * d * e);
        (fwd + grad + sgd, self.all_reduce(rows * d * 4.0))
    }

    /// Seconds every rank spends on the dense part: `(compute, communication)`.
    pub fn dense(&self, p: &DenseProfile) -> (f64, f64) {
        let m = &self.opts.machine;
        let passes = if self.train { 6.0 } else { 1.0 };
        let compute = m.time(p.flops_per_sample * self.b(), passes * p.param_bytes);
        if !self.train {
            return (compute, 0.0);
        }
        // The gradients, then the loss (4 bytes).
        let comm = p
            .grad_bytes
            .iter()
            .map(|&n| self.all_reduce(n))
            .sum::<f64>()
            + self.all_reduce(4.0);
        (compute, comm)
    }
}
