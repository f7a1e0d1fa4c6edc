//! Theme `canon`: DLRM-level ops from the generic ops of an imported (ONNX) model.
//! These rules run in the `canon` pass (before autodiff, so that the canonical
//! graph has gradients and the `fuse` rules see `linear` layers), not in `fuse`.
//!
//! - `embedding-bag-sum`, `embedding-bag-mean`: `reduce{sum|mean, axes=[1]}
//!   (gather{axis=0}(t[R,D], idx[S,L]))` -> `embedding_bag{sum|mean}(t, idx)`
//!   (fixed pooling: PyTorch's `Embedding` then `sum`/`mean` over the bag axis);
//! - `linear-matmul-add`, `linear-add-matmul`: `binary{add}(matmul(x[S,K],
//!   w[K,N]), b[N])` (either operand order) -> `linear{none}(x, transpose(w), b)`
//!   (the exporter's pre-transposed weight; the `canon` pass then stores such a
//!   parameter transposed, so no transpose runs);
//! - `cancel-transpose-transpose`: `transpose{[1,0]}(transpose{[1,0]}(w))` -> `w`;
//! - `drop-identity-reshape`: a `reshape` to its operand's own type -> the operand;
//! - `interaction-dot`: the reference DLRM's `interact_features` as PyTorch exports
//!   it: `T = reshape[S,F,D](concat{axis=1}(x, e_1, ..))`, `Z = matmul(T,
//!   transpose{[0,2,1]}(T))`, the lower triangle taken by a constant `gather
//!   {axis=1}` of `reshape[S,F·F](Z)` with indices `i·F + j` (`j < i`, or `j <= i`
//!   with self interaction, row-major), then `concat{axis=1}(x, ·)` ->
//!   `interaction{dot}(x, e_1, ..)`;
//! - `interaction-dot-indexed`: the same where the triangle is `Z[:, li, lj]` as the
//!   TorchScript exporter writes advanced indexing: `transpose{[1,0]}(gather
//!   {axis=0}(reshape[F·F,S](transpose{[1,2,0]}(Z)), li·F + lj))` (its other
//!   reshapes are identities, dropped by `drop-identity-reshape`);
//! - `interaction-cat`: `concat{axis=1}(x, e_1, ..)` of 2-D values whose operands
//!   after the first are embedding bags -> `interaction{cat}(x, e_1, ..)`.
//!
//! Exactness (f32, bit for bit): `embedding_bag` sums a bag's rows in index order
//! from 0 and divides by the count for `mean`, as `reduce` does; `linear` is
//! `matmul`'s one accumulator over `k` ascending, then `+ b`; each dot product of
//! `interaction` is `matmul`'s accumulator over `d` ascending, and the kept pairs
//! are checked against the gather's constant indices (the `canon` pass gives the
//! rules the values of the small integer parameters). One difference on invalid
//! input: ONNX `Gather` wraps a negative index, `embedding_bag` rejects it (as
//! PyTorch's embeddings do).

use super::super::lang::{Dl, DlGraph, Types, class_name, set_hint};
use super::{
    RuleConfig, add1, attr_of, bound, build_op_rule, build_rule, const_ints, op_nodes, same_type,
    ty_of,
};
use dlrm_ir::{Act, Attr, Dim, InteractionKind, Op, Pool};
use egg::{Id, Rewrite, Subst, rewrite};

/// The rules of this theme.
pub fn rules(cfg: &RuleConfig) -> Vec<Rewrite<Dl, Types>> {
    vec![
        build_rule(
            "embedding-bag-sum",
            "(reduce kind=sum axes=[1] keepdims=false (gather axis=0 ?t ?idx))",
            bag_sum,
            cfg,
        ),
        build_rule(
            "embedding-bag-mean",
            "(reduce kind=mean axes=[1] keepdims=false (gather axis=0 ?t ?idx))",
            bag_mean,
            cfg,
        ),
        build_rule(
            "linear-matmul-add",
            "(binary kind=add (matmul ?x ?w) ?b)",
            linear,
            cfg,
        ),
        build_rule(
            "linear-add-matmul",
            "(binary kind=add ?b (matmul ?x ?w))",
            linear,
            cfg,
        ),
        rewrite!("cancel-transpose-transpose";
            "(transpose perm=[1,0] (transpose perm=[1,0] ?w))" => "?w"),
        build_rule(
            "drop-identity-reshape",
            "(reshape ?s ?x)",
            identity_reshape,
            cfg,
        ),
        build_rule(
            "interaction-dot",
            "(concat axis=1 ?x (gather axis=1 (reshape ?zs (matmul ?t (transpose perm=[0,2,1] ?t))) ?idx))",
            dot_flat,
            cfg,
        ),
        build_rule(
            "interaction-dot-indexed",
            "(concat axis=1 ?x (transpose perm=[1,0] (gather axis=0 (reshape ?zs (transpose perm=[1,2,0] (matmul ?t (transpose perm=[0,2,1] ?t)))) ?idx)))",
            dot_indexed,
            cfg,
        ),
        build_op_rule("interaction-cat", "concat", cat, cfg),
    ]
}

/// Hints `new`'s name as `<name of like>.<suffix>`.
fn name_like(eg: &mut DlGraph, new: Id, like: Id, suffix: &str) {
    if let Some(n) = class_name(eg, like) {
        set_hint(eg, new, format!("{n}.{suffix}"));
    }
}

fn bag(eg: &mut DlGraph, m: Id, s: &Subst, mode: Pool) -> Option<Id> {
    let (t, idx) = (bound(s, "t")?, bound(s, "idx")?);
    let (tt, it) = (ty_of(eg, t)?, ty_of(eg, idx)?);
    if tt.rank() != 2 || it.rank() != 2 || !it.dtype.is_int() {
        return None;
    }
    let (e, _) = add1(eg, &Op::EmbeddingBag { mode }, &[t, idx])?;
    same_type(eg, m, e)
}

fn bag_sum(eg: &mut DlGraph, m: Id, s: &Subst, _: &RuleConfig) -> Option<Id> {
    bag(eg, m, s, Pool::Sum)
}

fn bag_mean(eg: &mut DlGraph, m: Id, s: &Subst, _: &RuleConfig) -> Option<Id> {
    bag(eg, m, s, Pool::Mean)
}

fn linear(eg: &mut DlGraph, m: Id, s: &Subst, _: &RuleConfig) -> Option<Id> {
    let (x, w, b) = (bound(s, "x")?, bound(s, "w")?, bound(s, "b")?);
    let (xt, wt, bt) = (ty_of(eg, x)?, ty_of(eg, w)?, ty_of(eg, b)?);
    if xt.rank() != 2 || wt.rank() != 2 || bt.rank() != 1 || bt.shape[0] != wt.shape[1] {
        return None;
    }
    let (w_t, _) = add1(eg, &Op::Transpose { perm: vec![1, 0] }, &[w])?;
    name_like(eg, w_t, w, "T");
    let (y, _) = add1(eg, &Op::Linear { act: Act::None }, &[x, w_t, b])?;
    same_type(eg, m, y)
}

fn identity_reshape(eg: &mut DlGraph, m: Id, s: &Subst, _: &RuleConfig) -> Option<Id> {
    let x = bound(s, "x")?;
    (ty_of(eg, x)? == ty_of(eg, m)?).then_some(x)
}

/// The flat indices `i·F + j` of the kept pairs of a dot interaction over `f`
/// vectors, in output order.
pub fn triangle(f: usize, self_interaction: bool) -> Vec<i64> {
    let mut out = Vec::new();
    for i in 0..f {
        for j in 0..i + usize::from(self_interaction) {
            out.push((i * f + j) as i64);
        }
    }
    out
}

/// The vectors behind `T = reshape[S,F,D](concat{axis=1}(v_0, .., v_{F-1}))`, each
/// `[S,D]`.
fn stacked(eg: &DlGraph, t: Id) -> Option<Vec<Id>> {
    let tt = ty_of(eg, t)?;
    let [s, f, d] = tt.shape.as_slice() else {
        return None;
    };
    for (_, ins) in op_nodes(eg, t, "reshape") {
        let [c] = ins.as_slice() else { continue };
        for (attrs, parts) in op_nodes(eg, *c, "concat") {
            let axis1 = matches!(attrs.as_slice(), [(_, Attr::Int(1))]);
            let fits = parts.iter().all(|&p| {
                ty_of(eg, p).is_some_and(|pt| pt.shape.as_slice() == [s.clone(), d.clone()])
            });
            if axis1 && fits && Some(parts.len()) == f.fixed() {
                return Some(parts);
            }
        }
    }
    None
}

/// The shared builder of `interaction-dot{,-indexed}`: `flat` is the shape the
/// product `Z` is flattened to (checked against the tag `?zs`).
fn dot(eg: &mut DlGraph, m: Id, s: &Subst, flat: impl Fn(&Dim, usize) -> Vec<Dim>) -> Option<Id> {
    let (x, t, idx, zs) = (
        bound(s, "x")?,
        bound(s, "t")?,
        bound(s, "idx")?,
        bound(s, "zs")?,
    );
    let parts = stacked(eg, t)?;
    let f = parts.len();
    if eg.find(*parts.first()?) != eg.find(x) {
        return None;
    }
    let samples = ty_of(eg, m)?.shape.first()?.clone();
    if attr_of(eg, zs)? != Attr::List(flat(&samples, f)) {
        return None;
    }
    let idx = const_ints(eg, idx)?;
    let self_interaction = if idx == triangle(f, false) {
        false
    } else if idx == triangle(f, true) {
        true
    } else {
        return None;
    };
    let op = Op::Interaction {
        kind: InteractionKind::Dot,
        self_interaction,
    };
    let (r, _) = add1(eg, &op, &parts)?;
    same_type(eg, m, r)
}

fn dot_flat(eg: &mut DlGraph, m: Id, s: &Subst, _: &RuleConfig) -> Option<Id> {
    dot(eg, m, s, |samples, f| {
        vec![samples.clone(), Dim::Fixed(f * f)]
    })
}

fn dot_indexed(eg: &mut DlGraph, m: Id, s: &Subst, _: &RuleConfig) -> Option<Id> {
    dot(eg, m, s, |samples, f| {
        vec![Dim::Fixed(f * f), samples.clone()]
    })
}

fn is_bag(eg: &DlGraph, c: Id) -> bool {
    eg[c].nodes.iter().any(|n| {
        matches!(n, Dl::Op(op, _)
            if matches!(op.as_str(), "embedding_bag" | "embedding_bag_weighted"))
    })
}

fn cat(eg: &mut DlGraph, m: Id, _: &Subst, _: &RuleConfig) -> Option<Id> {
    if ty_of(eg, m)?.rank() != 2 {
        return None;
    }
    let found = op_nodes(eg, m, "concat")
        .into_iter()
        .find(|(attrs, parts)| {
            matches!(attrs.as_slice(), [(_, Attr::Int(1))])
                && parts.len() >= 2
                && parts[1..].iter().all(|&p| is_bag(eg, p))
        })?;
    let op = Op::Interaction {
        kind: InteractionKind::Cat,
        self_interaction: false,
    };
    let (r, _) = add1(eg, &op, &found.1)?;
    same_type(eg, m, r)
}
