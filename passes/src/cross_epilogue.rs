//! Pass `fuse-cross-epilogue` (optimising, after `precision`): the elementwise
//! steps of the cross layers that `contract-cross` left beside their GEMMs move
//! into the GEMMs' epilogues (`dlrm_ir::ops::cross_brgemm`), so each chunk of a
//! product is mixed while it is in cache instead of in a separate pass over
//! `S × D` (and, in inference, the product is never stored):
//!
//! ```text
//! wb = brgemm{act=none}(zb, ub, b)        yb = cross_brgemm(zb, ub, b, x0b, xb)
//! yb = cross_mix(x0b, wb, xb)         =>  (or yb, wb = cross_brgemm_save(..) when
//!                                          wb has other users: the gradient's)
//!
//! tv = brgemm_dgrad(tb, vb)               dx, g, dx0 =
//! dx = add(dyb, tv)                   =>      cross_brgemm_dgrad(tb, vb, dyb, x0b, wb)
//! g, dx0 = cross_mix_grad(dx, x0b, wb)    (dx = cross_brgemm_dgrad(tb, vb, dyb)
//!                                          without a cross_mix_grad of dx)
//! ```
//!
//! The fused ops are defined as these compositions, so values are unchanged
//! bit for bit. It runs after `precision` so the dtypes it sees are final: a
//! `brgemm_dgrad` is taken only with `act=none`, no mask and an f32 result that
//! only the `add` reads, with `dy` and the sum f32.

use crate::copy::Copier;
use crate::pass::Params;
use crate::{Pass, Ran, Result};
use dlrm_ir::module::ModOp;
use dlrm_ir::{Act, DType, Graph, Op, ValueId};

/// The pass id.
pub const ID: &str = "fuse-cross-epilogue";

/// The pass's count in the pass log: the elementwise steps fused.
pub const FUSED: &str = "fused";

/// The cross-epilogue fusion pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct FuseCrossEpilogue;

impl Pass for FuseCrossEpilogue {
    fn id(&self) -> &'static str {
        ID
    }

    fn run(&self, g: Graph, _params: Option<&mut Params>) -> Result<Ran> {
        let (graph, fused) = fuse_cross_epilogue(&g, ID)?;
        Ok(Ran::counted(graph, FUSED, fused))
    }
}

/// What happens to a node of the graph.
#[derive(Clone)]
enum Plan {
    /// Copied as it is.
    Keep,
    /// Dropped: a node absorbed into a later fused node.
    Absorbed,
    /// Replaced by `op` on `inputs`, defining `results` (values of the graph).
    Fused {
        op: Op,
        inputs: Vec<ValueId>,
        results: Vec<ValueId>,
    },
}

/// `g` with every eligible step fused (see the module docs) and the number of
/// fused nodes; `pass` names the pass in errors.
pub fn fuse_cross_epilogue(g: &Graph, pass: &str) -> Result<(Graph, usize)> {
    let nodes = g.nodes();
    let users = g.users();
    let def = crate::copy::definitions(g);
    let exported = |v| crate::copy::exported(g, v);
    // Defined before node `i` (inputs and parameters are).
    let before = |v: ValueId, i: usize| def[v.index()].is_none_or(|d| d < i);
    let mut plan = vec![Plan::Keep; nodes.len()];
    let mut fused = 0;
    for (i, n) in nodes.iter().enumerate() {
        // The forward step: `cross_mix(x0, w, x)` of a bias-carrying product.
        if n.op.is_module("cross_mix")
            && let &[x0, w, x] = n.inputs.as_slice()
            && let Some(p) = def[w.index()]
            && matches!(plan[p], Plan::Keep)
            && matches!(nodes[p].op, Op::Brgemm { act: Act::None })
            && nodes[p].inputs.len() == 3
            && !exported(w)
            && ![x0, x].contains(&w)
            && users[w.index()].iter().all(|&u| u >= i)
        {
            let save = users[w.index()].len() > 1;
            let mnemonic = if save {
                "cross_brgemm_save"
            } else {
                "cross_brgemm"
            };
            let mut inputs = nodes[p].inputs.clone();
            inputs.extend([x0, x]);
            let mut results = n.outputs.clone();
            if save {
                results.push(w);
            }
            plan[p] = Plan::Absorbed;
            plan[i] = Plan::Fused {
                op: ModOp::op(mnemonic),
                inputs,
                results,
            };
            fused += 1;
            continue;
        }
        // The backward residual: `add(dy, brgemm_dgrad(t, v))`.
        if matches!(n.op, Op::Add)
            && let &[dy, tv] = n.inputs.as_slice()
            && let &[dx] = n.outputs.as_slice()
            && let Some(p) = def[tv.index()]
            && matches!(plan[p], Plan::Keep)
            && matches!(
                nodes[p].op,
                Op::BrgemmDgrad {
                    act: Act::None,
                    mask: Act::None,
                    dtype: DType::F32
                }
            )
            && nodes[p].inputs.len() == 2
            && users[tv.index()] == [i]
            && !exported(tv)
            && dy != tv
            && g.ty(dy).dtype == DType::F32
            && g.ty(dx).dtype == DType::F32
            && g.ty(dy).shape == g.ty(tv).shape
        {
            let mut inputs = nodes[p].inputs.clone();
            inputs.push(dy);
            let mut results = vec![dx];
            // The layer below's `cross_mix_grad(dx, x0, w)`, if any.
            let grad = users[dx.index()].iter().copied().find(|&u| {
                let m = &nodes[u];
                m.op.is_module("cross_mix_grad")
                    && matches!(plan[u], Plan::Keep)
                    && m.inputs.len() == 3
                    && m.inputs[0] == dx
                    && !m.inputs[1..].contains(&dx)
                    && m.inputs[1..].iter().all(|&v| before(v, i))
            });
            if let Some(u) = grad {
                inputs.extend_from_slice(&nodes[u].inputs[1..]);
                results.extend_from_slice(&nodes[u].outputs);
                plan[u] = Plan::Absorbed;
            }
            plan[p] = Plan::Absorbed;
            plan[i] = Plan::Fused {
                op: ModOp::op("cross_brgemm_dgrad"),
                inputs,
                results,
            };
            fused += 1;
        }
    }
    let mut c = Copier::new(g, pass, &[])?;
    for (n, p) in nodes.iter().zip(&plan) {
        match p {
            Plan::Keep => c.push(n.op.clone(), &n.inputs, &n.outputs)?,
            Plan::Absorbed => {}
            Plan::Fused {
                op,
                inputs,
                results,
            } => c.push(op.clone(), inputs, results)?,
        }
    }
    Ok((c.finish()?, fused))
}
