//! Feature interaction: `interaction` (`dot`, `cat`) and `interaction_grad`.
//!
//! `dot`: with `T = [x, e_0, .., e_{n-1}]` (`F = n+1` vectors of width `D` per
//! sample) the result row is `x` followed by `T_i · T_j` for `i` in `0..F` (outer)
//! and `j` in `0..i` (inner; `0..=i` with self interaction). Each dot product is one
//! f32 accumulator from `0.0` over `d` ascending.
//!
//! `dot` gradient, per sample: `dT_0` starts as the `x` part of `dr` and every other
//! `dT_k` at zero; then, for each kept pair `(i, j)` in the forward's output order
//! with `g = dr[pair]`, for `d` ascending: `dT_i[d] += g·T_j[d]` then
//! `dT_j[d] += g·T_i[d]` (a diagonal pair thus adds `g·T_i[d]` twice).
//! `cat` gradient: `dr` split back into the operands' widths.

use super::common::{R, floats, store};
use crate::{Checked, DType, InteractionKind, Op, Tensor, interaction_width};
use std::borrow::Cow;

/// Forward operands: samples, widths and the widened values.
type Operands<'t> = (usize, Vec<usize>, Vec<Cow<'t, [f32]>>);

/// The forward operands' samples, widths and widened values (their ranks, samples
/// and, for `dot`, equal widths are the op's rule, checked by its instance).
fn operands<'t>(fwd: &[&'t Tensor]) -> R<Operands<'t>> {
    let s = fwd.first().map_or(0, |t| t.shape[0]);
    let widths = fwd.iter().map(|t| t.shape[1]).collect();
    let vals = fwd
        .iter()
        .enumerate()
        .map(|(i, t)| floats(t, &format!("interaction operand {i}")))
        .collect::<R<Vec<_>>>()?;
    Ok((s, widths, vals))
}

/// Evaluates `interaction` or `interaction_grad` on its checked operands.
pub(super) fn eval(c: &Checked<'_>) -> R<Vec<Tensor>> {
    match *c.op() {
        Op::Interaction {
            kind,
            self_interaction,
        } => interaction(kind, self_interaction, c).map(|t| vec![t]),
        Op::InteractionGrad {
            kind,
            self_interaction,
        } => interaction_grad(kind, self_interaction, c),
        ref other => super::common::not_in_family(other, "an interaction"),
    }
}

/// The pairs `(i, j)` kept by `dot`, in output order.
fn pairs(f: usize, self_interaction: bool) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for i in 0..f {
        let end = if self_interaction { i + 1 } else { i };
        for j in 0..end {
            out.push((i, j));
        }
    }
    out
}

/// `interaction(x, e_0, .., e_{n-1})`.
fn interaction(kind: InteractionKind, self_interaction: bool, c: &Checked<'_>) -> R<Tensor> {
    interaction_of(kind, self_interaction, c.inputs(), c.out(0).dtype)
}

/// `interaction(ins..)` stored as `out` (the operands' shapes checked by the
/// caller: `[S, w_i]`, one `S`, one width for `dot`).
pub(crate) fn interaction_of(
    kind: InteractionKind,
    self_interaction: bool,
    ins: &[&Tensor],
    out: DType,
) -> R<Tensor> {
    let (s, widths, vals) = operands(ins)?;
    let width = interaction_width(kind, self_interaction, &widths);
    let mut r = Vec::with_capacity(s * width);
    match kind {
        InteractionKind::Cat => {
            for si in 0..s {
                for (v, &w) in vals.iter().zip(&widths) {
                    r.extend_from_slice(&v[si * w..(si + 1) * w]);
                }
            }
        }
        InteractionKind::Dot => {
            let d = widths[0];
            let kept = pairs(ins.len(), self_interaction);
            for si in 0..s {
                let row = |k: usize| &vals[k][si * d..(si + 1) * d];
                r.extend_from_slice(row(0));
                for &(i, j) in &kept {
                    let mut acc = 0.0f32;
                    for (a, b) in row(i).iter().zip(row(j)) {
                        acc += a * b;
                    }
                    r.push(acc);
                }
            }
        }
    }
    store(out, vec![s, width], r)
}

/// `interaction_grad(dr, x, e_0, .., e_{n-1}) -> (dx, de_0, .., de_{n-1})`.
fn interaction_grad(
    kind: InteractionKind,
    self_interaction: bool,
    c: &Checked<'_>,
) -> R<Vec<Tensor>> {
    let Some((dr_t, fwd)) = c.inputs().split_first() else {
        return Err("internal: interaction_grad without operands".into());
    };
    let outs: Vec<DType> = (0..fwd.len()).map(|k| c.out(k).dtype).collect();
    interaction_grad_of(kind, self_interaction, dr_t, fwd, &outs)
}

/// `interaction_grad(dr, fwd..)` with gradient `k` stored as `outs[k]` (the
/// shapes checked by the caller).
pub(crate) fn interaction_grad_of(
    kind: InteractionKind,
    self_interaction: bool,
    dr_t: &Tensor,
    fwd: &[&Tensor],
    outs: &[DType],
) -> R<Vec<Tensor>> {
    let (s, widths, vals) = operands(fwd)?;
    let width = interaction_width(kind, self_interaction, &widths);
    let dr = floats(dr_t, "dr")?;
    let mut grads: Vec<Vec<f32>> = widths.iter().map(|&w| vec![0.0f32; s * w]).collect();
    match kind {
        InteractionKind::Cat => {
            for si in 0..s {
                let mut off = si * width;
                for (g, &w) in grads.iter_mut().zip(&widths) {
                    g[si * w..(si + 1) * w].copy_from_slice(&dr[off..off + w]);
                    off += w;
                }
            }
        }
        InteractionKind::Dot => {
            let d = widths[0];
            let kept = pairs(fwd.len(), self_interaction);
            for si in 0..s {
                let rs = si * width;
                let at = si * d;
                grads[0][at..at + d].copy_from_slice(&dr[rs..rs + d]);
                for (p, &(i, j)) in kept.iter().enumerate() {
                    let g = dr[rs + d + p];
                    for k in 0..d {
                        grads[i][at + k] += g * vals[j][at + k];
                        grads[j][at + k] += g * vals[i][at + k];
                    }
                }
            }
        }
    }
    grads
        .into_iter()
        .zip(widths)
        .enumerate()
        .map(|(k, (g, w))| store(outs[k], vec![s, w], g))
        .collect()
}
