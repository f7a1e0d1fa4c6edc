//! Feature interaction (`dot` and `cat`) and its gradient, parallel over blocks of
//! samples.
//!
//! `dot`: per sample, `T = [x, e_0, .., e_{n-1}]` (F vectors of width D) is read in
//! place from the operands (no concatenation copy); each kept pair `(i, j)` (`i > j`,
//! plus `i == j` with self interaction; row-major order) is one dot product of
//! length D, accumulated in 8 lanes then summed (reassociation only: the tests allow
//! 1e-5 relative to the terms' magnitude). The gradient, per sample:
//! `dT_i += dZ_ij · T_j` and `dT_j += dZ_ij · T_i` for `i > j`, `dT_i += 2 dZ_ii · T_i`
//! on the diagonal, plus the pass-through `dx += dr[.., 0..D]`.
//! `cat` is a copy forward and a split backward (bitwise exact).
//!
//! The operands come checked against the node's instance ([`Checked`]): ranks,
//! samples, widths and `dr`'s shape were verified by inference.

use super::gemm::dot;
use super::{KResult, block_rows, dims_of};
use dlrm_ir::{Checked, InteractionKind, Tensor, interaction_width};
use rayon::prelude::*;

/// Samples, per-operand f32 data, per-operand widths.
type Operands<'a> = (usize, Vec<&'a [f32]>, Vec<usize>);

/// Samples and widths of the checked interaction operands `from..` (the instance
/// verified them: rank 2, the same samples, at least the dense operand, equal
/// widths for `dot`, and `dr`'s shape for the gradient).
pub(crate) fn samples_and_widths(c: &Checked<'_>, from: usize) -> KResult<(usize, Vec<usize>)> {
    let mut s = 0;
    let mut widths = Vec::with_capacity(c.inputs().len().saturating_sub(from));
    for i in from..c.inputs().len() {
        let [si, w] = dims_of::<2>(c, i)?;
        s = si;
        widths.push(w);
    }
    Ok((s, widths))
}

/// The f32 data and widths of the checked interaction operands `from..`
/// (`None`: not all f32).
fn operands<'a>(c: &Checked<'a>, from: usize) -> Option<KResult<Operands<'a>>> {
    let ts = c.inputs().get(from..)?;
    let data: Vec<&[f32]> = ts.iter().map(|t| t.as_f32()).collect::<Option<_>>()?;
    Some(samples_and_widths(c, from).map(|(s, widths)| (s, data, widths)))
}

/// The kept pairs `(i, j)` in row-major order.
fn pairs(f: usize, self_interaction: bool) -> Vec<(usize, usize)> {
    (0..f)
        .flat_map(|i| (0..if self_interaction { i + 1 } else { i }).map(move |j| (i, j)))
        .collect()
}

/// `interaction(x[S,D], e_0[S,D], ..) -> r`.
pub fn interaction(
    kind: InteractionKind,
    self_interaction: bool,
    c: &Checked<'_>,
) -> Option<KResult<Tensor>> {
    let parsed = operands(c, 0)?;
    Some(parsed.map(|(s, data, widths)| {
        let width = interaction_width(kind, self_interaction, &widths);
        let mut out = vec![0.0f32; s * width];
        if s == 0 || width == 0 {
            return Tensor::f32(vec![s, width], out);
        }
        let sb = block_rows(s, 8, 256);
        let pr = pairs(widths.len(), self_interaction);
        out.par_chunks_mut(sb * width)
            .enumerate()
            .for_each(|(blk, o)| {
                let s0 = blk * sb;
                for (k, row) in o.chunks_exact_mut(width).enumerate() {
                    let sample = s0 + k;
                    let vec_of = |f: usize| {
                        let w = widths[f];
                        &data[f][sample * w..(sample + 1) * w]
                    };
                    match kind {
                        InteractionKind::Cat => {
                            let mut at = 0;
                            for f in 0..widths.len() {
                                row[at..at + widths[f]].copy_from_slice(vec_of(f));
                                at += widths[f];
                            }
                        }
                        InteractionKind::Dot => {
                            let d = widths[0];
                            row[..d].copy_from_slice(vec_of(0));
                            for (z, &(i, j)) in row[d..].iter_mut().zip(&pr) {
                                *z = dot(vec_of(i), vec_of(j));
                            }
                        }
                    }
                }
            });
        Tensor::f32(vec![s, width], out)
    }))
}

/// `interaction_grad(dr, x, e_0, ..) -> (dx, de_0, ..)`.
pub fn interaction_grad(
    kind: InteractionKind,
    self_interaction: bool,
    c: &Checked<'_>,
) -> Option<KResult<Vec<Tensor>>> {
    // The instance verified dr[S, width] and the operands after it.
    let dr = c.input(0).as_f32()?;
    let parsed = operands(c, 1)?;
    Some(parsed.map(|(s, data, widths)| {
        let width = interaction_width(kind, self_interaction, &widths);
        let f = widths.len();
        let mut outs: Vec<Vec<f32>> = widths.iter().map(|&w| vec![0.0f32; s * w]).collect();
        if s > 0 {
            let sb = block_rows(s, 8, 256);
            let nblocks = s.div_ceil(sb);
            // Regroup the F outputs by sample block: block b gets its rows of each.
            let mut per_block: Vec<Vec<&mut [f32]>> =
                (0..nblocks).map(|_| Vec::with_capacity(f)).collect();
            for (out, &w) in outs.iter_mut().zip(&widths) {
                if w == 0 {
                    per_block.iter_mut().for_each(|b| b.push(&mut []));
                    continue;
                }
                for (b, chunk) in out.chunks_mut(sb * w).enumerate() {
                    per_block[b].push(chunk);
                }
            }
            let pr = pairs(f, self_interaction);
            per_block
                .into_par_iter()
                .enumerate()
                .for_each(|(blk, mut grads)| {
                    let s0 = blk * sb;
                    let rows = (s - s0).min(sb);
                    for k in 0..rows {
                        let sample = s0 + k;
                        let drow = &dr[sample * width..(sample + 1) * width];
                        match kind {
                            InteractionKind::Cat => {
                                let mut at = 0;
                                for (g, &w) in grads.iter_mut().zip(&widths) {
                                    g[k * w..(k + 1) * w].copy_from_slice(&drow[at..at + w]);
                                    at += w;
                                }
                            }
                            InteractionKind::Dot => {
                                let d = widths[0];
                                grads[0][k * d..(k + 1) * d].copy_from_slice(&drow[..d]);
                                for (&g, &(i, j)) in drow[d..].iter().zip(&pr) {
                                    let ti = &data[i][sample * d..(sample + 1) * d];
                                    if i == j {
                                        let gi = &mut grads[i][k * d..(k + 1) * d];
                                        gi.iter_mut().zip(ti).for_each(|(o, &t)| *o += 2.0 * g * t);
                                        continue;
                                    }
                                    let tj = &data[j][sample * d..(sample + 1) * d];
                                    grads[i][k * d..(k + 1) * d]
                                        .iter_mut()
                                        .zip(tj)
                                        .for_each(|(o, &t)| *o += g * t);
                                    grads[j][k * d..(k + 1) * d]
                                        .iter_mut()
                                        .zip(ti)
                                        .for_each(|(o, &t)| *o += g * t);
                                }
                            }
                        }
                    }
                });
        }
        outs.into_iter()
            .zip(&widths)
            .map(|(o, &w)| Tensor::f32(vec![s, w], o))
            .collect()
    }))
}
