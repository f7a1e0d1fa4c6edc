//! Theme `canon` (continued): DCN-v2's cross layer from the generic ops of an
//! imported model.
//!
//! - `cross-layer` (eight orderings): `x0 * (linear{none}(matmul(x, vt), u, b)) + x`
//!   -> `cross(x0, x, transpose(vt), u, b)`, for either operand order of the
//!   product and of the sum (`binary{add}` or `add`). The `linear` is what the
//!   `linear-matmul-add` rule made of `matmul(z, transpose(u)) + b`, so this is
//!   TorchRec's `LowRankCrossNet` layer `x_0 * (W(V x_l) + b) + x_l` as PyTorch
//!   exports it (`V x_l` a bias-free `F.linear`: a `MatMul` by the transposed `V`),
//!   and dlrmc's own export of a `cross` op. Shapes are checked: `x0` and `x` the
//!   same `[S, D]`, `vt` `[D, R]`, `u` `[D, R]`, `b` `[D]`.
//!
//! Exactness: `cross` computes `z` and `w` with `matmul`'s and `linear`'s
//! accumulation orders and then `x0·w + x` in the same order as the generic ops,
//! so the rewrite is bit for bit in f32.

use super::super::lang::{Dl, DlGraph, Types};
use super::{RuleConfig, add1, bound, build_rule, same_type, ty_of};
use dlrm_ir::Op;
use dlrm_ir::module::ModOp;
use egg::{Id, Rewrite, Subst};

/// The rules of this theme.
pub fn rules(cfg: &RuleConfig) -> Vec<Rewrite<Dl, Types>> {
    let layer = "(linear act=none (matmul ?x ?vt) ?u ?b)";
    let mut out = Vec::new();
    for (i, (prod, sum)) in [
        (format!("(binary kind=mul ?x0 {layer})"), "binary kind=add"),
        (format!("(binary kind=mul {layer} ?x0)"), "binary kind=add"),
        (format!("(binary kind=mul ?x0 {layer})"), "add"),
        (format!("(binary kind=mul {layer} ?x0)"), "add"),
    ]
    .into_iter()
    .enumerate()
    {
        out.push(build_rule(
            &format!("cross-layer-{}", 2 * i),
            &format!("({sum} {prod} ?x)"),
            cross,
            cfg,
        ));
        out.push(build_rule(
            &format!("cross-layer-{}", 2 * i + 1),
            &format!("({sum} ?x {prod})"),
            cross,
            cfg,
        ));
    }
    out
}

fn cross(eg: &mut DlGraph, m: Id, s: &Subst, _: &RuleConfig) -> Option<Id> {
    let [x0, x, vt, u, b] = ["x0", "x", "vt", "u", "b"].map(|k| bound(s, k));
    let (x0, x, vt, u, b) = (x0?, x?, vt?, u?, b?);
    let (t0, tx, tvt, tu) = (ty_of(eg, x0)?, ty_of(eg, x)?, ty_of(eg, vt)?, ty_of(eg, u)?);
    if t0 != tx || tx.rank() != 2 || tvt.rank() != 2 || tvt.shape != tu.shape {
        return None;
    }
    let (v, _) = add1(eg, &Op::Transpose { perm: vec![1, 0] }, &[vt])?;
    let (y, _) = add1(eg, &ModOp::op("cross"), &[x0, x, v, u, b])?;
    same_type(eg, m, y)
}
