//! `brgemm`, `brgemm_dgrad` and `brgemm_wgrad` on the JIT GEMM core
//! ([`super::gemm`]): the blocked MLP layers of the `-O1` plans.
//!
//! The operands are read where they are, in their blocked layouts, wherever the
//! GEMM core can address them: the activations as a batch-reduce over their
//! blocks (`A` block `q` of row `i` at `i·lda + q·a_blk`, [`GemmSpec::kb`]), the
//! weight blocks and `dz` as in-place `B`
//! ([`BLayout::InPlace`](super::gemm::BLayout::InPlace), when the block width is
//! whole tiles of the micro-kernel; bf16 weight blocks
//! [`BLayout::InPlaceBf16`](super::gemm::BLayout::InPlaceBf16) where the
//! micro-kernel widens them as it loads). Only what the layouts cannot
//! express is copied, once per call: `wᵀ` for dgrad (`K·N` elements), `dz` when
//! the activation has a derivative, and the forward's `B` when its block width
//! is ragged, its bf16 elements are not read in place, or the race finds
//! packing faster (`JitOptions::pack_b`). One compiled kernel then runs on disjoint output blocks
//! ([`GemmKernel::run_block`]; how the blocks are shared out is below the table):
//!
//! | op | GEMM per output block | A | B | epilogue |
//! | --- | --- | --- | --- | --- |
//! | `brgemm(xb, wb, b)` | `yb[nb]` rows `r0..`: `S × bn`, `k = Kb·bk` | `xb`, batch-reduce over `Kb` | `wb[nb]` (`Kb·bk × bn`), in place | bias, relu fused; sigmoid after |
//! | `brgemm_dgrad(dyb, (yb,) wb)` | `dx[kb]` rows `r0..`: `S × bk`, `k = Nb·bn` | `dz = act'(dy, y)`, batch-reduce over `Nb` | `wb[·][kb]ᵀ`, packed | none |
//! | `brgemm_wgrad(dyb, (yb,) xb)` | `dw[nb][kb]`: `bk × bn`, `k = S` | `xb[kb]ᵀ`: the transposed view in place (a bf16 `x`: packed once when at least 4 N blocks reuse it) | `dz[nb]`, packed (`act'` applied on the way) | none; `db` summed from `dz` |
//!
//! `brgemm_wgrad` with one-column blocks (`bn = 1`: the DLRM's last layer, one
//! output) is a matrix-vector product per column, computed as a weighted sum of
//! `x`'s rows (`x` read once; a GEMM tile would use one of its 8 or 32 lanes)
//! with the same float operations.
//!
//! `brgemm` and `brgemm_dgrad` run one task per row chunk (`run_row_chunks`),
//! which runs every output block on its rows, so a chunk's `A` stays with one
//! thread. `A` is read in place, or (the second form) the task first packs its
//! rows of `A` once into the micro-kernel's tiles (f32, bf16 widened, dgrad's
//! `act'` applied on the way). Which form runs is timed per shape with the
//! micro-kernel (`Jit::pick_variant`, [`JitOptions::pack_a`]); the AVX-512
//! kernel gains most from packing (`examples/brgemm_best` at 2048×512×512, 2
//! threads: `brgemm` 182 against 170 GFLOP/s when it came in). In place, the
//! threads take the chunks in order from one counter and the last chunks are
//! smaller (`super::sched`), so both threads finish a layer at about the same
//! time. Before (stop 61) that form ran each (row chunk, output block) as a
//! rayon task, both threads reading the same chunk's `A`, and equal chunks
//! left one thread waiting at the end of each layer: on an Intel Xeon model
//! 207 (2 threads, interleaved with the build before) `brgemm_best 2048 512
//! 256` in place went from 1.74-1.85 to 1.71-1.75 ms (f32) and from 2.01-2.09
//! to 1.87-1.97 ms (bf16), and the forward GEMMs of a dlrm-small inference
//! step from 5.22-5.31 to 4.83-4.94 ms. The packed form keeps equal chunks
//! as rayon tasks: the counter and the smaller last chunks were 1-10% slower
//! there (each chunk streams all of `B` for its rows).
//! `brgemm_wgrad` keeps rayon tasks of one output block each (`run_blocks`).
//!
//! A bf16 `A` read in place (a `--precision bf16` plan's activations, and
//! `dz` in its backward) has a third form, timed beside the two: each task
//! first widens its rows of every block into an f32 copy laid out as the
//! blocked activation (`[Kb][rows][bk]`, a straight conversion, no
//! transpose), which the f32 in-place loops then read
//! ([`GemmSpec::widened`], [`JitOptions::widen_a`]). Read in place, a bf16
//! `A` is widened per tile and per output block by the micro-kernel (into
//! its stack), so `Nb` times over. On an Intel Xeon model 207 (2 threads,
//! interleaved, `brgemm_best 2048 512 256` bf16 in place, the FMA kernel):
//! 1.83-1.84 ms widened against 1.94-1.97 ms per tile; dlrm-small's bf16
//! inference, whose picks then take it for one or two of the four shapes,
//! forward GEMMs 4.89-5.06 against 4.92-5.63 ms a step (6 pairs).
//!
//! `brgemm_dgrad` with a `mask` (the previous layer's `act'`, see
//! [`dlrm_ir::Op::BrgemmDgrad`]) applies relu's in the micro-kernel's
//! epilogue where the kernel can ([`GemmSpec::mask`]: the AVX-512 family,
//! the layer input of the result's element type, its tile prefetched as the
//! tile starts); otherwise, and for sigmoid's, to each chunk of `dx` right
//! after the chunk's GEMM, while it is in cache (the epilogue hook of both
//! forms), reading the layer input's rows of that chunk.
//!
//! Results are not zeroed first (`Fresh`): the kernels write every element.
//!
//! bf16 gradients (a bf16 plan's backward): `brgemm_dgrad` with bf16 `dy` and
//! weights takes `dz` as a bf16 `A` in place and packs `wᵀ` from the bf16
//! weights (in k pairs for the k-pair kernels, AMX-BF16 or AVX-512 BF16);
//! `brgemm_wgrad` with bf16 `dy` and `x` copies `xᵀ` as bf16 rows and packs `dz`
//! in sample pairs (`wgrad_bf16.rs`, where a k-pair kernel runs). Both only for `act` none or
//! relu, whose `dz` is exact in bf16; with sigmoid, `dz` is f32 (FMA kernels).
//!
//! Arithmetic: every output element is one accumulator summed over its reduction
//! index ascending (the interpreter's order) with one FMA per term, then the
//! epilogue (on the k-pair kernels, AMX-BF16 or AVX-512 BF16, which `brgemm`
//! with bf16 `x` and weights runs under `auto` where the CPU has them, exact
//! products summed in the instruction's order); so the results differ from the reference kernels
//! ([`crate::reference::brgemm`]) by float reassociation of the multiply-adds only
//! (the bias gradient and `act'` are computed exactly as there). Padding outputs
//! are exactly 0. Operands may be f32 or bf16 (widened exactly); results are
//! stored in their declared dtype (bf16 rounded to nearest even: `brgemm`'s,
//! `brgemm_dgrad`'s after its mask), `brgemm_wgrad`'s are f32. The micro-kernel
//! is chosen per shape by `Jit::pick_variant` under [`JitOptions::kernels`].

use super::buffers::{Floats, Fresh, Scratch};
use super::gemm::{Elt, GemmKernel, GemmSpec, Operand, OutBuf, pack_b_into};
use super::gemm_spec::ROW_CHUNK_MAX_TILES;
use super::linear::{elt_of, operand};
use super::micro::BPacking;
use super::micro::avx512bf16::pack_b_pairs_into;
use super::sched::{guided_chunks, run_dynamic};
use super::{Jit, JitError, JitOptions};
use crate::reference::{KResult, KernelError};
use dlrm_ir::{Checked, Data, Tensor, TensorType};
use rayon::prelude::*;

/// Evaluates `brgemm`, `brgemm_dgrad` or `brgemm_wgrad`; `None` for other ops or
/// non-float operands or results.
pub fn eval(
    jit: &Jit,
    opts: &JitOptions,
    c: &Checked<'_>,
    out_types: &[TensorType],
) -> Option<KResult<Vec<Tensor>>> {
    use dlrm_ir::Op;
    let op = c.op();
    if c.inputs().iter().any(|t| operand(t).is_none()) {
        return None;
    }
    let out = elt_of(out_types.first()?.dtype)?;
    if out_types.iter().any(|t| elt_of(t.dtype).is_none()) {
        return None;
    }
    Some(match op {
        Op::Brgemm { act } => brgemm(jit, opts, *act, c, out, None).map(|t| vec![t]),
        Op::BrgemmDgrad { act, mask, .. } => {
            brgemm_dgrad(jit, opts, (*act, *mask), c, out, None).map(|t| vec![t])
        }
        Op::BrgemmWgrad { act, n } => brgemm_wgrad(jit, opts, *act, *n, c, out_types),
        _ => return None,
    })
}

/// Whether a bf16 `y` is `> 0` (relu's derivative is 1 there): its bits are
/// those of a positive finite number or `+inf` (not ±0, negative or NaN), so
/// a bf16 activation's mask needs no widening.
#[inline]
fn positive(y: half::bf16) -> bool {
    (1..=0x7F80).contains(&y.to_bits())
}

/// `z = keep(y) ? d : 0`, element by element: relu's derivative applied to a
/// bf16 `dy` (`keep` is [`positive`] for a bf16 `y`, `y > 0.0` for an f32 one).
/// The one formulation of the mask on the bf16 gradient paths; the lengths are
/// the caller's (the shortest slice's elements are written).
#[inline]
fn mask_into<T: Copy>(z: &mut [half::bf16], d: &[half::bf16], y: &[T], keep: impl Fn(T) -> bool) {
    for ((z, &d), &y) in z.iter_mut().zip(d).zip(y) {
        *z = if keep(y) { d } else { half::bf16::ZERO };
    }
}

/// [`mask_into`] in place: `z = keep(y) ? z : 0`.
#[inline]
fn mask_into_self<T: Copy>(z: &mut [half::bf16], y: &[T], keep: impl Fn(T) -> bool) {
    // A select, not a branch (see `mask_in_place`).
    for (z, &y) in z.iter_mut().zip(y) {
        *z = if keep(y) { *z } else { half::bf16::ZERO };
    }
}

/// bf16 values in a pooled buffer (two a word): no fresh pages to fault in and
/// zero on every call.
struct PooledBf16 {
    buf: Scratch,
    n: usize,
}

impl PooledBf16 {
    fn values(&self) -> &[half::bf16] {
        &bytemuck::cast_slice(&self.buf[..])[..self.n]
    }
}

/// [`mask_into`] over the whole of `d` into a [`PooledBf16`], in parallel
/// chunks; `None` if `y`'s length differs from `d`'s.
fn masked<T: Copy + Sync>(
    d: &[half::bf16],
    y: &[T],
    keep: impl Fn(T) -> bool + Sync,
) -> Option<PooledBf16> {
    let n = d.len();
    if y.len() != n {
        return None;
    }
    let mut buf = Scratch::new(n.div_ceil(2));
    let z: &mut [half::bf16] = &mut bytemuck::cast_slice_mut(&mut buf[..])[..n];
    const CHUNK: usize = 1 << 14;
    z.par_chunks_mut(CHUNK)
        .zip(d.par_chunks(CHUNK).zip(y.par_chunks(CHUNK)))
        .for_each(|(z, (d, y))| mask_into(z, d, y, &keep));
    Some(PooledBf16 { buf, n })
}

fn jit_err(op: &'static str, e: JitError) -> KernelError {
    KernelError::Jit {
        op,
        reason: e.to_string(),
    }
}

/// Checks that `kern` writes whole rows of `width` elements and that `out` is
/// `blocks` blocks of `m` such rows: then running it on every row chunk of every
/// block writes every element of `out`.
fn check_cover(
    kern: &GemmKernel,
    out: &Fresh,
    (blocks, m, width): (usize, usize, usize),
) -> Result<(), JitError> {
    let sp = kern.spec();
    if sp.n != width || sp.ldc != width || out.len() != blocks * m * width || m > sp.m {
        return Err(JitError::Args {
            kernel: format!("{sp:?}"),
            reason: format!(
                "a result of {} elements is not {blocks} blocks of {m} rows of {width}",
                out.len()
            ),
        });
    }
    Ok(())
}

/// Packs N block `nbi`'s `dz` into a task's buffer and its `db` sums into
/// that block's share of them: `(nbi, buffer, db)`.
type PackDz<'p> = dyn Fn(usize, &mut [f32], &mut [f32]) + Sync + 'p;

/// Writes an N block's result chunk from its packed `dz`: `(dz, chunk)`.
type BlockGemm<'g> = dyn Fn(&[f32], OutBuf<'_>) -> Result<(), JitError> + Sync + 'g;

/// N blocks per thread from which `brgemm_wgrad` packs each block's `dz`
/// inside that block's GEMM task ([`per_n_block`]) instead of all blocks
/// first (with f32 `x`, `examples/brgemm_best` `FLUSH=1`, 3 interleaved
/// pairs, Intel Xeon model 207, 2026-11-30: 1024→1024 14.8-15.1 to 14.6-14.8
/// ms, 1024→512 7.4-7.6 to 7.3-7.4, 512→256 1.98-2.05 to 1.93-1.98; bf16 on
/// the k-pair kernels: [`wgrad_bf16`]).
const FUSED_DZ_BLOCKS_PER_THREAD: usize = 2;

/// True if [`per_n_block`] has enough of the `nb` N blocks to share out.
fn per_n_block_pays(nb: usize) -> bool {
    nb >= FUSED_DZ_BLOCKS_PER_THREAD * rayon::current_num_threads().max(1)
}

/// `brgemm_wgrad`'s `dw` with one task per N block: the block's `dz` packed
/// into a buffer of its own (`blk_b` floats, `pack`, its `db` into its
/// `db_len` of `dbp`), then at once its GEMMs on it (`gemm`, on the block's
/// chunk of `fresh`), while the packed `dz` is in cache: it never goes through
/// memory, as it does when every block is packed first and read back per row
/// chunk. `fresh` holds `dbp.len() / db_len` blocks.
///
/// # Safety
/// `gemm` returning `Ok` has written every element of its chunk.
unsafe fn per_n_block(
    mut fresh: Fresh,
    blk_b: usize,
    (dbp, db_len): (&mut [f32], usize),
    pack: &PackDz<'_>,
    gemm: &BlockGemm<'_>,
) -> Result<Floats, JitError> {
    let nb = dbp.len() / db_len.max(1);
    let blk = fresh.len() / nb.max(1);
    let tasks: Vec<_> = fresh
        .buf()
        .chunks(blk)
        .into_iter()
        .zip(dbp.chunks_mut(db_len))
        .enumerate()
        .collect();
    tasks
        .into_par_iter()
        .with_max_len(1)
        .try_for_each(|(nbi, (cb, db))| {
            let mut b = Scratch::new(blk_b);
            pack(nbi, &mut b, db);
            gemm(&b, cb)
        })?;
    // SAFETY: every task returned Ok, so each wrote its whole chunk (the
    // caller's contract), and the chunks cover `fresh`.
    Ok(unsafe { fresh.assume_init() })
}

/// Row blocks of `m` rows for `tasks_per_row_block` output blocks: whole tiles,
/// about four tasks per thread overall, at least one tile, at most `mc_rows`.
fn row_block(m: usize, mr: usize, blocks: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let want_row_blocks = (4 * threads).div_ceil(blocks.max(1)).max(1);
    let rb = m.div_ceil(want_row_blocks).div_ceil(mr) * mr;
    rb.clamp(mr, ROW_CHUNK_MAX_TILES * mr.max(1))
        .min(m.div_ceil(mr) * mr)
        .max(mr)
}

/// Picks the kernel for `base` ([`Jit::pick_variant`]: the micro-kernel and,
/// when `packable`, whether `A` is packed per row chunk; `bf16_b`: `B` is bf16
/// in memory) and runs `go` with it.
fn with_kernel<T>(
    jit: &Jit,
    opts: &JitOptions,
    op: &'static str,
    (base, packable, bf16_b): (GemmSpec, bool, bool),
    go: &mut dyn FnMut(GemmKernel) -> Result<T, JitError>,
) -> KResult<T> {
    let spec = {
        let mut trial = |k: GemmKernel| go(k).map(|_| ());
        jit.pick_variant(base, opts, (packable, bf16_b), &mut trial)
            .map_err(|e| jit_err(op, e))?
    };
    let k = jit.gemm(spec).map_err(|e| jit_err(op, e))?;
    go(k).map_err(|e| jit_err(op, e))
}

/// Where a row chunk's `A` comes from in [`run_row_chunks`].
pub(crate) enum RowsA<'p, 'd> {
    /// Packed per chunk (a spec with [`GemmSpec::pack_a`]): `pack(r0, rows,
    /// dst)` must write all of `dst`, `⌈rows/mr⌉` tiles `[k][mr]`, rows past
    /// `rows` zero.
    Packed(&'p (dyn Fn(usize, usize, &mut [f32]) + Sync)),
    /// Read in place: output block `q`'s `A` from row `r0` is `a_of(q, r0)`.
    InPlace(&'p (dyn Fn(usize, usize) -> Operand<'d> + Sync)),
    /// A bf16 blocked `A` (`[k / kb][m][kb]`, blocks `src_blk` elements
    /// apart) that every output block reads, widened once per chunk into
    /// f32 for a spec of [`GemmSpec::widened`] (its `a_blk` apart).
    Widened { a: &'d [half::bf16], src_blk: usize },
}

/// `rows` rows of every block of the bf16 blocked `A` from row `r0`
/// ([`RowsA::Widened`]) widened (exactly) into this worker's scratch for the
/// kernel of spec `sp`: `lda = kb`, blocks `sp.a_blk` apart, or one block.
fn widened_rows(
    sp: &GemmSpec,
    (a, src_blk): (&[half::bf16], usize),
    (r0, rows): (usize, usize),
) -> Result<Scratch, JitError> {
    let lda = sp.lda.max(1);
    let blocks = sp.k.div_ceil(sp.kb.clamp(1, sp.k.max(1)));
    let len = rows * lda;
    let dst_blk = if blocks > 1 { sp.a_blk } else { 0 };
    if blocks > 1 && dst_blk < len {
        return Err(JitError::Codegen(format!(
            "internal: a widened chunk of {rows} rows in blocks of {dst_blk} elements"
        )));
    }
    let mut dst = Scratch::new((blocks - 1) * dst_blk + len);
    for q in 0..blocks {
        let from = q * src_blk + r0 * lda;
        let (Some(src), Some(to)) = (
            a.get(from..from + len),
            dst.get_mut(q * dst_blk..q * dst_blk + len),
        ) else {
            return Err(JitError::Codegen(format!(
                "internal: block {q} of a widened A outside its operand"
            )));
        };
        crate::reference::convert::widen(src, to);
    }
    Ok(dst)
}

/// [`RowsA::Widened`] for a kernel whose spec reads an f32 `A`
/// ([`GemmSpec::widened`]) where the operand `a` is bf16 (blocks `src_blk`
/// elements apart), else `a` read in place through `in_place`.
fn rows_a<'p, 'd>(
    a: Operand<'d>,
    sp: &GemmSpec,
    src_blk: usize,
    in_place: &'p (dyn Fn(usize, usize) -> Operand<'d> + Sync),
) -> RowsA<'p, 'd> {
    match (a, sp.a) {
        (Operand::BF16(a), Elt::F32) => RowsA::Widened { a, src_blk },
        _ => RowsA::InPlace(in_place),
    }
}

/// Runs `kern` on row chunks of about `rb` rows, one task each (in place:
/// taken in order from one counter, [`run_dynamic`], the chunks
/// [`guided_chunks`]'; packed: equal chunks, [`balanced_chunks`], as rayon
/// tasks):
/// `out` holds `blocks` blocks of `m` rows × `width` (row stride `width`);
/// the task for rows `r0..r0+rows` runs every output block `q` on them,
/// reading `B` and the bias from `b_of(q)`, `A` from `a` — packed once per
/// chunk however many blocks reuse it, or in place. A chunk's rows stay
/// with one thread: output blocks of one chunk on both threads (the
/// blocks as tasks) read its `A` into both cores' caches. Only with fewer
/// chunks than two a thread (serving batches) is each chunk's run of blocks
/// cut into groups, a task each ([`block_groups`]). `epi` runs on each
/// chunk once written.
#[allow(clippy::type_complexity)]
fn run_row_chunks<'d>(
    kern: GemmKernel,
    mut out: Fresh,
    (blocks, m, width, rb): (usize, usize, usize, usize),
    a: RowsA<'_, 'd>,
    b_of: &(dyn Fn(usize) -> (Operand<'d>, Option<&'d [f32]>) + Sync),
    (epi, mask): (Option<Epilogue<'_>>, Option<Operand<'d>>),
) -> Result<Floats, JitError> {
    check_cover(&kern, &out, (blocks, m, width))?;
    let (mr, k) = (kern.spec().micro.mr(), kern.spec().k);
    // Packed: equal chunks as rayon tasks (see the module docs).
    let chunks = match &a {
        RowsA::Packed(_) => balanced_chunks(m, mr, m.div_ceil(rb.max(1))),
        RowsA::InPlace(_) | RowsA::Widened { .. } => guided_chunks(m, mr, rb, ROW_CHUNK_MIN_TILES),
    };
    let lens: Vec<usize> = chunks.iter().map(|&(_, rows)| rows * width).collect();
    let mut parts: Vec<Vec<OutBuf<'_>>> = chunks.iter().map(|_| Vec::new()).collect();
    for blk in out.buf().chunks(m * width) {
        for (task, part) in parts.iter_mut().zip(blk.split_lens(&lens)) {
            task.push(part);
        }
    }
    let groups = block_groups(chunks.len(), blocks);
    let mut tasks = Vec::with_capacity(chunks.len() * groups);
    for (chunk_parts, chunk) in parts.into_iter().zip(chunks) {
        let mut q0 = 0;
        let mut rest = chunk_parts.into_iter();
        for g in 0..groups {
            let n = (g + 1) * blocks / groups - g * blocks / groups;
            tasks.push((q0, rest.by_ref().take(n).collect::<Vec<_>>(), chunk));
            q0 += n;
        }
    }
    let task = |(q0, parts, (r0, rows)): (usize, Vec<OutBuf<'_>>, (usize, usize))| {
        // This worker's reusable buffer: packing allocates nothing.
        let packed = match &a {
            RowsA::Packed(pack) => {
                let mut buf = Scratch::new(rows.div_ceil(mr) * mr * k);
                pack(r0, rows, &mut buf);
                Some(buf)
            }
            RowsA::Widened { a, src_blk } => {
                Some(widened_rows(kern.spec(), (a, *src_blk), (r0, rows))?)
            }
            RowsA::InPlace(_) => None,
        };
        for (q, mut cb) in (q0..).zip(parts) {
            let xa = match (&a, &packed) {
                (RowsA::InPlace(a_of), _) => a_of(q, r0),
                (_, Some(buf)) => Operand::F32(buf),
                (_, None) => {
                    return Err(JitError::Codegen("internal: a row chunk not packed".into()));
                }
            };
            let (b, bias) = b_of(q);
            let mk = mask.map(|mk| tail(mk, (q * m + r0) * width));
            kern.run_block_b(xa, b, bias, cb.reborrow(), rows, mk)?;
            run_epilogue(epi, &kern, q, r0, cb)?;
        }
        Ok(())
    };
    match a {
        RowsA::Packed(_) => tasks.into_par_iter().with_max_len(1).try_for_each(task)?,
        RowsA::InPlace(_) | RowsA::Widened { .. } => run_dynamic(tasks, &task)?,
    }
    // SAFETY: every task returned Ok, and `check_cover` held: each wrote its
    // `rows` whole rows of every block, and the chunks cover `0..m`.
    Ok(unsafe { out.assume_init() })
}

/// Into how many groups of output blocks [`run_row_chunks`] cuts each of its
/// `chunks` row chunks (a task each): one while there are at least two
/// chunks a thread, else as many as give that many tasks (at most
/// `blocks`). At serving batches a layer has a chunk or two a thread
/// (batch 64: 6 tiles of 12 rows, two chunks of 3 tiles, the second with
/// a 4-row tile), and a thread with a short chunk waited for the other;
/// with the blocks in groups each thread also reads only its groups'
/// weights. A chunk whose `A` is packed or widened is then converted once
/// per group (a chunk's rows, small beside its groups' weights at these
/// batches). `dlrm-run --bench`, Intel Xeon model 207, 2 threads, 4
/// interleaved pairs, samples/s: dlrm-mlperf inference at batch 64
/// 42.9-44.6k to 51.0-51.9k, dlrm-small at 128 261-296k to 301-311k,
/// dlrm-small training at 64 65-70k to 72-76k; dlrm-small inference at 64
/// level (270-289k against 268-283k).
fn block_groups(chunks: usize, blocks: usize) -> usize {
    let want = 2 * rayon::current_num_threads().max(1);
    if chunks >= want {
        1
    } else {
        want.div_ceil(chunks.max(1)).clamp(1, blocks.max(1))
    }
}

/// Least tiles in a row chunk of [`guided_chunks`]' tail.
const ROW_CHUNK_MIN_TILES: usize = 4;

/// `0..m` cut into `n` chunks `(r0, rows)` on tile bounds (`mr` rows), their
/// tile counts within one of each other (at most one chunk a tile, at least
/// one chunk): with uniform chunks the last one's shortfall left a thread idle
/// (2048 rows in 8 chunks of 22 tiles: 88 tiles on one of 2 threads, against
/// 85.5 shared evenly).
fn balanced_chunks(m: usize, mr: usize, n: usize) -> Vec<(usize, usize)> {
    let mr = mr.max(1);
    let tiles = m.div_ceil(mr);
    if tiles == 0 {
        return Vec::new();
    }
    let n = n.clamp(1, tiles);
    (0..n)
        .map(|i| {
            let (t0, t1) = (i * tiles / n, (i + 1) * tiles / n);
            let r0 = (t0 * mr).min(m);
            (r0, (t1 * mr).min(m) - r0)
        })
        .collect()
}

/// Runs `kern` on every row chunk of every output block, one rayon task each
/// (`brgemm_wgrad`'s blocks of `dw`, whose `A` rows, `xᵀ` over the whole
/// batch, are too long to keep a chunk's with one thread; the forward and
/// dgrad take [`run_row_chunks`]):
/// `out` holds `blocks` blocks of `m` rows × `width` (row stride `width`), cut
/// into chunks of `rb` rows; the chunk of block `q` from row `r0` reads `A` from
/// `a_of(q, r0)` and `B` and the bias from `b_of(q)`. Chunks are ordered row
/// chunk outer, block inner, so neighbouring tasks share `A` rows. `epi`
/// runs on each chunk once written.
#[allow(clippy::type_complexity)]
fn run_blocks<'d>(
    kern: GemmKernel,
    mut out: Fresh,
    (blocks, m, width, rb): (usize, usize, usize, usize),
    a_of: &(dyn Fn(usize, usize) -> Operand<'d> + Sync),
    b_of: &(dyn Fn(usize) -> (&'d [f32], Option<&'d [f32]>) + Sync),
    (epi, mask): (Option<Epilogue<'_>>, Option<Operand<'d>>),
) -> Result<Floats, JitError> {
    check_cover(&kern, &out, (blocks, m, width))?;
    let rb = rb.max(1);
    let mut tasks: Vec<(usize, usize, OutBuf<'_>)> = Vec::with_capacity(blocks * m.div_ceil(rb));
    for (q, blk) in out.buf().chunks(m * width).into_iter().enumerate() {
        for (ri, ch) in blk.chunks(rb * width).into_iter().enumerate() {
            tasks.push((q, ri, ch));
        }
    }
    tasks.sort_by_key(|&(q, ri, _)| (ri, q));
    tasks
        .into_par_iter()
        .with_max_len(1)
        .try_for_each(|(q, ri, mut cb)| {
            let r0 = ri * rb;
            let (b, bias) = b_of(q);
            let mk = mask.map(|mk| tail(mk, (q * m + r0) * width));
            kern.run_block(a_of(q, r0), b, bias, cb.reborrow(), rb.min(m - r0), mk)?;
            run_epilogue(epi, &kern, q, r0, cb)
        })?;
    // SAFETY: every task returned Ok, and `check_cover` held: each wrote its
    // whole rows, and the tasks' row chunks cover every block.
    Ok(unsafe { out.assume_init() })
}

/// A chunk of a GEMM result as written, in its element type.
pub(crate) enum Written<'a> {
    F32(&'a mut [f32]),
    BF16(&'a mut [half::bf16]),
}

impl Written<'_> {
    pub(crate) fn len(&self) -> usize {
        match self {
            Written::F32(v) => v.len(),
            Written::BF16(v) => v.len(),
        }
    }
}

/// Work on a chunk of a GEMM result while it is in cache: `(block q, first row
/// r0, the chunk's rows as written)`.
pub(crate) type Epilogue<'e> = &'e (dyn Fn(usize, usize, Written<'_>) + Sync);

/// Runs `epi` (if any) on the chunk `cb` of block `q` from row `r0`, which
/// `kern.run_block` has just written whole.
fn run_epilogue(
    epi: Option<Epilogue<'_>>,
    _kern: &GemmKernel,
    q: usize,
    r0: usize,
    mut cb: OutBuf<'_>,
) -> Result<(), JitError> {
    if let Some(epi) = epi {
        // SAFETY: the caller ran the kernel on this chunk, which wrote all of
        // it (`check_cover`: whole rows of the chunk's width).
        epi(q, r0, unsafe { cb.written() });
    }
    Ok(())
}

/// `v[from..]` of an operand (empty past the end).
fn tail(a: Operand<'_>, from: usize) -> Operand<'_> {
    match a {
        Operand::F32(v) => Operand::F32(&v[from.min(v.len())..]),
        Operand::BF16(v) => Operand::BF16(&v[from.min(v.len())..]),
    }
}

/// `nb` blocks of `k × bn` (`B` of the forward op: the blocked weights
/// `[Nb][kp][bn]`, `kp = Kb·bk >= k`: the first `k` rows of each) packed for
/// the kernel of spec `sp` (`k`, `n = bn`): into `⌈bn/nr⌉` zero-padded panels
/// each, of f32, or of k pairs for the k-pair kernels (bf16 weights).
fn pack_w_blocks(w: &Tensor, (nb, kp): (usize, usize), sp: &GemmSpec) -> Scratch {
    let (k, bn, nr) = (sp.k, sp.n, sp.micro.nr());
    let blk = sp.packed_b_len();
    let mut bp = Scratch::new(nb * blk);
    bp.par_chunks_mut(blk).enumerate().for_each(|(q, dst)| {
        let src = q * kp * bn;
        let geom = (k, bn, bn, 1);
        match &w.data {
            Data::BF16(v) if sp.micro.b_packing() == BPacking::KPairs => {
                pack_b_pairs_into(dst, &v[src..src + k * bn], geom, nr)
            }
            Data::F32(v) => pack_b_into(dst, &v[src..src + k * bn], geom, nr),
            Data::BF16(v) => pack_b_into(dst, &v[src..src + k * bn], geom, nr),
            // Not reached: the op takes float weights only.
            _ => dst.fill(0.0),
        }
    });
    bp
}

mod dgrad;
mod forward;
mod wgrad;
mod wgrad_bf16;
pub(crate) use dgrad::brgemm_dgrad;
pub(crate) use forward::brgemm;
pub use wgrad::brgemm_wgrad;

#[cfg(test)]
mod tests {
    use super::{balanced_chunks, block_groups, masked, positive};
    use half::bf16;

    /// Two row chunks a thread or more: one group; fewer: groups enough for
    /// that many tasks, never more than the blocks.
    #[test]
    fn output_blocks_are_grouped_only_below_two_chunks_a_thread() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build();
        pool.expect("a pool").install(|| {
            assert_eq!(block_groups(4, 16), 1);
            assert_eq!(block_groups(9, 2), 1);
            assert_eq!(block_groups(3, 16), 2);
            assert_eq!(block_groups(2, 4), 2);
            assert_eq!(block_groups(1, 16), 4);
            assert_eq!(block_groups(1, 3), 3);
            assert_eq!(block_groups(1, 1), 1);
        });
    }

    #[test]
    fn balanced_chunks_cover_the_rows_on_tile_bounds_within_a_tile_of_each_other() {
        for m in [0, 1, 11, 12, 13, 200, 2048, 2051] {
            for mr in [1, 6, 12] {
                for n in [0, 1, 2, 3, 8, 300] {
                    let c = balanced_chunks(m, mr, n);
                    let tiles = m.div_ceil(mr);
                    assert_eq!(
                        c.len(),
                        n.clamp(1, tiles.max(1)) * usize::from(m > 0),
                        "{m} {mr} {n}"
                    );
                    let mut next = 0;
                    for &(r0, rows) in &c {
                        assert_eq!(r0, next, "contiguous: {m} {mr} {n} {c:?}");
                        assert!(rows > 0 && r0 % mr == 0, "{m} {mr} {n} {c:?}");
                        next = r0 + rows;
                    }
                    assert_eq!(next, m, "the chunks cover 0..{m}");
                    let t: Vec<usize> = c.iter().map(|&(_, rows)| rows.div_ceil(mr)).collect();
                    let (lo, hi) = (t.iter().min(), t.iter().max());
                    if let (Some(lo), Some(hi)) = (lo, hi) {
                        assert!(hi - lo <= 1, "{m} {mr} {n}: tiles {t:?}");
                    }
                }
            }
        }
        // 2048 rows of 12-row tiles in 8 chunks: 171 tiles as 21 or 22 each.
        let t: Vec<usize> = balanced_chunks(2048, 12, 8)
            .iter()
            .map(|c| c.1.div_ceil(12))
            .collect();
        assert_eq!(t, [21, 21, 22, 21, 21, 22, 21, 22]);
    }

    #[test]
    fn masked_keeps_dy_where_y_is_positive_and_zero_elsewhere() {
        // More than one parallel chunk and a ragged last one; every bf16 bit
        // pattern of `y` (±0, subnormals, ±inf, NaN) in turn.
        let n = (1 << 14) * 3 + 7;
        let d: Vec<bf16> = (0..n)
            .map(|i| bf16::from_bits((i as u16).wrapping_mul(40503) | 1))
            .collect();
        let y16: Vec<bf16> = (0..n).map(|i| bf16::from_bits(i as u16)).collect();
        let y32: Vec<f32> = y16.iter().map(|y| y.to_f32()).collect();
        let z16 = masked(&d, &y16, positive).expect("equal lengths");
        let z32 = masked(&d, &y32, |y: f32| y > 0.0).expect("equal lengths");
        for (i, (&dv, &y)) in d.iter().zip(&y32).enumerate() {
            let want = if y > 0.0 { dv } else { bf16::ZERO };
            assert_eq!(
                z16.values()[i].to_bits(),
                want.to_bits(),
                "bf16 y, element {i}"
            );
            assert_eq!(
                z32.values()[i].to_bits(),
                want.to_bits(),
                "f32 y, element {i}"
            );
        }
        assert_eq!(z16.values().len(), n);
        assert!(
            masked(&d, &y16[1..], positive).is_none(),
            "a length mismatch"
        );
    }
}
