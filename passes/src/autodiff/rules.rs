//! The gradient rules of the built-in ops, one method of [`Ad`] per op family
//! (dense and elementwise, interaction, shape ops, embedding bags); the loss's
//! rule is the seed (`add_loss`).

use super::{Ad, ID, node_err};
use crate::{PassError, Result};
use dlrm_ir::{Act, Graph, InteractionKind, Op, Pool, ValueId};

impl Ad {
    /// `linear{act}(x, w, b) = y`: the pre-activation gradient `dz`, then
    /// `linear_dx`, `linear_dw`, `linear_db` for the operands that need one.
    pub(super) fn backward_linear(
        &mut self,
        fwd: &Graph,
        act: Act,
        ins: &[ValueId],
        dy: ValueId,
        y: ValueId,
    ) -> Result<()> {
        let e = PassError::ir(ID);
        let yname = fwd.name_of(y).to_string();
        let (x, w, b) = (ins[0], ins[1], ins[2]);
        let pre = format!("d.{yname}.pre");
        let dz = match act {
            Act::None => dy,
            Act::Relu => self.g.add(Op::ReluGrad, &[dy, y], &pre).map_err(&e)?,
            Act::Sigmoid => self.g.add(Op::SigmoidGrad, &[dy, y], &pre).map_err(&e)?,
        };
        if self.need[x.index()] {
            let h = self.hint(x);
            let dx = self.g.add(Op::LinearDx, &[dz, w], &h).map_err(&e)?;
            self.contribute(x, dx);
        }
        if self.need[w.index()] {
            let h = self.hint(w);
            let dw = self.g.add(Op::LinearDw, &[dz, x], &h).map_err(&e)?;
            self.contribute(w, dw);
        }
        if self.need[b.index()] {
            let h = self.hint(b);
            let db = self.g.add(Op::LinearDb, &[dz], &h).map_err(&e)?;
            self.contribute(b, db);
        }
        Ok(())
    }

    /// `relu`, `sigmoid` (their gradients read the output `y`) and `add` (both
    /// operands receive `dy`).
    pub(super) fn backward_elementwise(
        &mut self,
        op: &Op,
        ins: &[ValueId],
        dy: ValueId,
        y: ValueId,
    ) -> Result<()> {
        let e = PassError::ir(ID);
        match op {
            Op::Relu | Op::Sigmoid => {
                let x = ins[0];
                let op = if *op == Op::Relu {
                    Op::ReluGrad
                } else {
                    Op::SigmoidGrad
                };
                let h = self.hint(x);
                let dx = self.g.add(op, &[dy, y], &h).map_err(&e)?;
                self.contribute(x, dx);
            }
            Op::Add => {
                self.contribute(ins[0], dy);
                self.contribute(ins[1], dy);
            }
            other => unreachable!("`{}` is not elementwise", other.mnemonic()),
        }
        Ok(())
    }

    /// `interaction`: `interaction_grad(dy, operands..)`, the needed results taken.
    pub(super) fn backward_interaction(
        &mut self,
        kind: InteractionKind,
        self_interaction: bool,
        ins: &[ValueId],
        dy: ValueId,
    ) -> Result<()> {
        let hints: Vec<String> = ins.iter().map(|&v| self.hint(v)).collect();
        let hints: Vec<&str> = hints.iter().map(String::as_str).collect();
        let mut operands = vec![dy];
        operands.extend_from_slice(ins);
        let outs = self
            .g
            .add_node(
                Op::InteractionGrad {
                    kind,
                    self_interaction,
                },
                &operands,
                &hints,
            )
            .map_err(PassError::ir(ID))?;
        for (&v, d) in ins.iter().zip(outs) {
            self.contribute(v, d);
        }
        Ok(())
    }

    /// The backward of a `concat` (node `n`): a `split` of `dy` at the operands'
    /// sizes on `axis`, which must be fixed.
    pub(super) fn backward_concat(
        &mut self,
        fwd: &Graph,
        n: usize,
        axis: usize,
        dy: ValueId,
    ) -> Result<()> {
        let node = &fwd.nodes()[n];
        let ins = node.inputs.as_slice();
        let mut sizes = Vec::with_capacity(ins.len());
        for &v in ins {
            let size = fwd.ty(v).shape.get(axis).and_then(|d| d.fixed());
            let Some(size) = size else {
                return Err(node_err(
                    fwd,
                    n,
                    &node.op,
                    format!(
                        "operand %{} has no fixed size on axis {axis}",
                        fwd.name_of(v)
                    ),
                ));
            };
            sizes.push(size);
        }
        let hints: Vec<String> = ins.iter().map(|&v| self.hint(v)).collect();
        let hints: Vec<&str> = hints.iter().map(String::as_str).collect();
        let outs = self
            .g
            .add_node(Op::Split { axis, sizes }, &[dy], &hints)
            .map_err(PassError::ir(ID))?;
        for (&v, d) in ins.iter().zip(outs) {
            self.contribute(v, d);
        }
        Ok(())
    }

    /// The backward of a `reshape` of `x`: `dy` reshaped back to `x`'s shape.
    pub(super) fn backward_reshape(&mut self, fwd: &Graph, x: ValueId, dy: ValueId) -> Result<()> {
        if self.need[x.index()] {
            let shape = fwd.ty(x).shape.clone();
            let h = self.hint(x);
            let dx = self
                .g
                .add(Op::Reshape { shape }, &[dy], &h)
                .map_err(PassError::ir(ID))?;
            self.contribute(x, dx);
        }
        Ok(())
    }

    /// The backward of a `split` (node `n`): the `concat` of its results'
    /// gradients, each of which must exist.
    pub(super) fn backward_split(
        &mut self,
        fwd: &Graph,
        n: usize,
        axis: usize,
        dys: &[Option<ValueId>],
    ) -> Result<()> {
        let node = &fwd.nodes()[n];
        let mut parts = Vec::with_capacity(dys.len());
        for (k, d) in dys.iter().enumerate() {
            let Some(d) = d else {
                return Err(node_err(
                    fwd,
                    n,
                    &node.op,
                    format!(
                        "unsupported: result {k} %{} has no gradient (it does not reach the loss)",
                        fwd.name_of(node.outputs[k])
                    ),
                ));
            };
            parts.push(*d);
        }
        let x = node.inputs[0];
        let hint = self.hint(x);
        let dx = self
            .g
            .add(Op::Concat { axis }, &parts, &hint)
            .map_err(PassError::ir(ID))?;
        self.contribute(x, dx);
        Ok(())
    }

    /// The backward of an embedding bag (node `n`): the table's row gradient
    /// (`embedding_bag_grad`, with the weights as its fourth operand for
    /// `embedding_bag_weighted`), kept with the index operands for the update.
    pub(super) fn backward_embedding(&mut self, fwd: &Graph, n: usize, dy: ValueId) -> Result<()> {
        let e = PassError::ir(ID);
        let node = &fwd.nodes()[n];
        let ins = node.inputs.as_slice();
        match &node.op {
            Op::EmbeddingBag { mode, last_offset } => {
                let table = ins[0];
                if self.need[table.index()] {
                    let h = format!("d.{}.rows", fwd.name_of(table));
                    let mut operands = vec![dy];
                    operands.extend_from_slice(&ins[1..]);
                    let rows = self
                        .g
                        .add(
                            Op::EmbeddingBagGrad {
                                mode: *mode,
                                last_offset: *last_offset,
                            },
                            &operands,
                            &h,
                        )
                        .map_err(&e)?;
                    // Backward visits bags in reverse; keep bag order. The update
                    // takes the indices, and a last_offset bag's offsets as the
                    // bounds of the indices it reads (other keys' ids of a jagged
                    // batch are not this table's).
                    let index_ops = if *last_offset {
                        ins[1..].to_vec()
                    } else {
                        vec![ins[1]]
                    };
                    self.rows[table.index()].insert(0, (index_ops, rows));
                }
            }
            Op::EmbeddingBagWeighted => {
                // Row i of the sum bag's gradient is dy[bag(i)] scaled by w[i]:
                // the bag gradient with the weights as its fourth operand.
                let [table, idx, off, w] = ins else {
                    return Err(node_err(fwd, n, &node.op, "needs 4 operands".into()));
                };
                if self.need[table.index()] {
                    let name = fwd.name_of(*table);
                    let rows = self
                        .g
                        .add(
                            Op::EmbeddingBagGrad {
                                mode: Pool::Sum,
                                last_offset: false,
                            },
                            &[dy, *idx, *off, *w],
                            &format!("d.{name}.rows"),
                        )
                        .map_err(&e)?;
                    self.rows[table.index()].insert(0, (vec![*idx], rows));
                }
            }
            other => unreachable!("`{}` is not an embedding bag", other.mnemonic()),
        }
        Ok(())
    }
}
