//! Hybrid-parallel partitioning: one graph per rank (DOMAIN.md, "Hybrid parallel
//! training"; [`dlrm_ir::Op::AllToAll`] for the exchange's exact semantics).
//!
//! Embedding tables are model parallel: each table lives on one rank (its *owner*),
//! which looks up its bags for the whole global batch `G`. MLPs, interaction and loss
//! are data parallel: every rank runs them on its own `B` samples.
//!
//! # Placement
//! Tables are placed by a deterministic cost model (a function of the table list and
//! the rank count only, so the training and inference graphs of one model place
//! identically):
//!
//! `cost(t) = rows · dim · elem_bytes + lookups_per_sample · dim`
//!
//! the table's memory in bytes plus its per-sample pooling work in elements, where
//! `lookups_per_sample` sums over the table's bags the pooling factor `L` of
//! fixed-pooling bags (`indices: [B, L]`) and counts 1 for a bag with offsets (its
//! pooling is unknown at compile time). Tables are sorted by decreasing cost (ties by
//! name) and each goes to the least-loaded rank so far (ties to the lowest rank):
//! the LPT greedy heuristic, whose final loads differ by at most the largest table
//! cost. Ranks may own no table.
//!
//! # Per-rank graph `<name>.rank<r>`
//! Rebuilt node by node into a new graph (nothing is mutated in place):
//! - inputs: as in the source, except that the index/offset inputs of bags whose table
//!   rank `r` does not own are absent, and those of owned bags get leading dimension
//!   `G` instead of `B` (`indices: [G, L]`; with offsets, `offsets: [G]` and the
//!   `indices: [N]` stay); parameters: as in the source minus the tables not owned;
//! - forward: the owned bags (in node order, outputs `%<bag>.G: [G, D]`) feed one
//!   `all_to_all {dir=scatter}` placed where the first bag was; its results are every
//!   bag's `[B, D]` output, ordered by owner rank then bag order, carry the original
//!   bag names and replace the bag outputs for all users;
//! - backward (training graphs): the bag-output gradients of every bag (`[B, D]`, in
//!   the same owner-grouped order) feed one `all_to_all {dir=gather}` placed right
//!   after the last of them is computed; its results (`%<grad>.G: [G, D]`) feed the
//!   owned bags' `embedding_bag_grad`, followed by the owned tables' `sparse_sgd`s;
//! - `denom=B` of `bce`/`mse`/`bce_grad`/`mse_grad` becomes `denom=G`, so the ranks'
//!   losses and gradients sum to the global mean;
//! - every gradient consumed by a dense `sgd` goes through its own `all_reduce`
//!   (`%<grad>.sum`), emitted right after the gradient is computed; a loss output
//!   (a `bce`/`mse` result) is replaced by its `all_reduce` (`%<loss>.sum`), the global
//!   loss on every rank;
//! - dense nodes keep their names, types and order, so every rank issues its
//!   collectives in the same order.
//!
//! Each rank's graph then has its gradient `all_reduce`s fused into buckets by
//! [`crate::bucket()`] when [`partition_buckets`] is given a bucket size (the other
//! entry points keep one per gradient; the loss's always stays alone) and is
//! reordered by
//! [`crate::schedule()`] (collectives as early
//! as their operands allow, work that feeds no collective — the optimizer updates —
//! last), keeping the collectives' relative order; the positions above are those
//! before scheduling.
//!
//! Optimised graphs partition the same way: a fused `embedding_update` (or
//! `split_embedding_update`, whose table low half `%t.lo` lives with its table on
//! the owner) plays the role of the bag gradient and its `sparse_sgd`, fed by the
//! gathered `[G, D]` gradient; blocked weight gradients consumed by `sgd` or
//! `split_sgd` are `all_reduce`d like any dense gradient; `bce_logits` is a loss
//! (`denom` becomes `G`, its value is all-reduced).
//!
//! Structural requirements (errors otherwise): tables are parameters used only as
//! operand 0 of `embedding_bag` / `sparse_sgd`; indices/offsets are graph inputs used
//! only by bags, bag gradients and `sparse_sgd`; a bag's samples dimension is `B`;
//! every `embedding_bag_grad` feeds exactly one `sparse_sgd` chain of a table with a
//! matching bag; the graph holds no collective yet.

use crate::shard::{Shard, ShardKind, ShardPlan};
use crate::{PassError, Result};
use dlrm_ir::{A2aDir, Data, Def, Dim, Graph, Op, Tensor, TensorType, ValueId, verify};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::fmt;

/// The id used in errors and as the IR dump stage.
pub const ID: &str = "partition";

/// What the placement cost model knows about a table.
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
    /// Lookups per sample over all the table's bags (see the module docs).
    pub lookups_per_sample: usize,
    /// The number of bags (`embedding_bag` nodes) of the table; each is one
    /// `[G, D]` tensor in the exchange.
    #[serde(default = "one")]
    pub bags: usize,
}

fn one() -> usize {
    1
}

impl TableInfo {
    /// `rows · dim · elem_bytes + lookups_per_sample · dim`.
    pub fn cost(&self) -> f64 {
        (self.rows as f64) * (self.dim as f64) * (self.elem_bytes as f64)
            + (self.lookups_per_sample as f64) * (self.dim as f64)
    }
}

/// Which rank owns which table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    /// `(table parameter, owner rank)`, in the order the tables were given.
    pub table_owner: Vec<(String, usize)>,
    /// The summed cost of each rank's tables.
    pub per_rank_cost: Vec<f64>,
}

impl Placement {
    /// The number of ranks.
    pub fn ranks(&self) -> usize {
        self.per_rank_cost.len()
    }

    /// The owner of `table`, if it is placed.
    pub fn owner(&self, table: &str) -> Option<usize> {
        self.table_owner
            .iter()
            .find(|(t, _)| t == table)
            .map(|&(_, r)| r)
    }

    /// The tables rank `rank` owns, in table order.
    pub fn tables_of(&self, rank: usize) -> Vec<&str> {
        self.table_owner
            .iter()
            .filter(|&&(_, r)| r == rank)
            .map(|(t, _)| t.as_str())
            .collect()
    }
}

impl fmt::Display for Placement {
    /// One line per rank: `rank 0 (cost 1234): emb.0, emb.2`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (r, cost) in self.per_rank_cost.iter().enumerate() {
            let tables = self.tables_of(r);
            let tables = if tables.is_empty() {
                "-".to_string()
            } else {
                tables.join(", ")
            };
            writeln!(f, "rank {r} (cost {cost}): {tables}")?;
        }
        Ok(())
    }
}

/// Places `tables` on `ranks` ranks with the LPT greedy heuristic (module docs).
pub fn place(tables: &[TableInfo], ranks: usize) -> Result<Placement> {
    if ranks == 0 {
        return Err(PassError::Arg {
            pass: ID.to_string(),
            reason: "the rank count must be at least 1".into(),
        });
    }
    let mut order: Vec<usize> = (0..tables.len()).collect();
    order.sort_by(|&a, &b| {
        tables[b]
            .cost()
            .total_cmp(&tables[a].cost())
            .then_with(|| tables[a].name.cmp(&tables[b].name))
    });
    let mut load = vec![0.0f64; ranks];
    let mut owner = vec![0usize; tables.len()];
    for t in order {
        let mut best = 0;
        for r in 1..ranks {
            if load[r] < load[best] {
                best = r;
            }
        }
        owner[t] = best;
        load[best] += tables[t].cost();
    }
    Ok(Placement {
        table_owner: tables
            .iter()
            .zip(owner)
            .map(|(t, r)| (t.name.clone(), r))
            .collect(),
        per_rank_cost: load,
    })
}

/// The graph split into one graph per rank.
#[derive(Clone, Debug)]
pub struct Partitioned {
    /// Rank `r`'s graph at index `r`.
    pub graphs: Vec<Graph>,
    /// Where the tables went.
    pub plan: ShardPlan,
    /// The parameters that hold a row range of a table (row-wise tables), for
    /// [`Partitioned::shard_params`].
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
    /// `[rows, D]` tensor with `hi <= rows`.
    pub fn slice(&self, t: &Tensor) -> Option<Tensor> {
        let [rows, d] = t.shape[..] else {
            return None;
        };
        if self.hi > rows || self.lo > self.hi {
            return None;
        }
        let r = self.lo * d..self.hi * d;
        let data = match &t.data {
            Data::F32(v) => Data::F32(v.get(r)?.to_vec()),
            Data::BF16(v) => Data::BF16(v.get(r)?.to_vec()),
            Data::I64(v) => Data::I64(v.get(r)?.to_vec()),
            Data::I32(v) => Data::I32(v.get(r)?.to_vec()),
        };
        Some(Tensor {
            shape: vec![self.hi - self.lo, d],
            data,
        })
    }
}

impl Partitioned {
    /// `params` (name, value) with every row shard's slice added (the tables
    /// themselves stay; the per-rank graphs do not declare the split ones).
    pub fn shard_params(&self, mut params: Vec<(String, Tensor)>) -> Result<Vec<(String, Tensor)>> {
        for s in &self.row_shards {
            let t = params
                .iter()
                .find(|(n, _)| *n == s.table)
                .map(|(_, t)| t)
                .ok_or_else(|| PassError::Arg {
                    pass: ID.to_string(),
                    reason: format!("no value for the row-wise table `{}`", s.table),
                })?;
            let slice = s.slice(t).ok_or_else(|| PassError::Arg {
                pass: ID.to_string(),
                reason: format!(
                    "the value of `{}` (shape {:?}) has no rows {}..{}",
                    s.table, t.shape, s.lo, s.hi
                ),
            })?;
            params.push((s.param.clone(), slice));
        }
        Ok(params)
    }
}

/// The embedding tables of `g` with their cost-model data, in parameter order.
pub fn tables(g: &Graph) -> Result<Vec<TableInfo>> {
    Ok(Sparse::analyze(g)?.table_infos)
}

/// Partitions `g` for `ranks` ranks with every table placed table-wise by [`place`]
/// (see the module docs), one `all_reduce` per gradient.
pub fn partition(g: &Graph, ranks: usize) -> Result<Partitioned> {
    if ranks == 0 {
        return Err(PassError::Arg {
            pass: ID.to_string(),
            reason: "the rank count must be at least 1".into(),
        });
    }
    verify(g).map_err(PassError::ir(ID))?;
    let sparse = Sparse::analyze(g)?;
    let placement = place(&sparse.table_infos, ranks)?;
    let plan = ShardPlan::table_wise(&placement, &sparse.table_infos);
    partition_sparse(g, &sparse, &plan, 0)
}

/// Partitions `g` as `plan` says (table-wise, row-wise and data-parallel tables;
/// see the module docs and [`crate::shard`]).
/// One `all_reduce` per gradient (no buckets, as [`partition`]).
pub fn partition_with(g: &Graph, plan: &ShardPlan) -> Result<Partitioned> {
    partition_buckets(g, plan, 0)
}

/// [`partition_with`] with gradient all-reduce buckets of `bucket_bytes` bytes
/// ([`crate::bucket()`]; 0: one `all_reduce` per gradient; `dlrm-run` uses
/// [`crate::DEFAULT_BUCKET_BYTES`] unless `--bucket-bytes` says otherwise).
pub fn partition_buckets(g: &Graph, plan: &ShardPlan, bucket_bytes: u64) -> Result<Partitioned> {
    verify(g).map_err(PassError::ir(ID))?;
    let sparse = Sparse::analyze(g)?;
    plan.check(&sparse.table_infos)?;
    partition_sparse(g, &sparse, plan, bucket_bytes)
}

fn partition_sparse(
    g: &Graph,
    sparse: &Sparse,
    plan: &ShardPlan,
    bucket_bytes: u64,
) -> Result<Partitioned> {
    let mut home = vec![Home::NotTable; g.values().len()];
    let mut row_shards = Vec::new();
    for (&t, tp) in sparse.tables.iter().zip(&plan.tables) {
        home[t.index()] = match tp.kind {
            ShardKind::TableWise => Home::Owner(tp.shards[0].rank),
            ShardKind::DataParallel => Home::Replicated,
            ShardKind::RowWise => {
                let mut names = Vec::with_capacity(tp.shards.len());
                for s in &tp.shards {
                    let name = format!("{}.rows{}_{}", tp.table, s.lo, s.hi);
                    if g.find(&name).is_some() {
                        return Err(graph_err(
                            g,
                            format!("the shard name %{name} is already a value of the graph"),
                        ));
                    }
                    row_shards.push(RowShard {
                        param: name.clone(),
                        table: tp.table.clone(),
                        lo: s.lo,
                        hi: s.hi,
                    });
                    names.push(name);
                }
                Home::Rows(tp.shards.clone(), names)
            }
        };
    }
    // A Split-SGD-BF16 low half lives with its table; a row-wise table's low half
    // is split at the same rows (shards `<low half>.rows<lo>_<hi>`).
    for &(lo, t) in &sparse.companions {
        home[lo.index()] = match &home[t.index()] {
            Home::Rows(shards, _) => {
                let mut names = Vec::with_capacity(shards.len());
                for s in shards {
                    let name = format!("{}.rows{}_{}", g.name_of(lo), s.lo, s.hi);
                    if g.find(&name).is_some() {
                        return Err(graph_err(
                            g,
                            format!("the shard name %{name} is already a value of the graph"),
                        ));
                    }
                    row_shards.push(RowShard {
                        param: name.clone(),
                        table: g.name_of(lo).to_string(),
                        lo: s.lo,
                        hi: s.hi,
                    });
                    names.push(name);
                }
                Home::Rows(shards.clone(), names)
            }
            other => other.clone(),
        };
    }
    let graphs = (0..plan.ranks)
        .map(|r| {
            RankBuilder::new(g, sparse, &home, plan.ranks, r)
                .build()
                .and_then(|rank_graph| crate::bucket(&rank_graph, bucket_bytes))
                .and_then(|rank_graph| crate::schedule(&rank_graph))
        })
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

// ------------------------------------------------------------------ analysis

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Dense,
    Bag,
    BagGrad,
    SparseSgd,
    /// `embedding_update`: bag gradient and sparse SGD fused.
    Update,
}

#[derive(Clone, Debug)]
struct Bag {
    node: usize,
    table: ValueId,
    out: ValueId,
    /// The `embedding_bag_grad` node of this bag, in a training graph.
    grad: Option<usize>,
}

/// The sparse (embedding) structure of a graph, checked.
struct Sparse {
    kinds: Vec<Kind>,
    /// In node order.
    bags: Vec<Bag>,
    /// Table parameters, in parameter order.
    tables: Vec<ValueId>,
    table_infos: Vec<TableInfo>,
    /// Per value: an index/offset input of a bag.
    is_index: Vec<bool>,
    /// Per node: the root table of a `sparse_sgd` or fused update.
    sgd_root: Vec<Option<ValueId>>,
    /// Per node: the root table of an `embedding_bag_grad`.
    grad_root: Vec<Option<ValueId>>,
    /// Split-SGD-BF16 low halves of tables: `(low-half parameter, its table)`.
    companions: Vec<(ValueId, ValueId)>,
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

impl Sparse {
    fn analyze(g: &Graph) -> Result<Sparse> {
        let nvals = g.values().len();
        let nodes = g.nodes();
        let mut kinds = vec![Kind::Dense; nodes.len()];
        let mut bags = Vec::new();
        let mut is_table = vec![false; nvals];
        let mut is_index = vec![false; nvals];
        let mut sgd_root: Vec<Option<ValueId>> = vec![None; nodes.len()];
        let mut companions: Vec<(ValueId, ValueId)> = Vec::new();
        let def_node = |v: ValueId| match g.value(v).def {
            Def::Node(m, _) => Some(m),
            _ => None,
        };
        if let Some(n) = nodes.iter().position(|node| node.op.is_collective()) {
            return Err(node_err(
                g,
                n,
                "the graph already holds collectives (is it partitioned?)".into(),
            ));
        }
        for (n, node) in nodes.iter().enumerate() {
            match node.op {
                Op::EmbeddingBag { .. } => {
                    kinds[n] = Kind::Bag;
                    let table = node.inputs[0];
                    if !matches!(g.value(table).def, Def::Param(_)) {
                        return Err(node_err(
                            g,
                            n,
                            format!("the table %{} must be a parameter", g.name_of(table)),
                        ));
                    }
                    for &v in &node.inputs[1..] {
                        if !matches!(g.value(v).def, Def::Input(_)) {
                            return Err(node_err(
                                g,
                                n,
                                format!("indices/offsets %{} must be a graph input", g.name_of(v)),
                            ));
                        }
                        is_index[v.index()] = true;
                    }
                    let out = node.outputs[0];
                    if !g.ty(out).shape[0].is_sym(Dim::BATCH) {
                        return Err(node_err(
                            g,
                            n,
                            format!(
                                "the bag's samples dimension must be {}, got {}",
                                Dim::BATCH,
                                g.ty(out)
                            ),
                        ));
                    }
                    is_table[table.index()] = true;
                    bags.push(Bag {
                        node: n,
                        table,
                        out,
                        grad: None,
                    });
                }
                Op::EmbeddingBagGrad { .. } => kinds[n] = Kind::BagGrad,
                Op::SparseSgd { .. }
                | Op::EmbeddingUpdate { .. }
                | Op::SplitEmbeddingUpdate { .. } => {
                    kinds[n] = if matches!(node.op, Op::SparseSgd { .. }) {
                        Kind::SparseSgd
                    } else {
                        Kind::Update
                    };
                    let t = node.inputs[0];
                    let root = if is_table[t.index()] {
                        Some(t)
                    } else {
                        def_node(t).and_then(|m| sgd_root[m])
                    };
                    let Some(root) = root else {
                        return Err(node_err(
                            g,
                            n,
                            format!(
                                "%{} is neither an embedding table nor a sparse_sgd of one",
                                g.name_of(t)
                            ),
                        ));
                    };
                    sgd_root[n] = Some(root);
                }
                _ => {}
            }
        }

        // Bag gradients: each feeds exactly one sparse_sgd, with the same indices.
        let users = g.users();
        let mut grad_root: Vec<Option<ValueId>> = vec![None; nodes.len()];
        for (n, node) in nodes.iter().enumerate() {
            if kinds[n] != Kind::SparseSgd {
                continue;
            }
            let rows = node.inputs[2];
            let bg = def_node(rows).filter(|&m| kinds[m] == Kind::BagGrad);
            let Some(bg) = bg else {
                return Err(node_err(
                    g,
                    n,
                    format!(
                        "the row gradient %{} must come from embedding_bag_grad",
                        g.name_of(rows)
                    ),
                ));
            };
            if nodes[bg].inputs[1] != node.inputs[1] {
                return Err(node_err(
                    g,
                    n,
                    "indices differ from those of its embedding_bag_grad".into(),
                ));
            }
            if grad_root[bg].is_some() {
                return Err(node_err(
                    g,
                    bg,
                    "the row gradient feeds more than one sparse_sgd".into(),
                ));
            }
            grad_root[bg] = sgd_root[n];
        }
        for (k, node) in nodes.iter().enumerate() {
            if kinds[k] != Kind::BagGrad {
                continue;
            }
            let Some(root) = grad_root[k] else {
                return Err(node_err(
                    g,
                    k,
                    "the row gradient must feed a sparse_sgd".into(),
                ));
            };
            let dy = node.inputs[0];
            if def_node(dy).is_some_and(|m| kinds[m] != Kind::Dense) {
                return Err(node_err(
                    g,
                    k,
                    format!("the gradient %{} must be a dense value", g.name_of(dy)),
                ));
            }
            let Op::EmbeddingBagGrad { mode } = node.op else {
                continue;
            };
            let bag = bags.iter_mut().find(|b| {
                let bn = &nodes[b.node];
                b.grad.is_none()
                    && b.table == root
                    && bn.inputs[1..] == node.inputs[1..]
                    && bn.op == Op::EmbeddingBag { mode }
            });
            match bag {
                Some(b) => b.grad = Some(k),
                None => {
                    return Err(node_err(
                        g,
                        k,
                        format!(
                            "no embedding_bag of %{} with these indices is left to match it",
                            g.name_of(root)
                        ),
                    ));
                }
            }
        }

        // Fused updates: each matches a bag of its table with the same indices.
        for (k, node) in nodes.iter().enumerate() {
            if kinds[k] != Kind::Update {
                continue;
            }
            let dy = bag_dy(g, k);
            if def_node(dy).is_some_and(|m| kinds[m] != Kind::Dense) {
                return Err(node_err(
                    g,
                    k,
                    format!("the gradient %{} must be a dense value", g.name_of(dy)),
                ));
            }
            let (mode, first_index) = match &node.op {
                Op::EmbeddingUpdate { mode, .. } => (mode, 2),
                Op::SplitEmbeddingUpdate { mode, .. } => {
                    let lo = node.inputs[1];
                    if let (Def::Param(_), Some(root)) = (g.value(lo).def, sgd_root[k]) {
                        companions.push((lo, root));
                    }
                    (mode, 3)
                }
                _ => continue,
            };
            let Some(root) = sgd_root[k] else {
                continue;
            };
            let bag = bags.iter_mut().find(|b| {
                let bn = &nodes[b.node];
                b.grad.is_none()
                    && b.table == root
                    && bn.inputs[1..] == node.inputs[first_index..]
                    && bn.op == Op::EmbeddingBag { mode: *mode }
            });
            match bag {
                Some(b) => b.grad = Some(k),
                None => {
                    return Err(node_err(
                        g,
                        k,
                        format!(
                            "no embedding_bag of %{} with these indices is left to match it",
                            g.name_of(root)
                        ),
                    ));
                }
            }
        }

        // Where sparse values may go.
        let outputs: HashSet<ValueId> = g.outputs().iter().copied().collect();
        for (i, v) in g.values().iter().enumerate() {
            let id = ValueId(i as u32);
            let allowed: &[(Kind, &[usize])] = if is_table[i] {
                &[
                    (Kind::Bag, &[0]),
                    (Kind::SparseSgd, &[0]),
                    (Kind::Update, &[0]),
                ]
            } else if is_index[i] {
                &[
                    (Kind::Bag, &[1, 2]),
                    (Kind::BagGrad, &[1, 2]),
                    (Kind::SparseSgd, &[1]),
                    (Kind::Update, &[2, 3, 4]),
                ]
            } else {
                match def_node(id).map(|m| kinds[m]) {
                    Some(Kind::BagGrad) => &[(Kind::SparseSgd, &[2])],
                    Some(Kind::SparseSgd | Kind::Update) => {
                        &[(Kind::SparseSgd, &[0]), (Kind::Update, &[0, 1])]
                    }
                    _ => continue,
                }
            };
            if outputs.contains(&id) {
                return Err(graph_err(
                    g,
                    format!("%{} is embedding state and cannot be an output", v.name),
                ));
            }
            for &n in &users[i] {
                let node = &nodes[n];
                for (slot, _) in node.inputs.iter().enumerate().filter(|(_, x)| **x == id) {
                    let ok = allowed
                        .iter()
                        .any(|(k, slots)| *k == kinds[n] && slots.contains(&slot));
                    if !ok {
                        return Err(node_err(
                            g,
                            n,
                            format!(
                                "uses embedding state %{} as operand {slot}: unsupported",
                                v.name
                            ),
                        ));
                    }
                }
            }
        }
        for u in g.updates() {
            let root = def_node(u.value).and_then(|m| sgd_root[m]);
            let companion = companions
                .iter()
                .find(|(lo, _)| *lo == u.param)
                .map(|&(_, t)| t);
            let state = if companion.is_some() {
                companion
            } else {
                is_table[u.param.index()].then_some(u.param)
            };
            if state != root {
                return Err(graph_err(
                    g,
                    format!(
                        "update of %{} by %{}: a table must be updated by its own sparse_sgd",
                        g.name_of(u.param),
                        g.name_of(u.value)
                    ),
                ));
            }
        }

        let tables: Vec<ValueId> = g
            .params()
            .iter()
            .copied()
            .filter(|p| is_table[p.index()])
            .collect();
        let mut table_infos = Vec::with_capacity(tables.len());
        for &t in &tables {
            let ty = g.ty(t);
            let (Some(rows), Some(dim)) = (ty.shape[0].fixed(), ty.shape[1].fixed()) else {
                return Err(graph_err(
                    g,
                    format!("table %{} must have a fixed shape, got {ty}", g.name_of(t)),
                ));
            };
            let lookups = bags
                .iter()
                .filter(|b| b.table == t)
                .map(|b| {
                    let ins = &nodes[b.node].inputs;
                    if ins.len() == 2 {
                        g.ty(ins[1]).shape[1].fixed().unwrap_or(1)
                    } else {
                        1
                    }
                })
                .sum();
            table_infos.push(TableInfo {
                name: g.name_of(t).to_string(),
                rows,
                dim,
                elem_bytes: ty.dtype.size_bytes(),
                lookups_per_sample: lookups,
                bags: bags.iter().filter(|b| b.table == t).count(),
            });
        }
        Ok(Sparse {
            kinds,
            bags,
            tables,
            table_infos,
            is_index,
            sgd_root,
            grad_root,
            companions,
        })
    }
}

// ------------------------------------------------------------------ rebuild

/// One `[G, D]` tensor of the exchange: a bag looked up by one rank, for the whole
/// table (table-wise) or one row shard (`Some(k)`: shard index).
#[derive(Clone, Copy)]
struct Inst<'a> {
    bag: &'a Bag,
    rank: usize,
    shard: Option<usize>,
}

struct RankBuilder<'a> {
    g: &'a Graph,
    sp: &'a Sparse,
    /// Per value: where it lives (tables and their low halves).
    home: &'a [Home],
    ranks: usize,
    rank: usize,
    ng: Graph,
    map: Vec<Option<ValueId>>,
    /// Per source value: its all_reduce in the new graph (dense gradients, losses).
    reduced: Vec<Option<ValueId>>,
    /// Per source value: must be all_reduced once defined.
    to_reduce: Vec<bool>,
    /// Per source value (row gradient of a replicated table's bag): the all-reduced
    /// dense table gradient that replaces it.
    dense_grad: Vec<Option<ValueId>>,
    names: HashSet<&'a str>,
}

impl<'a> RankBuilder<'a> {
    fn new(g: &'a Graph, sp: &'a Sparse, home: &'a [Home], ranks: usize, rank: usize) -> Self {
        let nvals = g.values().len();
        let mut to_reduce = vec![false; nvals];
        for node in g.nodes() {
            match node.op {
                Op::Sgd { .. } => to_reduce[node.inputs[1].index()] = true,
                Op::SplitSgd { .. } => to_reduce[node.inputs[2].index()] = true,
                _ => {}
            }
        }
        for &o in g.outputs() {
            if is_loss(g, o) {
                to_reduce[o.index()] = true;
            }
        }
        RankBuilder {
            g,
            sp,
            home,
            ranks,
            rank,
            ng: Graph::new(format!("{}.rank{rank}", g.name)),
            map: vec![None; nvals],
            reduced: vec![None; nvals],
            to_reduce,
            dense_grad: vec![None; nvals],
            names: g.values().iter().map(|v| v.name.as_str()).collect(),
        }
    }

    fn replicated(&self, table: ValueId) -> bool {
        matches!(self.home[table.index()], Home::Replicated)
    }

    /// This rank's part of a model-parallel table: `Some(None)` the whole table,
    /// `Some(Some(k))` row shard `k`, `None` nothing (or a replicated table).
    fn held(&self, table: ValueId) -> Option<Option<usize>> {
        match &self.home[table.index()] {
            Home::Owner(r) if *r == self.rank => Some(None),
            Home::Rows(shards, _) => shards.iter().position(|s| s.rank == self.rank).map(Some),
            _ => None,
        }
    }

    /// A name free in both the source and the new graph.
    fn fresh(&self, hint: &str) -> String {
        let free = |n: &str| !self.names.contains(n) && self.ng.find(n).is_none();
        if free(hint) {
            return hint.to_string();
        }
        (1..)
            .map(|i| format!("{hint}.{i}"))
            .find(|n| free(n))
            .unwrap_or_else(|| unreachable!("an unbounded range always finds a free name"))
    }

    fn get(&self, v: ValueId) -> Result<ValueId> {
        self.map[v.index()].ok_or_else(|| {
            graph_err(
                self.g,
                format!(
                    "%{} is needed but rank {} does not hold it",
                    self.g.name_of(v),
                    self.rank
                ),
            )
        })
    }

    /// Records the new value of `old`, and all-reduces it if it must be.
    fn define(&mut self, old: ValueId, new: ValueId) -> Result<()> {
        self.map[old.index()] = Some(new);
        if self.to_reduce[old.index()] {
            let name = self.fresh(&format!("{}.sum", self.g.name_of(old)));
            let r = self
                .ng
                .add(Op::AllReduce, &[new], &name)
                .map_err(PassError::ir(ID))?;
            self.reduced[old.index()] = Some(r);
        }
        Ok(())
    }

    /// The exchanged tensors in order: by holder rank, then bag (node order), then
    /// shard; only bags with a gradient when `with_grad`. Also the count per rank.
    fn exchange_order(&self, with_grad: bool) -> (Vec<Inst<'a>>, Vec<usize>) {
        let mut order: Vec<Inst<'a>> = Vec::new();
        for b in &self.sp.bags {
            if with_grad && b.grad.is_none() {
                continue;
            }
            match &self.home[b.table.index()] {
                Home::Owner(r) => order.push(Inst {
                    bag: b,
                    rank: *r,
                    shard: None,
                }),
                Home::Rows(shards, _) => {
                    for (k, s) in shards.iter().enumerate() {
                        order.push(Inst {
                            bag: b,
                            rank: s.rank,
                            shard: Some(k),
                        });
                    }
                }
                Home::Replicated | Home::NotTable => {}
            }
        }
        order.sort_by_key(|i| i.rank);
        let mut counts = vec![0usize; self.ranks];
        for i in &order {
            counts[i.rank] += 1;
        }
        (order, counts)
    }

    /// The shard `k` of a row-wise table.
    fn shard(&self, table: ValueId, k: usize) -> Result<Shard> {
        match &self.home[table.index()] {
            Home::Rows(shards, _) => Ok(shards[k]),
            _ => Err(graph_err(
                self.g,
                format!("internal: %{} is not row-wise", self.g.name_of(table)),
            )),
        }
    }

    fn table_rows(&self, table: ValueId) -> usize {
        self.g.ty(table).shape[0].fixed().unwrap_or(0)
    }

    fn scatter_block(&mut self) -> Result<()> {
        let e = PassError::ir(ID);
        let g = self.g;
        let (order, counts) = self.exchange_order(false);
        if order.is_empty() {
            return Ok(());
        }
        let mut owned = Vec::new();
        for inst in order.iter().filter(|i| i.rank == self.rank) {
            let b = inst.bag;
            let node = &g.nodes()[b.node];
            let ins = node
                .inputs
                .iter()
                .map(|&v| self.get(v))
                .collect::<Result<Vec<_>>>()?;
            let name = self.fresh(&format!("{}.G", g.name_of(b.out)));
            let op = match (inst.shard, &node.op) {
                (None, op) => op.clone(),
                (Some(k), Op::EmbeddingBag { mode }) => {
                    let s = self.shard(b.table, k)?;
                    Op::EmbeddingBagRows {
                        mode: *mode,
                        lo: s.lo,
                        rows: self.table_rows(b.table),
                    }
                }
                (Some(_), op) => {
                    return Err(node_err(
                        g,
                        b.node,
                        format!("`{}` has no row-wise form", op.mnemonic()),
                    ));
                }
            };
            owned.push(self.ng.add(op, &ins, &name).map_err(&e)?);
        }
        let mut names = Vec::with_capacity(order.len());
        for inst in &order {
            let out = g.name_of(inst.bag.out);
            names.push(match inst.shard {
                None => out.to_string(),
                Some(k) => {
                    let s = self.shard(inst.bag.table, k)?;
                    self.fresh(&format!("{out}.rows{}_{}", s.lo, s.hi))
                }
            });
        }
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let declared: Vec<TensorType> = order.iter().map(|i| g.ty(i.bag.out).clone()).collect();
        let op = Op::AllToAll {
            dir: A2aDir::Scatter,
            counts,
            rank: self.rank,
        };
        let res = self
            .ng
            .add_node_typed(op, &owned, &names, &declared)
            .map_err(&e)?;
        // Whole bags are defined directly; row shards' partial sums are added in
        // shard order: ((p0 + p1) + p2) ...
        let mut partials: Vec<Vec<(usize, ValueId)>> = vec![Vec::new(); g.nodes().len()];
        for (inst, v) in order.iter().zip(res) {
            match inst.shard {
                None => self.define(inst.bag.out, v)?,
                Some(k) => partials[inst.bag.node].push((k, v)),
            }
        }
        for b in &self.sp.bags {
            let mut parts = std::mem::take(&mut partials[b.node]);
            if parts.is_empty() {
                continue;
            }
            parts.sort_by_key(|&(k, _)| k);
            let mut acc = parts[0].1;
            for (i, &(_, p)) in parts.iter().enumerate().skip(1) {
                let name = if i + 1 == parts.len() {
                    g.name_of(b.out).to_string()
                } else {
                    self.fresh(&format!("{}.psum{i}", g.name_of(b.out)))
                };
                acc = self.ng.add(Op::Add, &[acc, p], &name).map_err(&e)?;
            }
            self.define(b.out, acc)?;
        }
        Ok(())
    }

    fn gather_block(&mut self) -> Result<()> {
        let e = PassError::ir(ID);
        let g = self.g;
        let (order, counts) = self.exchange_order(true);
        let mut operands = Vec::with_capacity(order.len());
        let mut names = Vec::new();
        let mut mine = Vec::new();
        for inst in &order {
            let k = inst
                .bag
                .grad
                .unwrap_or_else(|| unreachable!("filtered on grad"));
            let dy = bag_dy(g, k);
            operands.push(self.get(dy)?);
            if inst.rank == self.rank {
                names.push(self.fresh(&format!("{}.G", g.name_of(dy))));
                mine.push((k, inst.shard, inst.bag.table));
            }
        }
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let op = Op::AllToAll {
            dir: A2aDir::Gather,
            counts,
            rank: self.rank,
        };
        let gathered = self.ng.add_node(op, &operands, &names).map_err(&e)?;
        for ((k, shard, table), dy) in mine.into_iter().zip(gathered) {
            let node = &g.nodes()[k];
            let mut ins = Vec::with_capacity(node.inputs.len());
            // The state operands before dy: none (bag gradient), the table (fused
            // update), the table and its low half (split update).
            let state = match node.op {
                Op::EmbeddingUpdate { .. } => 1,
                Op::SplitEmbeddingUpdate { .. } => 2,
                _ => 0,
            };
            for &v in &node.inputs[..state] {
                ins.push(self.get(v)?);
            }
            ins.push(dy);
            for &v in &node.inputs[state + 1..] {
                ins.push(self.get(v)?);
            }
            let op = match (shard, &node.op) {
                (None, op) | (Some(_), op @ Op::EmbeddingBagGrad { .. }) => op.clone(),
                (Some(sk), Op::EmbeddingUpdate { mode, lr }) => {
                    let s = self.shard(table, sk)?;
                    Op::EmbeddingUpdateRows {
                        mode: *mode,
                        lr: *lr,
                        lo: s.lo,
                        rows: self.table_rows(table),
                    }
                }
                (Some(sk), Op::SplitEmbeddingUpdate { mode, lr }) => {
                    let s = self.shard(table, sk)?;
                    Op::SplitEmbeddingUpdateRows {
                        mode: *mode,
                        lr: *lr,
                        lo: s.lo,
                        rows: self.table_rows(table),
                    }
                }
                (Some(_), op) => {
                    return Err(node_err(
                        g,
                        k,
                        format!("`{}` has no row-wise form", op.mnemonic()),
                    ));
                }
            };
            let names: Vec<&str> = node.outputs.iter().map(|&o| g.name_of(o)).collect();
            let news = self.ng.add_node(op, &ins, &names).map_err(&e)?;
            for (&out, new) in node.outputs.iter().zip(news) {
                self.define(out, new)?;
            }
        }
        for (n, node) in g.nodes().iter().enumerate() {
            if self.sp.kinds[n] != Kind::SparseSgd {
                continue;
            }
            let Some(root) = self.sp.sgd_root[n] else {
                continue;
            };
            let Some(held) = self.held(root) else {
                continue;
            };
            let ins = node
                .inputs
                .iter()
                .map(|&v| self.get(v))
                .collect::<Result<Vec<_>>>()?;
            let op = match (held, &node.op) {
                (Some(sk), Op::SparseSgd { lr }) => {
                    let s = self.shard(root, sk)?;
                    Op::SparseSgdRows {
                        lr: *lr,
                        lo: s.lo,
                        rows: self.table_rows(root),
                    }
                }
                (_, op) => op.clone(),
            };
            let out = node.outputs[0];
            let new = self.ng.add(op, &ins, g.name_of(out)).map_err(&e)?;
            self.define(out, new)?;
        }
        Ok(())
    }

    /// The all-reduced dense gradient `embedding_grad_dense(dy, indices[, offsets])`
    /// of a replicated table, named after `hint`.
    fn replicated_grad(
        &mut self,
        mode: dlrm_ir::Pool,
        table: ValueId,
        dy: ValueId,
        index_ins: &[ValueId],
        hint: &str,
    ) -> Result<ValueId> {
        let e = PassError::ir(ID);
        let mut ins = vec![self.get(dy)?];
        for &v in index_ins {
            ins.push(self.get(v)?);
        }
        let rows = self.table_rows(table);
        let name = self.fresh(&format!("{hint}.dense"));
        let dense = self
            .ng
            .add(Op::EmbeddingGradDense { mode, rows }, &ins, &name)
            .map_err(&e)?;
        let name = self.fresh(&format!("{hint}.dense.sum"));
        self.ng.add(Op::AllReduce, &[dense], &name).map_err(&e)
    }

    /// A sparse node of a data-parallel table, at its place in node order: the bag
    /// on the local samples; the backward as a dense, all-reduced gradient and
    /// `sgd` (or `split_sgd`).
    fn replicated_node(&mut self, n: usize) -> Result<()> {
        let e = PassError::ir(ID);
        let g = self.g;
        let node = &g.nodes()[n];
        let name = |i: usize| g.name_of(node.outputs[i]);
        match (&node.op, self.sp.kinds[n]) {
            (Op::EmbeddingBag { .. }, _) => {
                let ins = node
                    .inputs
                    .iter()
                    .map(|&v| self.get(v))
                    .collect::<Result<Vec<_>>>()?;
                let v = self.ng.add(node.op.clone(), &ins, name(0)).map_err(&e)?;
                self.define(node.outputs[0], v)
            }
            (Op::EmbeddingBagGrad { mode }, _) => {
                let table = self.sp.grad_root[n]
                    .ok_or_else(|| node_err(g, n, "internal: no table".into()))?;
                let r =
                    self.replicated_grad(*mode, table, node.inputs[0], &node.inputs[1..], name(0))?;
                self.dense_grad[node.outputs[0].index()] = Some(r);
                Ok(())
            }
            (Op::SparseSgd { lr }, _) => {
                let grad = self.dense_grad[node.inputs[2].index()].ok_or_else(|| {
                    node_err(g, n, "internal: no dense gradient for the rows".into())
                })?;
                let w = self.get(node.inputs[0])?;
                let v = self
                    .ng
                    .add(Op::Sgd { lr: *lr }, &[w, grad], name(0))
                    .map_err(&e)?;
                self.define(node.outputs[0], v)
            }
            (Op::EmbeddingUpdate { mode, lr }, _) => {
                let table = self.sp.sgd_root[n]
                    .ok_or_else(|| node_err(g, n, "internal: no table".into()))?;
                let grad =
                    self.replicated_grad(*mode, table, node.inputs[1], &node.inputs[2..], name(0))?;
                let w = self.get(node.inputs[0])?;
                let v = self
                    .ng
                    .add(Op::Sgd { lr: *lr }, &[w, grad], name(0))
                    .map_err(&e)?;
                self.define(node.outputs[0], v)
            }
            (Op::SplitEmbeddingUpdate { mode, lr }, _) => {
                let table = self.sp.sgd_root[n]
                    .ok_or_else(|| node_err(g, n, "internal: no table".into()))?;
                let grad =
                    self.replicated_grad(*mode, table, node.inputs[2], &node.inputs[3..], name(0))?;
                let (hi, lo) = (self.get(node.inputs[0])?, self.get(node.inputs[1])?);
                let news = self
                    .ng
                    .add_node(
                        Op::SplitSgd { lr: *lr },
                        &[hi, lo, grad],
                        &[name(0), name(1)],
                    )
                    .map_err(&e)?;
                for (&out, new) in node.outputs.iter().zip(news) {
                    self.define(out, new)?;
                }
                Ok(())
            }
            (op, _) => Err(node_err(
                g,
                n,
                format!("internal: `{}` on a replicated table", op.mnemonic()),
            )),
        }
    }

    /// The table a sparse node works on (its bag's, its update's root).
    fn sparse_table(&self, n: usize) -> Option<ValueId> {
        match self.sp.kinds[n] {
            Kind::Bag => Some(self.g.nodes()[n].inputs[0]),
            Kind::BagGrad => self.sp.grad_root[n],
            Kind::SparseSgd | Kind::Update => self.sp.sgd_root[n],
            Kind::Dense => None,
        }
    }

    fn dense_node(&mut self, n: usize) -> Result<()> {
        let g = self.g;
        let node = &g.nodes()[n];
        let mut ins = Vec::with_capacity(node.inputs.len());
        for (i, &v) in node.inputs.iter().enumerate() {
            let grad_slot = match node.op {
                Op::Sgd { .. } => 1,
                Op::SplitSgd { .. } => 2,
                _ => usize::MAX,
            };
            let new = if i == grad_slot {
                self.reduced[v.index()].ok_or_else(|| {
                    node_err(g, n, "internal: the gradient was not all-reduced".into())
                })?
            } else {
                self.get(v)?
            };
            ins.push(new);
        }
        let global = |d: &Dim| {
            if d.is_sym(Dim::BATCH) {
                Dim::global()
            } else {
                d.clone()
            }
        };
        let op = match &node.op {
            Op::Bce { denom } => Op::Bce {
                denom: global(denom),
            },
            Op::Mse { denom } => Op::Mse {
                denom: global(denom),
            },
            Op::BceGrad { denom } => Op::BceGrad {
                denom: global(denom),
            },
            Op::MseGrad { denom } => Op::MseGrad {
                denom: global(denom),
            },
            Op::BceLogits { denom } => Op::BceLogits {
                denom: global(denom),
            },
            Op::BceLogitsGrad { denom } => Op::BceLogitsGrad {
                denom: global(denom),
            },
            other => other.clone(),
        };
        let results = node
            .outputs
            .iter()
            .map(|&v| (g.name_of(v).to_string(), g.ty(v).clone()))
            .collect();
        let new = self
            .ng
            .push_node_unchecked(op, ins, results)
            .map_err(PassError::ir(ID))?;
        for (&old, new) in node.outputs.iter().zip(new) {
            self.define(old, new)?;
        }
        Ok(())
    }

    fn build(mut self) -> Result<Graph> {
        let g = self.g;
        let e = PassError::ir(ID);
        // Index inputs: `[G, ..]` for the bags of tables this rank holds (whole or a
        // row shard), as in the source for replicated tables, dropped otherwise.
        let mut global = vec![false; g.values().len()];
        let mut local = vec![false; g.values().len()];
        for b in &self.sp.bags {
            let (held, rep) = (self.held(b.table).is_some(), self.replicated(b.table));
            for &v in &g.nodes()[b.node].inputs[1..] {
                global[v.index()] |= held;
                local[v.index()] |= rep;
            }
        }
        for &v in g.inputs() {
            let mut ty = g.ty(v).clone();
            if self.sp.is_index[v.index()] {
                if global[v.index()] && local[v.index()] {
                    return Err(graph_err(
                        g,
                        format!(
                            "the indices %{} feed a replicated and a model-parallel table: \
                             place their tables alike",
                            g.name_of(v)
                        ),
                    ));
                }
                if !global[v.index()] && !local[v.index()] {
                    continue;
                }
                if global[v.index()] && ty.shape.first().is_some_and(|d| d.is_sym(Dim::BATCH)) {
                    ty.shape[0] = Dim::global();
                }
            }
            let new = self.ng.add_input(g.name_of(v), ty).map_err(&e)?;
            self.map[v.index()] = Some(new);
        }
        for &p in g.params() {
            let new = match &self.home[p.index()] {
                Home::NotTable | Home::Replicated => self
                    .ng
                    .add_param(g.name_of(p), g.ty(p).clone())
                    .map_err(&e)?,
                Home::Owner(r) if *r == self.rank => self
                    .ng
                    .add_param(g.name_of(p), g.ty(p).clone())
                    .map_err(&e)?,
                Home::Owner(_) => continue,
                Home::Rows(shards, names) => {
                    let Some(k) = shards.iter().position(|s| s.rank == self.rank) else {
                        continue;
                    };
                    let mut ty = g.ty(p).clone();
                    ty.shape[0] = Dim::Fixed(shards[k].hi - shards[k].lo);
                    self.ng.add_param(&names[k], ty).map_err(&e)?
                }
            };
            self.map[p.index()] = Some(new);
        }
        for &v in g.inputs().iter().chain(g.params()) {
            if let Some(new) = self.map[v.index()] {
                self.define(v, new)?;
            }
        }

        let first_bag = self.sp.bags.first().map(|b| b.node);
        // The gather goes after the last exchanged bag gradient is defined (None: at
        // the start).
        let grads: Vec<ValueId> = self
            .sp
            .bags
            .iter()
            .filter(|b| !self.replicated(b.table))
            .filter_map(|b| b.grad)
            .map(|k| bag_dy(g, k))
            .collect();
        let gather_after: Option<Option<usize>> = if grads.is_empty() {
            None
        } else {
            Some(
                grads
                    .iter()
                    .filter_map(|&v| match g.value(v).def {
                        Def::Node(m, _) => Some(m),
                        _ => None,
                    })
                    .max(),
            )
        };
        if gather_after == Some(None) {
            self.gather_block()?;
        }
        for n in 0..g.nodes().len() {
            if first_bag == Some(n) {
                self.scatter_block()?;
            }
            match self.sparse_table(n) {
                None => self.dense_node(n)?,
                Some(t) if self.replicated(t) => self.replicated_node(n)?,
                Some(_) => {}
            }
            if gather_after == Some(Some(n)) {
                self.gather_block()?;
            }
        }

        let mut outputs = Vec::with_capacity(g.outputs().len());
        for &o in g.outputs() {
            let v = match self.reduced[o.index()] {
                Some(r) if is_loss(g, o) => r,
                _ => self.get(o)?,
            };
            outputs.push(v);
        }
        self.ng.set_outputs(outputs);
        for u in g.updates() {
            if self.map[u.param.index()].is_none() {
                continue;
            }
            let (p, v) = (self.get(u.param)?, self.get(u.value)?);
            self.ng.add_update(p, v).map_err(&e)?;
        }
        verify(&self.ng).map_err(|source| PassError::Verify {
            after: ID.to_string(),
            source,
        })?;
        Ok(self.ng)
    }
}

/// True if `v` is a loss (a `bce` or `mse` result).
fn is_loss(g: &Graph, v: ValueId) -> bool {
    match g.value(v).def {
        Def::Node(m, _) => matches!(
            g.nodes()[m].op,
            Op::Bce { .. } | Op::Mse { .. } | Op::BceLogits { .. }
        ),
        _ => false,
    }
}

/// The bag-output gradient of a bag's backward node (`embedding_bag_grad` or the
/// fused `embedding_update`).
fn bag_dy(g: &Graph, k: usize) -> ValueId {
    let node = &g.nodes()[k];
    match node.op {
        Op::EmbeddingUpdate { .. } => node.inputs[1],
        Op::SplitEmbeddingUpdate { .. } => node.inputs[2],
        _ => node.inputs[0],
    }
}
