//! The sparse (embedding) structure of a graph, checked: which nodes are bags, bag
//! gradients and sparse updates, which table each works on, which bag each backward
//! node belongs to, and where embedding state may flow. One function per pattern;
//! [`Sparse::analyze`] runs them in order, so the first violation found is the
//! error.

use super::{TableInfo, graph_err, node_err};
use crate::Result;
use dlrm_ir::{Def, Dim, Graph, Op, ValueId};
use std::collections::HashSet;

/// What a node is to the partition pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Dense,
    Bag,
    BagGrad,
    SparseSgd,
    /// `embedding_update` (or its split / Adagrad form): bag gradient and sparse
    /// update fused.
    Update,
}

/// An `embedding_bag` node.
#[derive(Clone, Debug)]
pub(super) struct Bag {
    pub node: usize,
    pub table: ValueId,
    pub out: ValueId,
    /// The backward node of this bag (`embedding_bag_grad` or a fused update), in a
    /// training graph.
    pub grad: Option<usize>,
}

/// The sparse (embedding) structure of a graph, checked.
pub(super) struct Sparse {
    pub kinds: Vec<Kind>,
    /// In node order.
    pub bags: Vec<Bag>,
    /// Table parameters, in parameter order.
    pub tables: Vec<ValueId>,
    pub table_infos: Vec<TableInfo>,
    /// Per value: a table (operand 0 of a bag).
    is_table: Vec<bool>,
    /// Per value: an index/offset input of a bag.
    pub is_index: Vec<bool>,
    /// Per node: the root table of a `sparse_sgd` or fused update.
    pub sgd_root: Vec<Option<ValueId>>,
    /// Per node: the root table of an `embedding_bag_grad`.
    pub grad_root: Vec<Option<ValueId>>,
    /// State sharded like its table: Split-SGD-BF16 low halves and Adagrad
    /// accumulators, `(parameter, its table)`.
    pub companions: Vec<(ValueId, ValueId)>,
}

/// The node defining `v`, if a node does.
fn def_node(g: &Graph, v: ValueId) -> Option<usize> {
    match g.value(v).def {
        Def::Node(m, _) => Some(m),
        _ => None,
    }
}

/// The bag-output gradient of a bag's backward node (`embedding_bag_grad` or the
/// fused `embedding_update` / `split_embedding_update`).
pub(super) fn bag_dy(g: &Graph, k: usize) -> ValueId {
    let node = &g.nodes()[k];
    node.op
        .bag_update()
        .map_or(node.inputs[0], |u| node.inputs[u.dy])
}

impl Sparse {
    /// The checked sparse structure of `g` (see the partition module's structural
    /// requirements).
    pub(super) fn analyze(g: &Graph) -> Result<Sparse> {
        reject_collectives(g)?;
        let mut sp = Sparse::empty(g);
        for n in 0..g.nodes().len() {
            sp.classify(g, n)?;
        }
        sp.match_sparse_sgds(g)?;
        sp.match_bag_grads(g)?;
        sp.match_updates(g)?;
        sp.check_flow(g)?;
        sp.check_updates(g)?;
        sp.collect_tables(g)?;
        Ok(sp)
    }

    fn empty(g: &Graph) -> Sparse {
        let (nvals, nnodes) = (g.values().len(), g.nodes().len());
        Sparse {
            kinds: vec![Kind::Dense; nnodes],
            bags: Vec::new(),
            tables: Vec::new(),
            table_infos: Vec::new(),
            is_table: vec![false; nvals],
            is_index: vec![false; nvals],
            sgd_root: vec![None; nnodes],
            grad_root: vec![None; nnodes],
            companions: Vec::new(),
        }
    }

    /// Node `n`'s kind; a bag's table, indices and samples dimension; a sparse
    /// update's root table (a table, or the result of an update of one).
    fn classify(&mut self, g: &Graph, n: usize) -> Result<()> {
        let node = &g.nodes()[n];
        match node.op {
            Op::EmbeddingBag { .. } | Op::EmbeddingBagWeighted => self.classify_bag(g, n),
            Op::EmbeddingBagGrad { .. } => {
                self.kinds[n] = Kind::BagGrad;
                Ok(())
            }
            Op::SparseAdagrad { .. } => Err(node_err(
                g,
                n,
                "an unfused sparse_adagrad cannot be partitioned yet, only the fused \
                 embedding_update_adagrad (compile with -O1; per-sample-weighted bags \
                 do not fuse)"
                    .into(),
            )),
            // A sparse SGD or a fused embedding update (of `enum Op`, or a module
            // update such as Split-Adagrad's).
            ref op if matches!(op, Op::SparseSgd { .. }) || op.bag_update().is_some() => {
                self.kinds[n] = if matches!(node.op, Op::SparseSgd { .. }) {
                    Kind::SparseSgd
                } else {
                    Kind::Update
                };
                let t = node.inputs[0];
                let root = if self.is_table[t.index()] {
                    Some(t)
                } else {
                    def_node(g, t).and_then(|m| self.sgd_root[m])
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
                self.sgd_root[n] = Some(root);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// An `embedding_bag`: its table is a parameter, its indices/offsets graph
    /// inputs, its samples dimension `B`.
    fn classify_bag(&mut self, g: &Graph, n: usize) -> Result<()> {
        let node = &g.nodes()[n];
        self.kinds[n] = Kind::Bag;
        let table = node.inputs[0];
        if matches!(
            node.op,
            Op::EmbeddingBag {
                last_offset: true,
                ..
            }
        ) {
            // `last_offset::plain_offsets` made every such bag plain before.
            return Err(node_err(
                g,
                n,
                format!(
                    "internal: the last_offset bag of %{} was not made plain before the analysis",
                    g.name_of(table)
                ),
            ));
        }
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
            self.is_index[v.index()] = true;
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
        self.is_table[table.index()] = true;
        self.bags.push(Bag {
            node: n,
            table,
            out,
            grad: None,
        });
        Ok(())
    }

    /// Every `sparse_sgd`'s row gradient comes from an `embedding_bag_grad` with the
    /// same indices, which feeds no other `sparse_sgd`; that bag gradient gets the
    /// update's root table.
    fn match_sparse_sgds(&mut self, g: &Graph) -> Result<()> {
        let nodes = g.nodes();
        for (n, node) in nodes.iter().enumerate() {
            if self.kinds[n] != Kind::SparseSgd {
                continue;
            }
            let rows = node.inputs[2];
            let bg = def_node(g, rows).filter(|&m| self.kinds[m] == Kind::BagGrad);
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
            if self.grad_root[bg].is_some() {
                return Err(node_err(
                    g,
                    bg,
                    "the row gradient feeds more than one sparse_sgd".into(),
                ));
            }
            self.grad_root[bg] = self.sgd_root[n];
        }
        Ok(())
    }

    /// Every `embedding_bag_grad` feeds a `sparse_sgd`, takes a dense gradient and
    /// belongs to a bag of its table with the same indices and pooling (the first
    /// such bag not yet matched).
    fn match_bag_grads(&mut self, g: &Graph) -> Result<()> {
        for (k, node) in g.nodes().iter().enumerate() {
            if self.kinds[k] != Kind::BagGrad {
                continue;
            }
            let Some(root) = self.grad_root[k] else {
                return Err(node_err(
                    g,
                    k,
                    "the row gradient must feed a sparse_sgd".into(),
                ));
            };
            self.check_dense_dy(g, k)?;
            let Op::EmbeddingBagGrad { mode, .. } = node.op else {
                continue;
            };
            self.match_bag(g, k, root, &node.inputs[1..], mode)?;
        }
        Ok(())
    }

    /// Every fused update takes a dense gradient and belongs to a bag of its table
    /// with the same indices and pooling; a split update's low-half parameter (an
    /// Adagrad update's accumulator) is recorded as its table's companion.
    fn match_updates(&mut self, g: &Graph) -> Result<()> {
        for (k, node) in g.nodes().iter().enumerate() {
            if self.kinds[k] != Kind::Update {
                continue;
            }
            self.check_dense_dy(g, k)?;
            let Some(u) = node.op.bag_update() else {
                continue;
            };
            // The state operands (a low half, an accumulator, or both).
            for (i, _) in node.op.state_operands() {
                let s = node.inputs[i];
                if let (Def::Param(_), Some(root)) = (g.value(s).def, self.sgd_root[k]) {
                    self.companions.push((s, root));
                }
            }
            let (mode, first_index) = (u.mode, u.dy + 1);
            let Some(root) = self.sgd_root[k] else {
                continue;
            };
            self.match_bag(g, k, root, &node.inputs[first_index..], mode)?;
        }
        Ok(())
    }

    /// The bag-output gradient of backward node `k` is a dense value.
    fn check_dense_dy(&self, g: &Graph, k: usize) -> Result<()> {
        let dy = bag_dy(g, k);
        if def_node(g, dy).is_some_and(|m| self.kinds[m] != Kind::Dense) {
            return Err(node_err(
                g,
                k,
                format!("the gradient %{} must be a dense value", g.name_of(dy)),
            ));
        }
        Ok(())
    }

    /// Marks the first unmatched bag of `table` with indices `index_ins` and pooling
    /// `mode` as backward node `k`'s.
    fn match_bag(
        &mut self,
        g: &Graph,
        k: usize,
        table: ValueId,
        index_ins: &[ValueId],
        mode: dlrm_ir::Pool,
    ) -> Result<()> {
        let nodes = g.nodes();
        let bag = self.bags.iter_mut().find(|b| {
            let bn = &nodes[b.node];
            // A weighted bag's gradient carries its weights too (sum mode).
            let op_fits = match bn.op {
                Op::EmbeddingBagWeighted => mode == dlrm_ir::Pool::Sum,
                ref op => {
                    *op == Op::EmbeddingBag {
                        mode,
                        last_offset: false,
                    }
                }
            };
            b.grad.is_none() && b.table == table && bn.inputs[1..] == *index_ins && op_fits
        });
        match bag {
            Some(b) => {
                b.grad = Some(k);
                Ok(())
            }
            None => Err(node_err(
                g,
                k,
                format!(
                    "no embedding_bag of %{} with these indices is left to match it",
                    g.name_of(table)
                ),
            )),
        }
    }

    /// Where embedding state may flow: tables, indices, row gradients and updated
    /// tables are no graph outputs and are used only in the operand slots of the
    /// sparse ops that take them.
    fn check_flow(&self, g: &Graph) -> Result<()> {
        let outputs: HashSet<ValueId> = g.outputs().iter().copied().collect();
        let users = g.users();
        for (i, v) in g.values().iter().enumerate() {
            let id = ValueId(i as u32);
            let Some(allowed) = self.allowed_uses(g, id) else {
                continue;
            };
            if outputs.contains(&id) {
                return Err(graph_err(
                    g,
                    format!("%{} is embedding state and cannot be an output", v.name),
                ));
            }
            for &n in &users[i] {
                let node = &g.nodes()[n];
                for (slot, _) in node.inputs.iter().enumerate().filter(|(_, x)| **x == id) {
                    let ok = allowed
                        .iter()
                        .any(|(k, slots)| *k == self.kinds[n] && slots.contains(&slot));
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
        Ok(())
    }

    /// The (user kind, operand slots) a sparse value may be used in; `None` for a
    /// dense value.
    fn allowed_uses(&self, g: &Graph, v: ValueId) -> Option<&'static [(Kind, &'static [usize])]> {
        if self.is_table[v.index()] {
            return Some(&[
                (Kind::Bag, &[0]),
                (Kind::SparseSgd, &[0]),
                (Kind::Update, &[0]),
            ]);
        }
        if self.is_index[v.index()] {
            return Some(&[
                (Kind::Bag, &[1, 2, 3]),
                (Kind::BagGrad, &[1, 2, 3]),
                (Kind::SparseSgd, &[1]),
                (Kind::Update, &[2, 3, 4, 5]),
            ]);
        }
        match def_node(g, v).map(|m| self.kinds[m]) {
            Some(Kind::BagGrad) => Some(&[(Kind::SparseSgd, &[2])]),
            Some(Kind::SparseSgd | Kind::Update) => {
                Some(&[(Kind::SparseSgd, &[0]), (Kind::Update, &[0, 1, 2])])
            }
            _ => None,
        }
    }

    /// A table (or a Split-SGD-BF16 low half) is updated only by its own sparse
    /// update chain.
    fn check_updates(&self, g: &Graph) -> Result<()> {
        for u in g.updates() {
            let root = def_node(g, u.value).and_then(|m| self.sgd_root[m]);
            let companion = self
                .companions
                .iter()
                .find(|(lo, _)| *lo == u.param)
                .map(|&(_, t)| t);
            let state = if companion.is_some() {
                companion
            } else {
                self.is_table[u.param.index()].then_some(u.param)
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
        Ok(())
    }

    /// The tables in parameter order, with their [`TableInfo`]s (fixed shapes).
    fn collect_tables(&mut self, g: &Graph) -> Result<()> {
        let nodes = g.nodes();
        self.tables = g
            .params()
            .iter()
            .copied()
            .filter(|p| self.is_table[p.index()])
            .collect();
        for &t in &self.tables {
            let ty = g.ty(t);
            let (Some(rows), Some(dim)) = (ty.shape[0].fixed(), ty.shape[1].fixed()) else {
                return Err(graph_err(
                    g,
                    format!("table %{} must have a fixed shape, got {ty}", g.name_of(t)),
                ));
            };
            let bags = self.bags.iter().filter(|b| b.table == t);
            let row_wise = bags
                .clone()
                .all(|b| matches!(nodes[b.node].op, Op::EmbeddingBag { .. }));
            let lookups = bags
                .clone()
                .map(|b| {
                    let ins = &nodes[b.node].inputs;
                    if ins.len() == 2 {
                        g.ty(ins[1]).shape[1].fixed().unwrap_or(1)
                    } else {
                        1
                    }
                })
                .sum();
            // Low halves and accumulators, sharded with the table.
            let state: usize = self
                .companions
                .iter()
                .filter(|&&(_, owner)| owner == t)
                .map(|&(s, _)| {
                    let st = g.ty(s);
                    st.fixed_numel().unwrap_or(0) * st.dtype.size_bytes() / rows.max(1)
                })
                .sum();
            self.table_infos.push(TableInfo {
                name: g.name_of(t).to_string(),
                rows,
                dim,
                elem_bytes: ty.dtype.size_bytes(),
                lookups_per_sample: lookups,
                bags: bags.count(),
                state_bytes_per_row: state,
                row_wise,
            });
        }
        Ok(())
    }
}

/// A graph that already holds collectives is partitioned already.
fn reject_collectives(g: &Graph) -> Result<()> {
    match g.nodes().iter().position(|node| node.op.is_collective()) {
        Some(n) => Err(node_err(
            g,
            n,
            "the graph already holds collectives (is it partitioned?)".into(),
        )),
        None => Ok(()),
    }
}
