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
//! Each rank's graph is then reordered by [`crate::schedule()`] (collectives as early
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

use crate::{PassError, Result};
use dlrm_ir::{A2aDir, Def, Dim, Graph, Op, TensorType, ValueId, verify};
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
    pub placement: Placement,
}

/// The embedding tables of `g` with their cost-model data, in parameter order.
pub fn tables(g: &Graph) -> Result<Vec<TableInfo>> {
    Ok(Sparse::analyze(g)?.table_infos)
}

/// Partitions `g` for `ranks` ranks (see the module docs).
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
    let mut owner = vec![usize::MAX; g.values().len()];
    for (&t, (_, r)) in sparse.tables.iter().zip(&placement.table_owner) {
        owner[t.index()] = *r;
    }
    for &(lo, t) in &sparse.companions {
        owner[lo.index()] = owner[t.index()];
    }
    let graphs = (0..ranks)
        .map(|r| {
            RankBuilder::new(g, &sparse, &owner, ranks, r)
                .build()
                .and_then(|rank_graph| crate::schedule(&rank_graph))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Partitioned { graphs, placement })
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
    /// Per node: the root table of a `sparse_sgd`.
    sgd_root: Vec<Option<ValueId>>,
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
            });
        }
        Ok(Sparse {
            kinds,
            bags,
            tables,
            table_infos,
            is_index,
            sgd_root,
            companions,
        })
    }
}

// ------------------------------------------------------------------ rebuild

struct RankBuilder<'a> {
    g: &'a Graph,
    sp: &'a Sparse,
    /// Per value: owner rank of a table (usize::MAX otherwise).
    owner: &'a [usize],
    ranks: usize,
    rank: usize,
    ng: Graph,
    map: Vec<Option<ValueId>>,
    /// Per source value: its all_reduce in the new graph (dense gradients, losses).
    reduced: Vec<Option<ValueId>>,
    /// Per source value: must be all_reduced once defined.
    to_reduce: Vec<bool>,
    names: HashSet<&'a str>,
}

impl<'a> RankBuilder<'a> {
    fn new(g: &'a Graph, sp: &'a Sparse, owner: &'a [usize], ranks: usize, rank: usize) -> Self {
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
            owner,
            ranks,
            rank,
            ng: Graph::new(format!("{}.rank{rank}", g.name)),
            map: vec![None; nvals],
            reduced: vec![None; nvals],
            to_reduce,
            names: g.values().iter().map(|v| v.name.as_str()).collect(),
        }
    }

    fn owns(&self, b: &Bag) -> bool {
        self.owner[b.table.index()] == self.rank
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

    /// Bags in the exchange order: by owner rank, then node order.
    fn exchange_order(&self, with_grad: bool) -> (Vec<&'a Bag>, Vec<usize>) {
        let mut order: Vec<&Bag> = self
            .sp
            .bags
            .iter()
            .filter(|b| !with_grad || b.grad.is_some())
            .collect();
        order.sort_by_key(|b| self.owner[b.table.index()]);
        let mut counts = vec![0usize; self.ranks];
        for b in &order {
            counts[self.owner[b.table.index()]] += 1;
        }
        (order, counts)
    }

    fn scatter_block(&mut self) -> Result<()> {
        let e = PassError::ir(ID);
        let g = self.g;
        let mut owned = Vec::new();
        for b in &self.sp.bags {
            if !self.owns(b) {
                continue;
            }
            let node = &g.nodes()[b.node];
            let ins = node
                .inputs
                .iter()
                .map(|&v| self.get(v))
                .collect::<Result<Vec<_>>>()?;
            let name = self.fresh(&format!("{}.G", g.name_of(b.out)));
            owned.push(self.ng.add(node.op.clone(), &ins, &name).map_err(&e)?);
        }
        let (order, counts) = self.exchange_order(false);
        let names: Vec<&str> = order.iter().map(|b| g.name_of(b.out)).collect();
        let declared: Vec<TensorType> = order.iter().map(|b| g.ty(b.out).clone()).collect();
        let op = Op::AllToAll {
            dir: A2aDir::Scatter,
            counts,
            rank: self.rank,
        };
        let res = self
            .ng
            .add_node_typed(op, &owned, &names, &declared)
            .map_err(&e)?;
        for (b, v) in order.iter().zip(res) {
            self.define(b.out, v)?;
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
        for b in &order {
            let k = b.grad.unwrap_or_else(|| unreachable!("filtered on grad"));
            let dy = bag_dy(g, k);
            operands.push(self.get(dy)?);
            if self.owns(b) {
                names.push(self.fresh(&format!("{}.G", g.name_of(dy))));
                mine.push(k);
            }
        }
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let op = Op::AllToAll {
            dir: A2aDir::Gather,
            counts,
            rank: self.rank,
        };
        let gathered = self.ng.add_node(op, &operands, &names).map_err(&e)?;
        for (k, dy) in mine.into_iter().zip(gathered) {
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
            let names: Vec<&str> = node.outputs.iter().map(|&o| g.name_of(o)).collect();
            let news = self
                .ng
                .add_node(node.op.clone(), &ins, &names)
                .map_err(&e)?;
            for (&out, new) in node.outputs.iter().zip(news) {
                self.define(out, new)?;
            }
        }
        for (n, node) in g.nodes().iter().enumerate() {
            let owned = self.sp.sgd_root[n].is_some_and(|t| self.owner[t.index()] == self.rank);
            if self.sp.kinds[n] != Kind::SparseSgd || !owned {
                continue;
            }
            let ins = node
                .inputs
                .iter()
                .map(|&v| self.get(v))
                .collect::<Result<Vec<_>>>()?;
            let out = node.outputs[0];
            let new = self
                .ng
                .add(node.op.clone(), &ins, g.name_of(out))
                .map_err(&e)?;
            self.define(out, new)?;
        }
        Ok(())
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
        // Inputs: owned bags' index inputs with G, other bags' dropped.
        let mut keep = vec![false; g.values().len()];
        for b in &self.sp.bags {
            if self.owns(b) {
                for &v in &g.nodes()[b.node].inputs[1..] {
                    keep[v.index()] = true;
                }
            }
        }
        for &v in g.inputs() {
            let mut ty = g.ty(v).clone();
            if self.sp.is_index[v.index()] {
                if !keep[v.index()] {
                    continue;
                }
                if ty.shape.first().is_some_and(|d| d.is_sym(Dim::BATCH)) {
                    ty.shape[0] = Dim::global();
                }
            }
            let new = self.ng.add_input(g.name_of(v), ty).map_err(&e)?;
            self.map[v.index()] = Some(new);
        }
        for &p in g.params() {
            if self.owner[p.index()] != usize::MAX && self.owner[p.index()] != self.rank {
                continue;
            }
            let new = self
                .ng
                .add_param(g.name_of(p), g.ty(p).clone())
                .map_err(&e)?;
            self.map[p.index()] = Some(new);
        }
        for &v in g.inputs().iter().chain(g.params()) {
            if let Some(new) = self.map[v.index()] {
                self.define(v, new)?;
            }
        }

        let first_bag = self.sp.bags.first().map(|b| b.node);
        // The gather goes after the last bag gradient is defined (None: at the start).
        let grads: Vec<ValueId> = self
            .sp
            .bags
            .iter()
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
            if self.sp.kinds[n] == Kind::Dense {
                self.dense_node(n)?;
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
