//! Theme `contract`: linear layers as blocked batch-reduce GEMMs (SC20).
//!
//! Forward: `contract-linear`: `linear{act}(x, w, b)` ->
//! `unblock_act(brgemm{act}(block_act(x), block_weight(w), b))`: the epilogue (bias,
//! activation) fused, the re-layouts at the edges (the `layout` theme cancels those
//! that meet between consecutive layers).
//!
//! Backward (the forward layer found through the activation's gradient):
//! - `contract-dgrad-relu` / `-sigmoid`: `linear_dx(relu_grad(dy, linear{relu}(x,w,b)), w)`
//!   -> `brgemm_dgrad{relu}(block(dy), Yb, block_weight(w))` (mask fused; `Yb` is the
//!   forward brgemm, shared by hash-consing);
//! - `contract-dgrad`: `linear_dx(dz, w)` -> `brgemm_dgrad{none}(block(dz), block_weight(w))`;
//! - `contract-wgrad-relu` / `-sigmoid`, `contract-wgrad`: `linear_dw(dz, x)` ->
//!   `unblock_weight(get 0 (brgemm_wgrad(..)))`, and when `linear_db(dz)` exists it
//!   is united with `get 1` of the same `brgemm_wgrad` (bias gradient fused).
//!
//! Block sizes come from [`crate::egraph::extract::block_for`] per dimension (or the
//! forced size), so consecutive layers agree and forward and backward use one weight
//! layout.

use super::super::extract::block_for;
use super::super::lang::{Dl, DlGraph, Types, class_name, set_hint};
use super::{RuleConfig, add_op, add1, attr_of, bound, build_rule, get, same_type, ty_of};
use dlrm_ir::{Act, Attr, DType, Op, TensorType};
use egg::{Id, Rewrite, Subst, Symbol};

/// The rules of this theme.
pub fn rules(cfg: &RuleConfig) -> Vec<Rewrite<Dl, Types>> {
    vec![
        build_rule("contract-linear", "(linear ?act ?x ?w ?b)", linear, cfg),
        build_rule(
            "contract-dgrad-relu",
            "(linear_dx (relu_grad ?dy (linear act=relu ?x ?w ?b)) ?w)",
            dgrad_relu,
            cfg,
        ),
        build_rule(
            "contract-dgrad-sigmoid",
            "(linear_dx (sigmoid_grad ?dy (linear act=sigmoid ?x ?w ?b)) ?w)",
            dgrad_sigmoid,
            cfg,
        ),
        build_rule("contract-dgrad", "(linear_dx ?dz ?w)", dgrad_plain, cfg),
        build_rule(
            "contract-wgrad-relu",
            "(linear_dw (relu_grad ?dy (linear act=relu ?x ?w ?b)) ?x)",
            wgrad_relu,
            cfg,
        ),
        build_rule(
            "contract-wgrad-sigmoid",
            "(linear_dw (sigmoid_grad ?dy (linear act=sigmoid ?x ?w ?b)) ?x)",
            wgrad_sigmoid,
            cfg,
        ),
        build_rule("contract-wgrad", "(linear_dw ?dz ?x)", wgrad_plain, cfg),
    ]
}

fn fixed(t: &TensorType, i: usize) -> Option<usize> {
    t.shape.get(i)?.fixed()
}

fn act_of(eg: &DlGraph, subst: &Subst) -> Option<Act> {
    match attr_of(eg, bound(subst, "act")?)? {
        Attr::Ident(s) => match s.as_str() {
            "none" => Some(Act::None),
            "relu" => Some(Act::Relu),
            "sigmoid" => Some(Act::Sigmoid),
            _ => None,
        },
        _ => None,
    }
}

/// `block_act{bk}(x)` keeping x's dtype.
fn block(eg: &mut DlGraph, x: Id, bk: usize) -> Option<(Id, TensorType)> {
    let dtype = ty_of(eg, x)?.dtype;
    let r = add1(eg, &Op::BlockAct { bk, dtype }, &[x])?;
    name_like(eg, r.0, x, "blk");
    Some(r)
}

/// Hints `new`'s name as `<name of like>.<suffix>`.
fn name_like(eg: &mut DlGraph, new: Id, like: Id, suffix: &str) {
    if let Some(n) = class_name(eg, like) {
        set_hint(eg, new, format!("{n}.{suffix}"));
    }
}

/// The blocked forward layer: `(yb, wb, bn, bk, N, K)`.
struct Fwd {
    xb: Id,
    wb: Id,
    yb: Id,
    bn: usize,
    n: usize,
    k: usize,
}

fn forward(eg: &mut DlGraph, act: Act, x: Id, w: Id, b: Id, cfg: &RuleConfig) -> Option<Fwd> {
    let wt = ty_of(eg, w)?;
    let (n, k) = (fixed(&wt, 0)?, fixed(&wt, 1)?);
    let (bn, bk) = (block_for(n, cfg.block), block_for(k, cfg.block));
    let (xb, _) = block(eg, x, bk)?;
    let (wb, _) = add1(eg, &Op::BlockWeight { bn, bk }, &[w])?;
    let (yb, _) = add1(eg, &Op::Brgemm { act }, &[xb, wb, b])?;
    name_like(eg, wb, w, "blk");
    Some(Fwd {
        xb,
        wb,
        yb,
        bn,
        n,
        k,
    })
}

fn linear(eg: &mut DlGraph, m: Id, s: &Subst, cfg: &RuleConfig) -> Option<Id> {
    let act = act_of(eg, s)?;
    let (x, w, b) = (bound(s, "x")?, bound(s, "w")?, bound(s, "b")?);
    let f = forward(eg, act, x, w, b, cfg)?;
    name_like(eg, f.yb, m, "blk");
    let dtype = ty_of(eg, m)?.dtype;
    let (y, _) = add1(eg, &Op::UnblockAct { k: f.n, dtype }, &[f.yb])?;
    same_type(eg, m, y)
}

fn dgrad_fused(eg: &mut DlGraph, m: Id, s: &Subst, cfg: &RuleConfig, act: Act) -> Option<Id> {
    let (dy, x, w, b) = (
        bound(s, "dy")?,
        bound(s, "x")?,
        bound(s, "w")?,
        bound(s, "b")?,
    );
    let f = forward(eg, act, x, w, b, cfg)?;
    let (dyb, _) = block(eg, dy, f.bn)?;
    let (dxb, _) = add1(
        eg,
        &Op::BrgemmDgrad {
            act,
            mask: Act::None,
            dtype: DType::F32,
        },
        &[dyb, f.yb, f.wb],
    )?;
    name_like(eg, dxb, m, "blk");
    let (dx, _) = add1(
        eg,
        &Op::UnblockAct {
            k: f.k,
            dtype: ty_of(eg, m)?.dtype,
        },
        &[dxb],
    )?;
    same_type(eg, m, dx)
}

fn dgrad_relu(eg: &mut DlGraph, m: Id, s: &Subst, cfg: &RuleConfig) -> Option<Id> {
    dgrad_fused(eg, m, s, cfg, Act::Relu)
}

fn dgrad_sigmoid(eg: &mut DlGraph, m: Id, s: &Subst, cfg: &RuleConfig) -> Option<Id> {
    dgrad_fused(eg, m, s, cfg, Act::Sigmoid)
}

fn dgrad_plain(eg: &mut DlGraph, m: Id, s: &Subst, cfg: &RuleConfig) -> Option<Id> {
    let (dz, w) = (bound(s, "dz")?, bound(s, "w")?);
    let wt = ty_of(eg, w)?;
    let (n, k) = (fixed(&wt, 0)?, fixed(&wt, 1)?);
    let (bn, bk) = (block_for(n, cfg.block), block_for(k, cfg.block));
    let (dzb, _) = block(eg, dz, bn)?;
    let (wb, _) = add1(eg, &Op::BlockWeight { bn, bk }, &[w])?;
    let (dxb, _) = add1(
        eg,
        &Op::BrgemmDgrad {
            act: Act::None,
            mask: Act::None,
            dtype: DType::F32,
        },
        &[dzb, wb],
    )?;
    name_like(eg, dxb, m, "blk");
    let (dx, _) = add1(
        eg,
        &Op::UnblockAct {
            k,
            dtype: ty_of(eg, m)?.dtype,
        },
        &[dxb],
    )?;
    same_type(eg, m, dx)
}

/// Builds `brgemm_wgrad` and its projections; unites `linear_db(dz)` (if present)
/// with the bias gradient. Returns the weight gradient class.
#[allow(clippy::too_many_arguments)]
fn wgrad_common(
    eg: &mut DlGraph,
    m: Id,
    act: Act,
    dyb: Id,
    yb: Id,
    xb: Id,
    dz: Id,
    n: usize,
    k: usize,
) -> Option<Id> {
    let operands = if act == Act::None {
        vec![dyb, xb]
    } else {
        vec![dyb, yb, xb]
    };
    let (wg, tys) = add_op(eg, &Op::BrgemmWgrad { act, n }, &operands)?;
    if tys.len() != 2 {
        return None;
    }
    let dwb = get(eg, wg, 0);
    name_like(eg, dwb, m, "blk");
    let db = get(eg, wg, 1);
    let (dw, _) = add1(eg, &Op::UnblockWeight { n, k }, &[dwb])?;
    let dw = same_type(eg, m, dw)?;
    let linear_db = eg.lookup(Dl::Op(Symbol::from("linear_db"), vec![dz]));
    if let Some(old) = linear_db
        && same_type(eg, old, db).is_some()
    {
        eg.union(old, db);
    }
    Some(dw)
}

fn wgrad_fused(eg: &mut DlGraph, m: Id, s: &Subst, cfg: &RuleConfig, act: Act) -> Option<Id> {
    let (dy, x, w, b) = (
        bound(s, "dy")?,
        bound(s, "x")?,
        bound(s, "w")?,
        bound(s, "b")?,
    );
    let f = forward(eg, act, x, w, b, cfg)?;
    let (dyb, _) = block(eg, dy, f.bn)?;
    // The matched dz = act_grad(dy, y): find its class for the bias gradient.
    let act_tag = super::super::convert::tag(eg, "act", &Attr::Ident(act.name().into()));
    let y = eg.lookup(Dl::Op(Symbol::from("linear"), vec![act_tag, x, w, b]))?;
    let grad = if act == Act::Relu {
        "relu_grad"
    } else {
        "sigmoid_grad"
    };
    let dz = eg.lookup(Dl::Op(Symbol::from(grad), vec![dy, y]))?;
    wgrad_common(eg, m, act, dyb, f.yb, f.xb, dz, f.n, f.k)
}

fn wgrad_relu(eg: &mut DlGraph, m: Id, s: &Subst, cfg: &RuleConfig) -> Option<Id> {
    wgrad_fused(eg, m, s, cfg, Act::Relu)
}

fn wgrad_sigmoid(eg: &mut DlGraph, m: Id, s: &Subst, cfg: &RuleConfig) -> Option<Id> {
    wgrad_fused(eg, m, s, cfg, Act::Sigmoid)
}

fn wgrad_plain(eg: &mut DlGraph, m: Id, s: &Subst, cfg: &RuleConfig) -> Option<Id> {
    let (dz, x) = (bound(s, "dz")?, bound(s, "x")?);
    let (dzt, xt) = (ty_of(eg, dz)?, ty_of(eg, x)?);
    let (n, k) = (fixed(&dzt, 1)?, fixed(&xt, 1)?);
    let (bn, bk) = (block_for(n, cfg.block), block_for(k, cfg.block));
    let (dzb, _) = block(eg, dz, bn)?;
    let (xb, _) = block(eg, x, bk)?;
    wgrad_common(eg, m, Act::None, dzb, dzb, xb, dz, n, k)
}
