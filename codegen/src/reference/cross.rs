//! The reference kernels of the `cross` module ops (DCN-v2's low-rank cross layer,
//! `dlrm_ir::ops::cross`, whose doc is the specification): `matrixmultiply::sgemm`
//! on row blocks of the batch (one per thread), the layer's elementwise steps
//! applied to each block right after its products, while it is in cache. f32 only
//! (`None` otherwise: the interpreter runs). The elementwise steps `cross_mix` and
//! `cross_mix_grad` take f32 or bf16 operands in any mix, in parallel chunks.
//!
//! `sgemm` sums in its own order, so results equal the interpreter's within
//! rounding, not bit for bit (checked in `codegen/tests/cross.rs`).

use super::KResult;
use super::gemm::{MatRef, gemm};
use dlrm_ir::{Checked, DType, Data, Tensor};
use half::bf16;
use rayon::prelude::*;

/// A module op's reference kernel: `None` for operands it does not handle.
pub(crate) type Kernel = fn(&Checked<'_>) -> Option<KResult<Vec<Tensor>>>;

/// The kernel of a module op, by mnemonic: the one list of the module ops with a
/// reference kernel (`None`: the interpreter runs them).
pub(crate) fn kernel(mnemonic: &str) -> Option<Kernel> {
    match mnemonic {
        "cross" => Some(cross),
        "cross_grad" => Some(cross_grad),
        "cross_save" => Some(cross_save),
        "cross_grad_saved" => Some(cross_grad_saved),
        "cross_mix" => Some(cross_mix),
        "cross_mix_grad" => Some(cross_mix_grad),
        _ => None,
    }
}

fn rm(data: &[f32], cols: usize) -> MatRef<'_> {
    MatRef {
        data,
        rs: cols,
        cs: 1,
    }
}

/// The transposed view of a row-major `[rows, cols]` matrix.
fn tr(data: &[f32], cols: usize) -> MatRef<'_> {
    MatRef {
        data,
        rs: 1,
        cs: cols,
    }
}

/// `z = x·vᵀ` and `w = z·uᵀ + b` for the `rows` rows of one block (`z`: `rows×r`,
/// `w`: `rows×d`).
#[allow(clippy::too_many_arguments)]
fn block_forward(
    x: &[f32],
    v: &[f32],
    u: &[f32],
    b: &[f32],
    rows: usize,
    d: usize,
    r: usize,
    z: &mut [f32],
    w: &mut [f32],
) {
    gemm(rows, d, r, rm(x, d), tr(v, d), z, r);
    gemm(rows, r, d, rm(z, r), tr(u, r), w, d);
    for row in w.chunks_exact_mut(d) {
        for (e, &bias) in row.iter_mut().zip(b) {
            *e += bias;
        }
    }
}

fn f32s<'a>(c: &'a Checked<'_>, from: usize, n: usize) -> Option<Vec<&'a [f32]>> {
    (from..from + n).map(|i| c.input(i).as_f32()).collect()
}

fn cross(c: &Checked<'_>) -> Option<KResult<Vec<Tensor>>> {
    forward(c, false)
}

fn cross_save(c: &Checked<'_>) -> Option<KResult<Vec<Tensor>>> {
    forward(c, true)
}

/// `cross`, or with `save` `cross_save` (`y`, `z`, `w`).
fn forward(c: &Checked<'_>, save: bool) -> Option<KResult<Vec<Tensor>>> {
    let ops = f32s(c, 0, 5)?;
    let [x0, x, v, u, b] = ops[..] else {
        return None;
    };
    let (&[s, d], r) = (c.in_shape(1), c.in_shape(2)[0]) else {
        return None;
    };
    if r == 0 {
        return None; // rank 0: the interpreter (w = b).
    }
    let mut y = vec![0.0f32; s * d];
    // Without `save`, z is one block's scratch and w is computed in y's block.
    let (mut z, mut w) = if save {
        (vec![0.0f32; s * r], vec![0.0f32; s * d])
    } else {
        (Vec::new(), Vec::new())
    };
    if s > 0 && d > 0 {
        let rb = s.div_ceil(rayon::current_num_threads()).max(16);
        let zs: Vec<&mut [f32]> = z.chunks_mut(rb * r).collect();
        let ws: Vec<&mut [f32]> = w.chunks_mut(rb * d).collect();
        let mut saves: Vec<Option<(&mut [f32], &mut [f32])>> =
            zs.into_iter().zip(ws).map(Some).collect();
        saves.resize_with(s.div_ceil(rb), || None);
        y.par_chunks_mut(rb * d)
            .zip(saves.into_par_iter())
            .enumerate()
            .for_each(|(blk, (yb, keep))| {
                let (r0, rows) = (blk * rb, yb.len() / d);
                let (x0b, xb) = (&x0[r0 * d..][..rows * d], &x[r0 * d..][..rows * d]);
                match keep {
                    Some((zb, wb)) => {
                        block_forward(&x[r0 * d..], v, u, b, rows, d, r, zb, wb);
                        for (((o, &a), &res), &e) in yb.iter_mut().zip(x0b).zip(xb).zip(wb.iter()) {
                            *o = a * e + res;
                        }
                    }
                    None => {
                        let mut zb = vec![0.0f32; rows * r];
                        block_forward(&x[r0 * d..], v, u, b, rows, d, r, &mut zb, yb);
                        for ((o, &a), &res) in yb.iter_mut().zip(x0b).zip(xb) {
                            *o = a * *o + res;
                        }
                    }
                }
            });
    }
    let mut out = vec![Tensor::f32(vec![s, d], y)];
    if save {
        out.push(Tensor::f32(vec![s, r], z));
        out.push(Tensor::f32(vec![s, d], w));
    }
    Some(Ok(out))
}

fn cross_grad(c: &Checked<'_>) -> Option<KResult<Vec<Tensor>>> {
    backward(c, false)
}

fn cross_grad_saved(c: &Checked<'_>) -> Option<KResult<Vec<Tensor>>> {
    backward(c, true)
}

/// `cross_grad`, or with `saved` `cross_grad_saved` (`z` and `w` given, not
/// recomputed).
fn backward(c: &Checked<'_>, saved: bool) -> Option<KResult<Vec<Tensor>>> {
    let ops = f32s(c, 0, if saved { 7 } else { 6 })?;
    let (dy, x0, x, v, u) = (ops[0], ops[1], ops[2], ops[3], ops[4]);
    // `b` (recomputing) or the saved `z` and `w`.
    let (b, zs, ws) = if saved {
        (&[][..], ops[5], ops[6])
    } else {
        (ops[5], &[][..], &[][..])
    };
    let (&[s, d], r) = (c.in_shape(2), c.in_shape(3)[0]) else {
        return None;
    };
    if r == 0 {
        return None; // rank 0: the interpreter (dx = dy, dx0 = dy ⊙ b).
    }
    let (mut z, mut g, mut t) = (
        vec![0.0f32; s * r],
        vec![0.0f32; s * d],
        vec![0.0f32; s * r],
    );
    let (mut dx0, mut dx) = (vec![0.0f32; s * d], vec![0.0f32; s * d]);
    let (mut du, mut dv, mut db) = (vec![0.0f32; d * r], vec![0.0f32; r * d], vec![0.0f32; d]);
    if s > 0 && d > 0 && r > 0 {
        let rb = s.div_ceil(rayon::current_num_threads()).max(16);
        z.par_chunks_mut(rb * r)
            .zip(g.par_chunks_mut(rb * d))
            .zip(t.par_chunks_mut(rb * r))
            .zip(dx0.par_chunks_mut(rb * d))
            .zip(dx.par_chunks_mut(rb * d))
            .enumerate()
            .for_each(|(blk, ((((zb, gb), tb), dx0b), dxb))| {
                let (r0, rows) = (blk * rb, gb.len() / d);
                let span = r0 * d..(r0 + rows) * d;
                let (dyb, x0b) = (&dy[span.clone()], &x0[span]);
                // w lands in dx0's block, then becomes dy ⊙ w in place.
                if saved {
                    zb.copy_from_slice(&zs[r0 * r..(r0 + rows) * r]);
                    dx0b.copy_from_slice(&ws[r0 * d..(r0 + rows) * d]);
                } else {
                    block_forward(&x[r0 * d..], v, u, b, rows, d, r, zb, dx0b);
                }
                for (((gw, w), &e), &a) in gb.iter_mut().zip(dx0b.iter_mut()).zip(dyb).zip(x0b) {
                    *gw = e * a;
                    *w *= e;
                }
                gemm(rows, d, r, rm(gb, d), rm(u, r), tb, r);
                gemm(rows, r, d, rm(tb, r), rm(v, d), dxb, d);
                for (o, &e) in dxb.iter_mut().zip(dyb) {
                    *o += e;
                }
            });
        // du = gᵀ·z and dv = tᵀ·x: one row block of each result per thread (each
        // block's sgemm packs all of z or x, so few large blocks), reducing over S.
        let (gr, zr, tr_, xr) = (&g, &z, &t, x);
        let block = |rows: usize| rows.div_ceil(rayon::current_num_threads()).max(16);
        let bd = block(d);
        du.par_chunks_mut(bd * r).enumerate().for_each(|(blk, o)| {
            let (d0, m) = (blk * bd, o.len() / r);
            gemm(m, s, r, tr(&gr[d0..], d), rm(zr, r), o, r);
        });
        let br = block(r);
        dv.par_chunks_mut(br * d).enumerate().for_each(|(blk, o)| {
            let (q0, m) = (blk * br, o.len() / d);
            gemm(m, s, d, tr(&tr_[q0..], r), rm(xr, d), o, d);
        });
        for row in g.chunks_exact(d) {
            for (acc, &e) in db.iter_mut().zip(row) {
                *acc += e;
            }
        }
    }
    Some(Ok(vec![
        Tensor::f32(vec![s, d], dx0),
        Tensor::f32(vec![s, d], dx),
        Tensor::f32(vec![r, d], dv),
        Tensor::f32(vec![d, r], du),
        Tensor::f32(vec![d], db),
    ]))
}

/// Elements per parallel chunk of the elementwise steps.
const CHUNK: usize = 1 << 14;

/// A float operand of an elementwise step, read as f32 per element.
#[derive(Clone, Copy)]
enum Elems<'a> {
    F32(&'a [f32]),
    BF16(&'a [bf16]),
}

impl Elems<'_> {
    fn of(t: &Tensor) -> Option<Elems<'_>> {
        match &t.data {
            Data::F32(v) => Some(Elems::F32(v)),
            Data::BF16(v) => Some(Elems::BF16(v)),
            _ => None,
        }
    }

    /// Elements `at..at + buf.len()` into `buf`, widened to f32 (exact).
    fn load(self, at: usize, buf: &mut [f32]) {
        match self {
            Elems::F32(v) => buf.copy_from_slice(&v[at..at + buf.len()]),
            Elems::BF16(v) => {
                for (o, x) in buf.iter_mut().zip(&v[at..]) {
                    *o = x.to_f32();
                }
            }
        }
    }
}

/// `f(a, b, c)` of the operands' elements, computed in f32 in parallel chunks
/// (each operand widened a chunk at a time), stored as `dtype` (bf16: rounded
/// once, to nearest even).
fn elementwise(
    dtype: DType,
    shape: Vec<usize>,
    ops: [Elems<'_>; 3],
    f: impl Fn(f32, f32, f32) -> f32 + Sync,
) -> Tensor {
    let n: usize = shape.iter().product();
    // Chunk `i` of the results, in f32.
    let chunk = |i: usize, len: usize| -> Vec<f32> {
        let at = i * CHUNK;
        let mut bufs = [vec![0.0f32; len], vec![0.0f32; len], vec![0.0f32; len]];
        for (b, e) in bufs.iter_mut().zip(ops) {
            e.load(at, b);
        }
        let [a, b, c] = &bufs;
        (0..len).map(|k| f(a[k], b[k], c[k])).collect()
    };
    match dtype {
        DType::BF16 => {
            let mut y = vec![bf16::ZERO; n];
            y.par_chunks_mut(CHUNK).enumerate().for_each(|(i, yc)| {
                let vals = chunk(i, yc.len());
                for (o, v) in yc.iter_mut().zip(vals) {
                    *o = bf16::from_f32(v);
                }
            });
            Tensor::bf16(shape, y)
        }
        _ => {
            let mut y = vec![0.0f32; n];
            y.par_chunks_mut(CHUNK)
                .enumerate()
                .for_each(|(i, yc)| yc.copy_from_slice(&chunk(i, yc.len())));
            Tensor::f32(shape, y)
        }
    }
}

/// The three float operands of an elementwise step.
fn three<'a>(c: &'a Checked<'_>) -> Option<[Elems<'a>; 3]> {
    Some([
        Elems::of(c.input(0))?,
        Elems::of(c.input(1))?,
        Elems::of(c.input(2))?,
    ])
}

/// The three operands as f32 slices, if all three are f32 (the loops over them
/// vectorise with no widening copy).
fn three_f32<'a>(c: &'a Checked<'_>) -> Option<[&'a [f32]; 3]> {
    Some([
        c.input(0).as_f32()?,
        c.input(1).as_f32()?,
        c.input(2).as_f32()?,
    ])
}

/// `cross_mix(x0, w, x)`: `x0·w + x` per element (f32 or bf16 operands in any mix).
fn cross_mix(c: &Checked<'_>) -> Option<KResult<Vec<Tensor>>> {
    if let (Some([x0, w, x]), DType::F32) = (three_f32(c), c.out(0).dtype) {
        let mut y = vec![0.0f32; x.len()];
        y.par_chunks_mut(CHUNK).enumerate().for_each(|(i, yc)| {
            let at = i * CHUNK..i * CHUNK + yc.len();
            let (x0, w, x) = (&x0[at.clone()], &w[at.clone()], &x[at]);
            for (k, o) in yc.iter_mut().enumerate() {
                *o = x0[k] * w[k] + x[k];
            }
        });
        return Some(Ok(vec![Tensor::f32(c.in_shape(2).to_vec(), y)]));
    }
    let ops = three(c)?;
    let shape = c.in_shape(2).to_vec();
    let y = elementwise(c.out(0).dtype, shape, ops, |x0, w, x| x0 * w + x);
    Some(Ok(vec![y]))
}

/// `cross_mix_grad(dy, x0, w)`: `(dy·x0, dy·w)` per element (f32 or bf16 operands
/// in any mix).
fn cross_mix_grad(c: &Checked<'_>) -> Option<KResult<Vec<Tensor>>> {
    let all_f32 = (0..2).all(|k| c.out(k).dtype == DType::F32);
    if let (Some([dy, x0, w]), true) = (three_f32(c), all_f32) {
        let (mut g, mut dx0) = (vec![0.0f32; dy.len()], vec![0.0f32; dy.len()]);
        g.par_chunks_mut(CHUNK)
            .zip(dx0.par_chunks_mut(CHUNK))
            .enumerate()
            .for_each(|(i, (gc, dc))| {
                let at = i * CHUNK..i * CHUNK + gc.len();
                let (dy, x0, w) = (&dy[at.clone()], &x0[at.clone()], &w[at]);
                for k in 0..gc.len() {
                    gc[k] = dy[k] * x0[k];
                    dc[k] = dy[k] * w[k];
                }
            });
        let shape = c.in_shape(0).to_vec();
        return Some(Ok(vec![
            Tensor::f32(shape.clone(), g),
            Tensor::f32(shape, dx0),
        ]));
    }
    let ops = three(c)?;
    let shape = c.in_shape(0).to_vec();
    let g = elementwise(c.out(0).dtype, shape.clone(), ops, |dy, x0, _| dy * x0);
    let dx0 = elementwise(c.out(1).dtype, shape, ops, |dy, _, w| dy * w);
    Some(Ok(vec![g, dx0]))
}
