//! The exchange of the model-parallel (table-wise and row-wise) tables: the held
//! bags and the forward `all_to_all {dir=scatter}` (row shards' partial sums added
//! on the receiver), the backward `all_to_all {dir=gather}` and the held tables'
//! bag gradients, fused updates and `sparse_sgd`s after it (their `_rows` forms on a
//! row shard). The order of the exchanged tensors is the same on every rank: by
//! holder rank, then bag (node order), then shard.

use super::analysis::{Bag, Kind, bag_dy};
use super::rank::RankBuilder;
use super::{Home, ID, node_err};
use crate::{PassError, Result};
use dlrm_ir::{A2aDir, Graph, Op, TensorType, ValueId};

/// One `[G, D]` tensor of the exchange: a bag looked up by one rank, for the whole
/// table (table-wise) or one row shard (`Some(k)`: shard index).
#[derive(Clone, Copy)]
struct Inst<'a> {
    bag: &'a Bag,
    rank: usize,
    shard: Option<usize>,
}

impl<'a> RankBuilder<'a> {
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

    /// The forward exchange: this rank's held bags on the whole global batch, one
    /// `all_to_all {dir=scatter}`, and every exchanged bag's `[B, D]` output (row
    /// shards' partial sums added in shard order).
    pub(super) fn scatter_block(&mut self) -> Result<()> {
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
                (
                    Some(k),
                    Op::EmbeddingBag {
                        mode,
                        last_offset: false,
                    },
                ) => {
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

    /// The backward exchange: every exchanged bag gradient gathered to its
    /// holders, then this rank's bag gradients (or fused updates) on the gathered
    /// `[G, D]` gradients and its `sparse_sgd`s.
    pub(super) fn gather_block(&mut self) -> Result<()> {
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
        let gathered = self
            .ng
            .add_node(op, &operands, &names)
            .map_err(PassError::ir(ID))?;
        for ((k, shard, table), dy) in mine.into_iter().zip(gathered) {
            self.held_backward(k, shard, table, dy)?;
        }
        self.held_sparse_sgds()
    }

    /// Backward node `k` of a held bag (shard `shard` of `table`) on the gathered
    /// gradient `dy`: as it is, or its `_rows` form on a row shard.
    fn held_backward(
        &mut self,
        k: usize,
        shard: Option<usize>,
        table: ValueId,
        dy: ValueId,
    ) -> Result<()> {
        let g = self.g;
        let node = &g.nodes()[k];
        let mut ins = Vec::with_capacity(node.inputs.len());
        // The state operands before dy: none (bag gradient), the table (fused
        // update), the table and its low half (split update) or its accumulator
        // (Adagrad update).
        let state = node.op.bag_update().map_or(0, |u| u.dy);
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
            (
                Some(sk),
                &Op::EmbeddingUpdateAdagrad {
                    mode,
                    lr,
                    eps,
                    rowwise,
                },
            ) => {
                let s = self.shard(table, sk)?;
                Op::EmbeddingUpdateAdagradRows {
                    mode,
                    lr,
                    eps,
                    rowwise,
                    lo: s.lo,
                    rows: self.table_rows(table),
                }
            }
            (Some(sk), op) => {
                // A module update takes its row shard as attributes.
                let s = self.shard(table, sk)?;
                let Some(op) = op.with_rows(s.lo, self.table_rows(table)) else {
                    return Err(node_err(
                        g,
                        k,
                        format!("`{}` has no row-wise form", op.mnemonic()),
                    ));
                };
                op
            }
        };
        let names: Vec<&str> = node.outputs.iter().map(|&o| g.name_of(o)).collect();
        let news = self
            .ng
            .add_node(op, &ins, &names)
            .map_err(PassError::ir(ID))?;
        for (&out, new) in node.outputs.iter().zip(news) {
            self.define(out, new)?;
        }
        Ok(())
    }

    /// The `sparse_sgd`s of the tables this rank holds (`sparse_sgd_rows` on a row
    /// shard), in node order.
    fn held_sparse_sgds(&mut self) -> Result<()> {
        let g: &Graph = self.g;
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
            let new = self
                .ng
                .add(op, &ins, g.name_of(out))
                .map_err(PassError::ir(ID))?;
            self.define(out, new)?;
        }
        Ok(())
    }
}
