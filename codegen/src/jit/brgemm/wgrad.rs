//! `brgemm_wgrad`: the weight and bias gradients of a blocked layer (see the parent
//! module's table).

use super::{
    check_cover, jit_err, per_n_block, per_n_block_pays, row_block, run_blocks, tail, with_kernel,
};
use crate::jit::buffers::{Floats, Fresh, Scratch};
use crate::jit::gemm::{Elt, GemmKernel, GemmSpec, Operand, OutBuf};
use crate::jit::layout::{buf, zeros};
use crate::jit::linear::{elt_of, operand};
use crate::jit::{Jit, JitError, JitOptions};
use crate::reference::brgemm::{WgradArgs, act_grad, floats, wgrad_args};
use crate::reference::{Elem, KResult, shape_err};
use dlrm_ir::{Act, Checked, Data, Tensor, TensorType};
use half::bf16;
use rayon::prelude::*;

/// `brgemm_wgrad(dyb[Nb,S,bn], (yb,) xb[Kb,S,bk]) -> (dw[Nb,Kb,bk,bn], db[n])`.
pub fn brgemm_wgrad(
    jit: &Jit,
    opts: &JitOptions,
    act: Act,
    n: usize,
    c: &Checked<'_>,
    out_types: &[TensorType],
) -> KResult<Vec<Tensor>> {
    const OP: &str = "brgemm_wgrad";
    let WgradArgs {
        dy,
        y,
        x,
        dims: [nb, kb, s, bk, bn],
        outs: [dw_t, db_t],
    } = wgrad_args(act, c, out_types)?;
    let (dw_elt, db_elt) = (
        elt_of(dw_t.dtype).ok_or_else(|| shape_err(OP, "dw must be f32 or bf16".into()))?,
        elt_of(db_t.dtype).ok_or_else(|| shape_err(OP, "db must be f32 or bf16".into()))?,
    );
    let xa = operand(x).ok_or_else(|| shape_err(OP, "x must be a float tensor".into()))?;
    if nb == 0 || kb == 0 || bn == 0 || bk == 0 || s == 0 {
        let dw = Floats::zeros(dw_elt, nb * kb * bk * bn).tensor(vec![nb, kb, bk, bn]);
        let db = Floats::zeros(db_elt, n).tensor(vec![n]);
        return Ok(vec![dw, db]);
    }
    if bn > 1
        && let Some((dz, x16)) = super::wgrad_bf16::operands(opts, act, (dy, y, x))
    {
        let dims = (nb, kb, s, bk, bn);
        let (dw, dbp) = super::wgrad_bf16::wgrad_gemm(jit, opts, (&dz, x16), dims, dw_elt)?;
        return Ok(finish_wgrad(dw, dbp, n, (nb, kb, bk, bn), db_elt));
    }
    if bn == 1 {
        let (dyv, yv) = (floats(dy), floats(y));
        return wgrad_columns(jit, act, (&dyv, &yv), xa, (nb, kb, s, bk), (dw_elt, db_elt));
    }
    let pack_x = xa.elt() == Elt::BF16 && nb >= PACK_X_MIN_NB;
    let threads = rayon::current_num_threads().max(1);
    let per_k = pack_x && kb >= K_BLOCKS_PER_THREAD * threads;
    let base = wgrad_spec((pack_x, per_k), (kb, s, bk, bn), xa.elt(), dw_elt);
    let mut result = None;
    let dims = (nb, kb, bk);
    // `Ok`: bf16 `dy` and `y`, read in place and widened as each panel is
    // packed (a widened copy of both first was 8-12% of a bf16 dlrm-small
    // training step under the FMA kernels); `Err`: f32 (or mixed) as f32.
    let operands = match (&dy.data, &y.data) {
        (Data::BF16(d), Data::BF16(yy)) => Ok((d.as_slice(), yy.as_slice())),
        _ => Err((floats(dy), floats(y))),
    };
    with_kernel(jit, opts, OP, (base, false, false), &mut |kern| {
        result = Some(match &operands {
            Ok((dy, y)) => {
                let dz = DzRows { act, dy, y, s, bn };
                wgrad_gemm(kern, &dz, xa, dims, dw_elt)?
            }
            Err((dy, y)) => {
                let dz = DzRows { act, dy, y, s, bn };
                wgrad_gemm(kern, &dz, xa, dims, dw_elt)?
            }
        });
        Ok(())
    })?;
    let (dw, dbp) = result.ok_or_else(|| shape_err(OP, "internal: no result".into()))?;
    Ok(finish_wgrad(dw, dbp, n, (nb, kb, bk, bn), db_elt))
}

/// The GEMM spec of `brgemm_wgrad` for `[Kb·bk] × S` of `xᵀ` (elements `xa`)
/// times `S × bn` of `dz`. An f32 `x` is read in place, its transposed view
/// (each tile's `mr` columns of a block, `bk` apart from one sample to the
/// next); a bf16 `x` is packed once per call (`pack_x`, widened) when at least
/// [`PACK_X_MIN_NB`] N blocks reuse it, as the FMA kernels' bf16 `A` read in
/// place costs a widening per broadcast. Packing an f32 `x` copied `S·K`
/// floats through memory to save the ragged last tile of each block
/// (`examples/brgemm_best`, 2026-11-29, AMD EPYC Zen 5 class, 2 threads,
/// `FLUSH=1`, interleaved: in place 512→256 1.33-1.36 against 1.65-1.66 ms
/// packed, 1024→512 4.9-5.0 against 5.5-5.6, 1024→1024 9.8-9.9 against
/// 9.8-10.3, 479→1024 in blocks of 160 5.5-5.7 against 6.0-6.2; the AVX2
/// kernel 3-8% faster in place too; a bf16 `x` 10% slower in place at
/// 1024→1024).
fn wgrad_spec(
    (pack_x, per_k): (bool, bool),
    (kb, s, bk, bn): (usize, usize, usize, usize),
    xa: Elt,
    dw_elt: Elt,
) -> GemmSpec {
    let kp = kb * bk;
    // Packed whole: one GEMM per N block over all `Kb·bk` rows of xᵀ (its
    // tiles run across the K blocks: no ragged tile per block), whose
    // `[Kb·bk][bn]` result is exactly dw[nb]. Packed per K block (`per_k`)
    // or in place: one per block dw[nb][kb].
    let (m, a) = match (pack_x, per_k) {
        (true, false) => (kp, Elt::F32),
        (true, true) => (bk, Elt::F32),
        (false, _) => (bk, xa),
    };
    GemmSpec {
        pack_a: pack_x,
        ..GemmSpec::new(m, bn, s, a, dw_elt).a_strides(1, bk)
    }
}

/// `dz = act'(dy, y)` over the `[Nb][S][bn]` blocks of `dy` and `y`, the `B`
/// operand of `brgemm_wgrad`'s GEMMs.
struct DzRows<'v, E> {
    act: Act,
    dy: &'v [E],
    y: &'v [E],
    s: usize,
    bn: usize,
}

impl<E: Elem> DzRows<'_, E> {
    /// Every N block's packed dz (`[Nb][panels][S][nr]`), the panels packed in
    /// parallel, each one's db column sums into its `nr` of `dbp`.
    fn pack_all(&self, (nb, panels, nr): (usize, usize, usize), dbp: &mut [f32]) -> Scratch {
        let mut bp = Scratch::new(nb * panels * self.s * nr);
        bp.par_chunks_mut(self.s * nr)
            .zip(dbp.par_chunks_mut(nr))
            .enumerate()
            .for_each(|(q, (pan, dbq))| self.pack_panel((q, panels, nr), pan, dbq));
        bp
    }

    /// Panel `q` (`S × nr`; `panels` per N block) of the packed dz, its db
    /// columns summed into `dbq`.
    fn pack_panel(&self, (q, panels, nr): (usize, usize, usize), pan: &mut [f32], dbq: &mut [f32]) {
        let (s, bn) = (self.s, self.bn);
        let (nbi, p) = (q / panels, q % panels);
        let j0 = p * nr;
        let cols = nr.min(bn - j0);
        if cols < nr {
            pan.fill(0.0);
        }
        let rows = (
            &self.dy[nbi * s * bn..(nbi + 1) * s * bn],
            &self.y[nbi * s * bn..(nbi + 1) * s * bn],
        );
        match self.act {
            Act::None => pack_dz(rows, pan, &mut dbq[..cols], (bn, j0, nr), |d, _| d.load()),
            Act::Relu => pack_dz(rows, pan, &mut dbq[..cols], (bn, j0, nr), |d, y| {
                act_grad(Act::Relu, d.load(), y.load())
            }),
            Act::Sigmoid => pack_dz(rows, pan, &mut dbq[..cols], (bn, j0, nr), |d, y| {
                act_grad(Act::Sigmoid, d.load(), y.load())
            }),
        }
    }
}

/// `dw` (`[Nb][Kb·bk][bn]`) with `kern` ([`wgrad_spec`]), and the per-panel
/// column sums of dz (`db`, `[Nb][panels·nr]`).
fn wgrad_gemm<E: Elem>(
    kern: GemmKernel,
    dz: &DzRows<'_, E>,
    xa: Operand<'_>,
    (nb, kb, bk): (usize, usize, usize),
    dw_elt: Elt,
) -> Result<(Floats, Vec<f32>), JitError> {
    let (s, bn) = (dz.s, dz.bn);
    let sp = *kern.spec();
    let kp = kb * bk;
    let (mr, nr) = (sp.micro.mr(), sp.micro.nr());
    // B per nb block: dz[nb] (`S × bn`), packed, with db summed on the way.
    let panels = bn.div_ceil(nr);
    let blk_b = panels * s * nr;
    let mut dbp = vec![0.0f32; nb * panels * nr];
    let pack_panel =
        |q: usize, pan: &mut [f32], dbq: &mut [f32]| dz.pack_panel((q, panels, nr), pan, dbq);
    let fresh = Fresh::new(dw_elt, nb * kp * bn);
    if sp.pack_a && sp.m < kp {
        let bp = dz.pack_all((nb, panels, nr), &mut dbp);
        let dw = per_k_block(kern, xa, (&bp, blk_b), fresh, (nb, kb, bk, s))?;
        return Ok((dw, dbp));
    }
    let xt = sp.pack_a.then(|| {
        let mut xt = Scratch::new(kp.div_ceil(mr) * mr * s);
        pack_x_t(&mut xt, xa, (kb, s, bk), mr);
        xt
    });
    let dw = if per_n_block_pays(nb) {
        // One task per N block packs that block's dz into a buffer of its
        // own and runs the GEMMs on it at once, while it is in cache (enough
        // blocks to share out; the packed dz never goes through memory):
        // one GEMM over the packed xᵀ, or one per K block reading x in place.
        match &xt {
            Some(_) => check_cover(&kern, &fresh, (nb, kp, bn))?,
            None => check_cover(&kern, &fresh, (nb * kb, bk, bn))?,
        }
        let pack = |nbi: usize, b: &mut [f32], dbq: &mut [f32]| {
            for (p, (pan, dbp)) in b.chunks_mut(s * nr).zip(dbq.chunks_mut(nr)).enumerate() {
                pack_panel(nbi * panels + p, pan, dbp);
            }
        };
        let gemm = |b: &[f32], cb: OutBuf<'_>| match &xt {
            Some(xt) => kern.run_block(Operand::F32(xt), b, None, cb, kp, None),
            None => cb
                .chunks(bk * bn)
                .into_iter()
                .enumerate()
                .try_for_each(|(kbi, ck)| {
                    kern.run_block(tail(xa, kbi * s * bk), b, None, ck, bk, None)
                }),
        };
        // SAFETY: `check_cover` held: a task's one GEMM (or one per K block
        // of `bk` rows) writes all `Kb·bk` rows of its block.
        unsafe { per_n_block(fresh, blk_b, (&mut dbp, panels * nr), &pack, &gemm)? }
    } else {
        let bp = dz.pack_all((nb, panels, nr), &mut dbp);
        let b_of = |nbi: usize| (&bp[nbi * blk_b..(nbi + 1) * blk_b], None);
        if let Some(xt) = &xt {
            // Row chunks of dw[nb] (whole tiles: chunk r0 starts at tile
            // r0/mr, element r0·S of the packed xᵀ).
            run_blocks(
                kern,
                fresh,
                (nb, kp, bn, row_block(kp, mr, nb)),
                &|_, r0| Operand::F32(&xt[(r0 * s).min(xt.len())..]),
                &b_of,
                (None, None),
            )?
        } else {
            // One task per block dw[nb][kb]: `xb[kb]` read as its transpose.
            run_blocks(
                kern,
                fresh,
                (nb * kb, bk, bn, bk),
                &|blk, _| tail(xa, (blk % kb) * s * bk),
                &|blk| b_of(blk / kb),
                (None, None),
            )?
        }
    };
    Ok((dw, dbp))
}

/// [`wgrad_gemm`]'s `dw` with xᵀ packed one K block at a time (a spec of
/// `bk` packed rows, [`wgrad_spec`]'s `per_k`), on every N block's dz packed
/// first (`bp`, `blk_b` floats a block): one task per K block packs that
/// block of xᵀ (in cache, `bk × S`) and runs it against every N block,
/// writing `dw[..][kb]`. Packing all of xᵀ first wrote it through memory and read it
/// back once per N block.
fn per_k_block(
    kern: GemmKernel,
    xa: Operand<'_>,
    (bp, blk_b): (&[f32], usize),
    mut fresh: Fresh,
    (nb, kb, bk, s): (usize, usize, usize, usize),
) -> Result<Floats, JitError> {
    let sp = *kern.spec();
    let (mr, bn) = (sp.micro.mr(), sp.n);
    check_cover(&kern, &fresh, (nb * kb, bk, bn))?;
    // Block dw[nbi][kbi] is chunk nbi·kb + kbi: task kbi takes every kb-th.
    let mut tasks: Vec<Vec<_>> = (0..kb).map(|_| Vec::new()).collect();
    for (c, ch) in fresh.buf().chunks(bk * bn).into_iter().enumerate() {
        tasks[c % kb].push(ch);
    }
    tasks
        .into_par_iter()
        .with_max_len(1)
        .enumerate()
        .try_for_each(|(kbi, parts)| {
            let mut xk = Scratch::new(bk.div_ceil(mr) * mr * s);
            pack_x_t(&mut xk, tail(xa, kbi * s * bk), (1, s, bk), mr);
            parts.into_iter().enumerate().try_for_each(|(nbi, cb)| {
                let b = &bp[nbi * blk_b..(nbi + 1) * blk_b];
                kern.run_block(Operand::F32(&xk), b, None, cb, bk, None)
            })
        })?;
    // SAFETY: every task returned Ok, and `check_cover` held: task kbi wrote
    // the `bk` rows of every block dw[nb][kbi], and the tasks cover every kbi.
    Ok(unsafe { fresh.assume_init() })
}

/// `brgemm_wgrad`'s results from the GEMMs' `dw` and per-panel `db` sums:
/// exact zeros in `dw`'s padding columns `n >= N` (the interpreter writes 0),
/// `db`'s `n` live columns.
fn finish_wgrad(
    mut dw: Floats,
    dbp: Vec<f32>,
    n: usize,
    (nb, kb, bk, bn): (usize, usize, usize, usize),
    db_elt: Elt,
) -> Vec<Tensor> {
    let live_last = n - (nb - 1) * bn;
    if live_last < bn {
        match &mut dw {
            Floats::F32(v) => v[(nb - 1) * kb * bk * bn..]
                .chunks_mut(bn)
                .for_each(|r| r[live_last..].fill(0.0)),
            Floats::BF16(v) => v[(nb - 1) * kb * bk * bn..]
                .chunks_mut(bn)
                .for_each(|r| r[live_last..].fill(bf16::ZERO)),
        }
    }
    // dbp is [Nb][panels·nr]: column j of block nb at nb·panels·nr + j.
    let panels_nr = dbp.len() / nb;
    let db: Vec<f32> = (0..n).map(|j| dbp[(j / bn) * panels_nr + j % bn]).collect();
    vec![dw.tensor(vec![nb, kb, bk, bn]), db_of(db, db_elt)]
}

/// The bias gradient `db` (f32 sums) stored as `elt`.
fn db_of(db: Vec<f32>, elt: Elt) -> Tensor {
    let n = db.len();
    let db = match elt {
        Elt::F32 => Floats::F32(db),
        Elt::BF16 => Floats::BF16(db.iter().map(|&v| bf16::from_f32(v)).collect()),
    };
    db.tensor(vec![n])
}

/// `brgemm_wgrad` with one-column blocks (`bn = 1`, e.g. a layer with one
/// output): column `nb` of `dw` is `Σ_s dz[nb][s] · x[s]`, a matrix-vector
/// product, computed as a weighted sum of `x`'s rows
/// ([`crate::jit::reduce::weighted_block_sums`]) that reads `x` once — a GEMM tile
/// would use one of its 8 or 32 lanes. Same float operations as the GEMM
/// path: each element summed over the samples in order, one FMA per term;
/// `dz = act'(dy, y)` and `db` (its sum in sample order) as in [`pack_dz`].
fn wgrad_columns(
    jit: &Jit,
    act: Act,
    (dyv, yv): (&[f32], &[f32]),
    xa: Operand<'_>,
    (nb, kb, s, bk): (usize, usize, usize, usize),
    (dw_elt, db_elt): (Elt, Elt),
) -> KResult<Vec<Tensor>> {
    const OP: &str = "brgemm_wgrad";
    // `dy` and `y` hold `nb·s` elements each (`bn = 1`; checked against the
    // node's instance before the kernel ran).
    let mut dw = zeros(dw_elt, nb * kb * bk);
    let mut db = Vec::with_capacity(nb);
    let mut dz = vec![0.0f32; s];
    for (q, mut dwq) in buf(&mut dw).chunks(kb * bk).into_iter().enumerate() {
        let mut sum = 0.0f32;
        for ((z, &d), &y) in dz.iter_mut().zip(&dyv[q * s..]).zip(&yv[q * s..]) {
            *z = act_grad(act, d, y);
            sum += *z;
        }
        db.push(sum);
        crate::jit::reduce::weighted_block_sums(jit, xa, (kb, s, bk), &dz, dwq.reborrow())
            .map_err(|e| jit_err(OP, e))?;
    }
    let dw = Tensor {
        shape: vec![nb, kb, bk, 1],
        data: dw,
    };
    Ok(vec![dw, db_of(db, db_elt)])
}

/// N blocks from which `brgemm_wgrad` packs a bf16 `xᵀ` (fewer read it in
/// place; an f32 one is always read in place, see [`wgrad_spec`]).
const PACK_X_MIN_NB: usize = 4;

/// K blocks per thread from which `brgemm_wgrad` packs a bf16 `xᵀ` one K
/// block per task ([`per_k_block`]) instead of all of it first.
const K_BLOCKS_PER_THREAD: usize = 2;

/// One packed panel of `dz = g(dy, y)` (`S` rows of `nr`, the first `db.len()`
/// columns live, from column `j0` of the `[S][bn]` block `dy`, `y`), adding each
/// row into `db` in sample order. A whole panel of the AVX-512 tile width takes
/// [`pack_dz_rows`] (fixed-length rows: vector moves, the sums in registers);
/// the general loop's row copies compiled to a `memcpy` call per 128-byte row.
fn pack_dz<E: Copy>(
    (dy, y): (&[E], &[E]),
    pan: &mut [f32],
    db: &mut [f32],
    (bn, j0, nr): (usize, usize, usize),
    g: impl Fn(E, E) -> f32,
) {
    if db.len() == nr && nr == 32 {
        pack_dz_rows::<32, E>((dy, y), pan, db, (bn, j0), g);
    } else {
        pack_dz_any((dy, y), pan, db, (bn, j0, nr), g);
    }
}

/// [`pack_dz`] for any panel.
fn pack_dz_any<E: Copy>(
    (dy, y): (&[E], &[E]),
    pan: &mut [f32],
    db: &mut [f32],
    (bn, j0, nr): (usize, usize, usize),
    g: impl Fn(E, E) -> f32,
) {
    let cols = db.len();
    for ((row, d), yy) in pan
        .chunks_exact_mut(nr)
        .zip(dy.chunks_exact(bn))
        .zip(y.chunks_exact(bn))
    {
        for (((o, &d), &yy), acc) in row[..cols]
            .iter_mut()
            .zip(&d[j0..j0 + cols])
            .zip(&yy[j0..j0 + cols])
            .zip(db.iter_mut())
        {
            let z = g(d, yy);
            *o = z;
            *acc += z;
        }
    }
}

/// [`pack_dz`] for a panel of `N` live columns: the same values and the same
/// sums in the same order, on fixed-length rows.
fn pack_dz_rows<const N: usize, E: Copy>(
    (dy, y): (&[E], &[E]),
    pan: &mut [f32],
    db: &mut [f32],
    (bn, j0): (usize, usize),
    g: impl Fn(E, E) -> f32,
) {
    let mut acc = [0.0f32; N];
    acc.copy_from_slice(&db[..N]);
    for ((row, d), yy) in pan
        .as_chunks_mut::<N>()
        .0
        .iter_mut()
        .zip(dy.chunks_exact(bn))
        .zip(y.chunks_exact(bn))
    {
        let (d, yy) = (&d[j0..j0 + N], &yy[j0..j0 + N]);
        for j in 0..N {
            let z = g(d[j], yy[j]);
            row[j] = z;
            acc[j] += z;
        }
    }
    db[..N].copy_from_slice(&acc);
}

/// `xᵀ` of a blocked activation `xb[Kb][S][bk]` (`Kb·bk × S`: row `r` is column
/// `r % bk` of block `r / bk`) into `dst` as tile-major panels `[⌈Kb·bk/mr⌉][S][mr]`
/// (f32, bf16 widened exactly), every element written: rows past `Kb·bk` zero.
///
/// Row `si` of tile `t` is columns `t·mr..(t+1)·mr` of sample `si`'s whole `x`
/// row (its blocks side by side), so this is a copy of short runs, not a
/// transpose. Each task takes [`PACK_X_SAMPLES`] samples: it stages their rows
/// side by side (reading `x` in order), then writes its part of each tile as
/// one contiguous run. (Reading each tile's runs straight from `x` touched
/// every cache line of `x` once per tile and took ~1.6× as long on a cold `x`,
/// 2048×512.)
fn pack_x_t(dst: &mut [f32], x: Operand<'_>, (kb, s, bk): (usize, usize, usize), mr: usize) {
    let kp = kb * bk;
    let tiles = kp.div_ceil(mr);
    // Sample chunks of the tiles, transposed into tasks: task c writes chunk c
    // of every tile.
    let chunk = PACK_X_SAMPLES;
    let mut tasks: Vec<Vec<&mut [f32]>> = (0..s.div_ceil(chunk)).map(|_| Vec::new()).collect();
    for tile in dst.chunks_mut(s * mr).take(tiles) {
        for (c, part) in tile.chunks_mut(chunk * mr).enumerate() {
            tasks[c].push(part);
        }
    }
    tasks
        .into_par_iter()
        .enumerate()
        .for_each(|(c, mut parts)| {
            // The chunk's rows, zero-padded to whole tiles.
            let (s0, s1) = (c * chunk, s.min((c + 1) * chunk));
            let w = tiles * mr;
            let mut rows = Scratch::new((s1 - s0) * w);
            for (si, row) in (s0..s1).zip(rows.chunks_exact_mut(w)) {
                row[kp..].fill(0.0);
                for (q, dst) in row[..kp].chunks_exact_mut(bk).enumerate() {
                    let at = (q * s + si) * bk;
                    match x {
                        Operand::F32(v) => dst.copy_from_slice(&v[at..at + bk]),
                        Operand::BF16(v) => dst
                            .iter_mut()
                            .zip(&v[at..at + bk])
                            .for_each(|(d, e)| *d = e.to_f32()),
                    }
                }
            }
            for (t, part) in parts.iter_mut().enumerate() {
                match mr {
                    12 => copy_runs::<12>(part, &rows, w, t),
                    6 => copy_runs::<6>(part, &rows, w, t),
                    4 => copy_runs::<4>(part, &rows, w, t),
                    _ => {
                        for (d, row) in part.chunks_exact_mut(mr).zip(rows.chunks_exact(w)) {
                            d.copy_from_slice(&row[t * mr..(t + 1) * mr]);
                        }
                    }
                }
            }
        });
}

/// Tile `t`'s rows of a chunk (`part`, `[samples][MR]`) from the staged rows
/// (`w` floats each): a fixed length, so a few vector moves per row rather than
/// a `memcpy` call.
fn copy_runs<const MR: usize>(part: &mut [f32], rows: &[f32], w: usize, t: usize) {
    for (d, row) in part
        .as_chunks_mut::<MR>()
        .0
        .iter_mut()
        .zip(rows.chunks_exact(w))
    {
        *d = row[t * MR..].as_chunks::<MR>().0[0];
    }
}

/// Samples per task of [`pack_x_t`].
const PACK_X_SAMPLES: usize = 64;

#[cfg(test)]
mod tests {
    use super::{pack_dz_any, pack_dz_rows};
    use crate::reference::brgemm::act_grad;
    use dlrm_ir::Act;

    /// The fixed-width panel is bit for bit the general loop's: values (NaN
    /// and -0 among them, every activation) and the `db` sums (started from
    /// nonzero values).
    #[test]
    fn fixed_width_dz_panel_is_the_general_one() {
        let (s, bn) = (37, 96);
        let v = |seed: u32| -> Vec<f32> {
            (0..s * bn)
                .map(
                    |i| match ((i as u32).wrapping_mul(2654435761) ^ seed) % 29 {
                        0 => f32::NAN,
                        1 => -0.0,
                        r => (r as f32 - 14.0) / 7.0,
                    },
                )
                .collect()
        };
        let (dy, y) = (v(1), v(2));
        for act in [Act::None, Act::Relu, Act::Sigmoid] {
            for j0 in [0, 32, 64] {
                let g = |d, yy| act_grad(act, d, yy);
                let (mut p1, mut p2) = (vec![9.0f32; s * 32], vec![9.0f32; s * 32]);
                let (mut d1, mut d2) = (vec![0.5f32; 32], vec![0.5f32; 32]);
                pack_dz_rows::<32, f32>((&dy, &y), &mut p1, &mut d1, (bn, j0), g);
                pack_dz_any((&dy, &y), &mut p2, &mut d2, (bn, j0, 32), g);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&p1), bits(&p2), "{act:?} from column {j0}: panel");
                assert_eq!(bits(&d1), bits(&d2), "{act:?} from column {j0}: db");
            }
        }
    }
}
