//! The sparse nodes of a data-parallel (replicated) table, each at its place in node
//! order: the bag on the rank's own samples; the backward as a dense table gradient
//! (`embedding_grad_dense`), all-reduced, and a dense `sgd` (`adagrad` for an
//! Adagrad update, with its accumulator; `split_sgd` for a
//! Split-SGD-BF16 table) instead of the sparse update.

use super::ID;
use super::node_err;
use super::rank::RankBuilder;
use crate::{PassError, Result};
use dlrm_ir::ops::split_adagrad;
use dlrm_ir::{Op, ValueId};

impl RankBuilder<'_> {
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
    pub(super) fn replicated_node(&mut self, n: usize) -> Result<()> {
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
            (
                Op::EmbeddingBagGrad {
                    mode,
                    last_offset: false,
                },
                _,
            ) => {
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
            (
                &Op::EmbeddingUpdateAdagrad {
                    mode,
                    lr,
                    eps,
                    rowwise,
                },
                _,
            ) => {
                // The dense form of the sparse update: rows without gradient keep
                // their weights and accumulators exactly (eps > 0).
                let table = self.sp.sgd_root[n]
                    .ok_or_else(|| node_err(g, n, "internal: no table".into()))?;
                let grad =
                    self.replicated_grad(mode, table, node.inputs[2], &node.inputs[3..], name(0))?;
                let (w, acc) = (self.get(node.inputs[0])?, self.get(node.inputs[1])?);
                let op = Op::Adagrad {
                    lr,
                    eps,
                    wd: 0.0,
                    rowwise,
                };
                let news = self
                    .ng
                    .add_node(op, &[w, acc, grad], &[name(0), name(1)])
                    .map_err(&e)?;
                for (&out, new) in node.outputs.iter().zip(news) {
                    self.define(out, new)?;
                }
                Ok(())
            }
            (Op::Module(m), _) if m.mnemonic() == split_adagrad::TABLE => {
                self.replicated_split_adagrad(n, m)
            }
            (op, _) => Err(node_err(
                g,
                n,
                format!("internal: `{}` on a replicated table", op.mnemonic()),
            )),
        }
    }

    /// `split_embedding_update_adagrad` on a data-parallel table: Split-Adagrad's
    /// dense form `split_adagrad` on the all-reduced gradient, as
    /// `embedding_update_adagrad` becomes `adagrad` (rows without gradient keep
    /// their masters and accumulators exactly).
    fn replicated_split_adagrad(&mut self, n: usize, m: &dlrm_ir::module::ModOp) -> Result<()> {
        let g = self.g;
        let node = &g.nodes()[n];
        let name = |i: usize| g.name_of(node.outputs[i]);
        let (mode, h, _) = split_adagrad::table_attrs(m);
        let table =
            self.sp.sgd_root[n].ok_or_else(|| node_err(g, n, "internal: no table".into()))?;
        let grad = self.replicated_grad(mode, table, node.inputs[3], &node.inputs[4..], name(0))?;
        let mut ins = node.inputs[..3]
            .iter()
            .map(|&v| self.get(v))
            .collect::<Result<Vec<_>>>()?;
        ins.push(grad);
        let op = split_adagrad::split_adagrad(h, 0.0);
        let news = self
            .ng
            .add_node(op, &ins, &[name(0), name(1), name(2)])
            .map_err(PassError::ir(ID))?;
        for (&out, new) in node.outputs.iter().zip(news) {
            self.define(out, new)?;
        }
        Ok(())
    }
}
