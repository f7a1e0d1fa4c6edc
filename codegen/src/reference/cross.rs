//! The reference kernels of the `cross` module ops (DCN-v2's low-rank cross layer,
//! `dlrm_ir::ops::cross`, whose doc is the specification): `matrixmultiply::sgemm`
//! on row blocks of the batch (one per thread), the layer's elementwise steps
//! applied to each block right after its products, while it is in cache. f32 only
//! (`None` otherwise: the interpreter runs). The elementwise steps `cross_mix` and
//! `cross_mix_grad` take f32 or bf16 operands in any mix, in parallel chunks.
//!
//! `sgemm` sums in its own order, so results equal the interpreter's within
//! rounding, not bit for bit (checked in `codegen/tests/cross.rs`).

use super::gemm::{MatRef, gemm};
use super::{Elem, KResult};
use dlrm_ir::module::ModOp;
use dlrm_ir::{Checked, DType, Data, Tensor};
use half::bf16;
use rayon::prelude::*;
use std::mem::MaybeUninit;

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

/// `cross` (the registry's kernel, `crate::modules`).
pub(crate) fn cross(_: &ModOp, c: &Checked<'_>) -> Option<KResult<Vec<Tensor>>> {
    forward(c, false)
}

/// `cross_save`: `cross` keeping `z` and `w` for the backward.
pub(crate) fn cross_save(_: &ModOp, c: &Checked<'_>) -> Option<KResult<Vec<Tensor>>> {
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

/// `cross_grad`.
pub(crate) fn cross_grad(_: &ModOp, c: &Checked<'_>) -> Option<KResult<Vec<Tensor>>> {
    backward(c, false)
}

/// `cross_grad_saved`: `cross_grad` on the saved `z` and `w`.
pub(crate) fn cross_grad_saved(_: &ModOp, c: &Checked<'_>) -> Option<KResult<Vec<Tensor>>> {
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
pub(crate) const CHUNK: usize = 1 << 14;

/// `$body` with `$T` the element type of storage `$dtype` (f32 or bf16;
/// `None` for other dtypes).
macro_rules! by_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::BF16 => {
                type $T = bf16;
                $body
            }
            _ => None,
        }
    };
}

/// `R` results of the elementwise step `f` of the three operands' elements,
/// computed in f32 (operands widened exactly), stored in the declared dtypes
/// (bf16: rounded once, to nearest even). One loop per combination of operand
/// and result storage ([`direct`]), so every loop vectorises; results of two
/// storages (no plan has them today) are computed in f32 and narrowed after.
fn step<const R: usize>(
    c: &Checked<'_>,
    f: impl Fn(f32, f32, f32) -> [f32; R] + Sync + Copy,
) -> Option<KResult<Vec<Tensor>>> {
    let out = c.out(0).dtype;
    let one_storage = (0..R).all(|k| c.out(k).dtype == out);
    let ys = by_dtype!(c.input(0).dtype(), A => {
        by_dtype!(c.input(1).dtype(), B => {
            by_dtype!(c.input(2).dtype(), C => {
                if one_storage {
                    by_dtype!(out, O => direct::<A, B, C, O, R>(c, f))
                } else {
                    direct::<A, B, C, f32, R>(c, f)
                }
            })
        })
    })?;
    let ys = ys
        .into_iter()
        .enumerate()
        .map(|(k, y)| match (c.out(k).dtype, y.as_f32()) {
            (DType::BF16, Some(v)) => Tensor::bf16(
                y.shape.clone(),
                v.par_iter().map(|&x| bf16::store(x)).collect(),
            ),
            _ => y,
        })
        .collect();
    Some(Ok(ys))
}

/// One chunk of [`direct`]: `ys[r][k] = f(a[k], b[k], d[k])[r]` for every `k`
/// of the operands' chunks (each as long as the results').
#[inline(always)]
fn chunk<A: Elem, B: Elem, C: Elem, O: Elem, const R: usize>(
    (a, b, d): (&[A], &[B], &[C]),
    ys: &mut [&mut [MaybeUninit<O>]; R],
    f: &impl Fn(f32, f32, f32) -> [f32; R],
) {
    for k in 0..a.len() {
        let y = f(a[k].load(), b[k].load(), d[k].load());
        for (o, v) in ys.iter_mut().zip(y) {
            o[k].write(O::store(v));
        }
    }
}

/// [`chunk`] compiled for AVX2: the baseline x86-64 target (SSE2) has no
/// 32-to-16-bit pack, so the bf16 stores would not vectorise there (this form
/// ran the bf16 steps of a DLRM-DCNv2 step 1.7-1.8x faster).
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn chunk_avx2<A: Elem, B: Elem, C: Elem, O: Elem, const R: usize>(
    ins: (&[A], &[B], &[C]),
    ys: &mut [&mut [MaybeUninit<O>]; R],
    f: &impl Fn(f32, f32, f32) -> [f32; R],
) {
    chunk(ins, ys, f);
}

/// `R` results stored as `O`, `f(a, b, d)` of operands stored as `A`, `B` and
/// `C` (`None` if they are not); parallel over chunks, the results written
/// once (never zeroed first).
fn direct<A: Elem, B: Elem, C: Elem, O: Elem, const R: usize>(
    c: &Checked<'_>,
    f: impl Fn(f32, f32, f32) -> [f32; R] + Sync,
) -> Option<Vec<Tensor>> {
    let (xa, xb, xc) = (
        A::slice(c.input(0))?,
        B::slice(c.input(1))?,
        C::slice(c.input(2))?,
    );
    // The shape rule gave the operands and the results one shape.
    let n = xa.len();
    let mut outs: [Vec<O>; R] = std::array::from_fn(|_| Vec::with_capacity(n));
    {
        let mut per_out: Vec<_> = outs
            .iter_mut()
            .map(|o| o.spare_capacity_mut()[..n].chunks_mut(CHUNK))
            .collect();
        // Per task, chunk `i` of every result (arrays: the loop below knows R).
        let tasks: Vec<[&mut [MaybeUninit<O>]; R]> = (0..n.div_ceil(CHUNK))
            .map(|_| std::array::from_fn(|r| per_out[r].next().unwrap_or_default()))
            .collect();
        let avx2 = super::convert::has_avx2();
        tasks.into_par_iter().enumerate().for_each(|(i, mut ys)| {
            let (at, len) = (i * CHUNK, CHUNK.min(n - i * CHUNK));
            let ins = (&xa[at..at + len], &xb[at..at + len], &xc[at..at + len]);
            if avx2 {
                // SAFETY: the CPU has AVX2 (checked above).
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    chunk_avx2(ins, &mut ys, &f)
                };
            } else {
                chunk(ins, &mut ys, &f);
            }
        });
    }
    let shape = c.in_shape(0).to_vec();
    Some(
        outs.into_iter()
            .map(|mut v| {
                // SAFETY: the tasks wrote every element of `0..n`: their chunks
                // of `CHUNK` cover it, and each writes all of its chunk.
                unsafe { v.set_len(n) };
                O::tensor(shape.clone(), v)
            })
            .collect(),
    )
}

/// Elements of an operand of [`mix_into`]: f32 or bf16.
#[derive(Clone, Copy)]
pub(crate) enum In<'a> {
    F32(&'a [f32]),
    BF16(&'a [bf16]),
}

impl<'a> In<'a> {
    /// `t`'s elements, if it is f32 or bf16.
    pub(crate) fn of(t: &'a Tensor) -> Option<In<'a>> {
        match &t.data {
            Data::F32(v) => Some(In::F32(v)),
            Data::BF16(v) => Some(In::BF16(v)),
            _ => None,
        }
    }

    /// Elements `at..at + len`.
    pub(crate) fn range(self, at: usize, len: usize) -> In<'a> {
        match self {
            In::F32(v) => In::F32(&v[at..at + len]),
            In::BF16(v) => In::BF16(&v[at..at + len]),
        }
    }
}

/// Where [`mix_into`] writes: f32 or bf16 elements, not yet initialised.
pub(crate) enum Out<'a> {
    F32(&'a mut [MaybeUninit<f32>]),
    BF16(&'a mut [MaybeUninit<bf16>]),
}

/// `out[k] = f(a[k], b[k], d[k])` for every `k`, computed in f32 (operands
/// widened exactly), stored in `out`'s storage (bf16 rounded once, to nearest
/// even): the elementwise steps of [`cross_mix`] and [`cross_mix_grad`] on one
/// chunk, for the GEMM epilogues that fuse them (`crate::modules`). The
/// operands are as long as `out`.
pub(crate) fn mix_into(
    (a, b, d): (In<'_>, In<'_>, In<'_>),
    out: Out<'_>,
    f: &impl Fn(f32, f32, f32) -> f32,
) {
    let g = |x: f32, y: f32, z: f32| [f(x, y, z)];
    macro_rules! of {
        ($e:expr, $T:ident => $body:expr) => {
            match $e {
                In::F32(v) => {
                    type $T = f32;
                    let v: &[$T] = v;
                    $body(v)
                }
                In::BF16(v) => {
                    type $T = bf16;
                    let v: &[$T] = v;
                    $body(v)
                }
            }
        };
    }
    fn run<A: Elem, B: Elem, C: Elem, O: Elem>(
        ins: (&[A], &[B], &[C]),
        out: &mut [MaybeUninit<O>],
        f: &impl Fn(f32, f32, f32) -> [f32; 1],
    ) {
        let mut ys = [out];
        if super::convert::has_avx2() {
            // SAFETY: the CPU has AVX2.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                chunk_avx2(ins, &mut ys, f)
            };
            #[cfg(not(target_arch = "x86_64"))]
            chunk(ins, &mut ys, f);
        } else {
            chunk(ins, &mut ys, f);
        }
    }
    of!(a, A => |a: &[A]| of!(b, B => |b: &[B]| of!(d, C => |d: &[C]| match out {
        Out::F32(o) => run::<A, B, C, f32>((a, b, d), o, &g),
        Out::BF16(o) => run::<A, B, C, bf16>((a, b, d), o, &g),
    })))
}

/// `cross_mix(x0, w, x)`: `x0·w + x` per element (f32 or bf16 operands in any mix).
pub(crate) fn cross_mix(_: &ModOp, c: &Checked<'_>) -> Option<KResult<Vec<Tensor>>> {
    step(c, |x0, w, x| [x0 * w + x])
}

/// `cross_mix_grad(dy, x0, w)`: `(dy·x0, dy·w)` per element (f32 or bf16 operands
/// in any mix).
pub(crate) fn cross_mix_grad(_: &ModOp, c: &Checked<'_>) -> Option<KResult<Vec<Tensor>>> {
    step(c, |dy, x0, w| [dy * x0, dy * w])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX2 form of a chunk is the baseline's, bit for bit, for every
    /// storage of operands and results (NaN, infinities and rounding ties
    /// included).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn avx2_chunk_is_the_baseline_chunk() {
        if !super::super::convert::has_avx2() {
            return;
        }
        let mut bits = 0x9e37_79b9u32;
        let mut vals: Vec<f32> = (0..4099)
            .map(|_| {
                bits ^= bits << 13;
                bits ^= bits >> 17;
                bits ^= bits << 5;
                f32::from_bits(bits)
            })
            .collect();
        vals.extend([
            f32::NAN,
            f32::INFINITY,
            -0.0,
            1.0 + f32::EPSILON * 64.0,
            3.0e38,
        ]);
        let a: Vec<f32> = vals.clone();
        let b: Vec<bf16> = vals.iter().rev().map(|&x| bf16::from_f32(x)).collect();
        let d: Vec<bf16> = vals.iter().map(|&x| bf16::from_f32(x * 0.5)).collect();
        let f = |x: f32, y: f32, z: f32| [x * y + z, x * z];
        let run = |wide: bool| {
            let n = a.len();
            let (mut y0, mut y1) = (Vec::<bf16>::with_capacity(n), Vec::with_capacity(n));
            let mut ys = [
                &mut y0.spare_capacity_mut()[..n],
                &mut y1.spare_capacity_mut()[..n],
            ];
            if wide {
                // SAFETY: checked above.
                unsafe { chunk_avx2((&a[..], &b[..], &d[..]), &mut ys, &f) };
            } else {
                chunk((&a[..], &b[..], &d[..]), &mut ys, &f);
            }
            // SAFETY: `chunk` wrote all `n` of both.
            unsafe {
                y0.set_len(n);
                y1.set_len(n);
            }
            (y0, y1)
        };
        let (base, wide) = (run(false), run(true));
        let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&base.0), bits(&wide.0));
        assert_eq!(bits(&base.1), bits(&wide.1));
    }
}
