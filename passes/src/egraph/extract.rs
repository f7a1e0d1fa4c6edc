//! The extraction cost model: estimated time of every e-node, so that the
//! extracted graph is the cheapest one in the e-graph, not the first one found.
//!
//! `time(node) = overhead + flops / (gflops · efficiency(op)) + bytes / bandwidth`
//! (in ns), where
//! - `flops` are those of [`crate::stats`] for the IR ops; for the blocked ops they
//!   are counted on the *padded* sizes (padding is wasted work);
//! - `efficiency` is `blocked_eff` for the brgemm family (blocks stay in cache),
//!   `plain_eff` for `linear` and its gradients (strided, re-read weights), 1 for
//!   the rest (memory bound: their bytes dominate);
//! - `bytes` = operands + results, dtype-aware (bf16 moves half of f32);
//! - each `exp`/`ln` counts `transcendental` flops: a sigmoid (op or epilogue)
//!   one per element, `bce` three (two clamped logs), `bce_logits` two (a module
//!   op's flops are its own work count, `OpModule::work`);
//! - symbolic dimensions (`B`, `G`, bag sizes) are taken as `batch`;
//! - `matmul` counts `2·M·N·K` flops per batch entry at `plain_eff` (as `linear`);
//! - the generic ops of imported models ([`super::canon::GENERIC`]) pay the
//!   per-op overhead twice (plain-Rust generic kernels, an extra pass over memory),
//!   so their DLRM-level equivalents win even where the work is equal (`concat`
//!   vs `interaction{cat}`);
//! - relayouts of a parameter (`block_weight` or `transpose` of a `%param`) are
//!   free: the layout pass (`canon`, for transposes) does them once, at compile time;
//! - `get` costs nothing; the tuple it projects is paid by its result 0 only, so
//!   that the bias gradient fused into `brgemm_wgrad` is not counted twice (tree
//!   extraction would otherwise prefer a separate `linear_db`).
//!
//! [`block_for`] chooses a block size for a dimension with the same model (padding
//! waste against per-block overhead); it depends on the dimension only, so a
//! layer's output blocks always equal the next layer's input blocks.

use super::lang::{Data, Dl, DlGraph, GET};
use dlrm_ir::{Dim, TensorType};
use egg::{CostFunction, Id, Language};
use serde::{Deserialize, Serialize};

/// The machine model behind extraction.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExtractCost {
    /// Peak f32 throughput, GFLOP/s (= flops per ns).
    pub gflops: f64,
    /// Fraction of peak reached by the blocked (brgemm) kernels.
    pub blocked_eff: f64,
    /// Fraction of peak reached by unblocked `linear` and its gradients.
    pub plain_eff: f64,
    /// Memory bandwidth, bytes per ns.
    pub bytes_per_ns: f64,
    /// Fixed cost of running one op (dispatch, one pass over its data), ns.
    pub op_overhead_ns: f64,
    /// The size assumed for symbolic dimensions.
    pub batch: usize,
    /// Flop-equivalents of one `exp`/`ln` (sigmoid epilogues, losses).
    pub transcendental: f64,
}

impl Default for ExtractCost {
    fn default() -> Self {
        ExtractCost {
            gflops: 20.0,
            blocked_eff: 0.9,
            plain_eff: 0.35,
            bytes_per_ns: 10.0,
            op_overhead_ns: 200.0,
            batch: 512,
            transcendental: 10.0,
        }
    }
}

/// Candidate block sizes are at most this, but for [`MAX_WIDE_BLOCK`].
pub const MAX_BLOCK: usize = 64;

/// Where every block of at most [`MAX_BLOCK`] pads the dimension, wider blocks
/// up to this (multiples of 32, dividing the dimension rounded up to 32) are
/// candidates too: dlrm-mlperf's interaction width 479 padded to 512 in blocks
/// of 64 (7% more work in the top MLP's first layer, forward and backward) and
/// to 480 in blocks of 160. In `dlrm-run --bench` (2026-11-29, AMD EPYC Zen 5
/// class, 2 threads, interleaved) that layer's forward went from 4.9-5.3 to
/// 4.6-4.8 ms, its dgrad and wgrad from 5.0 to 4.8 ms a step.
pub const MAX_WIDE_BLOCK: usize = 192;

/// The block size for a dimension of size `d`: `forced` (capped at `d`) if given,
/// else the candidate minimising `padded(d, b) / d · (1 + 8 / b)` among `d` itself
/// (when `d <= 64`), its divisors in `8..=64`, and 16, 32, 64 (ties: the larger);
/// where that choice pads past the next multiple of 32, also among the wider
/// blocks of [`MAX_WIDE_BLOCK`] (which pad to it). Then, where the blocks
/// chosen waste micro-kernel lanes ([`lanes`] past the padded width rounded up
/// to 16) and `d` is at most [`MAX_WIDE_BLOCK`], one block of `d` if it
/// scores better with the lanes counted (`lane_score`): `d = 100` in one
/// block, not two of 50.
pub fn block_for(d: usize, forced: Option<usize>) -> usize {
    let d = d.max(1);
    if let Some(b) = forced {
        return b.clamp(1, d);
    }
    let b = padding_block(d);
    let padded = d.div_ceil(b) * b;
    if d > MAX_BLOCK
        && d <= MAX_WIDE_BLOCK
        && lanes(d, b) > padded.next_multiple_of(16)
        && lane_score(d, d) <= lane_score(d, b)
    {
        return d;
    }
    b
}

/// [`block_for`]'s choice by padding alone.
fn padding_block(d: usize) -> usize {
    let mut cands: Vec<usize> = vec![16, 32, 64];
    if d <= MAX_BLOCK {
        cands.push(d);
    }
    cands.extend((8..=MAX_BLOCK).filter(|b| d.is_multiple_of(*b)));
    cands.retain(|&b| b <= d.clamp(16, MAX_BLOCK) || b == d);
    let narrow = best_block(d, &cands).unwrap_or(d.min(MAX_BLOCK));
    if d.is_multiple_of(narrow) {
        return narrow;
    }
    let to32 = d.next_multiple_of(32);
    if to32 >= d.div_ceil(narrow) * narrow {
        return narrow;
    }
    let mut wide: Vec<usize> = (MAX_BLOCK + 1..=MAX_WIDE_BLOCK.min(to32))
        .filter(|&b| b.is_multiple_of(32) && to32.is_multiple_of(b))
        .collect();
    wide.push(narrow);
    best_block(d, &wide).unwrap_or(narrow)
}

/// The candidate of least `padded(d, b) / d · (1 + 8 / b)` (ties: the larger).
fn best_block(d: usize, cands: &[usize]) -> Option<usize> {
    let score = |b: usize| (d.div_ceil(b) * b) as f64 / d as f64 * (1.0 + 8.0 / b as f64);
    cands
        .iter()
        .fold(None::<(usize, f64)>, |best, &b| {
            let s = score(b);
            match best {
                Some((bb, bs)) if bs < s || (bs == s && bb >= b) => Some((bb, bs)),
                _ => Some((b, s)),
            }
        })
        .map(|(b, _)| b)
}

/// The micro-kernel lanes computed for `d` columns in blocks of `b` (`d`
/// padded to whole blocks), as the AVX-512 tile computes them (the AVX2
/// one's 16-lane panels waste the same lanes for the blocks it concerns):
/// each block in 32-lane panels, its last partial one 16 lanes wide when at most 16
/// columns are left (the AVX-512 tile's one-vector form). A GEMM whose output
/// runs in such blocks (the forward and wgrad of the layer producing `d`, the
/// dgrad of the one consuming it) does this much work: `d = 100` in blocks of
/// 50 is two panels of 32 a block, 128 lanes, against 112 in one block of 100.
pub fn lanes(d: usize, b: usize) -> usize {
    let b = b.max(1);
    let per_block = |w: usize| {
        let rem = w % 32;
        w - rem
            + match rem {
                0 => 0,
                1..=16 => 16,
                _ => 32,
            }
    };
    // A padded dimension's last block is as wide as the others.
    d.div_ceil(b) * per_block(b)
}

/// [`best_block`]'s score with the lanes counted beside the padding: a
/// dimension is the reduction (padded) of three of its layers' GEMMs and
/// the output (lanes) of the other three, so the mean of the two, times the
/// per-block overhead `1 + 8 / b`.
fn lane_score(d: usize, b: usize) -> f64 {
    let padded = d.div_ceil(b) * b;
    (padded + lanes(d, b)) as f64 / (2 * d) as f64 * (1.0 + 8.0 / b as f64)
}

/// The tree cost function over the e-graph (see the module docs).
pub struct DlCost<'a> {
    /// The e-graph (for the types of children).
    pub egraph: &'a DlGraph,
    /// The model.
    pub model: ExtractCost,
}

impl DlCost<'_> {
    fn size(&self, d: &Dim) -> f64 {
        d.fixed().unwrap_or(self.model.batch) as f64
    }

    fn numel(&self, t: &TensorType) -> f64 {
        t.shape.iter().map(|d| self.size(d)).product()
    }

    fn bytes(&self, t: &TensorType) -> f64 {
        self.numel(t) * t.dtype.size_bytes() as f64
    }

    fn types(&self, id: Id) -> Vec<TensorType> {
        match &self.egraph[id].data {
            Data::Types(Some(t)) => t.clone(),
            _ => Vec::new(),
        }
    }

    /// The flops of a module op's e-node (its own work model), `None` for any
    /// other op.
    fn module_work(
        &self,
        m: &str,
        children: &[Id],
        ins: &[TensorType],
        outs: &[TensorType],
    ) -> Option<f64> {
        dlrm_ir::module::find(m)?;
        let attrs: Vec<(String, dlrm_ir::Attr)> = children
            .iter()
            .filter_map(|&c| match &self.egraph[c].data {
                Data::Tag(t) => Some((t.key.as_str().to_string(), t.attr())),
                _ => None,
            })
            .collect();
        let Ok(dlrm_ir::Op::Module(op)) = dlrm_ir::Op::from_parts(m, &attrs) else {
            return None;
        };
        let ins: Vec<&TensorType> = ins.iter().collect();
        let outs: Vec<&TensorType> = outs.iter().collect();
        Some(op.def().work(&op, &ins, &outs, &|d| self.size(d)).flops)
    }

    /// The time of one op e-node, children excluded.
    pub fn own(&self, enode: &Dl) -> f64 {
        let Dl::Op(m, children) = enode else {
            return 0.0;
        };
        let m = m.as_str();
        if m == GET {
            return 0.0;
        }
        let operands: Vec<Id> = children
            .iter()
            .copied()
            .filter(|&c| !matches!(self.egraph[c].data, Data::Tag(_)))
            .collect();
        let ins: Vec<TensorType> = operands
            .iter()
            .filter_map(|&c| self.types(c).into_iter().next())
            .collect();
        if matches!(m, "block_weight" | "transpose")
            && operands.first().is_some_and(|&c| {
                self.egraph[c]
                    .nodes
                    .iter()
                    .any(|n| matches!(n, Dl::Value(_)))
            })
        {
            return 0.0;
        }
        let outs = self
            .egraph
            .lookup(enode.clone())
            .map(|c| self.types(c))
            .unwrap_or_default();
        let bytes: f64 = ins.iter().chain(&outs).map(|t| self.bytes(t)).sum();
        let d = |t: Option<&TensorType>, i: usize| {
            t.and_then(|t| t.shape.get(i)).map_or(1.0, |x| self.size(x))
        };
        let (i0, i1, last) = (ins.first(), ins.get(1), ins.last());
        let o0 = outs.first();
        let (flops, eff) = match m {
            "linear" => (2.0 * d(i0, 0) * d(i1, 0) * d(i0, 1), self.model.plain_eff),
            // a[.., M, K] · b[.., K, N]
            "matmul" => {
                let k = i0.map_or(1.0, |t| t.shape.last().map_or(1.0, |x| self.size(x)));
                (
                    2.0 * o0.map_or(0.0, |t| self.numel(t)) * k,
                    self.model.plain_eff,
                )
            }
            "linear_dx" | "linear_dw" => {
                (2.0 * d(i0, 0) * d(i0, 1) * d(i1, 1), self.model.plain_eff)
            }
            // xb[Kb,S,bk] · wb[Nb,Kb,bk,bn]
            "brgemm" => (
                2.0 * d(i0, 1) * d(i1, 0) * d(i1, 3) * d(i0, 0) * d(i0, 2),
                self.model.blocked_eff,
            ),
            // dyb[Nb,S,bn] · wb[Nb,Kb,bk,bn]
            "brgemm_dgrad" => (
                2.0 * d(i0, 1) * d(i0, 0) * d(i0, 2) * d(last, 1) * d(last, 2),
                self.model.blocked_eff,
            ),
            // dyb[Nb,S,bn]ᵀ · xb[Kb,S,bk]
            "brgemm_wgrad" => (
                2.0 * d(i0, 1) * d(i0, 0) * d(i0, 2) * d(last, 0) * d(last, 2),
                self.model.blocked_eff,
            ),
            _ => match self.module_work(m, children, &ins, &outs) {
                Some(w) => (w, self.model.plain_eff),
                None => (o0.map_or(0.0, |t| self.numel(t)), 1.0),
            },
        };
        // exp/ln per element: the sigmoid epilogue, the losses (the clamped BCE
        // takes two logs, its logits form one exp and one log1p).
        let sigmoid_epilogue = children
            .iter()
            .any(|&c| matches!(&self.egraph[c].data, Data::Tag(t) if t.key.as_str() == "act" && t.val.as_str() == "sigmoid"));
        let per_elem = match m {
            "bce" => 3.0,
            "bce_logits" => 2.0,
            "bce_grad" | "bce_logits_grad" | "sigmoid" => 1.0,
            _ if sigmoid_epilogue => 1.0,
            _ => 0.0,
        };
        let elems = match m {
            "bce" | "bce_logits" | "bce_grad" | "bce_logits_grad" => {
                i0.map_or(0.0, |t| self.numel(t))
            }
            _ => o0.map_or(0.0, |t| self.numel(t)),
        };
        let flops = flops + per_elem * elems * self.model.transcendental;
        let overhead = if super::canon::GENERIC.contains(&m) {
            2.0 * self.model.op_overhead_ns
        } else {
            self.model.op_overhead_ns
        };
        let m = &self.model;
        overhead + flops / (m.gflops * eff) + bytes / m.bytes_per_ns
    }
}

impl CostFunction<Dl> for DlCost<'_> {
    type Cost = f64;

    fn cost<C>(&mut self, enode: &Dl, mut costs: C) -> f64
    where
        C: FnMut(Id) -> f64,
    {
        if let Dl::Op(m, children) = enode
            && m.as_str() == GET
        {
            // Result 0 pays for the tuple; the other results are free riders.
            let first = children.first().and_then(|&t| match &self.egraph[t].data {
                Data::Tag(tag) => Some(tag.val.as_str() == "0"),
                _ => None,
            });
            let tuple = children.last().copied();
            return match (first, tuple) {
                (Some(true), Some(t)) => costs(t),
                (_, Some(t)) => 1.0 + costs(t) * 1e-9,
                _ => 1.0,
            };
        }
        let own = self.own(enode);
        enode.fold(own, |acc, c| acc + costs(c))
    }
}
