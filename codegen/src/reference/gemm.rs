//! Linear layers and their gradients as `matrixmultiply::sgemm` calls.
//!
//! | op | product | parallel split |
//! | --- | --- | --- |
//! | `linear(x[S,K], w[N,K], b[N])` | `x · wᵀ` (wᵀ transposed once per call into a row-major buffer: packing a strided wᵀ inside every block's sgemm costs more) | row blocks of S (one per thread, at most 512 rows so the block stays in L2); bias + activation applied to each block right after its GEMM, while it is in cache |
//! | `linear_dx(dz[S,N], w[N,K])` | `dz · w` | row blocks of S |
//! | `linear_dw(dz[S,N], x[S,K])` | `dzᵀ · x` (dzᵀ by strides) | row blocks of N; when N is too small to feed the threads, column blocks of K (each into a small buffer, then copied) |
//! | `linear_db(dz[S,N])` | `Σ_s dz[s]` | column blocks of N |
//!
//! Skinny layers (N < [`SKINNY`], e.g. the last layer's N = 1) skip `sgemm`, whose
//! packing dominates such products: `linear` does one 8-lane dot product per output
//! element, `linear_dx` sums the N rows of w scaled by dz (j in order), `linear_dw`
//! accumulates `dz[s,j]·x[s]` over s in order.
//!
//! `linear_dw` is split over its *output* (N, else K) rather than over the reduction
//! axis S: no partial sums, no reduction step. In general every output element is
//! computed by the same sequence of float operations whatever block it falls in
//! (`sgemm`'s reduction order does not depend on the row/column block; the skinny
//! loops and `linear_db` sum in index order), so every kernel here is deterministic
//! and independent of the pool size. Compared to the interpreter's sequential sums,
//! results differ by reassociation only (relative error ~1e-6·sqrt(K); the tests
//! allow 1e-5 relative to the magnitude of the terms); `linear_db` sums samples in
//! order, exactly like the definition.
//!
//! The operands come checked against the node's instance ([`Checked`]: ranks and
//! the shared dims verified by inference, buffers of their shapes' lengths), so
//! the kernels read `S`, `N`, `K` from it and check no shape.

use super::{KResult, block_rows, gemm_rows};
use dlrm_ir::{Act, Checked, Tensor};
use rayon::prelude::*;

/// Output widths below this use the skinny (non-`sgemm`) paths.
pub const SKINNY: usize = 8;

/// An 8-lane dot product (fixed association: lanes, then the tail).
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let lanes = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    lanes + tail
}

/// `o += a·x`, elementwise.
#[inline]
fn axpy(o: &mut [f32], a: f32, x: &[f32]) {
    o.iter_mut().zip(x).for_each(|(o, &x)| *o += a * x);
}

/// A read-only strided matrix view: element `(i, j)` is `data[i·rs + j·cs]`.
#[derive(Clone, Copy)]
pub(crate) struct MatRef<'a> {
    pub data: &'a [f32],
    pub rs: usize,
    pub cs: usize,
}

fn span(rows: usize, cols: usize, rs: usize, cs: usize) -> usize {
    // Index one past the last element touched.
    (rows - 1) * rs + (cols - 1) * cs + 1
}

fn stride(s: usize) -> isize {
    isize::try_from(s).unwrap_or_else(|_| unreachable!("strides of in-memory slices fit isize"))
}

/// `C[m×n] = A[m×k] · B[k×n]` with `C` row-major (row stride `ldc`), overwriting `C`.
///
/// Panics if a view is too short for its dimensions and strides (a bug in the
/// caller, which validated the shapes).
pub(crate) fn gemm(
    m: usize,
    k: usize,
    n: usize,
    a: MatRef<'_>,
    b: MatRef<'_>,
    c: &mut [f32],
    ldc: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(ldc >= n, "gemm: ldc {ldc} < n {n}");
    assert!(c.len() >= (m - 1) * ldc + n, "gemm: C too short");
    if k == 0 {
        for row in c.chunks_mut(ldc).take(m) {
            row[..n].fill(0.0);
        }
        return;
    }
    assert!(a.data.len() >= span(m, k, a.rs, a.cs), "gemm: A too short");
    assert!(b.data.len() >= span(k, n, b.rs, b.cs), "gemm: B too short");
    // SAFETY: the asserts above guarantee that every element `sgemm` reads
    // (A: i·rsa + p·csa for i < m, p < k; B: p·rsb + j·csb) is inside its slice and
    // every element it writes (C: i·ldc + j, j < n <= ldc) is inside `c`, whose
    // elements do not alias (csc = 1, rsc = ldc >= n). `c` is borrowed mutably, so
    // nothing else reads or writes it meanwhile; beta = 0 means C is not read.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.data.as_ptr(),
            stride(a.rs),
            stride(a.cs),
            b.data.as_ptr(),
            stride(b.rs),
            stride(b.cs),
            0.0,
            c.as_mut_ptr(),
            stride(ldc),
            1,
        );
    }
}

/// The transpose of a row-major `[rows, cols]` matrix, by 32×32 tiles.
pub(crate) fn transpose(a: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    const T: usize = 32;
    let mut t = vec![0.0f32; rows * cols];
    for i0 in (0..rows).step_by(T) {
        for j0 in (0..cols).step_by(T) {
            for i in i0..(i0 + T).min(rows) {
                for j in j0..(j0 + T).min(cols) {
                    t[j * rows + i] = a[i * cols + j];
                }
            }
        }
    }
    t
}

/// The fused epilogue: `act(c + b)` over a block of rows of width `b.len()`.
fn bias_act(c: &mut [f32], b: &[f32], act: Act) {
    for row in c.chunks_exact_mut(b.len()) {
        match act {
            Act::None => row.iter_mut().zip(b).for_each(|(v, &bb)| *v += bb),
            Act::Relu => row.iter_mut().zip(b).for_each(|(v, &bb)| {
                let x = *v + bb;
                *v = if x > 0.0 || x.is_nan() { x } else { 0.0 };
            }),
            Act::Sigmoid => row.iter_mut().zip(b).for_each(|(v, &bb)| {
                let x = *v + bb;
                *v = 1.0 / (1.0 + (-x).exp());
            }),
        }
    }
}

/// `linear(x[S,K], w[N,K], b[N]) -> act(x · wᵀ + b)`.
pub fn linear(act: Act, c: &Checked<'_>) -> Option<KResult<Tensor>> {
    let (x, w, b) = (
        c.input(0).as_f32()?,
        c.input(1).as_f32()?,
        c.input(2).as_f32()?,
    );
    // The instance verified x[S,K], weight[N,K], bias[N].
    let (&[s, k], &[n, _]) = (c.in_shape(0), c.in_shape(1)) else {
        return None;
    };
    Some((|| {
        let mut out = vec![0.0f32; s * n];
        if s == 0 || n == 0 {
            return Ok(Tensor::f32(vec![s, n], out));
        }
        if n < SKINNY {
            let rb = block_rows(s, 64, 1024);
            out.par_chunks_mut(rb * n).enumerate().for_each(|(blk, c)| {
                let r0 = blk * rb;
                for (i, row) in c.chunks_exact_mut(n).enumerate() {
                    let xr = &x[(r0 + i) * k..(r0 + i + 1) * k];
                    for (j, o) in row.iter_mut().enumerate() {
                        *o = dot(xr, &w[j * k..(j + 1) * k]);
                    }
                }
                bias_act(c, b, act);
            });
            return Ok(Tensor::f32(vec![s, n], out));
        }
        let wt = transpose(w, n, k);
        let rb = gemm_rows(s, 16, 512);
        out.par_chunks_mut(rb * n).enumerate().for_each(|(blk, c)| {
            let r0 = blk * rb;
            let rows = c.len() / n;
            gemm(
                rows,
                k,
                n,
                MatRef {
                    data: &x[r0 * k..],
                    rs: k,
                    cs: 1,
                },
                MatRef {
                    data: &wt,
                    rs: n,
                    cs: 1,
                },
                c,
                n,
            );
            bias_act(c, b, act);
        });
        Ok(Tensor::f32(vec![s, n], out))
    })())
}

/// `linear_dx(dz[S,N], w[N,K]) -> dz · w`.
pub fn linear_dx(c: &Checked<'_>) -> Option<KResult<Tensor>> {
    let (dz, w) = (c.input(0).as_f32()?, c.input(1).as_f32()?);
    // The instance verified dz[S,N], weight[N,K].
    let (&[s, n], &[_, k]) = (c.in_shape(0), c.in_shape(1)) else {
        return None;
    };
    Some((|| {
        let mut out = vec![0.0f32; s * k];
        if s == 0 || k == 0 {
            return Ok(Tensor::f32(vec![s, k], out));
        }
        if n < SKINNY {
            let rb = block_rows(s, 64, 1024);
            out.par_chunks_mut(rb * k).enumerate().for_each(|(blk, c)| {
                let r0 = blk * rb;
                for (i, row) in c.chunks_exact_mut(k).enumerate() {
                    for j in 0..n {
                        axpy(row, dz[(r0 + i) * n + j], &w[j * k..(j + 1) * k]);
                    }
                }
            });
            return Ok(Tensor::f32(vec![s, k], out));
        }
        let rb = gemm_rows(s, 16, 512);
        out.par_chunks_mut(rb * k).enumerate().for_each(|(blk, c)| {
            let r0 = blk * rb;
            let rows = c.len() / k;
            gemm(
                rows,
                n,
                k,
                MatRef {
                    data: &dz[r0 * n..],
                    rs: n,
                    cs: 1,
                },
                MatRef {
                    data: w,
                    rs: k,
                    cs: 1,
                },
                c,
                k,
            );
        });
        Ok(Tensor::f32(vec![s, k], out))
    })())
}

/// `linear_dw(dz[S,N], x[S,K]) -> dzᵀ · x` (`[N,K]`).
pub fn linear_dw(c: &Checked<'_>) -> Option<KResult<Tensor>> {
    let (dz, x) = (c.input(0).as_f32()?, c.input(1).as_f32()?);
    // The instance verified dz[S,N], x[S,K].
    let (&[s, n], &[_, k]) = (c.in_shape(0), c.in_shape(1)) else {
        return None;
    };
    Some((|| {
        let mut out = vec![0.0f32; n * k];
        if n == 0 || k == 0 || s == 0 {
            return Ok(Tensor::f32(vec![n, k], out));
        }
        let threads = rayon::current_num_threads().max(1);
        if n < SKINNY {
            // out[j] = Σ_s dz[s,j]·x[s], s in order; column blocks of K.
            let kb = k.div_ceil(threads).max(64);
            let parts: Vec<(usize, Vec<f32>)> = (0..k.div_ceil(kb))
                .into_par_iter()
                .map(|blk| {
                    let k0 = blk * kb;
                    let cols = kb.min(k - k0);
                    let mut c = vec![0.0f32; n * cols];
                    for si in 0..s {
                        let xr = &x[si * k + k0..si * k + k0 + cols];
                        for (j, o) in c.chunks_exact_mut(cols).enumerate() {
                            axpy(o, dz[si * n + j], xr);
                        }
                    }
                    (k0, c)
                })
                .collect();
            scatter_columns(&mut out, k, n, parts);
        } else if n >= 2 * threads || k < 64 {
            // Row blocks of the output: rows n0.. of dzᵀ are columns n0.. of dz.
            let nb = gemm_rows(n, 1, usize::MAX);
            out.par_chunks_mut(nb * k).enumerate().for_each(|(blk, c)| {
                let n0 = blk * nb;
                let rows = c.len() / k;
                gemm(
                    rows,
                    s,
                    k,
                    MatRef {
                        data: &dz[n0..],
                        rs: 1,
                        cs: n,
                    },
                    MatRef {
                        data: x,
                        rs: k,
                        cs: 1,
                    },
                    c,
                    k,
                );
            });
        } else {
            // Few output rows: split the columns of K.
            let kb = k.div_ceil(threads);
            let parts: Vec<(usize, Vec<f32>)> = (0..k.div_ceil(kb))
                .into_par_iter()
                .map(|blk| {
                    let k0 = blk * kb;
                    let cols = kb.min(k - k0);
                    let mut c = vec![0.0f32; n * cols];
                    gemm(
                        n,
                        s,
                        cols,
                        MatRef {
                            data: dz,
                            rs: 1,
                            cs: n,
                        },
                        MatRef {
                            data: &x[k0..],
                            rs: k,
                            cs: 1,
                        },
                        &mut c,
                        cols,
                    );
                    (k0, c)
                })
                .collect();
            scatter_columns(&mut out, k, n, parts);
        }
        Ok(Tensor::f32(vec![n, k], out))
    })())
}

/// Copies column blocks `(k0, [n × cols])` into the row-major `[n × k]` output.
fn scatter_columns(out: &mut [f32], k: usize, n: usize, parts: Vec<(usize, Vec<f32>)>) {
    for (k0, c) in parts {
        let cols = c.len() / n.max(1);
        if cols == 0 {
            continue;
        }
        for (dst, src) in out.chunks_exact_mut(k).zip(c.chunks_exact(cols)) {
            dst[k0..k0 + cols].copy_from_slice(src);
        }
    }
}

/// `linear_db(dz[S,N]) -> Σ_s dz[s]` (`[N]`), summed over samples in order.
pub fn linear_db(c: &Checked<'_>) -> Option<KResult<Tensor>> {
    let dz = c.input(0).as_f32()?;
    // The instance verified dz[S,N].
    let &[s, n] = c.in_shape(0) else {
        return None;
    };
    let mut out = vec![0.0f32; n];
    if n > 0 {
        // Column blocks; each scans every sample in order (as the definition).
        let cb = if s * n >= 1 << 16 {
            block_rows(n, 64, usize::MAX)
        } else {
            n
        };
        out.par_chunks_mut(cb).enumerate().for_each(|(blk, acc)| {
            let c0 = blk * cb;
            let c1 = c0 + acc.len();
            for row in dz.chunks_exact(n).take(s) {
                acc.iter_mut().zip(&row[c0..c1]).for_each(|(a, &v)| *a += v);
            }
        });
    }
    Some(Ok(Tensor::f32(vec![n], out)))
}
