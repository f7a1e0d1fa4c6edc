//! Cross layers as blocked GEMMs (pass id `contract-cross`, optimising only; runs
//! before `fuse`): every `cross` of DCN-v2 and its `cross_grad` become the
//! SC20 blocked batch-reduce GEMMs (`brgemm` and its gradients) the MLP layers
//! use, with the layer's elementwise step as `cross_mix` / `cross_mix_grad`
//! (`dlrm_ir::ops::cross_mix`).
//!
//! With `D` the width of `x` and `R` the rank (block sizes `bd`, `br` from
//! [`block_for`], the sizes the MLP layers use), each layer
//! `y = x0 ⊙ (u·(v·x) + b) + x` is
//! ```text
//! zb = brgemm(xb, vb)            // z = x·vᵀ: [Rb,S,br], no bias
//! wb = brgemm(zb, ub, b)         // w = z·uᵀ + b: [Db,S,bd]
//! yb = cross_mix(x0b, wb, xb)    // x0 ⊙ w + x
//! ```
//! and its gradient, reusing the forward's `zb` and `wb` (the saved activations:
//! 8·S·R·D flops, not 12),
//! ```text
//! gb, dx0b = cross_mix_grad(dyb, x0b, wb)   // dy ⊙ x0, dy ⊙ w
//! dub, db  = brgemm_wgrad{n=D}(gb, zb)      // du = gᵀ·z, db = Σ_s g
//! tb       = brgemm_dgrad(gb, ub)           // t = g·u
//! dvb, _   = brgemm_wgrad{n=R}(tb, xb)      // dv = tᵀ·x
//! dxb      = add(dyb, brgemm_dgrad(tb, vb)) // dx = dy + t·v
//! ```
//! with `block_act` / `unblock_act` / `block_weight` / `unblock_weight` at the
//! edges, which `fuse`'s `layout` rules cancel between consecutive layers and
//! against the top MLP's first layer; the `layout` pass then stores `v` and `u`
//! blocked. Every sum keeps `cross`'s order (`brgemm`'s definitions are `linear`'s
//! arithmetic), so the interpreter gives the same values bit for bit.
//!
//! This is a pass, not an e-graph rule, for the reason `fuse-dgrad-mask` is one:
//! `cross_grad` has five results, and tree extraction prices a tuple through one
//! of them, so it would keep the tuple for the other four and compute the layer's
//! gradient twice. The blocked form is never slower than `cross` where the dims
//! are fixed (the same flops at the brgemm kernels' efficiency); layers with a
//! symbolic `D` or `R`, or bf16 operands, are left as they are (and
//! `save-activations` pairs them).

use crate::egraph::extract::block_for;
use crate::pass::Params;
use crate::{Pass, PassError, Ran, Result};
use dlrm_ir::module::{ModOp, rebuild};
use dlrm_ir::{Act, DType, Graph, Op, ValueId};
use std::collections::HashMap;

/// The pass: `block` forces a block size, as `fuse`'s rules do.
#[derive(Clone, Copy, Debug, Default)]
pub struct ContractCross {
    /// The forced block size (`--block`), `None`: [`block_for`] per dimension.
    pub block: Option<usize>,
}

/// The pass id.
pub const ID: &str = "contract-cross";

impl Pass for ContractCross {
    fn id(&self) -> &'static str {
        ID
    }

    fn run(&self, g: Graph, _params: Option<&mut Params>) -> Result<Ran> {
        let (out, layers) = contract(&g, self.block)?;
        Ok(Ran::counted(out, "layers", layers))
    }
}

/// A contracted layer's blocked values (in the new graph), for its gradient.
#[derive(Clone, Copy)]
struct Layer {
    x0b: ValueId,
    xb: ValueId,
    vb: ValueId,
    ub: ValueId,
    zb: ValueId,
    wb: ValueId,
}

/// The builder of the blocked graph: memoised re-layouts (one `block_act` of
/// `x0` serves every layer).
struct Blocked {
    block: Option<usize>,
    acts: HashMap<(ValueId, usize), ValueId>,
    weights: HashMap<(ValueId, usize, usize), ValueId>,
}

impl Blocked {
    fn act(&mut self, out: &mut Graph, x: ValueId, bk: usize) -> dlrm_ir::Result<ValueId> {
        if let Some(&b) = self.acts.get(&(x, bk)) {
            return Ok(b);
        }
        let dtype = out.ty(x).dtype;
        let name = format!("{}.blk", out.name_of(x));
        let b = out.add(Op::BlockAct { bk, dtype }, &[x], &name)?;
        self.acts.insert((x, bk), b);
        Ok(b)
    }

    fn weight(
        &mut self,
        out: &mut Graph,
        w: ValueId,
        bn: usize,
        bk: usize,
    ) -> dlrm_ir::Result<ValueId> {
        if let Some(&b) = self.weights.get(&(w, bn, bk)) {
            return Ok(b);
        }
        let name = format!("{}.blk", out.name_of(w));
        let b = out.add(Op::BlockWeight { bn, bk }, &[w], &name)?;
        self.weights.insert((w, bn, bk), b);
        Ok(b)
    }

    /// `(D, R, bd, br)` of a layer whose `x` and `v` are these, if it can be
    /// contracted: fixed dims, f32 operands.
    fn dims(&self, out: &Graph, ops: &[ValueId]) -> Option<(usize, usize, usize, usize)> {
        if ops.iter().any(|&v| out.ty(v).dtype != DType::F32) {
            return None;
        }
        let (x, v) = (ops[ops.len() - 4], ops[ops.len() - 3]);
        let d = out.ty(x).shape.get(1)?.fixed()?;
        let r = out.ty(v).shape.first()?.fixed()?;
        (d > 0 && r > 0).then(|| (d, r, block_for(d, self.block), block_for(r, self.block)))
    }

    /// The forward of a layer `[x0, x, v, u, b]`: its blocked values.
    fn forward(
        &mut self,
        out: &mut Graph,
        ops: &[ValueId],
        name: &str,
    ) -> dlrm_ir::Result<Option<Layer>> {
        let Some((_, _, bd, br)) = self.dims(out, ops) else {
            return Ok(None);
        };
        let &[x0, x, v, u, b] = ops else {
            return Ok(None);
        };
        let (x0b, xb) = (self.act(out, x0, bd)?, self.act(out, x, bd)?);
        let (vb, ub) = (self.weight(out, v, br, bd)?, self.weight(out, u, bd, br)?);
        let none = Op::Brgemm { act: Act::None };
        let zb = out.add(none.clone(), &[xb, vb], &format!("{name}.z"))?;
        let wb = out.add(none, &[zb, ub, b], &format!("{name}.w"))?;
        Ok(Some(Layer {
            x0b,
            xb,
            vb,
            ub,
            zb,
            wb,
        }))
    }

    /// `y` of a contracted forward layer, named `name`.
    fn mix(&mut self, out: &mut Graph, l: Layer, d: usize, name: &str) -> dlrm_ir::Result<ValueId> {
        let dtype = out.ty(l.xb).dtype;
        let yb = out.add(
            ModOp::op("cross_mix"),
            &[l.x0b, l.wb, l.xb],
            &format!("{name}.blk"),
        )?;
        out.add(Op::UnblockAct { k: d, dtype }, &[yb], name)
    }

    /// The five gradients of a contracted layer, named `names`.
    fn grads(
        &mut self,
        out: &mut Graph,
        l: Layer,
        dy: ValueId,
        (d, r, bd): (usize, usize, usize),
        names: &[&str],
    ) -> dlrm_ir::Result<Vec<ValueId>> {
        // Intermediates are named after the forward layer: `d.<layer>.g`, ...
        let z = out.name_of(l.zb);
        let base = format!("d.{}", z.strip_suffix(".z").unwrap_or(z));
        let dyb = self.act(out, dy, bd)?;
        let mix = out.add_node(
            ModOp::op("cross_mix_grad"),
            &[dyb, l.x0b, l.wb],
            &[&format!("{base}.g"), &format!("{}.blk", names[0])],
        )?;
        let (gb, dx0b) = (mix[0], mix[1]);
        let du = out.add_node(
            Op::BrgemmWgrad {
                act: Act::None,
                n: d,
            },
            &[gb, l.zb],
            &[&format!("{}.blk", names[3]), names[4]],
        )?;
        let dgrad = Op::BrgemmDgrad {
            act: Act::None,
            mask: Act::None,
            dtype: DType::F32,
        };
        let tb = out.add(dgrad.clone(), &[gb, l.ub], &format!("{base}.t"))?;
        let dv = out.add_node(
            Op::BrgemmWgrad {
                act: Act::None,
                n: r,
            },
            &[tb, l.xb],
            &[&format!("{}.blk", names[2]), &format!("{base}.t.sum")],
        )?;
        let tvb = out.add(dgrad, &[tb, l.vb], &format!("{base}.tv"))?;
        let dxb = out.add(Op::Add, &[dyb, tvb], &format!("{}.blk", names[1]))?;
        let f32 = DType::F32;
        Ok(vec![
            out.add(Op::UnblockAct { k: d, dtype: f32 }, &[dx0b], names[0])?,
            out.add(Op::UnblockAct { k: d, dtype: f32 }, &[dxb], names[1])?,
            out.add(Op::UnblockWeight { n: r, k: d }, &[dv[0]], names[2])?,
            out.add(Op::UnblockWeight { n: d, k: r }, &[du[0]], names[3])?,
            du[1],
        ])
    }
}

/// `g` with its cross layers contracted (see the module docs), and how many.
pub fn contract(g: &Graph, block: Option<usize>) -> Result<(Graph, usize)> {
    let nodes = g.nodes();
    if !nodes
        .iter()
        .any(|n| n.op.is_module("cross") || n.op.is_module("cross_grad"))
    {
        return Ok((g.clone(), 0));
    }
    // A layer's blocked values by its forward operands (in the new graph).
    let mut layers: HashMap<Vec<ValueId>, Layer> = HashMap::new();
    let mut count = 0;
    let mut b = Blocked {
        block,
        acts: HashMap::new(),
        weights: HashMap::new(),
    };
    let out = rebuild(g, &mut |_, node, out, ins, names| {
        let forward = node.op.is_module("cross");
        if !forward && !node.op.is_module("cross_grad") {
            return None;
        }
        let fwd_ops = if forward { ins } else { &ins[1..] };
        let (d, r, bd, _) = b.dims(out, ins)?;
        let layer = match layers.get(fwd_ops) {
            Some(&l) => l,
            None => match b.forward(out, fwd_ops, names[0]) {
                Ok(Some(l)) => {
                    layers.insert(fwd_ops.to_vec(), l);
                    l
                }
                Ok(None) => return None,
                Err(e) => return Some(Err(e)),
            },
        };
        count += 1;
        Some(if forward {
            b.mix(out, layer, d, names[0]).map(|y| vec![y])
        } else {
            b.grads(out, layer, ins[0], (d, r, bd), names)
        })
    })
    .map_err(PassError::ir(ID))?;
    Ok((out, count))
}
