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
//! - `interaction-dot-sliced`: the triangle as slices of `Z` (the diagonal optional):
//!   `concat{axis=1}` of `reshape[S,n·k](slice(Z))` pieces (one piece alone, too),
//!   or `reshape[S,P](concat{axis=2}(slice(Z), ..))`; the kept pairs are read from
//!   the slices' bounds in output order;
//! - `interaction-dot-gather-nd`: `transpose{[1,0]}(gather_nd{batch_dims=0}
//!   (transpose{[1,2,0]}(Z), pairs[P,2]))` with constant pairs `[i, j]`;
//! - `interaction-dot-gather-nd-batched`: `gather_nd{batch_dims=1}(Z, pairs[S,P,2])`
//!   (a fixed batch) with the same constant pairs for every sample;
//!
//!   in every `interaction-dot*` rule the kept pairs must be exactly the lower
//!   triangle (`j < i`, or `j <= i`: `self=true`) in row-major order; any other
//!   order or set keeps the generic ops;
//! - `flatten-stacked-concat`: `reshape[S,W](concat{axis=1}(p_1, ..))` where each
//!   `p_i` is `reshape[S,n_i,D](y_i)` of a 2-D `y_i[S,n_i·D]` (TorchRec's
//!   `InteractionDCNArch`: the dense vector unsqueezed and the pooled embeddings
//!   viewed `[S,F,D]`, stacked, then flattened) -> `concat{axis=1}(y_1, ..)`, with
//!   a `y_i` that is itself a `concat{axis=1}` replaced by its operands (row-major:
//!   each sample's stacked rows flattened are its pieces one after another);
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

use super::super::lang::{Dl, DlGraph, Types, class_name, ir_op, set_hint};
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
        build_op_rule("interaction-dot-sliced", "concat", dot_sliced, cfg),
        build_rule(
            "interaction-dot-gather-nd",
            "(concat axis=1 ?x (transpose perm=[1,0] (gather_nd batch_dims=0 (transpose perm=[1,2,0] ?z) ?idx)))",
            dot_gather_nd,
            cfg,
        ),
        build_rule(
            "interaction-dot-gather-nd-batched",
            "(concat axis=1 ?x (gather_nd batch_dims=1 ?z ?idx))",
            dot_gather_nd_batched,
            cfg,
        ),
        build_op_rule("flatten-stacked-concat", "reshape", flatten_stacked, cfg),
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
    let (e, _) = add1(
        eg,
        &Op::EmbeddingBag {
            mode,
            last_offset: false,
        },
        &[t, idx],
    )?;
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

/// `t` if class `z` is the product `matmul(t, transpose{[0,2,1]}(t))` of a stack
/// `t[S,F,D]` with itself (`Z[s,i,j] = T_i · T_j`).
fn gram(eg: &DlGraph, z: Id) -> Option<Id> {
    op_nodes(eg, z, "matmul").into_iter().find_map(|(_, ins)| {
        let [t, tt] = ins.as_slice() else {
            return None;
        };
        let flipped = op_nodes(eg, *tt, "transpose").into_iter().any(|(a, o)| {
            matches!(a.as_slice(), [(_, Attr::List(p))] if p == &[Dim::Fixed(0), Dim::Fixed(2), Dim::Fixed(1)])
                && o.len() == 1
                && eg.find(o[0]) == eg.find(*t)
        });
        flipped.then_some(*t)
    })
}

/// The shared end of every `interaction-dot*` rule: `interaction{dot}` of the
/// vectors stacked in `t` (the first of which must be `x`) when `kept(F, S)` — the
/// flat indices `i·F + j` of the entries of `Z` the matched subgraph keeps, in its
/// output order — is exactly the lower triangle (with or without the diagonal).
fn interaction_of(
    eg: &mut DlGraph,
    m: Id,
    x: Id,
    t: Id,
    kept: impl FnOnce(&DlGraph, usize, &Dim) -> Option<Vec<i64>>,
) -> Option<Id> {
    let parts = stacked(eg, t)?;
    let f = parts.len();
    if eg.find(*parts.first()?) != eg.find(x) {
        return None;
    }
    let samples = ty_of(eg, m)?.shape.first()?.clone();
    let kept = kept(eg, f, &samples)?;
    let self_interaction = if kept == triangle(f, false) {
        false
    } else if kept == triangle(f, true) {
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

/// The shared builder of `interaction-dot{,-indexed}`: `flat` is the shape the
/// product `Z` is flattened to (checked against the tag `?zs`).
fn dot(eg: &mut DlGraph, m: Id, s: &Subst, flat: impl Fn(&Dim, usize) -> Vec<Dim>) -> Option<Id> {
    let (x, t, idx, zs) = (
        bound(s, "x")?,
        bound(s, "t")?,
        bound(s, "idx")?,
        bound(s, "zs")?,
    );
    interaction_of(eg, m, x, t, |eg, f, samples| {
        if attr_of(eg, zs)? != Attr::List(flat(samples, f)) {
            return None;
        }
        const_ints(eg, idx)
    })
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

/// Flat indices `i·F + j` of `(i, j)` pairs, `None` if one is outside `0..F`.
fn flat_pairs(f: usize, pairs: impl IntoIterator<Item = (i64, i64)>) -> Option<Vec<i64>> {
    let fi = i64::try_from(f).ok()?;
    pairs
        .into_iter()
        .map(|(i, j)| ((0..fi).contains(&i) && (0..fi).contains(&j)).then_some(i * fi + j))
        .collect()
}

/// `interaction-dot-gather-nd`: the triangle is `gather_nd{batch_dims=0}` of the
/// product transposed to `[F,F,S]` by constant pairs `idx[P,2]`, transposed back.
fn dot_gather_nd(eg: &mut DlGraph, m: Id, s: &Subst, _: &RuleConfig) -> Option<Id> {
    let (x, z, idx) = (bound(s, "x")?, bound(s, "z")?, bound(s, "idx")?);
    let t = gram(eg, z)?;
    interaction_of(eg, m, x, t, |eg, f, _| {
        let it = ty_of(eg, idx)?;
        let [p, two] = it.shape.as_slice() else {
            return None;
        };
        let vals = const_ints(eg, idx)?;
        if two.fixed() != Some(2) || p.fixed()? * 2 != vals.len() {
            return None;
        }
        flat_pairs(f, vals.chunks(2).map(|c| (c[0], c[1])))
    })
}

/// `interaction-dot-gather-nd-batched`: the triangle is `gather_nd{batch_dims=1}`
/// of the product `Z[S,F,F]` by constant pairs `idx[S,P,2]` the same for every
/// sample (a fixed batch).
fn dot_gather_nd_batched(eg: &mut DlGraph, m: Id, s: &Subst, _: &RuleConfig) -> Option<Id> {
    let (x, z, idx) = (bound(s, "x")?, bound(s, "z")?, bound(s, "idx")?);
    let t = gram(eg, z)?;
    interaction_of(eg, m, x, t, |eg, f, samples| {
        let it = ty_of(eg, idx)?;
        let [sd, p, two] = it.shape.as_slice() else {
            return None;
        };
        let vals = const_ints(eg, idx)?;
        let (sn, pn) = (sd.fixed()?, p.fixed()?);
        if sd != samples || two.fixed() != Some(2) || sn * pn * 2 != vals.len() || sn == 0 {
            return None;
        }
        let row = &vals[..pn * 2];
        if vals.chunks(pn * 2).any(|r| r != row) {
            return None;
        }
        flat_pairs(f, row.chunks(2).map(|c| (c[0], c[1])))
    })
}

/// The elements `start, start + step, ..` below `end`.
fn range_of(start: usize, end: usize, step: usize) -> Vec<usize> {
    (start..end).step_by(step.max(1)).collect()
}

/// A `slice` of a product `Z[S,F,F]` in class `c` that keeps every sample: `Z`'s
/// class and the rows and columns kept (in order).
fn slice_of_z(eg: &DlGraph, c: Id) -> Option<(Id, Vec<usize>, Vec<usize>)> {
    op_nodes(eg, c, "slice")
        .into_iter()
        .find_map(|(attrs, ins)| {
            let [z] = ins.as_slice() else {
                return None;
            };
            let Some(Op::Slice {
                axes,
                starts,
                ends,
                steps,
            }) = ir_op("slice", &attrs)
            else {
                return None;
            };
            let zt = ty_of(eg, *z)?;
            let [_, r, c] = zt.shape.as_slice() else {
                return None;
            };
            let mut kept = [
                None,
                Some(range_of(0, r.fixed()?, 1)),
                Some(range_of(0, c.fixed()?, 1)),
            ];
            if [starts.len(), ends.len(), steps.len()] != [axes.len(); 3] {
                return None;
            }
            for (k, &a) in axes.iter().enumerate() {
                *kept.get_mut(a)? = Some(range_of(starts[k], ends[k].fixed()?, steps[k]));
            }
            let [None, Some(rows), Some(cols)] = kept else {
                return None;
            };
            Some((*z, rows, cols))
        })
}

/// The triangle as slices of `Z` (class `tri`, type `[S,P]`): the `Z`'s class and
/// the kept `(i, j)` pairs in output order. Forms: `reshape[S,n·k](slice(Z))` (one
/// piece, `n` rows by `k` columns), a `concat{axis=1}` of such pieces, or
/// `reshape[S,P](concat{axis=2}(slice(Z), ..))`.
fn sliced(eg: &DlGraph, tri: Id, samples: &Dim) -> Option<(Id, Vec<(i64, i64)>)> {
    let same_z = |zs: &[Id]| zs.windows(2).all(|w| eg.find(w[0]) == eg.find(w[1]));
    let pairs = |rows: &[usize], cols: &[usize]| -> Vec<(i64, i64)> {
        rows.iter()
            .flat_map(|&i| cols.iter().map(move |&j| (i as i64, j as i64)))
            .collect()
    };
    // One piece: `reshape[S, n·k](slice(Z))`.
    let piece = |c: Id| -> Option<(Id, Vec<(i64, i64)>)> {
        let ct = ty_of(eg, c)?;
        op_nodes(eg, c, "reshape").into_iter().find_map(|(_, ins)| {
            let (z, rows, cols) = slice_of_z(eg, *ins.first()?)?;
            let want = [samples.clone(), Dim::Fixed(rows.len() * cols.len())];
            (ct.shape.as_slice() == want).then(|| (z, pairs(&rows, &cols)))
        })
    };
    if let Some(found) = piece(tri) {
        return Some(found);
    }
    for (attrs, parts) in op_nodes(eg, tri, "concat") {
        if !matches!(attrs.as_slice(), [(_, Attr::Int(1))]) {
            continue;
        }
        let Some(pieces) = parts.iter().map(|&p| piece(p)).collect::<Option<Vec<_>>>() else {
            continue;
        };
        let zs: Vec<Id> = pieces.iter().map(|p| p.0).collect();
        if let Some(&z) = zs.first()
            && same_z(&zs)
        {
            return Some((z, pieces.into_iter().flat_map(|p| p.1).collect()));
        }
    }
    // `reshape[S,P](concat{axis=2}(slices..))`: rows outer, then the slices.
    let tt = ty_of(eg, tri)?;
    for (_, ins) in op_nodes(eg, tri, "reshape") {
        for (attrs, parts) in op_nodes(eg, *ins.first()?, "concat") {
            if !matches!(attrs.as_slice(), [(_, Attr::Int(2))]) {
                continue;
            }
            let Some(slices) = parts
                .iter()
                .map(|&p| slice_of_z(eg, p))
                .collect::<Option<Vec<_>>>()
            else {
                continue;
            };
            let zs: Vec<Id> = slices.iter().map(|p| p.0).collect();
            let n = slices.first()?.1.len();
            let width: usize = slices.iter().map(|s| n * s.2.len()).sum();
            if !same_z(&zs)
                || slices.iter().any(|s| s.1.len() != n)
                || tt.shape.as_slice() != [samples.clone(), Dim::Fixed(width)]
            {
                continue;
            }
            let kept = (0..n)
                .flat_map(|r| {
                    slices
                        .iter()
                        .flat_map(move |s| s.2.iter().map(move |&j| (s.1[r] as i64, j as i64)))
                })
                .collect();
            return Some((zs[0], kept));
        }
    }
    None
}

/// `interaction-dot-sliced`: `concat{axis=1}(x, tri)` where the triangle `tri` is
/// taken from `Z` by slices (see [`sliced`]).
fn dot_sliced(eg: &mut DlGraph, m: Id, _: &Subst, _: &RuleConfig) -> Option<Id> {
    let samples = ty_of(eg, m)?.shape.first()?.clone();
    for (attrs, ops) in op_nodes(eg, m, "concat") {
        let ([(_, Attr::Int(1))], [x, tri]) = (attrs.as_slice(), ops.as_slice()) else {
            continue;
        };
        let Some((z, kept)) = sliced(eg, *tri, &samples) else {
            continue;
        };
        let Some(t) = gram(eg, z) else { continue };
        let found = interaction_of(eg, m, *x, t, |_, f, _| flat_pairs(f, kept));
        if found.is_some() {
            return found;
        }
    }
    None
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

/// `flatten-stacked-concat` (see the module docs): the flat `concat` of the
/// stacked pieces' 2-D sources.
fn flatten_stacked(eg: &mut DlGraph, m: Id, _: &Subst, _: &RuleConfig) -> Option<Id> {
    let mt = ty_of(eg, m)?;
    let [samples, _] = mt.shape.as_slice() else {
        return None;
    };
    for (_, ops) in op_nodes(eg, m, "reshape") {
        let [x] = ops.as_slice() else { continue };
        let Some(flat) = stacked_sources(eg, *x, samples) else {
            continue;
        };
        let Some((r, _)) = add1(eg, &Op::Concat { axis: 1 }, &flat) else {
            continue;
        };
        if let Some(r) = same_type(eg, m, r) {
            return Some(r);
        }
    }
    None
}

/// The 2-D sources `y_i[S, n_i·D]` of a `concat{axis=1}` of `reshape[S,n_i,D](y_i)`
/// pieces (one `D` for all), a source that is a `concat{axis=1}` given as its
/// operands.
fn stacked_sources(eg: &DlGraph, x: Id, samples: &Dim) -> Option<Vec<Id>> {
    let xt = ty_of(eg, x)?;
    let [s, _, d] = xt.shape.as_slice() else {
        return None;
    };
    if s != samples {
        return None;
    }
    op_nodes(eg, x, "concat")
        .into_iter()
        .find_map(|(attrs, parts)| {
            if !matches!(attrs.as_slice(), [(_, Attr::Int(1))]) {
                return None;
            }
            let mut flat = Vec::new();
            for p in parts {
                let pt = ty_of(eg, p)?;
                let [ps, Dim::Fixed(n), pd] = pt.shape.as_slice() else {
                    return None;
                };
                let Dim::Fixed(dd) = pd else { return None };
                if ps != samples || pd != d {
                    return None;
                }
                let y = op_nodes(eg, p, "reshape")
                    .into_iter()
                    .find_map(|(_, ops)| {
                        let [y] = ops.as_slice() else { return None };
                        let yt = ty_of(eg, *y)?;
                        (yt.shape.as_slice() == [samples.clone(), Dim::Fixed(n.checked_mul(*dd)?)])
                            .then_some(*y)
                    })?;
                let inner = op_nodes(eg, y, "concat").into_iter().find_map(|(a, ops)| {
                    let two_d = ops
                        .iter()
                        .all(|&o| ty_of(eg, o).is_some_and(|t| t.rank() == 2));
                    (matches!(a.as_slice(), [(_, Attr::Int(1))]) && two_d).then_some(ops)
                });
                match inner {
                    Some(ops) => flat.extend(ops),
                    None => flat.push(y),
                }
            }
            Some(flat)
        })
}
