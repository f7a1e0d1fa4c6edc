//! Parameter initialisation, exactly as the reference DLRM, deterministic, parallel
//! and *seekable*: any element range of a parameter can be generated alone, with
//! the values the whole-tensor fill gives it. This is what lets a plan describe a
//! table instead of storing it ([`Described`], recorded in the plan's manifest) and
//! every rank create only the rows it owns.
//!
//! Distributions (`dlrm_s_pytorch.py`):
//! - linear weight `[out, in]`: `N(0, std = sqrt(2 / (in + out)))`;
//! - linear bias `[out]`: `N(0, std = sqrt(1 / out))`;
//! - embedding table `[rows, dim]`: `U(-sqrt(1 / rows), sqrt(1 / rows))`;
//! - an optimizer's accumulator: a constant.
//!
//! Random streams: a master ChaCha8 generator is keyed from the model's seed
//! (`seed_from_u64`). Parameter number `p` (its index in the model's parameter list)
//! is cut into chunks of [`CHUNK`] elements; chunk `c` gets its own 256-bit ChaCha8
//! key, the 8 words at word position `8c` of the master's stream `p`, and draws its
//! values from a ChaCha8 generator with that key, in element order. Chunk keys are
//! distinct words of one keystream, so the values are a pure function of
//! (seed, parameter index, element index): independent of the thread count and
//! scheduling, of the other parameters' shapes, and of which range is generated
//! ([`fill_range`]). Chunks are filled in parallel with rayon.
//!
//! Uniform values use the top 24 bits of one 32-bit word each:
//! `(k - 2^23) · bound / 2^23` with `k` in `0 .. 2^24`, so they lie in
//! `[-bound, bound)` exactly; a range starting inside a chunk seeks the chunk's
//! generator to its word (one word per value). Whole chunks come from whole ChaCha
//! blocks (the block function is the fast, SIMD path). Normal values are
//! rand_distr's ziggurat `StandardNormal` in f64, scaled, then rounded to f32 (as the
//! reference's numpy f64 draws are cast to f32); a ziggurat draw takes a variable
//! number of words, so a range starting inside a chunk draws the chunk from its
//! start and drops the values before the range (linear layers are small).
//!
//! Memory: [`try_alloc`] allocates fallibly ([`try_reserve`]), so a parameter too
//! large for this process is an error naming it and the bytes, never an abort.

use crate::error::{IrError, Result};
use crate::tensor::{Data, Tensor};
use crate::types::DType;
use half::bf16;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::rand_core::block::BlockRngCore;
use rand_chacha::{ChaCha8Core, ChaCha8Rng};
use rand_distr::StandardNormal;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Elements per independently seeded chunk.
pub const CHUNK: usize = 1 << 16;

/// How one parameter is initialised.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Init {
    /// Uniform in `[-bound, bound)`.
    Uniform {
        /// Half-width.
        bound: f32,
    },
    /// Normal with mean 0.
    Normal {
        /// Standard deviation.
        std: f64,
    },
    /// Every element `value` (an optimizer's accumulator); draws nothing.
    Constant {
        /// The value.
        value: f32,
    },
}

impl Init {
    /// The reference's initialisation of an embedding table with `rows` rows.
    pub fn embedding(rows: usize) -> Init {
        Init::Uniform {
            bound: (1.0 / rows as f64).sqrt() as f32,
        }
    }

    /// The reference's initialisation of a linear weight `[fan_out, fan_in]`.
    pub fn linear_weight(fan_in: usize, fan_out: usize) -> Init {
        Init::Normal {
            std: (2.0 / (fan_in + fan_out) as f64).sqrt(),
        }
    }

    /// The reference's initialisation of a linear bias `[fan_out]`.
    pub fn linear_bias(fan_out: usize) -> Init {
        Init::Normal {
            std: (1.0 / fan_out as f64).sqrt(),
        }
    }
}

/// Fills every buffer: `bufs[p]` is parameter `p` with its initialisation (the
/// whole-tensor fill; equal to [`fill_range`] of every parameter from element 0).
pub fn fill(seed: u64, bufs: &mut [(Init, &mut [f32])]) {
    let master = ChaCha8Rng::seed_from_u64(seed);
    let mut tasks: Vec<(u64, u64, Init, &mut [f32])> = Vec::new();
    for (p, (init, data)) in bufs.iter_mut().enumerate() {
        for (c, chunk) in data.chunks_mut(CHUNK).enumerate() {
            tasks.push((p as u64, c as u64, *init, chunk));
        }
    }
    tasks
        .into_par_iter()
        .for_each(|(p, c, init, chunk)| fill_chunk(&master, p, c, 0, init, chunk));
}

/// Fills `out` with elements `start .. start + out.len()` of parameter `p` (seed
/// `seed`, initialisation `init`): bit for bit the values [`fill`] gives them.
pub fn fill_range(seed: u64, p: u64, init: Init, start: u64, out: &mut [f32]) {
    let master = ChaCha8Rng::seed_from_u64(seed);
    let chunk = CHUNK as u64;
    let mut tasks: Vec<(u64, usize, &mut [f32])> = Vec::new();
    let mut rest = out;
    let mut at = start;
    while !rest.is_empty() {
        let c = at / chunk;
        let off = (at % chunk) as usize;
        let n = (CHUNK - off).min(rest.len());
        let (head, tail) = rest.split_at_mut(n);
        tasks.push((c, off, head));
        rest = tail;
        at += n as u64;
    }
    tasks
        .into_par_iter()
        .for_each(|(c, off, part)| fill_chunk(&master, p, c, off, init, part));
}

/// Elements `off .. off + out.len()` of chunk `c` of parameter `p`.
fn fill_chunk(master: &ChaCha8Rng, p: u64, c: u64, off: usize, init: Init, out: &mut [f32]) {
    match init {
        Init::Constant { value } => out.fill(value),
        Init::Uniform { bound } => {
            let key = chunk_key(master, p, c);
            if off == 0 {
                fill_uniform(ChaCha8Core::from_seed(key), bound, out);
            } else {
                let mut rng = ChaCha8Rng::from_seed(key);
                rng.set_word_pos(off as u128);
                let scale = bound / (1u32 << 23) as f32;
                for x in out.iter_mut() {
                    *x = uniform(rng.next_u32(), scale);
                }
            }
        }
        Init::Normal { std } => {
            let mut rng = ChaCha8Rng::from_seed(chunk_key(master, p, c));
            for _ in 0..off {
                let _: f64 = rng.sample(StandardNormal);
            }
            for x in out.iter_mut() {
                let z: f64 = rng.sample(StandardNormal);
                *x = (z * std) as f32;
            }
        }
    }
}

/// The key of chunk `c` of parameter `p`: words `8c .. 8c+8` of the master's stream `p`.
fn chunk_key(master: &ChaCha8Rng, p: u64, c: u64) -> [u8; 32] {
    let mut rng = master.clone();
    rng.set_stream(p);
    rng.set_word_pos(u128::from(c) * 8);
    let mut key = [0u8; 32];
    rng.fill_bytes(&mut key);
    key
}

#[inline]
fn uniform(w: u32, scale: f32) -> f32 {
    let k = w >> 8;
    (k as f32 - (1u32 << 23) as f32) * scale
}

/// Uniform values from whole ChaCha blocks: the same words, in the same order, as
/// `ChaCha8Rng::from_seed(key).next_u32()` would give.
fn fill_uniform(mut core: ChaCha8Core, bound: f32, out: &mut [f32]) {
    let scale = bound / (1u32 << 23) as f32;
    let mut block = <ChaCha8Core as BlockRngCore>::Results::default();
    for part in out.chunks_mut(block.as_ref().len()) {
        core.generate(&mut block);
        for (x, &w) in part.iter_mut().zip(block.as_ref()) {
            *x = uniform(w, scale);
        }
    }
}

/// An empty vector with room for `n` elements, reserved fallibly
/// (`Vec::try_reserve_exact`): a size this process cannot hold is an error naming
/// `what` and the bytes ([`IrError::Alloc`]), not an abort. The one place where
/// the crates' fallible allocations ([`try_alloc`], the executor's check of a
/// step's buffers) ask the allocator. Nothing is written: the pages are not
/// touched.
pub fn try_reserve<T>(what: &str, n: u128) -> Result<Vec<T>> {
    let bytes = n.saturating_mul(std::mem::size_of::<T>() as u128);
    let fail = |why: &str| IrError::Alloc {
        what: what.to_string(),
        bytes,
        reason: why.to_string(),
    };
    let n = match usize::try_from(n) {
        Ok(n) if bytes <= isize::MAX as u128 => n,
        _ => return Err(fail("more than this machine can address")),
    };
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| fail("the allocation failed (not enough memory, or a memory limit)"))?;
    Ok(v)
}

/// A vector of `n` default elements, allocated fallibly ([`try_reserve`]): a size
/// this process cannot hold is an error naming `what` and the bytes, not an abort.
pub fn try_alloc<T: Clone + Default>(what: &str, n: usize) -> Result<Vec<T>> {
    let mut v = try_reserve(what, n as u128)?;
    v.resize(n, T::default());
    Ok(v)
}

/// Which part of the f32 initial value a described parameter holds (the precision
/// pass stores a parameter in bf16 rounded to nearest, or split into the truncated
/// high half and the low 16 bits of the f32 master: Split-SGD-BF16).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Part {
    /// The f32 values.
    #[default]
    F32,
    /// bf16, rounded to nearest even.
    Bf16Round,
    /// bf16: the high 16 bits of the f32 value (truncated).
    Bf16High,
    /// bf16-typed raw bits: the low 16 bits of the f32 value.
    Bf16Low,
}

impl Part {
    /// The element type of the stored part.
    pub fn dtype(self) -> DType {
        match self {
            Part::F32 => DType::F32,
            _ => DType::BF16,
        }
    }
}

/// A parameter's initial value described instead of stored: a pure function of
/// (seed, parameter index, element index), so any rows of it can be created alone.
/// Its first dimension is the rows (a table's or an accumulator's).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Described {
    /// The distribution.
    pub init: Init,
    /// The model's seed.
    pub seed: u64,
    /// The parameter's index in the model's parameter list (its random stream).
    pub stream: u64,
    /// The shape.
    pub shape: Vec<usize>,
    /// Which part of the f32 values is held.
    #[serde(default)]
    pub part: Part,
    /// The values blocked for the blocked GEMM (the layout pass): `shape` is then
    /// the blocked `[n/bn, k/bk, bk, bn]` and the values those of the `[n, k]`
    /// initialisation, zero-padded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked: Option<Blocking>,
}

/// How a described `[n, k]` weight is blocked: element `w[i][j]` sits at
/// `[i / bn, j / bk, j % bk, i % bn]` of the `[ceil(n/bn), ceil(k/bk), bk, bn]`
/// value, every other element 0 (the interpreter's `block_weight`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Blocking {
    /// Rows of the unblocked weight (its output features).
    pub n: usize,
    /// Columns of the unblocked weight (its input features).
    pub k: usize,
    /// Block rows.
    pub bn: usize,
    /// Block columns.
    pub bk: usize,
}

impl Blocking {
    /// The blocked shape `[ceil(n/bn), ceil(k/bk), bk, bn]`.
    pub fn shape(&self) -> Vec<usize> {
        vec![
            self.n.div_ceil(self.bn),
            self.k.div_ceil(self.bk),
            self.bk,
            self.bn,
        ]
    }
}

impl Described {
    /// Elements in all (saturating: a described shape may exceed the address space).
    pub fn numel(&self) -> u128 {
        self.shape.iter().map(|&d| d as u128).product()
    }

    /// Elements per row (the product of the dimensions after the first).
    pub fn row_len(&self) -> u128 {
        self.shape.iter().skip(1).map(|&d| d as u128).product()
    }

    /// The same values, another part (e.g. after the precision pass).
    pub fn with_part(&self, part: Part) -> Described {
        Described {
            part,
            ..self.clone()
        }
    }

    /// Rows `lo..hi` (of the first dimension) as a tensor of shape
    /// `[hi - lo, shape[1..]]`; `name` is for errors (out of range, allocation).
    pub fn rows(&self, name: &str, lo: usize, hi: usize) -> Result<Tensor> {
        let shape = row_range_shape(name, &self.shape, lo, hi)?;
        let row = self.row_len();
        let n = usize::try_from((hi - lo) as u128 * row).map_err(|_| IrError::Alloc {
            what: name.to_string(),
            bytes: (hi - lo) as u128 * row * 4,
            reason: "more than this machine can address".into(),
        })?;
        if let Some(b) = self.blocked {
            return self.blocked_rows(name, b, lo, hi, n, shape);
        }
        let start = (lo as u128 * row) as u64;
        let generate = |out: &mut [f32]| fill_range(self.seed, self.stream, self.init, start, out);
        let data = match self.part {
            Part::F32 => {
                let mut v = try_alloc::<f32>(name, n)?;
                generate(&mut v);
                Data::F32(v)
            }
            part => {
                // Generate in slices, so the f32 scratch stays small.
                let mut v = try_alloc::<bf16>(name, n)?;
                let mut scratch = vec![0f32; CHUNK.min(n)];
                let mut at = start;
                for out in v.chunks_mut(CHUNK) {
                    let s = &mut scratch[..out.len()];
                    fill_range(self.seed, self.stream, self.init, at, s);
                    for (o, &x) in out.iter_mut().zip(s.iter()) {
                        *o = to_part(part, x);
                    }
                    at += out.len() as u64;
                }
                Data::BF16(v)
            }
        };
        Ok(Tensor { shape, data })
    }

    /// The whole value.
    pub fn materialize(&self, name: &str) -> Result<Tensor> {
        self.rows(name, 0, self.shape.first().copied().unwrap_or(1))
    }

    /// Block rows `lo..hi` of a blocked weight (`n` elements, `shape`): the
    /// unblocked rows they hold are generated a group of block rows at a time (an
    /// f32 scratch of about 2^20 elements, at least one block row's `bn * k`) and
    /// scattered to their blocked places; padding stays 0.
    fn blocked_rows(
        &self,
        name: &str,
        b: Blocking,
        lo: usize,
        hi: usize,
        n: usize,
        shape: Vec<usize>,
    ) -> Result<Tensor> {
        if shape.len() != 4 || b.bn == 0 || b.bk == 0 || b.shape()[1..] != shape[1..] {
            return Err(IrError::Binding {
                name: name.to_string(),
                reason: format!("blocking {b:?} does not give its shape {:?}", self.shape),
            });
        }
        let kb = b.k.div_ceil(b.bk);
        let block_row = kb * b.bk * b.bn;
        let src_row = b.bn * b.k;
        let group = ((1usize << 20) / src_row.max(1)).max(1);
        let mut scratch = try_alloc::<f32>(name, group.min(hi - lo) * src_row)?;
        let mut scatter = |out_row: &mut dyn FnMut(usize, f32), r0: usize| {
            // Block rows r0 .. r0 + group (absolute), unblocked rows i0 .. i1.
            let i0 = r0 * b.bn;
            let i1 = ((r0 + group).min(hi) * b.bn).min(b.n);
            if i0 >= i1 {
                return;
            }
            let s = &mut scratch[..(i1 - i0) * b.k];
            fill_range(self.seed, self.stream, self.init, (i0 * b.k) as u64, s);
            for i in i0..i1 {
                for j in 0..b.k {
                    let at =
                        (((i / b.bn - lo) * kb + j / b.bk) * b.bk + j % b.bk) * b.bn + i % b.bn;
                    out_row(at, s[(i - i0) * b.k + j]);
                }
            }
        };
        let data = match self.part {
            Part::F32 => {
                let mut v = try_alloc::<f32>(name, n)?;
                for r0 in (lo..hi).step_by(group) {
                    scatter(&mut |at, x| v[at] = x, r0);
                }
                Data::F32(v)
            }
            part => {
                let mut v = try_alloc::<bf16>(name, n)?;
                for r0 in (lo..hi).step_by(group) {
                    scatter(&mut |at, x| v[at] = to_part(part, x), r0);
                }
                Data::BF16(v)
            }
        };
        debug_assert_eq!(n, (hi - lo) * block_row);
        Ok(Tensor { shape, data })
    }
}

/// One f32 value as the stored `part` (a bf16 part).
fn to_part(part: Part, x: f32) -> bf16 {
    match part {
        Part::Bf16High => bf16::from_bits((x.to_bits() >> 16) as u16),
        Part::Bf16Low => bf16::from_bits((x.to_bits() & 0xffff) as u16),
        _ => bf16::from_f32(x),
    }
}

/// Where the values of an [`OnDemand`] parameter are read from, by row range (e.g.
/// a checkpoint's memory-mapped part files): nothing is read until a rank asks for
/// the rows it holds.
pub trait RowSource: Send + Sync {
    /// Rows `lo..hi` (of the first dimension) of the parameter the source calls
    /// `key`, read now.
    fn read_rows(&self, key: &str, lo: usize, hi: usize) -> Result<Tensor>;
    /// Where the values are, for messages (e.g. the checkpoint's directory).
    fn describe(&self) -> String;
}

/// A parameter whose values stay in a [`RowSource`] until they are read: its
/// element type and full shape, and the source.
#[derive(Clone)]
pub struct OnDemand {
    /// Element type.
    pub dtype: DType,
    /// The full shape.
    pub shape: Vec<usize>,
    /// The parameter's name in the source (a row shard of it is read under the
    /// shard's own name, e.g. `emb.0.rows0_60`, from the table's key).
    pub key: String,
    /// Where the rows are read from.
    pub source: Arc<dyn RowSource>,
}

impl OnDemand {
    /// Rows `lo..hi` read from the source (checked against the shape first);
    /// `name` is what the caller calls them, for errors.
    pub fn rows(&self, name: &str, lo: usize, hi: usize) -> Result<Tensor> {
        let want = row_range_shape(name, &self.shape, lo, hi)?;
        let t = self.source.read_rows(&self.key, lo, hi)?;
        if t.dtype() != self.dtype || t.shape != want {
            return Err(IrError::Binding {
                name: name.to_string(),
                reason: format!(
                    "{} gave {}{:?} for rows {lo}..{hi} of `{}`, expected {}{want:?}",
                    self.source.describe(),
                    t.dtype(),
                    t.shape,
                    self.key,
                    self.dtype
                ),
            });
        }
        Ok(t)
    }
}

impl std::fmt::Debug for OnDemand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnDemand")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("key", &self.key)
            .field("source", &self.source.describe())
            .finish()
    }
}

/// Two on-demand values are equal if they read the same source with the same type.
impl PartialEq for OnDemand {
    fn eq(&self, other: &OnDemand) -> bool {
        self.dtype == other.dtype
            && self.shape == other.shape
            && self.key == other.key
            && Arc::ptr_eq(&self.source, &other.source)
    }
}

/// A parameter's initial value: stored data, a [`Described`] initializer, or
/// values read [`OnDemand`] from a file.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamValue {
    /// The values themselves.
    Stored(Tensor),
    /// A description the values are generated from.
    Described(Described),
    /// Values read by row range when a rank needs them (a checkpoint's parameter).
    OnDemand(OnDemand),
}

impl ParamValue {
    /// Element type.
    pub fn dtype(&self) -> DType {
        match self {
            ParamValue::Stored(t) => t.dtype(),
            ParamValue::Described(d) => d.part.dtype(),
            ParamValue::OnDemand(o) => o.dtype,
        }
    }

    /// Shape.
    pub fn shape(&self) -> &[usize] {
        match self {
            ParamValue::Stored(t) => &t.shape,
            ParamValue::Described(d) => &d.shape,
            ParamValue::OnDemand(o) => &o.shape,
        }
    }

    /// Bytes of the whole value in memory.
    pub fn bytes(&self) -> u128 {
        let n: u128 = self.shape().iter().map(|&d| d as u128).product();
        n * self.dtype().size_bytes() as u128
    }

    /// The whole value (a stored one cloned; a described one generated, an
    /// on-demand one read, fallibly).
    pub fn materialize(&self, name: &str) -> Result<Tensor> {
        match self {
            ParamValue::Stored(t) => Ok(t.clone()),
            ParamValue::Described(d) => d.materialize(name),
            ParamValue::OnDemand(o) => o.rows(name, 0, o.shape.first().copied().unwrap_or(1)),
        }
    }

    /// The whole value, moving a stored one.
    pub fn into_tensor(self, name: &str) -> Result<Tensor> {
        match self {
            ParamValue::Stored(t) => Ok(t),
            other => other.materialize(name),
        }
    }

    /// Rows `lo..hi` of the first dimension (a `[rows]` vector's elements).
    pub fn rows(&self, name: &str, lo: usize, hi: usize) -> Result<Tensor> {
        match self {
            ParamValue::Described(d) => d.rows(name, lo, hi),
            ParamValue::OnDemand(o) => o.rows(name, lo, hi),
            ParamValue::Stored(t) => {
                let shape = row_range_shape(name, &t.shape, lo, hi)?;
                let row: usize = t.shape.iter().skip(1).product();
                let r = lo * row..hi * row;
                let data = t.data.slice(r).ok_or_else(|| IrError::Binding {
                    name: name.to_string(),
                    reason: format!("rows {lo}..{hi} are not all in its stored data"),
                })?;
                Ok(Tensor { shape, data })
            }
        }
    }
}

/// Every value materialised (e.g. for the interpreter or an export).
pub fn materialize_all(params: &[(String, ParamValue)]) -> Result<Vec<(String, Tensor)>> {
    params
        .iter()
        .map(|(n, v)| Ok((n.clone(), v.materialize(n)?)))
        .collect()
}

/// The shape of rows `lo..hi` of a parameter of shape `shape` (its first axis
/// cut to `hi - lo`; a scalar counts as one row), or an error naming `name` when
/// the range is not within its rows.
fn row_range_shape(name: &str, shape: &[usize], lo: usize, hi: usize) -> Result<Vec<usize>> {
    let rows = shape.first().copied().unwrap_or(1);
    if lo > hi || hi > rows {
        return Err(IrError::Binding {
            name: name.to_string(),
            reason: format!("rows {lo}..{hi} are outside its {rows} rows"),
        });
    }
    let mut cut = shape.to_vec();
    if let Some(r) = cut.first_mut() {
        *r = hi - lo;
    }
    Ok(cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An unblocked f32 parameter of `shape` drawn from `init`.
    fn described(init: Init, seed: u64, stream: u64, shape: Vec<usize>) -> Described {
        Described {
            init,
            seed,
            stream,
            shape,
            part: Part::F32,
            blocked: None,
        }
    }

    fn whole(seed: u64, inits: &[(Init, usize)]) -> Vec<Vec<f32>> {
        let mut data: Vec<Vec<f32>> = inits.iter().map(|&(_, n)| vec![0.0; n]).collect();
        let mut bufs: Vec<(Init, &mut [f32])> = inits
            .iter()
            .zip(data.iter_mut())
            .map(|(&(i, _), v)| (i, v.as_mut_slice()))
            .collect();
        fill(seed, &mut bufs);
        data
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn ranges_equal_the_whole_fill() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for case in 0..40u64 {
            let n = 1 + (rng.next_u32() as usize % (3 * CHUNK + 1000));
            let init = match case % 3 {
                0 => Init::Uniform { bound: 0.01 },
                1 => Init::Normal { std: 0.3 },
                _ => Init::Constant { value: 0.5 },
            };
            let inits = [(Init::embedding(5), 100), (init, n)];
            let all = whole(case, &inits);
            for _ in 0..4 {
                let a = rng.next_u32() as usize % n;
                let b = a + rng.next_u32() as usize % (n - a + 1);
                let mut out = vec![0f32; b - a];
                fill_range(case, 1, init, a as u64, &mut out);
                assert_eq!(
                    bits(&out),
                    bits(&all[1][a..b]),
                    "case {case} {a}..{b} of {n}"
                );
            }
        }
    }

    #[test]
    fn ranges_across_chunk_boundaries() {
        let init = Init::Uniform { bound: 0.2 };
        let n = 3 * CHUNK;
        let all = whole(3, &[(init, n)]);
        for (a, b) in [
            (CHUNK - 1, CHUNK + 1),
            (CHUNK - 70, 2 * CHUNK + 70),
            (0, n),
            (5, 6),
        ] {
            let mut out = vec![0f32; b - a];
            fill_range(3, 0, init, a as u64, &mut out);
            assert_eq!(bits(&out), bits(&all[0][a..b]), "{a}..{b}");
        }
    }

    #[test]
    fn described_rows_and_parts() {
        let d = described(Init::Uniform { bound: 0.05 }, 11, 2, vec![3000, 50]);
        let full = d.materialize("t").expect("t");
        let rows = d.rows("t", 1234, 2999).expect("rows");
        assert_eq!(rows.shape, vec![1765, 50]);
        let f = full.as_f32().expect("f32");
        assert_eq!(
            bits(rows.as_f32().expect("f32")),
            bits(&f[1234 * 50..2999 * 50])
        );
        let hi = d.with_part(Part::Bf16High).rows("t", 10, 20).expect("hi");
        let lo = d.with_part(Part::Bf16Low).rows("t", 10, 20).expect("lo");
        let rd = d.with_part(Part::Bf16Round).rows("t", 10, 20).expect("rd");
        let (Data::BF16(hi), Data::BF16(lo), Data::BF16(rd)) = (&hi.data, &lo.data, &rd.data)
        else {
            panic!("bf16 parts")
        };
        for k in 0..hi.len() {
            let x = f[500 + k];
            let joined = (u32::from(hi[k].to_bits()) << 16) | u32::from(lo[k].to_bits());
            assert_eq!(joined, x.to_bits());
            assert_eq!(rd[k], bf16::from_f32(x));
        }
        assert!(d.rows("t", 5, 3001).is_err());
    }

    #[test]
    fn blocked_rows_are_the_blocked_whole() {
        let b = Blocking {
            n: 70,
            k: 45,
            bn: 16,
            bk: 32,
        };
        let d = Described {
            blocked: Some(b),
            ..described(Init::Normal { std: 0.1 }, 3, 4, b.shape())
        };
        let plain = Described {
            shape: vec![70, 45],
            blocked: None,
            ..d.clone()
        }
        .materialize("w")
        .expect("w");
        let w = plain.as_f32().expect("f32");
        let whole = d.materialize("w").expect("blocked");
        assert_eq!(whole.shape, vec![5, 2, 32, 16]);
        let wb = whole.as_f32().expect("f32");
        let mut want = vec![0f32; 5 * 2 * 32 * 16];
        for i in 0..70 {
            for j in 0..45 {
                want[(((i / 16) * 2 + j / 32) * 32 + j % 32) * 16 + i % 16] = w[i * 45 + j];
            }
        }
        assert_eq!(bits(wb), bits(&want));
        let row = 2 * 32 * 16;
        let part = d.rows("w", 2, 5).expect("rows");
        assert_eq!(bits(part.as_f32().expect("f32")), bits(&want[2 * row..]));
        let lo = d.with_part(Part::Bf16Low).rows("w", 4, 5).expect("lo");
        let Data::BF16(lo) = &lo.data else {
            panic!("bf16")
        };
        for (k, x) in lo.iter().enumerate() {
            assert_eq!(x.to_bits(), (want[4 * row + k].to_bits() & 0xffff) as u16);
        }
    }

    #[test]
    fn too_large_is_an_error_not_an_abort() {
        let d = described(
            Init::Uniform { bound: 0.05 },
            1,
            0,
            vec![5_000_000_000, 1_000_000_000],
        );
        let e = d.materialize("emb.0").expect_err("too large");
        assert!(e.to_string().contains("emb.0"), "{e}");
        let e = try_alloc::<f32>("x", usize::MAX / 2).expect_err("too large");
        assert!(matches!(e, IrError::Alloc { .. }), "{e}");
        // Beyond the address space: refused at once; within it, only reserved.
        let e = try_reserve::<u8>("%y", 1 << 60).expect_err("too large");
        assert!(
            e.to_string()
                .starts_with("`%y` needs 1152921504606846976 bytes"),
            "{e}"
        );
        assert!(try_reserve::<f32>("z", u128::MAX).is_err());
        assert_eq!(
            try_reserve::<f32>("z", 1 << 20).expect("small").capacity(),
            1 << 20
        );
    }
}
