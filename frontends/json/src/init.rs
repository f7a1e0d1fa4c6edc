//! Parameter initialisation, exactly as the reference DLRM, deterministic and parallel.
//!
//! Distributions (`dlrm_s_pytorch.py`):
//! - linear weight `[out, in]`: `N(0, std = sqrt(2 / (in + out)))`;
//! - linear bias `[out]`: `N(0, std = sqrt(1 / out))`;
//! - embedding table `[rows, dim]`: `U(-sqrt(1 / rows), sqrt(1 / rows))`.
//!
//! Random streams: a master ChaCha8 generator is keyed from the model's seed
//! (`seed_from_u64`). Parameter number `p` (its index in the graph's parameter list)
//! is cut into chunks of [`CHUNK`] elements; chunk `c` gets its own 256-bit ChaCha8
//! key, the 8 words at word position `8c` of the master's stream `p`, and draws its
//! values from a ChaCha8 generator with that key, in element order. Chunk keys are
//! distinct words of one keystream, so the values are a pure function of
//! (seed, parameter index, element index): independent of the thread count and
//! scheduling, and of the other parameters' shapes. All chunks of all parameters are
//! filled in parallel with rayon.
//!
//! Uniform values use the top 24 bits of one 32-bit word each:
//! `(k - 2^23) · bound / 2^23` with `k` in `0 .. 2^24`, so they lie in
//! `[-bound, bound)` exactly; they are produced from whole ChaCha blocks (the block
//! function is the fast, SIMD path). Normal values are rand_distr's ziggurat
//! `StandardNormal` in f64, scaled, then rounded to f32 (as the reference's numpy f64
//! draws are cast to f32).

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::rand_core::block::BlockRngCore;
use rand_chacha::{ChaCha8Core, ChaCha8Rng};
use rand_distr::StandardNormal;
use rayon::prelude::*;

/// Elements per independently seeded chunk.
pub(crate) const CHUNK: usize = 1 << 16;

/// How one parameter is initialised.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Init {
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
}

impl Init {
    /// The reference's initialisation of an embedding table with `rows` rows.
    pub(crate) fn embedding(rows: usize) -> Init {
        Init::Uniform {
            bound: (1.0 / rows as f64).sqrt() as f32,
        }
    }

    /// The reference's initialisation of a linear weight `[fan_out, fan_in]`.
    pub(crate) fn linear_weight(fan_in: usize, fan_out: usize) -> Init {
        Init::Normal {
            std: (2.0 / (fan_in + fan_out) as f64).sqrt(),
        }
    }

    /// The reference's initialisation of a linear bias `[fan_out]`.
    pub(crate) fn linear_bias(fan_out: usize) -> Init {
        Init::Normal {
            std: (1.0 / fan_out as f64).sqrt(),
        }
    }
}

/// Fills every buffer: `bufs[p]` is parameter `p` with its initialisation.
pub(crate) fn fill(seed: u64, bufs: &mut [(Init, &mut [f32])]) {
    let master = ChaCha8Rng::seed_from_u64(seed);
    let mut tasks: Vec<(u64, u64, Init, &mut [f32])> = Vec::new();
    for (p, (init, data)) in bufs.iter_mut().enumerate() {
        for (c, chunk) in data.chunks_mut(CHUNK).enumerate() {
            tasks.push((p as u64, c as u64, *init, chunk));
        }
    }
    tasks.into_par_iter().for_each(|(p, c, init, chunk)| {
        let key = chunk_key(&master, p, c);
        match init {
            Init::Uniform { bound } => fill_uniform(ChaCha8Core::from_seed(key), bound, chunk),
            Init::Normal { std } => {
                let mut rng = ChaCha8Rng::from_seed(key);
                for x in chunk.iter_mut() {
                    let z: f64 = rng.sample(StandardNormal);
                    *x = (z * std) as f32;
                }
            }
        }
    });
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

/// Uniform values from whole ChaCha blocks: the same words, in the same order, as
/// `ChaCha8Rng::from_seed(key).next_u32()` would give.
fn fill_uniform(mut core: ChaCha8Core, bound: f32, out: &mut [f32]) {
    let scale = bound / (1u32 << 23) as f32;
    let mut block = <ChaCha8Core as BlockRngCore>::Results::default();
    for part in out.chunks_mut(block.as_ref().len()) {
        core.generate(&mut block);
        for (x, &w) in part.iter_mut().zip(block.as_ref()) {
            let k = w >> 8;
            *x = (k as f32 - (1u32 << 23) as f32) * scale;
        }
    }
}
