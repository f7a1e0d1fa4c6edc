//! Reference kernels for the heavy ops, one file per family.
//!
//! - [`brgemm`]: the blocked GEMM family `brgemm`, `brgemm_dgrad`, `brgemm_wgrad`
//!   and the re-layouts `block_act`, `unblock_act` (f32 and bf16 storage, bitwise
//!   equal to the interpreter);
//! - [`gemm`]: `linear` (bias + activation fused into the pass over each output
//!   block), `linear_dx`, `linear_dw`, `linear_db`, on top of `matrixmultiply::sgemm`;
//! - [`embedding`]: `embedding_bag` and `embedding_bag_grad` (fixed pooling and
//!   offsets), parallel over bags;
//! - [`interaction`]: `interaction` and `interaction_grad` (`dot` and `cat`);
//! - [`elementwise`]: `relu`, `relu_grad`, `sigmoid`, `sigmoid_grad`, `add`
//!   (and the elementwise module ops' maps);
//! - [`loss`]: `bce_logits`, `bce_logits_grad`;
//! - [`optim`] and [`adagrad`]: the in-place updates (`sgd`, `split_sgd`,
//!   `sparse_sgd`, `embedding_update`, `split_embedding_update`, SC20's race-free
//!   row-range update, on whole tables or row shards, [`Rows`]: the `*_rows`
//!   update ops; the Adagrad updates), reached through
//!   [`crate::update_in_place`] with their operands checked against the
//!   update's instance ([`dlrm_ir::CheckedMut`]);
//! - [`shard`]: `embedding_bag_rows` and `embedding_grad_dense` (row-wise and
//!   data-parallel tables of the partition pass).
//!
//! Shapes: every kernel takes its operands as [`Checked`] — bound to the node's
//! [`NodeInstance`], whose concrete types the op's shape rule
//! (`dlrm_ir::infer`) verified once — and reads its dims from there; no kernel
//! re-derives the rule. [`try_eval_instance`] binds the operands (dtypes, shapes,
//! each buffer's length: the one check of a call), [`try_eval`] builds the
//! instance first (a call outside a plan). Kernels check only data: index
//! values, offsets.
//!
//! Contract of [`try_eval`]: `None` means "no fast kernel for this op or these
//! dtypes" (the caller runs `dlrm_ir::interp::eval_op`); `Some(Ok(results))` are the
//! op's results exactly as the interpreter defines them, up to float reassociation
//! (see each family's documentation for its summation order and tolerance);
//! `Some(Err(..))` is a real error (shape mismatch, index out of range, bad
//! offsets) found *before* any output is produced. Kernels cover f32 only (bf16
//! storage goes through the interpreter for now), except the blocked GEMM family
//! and the optimizer updates, which handle f32 and bf16.
//!
//! Parallelism: every kernel splits its *output* into disjoint blocks, one rayon
//! task each, so no two tasks write the same memory and no locks or atomics are
//! needed. Block sizes depend on the shapes and the rayon pool size, but no
//! kernel's result does: each output element is computed by the same sequence of
//! float operations whatever the split (documented per kernel).

pub mod adagrad;
pub mod brgemm;
pub(crate) mod convert;
pub(crate) mod cross;
pub mod elementwise;
pub mod embedding;
pub mod gemm;
pub mod interaction;
pub mod loss;
pub mod optim;
pub mod shard;
pub(crate) mod split_adagrad;

pub use adagrad::Hyper;
pub use optim::{Rows, sgd_in_place, sparse_sgd_in_place};

use dlrm_ir::{Checked, Data, Dim, NodeInstance, Op, Tensor, TensorType};
use half::bf16;
use std::cell::OnceCell;
use std::collections::HashMap;
use thiserror::Error;

/// Errors found by a kernel (always before any output or parameter is written).
#[derive(Debug, Error, Clone, PartialEq)]
pub enum KernelError {
    /// Operand shapes do not fit the op (or each other).
    #[error("`{op}`: {reason}")]
    Shape {
        /// The op mnemonic.
        op: &'static str,
        /// What does not fit.
        reason: String,
    },
    /// An embedding index outside the table.
    #[error(
        "`{op}`: index {index} at position {position}{} is outside the table's {rows} rows",
        sample.map(|s| format!(" (sample {s})")).unwrap_or_default()
    )]
    IndexOutOfRange {
        /// The op mnemonic.
        op: &'static str,
        /// Flat (row-major) position of the index in the indices tensor.
        position: usize,
        /// The sample (bag) the index belongs to, when known.
        sample: Option<usize>,
        /// The offending index.
        index: i64,
        /// The table's row count.
        rows: usize,
    },
    /// Offsets of variable-size bags that are not a valid partition of the indices.
    #[error("`{op}`: bad offsets: {reason}")]
    Offsets {
        /// The op mnemonic.
        op: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The JIT failed to compile or refused a kernel's arguments.
    #[error("`{op}`: JIT kernel: {reason}")]
    Jit {
        /// The op mnemonic.
        op: &'static str,
        /// What failed.
        reason: String,
    },
    /// A dtype the kernel does not handle.
    #[error("`{op}`: unsupported dtype: {reason}")]
    DType {
        /// The op mnemonic.
        op: &'static str,
        /// Which operand has which dtype.
        reason: String,
    },
}

/// Result alias of the kernels.
pub type KResult<T> = Result<T, KernelError>;

/// Evaluates `op` with a fast kernel, if there is one for this op and these dtypes.
///
/// `inputs` are the node's operands, `out_types` its declared result types and `syms`
/// the symbol sizes (used to check the results' shapes; unbound symbols are not
/// checked). Returns `None` when the caller must use the interpreter instead.
/// The op's instance for these operands is verified first
/// ([`NodeInstance::of_operands`], only for an op with a kernel); a plan that
/// keeps its instances calls [`try_eval_instance`] instead.
pub fn try_eval(
    op: &Op,
    inputs: &[&Tensor],
    out_types: &[TensorType],
    syms: &HashMap<String, usize>,
) -> Option<KResult<Vec<Tensor>>> {
    let slot = OnceCell::new();
    dispatch(op, out_types, syms, || {
        let inst = NodeInstance::of_operands(op, inputs, out_types, syms)
            .map_err(|reason| instance_err(op, reason))?;
        bind(slot.get_or_init(|| inst), inputs)
    })
}

/// The operands bound to `inst` ([`NodeInstance::bind`]), errors as kernel errors.
pub(crate) fn bind<'a>(inst: &'a NodeInstance, inputs: &[&'a Tensor]) -> KResult<Checked<'a>> {
    inst.bind(inputs)
        .map_err(|reason| instance_err(inst.op(), reason))
}

/// A [`NodeInstance`] error as a kernel error (the message already names the op).
pub(crate) fn instance_err(op: &Op, reason: String) -> KernelError {
    let name = op.mnemonic();
    let reason = match reason.strip_prefix(&format!("`{name}`: ")) {
        Some(r) => r.to_string(),
        None => reason,
    };
    KernelError::Shape { op: name, reason }
}

/// [`try_eval`] with the node's verified instance (built once per symbol binding):
/// the operands are checked against it ([`NodeInstance::bind`], the one check of
/// each call: dtypes, shapes, buffer lengths), then the kernel runs on the
/// [`Checked`] operands without re-deriving the op's shape rule.
pub fn try_eval_instance(
    inst: &NodeInstance,
    inputs: &[&Tensor],
    out_types: &[TensorType],
    syms: &HashMap<String, usize>,
) -> Option<KResult<Vec<Tensor>>> {
    dispatch(inst.op(), out_types, syms, || bind(inst, inputs))
}

/// The reference kernel of `op` on the operands `bind` checks, called only for
/// an op that has one (`None`: no kernel for this op or these dtypes). Its match
/// is the one list of the ops this module covers.
fn dispatch<'a>(
    op: &Op,
    out_types: &[TensorType],
    syms: &HashMap<String, usize>,
    bind: impl FnOnce() -> KResult<Checked<'a>>,
) -> Option<KResult<Vec<Tensor>>> {
    // The other kernels than the blocked GEMM family's only run when every
    // declared result is f32 (bf16 results need the interpreter's rounding rule).
    let f32_results = out_types.iter().all(|t| t.dtype == dlrm_ir::DType::F32);
    // `$c`: the checked operands (bound here, so only for an op with a kernel).
    macro_rules! checked {
        ($c:ident => $run:expr) => {{
            let $c = match bind() {
                Ok(c) => c,
                Err(e) => return Some(Err(e)),
            };
            let $c = &$c;
            if !f32_results {
                return None;
            }
            $run
        }};
    }
    let res: KResult<Vec<Tensor>> = match op {
        // The blocked GEMM family handles f32 and bf16 storage.
        Op::Brgemm { .. }
        | Op::BrgemmDgrad { .. }
        | Op::BrgemmWgrad { .. }
        | Op::BlockAct { .. }
        | Op::UnblockAct { .. } => {
            let c = match bind() {
                Ok(c) => c,
                Err(e) => return Some(Err(e)),
            };
            brgemm::try_eval(&c, out_types)?
        }
        // A module op's kernel decides which dtypes it handles (`None`: the
        // interpreter runs) and stores its results in the declared dtypes.
        Op::Module(m) => {
            let run = crate::modules::reference(m)?;
            let c = match bind() {
                Ok(c) => c,
                Err(e) => return Some(Err(e)),
            };
            run(m, &c)?
        }
        Op::Linear { act } => checked!(c => one(gemm::linear(*act, c)?)),
        Op::LinearDx => checked!(c => one(gemm::linear_dx(c)?)),
        Op::LinearDw => checked!(c => one(gemm::linear_dw(c)?)),
        Op::LinearDb => checked!(c => one(gemm::linear_db(c)?)),
        Op::EmbeddingBag { mode, last_offset } => {
            checked!(c => one(embedding::embedding_bag(*mode, *last_offset, c)?))
        }
        Op::EmbeddingBagGrad { mode, last_offset } => {
            checked!(c => one(embedding::embedding_bag_grad(*mode, *last_offset, c)?))
        }
        Op::Interaction {
            kind,
            self_interaction,
        } => checked!(c => one(interaction::interaction(*kind, *self_interaction, c)?)),
        Op::InteractionGrad {
            kind,
            self_interaction,
        } => checked!(c => interaction::interaction_grad(*kind, *self_interaction, c)?),
        Op::Relu => checked!(c => one(elementwise::relu(c)?)),
        Op::ReluGrad => checked!(c => one(elementwise::relu_grad(c)?)),
        Op::Sigmoid => checked!(c => one(elementwise::sigmoid(c)?)),
        Op::SigmoidGrad => checked!(c => one(elementwise::sigmoid_grad(c)?)),
        Op::Add => checked!(c => one(elementwise::add(c)?)),
        Op::BceLogits { denom } => checked!(c => one(loss::bce_logits(denom, c, syms)?)),
        Op::BceLogitsGrad { denom } => checked!(c => one(loss::bce_logits_grad(denom, c, syms)?)),
        Op::EmbeddingBagRows { mode, lo, rows } => {
            checked!(c => one(shard::embedding_bag_rows(*mode, *lo, *rows, c)?))
        }
        Op::EmbeddingGradDense { mode, rows } => {
            checked!(c => one(shard::embedding_grad_dense(*mode, *rows, c)?))
        }
        _ => return None,
    };
    Some(res.and_then(|outs| check_results(op, outs, out_types, syms)))
}

fn one(r: KResult<Tensor>) -> KResult<Vec<Tensor>> {
    r.map(|t| vec![t])
}

/// Checks the results against the declared types (dims with unbound symbols are
/// not checked): a kernel must never hand back something the graph did not declare.
pub(crate) fn check_results(
    op: &Op,
    outs: Vec<Tensor>,
    out_types: &[TensorType],
    syms: &HashMap<String, usize>,
) -> KResult<Vec<Tensor>> {
    let err = |reason: String| KernelError::Shape {
        op: op.mnemonic(),
        reason,
    };
    if outs.len() != out_types.len() {
        return Err(err(format!(
            "{} results for {} declared types",
            outs.len(),
            out_types.len()
        )));
    }
    for (k, (t, ty)) in outs.iter().zip(out_types).enumerate() {
        let dims_ok = t.shape.len() == ty.shape.len()
            && t.shape.iter().zip(&ty.shape).all(|(&n, d)| match d {
                Dim::Fixed(k) => *k == n,
                Dim::Sym(s) => syms.get(s).is_none_or(|&v| v == n),
                Dim::Expr(e) => e.eval(&|s| syms.get(s).copied()).is_none_or(|v| v == n),
            });
        if !dims_ok || t.dtype() != ty.dtype {
            return Err(err(format!(
                "result {k} has shape {:?} ({}), declared {ty}",
                t.shape,
                t.dtype()
            )));
        }
    }
    Ok(outs)
}

// ------------------------------------------------------------------ helpers

/// The dims of checked operand `i`, of the rank `R` its op's shape rule verified
/// (an internal error if the kernel and the rule disagree, never a panic).
pub(crate) fn dims_of<const R: usize>(c: &Checked<'_>, i: usize) -> KResult<[usize; R]> {
    let shape = c.inputs().get(i).map_or(&[][..], |_| c.in_shape(i));
    <[usize; R]>::try_from(shape)
        .map_err(|_| internal(c, &format!("operand {i} {shape:?} is not of rank {R}")))
}

/// An internal error: a kernel disagrees with its op's verified instance.
pub(crate) fn internal(c: &Checked<'_>, what: &str) -> KernelError {
    internal_in(c.name(), what)
}

/// [`internal`] for the op named `op`.
pub(crate) fn internal_in(op: &'static str, what: &str) -> KernelError {
    shape_err(op, format!("internal: {what} differs from the instance"))
}

/// A shape error.
pub(crate) fn shape_err(op: &'static str, reason: String) -> KernelError {
    KernelError::Shape { op, reason }
}

/// Rows per task when splitting `rows` rows for the rayon pool: about two tasks
/// per thread, at least `min` and at most `max` rows per task.
pub(crate) fn block_rows(rows: usize, min: usize, max: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    rows.div_ceil(2 * threads)
        .clamp(min.max(1), max.max(min).max(1))
}

/// Rows per task for GEMMs: one task per thread (every task repacks the shared
/// operand, so fewer, larger tasks), at least `min` and at most `max` rows.
pub(crate) fn gemm_rows(rows: usize, min: usize, max: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    rows.div_ceil(threads)
        .clamp(min.max(1), max.max(min).max(1))
}

/// A float element stored as f32 or bf16: loaded as f32, stored with round to
/// nearest even (the IR's bf16 rule).
pub(crate) trait Elem: Copy + Send + Sync {
    fn load(self) -> f32;
    fn store(v: f32) -> Self;
    /// The tensor's elements, if it is stored as `Self`.
    fn slice(t: &Tensor) -> Option<&[Self]>;
    /// A tensor of `shape` holding `v`.
    fn tensor(shape: Vec<usize>, v: Vec<Self>) -> Tensor;
}

impl Elem for f32 {
    fn slice(t: &Tensor) -> Option<&[f32]> {
        t.as_f32()
    }
    fn tensor(shape: Vec<usize>, v: Vec<f32>) -> Tensor {
        Tensor::f32(shape, v)
    }
    #[inline(always)]
    fn load(self) -> f32 {
        self
    }
    #[inline(always)]
    fn store(v: f32) -> Self {
        v
    }
}

/// `half`'s conversions, bit for bit (a NaN loads and stores quiet, finite values
/// round to nearest even), written without branches so loops over slices
/// vectorise (a test checks them against `half` on every bf16 and on random f32).
impl Elem for bf16 {
    fn slice(t: &Tensor) -> Option<&[bf16]> {
        match &t.data {
            dlrm_ir::Data::BF16(v) => Some(v),
            _ => None,
        }
    }
    fn tensor(shape: Vec<usize>, v: Vec<bf16>) -> Tensor {
        Tensor::bf16(shape, v)
    }
    #[inline(always)]
    fn load(self) -> f32 {
        let b = self.to_bits();
        let quiet = if b & 0x7fff > 0x7f80 { b | 0x40 } else { b };
        f32::from_bits(u32::from(quiet) << 16)
    }
    #[inline(always)]
    fn store(v: f32) -> Self {
        let b = v.to_bits();
        let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
        let quiet = ((b >> 16) | 0x40) as u16;
        bf16::from_bits(if b & 0x7fff_ffff > 0x7f80_0000 {
            quiet
        } else {
            rounded
        })
    }
}

/// An integer index element (i64 or i32).
pub(crate) trait Ix: Copy + Send + Sync {
    fn get(self) -> i64;
}

impl Ix for i64 {
    #[inline(always)]
    fn get(self) -> i64 {
        self
    }
}

impl Ix for i32 {
    #[inline(always)]
    fn get(self) -> i64 {
        i64::from(self)
    }
}

/// The elements of an index tensor, by element type.
#[derive(Clone, Copy)]
pub(crate) enum Indices<'a> {
    I64(&'a [i64]),
    I32(&'a [i32]),
}

impl<'a> Indices<'a> {
    /// The index view of a tensor; `None` if it is not an integer tensor.
    pub(crate) fn of(t: &'a Tensor) -> Option<Indices<'a>> {
        match &t.data {
            Data::I64(v) => Some(Indices::I64(v)),
            Data::I32(v) => Some(Indices::I32(v)),
            _ => None,
        }
    }

    pub(crate) fn len(self) -> usize {
        match self {
            Indices::I64(v) => v.len(),
            Indices::I32(v) => v.len(),
        }
    }

    /// The indices at positions `r` (in range).
    pub(crate) fn slice(self, r: std::ops::Range<usize>) -> Indices<'a> {
        match self {
            Indices::I64(v) => Indices::I64(&v[r]),
            Indices::I32(v) => Indices::I32(&v[r]),
        }
    }

    /// The first position whose index is outside `0..rows`, with that index.
    pub(crate) fn first_out_of_range(self, rows: usize) -> Option<(usize, i64)> {
        fn scan<T: Ix>(v: &[T], rows: usize) -> Option<(usize, i64)> {
            use rayon::prelude::*;
            // A negative index is a huge u64: one comparison for both bounds.
            let bad = |x: &T| x.get() as u64 >= rows as u64;
            // Blocks checked without branches (vectorised), then the first bad
            // index of the first bad block.
            const BLOCK: usize = 1 << 12;
            let any_bad = |c: &[T]| c.iter().fold(false, |a, x| a | bad(x));
            let blk = if v.len() >= 1 << 16 {
                v.par_chunks(BLOCK).position_first(any_bad)
            } else {
                v.chunks(BLOCK).position(any_bad)
            }?;
            let p = blk * BLOCK + v[blk * BLOCK..].iter().position(bad)?;
            Some((p, v[p].get()))
        }
        match self {
            Indices::I64(v) => scan(v, rows),
            Indices::I32(v) => scan(v, rows),
        }
    }
}

/// Validates every index of `idx` against a table of `rows` rows; `per_sample` is
/// the number of indices per sample (fixed pooling) to name the sample, and
/// `offsets` the bag starts (variable bags) for the same purpose.
pub(crate) fn validate_indices(
    op: &'static str,
    idx: Indices<'_>,
    rows: usize,
    per_sample: Option<usize>,
    offsets: Option<&[i64]>,
) -> KResult<()> {
    match idx.first_out_of_range(rows) {
        None => Ok(()),
        Some((position, index)) => {
            let sample = match (per_sample, offsets) {
                (Some(l), _) if l > 0 => Some(position / l),
                (_, Some(off)) => Some(
                    off.partition_point(|&o| o <= position as i64)
                        .saturating_sub(1),
                ),
                _ => None,
            };
            Err(KernelError::IndexOutOfRange {
                op,
                position,
                sample,
                index,
                rows,
            })
        }
    }
}

/// Validates the indices of the bags of `bounds` (the `s + 1` validated bag
/// bounds, [`read_bounds`]) against a table of `rows` rows: only the positions
/// `bounds[0] .. bounds[s]` (those in a bag) are read; an error names the
/// position and its sample.
pub(crate) fn validate_bag_indices(
    op: &'static str,
    idx: Indices<'_>,
    rows: usize,
    bounds: &[i64],
) -> KResult<()> {
    let (Some(&lo), Some(&hi)) = (bounds.first(), bounds.last()) else {
        return Ok(());
    };
    let (lo, hi) = (lo as usize, hi as usize);
    match idx.slice(lo..hi).first_out_of_range(rows) {
        None => Ok(()),
        Some((p, index)) => {
            let position = lo + p;
            let sample = bounds
                .partition_point(|&o| o <= position as i64)
                .saturating_sub(1);
            Err(KernelError::IndexOutOfRange {
                op,
                position,
                sample: Some(sample),
                index,
                rows,
            })
        }
    }
}

/// Reads and validates the `s + 1` bounds of `s` variable bags over `n` indices:
/// without `last_offset` the `s` offsets ([`read_offsets`]) then `n`; with it the
/// offsets as given (PyTorch's `include_last_offset=True`): at least one, never
/// negative or decreasing, `<= n`, starting anywhere.
pub(crate) fn read_bounds(
    op: &'static str,
    t: &Tensor,
    n: usize,
    last_offset: bool,
) -> KResult<Vec<i64>> {
    let mut off = read_offsets_from(op, t, n, !last_offset)?;
    if !last_offset {
        off.push(n as i64);
    } else if off.is_empty() {
        return Err(KernelError::Offsets {
            op,
            reason: "last_offset needs at least one offset (the end of the last bag)".into(),
        });
    }
    Ok(off)
}

/// Reads and validates the offsets of `s` variable bags over `n` indices: they
/// start at 0 (when there is a bag), never decrease and stay `<= n`.
pub(crate) fn read_offsets(op: &'static str, t: &Tensor, n: usize) -> KResult<Vec<i64>> {
    read_offsets_from(op, t, n, true)
}

/// [`read_offsets`]; the first offset may be any `0..=n` unless `zero_start`.
fn read_offsets_from(
    op: &'static str,
    t: &Tensor,
    n: usize,
    zero_start: bool,
) -> KResult<Vec<i64>> {
    let off = match &t.data {
        Data::I64(v) => v.clone(),
        Data::I32(v) => v.iter().map(|&x| i64::from(x)).collect(),
        _ => {
            return Err(KernelError::DType {
                op,
                reason: format!("offsets must be i64 or i32, got {}", t.dtype()),
            });
        }
    };
    if t.shape.len() != 1 {
        return Err(shape_err(
            op,
            format!("offsets must have rank 1, got {:?}", t.shape),
        ));
    }
    if let Some(&first) = off.first()
        && (first < 0 || (zero_start && first != 0))
    {
        return Err(KernelError::Offsets {
            op,
            reason: if zero_start {
                format!("offsets[0] is {first}, must be 0")
            } else {
                format!("offsets[0] is {first}, must not be negative")
            },
        });
    }
    for (s, w) in off.windows(2).enumerate() {
        if w[1] < w[0] {
            return Err(KernelError::Offsets {
                op,
                reason: format!(
                    "offsets[{}] = {} is below offsets[{s}] = {}",
                    s + 1,
                    w[1],
                    w[0]
                ),
            });
        }
    }
    if let Some(&last) = off.last()
        && last as u64 > n as u64
    {
        return Err(KernelError::Offsets {
            op,
            reason: format!(
                "offsets[{}] = {last} is beyond the {n} indices",
                off.len() - 1
            ),
        });
    }
    Ok(off)
}

/// The index range of bag `s` of `off` over `n` indices (validated offsets).
#[inline]
pub(crate) fn bag_range(off: &[i64], s: usize, n: usize) -> std::ops::Range<usize> {
    let start = off[s] as usize;
    let end = off.get(s + 1).map_or(n, |&e| e as usize);
    start..end
}

#[cfg(test)]
mod tests {
    use super::Elem;
    use half::bf16;

    /// The branch-free bf16 conversions are `half`'s, bit for bit: loads of every
    /// bf16, stores of every f32 whose low half is one of the rounding cases.
    #[test]
    fn bf16_conversions_are_halfs() {
        for b in 0..=u16::MAX {
            let x = bf16::from_bits(b);
            assert_eq!(x.load().to_bits(), x.to_f32().to_bits(), "load {b:#06x}");
        }
        let lows = [0, 1, 0x7fff, 0x8000, 0x8001, 0xffff, 0x4000, 0xc000];
        for hi in 0..=u16::MAX as u32 {
            for lo in lows {
                let v = f32::from_bits(hi << 16 | lo);
                let (ours, half) = (bf16::store(v), bf16::from_f32(v));
                assert_eq!(
                    ours.to_bits(),
                    half.to_bits(),
                    "store {:#010x}",
                    v.to_bits()
                );
            }
        }
    }
}
