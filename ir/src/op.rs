//! The operations of the IR and what each one means.
//!
//! Every op documents its operands, results and semantics here; the reference
//! interpreter (`interp`) implements exactly this text, and every optimised path is
//! checked against the interpreter. `S` below stands for any leading (sample)
//! dimension: `B` on a single device, `B` or `G` in a partitioned program.
//!
//! Attributes are exposed generically ([`Op::attrs`], [`Op::from_parts`]) so that
//! the text printer and parser need no per-op code; both, with [`Op::mnemonic`] and
//! [`MNEMONICS`], are generated from the one op table in `op/table.rs`.

use crate::types::{DType, Dim, Shape};
use std::fmt;

mod adagrad;
pub(crate) mod family;
mod table;
mod update;
pub use adagrad::AdagradHyper;
pub use table::MNEMONICS;
pub use update::{BagUpdate, State};

/// Pooling of an embedding bag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pool {
    /// Sum of the bag's rows.
    Sum,
    /// Mean of the bag's rows; an empty bag gives zeros.
    Mean,
}

/// Activation fused into a linear layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Act {
    /// Identity.
    None,
    /// max(x, 0).
    Relu,
    /// 1 / (1 + exp(-x)).
    Sigmoid,
}

/// Feature interaction kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InteractionKind {
    /// Pairwise dot products (lower triangle), concatenated after the dense vector.
    Dot,
    /// Plain concatenation of the dense vector and all embeddings.
    Cat,
}

/// Direction of an [`Op::AllToAll`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum A2aDir {
    /// Owner's `[G, ..]` tensors are split by sample and scattered to every rank.
    Scatter,
    /// The adjoint: every rank's `[B, ..]` slices are gathered back by their owner.
    Gather,
}

/// An IR operation with its attributes.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    // ---------------------------------------------------------------- forward
    /// `embedding_bag(table[R,D], indices[S,L]) -> [S,D]` (fixed pooling) or
    /// `embedding_bag(table[R,D], indices[N], offsets[S]) -> [S,D]` (variable bags:
    /// bag `s` is `indices[offsets[s] .. offsets[s+1]]`, the last bag ends at `N`;
    /// offsets must be non-decreasing, start at 0 and be <= N). Output row `s` is the
    /// sum (or mean) of `table[i]` over the bag's indices. The result has the table's
    /// dtype. Any index outside `0..R` is an error naming the table and the sample.
    ///
    /// With `last_offset` (PyTorch's `include_last_offset=True`, printed
    /// `last_offset=true`, omitted when false) only the offsets form is allowed:
    /// `embedding_bag(table[R,D], indices[N], offsets[S+1]) -> [S,D]`, bag `s` is
    /// `indices[offsets[s] .. offsets[s+1]]` for `s < S`. The offsets must be
    /// non-decreasing and at most `N`, and need *not* start at 0: indices before
    /// `offsets[0]` and from `offsets[S]` on belong to no bag, are not read and not
    /// checked against `R` (a bag over a slice of a longer offsets vector, as
    /// TorchRec's per-key view of a jagged batch). An offsets vector with no entry
    /// is an error.
    EmbeddingBag {
        /// Sum or mean.
        mode: Pool,
        /// Offsets carry `S+1` entries, the last one ending the last bag.
        last_offset: bool,
    },
    /// `linear(x[S,K], w[N,K], b[N]) -> [S,N]`: `act(x · wᵀ + b)` (PyTorch's layout).
    Linear {
        /// Fused activation.
        act: Act,
    },
    /// `relu(x) -> x'`: elementwise `max(x, 0)`.
    Relu,
    /// `add(a, b) -> a + b`: elementwise, same shapes (sums gradients of a value used
    /// more than once).
    Add,
    /// `sigmoid(x) -> x'`: elementwise `1 / (1 + exp(-x))`.
    Sigmoid,
    /// `interaction(x[S,D], e_0[S,D], .., e_{n-1}[S,D]) -> r`.
    /// `dot`: with `T = [x, e_0, .., e_{n-1}]` (F = n+1 vectors per sample),
    /// `Z[i][j] = T_i · T_j`; keep `i > j` (and `i == j` if `self_interaction`) in
    /// row-major order (i outer, j inner); `r = concat(x, Zflat)`, width
    /// `D + F(F-1)/2` (`D + F(F+1)/2` with self interaction).
    /// `cat`: `r = concat(x, e_0, .., e_{n-1})` along axis 1 (widths may differ).
    Interaction {
        /// Dot or cat.
        kind: InteractionKind,
        /// Keep the diagonal `i == j` (dot only).
        self_interaction: bool,
    },
    /// `concat(x_0, .., x_k) -> y` along `axis`; other dimensions must agree.
    Concat {
        /// The axis joined.
        axis: usize,
    },
    /// `split(x) -> (y_0, .., y_k)` along `axis` into pieces of `sizes` (the adjoint of
    /// concat).
    Split {
        /// The axis split.
        axis: usize,
        /// Size of each piece along `axis`; they sum to the axis length.
        sizes: Vec<usize>,
    },
    /// `reshape(x) -> y` with `shape`, same elements in row-major order.
    Reshape {
        /// The result shape (may use symbols that appear in the operand's shape).
        shape: Shape,
    },
    /// `bce(p, y) -> f32[]`: `-Σ (y·log p + (1-y)·log(1-p)) / denom`, each log clamped
    /// below at -100 (as PyTorch's `BCELoss`). `p` and `y` have the same shape.
    Bce {
        /// The normaliser: `B` for the batch mean; `G` in a partitioned program so
        /// that the ranks' losses sum to the global mean.
        denom: Dim,
    },
    /// `mse(p, y) -> f32[]`: `Σ (p - y)² / denom`.
    Mse {
        /// The normaliser (see [`Op::Bce`]).
        denom: Dim,
    },

    // --------------------------------------------------------------- backward
    /// `relu_grad(dy, y) -> dx`: `dy` where `y > 0`, else 0 (`y` is relu's output).
    ReluGrad,
    /// `sigmoid_grad(dy, y) -> dx`: `dy · y · (1 - y)` (`y` is sigmoid's output).
    SigmoidGrad,
    /// `linear_dx(dz[S,N], w[N,K]) -> [S,K]`: `dz · w` (gradient of the input; `dz`
    /// is the gradient after the activation's backward).
    LinearDx,
    /// `linear_dw(dz[S,N], x[S,K]) -> [N,K]`: `dzᵀ · x`, in f32.
    LinearDw,
    /// `linear_db(dz[S,N]) -> [N]`: `Σ_s dz[s]`, in f32.
    LinearDb,
    /// `interaction_grad(dr, x, e_0, .., e_{n-1}) -> (dx, de_0, .., de_{n-1})`: the
    /// gradient of [`Op::Interaction`] with the same attributes.
    InteractionGrad {
        /// Dot or cat.
        kind: InteractionKind,
        /// As in the forward op.
        self_interaction: bool,
    },
    /// `embedding_bag_grad(dy[S,D], indices[S,L]) -> f32[S,L,D]` or
    /// `embedding_bag_grad(dy[S,D], indices[N], offsets[S]) -> f32[N,D]`: one gradient
    /// row per index (the sparse gradient of the table): row `i` is `dy[bag(i)]`
    /// (divided by the bag's size for `mean`). With `last_offset` (offsets
    /// `[S+1]`, as in [`Op::EmbeddingBag`]) the rows of indices in no bag are 0.
    /// A fourth operand `weights[N]` (offsets form) scales row `i` by `weights[i]`:
    /// the table's gradient of [`Op::EmbeddingBagWeighted`] (PyTorch's
    /// `per_sample_weights`, `sum` mode).
    EmbeddingBagGrad {
        /// As in the forward op.
        mode: Pool,
        /// As in the forward op.
        last_offset: bool,
    },
    /// `bce_grad(p, y) -> dp`: `(p - y) / max(p·(1-p), 1e-12) / denom`.
    BceGrad {
        /// As in the forward op.
        denom: Dim,
    },
    /// `mse_grad(p, y) -> dp`: `2 (p - y) / denom`.
    MseGrad {
        /// As in the forward op.
        denom: Dim,
    },

    // -------------------------------------------------------------- optimizer
    /// `sgd(w, g) -> w'`: `w - lr · g` computed in f32 and stored in `w`'s dtype.
    Sgd {
        /// Learning rate.
        lr: f32,
    },
    /// `sparse_sgd(table[R,D], indices[..], rowgrad[.., D]) -> table'`: for every
    /// index `i` in row-major order, `table[indices[i]] -= lr · rowgrad[i]` (duplicates
    /// accumulate; rows not indexed are unchanged). With a fourth operand
    /// `bounds[S+1]` (indices `[N]`: the offsets of the `last_offset` bag the row
    /// gradient comes from), only the indices at positions `bounds[0] ..
    /// bounds[S]` are applied; the others are in no bag (other keys' ids of a
    /// jagged batch) and are neither checked against `R` nor applied. Needs `0 <=
    /// bounds[0] <= bounds[S] <= N`.
    SparseSgd {
        /// Learning rate.
        lr: f32,
    },
    /// `adagrad(w, acc, g) -> (w', acc')` (`torch.optim.Adagrad`, `lr_decay=0`), f32
    /// only. With `wd != 0` the gradient is first `g + wd·w`. Elementwise
    /// (`rowwise=false`, `acc` shaped like `w`): `G = acc + g·g`,
    /// `w' = w - lr·(g / (sqrt(G) + eps))`, `acc' = G`. Row-wise (`rowwise=true`,
    /// `w[R,D]`, `acc[R]`, the dense form of a row-wise table update): per row `r`,
    /// `G = acc[r] + (Σ_j g[r,j]·g[r,j]) / D` (sum over `j` ascending from 0.0),
    /// then every element as above with that one `G`. A zero gradient leaves its
    /// weight unchanged when `eps > 0` or `acc > 0`.
    Adagrad {
        /// Learning rate.
        lr: f32,
        /// Added to the root of the accumulator.
        eps: f32,
        /// L2 weight decay folded into the gradient.
        wd: f32,
        /// One accumulator per row (`acc[R]`) instead of per element.
        rowwise: bool,
    },
    /// `sparse_adagrad(table[R,D], acc, indices[..], rowgrad[.., D]) -> (table', acc')`:
    /// Adagrad on the rows a sparse gradient touches (torch's sparse `Adagrad`, the
    /// reference's `RWSAdagrad`), f32 only, no weight decay (the peers refuse it for
    /// sparse gradients). First the gradient is coalesced: for each distinct row `r`
    /// among the indices, `g_r = Σ rowgrad[i]` over the `i` with `indices[i] = r`,
    /// in row-major order, from 0.0. Then each such row is updated once as
    /// [`Op::Adagrad`] with `g_r` (`acc[R,D]` elementwise, or `acc[R]` with
    /// `rowwise`); rows not indexed are unchanged. A fifth operand `bounds[S+1]`
    /// restricts the update to the indices at positions `bounds[0] .. bounds[S]`,
    /// as for [`Op::SparseSgd`]: indices in no bag are not coalesced, not checked,
    /// and their rows not updated.
    SparseAdagrad {
        /// Learning rate.
        lr: f32,
        /// Added to the root of the accumulator.
        eps: f32,
        /// One accumulator per row.
        rowwise: bool,
    },

    // ------------------------------------------------------------ collectives
    /// `all_reduce(x_0, .., x_k) -> (y_0, .., y_k)`: elementwise sum over all ranks;
    /// every rank receives the sums. f32 only.
    AllReduce,
    /// Hybrid-parallel exchange of embedding vectors over `counts.len()` ranks, where
    /// rank `r` owns `counts[r]` tensors and this program is rank `rank`. The sample
    /// axis (0) of a `[G, ..]` tensor is split in rank order, rank `r` taking
    /// [`crate::batch_slice`]`(G, ranks, r)`.
    /// - `scatter`: operands are this rank's `counts[rank]` tensors `[G, ..]`; results
    ///   are `Σ counts` tensors `[B, ..]`: for each rank `r` in order, its `counts[r]`
    ///   tensors restricted to this rank's samples.
    /// - `gather`: the adjoint: operands are `Σ counts` tensors `[B, ..]` grouped by
    ///   owner; results are this rank's `counts[rank]` tensors `[G, ..]` assembled from
    ///   every rank's slice.
    AllToAll {
        /// Scatter (forward) or gather (backward).
        dir: A2aDir,
        /// How many tensors each rank owns.
        counts: Vec<usize>,
        /// The rank this program runs on.
        rank: usize,
    },

    // ---- fused / blocked ops (e-graph, precision)
    // Blocked layouts (SC20): an activation `x[S,K]` blocked by `bk` is
    // `xb[Kb,S,bk]` with `Kb = ceil(K/bk)` and `xb[kb][s][i] = x[s][kb·bk+i]`; a weight
    // `w[N,K]` blocked by `(bn,bk)` is `wb[Nb,Kb,bk,bn]` with
    // `wb[nb][kb][i][j] = w[nb·bn+j][kb·bk+i]`. Padding (indices past `K` or `N`) is
    // always 0: every op producing a blocked value writes 0 there.
    /// `block_act(x[S,K]) -> dtype[ceil(K/bk),S,bk]`: blocks an activation (zero
    /// padding), converting to `dtype` (bf16: round to nearest even).
    BlockAct {
        /// Block width along the features.
        bk: usize,
        /// The result dtype (f32 or bf16).
        dtype: DType,
    },
    /// `unblock_act(xb[Kb,S,bk]) -> dtype[S,k]`: the inverse of `block_act`, dropping
    /// the padding (`k` must be in `((Kb-1)·bk, Kb·bk]`).
    UnblockAct {
        /// The unpadded feature count.
        k: usize,
        /// The result dtype (f32 or bf16).
        dtype: DType,
    },
    /// `block_weight(w[N,K]) -> [ceil(N/bn),ceil(K/bk),bk,bn]` (same dtype, zero padding).
    BlockWeight {
        /// Block width along the outputs.
        bn: usize,
        /// Block width along the inputs.
        bk: usize,
    },
    /// `unblock_weight(wb[Nb,Kb,bk,bn]) -> [n,k]`: the inverse of `block_weight`.
    UnblockWeight {
        /// Unpadded rows.
        n: usize,
        /// Unpadded columns.
        k: usize,
    },
    /// `brgemm(xb[Kb,S,bk], wb[Nb,Kb,bk,bn], b[N]) -> yb[Nb,S,bn]`: the blocked
    /// `linear`: `y[s][n] = act(Σ_k x[s][k]·w[n][k] + b[n])` for `n < N`, 0 in the
    /// padding. The sum runs over `k` ascending in one f32 accumulator (padding
    /// included, whose terms are 0), then the bias is added: exactly `linear`'s
    /// arithmetic. Without `b` (`brgemm(xb, wb)`: the bias-free product of a
    /// cross layer) nothing is added and every column is computed (the weight's
    /// zero padding rows give 0). The result dtype is bf16 only if `x` and `w`
    /// are both bf16.
    Brgemm {
        /// Fused activation (the epilogue).
        act: Act,
    },
    /// `brgemm_dgrad(dyb[Nb,S,bn], yb[Nb,S,bn], wb[Nb,Kb,bk,bn]) -> dtype[Kb,S,bk]`
    /// (`act=none` takes no `yb`: `brgemm_dgrad(dyb, wb)`): with `dz = act'(dy, y)`
    /// (`relu_grad`/`sigmoid_grad`/identity, fused), `dx[s][k] = Σ_n dz[s][n]·w[n][k]`
    /// over `n` ascending in f32 (as `linear_dx`), 0 in the padding; operands widened
    /// exactly, the result stored as `dtype` (bf16: rounded once, after the mask,
    /// to nearest even). With `mask` other than `none`, one more operand: the layer's
    /// blocked input `xb[Kb,S,bk]` (the previous layer's output, activated by `mask`),
    /// and the result is that layer's `dz`: `mask'(dx, xb)` elementwise (`relu_grad` /
    /// `sigmoid_grad` of the definition, padding included), so the previous
    /// layer's `brgemm_dgrad`/`brgemm_wgrad` take it with `act=none` instead of
    /// each applying `act'` to `dx` (the `fuse-dgrad-mask` pass). Printed only when not `none`.
    BrgemmDgrad {
        /// The forward activation whose gradient is fused.
        act: Act,
        /// The previous layer's activation, whose gradient is applied to the
        /// result (`none`: the plain `dx`).
        mask: Act,
        /// The result dtype (f32, or bf16 between bf16 layers; printed if bf16).
        dtype: DType,
    },
    /// `brgemm_wgrad(dyb[Nb,S,bn], yb[Nb,S,bn], xb[Kb,S,bk]) -> (f32[Nb,Kb,bk,bn], f32[n])`
    /// (`act=none` takes no `yb`: `brgemm_wgrad(dyb, xb)`):
    /// with `dz = act'(dy, y)`: the blocked weight gradient `dw[n][k] = Σ_s dz[s][n]·x[s][k]`
    /// and the bias gradient `db[n] = Σ_s dz[s][n]`, sums over `s` ascending in f32 (as
    /// `linear_dw`, `linear_db`), 0 in the padding; operands widened exactly.
    BrgemmWgrad {
        /// The forward activation whose gradient is fused.
        act: Act,
        /// The unpadded output count `N`.
        n: usize,
    },
    /// `bce_logits(z, y) -> f32[]`: binary cross-entropy on logits, the stable form
    /// `Σ (max(z,0) - z·y + ln(1 + exp(-|z|))) / denom` (sum in row-major order).
    BceLogits {
        /// The normaliser (see [`Op::Bce`]).
        denom: Dim,
    },
    /// `bce_logits_grad(z, y) -> f32`: `(sigmoid(z) - y) / denom`.
    BceLogitsGrad {
        /// As in the forward op.
        denom: Dim,
    },
    /// `split_sgd(hi: bf16, lo: bf16, g) -> (hi', lo')` (Split-SGD-BF16): `hi` is the
    /// bf16 weight, the high 16 bits of an f32 master whose low 16 bits `lo` holds (as
    /// raw bits in a bf16-typed tensor). Elementwise: `w = f32(hi << 16 | lo)`,
    /// `w -= lr·g` in f32, `hi' = w >> 16`, `lo' = w & 0xffff`.
    SplitSgd {
        /// Learning rate.
        lr: f32,
    },
    /// `embedding_update(table, dy[S,D], indices[S,L])` or
    /// `embedding_update(table, dy[S,D], indices[N], offsets[S]) -> table'`: the fused
    /// `sparse_sgd(table, indices, embedding_bag_grad(dy, indices[, offsets]))`, with
    /// exactly that arithmetic; no row gradient is materialised (the kernel is the
    /// race-free owner-computes update: each thread owns a row range).
    EmbeddingUpdate {
        /// As in the forward bag.
        mode: Pool,
        /// Learning rate.
        lr: f32,
    },
    /// `split_embedding_update(hi: bf16[R,D], lo: bf16[R,D], dy, indices[, offsets])
    /// -> (hi', lo')`: [`Op::EmbeddingUpdate`] on a Split-SGD-BF16 table: the f32
    /// master of each touched row is joined from its high (`hi`, the bf16 table) and
    /// low (`lo`) halves, updated exactly as `embedding_update` does in f32, and split
    /// again; untouched rows are unchanged.
    SplitEmbeddingUpdate {
        /// As in the forward bag.
        mode: Pool,
        /// Learning rate.
        lr: f32,
    },
    /// `embedding_update_adagrad(table, acc, dy[S,D], indices[S,L] | indices[N],
    /// offsets[S]) -> (table', acc')`: the fused `sparse_adagrad(table, acc,
    /// indices, embedding_bag_grad(dy, indices[, offsets]))` (same attributes), with
    /// exactly that arithmetic; no row gradient is materialised (the race-free
    /// owner-computes update: each thread owns a row range and its accumulators).
    EmbeddingUpdateAdagrad {
        /// As in the forward bag.
        mode: Pool,
        /// Learning rate.
        lr: f32,
        /// Added to the root of the accumulator.
        eps: f32,
        /// One accumulator per row.
        rowwise: bool,
    },
    // ---- sharded embeddings (partition: row-wise and data-parallel tables)
    /// `embedding_bag_rows(shard[Rs,D], indices[S,L] | indices[N], offsets[S]) ->
    /// [S,D]`: [`Op::EmbeddingBag`] on the rows `lo .. lo+Rs` of a table of `rows`
    /// rows whose shard this is (row-wise sharding). Every index must lie in
    /// `0..rows`; an index outside the shard's range contributes zero, one inside
    /// adds `shard[i - lo]` (f32 accumulator from 0.0, in bag order); `mean` divides
    /// by the *full* bag length, so the shards' results sum to the whole table's bag.
    /// Requires `lo + Rs <= rows`.
    EmbeddingBagRows {
        /// Sum or mean.
        mode: Pool,
        /// The first table row this shard holds.
        lo: usize,
        /// Rows of the whole table.
        rows: usize,
    },
    /// `sparse_sgd_rows(shard[Rs,D], indices[..], rowgrad[.., D]) -> shard'`:
    /// [`Op::SparseSgd`] restricted to the shard's rows `lo .. lo+Rs` of a table of
    /// `rows` rows: every index must lie in `0..rows`; those in range update
    /// `shard[i - lo]` in row-major order, the others are skipped.
    SparseSgdRows {
        /// Learning rate.
        lr: f32,
        /// The first table row this shard holds.
        lo: usize,
        /// Rows of the whole table.
        rows: usize,
    },
    /// `embedding_update_rows(shard, dy[S,D], indices[, offsets]) -> shard'`: the
    /// fused `sparse_sgd_rows(shard, indices, embedding_bag_grad(dy, indices[,
    /// offsets]))` (same attributes), with exactly that arithmetic.
    EmbeddingUpdateRows {
        /// As in the forward bag.
        mode: Pool,
        /// Learning rate.
        lr: f32,
        /// The first table row this shard holds.
        lo: usize,
        /// Rows of the whole table.
        rows: usize,
    },
    /// `split_embedding_update_rows(hi, lo, dy[S,D], indices[, offsets]) -> (hi',
    /// lo')`: [`Op::SplitEmbeddingUpdate`] on the row shard `lo .. lo+Rs` of a
    /// Split-SGD-BF16 table of `rows` rows (both halves sharded alike); indices
    /// outside the shard are skipped, as in [`Op::SparseSgdRows`].
    SplitEmbeddingUpdateRows {
        /// As in the forward bag.
        mode: Pool,
        /// Learning rate.
        lr: f32,
        /// The first table row this shard holds.
        lo: usize,
        /// Rows of the whole table.
        rows: usize,
    },
    /// `embedding_update_adagrad_rows(shard[Rs,D], acc, dy, indices[, offsets]) ->
    /// (shard', acc')`: [`Op::EmbeddingUpdateAdagrad`] on the row shard `lo .. lo+Rs`
    /// of a table of `rows` rows, whose accumulator rows (`acc[Rs,D]` or `acc[Rs]`)
    /// are sharded alike: every index must lie in `0..rows`; those outside the shard
    /// are skipped, as in [`Op::SparseSgdRows`].
    EmbeddingUpdateAdagradRows {
        /// As in the forward bag.
        mode: Pool,
        /// Learning rate.
        lr: f32,
        /// Added to the root of the accumulator.
        eps: f32,
        /// One accumulator per row.
        rowwise: bool,
        /// The first table row this shard holds.
        lo: usize,
        /// Rows of the whole table.
        rows: usize,
    },
    /// `embedding_grad_dense(dy[S,D], indices[, offsets]) -> f32[rows,D]`: the dense
    /// gradient of a table of `rows` rows: zeros, plus each row gradient of
    /// `embedding_bag_grad(dy, ..)` added to row `indices[i]`, `i` in row-major
    /// order (f32). Every index must lie in `0..rows`. Used for data-parallel
    /// (replicated) tables, whose gradients are all-reduced and applied by `sgd`.
    EmbeddingGradDense {
        /// As in the forward bag.
        mode: Pool,
        /// Rows of the table.
        rows: usize,
    },
    // ---- generic ops (ONNX import)
    /// `matmul(a[..,M,K], b[..,K,N]) -> [..,M,N]`: batched matrix product; both
    /// operands have rank >= 2 and their batch dimensions broadcast (numpy rules).
    /// Floats; the sum over `k` is one f32 accumulator in increasing `k`.
    MatMul,
    /// `binary(a, b) -> c`: elementwise `a op b` with numpy broadcasting (a
    /// dimension of size 1 stretches; ranks are aligned at the right). Floats.
    Binary {
        /// The operation.
        kind: BinaryKind,
    },
    /// `transpose(x) -> y` with `y.shape[i] = x.shape[perm[i]]`.
    Transpose {
        /// A permutation of `0..rank`.
        perm: Vec<usize>,
    },
    /// `gather(data, indices) -> data.shape[..axis] ++ indices.shape ++
    /// data.shape[axis+1..]`: ONNX `Gather`; a negative index counts from the end of
    /// `axis`; any other index outside the axis is an error. Any dtype.
    Gather {
        /// The axis indexed.
        axis: usize,
    },
    /// `gather_elements(data, indices) -> [indices.shape]`: ONNX `GatherElements`:
    /// `out[i..] = data[i.. with axis replaced by indices[i..]]`; ranks equal and
    /// every other dimension of `indices` at most `data`'s.
    GatherElements {
        /// The axis indexed.
        axis: usize,
    },
    /// `gather_nd(data, indices[.., k]) -> indices.shape[..-1] ++ data.shape[b+k..]`:
    /// ONNX `GatherND` with `batch_dims = b`.
    GatherNd {
        /// Leading dimensions shared by `data` and `indices`.
        batch_dims: usize,
    },
    /// `slice(x) -> y`: along each `axes[i]`, the elements `starts[i], starts[i] +
    /// steps[i], ..` below `ends[i]` (resolved at import: `0 <= start <= end <= dim`,
    /// step >= 1). On a symbolic axis the end is a dimension expression no more than
    /// a constant below the axis (`ends=[B]` of a `B+1` axis: all but the last) and
    /// the step is 1.
    Slice {
        /// The axes sliced (distinct).
        axes: Vec<usize>,
        /// First element kept, per axis.
        starts: Vec<usize>,
        /// End (exclusive), per axis: fixed, or an expression on a symbolic axis.
        ends: Vec<Dim>,
        /// Stride, per axis.
        steps: Vec<usize>,
    },
    /// `reduce(x) -> y`: sum or mean over `axes` (each reduced dimension removed, or
    /// kept as 1 with `keepdims`). Floats; the sum runs in increasing index order; a
    /// mean over zero elements is 0.
    Reduce {
        /// Sum or mean.
        kind: Pool,
        /// The axes reduced (distinct, sorted).
        axes: Vec<usize>,
        /// Keep reduced axes as size 1.
        keepdims: bool,
    },
    /// `cast(x) -> y` of dtype `to`: float to int truncates toward zero (out of range
    /// or NaN is an error), int to float rounds to nearest, i64 to i32 must fit.
    Cast {
        /// The result dtype.
        to: DType,
    },
    /// `embedding_bag_weighted(table[R,D], indices[N], offsets[S], weights[N]) ->
    /// [S,D]`: as [`Op::EmbeddingBag`] `sum` with offsets, each row scaled by its
    /// per-sample weight first (PyTorch's `per_sample_weights`).
    EmbeddingBagWeighted,
    /// `offsets_from_lengths(lengths[N]) -> [N/keys + 1]`, integer (i64 or i32, the
    /// result has the operand's dtype): the bag bounds of one key of a jagged
    /// batch (TorchRec's `KeyedJaggedTensor`: `lengths` holds `keys` runs of `R =
    /// N/keys` bag lengths, key-major, the bags' ids one after another in one
    /// `values` vector). With `G[j] = lengths[0] + .. + lengths[j-1]` (`G[0] = 0`,
    /// summed in that order), the result is `G[key·R + s]` for `s` in `0..=R`: the
    /// offsets of `embedding_bag[last_offset=true](table_key, values, ..)` (bag `s`
    /// is `values[G[key·R+s] .. G[key·R+s+1]]`). `keys = 1` gives `G` itself.
    /// Needs `key < keys` and `N` a multiple of `keys`; a negative length (of any
    /// key) is an error naming its position, a sum beyond the dtype an error.
    /// Integer: no gradient.
    OffsetsFromLengths {
        /// How many keys (runs of bag lengths) `lengths` holds.
        keys: usize,
        /// The key whose bag bounds are computed.
        key: usize,
    },
    /// An op written as one module ([`crate::module`], `ir/src/ops/`): its spec is there.
    Module(crate::module::ModOp),
}

/// The operation of an [`Op::Binary`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryKind {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
}

impl BinaryKind {
    /// The attribute spelling (`add`, `sub`, `mul`, `div`).
    pub fn name(self) -> &'static str {
        match self {
            BinaryKind::Add => "add",
            BinaryKind::Sub => "sub",
            BinaryKind::Mul => "mul",
            BinaryKind::Div => "div",
        }
    }
}

/// A generic attribute value, for printing and parsing.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    /// An integer.
    Int(i64),
    /// A float (printed so that it parses back bit-exactly).
    Float(f32),
    /// A boolean.
    Bool(bool),
    /// A bare identifier (enum values such as `relu`, `sum`, `scatter`).
    Ident(String),
    /// A dimension (fixed or symbolic), e.g. `denom=B`.
    Dim(Dim),
    /// A list of dimensions, e.g. `[B,9,64]` or `[1,2,3]`.
    List(Vec<Dim>),
}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attr::Int(v) => write!(f, "{v}"),
            Attr::Float(v) => write!(f, "{v:?}"),
            Attr::Bool(v) => write!(f, "{v}"),
            Attr::Ident(s) => f.write_str(s),
            Attr::Dim(d) => write!(f, "{d}"),
            Attr::List(ds) => {
                f.write_str("[")?;
                for (i, d) in ds.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{d}")?;
                }
                f.write_str("]")
            }
        }
    }
}

impl Pool {
    fn name(self) -> &'static str {
        match self {
            Pool::Sum => "sum",
            Pool::Mean => "mean",
        }
    }
}

impl Act {
    /// The attribute spelling (`none`, `relu`, `sigmoid`).
    pub fn name(self) -> &'static str {
        match self {
            Act::None => "none",
            Act::Relu => "relu",
            Act::Sigmoid => "sigmoid",
        }
    }
}

impl InteractionKind {
    fn name(self) -> &'static str {
        match self {
            InteractionKind::Dot => "dot",
            InteractionKind::Cat => "cat",
        }
    }
}

impl A2aDir {
    fn name(self) -> &'static str {
        match self {
            A2aDir::Scatter => "scatter",
            A2aDir::Gather => "gather",
        }
    }
}
