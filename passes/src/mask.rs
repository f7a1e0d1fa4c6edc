//! Pass `fuse-dgrad-mask` (after `fuse`, on the extracted graph): each layer's
//! `dz = act'(dy, y)` computed once, in the epilogue of the `brgemm_dgrad` that
//! produces `dy`, instead of once in each of the layer's gradient ops.
//!
//! After the `contract` rules, a hidden layer's backward is
//! `brgemm_dgrad{act}(dy, y, w)` and `brgemm_wgrad{act}(dy, y, x)`: both apply
//! `act'` to the same cold `dy` and `y`. When `dy` is itself the result of a
//! `brgemm_dgrad` (the next layer's) and every use of it is such a pair (same
//! `act`, same `y`), the producer takes `y` as its mask operand
//! (`brgemm_dgrad{.., mask=act}(.., y)`, see [`dlrm_ir::Op::BrgemmDgrad`]) and
//! writes `dz` while each chunk of its result is in cache; the users take `dz`
//! with `act=none`. The values keep their names (the producer's result is now
//! that layer's `dz`); the arithmetic is unchanged (each element is the same
//! `act'` of the same two floats).
//!
//! The tree extraction cannot find this form: it costs a shared `dz` once per
//! use, so it always prefers the two fused gradient ops; here the sharing is
//! explicit.

use crate::copy::Copier;
use crate::pass::Params;
use crate::{Pass, Ran, Result};
use dlrm_ir::{Act, DType, Graph, Op, ValueId};

/// The pass id.
pub const ID: &str = "fuse-dgrad-mask";

/// The pass's count in the pass log: the `brgemm_dgrad`s that took the mask.
pub const MASKED: &str = "masked";

/// The dgrad-mask fusion pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct FuseDgradMask;

impl Pass for FuseDgradMask {
    fn id(&self) -> &'static str {
        ID
    }

    fn run(&self, g: Graph, _params: Option<&mut Params>) -> Result<Ran> {
        let (graph, masked) = fuse_dgrad_mask(&g, ID)?;
        Ok(Ran::counted(graph, MASKED, masked))
    }
}

/// `g` with every eligible `brgemm_dgrad` masked (see the module docs) and the
/// number of them; `pass` names the pass in errors.
pub fn fuse_dgrad_mask(g: &Graph, pass: &str) -> Result<(Graph, usize)> {
    let nodes = g.nodes();
    let users = g.users();
    // Where each value is defined (inputs and parameters: before every node).
    let def = crate::copy::definitions(g);
    let exported = |v| crate::copy::exported(g, v);
    // Per node: the mask (act, y) it takes on, and whether it drops its act.
    let mut mask: Vec<Option<(Act, ValueId)>> = vec![None; nodes.len()];
    let mut drop_act = vec![false; nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        let (
            Op::BrgemmDgrad {
                mask: Act::None, ..
            },
            [dy],
        ) = (&n.op, n.outputs.as_slice())
        else {
            continue;
        };
        let us = &users[dy.index()];
        if us.is_empty() || exported(*dy) || g.ty(*dy).dtype != DType::F32 {
            continue;
        }
        let mut common: Option<(Act, ValueId)> = None;
        let all_pairs = us.iter().all(|&u| {
            let un = &nodes[u];
            let act = match un.op {
                Op::BrgemmDgrad { act, .. } | Op::BrgemmWgrad { act, .. } => act,
                _ => return false,
            };
            // `dy` first and nowhere else; `y` second, defined before the producer.
            let ok = act != Act::None
                && un.inputs.len() >= 3
                && un.inputs[0] == *dy
                && !un.inputs[1..].contains(dy)
                && def[un.inputs[1].index()].is_none_or(|d| d < i);
            let this = (act, un.inputs[1]);
            ok && *common.get_or_insert(this) == this
        });
        if all_pairs && let Some(m) = common {
            mask[i] = Some(m);
            for &u in us {
                drop_act[u] = true;
            }
        }
    }
    let mut c = Copier::new(g, pass, &[])?;
    let mut fused = 0;
    for (i, n) in nodes.iter().enumerate() {
        let mut inputs = n.inputs.clone();
        let op = match (&n.op, drop_act[i], mask[i]) {
            (op, false, None) => op.clone(),
            (Op::BrgemmDgrad { act, dtype, .. }, drop, m) => {
                if drop {
                    inputs.remove(1);
                }
                if let Some((_, y)) = m {
                    inputs.push(y);
                    fused += 1;
                }
                Op::BrgemmDgrad {
                    act: if drop { Act::None } else { *act },
                    mask: m.map_or(Act::None, |(a, _)| a),
                    dtype: *dtype,
                }
            }
            (Op::BrgemmWgrad { n, .. }, true, None) => {
                inputs.remove(1);
                Op::BrgemmWgrad {
                    act: Act::None,
                    n: *n,
                }
            }
            // Only dgrads take a mask, only the pairs above drop their act.
            (op, ..) => op.clone(),
        };
        c.push(op, &inputs, &n.outputs)?;
    }
    Ok((c.finish()?, fused))
}
