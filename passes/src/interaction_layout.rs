//! Pass `fuse-interaction-layout` (optimising, after `precision`): a dot
//! interaction whose only reader is the `block_act` that lays it out for the
//! top MLP's first GEMM is written in that layout directly
//! (`dlrm_ir::ops::interaction_blocked`), so the `[S, width]` result is never
//! stored and copied:
//!
//! ```text
//! r = interaction{dot, self}(x, e_0, ..)
//! rb = block_act{bk, dtype}(r)              =>  rb = interaction_blocked{self, bk, dtype}(x, e_0, ..)
//!
//! dr = unblock_act{width, dtype}(drb)
//! dx, de_0, .. =                            =>  dx, de_0, .. =
//!   interaction_grad{dot, self}(dr, x, ..)        interaction_grad_blocked{self}(drb, x, ..)
//! ```
//!
//! (the gradient read where the top MLP's first `brgemm_dgrad` wrote it,
//! without the row-major copy).
//!
//! The fused op is defined as this composition, so values are unchanged bit
//! for bit. It runs after `precision` so the dtypes it sees are final, and
//! takes a pair only where `block_act` keeps the interaction's dtype (its
//! kernels write the rows once, in that dtype).

use crate::copy::Copier;
use crate::pass::Params;
use crate::{Pass, Ran, Result};
use dlrm_ir::ops::interaction_blocked;
use dlrm_ir::{Graph, InteractionKind, Op};

/// The pass id.
pub const ID: &str = "fuse-interaction-layout";

/// The pass's count in the pass log: the interactions (and gradients) fused.
pub const FUSED: &str = "fused";

/// The interaction-layout fusion pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct FuseInteractionLayout;

impl Pass for FuseInteractionLayout {
    fn id(&self) -> &'static str {
        ID
    }

    fn run(&self, g: Graph, _params: Option<&mut Params>) -> Result<Ran> {
        let (graph, fused) = fuse_interaction_layout(&g, ID)?;
        Ok(Ran::counted(graph, FUSED, fused))
    }
}

/// `g` with every eligible pair fused (see the module docs) and the number
/// fused; `pass` names the pass in errors.
pub fn fuse_interaction_layout(g: &Graph, pass: &str) -> Result<(Graph, usize)> {
    let nodes = g.nodes();
    let users = g.users();
    let def = crate::copy::definitions(g);
    let exported = |v| crate::copy::exported(g, v);
    // Per node: absorbed into a later one, or replaced by a fused op on
    // these operands.
    let mut absorbed = vec![false; nodes.len()];
    let mut fused_op: Vec<Option<(Op, Vec<dlrm_ir::ValueId>)>> = vec![None; nodes.len()];
    let mut fused = 0;
    for (i, n) in nodes.iter().enumerate() {
        let Some(&r) = n.inputs.first() else {
            continue;
        };
        let Some(p) = def[r.index()] else {
            continue;
        };
        let only = !absorbed[p] && users[r.index()] == [i] && !exported(r);
        match (&n.op, &nodes[p].op) {
            (
                &Op::BlockAct { bk, dtype },
                &Op::Interaction {
                    kind: InteractionKind::Dot,
                    self_interaction,
                },
            ) if only && n.inputs.len() == 1 && g.ty(r).dtype == dtype => {
                let op = interaction_blocked::op(self_interaction, bk, dtype);
                fused_op[i] = Some((op, nodes[p].inputs.clone()));
            }
            (
                &Op::InteractionGrad {
                    kind: InteractionKind::Dot,
                    self_interaction,
                },
                &Op::UnblockAct { dtype, .. },
            ) if only && !n.inputs[1..].contains(&r) && g.ty(nodes[p].inputs[0]).dtype == dtype => {
                let mut inputs = nodes[p].inputs.clone();
                inputs.extend_from_slice(&n.inputs[1..]);
                fused_op[i] = Some((interaction_blocked::grad_op(self_interaction), inputs));
            }
            _ => continue,
        }
        absorbed[p] = true;
        fused += 1;
    }
    let mut c = Copier::new(g, pass, &[])?;
    for (i, n) in nodes.iter().enumerate() {
        match &fused_op[i] {
            _ if absorbed[i] => {}
            Some((op, inputs)) => c.push(op.clone(), inputs, &n.outputs)?,
            None => c.push(n.op.clone(), &n.inputs, &n.outputs)?,
        }
    }
    Ok((c.finish()?, fused))
}
