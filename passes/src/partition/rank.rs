//! Rank `r`'s graph: the source rebuilt node by node into a new graph. Dense nodes
//! keep their names, types and order (losses over `G`), every dense gradient and
//! loss is all-reduced right after it is defined; the sparse nodes go to the
//! exchange (`exchange.rs`) or, for data-parallel tables, stay local
//! (`replicated.rs`). See the partition module docs for the resulting graph.

use super::analysis::{Kind, Sparse, bag_dy};
use super::{Home, ID, graph_err, node_err};
use crate::shard::Shard;
use crate::{PassError, Result};
use dlrm_ir::{Def, Dim, Graph, Op, ValueId, verify};
use std::collections::HashSet;

/// Builds one rank's graph.
pub(super) struct RankBuilder<'a> {
    pub g: &'a Graph,
    pub sp: &'a Sparse,
    /// Per value: where it lives (tables and their low halves).
    pub home: &'a [Home],
    pub ranks: usize,
    pub rank: usize,
    pub ng: Graph,
    map: Vec<Option<ValueId>>,
    /// Per source value: its all_reduce in the new graph (dense gradients, losses).
    reduced: Vec<Option<ValueId>>,
    /// Per source value: must be all_reduced once defined.
    to_reduce: Vec<bool>,
    /// Per source value (row gradient of a replicated table's bag): the all-reduced
    /// dense table gradient that replaces it.
    pub dense_grad: Vec<Option<ValueId>>,
    names: HashSet<&'a str>,
}

impl<'a> RankBuilder<'a> {
    pub(super) fn new(
        g: &'a Graph,
        sp: &'a Sparse,
        home: &'a [Home],
        ranks: usize,
        rank: usize,
    ) -> Self {
        let nvals = g.values().len();
        let mut to_reduce = vec![false; nvals];
        for node in g.nodes() {
            if let Some(k) = node.op.dense_grad_operand() {
                to_reduce[node.inputs[k].index()] = true;
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

    pub(super) fn replicated(&self, table: ValueId) -> bool {
        matches!(self.home[table.index()], Home::Replicated)
    }

    /// This rank's part of a model-parallel table: `Some(None)` the whole table,
    /// `Some(Some(k))` row shard `k`, `None` nothing (or a replicated table).
    pub(super) fn held(&self, table: ValueId) -> Option<Option<usize>> {
        match &self.home[table.index()] {
            Home::Owner(r) if *r == self.rank => Some(None),
            Home::Rows(shards, _) => shards.iter().position(|s| s.rank == self.rank).map(Some),
            _ => None,
        }
    }

    /// A name free in both the source and the new graph.
    pub(super) fn fresh(&self, hint: &str) -> String {
        let free = |n: &str| !self.names.contains(n) && self.ng.find(n).is_none();
        if free(hint) {
            return hint.to_string();
        }
        (1..)
            .map(|i| format!("{hint}.{i}"))
            .find(|n| free(n))
            .unwrap_or_else(|| unreachable!("an unbounded range always finds a free name"))
    }

    pub(super) fn get(&self, v: ValueId) -> Result<ValueId> {
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
    pub(super) fn define(&mut self, old: ValueId, new: ValueId) -> Result<()> {
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

    /// The shard `k` of a row-wise table.
    pub(super) fn shard(&self, table: ValueId, k: usize) -> Result<Shard> {
        match &self.home[table.index()] {
            Home::Rows(shards, _) => Ok(shards[k]),
            _ => Err(graph_err(
                self.g,
                format!("internal: %{} is not row-wise", self.g.name_of(table)),
            )),
        }
    }

    pub(super) fn table_rows(&self, table: ValueId) -> usize {
        self.g.ty(table).shape[0].fixed().unwrap_or(0)
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
            let grad_slot = node.op.dense_grad_operand().unwrap_or(usize::MAX);
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

    /// Rank `r`'s graph (module docs).
    pub(super) fn build(mut self) -> Result<Graph> {
        self.interface()?;
        self.body()?;
        let g = self.g;
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
            self.ng.add_update(p, v).map_err(PassError::ir(ID))?;
        }
        verify(&self.ng).map_err(|source| PassError::Verify {
            after: ID.to_string(),
            source,
        })?;
        Ok(self.ng)
    }

    /// The inputs and parameters this rank has (module docs).
    fn interface(&mut self) -> Result<()> {
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
        Ok(())
    }

    /// The nodes in source order, the scatter where the first bag was and the
    /// gather after the last exchanged bag gradient.
    fn body(&mut self) -> Result<()> {
        let g = self.g;
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
        Ok(())
    }
}

/// True if `v` is a loss (a `bce`, `mse` or `bce_logits` result).
fn is_loss(g: &Graph, v: ValueId) -> bool {
    match g.value(v).def {
        Def::Node(m, _) => matches!(
            g.nodes()[m].op,
            Op::Bce { .. } | Op::Mse { .. } | Op::BceLogits { .. }
        ),
        _ => false,
    }
}
