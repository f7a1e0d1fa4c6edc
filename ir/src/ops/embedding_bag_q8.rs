//! `embedding_bag_q8`: an embedding bag over a table quantized to 8 bits per
//! element with a scale and a bias per row, in FBGEMM's *fused 8-bit row-wise*
//! format, dequantized as the rows are read (serving: a quarter of the f32
//! table's bytes plus 8 per row).
//!
//! **The format** (`fbgemm::FloatToFused8BitRowwiseQuantizedSBFloat`, TorchRec's
//! `INT8` inference tables): a table of `R` rows of width `D` is `u8[R, D+8]`;
//! row `r` holds its `D` codes `q[r][0..D]`, then its scale `s_r` and its bias
//! `b_r` as little-endian f32 (bytes `D..D+4` and `D+4..D+8`). It stands for
//! the f32 row `v[r][j] = fma(q[r][j], s_r, b_r)` (one rounding).
//! [`quantize_rows`] writes it as FBGEMM does: `b = min(row)`, `s = (max(row) -
//! min(row)) / 255`, `q = round_half_even((x - b) · (255 / (max - min + 1e-8)))`
//! (f32 operations in that order), so every code is in `0..=255` and the
//! extremes of a row are exact up to one rounding.
//!
//! **The op**: `embedding_bag_q8[mode, last_offset](table u8[R, D+8], indices,
//! offsets?, weights?) -> f32[S, D]` is `embedding_bag[mode, last_offset]` (or,
//! with a 4th operand `weights[N]`, `embedding_bag_weighted`, which needs
//! `mode=sum` and no `last_offset`) over the f32 table `v` above: the same
//! operand forms (`indices[S, L]`; `indices[N]` with `offsets[S]`, or `[S+1]`
//! with `last_offset`), the same checks, the same order of float operations (a
//! bag's dequantized rows added to +0 in bag order, each weighted row's product
//! rounded first; the mean's division last). Inference only: it has no gradient.
//! The result is f32 whatever the plan's precision (a bf16 consumer gets a
//! `cast`).

use super::cross::{arity_error, no_gradient};
use crate::error::{IrError, Result};
use crate::graph::ValueId;
use crate::instance::Checked;
use crate::interp::{EvalCtx, eval_op};
use crate::module::{DecomposeCx, GradCx, ModOp, OpModule, Work};
use crate::op::{Attr, Op, Pool};
use crate::tensor::Tensor;
use crate::types::{DType, Dim, TensorType};
use rayon::prelude::*;
use std::collections::HashMap;

type R<T> = std::result::Result<T, String>;

/// Bytes after a row's codes: its f32 scale and f32 bias.
pub const SCALE_BIAS_BYTES: usize = 8;

/// The op `embedding_bag_q8` (see the module docs).
pub struct EmbeddingBagQ8;

/// The op's mnemonic.
pub const MNEMONIC: &str = "embedding_bag_q8";

/// An `embedding_bag_q8` node's op: pooling `mode`, offsets with a last entry.
pub fn op(mode: Pool, last_offset: bool) -> Op {
    let mode = match mode {
        Pool::Sum => "sum",
        Pool::Mean => "mean",
    };
    let attrs = vec![
        ("mode", Attr::Ident(mode.to_string())),
        ("last_offset", Attr::Bool(last_offset)),
    ];
    match ModOp::new(&EmbeddingBagQ8, attrs) {
        Ok(m) => Op::Module(m),
        Err(e) => unreachable!("valid attributes: {e}"),
    }
}

/// The pooling mode and `last_offset` of an `embedding_bag_q8` op.
pub fn attrs_of(op: &ModOp) -> (Pool, bool) {
    let mode = match op.attr("mode") {
        Some(Attr::Ident(m)) if m == "mean" => Pool::Mean,
        _ => Pool::Sum,
    };
    let last = matches!(op.attr("last_offset"), Some(Attr::Bool(true)));
    (mode, last)
}

/// The f32 op whose result this op computes over the dequantized table.
fn plain_op(op: &ModOp, weighted: bool) -> Op {
    let (mode, last_offset) = attrs_of(op);
    if weighted {
        Op::EmbeddingBagWeighted
    } else {
        Op::EmbeddingBag { mode, last_offset }
    }
}

/// The scale and bias of a fused row (`D` codes, then 8 bytes).
#[inline]
pub fn scale_bias(row: &[u8]) -> (f32, f32) {
    let d = row.len() - SCALE_BIAS_BYTES;
    let f = |at: usize| f32::from_le_bytes([row[at], row[at + 1], row[at + 2], row[at + 3]]);
    (f(d), f(d + 4))
}

/// Quantizes `rows` rows of width `d` (`values`, row-major) into the fused
/// format (module docs), as FBGEMM does. A row holding a NaN or an infinity is
/// an error naming it (its scale would be meaningless).
pub fn quantize_rows(values: &[f32], d: usize) -> R<Vec<u8>> {
    if d == 0 {
        return Err("cannot quantize rows of width 0".into());
    }
    if !values.len().is_multiple_of(d) {
        return Err(format!("{} values are not rows of {d}", values.len()));
    }
    if let Some(at) = values.par_iter().position_first(|v| !v.is_finite()) {
        return Err(format!(
            "row {} holds {} at column {}",
            at / d,
            values[at],
            at % d
        ));
    }
    let w = d + SCALE_BIAS_BYTES;
    let mut out = crate::init::try_alloc::<u8>("int8 rows", values.len() / d * w)
        .map_err(|e| e.to_string())?;
    out.par_chunks_exact_mut(w)
        .zip(values.par_chunks_exact(d))
        .for_each(|(q, x)| quantize_row(x, q));
    Ok(out)
}

/// One finite row `x` into `q` (`x.len() + 8` bytes), as FBGEMM does: its
/// minimum and maximum are the first smallest and the first largest element
/// (`std::min_element`, `std::max_element`), the codes rounded half to even
/// (`lrintf`).
pub fn quantize_row(x: &[f32], q: &mut [u8]) {
    const EPSILON: f32 = 1e-8;
    let Some(&first) = x.first() else {
        return;
    };
    let (mut min, mut max) = (first, first);
    for &v in x {
        if v < min {
            min = v;
        }
        if max < v {
            max = v;
        }
    }
    let range = max - min;
    let inverse = 255.0 / (range + EPSILON);
    let d = x.len();
    for (c, &v) in q[..d].iter_mut().zip(x) {
        // In 0..=255 up to rounding; `as` saturates.
        *c = ((v - min) * inverse).round_ties_even() as u8;
    }
    q[d..d + 4].copy_from_slice(&(range / 255.0).to_le_bytes());
    q[d + 4..d + 8].copy_from_slice(&min.to_le_bytes());
}

/// The f32 rows a fused table stands for (module docs): `[R, D+8]` bytes to
/// `R·D` values.
pub fn dequantize_rows(table: &[u8], w: usize) -> Vec<f32> {
    let d = w.saturating_sub(SCALE_BIAS_BYTES);
    let mut out = Vec::with_capacity(table.len() / w.max(1) * d);
    for row in table.chunks_exact(w) {
        let (s, b) = scale_bias(row);
        out.extend(row[..d].iter().map(|&q| f32::from(q).mul_add(s, b)));
    }
    out
}

impl OpModule for EmbeddingBagQ8 {
    fn mnemonic(&self) -> &'static str {
        MNEMONIC
    }

    fn attr_keys(&self) -> &'static [&'static str] {
        &["mode", "last_offset"]
    }

    fn check_attrs(&self, attrs: &[(&'static str, Attr)]) -> R<()> {
        for (k, a) in attrs {
            match (*k, a) {
                ("mode", Attr::Ident(m)) if m == "sum" || m == "mean" => {}
                ("mode", other) => return Err(format!("mode must be sum or mean, got {other}")),
                ("last_offset", Attr::Bool(_)) => {}
                (k, other) => return Err(format!("{k} must be true or false, got {other}")),
            }
        }
        Ok(())
    }

    fn infer(&self, op: &ModOp, ins: &[&TensorType]) -> R<Vec<TensorType>> {
        if !(2..=4).contains(&ins.len()) {
            return Err(format!(
                "`{MNEMONIC}` takes 2 to 4 operands (table, indices, offsets, weights), got {}",
                ins.len()
            ));
        }
        let t = ins[0];
        let width = match (t.dtype, &t.shape[..]) {
            (DType::U8, [_, Dim::Fixed(w)]) if *w > SCALE_BIAS_BYTES => *w,
            _ => {
                return Err(format!(
                    "the table must be u8[R, D+8] (fused 8-bit row-wise rows of D >= 1 codes, \
                     scale and bias), got {t}"
                ));
            }
        };
        let weighted = ins.len() == 4;
        let (mode, last_offset) = attrs_of(op);
        if weighted && (mode != Pool::Sum || last_offset) {
            return Err("weights need mode=sum and last_offset=false".into());
        }
        let plain = TensorType::new(
            DType::F32,
            vec![t.shape[0].clone(), Dim::Fixed(width - SCALE_BIAS_BYTES)],
        );
        let mut operands: Vec<&TensorType> = vec![&plain];
        operands.extend_from_slice(&ins[1..]);
        let mut out = crate::infer::infer(&plain_op(op, weighted), &operands, &[])
            .map_err(|e| e.to_string())?;
        for o in &mut out {
            o.dtype = DType::F32;
        }
        Ok(out)
    }

    fn eval(&self, c: &Checked<'_>) -> R<Vec<Tensor>> {
        let Some(table) = c.input(0).data.as_u8() else {
            return Err("the table is not u8".into());
        };
        let &[rows, w] = c.in_shape(0) else {
            return Err("the table is not a matrix".into());
        };
        let plain = Tensor::f32(vec![rows, w - SCALE_BIAS_BYTES], dequantize_rows(table, w));
        let mut operands: Vec<&Tensor> = vec![&plain];
        operands.extend_from_slice(&c.inputs()[1..]);
        let Op::Module(m) = c.op() else {
            return Err(format!("`{MNEMONIC}` evaluated for another op"));
        };
        let out = TensorType::new(DType::F32, c.out(0).shape.iter().map(|&n| Dim::Fixed(n)));
        let syms = HashMap::new();
        let ctx = EvalCtx {
            syms: &syms,
            comm: &crate::SingleRank,
        };
        eval_op(&plain_op(m, operands.len() == 4), &operands, &[out], &ctx)
    }

    fn work(
        &self,
        _: &ModOp,
        ins: &[&TensorType],
        outs: &[&TensorType],
        dim: &dyn Fn(&Dim) -> f64,
    ) -> Work {
        // Each index reads one fused row and does an FMA and an add per column.
        let numel = |t: &TensorType| t.shape.iter().map(dim).product::<f64>();
        let width = ins.first().and_then(|t| t.shape.get(1)).map_or(0.0, dim);
        let d = (width - SCALE_BIAS_BYTES as f64).max(0.0);
        let n = ins.get(1).map_or(0.0, |t| numel(t));
        Work {
            flops: 2.0 * n * d,
            bytes: n * width
                + ins[1..]
                    .iter()
                    .chain(outs)
                    .map(|t| numel(t) * t.dtype.size_bytes() as f64)
                    .sum::<f64>(),
        }
    }

    fn backward(&self, _: &ModOp, _: &mut dyn GradCx) -> Result<()> {
        no_gradient(MNEMONIC)
    }

    fn decompose(
        &self,
        _: &ModOp,
        g: &mut DecomposeCx<'_>,
        ins: &[ValueId],
        _: &[&str],
    ) -> Result<Vec<ValueId>> {
        if !(2..=4).contains(&ins.len()) {
            return Err(arity_error(g, MNEMONIC, 3, ins.len()));
        }
        // No primitive op reads an f32 from four bytes: the ONNX exporter lowers
        // this op itself (the table split into codes, scales and biases).
        Err(IrError::Graph {
            graph: g.name.clone(),
            reason: format!(
                "`{MNEMONIC}` has no decomposition into primitive ops (its rows' scale and bias \
                 are f32 bytes); the ONNX exporter lowers it directly"
            ),
        })
    }

    no_onnx_form!();

    not_an_update!();
}
