//! Constructors of [`GemmSpec`] for the ops that build one: the common defaults
//! (row-major `A`, `C` rows `n` apart, a packed `B`, no bias, no relu, no
//! packing of `A`, one reduction block, the Cranelift micro-kernel, which the
//! JIT's pick then replaces) and setters for what an op changes.

use super::gemm::{BLayout, Elt, GemmSpec, Micro};

impl GemmSpec {
    /// `C[m × n] = A[m × k] · B`: `A` row-major (`lda = k`, `acs = 1`) of
    /// elements `a`, `C` of elements `c` with `ldc = n`, `B` packed; no bias,
    /// relu or packing of `A`; one reduction block; the Cranelift micro-kernel.
    pub fn new(m: usize, n: usize, k: usize, a: Elt, c: Elt) -> GemmSpec {
        GemmSpec {
            m,
            n,
            k,
            lda: k,
            acs: 1,
            ldc: n,
            a,
            c,
            bias: false,
            relu: false,
            mask: false,
            micro: Micro::Cranelift,
            pack_a: false,
            b: BLayout::Packed,
            kb: 0,
            a_blk: 0,
            kc: 0,
        }
    }

    /// The spec with the packed bias added, then relu if `relu`.
    pub fn with_bias(self, relu: bool) -> GemmSpec {
        GemmSpec {
            bias: true,
            relu,
            ..self
        }
    }

    /// The spec with `A`'s row stride `lda` and column (k) stride `acs`.
    pub fn a_strides(self, lda: usize, acs: usize) -> GemmSpec {
        GemmSpec { lda, acs, ..self }
    }

    /// The spec reading `A` as a blocked activation `[k / b][m][b]` in place:
    /// rows `b` apart, the reduction in blocks of `b` steps `m·b` elements
    /// apart (see [`GemmSpec::kb`]).
    pub fn blocked_a(self, b: usize) -> GemmSpec {
        GemmSpec {
            lda: b,
            acs: 1,
            kb: b,
            a_blk: self.m * b,
            ..self
        }
    }

    /// The spec that reads a bf16 blocked `A` ([`GemmSpec::blocked_a`]) from
    /// an f32 copy of each row chunk, widened once per chunk (the blocked
    /// GEMMs' widened form, `super::brgemm`): `[k / kb][rows][kb]`, blocks
    /// [`widen_rows`]`(m, mr)` rows apart, which the f32 in-place loops read
    /// (a bf16 `A` read in place is widened per tile and output block
    /// instead). `None` for any other `A`.
    pub fn widened(self, mr: usize) -> Option<GemmSpec> {
        let blocked = self.kb > 0 && self.lda == self.kb && self.acs == 1;
        (self.a == Elt::BF16 && !self.pack_a && blocked).then(|| GemmSpec {
            a: Elt::F32,
            a_blk: widen_rows(self.m, mr) * self.kb,
            ..self
        })
    }

    /// The reduction chunk [`GemmSpec::kc`] for this spec's micro-kernel when
    /// chunking pays (`k` at least two chunks, an f32 `C`; `0` otherwise): the
    /// rows of `B` whose `nr` f32 fill 32 KiB of L1, rounded to whole
    /// batch-reduce blocks.
    pub fn chunk_for(&self) -> usize {
        let nr = self.micro.nr().max(1);
        let mut kc = (32 * 1024 / (4 * nr)).max(1);
        if self.kb > 0 && self.kb < self.k {
            kc = (kc / self.kb).max(1) * self.kb;
        }
        kc += kc % 2;
        if self.micro == Micro::Cranelift || self.c != Elt::F32 || self.k < 2 * kc {
            0
        } else {
            kc
        }
    }
}

/// Most tiles in one row chunk of the blocked GEMMs (`super::brgemm`).
pub(crate) const ROW_CHUNK_MAX_TILES: usize = 32;

/// Rows of one block of a widened `A`'s copy ([`GemmSpec::widened`]): the
/// largest row chunk of `m` rows in tiles of `mr`.
pub(crate) fn widen_rows(m: usize, mr: usize) -> usize {
    let mr = mr.max(1);
    (ROW_CHUNK_MAX_TILES * mr).min(m.div_ceil(mr) * mr).max(mr)
}
