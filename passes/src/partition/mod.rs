//! Hybrid-parallel partitioning (pass id `partition`): one graph per rank, the
//! embedding tables placed as a [`ShardPlan`] says (see `docs/parallel.md` for the
//! step as a whole, [`dlrm_ir::Op::AllToAll`] for the exchange's exact semantics).
//!
//! MLPs, interaction and loss are data parallel: every rank runs them on its own `B`
//! samples of the global batch `G`. Each table is placed by the sharding planner
//! ([`crate::shard`]) in one of three ways:
//! - **table-wise**: on one rank (its *owner*), which looks up its bags for all `G`
//!   samples;
//! - **row-wise**: row ranges on several ranks, each looking up the indices in its
//!   range for all `G` samples (`embedding_bag_rows`); the receiver adds the partial
//!   sums in shard order;
//! - **data-parallel**: on every rank, looked up for the rank's own samples; its
//!   backward becomes a dense, all-reduced table gradient and a dense `sgd`.
//!
//! The pass is three steps, one module each (after `last_offset`, which makes
//! last_offset bags plain):
//! - `analysis`: the graph's sparse structure, checked (which nodes are bags, bag
//!   gradients, sparse updates; which bag each backward node belongs to; where
//!   tables, indices and row gradients may flow), and the tables' [`TableInfo`]s
//!   the planner works from;
//! - `rank`: rank `r`'s graph `<name>.rank<r>`, rebuilt node by node into a new
//!   graph: dense nodes as they are (losses over `G`), gradients all-reduced;
//! - `exchange`: the two `all_to_all`s of the model-parallel tables and the sparse
//!   nodes around them; `replicated`: the sparse nodes of data-parallel tables.
//!
//! # Per-rank graph `<name>.rank<r>`
//! - inputs: as in the source, except that the index/offset inputs of bags of
//!   tables rank `r` holds (whole or a row shard) get leading dimension `G` instead
//!   of `B` (`indices: [G, L]`; with offsets, `offsets: [G]` and the `indices: [N]`
//!   stay); those of tables it does not hold are absent; those of data-parallel
//!   tables stay `[B, ..]`. The offsets `[B+1]` of a last_offset bag
//!   (`include_last_offset=True`) become plain offsets (`[G]` or `[B]`) and its bag
//!   and bag gradient plain ones (`last_offset.rs`: the data sources give every
//!   rank offsets from 0 ending at the index count, so the last entry carries
//!   nothing the exchange needs). Parameters: the dense ones and the data-parallel tables,
//!   the tables it owns, and for a row shard `lo..hi` of table `t` a parameter
//!   `t.rows<lo>_<hi>` ([`RowShard`]; [`RowShard::slice`] cuts its value);
//! - forward: the held bags of the exchanged tables (in node order, outputs
//!   `%<bag>.G: [G, D]`) feed one `all_to_all {dir=scatter}` placed where the first
//!   bag was; its results are every exchanged bag's `[B, D]` output (a row-wise bag:
//!   one partial sum per shard, `%<bag>.rows<lo>_<hi>`, added into `%<bag>`),
//!   ordered by holder rank, then bag order, then shard; they carry the original
//!   bag names and replace the bag outputs for all users;
//! - backward (training graphs): the bag-output gradients of the exchanged bags
//!   (`[B, D]`, in the same order) feed one `all_to_all {dir=gather}` placed right
//!   after the last of them is computed; its results (`%<grad>.G: [G, D]`) feed the
//!   held bags' `embedding_bag_grad` (or fused update), followed by the held tables'
//!   `sparse_sgd`s (their `_rows` forms on a row shard);
//! - a data-parallel table's bag stays where it was, on the local samples; its bag
//!   gradient becomes `embedding_grad_dense` (`%<grad>.dense`), all-reduced
//!   (`%<grad>.dense.sum`), and its sparse update a dense `sgd` (`split_sgd`);
//! - `denom=B` of `bce`/`mse`/`bce_logits` and their gradients becomes `denom=G`, so
//!   the ranks' losses and gradients sum to the global mean;
//! - every gradient consumed by a dense `sgd` or `split_sgd` goes through its own
//!   `all_reduce` (`%<grad>.sum`), emitted right after the gradient is computed; a
//!   loss output is replaced by its `all_reduce` (`%<loss>.sum`), the global loss
//!   on every rank;
//! - dense nodes keep their names, types and order, so every rank issues its
//!   collectives in the same order.
//!
//! Optimised graphs partition the same way: a fused `embedding_update` (or
//! `split_embedding_update`, whose table low half `%t.lo` lives with its table and
//! is split at the same rows, or `embedding_update_adagrad`, whose accumulator
//! `%t.acc` does the same; a data-parallel table's becomes a dense `adagrad`) plays the role of the bag gradient and its
//! `sparse_sgd`; blocked weight gradients are all-reduced like any dense gradient.
//!
//! After this pass, the per-rank passes of the pipeline
//! ([`crate::pipeline::RANK_PASSES`]) run on every rank's graph: `bucket` fuses the
//! gradient all-reduces into buckets, `schedule` reorders the nodes (collectives
//! early, updates late). [`partition_with`] and [`partition_buckets`] run both;
//! [`rank_graphs`] is this pass alone.
//!
//! Structural requirements (errors otherwise): tables are parameters used only as
//! operand 0 of `embedding_bag` / `sparse_sgd` / fused updates; indices/offsets are
//! graph inputs used only by bags, bag gradients and sparse updates, and feed only
//! tables placed alike (all exchanged or all data-parallel); a bag's samples
//! dimension is `B`; every `embedding_bag_grad` feeds exactly one `sparse_sgd`
//! chain of a table with a matching bag; the graph holds no collective yet.

mod analysis;
mod exchange;
mod last_offset;
mod rank;
mod replicated;

use crate::shard::{Shard, ShardKind, ShardPlan};
use crate::{PassError, Result};
use analysis::Sparse;
use dlrm_ir::{Graph, Tensor, verify};
use rank::RankBuilder;
use serde::{Deserialize, Serialize};

/// The id used in errors and as the IR dump stage.
pub const ID: &str = "partition";

/// What the sharding planner knows about a table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TableInfo {
    /// The table parameter's name.
    pub name: String,
    /// Number of rows.
    pub rows: usize,
    /// Row width.
    pub dim: usize,
    /// Bytes per element.
    pub elem_bytes: usize,
    /// Lookups per sample over all the table's bags: the pooling factor `L` of a
    /// fixed-pooling bag (`indices: [B, L]`), 1 for a bag with offsets (its pooling
    /// is unknown at compile time).
    pub lookups_per_sample: usize,
    /// The number of bags (`embedding_bag` nodes) of the table; each is one
    /// `[G, D]` tensor in the exchange.
    #[serde(default = "one")]
    pub bags: usize,
    /// Bytes per row of the state sharded with the table: its Split-SGD-BF16 low
    /// half or its Adagrad accumulator (0 for plain SGD and inference).
    #[serde(default)]
    pub state_bytes_per_row: usize,
    /// Whether the table may be split by rows: every bag of it has a row-wise
    /// form (a weighted bag has none, so its table is placed whole).
    #[serde(default = "yes")]
    pub row_wise: bool,
}

fn one() -> usize {
    1
}

fn yes() -> bool {
    true
}

impl TableInfo {
    /// Bytes per row a holder keeps: the row and its state.
    pub fn bytes_per_row(&self) -> u64 {
        (self.dim * self.elem_bytes + self.state_bytes_per_row) as u64
    }

    /// Bytes of the whole table with its state.
    pub fn bytes(&self) -> u64 {
        (self.rows as u64).saturating_mul(self.bytes_per_row())
    }
}

/// The graph split into one graph per rank.
#[derive(Clone, Debug)]
pub struct Partitioned {
    /// Rank `r`'s graph at index `r`.
    pub graphs: Vec<Graph>,
    /// Where the tables went.
    pub plan: ShardPlan,
    /// The parameters that hold a row range of a table (row-wise tables; a rank
    /// creates a shard's value as its rows of the table, [`RowShard::slice`]).
    pub row_shards: Vec<RowShard>,
}

/// A parameter of the per-rank graphs holding rows `lo..hi` of a table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RowShard {
    /// The shard parameter's name: `<table>.rows<lo>_<hi>`.
    pub param: String,
    /// The table parameter it comes from.
    pub table: String,
    /// First row.
    pub lo: usize,
    /// One past the last row.
    pub hi: usize,
}

impl RowShard {
    /// Rows `lo..hi` of a table's value (any dtype); `None` if `t` is not a
    /// `[rows, D]` tensor (or a row-wise accumulator `[rows]`) with `hi <= rows`.
    pub fn slice(&self, t: &Tensor) -> Option<Tensor> {
        let (rows, d) = match t.shape[..] {
            [rows, d] => (rows, d),
            [rows] => (rows, 1),
            _ => return None,
        };
        if self.hi > rows || self.lo > self.hi {
            return None;
        }
        let r = self.lo * d..self.hi * d;
        let data = t.data.slice(r)?;
        let mut shape = t.shape.clone();
        shape[0] = self.hi - self.lo;
        Some(Tensor { shape, data })
    }
}

/// The embedding tables of `g` with their cost-model data, in parameter order.
pub fn tables(g: &Graph) -> Result<Vec<TableInfo>> {
    Ok(Sparse::analyze(last_offset::plain_offsets(g)?.as_ref())?.table_infos)
}

/// Partitions `g` as `plan` says (see the module docs), then runs the per-rank
/// passes with one `all_reduce` per gradient (no buckets).
pub fn partition_with(g: &Graph, plan: &ShardPlan) -> Result<Partitioned> {
    partition_buckets(g, plan, 0)
}

/// [`partition_with`] with gradient all-reduce buckets of `bucket_bytes` bytes
/// ([`crate::bucket()`]; 0: one `all_reduce` per gradient; `dlrm-run` uses
/// [`crate::DEFAULT_BUCKET_BYTES`] unless `--bucket-bytes` says otherwise).
pub fn partition_buckets(g: &Graph, plan: &ShardPlan, bucket_bytes: u64) -> Result<Partitioned> {
    crate::pipeline::partition(g, plan, bucket_bytes, &mut |_, _, _| {})
}

/// The partition pass alone: rank `r`'s graph at index `r`, before the per-rank
/// passes (one `all_reduce` per gradient, nodes in source order; module docs).
pub fn rank_graphs(g: &Graph, plan: &ShardPlan) -> Result<Partitioned> {
    verify(g).map_err(PassError::ir(ID))?;
    let plain = last_offset::plain_offsets(g)?;
    let g = plain.as_ref();
    let sparse = Sparse::analyze(g)?;
    plan.check(&sparse.table_infos)?;
    let (home, row_shards) = homes(g, &sparse, plan)?;
    let graphs = (0..plan.ranks)
        .map(|r| RankBuilder::new(g, &sparse, &home, plan.ranks, r).build())
        .collect::<Result<Vec<_>>>()?;
    Ok(Partitioned {
        graphs,
        plan: plan.clone(),
        row_shards,
    })
}

/// Where a parameter lives.
#[derive(Clone, Debug)]
enum Home {
    /// Not a table: dense parameters (replicated) and non-parameters.
    NotTable,
    /// A table-wise table on its owner.
    Owner(usize),
    /// A row-wise table: its shards (row order) and their parameter names.
    Rows(Vec<Shard>, Vec<String>),
    /// A data-parallel table, on every rank.
    Replicated,
}

/// Every value's [`Home`] under `plan` (tables and their Split-SGD-BF16 low halves;
/// everything else [`Home::NotTable`]) and the row-shard parameters.
fn homes(g: &Graph, sparse: &Sparse, plan: &ShardPlan) -> Result<(Vec<Home>, Vec<RowShard>)> {
    let mut home = vec![Home::NotTable; g.values().len()];
    let mut row_shards = Vec::new();
    for (&t, tp) in sparse.tables.iter().zip(&plan.tables) {
        home[t.index()] = match tp.kind {
            ShardKind::TableWise => Home::Owner(tp.shards[0].rank),
            ShardKind::DataParallel => Home::Replicated,
            ShardKind::RowWise => {
                let names = shard_names(g, &tp.table, &tp.shards, &mut row_shards)?;
                Home::Rows(tp.shards.clone(), names)
            }
        };
    }
    // A Split-SGD-BF16 low half lives with its table; a row-wise table's low half
    // is split at the same rows (shards `<low half>.rows<lo>_<hi>`).
    for &(lo, t) in &sparse.companions {
        home[lo.index()] = match &home[t.index()] {
            Home::Rows(shards, _) => {
                let names = shard_names(g, g.name_of(lo), shards, &mut row_shards)?;
                Home::Rows(shards.clone(), names)
            }
            other => other.clone(),
        };
    }
    Ok((home, row_shards))
}

/// The parameter names `<table>.rows<lo>_<hi>` of `shards`, recorded in `out`.
fn shard_names(
    g: &Graph,
    table: &str,
    shards: &[Shard],
    out: &mut Vec<RowShard>,
) -> Result<Vec<String>> {
    let mut names = Vec::with_capacity(shards.len());
    for s in shards {
        let name = format!("{table}.rows{}_{}", s.lo, s.hi);
        if g.find(&name).is_some() {
            return Err(graph_err(
                g,
                format!("the shard name %{name} is already a value of the graph"),
            ));
        }
        out.push(RowShard {
            param: name.clone(),
            table: table.to_string(),
            lo: s.lo,
            hi: s.hi,
        });
        names.push(name);
    }
    Ok(names)
}

fn node_err(g: &Graph, n: usize, reason: String) -> PassError {
    PassError::Node {
        pass: ID.to_string(),
        node: g.node_label(n),
        op: g.nodes()[n].op.mnemonic().to_string(),
        reason,
    }
}

fn graph_err(g: &Graph, reason: String) -> PassError {
    PassError::Graph {
        pass: ID.to_string(),
        graph: g.name.clone(),
        reason,
    }
}
