//! Graph statistics: op counts, parameter sizes and FLOPs per sample.
//!
//! FLOPs are counted for one sample: every symbolic dimension (`B`, `G`, and free ones
//! such as the `N` of bags with offsets) is taken as 1. Per op:
//! - `linear`, `linear_dx`, `linear_dw`: `2·M·N·K` (the epilogue is not counted);
//!   `linear_db`: one add per element of `dz`;
//! - `embedding_bag`: one add per looked-up element (`indices` elements × `D`);
//!   `embedding_bag_grad`: one per result element; `sparse_sgd`: two per row-gradient
//!   element (multiply, subtract);
//! - `interaction {kind=dot}`: `2·D` per pair of vectors (a dot product);
//!   `interaction_grad {kind=dot}`: `4·D` per pair (both operands' gradients);
//! - elementwise ops (`relu`, `sigmoid`, `add`, their gradients, the losses and their
//!   gradients): one per element of the result (of the prediction for a loss);
//! - data movement (`concat`, `split`, `reshape`, `interaction {kind=cat}` and its
//!   gradient) and collectives: 0;
//! - `sparse_adagrad` and the fused `embedding_update_adagrad` (and its row-shard
//!   form): seven per row-gradient element (the coalescing add, the square and its
//!   accumulation, root, `eps`, divide, the scaled subtract), an upper bound
//!   (duplicates and row-wise accumulators do less);
//! - `sgd`, `adagrad`: 0 — a dense update costs the same whatever the batch, so it is no
//!   per-sample work (at batch 1 it would be counted as if one sample paid for it).

use dlrm_ir::{Act, Dim, Graph, InteractionKind, Op, TensorType, gemm_flops};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Statistics of one graph.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GraphStats {
    /// Node count per op mnemonic.
    pub ops: BTreeMap<String, usize>,
    /// Parameter elements per dtype mnemonic.
    pub params: BTreeMap<String, usize>,
    /// Parameter bytes per dtype mnemonic.
    pub param_bytes: BTreeMap<String, usize>,
    /// Floating-point operations per sample (see the module docs).
    pub flops_per_sample: f64,
}

/// Size of a dimension with every symbol taken as 1.
fn dim1(d: &Dim) -> f64 {
    d.fixed().unwrap_or(1) as f64
}

fn numel1(t: &TensorType) -> f64 {
    t.shape.iter().map(dim1).product()
}

fn dot_pairs(f: usize, self_interaction: bool) -> f64 {
    let p = if self_interaction {
        f * (f + 1) / 2
    } else {
        f * f.saturating_sub(1) / 2
    };
    p as f64
}

/// FLOPs of node `n` for one sample.
pub(crate) fn node_flops(g: &Graph, n: usize) -> f64 {
    let node = &g.nodes()[n];
    let ty = |i: usize| g.ty(node.inputs[i]);
    let out = || g.ty(node.outputs[0]);
    let d = |t: &TensorType, i: usize| t.shape.get(i).map_or(1.0, dim1);
    match &node.op {
        Op::Module(m) => {
            let ins: Vec<&TensorType> = node.inputs.iter().map(|&v| g.ty(v)).collect();
            let outs: Vec<&TensorType> = node.outputs.iter().map(|&v| g.ty(v)).collect();
            m.def().work(m, &ins, &outs, &dim1).flops
        }
        // x[S,K] · w[N,K]ᵀ
        Op::Linear { .. } => gemm_flops(d(ty(0), 0), d(ty(1), 0), d(ty(0), 1)),
        // dz[S,N] · w[N,K], and dz[S,N]ᵀ · x[S,K]
        Op::LinearDx | Op::LinearDw => gemm_flops(d(ty(0), 0), d(ty(0), 1), d(ty(1), 1)),
        Op::LinearDb => numel1(ty(0)),
        Op::EmbeddingBag { .. } => numel1(ty(1)) * d(ty(0), 1),
        Op::EmbeddingBagGrad { .. } => numel1(out()),
        Op::SparseSgd { .. } => 2.0 * numel1(ty(2)),
        Op::Interaction {
            kind: InteractionKind::Dot,
            self_interaction,
        } => d(ty(0), 0) * dot_pairs(node.inputs.len(), *self_interaction) * 2.0 * d(ty(0), 1),
        Op::InteractionGrad {
            kind: InteractionKind::Dot,
            self_interaction,
        } => d(ty(1), 0) * dot_pairs(node.inputs.len() - 1, *self_interaction) * 4.0 * d(ty(1), 1),
        Op::Relu | Op::Sigmoid | Op::Add | Op::ReluGrad | Op::SigmoidGrad => numel1(out()),
        Op::Bce { .. } | Op::Mse { .. } | Op::BceGrad { .. } | Op::MseGrad { .. } => numel1(ty(0)),
        Op::Interaction { .. }
        | Op::InteractionGrad { .. }
        | Op::Concat { .. }
        | Op::Split { .. }
        | Op::Reshape { .. }
        | Op::AllReduce
        | Op::AllToAll { .. }
        | Op::Sgd { .. }
        | Op::Adagrad { .. } => 0.0,
        Op::SparseAdagrad { .. } => 7.0 * numel1(ty(3)),
        Op::EmbeddingUpdateAdagrad { .. } | Op::EmbeddingUpdateAdagradRows { .. } => {
            7.0 * numel1(ty(3)) * d(ty(0), 1)
        }
        // Blocked ops: the unpadded GEMM work (as the linear they replace).
        // xb[Kb,S,bk] · wb[Nb,Kb,bk,bn] -> N = bias length (Nb·bn without one)
        Op::Brgemm { .. } => {
            let n = match node.inputs.len() {
                3 => d(ty(2), 0),
                _ => d(ty(1), 0) * d(ty(1), 3),
            };
            2.0 * d(ty(0), 1) * n * d(ty(0), 0) * d(ty(0), 2)
        }
        Op::BrgemmDgrad { mask, .. } => {
            // The weight is last but for the mask operand.
            let w = ty(node.inputs.len() - 1 - usize::from(*mask != Act::None));
            2.0 * d(ty(0), 1) * d(ty(0), 0) * d(ty(0), 2) * d(w, 1) * d(w, 2)
        }
        Op::BrgemmWgrad { .. } => {
            let x = ty(node.inputs.len() - 1);
            2.0 * d(ty(0), 1) * d(ty(0), 0) * d(ty(0), 2) * d(x, 0) * d(x, 2)
        }
        Op::BceLogits { .. } | Op::BceLogitsGrad { .. } => numel1(ty(0)),
        Op::EmbeddingUpdate { .. } => 2.0 * numel1(ty(2)) * d(ty(0), 1),
        Op::SplitEmbeddingUpdate { .. } => 2.0 * numel1(ty(3)) * d(ty(0), 1),
        Op::BlockAct { .. }
        | Op::UnblockAct { .. }
        | Op::BlockWeight { .. }
        | Op::UnblockWeight { .. }
        | Op::SplitSgd { .. } => 0.0,
        // ---- sharded embeddings (upper bounds: every index counted)
        Op::EmbeddingBagRows { .. } => numel1(ty(1)) * d(ty(0), 1),
        Op::SparseSgdRows { .. } => 2.0 * numel1(ty(2)),
        Op::EmbeddingUpdateRows { .. } => 2.0 * numel1(ty(2)) * d(ty(0), 1),
        Op::SplitEmbeddingUpdateRows { .. } => 2.0 * numel1(ty(3)) * d(ty(0), 1),
        Op::EmbeddingGradDense { .. } => numel1(ty(1)) * d(ty(0), 1),
        // ---- generic ops (ONNX import)
        // a[..,M,K] · b[..,K,N]: 2·K per result element.
        Op::MatMul => 2.0 * d(ty(0), ty(0).rank().saturating_sub(1)) * numel1(out()),
        Op::Binary { .. } | Op::Reduce { .. } => numel1(ty(0)).max(numel1(out())),
        Op::EmbeddingBagWeighted => 2.0 * numel1(ty(1)) * d(ty(0), 1),
        Op::Transpose { .. }
        | Op::Gather { .. }
        | Op::GatherElements { .. }
        | Op::GatherNd { .. }
        | Op::Slice { .. }
        | Op::Cast { .. } => 0.0,
        // One add per length.
        Op::OffsetsFromLengths { .. } => numel1(ty(0)),
    }
}

impl GraphStats {
    /// Computes the statistics of `g`.
    pub fn of(g: &Graph) -> GraphStats {
        let mut s = GraphStats::default();
        for (n, node) in g.nodes().iter().enumerate() {
            *s.ops.entry(node.op.mnemonic().to_string()).or_default() += 1;
            s.flops_per_sample += node_flops(g, n);
        }
        for &p in g.params() {
            let t = g.ty(p);
            let n = t
                .shape
                .iter()
                .map(|d| d.fixed().unwrap_or(1))
                .product::<usize>();
            let dt = t.dtype.mnemonic().to_string();
            *s.params.entry(dt.clone()).or_default() += n;
            *s.param_bytes.entry(dt).or_default() += n * t.dtype.size_bytes();
        }
        s
    }

    /// Total parameter elements over all dtypes.
    pub fn param_count(&self) -> usize {
        self.params.values().sum()
    }

    /// Total parameter bytes over all dtypes.
    pub fn total_param_bytes(&self) -> usize {
        self.param_bytes.values().sum()
    }
}

impl fmt::Display for GraphStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "ops:")?;
        for (op, n) in &self.ops {
            writeln!(f, "  {op:<20} {n}")?;
        }
        writeln!(f, "params:")?;
        for (dt, n) in &self.params {
            let bytes = self.param_bytes.get(dt).copied().unwrap_or(0);
            writeln!(f, "  {dt:<20} {n} elements, {bytes} bytes")?;
        }
        writeln!(f, "flops per sample: {}", self.flops_per_sample)
    }
}
