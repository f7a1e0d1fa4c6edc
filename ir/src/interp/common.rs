//! Helpers shared by the op families: typed views of operands, result storage,
//! shape checks and symbol resolution.
//!
//! Invariant: every helper reports a problem as a message (`Err(String)`) and never
//! panics, whatever the operands hold (a [`Tensor`]'s fields are public, so even its
//! element count is checked against its shape before any element is read).

use crate::{DType, Data, Dim, Tensor, TensorType};
use half::bf16;
use std::borrow::Cow;
use std::collections::HashMap;

/// Result of an op helper: errors are plain messages.
pub(crate) type R<T> = Result<T, String>;

/// Element count of a shape; overflow is an error.
pub(crate) fn numel(shape: &[usize]) -> R<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| format!("shape {} has too many elements", fmt_shape(shape)))
}

/// `[2,3]`.
pub(crate) fn fmt_shape(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", dims.join(","))
}

/// `f32[2,3]`: a tensor's dtype and concrete shape.
pub(crate) fn describe(t: &Tensor) -> String {
    format!("{}{}", t.dtype(), fmt_shape(&t.shape))
}

fn data_len(d: &Data) -> usize {
    d.len()
}

/// Checks that `t` holds exactly as many elements as its shape says; returns that
/// count.
pub(crate) fn check_len(t: &Tensor, what: &str) -> R<usize> {
    let n = numel(&t.shape).map_err(|e| format!("{what}: {e}"))?;
    let len = data_len(&t.data);
    if n == len {
        Ok(n)
    } else {
        Err(format!(
            "{what} has shape {} ({n} elements) but holds {len} elements",
            fmt_shape(&t.shape)
        ))
    }
}

/// The elements of a float operand widened to f32 (borrowed when already f32).
pub(crate) fn floats<'t>(t: &'t Tensor, what: &str) -> R<Cow<'t, [f32]>> {
    check_len(t, what)?;
    match &t.data {
        Data::F32(v) => Ok(Cow::Borrowed(v.as_slice())),
        Data::BF16(v) => Ok(Cow::Owned(v.iter().map(|x| x.to_f32()).collect())),
        _ => Err(format!("{what} must be f32 or bf16, got {}", describe(t))),
    }
}

/// A read-only view of a float operand that widens one element at a time (used for
/// embedding tables, which are too large to widen whole).
#[derive(Clone, Copy)]
pub(crate) enum FView<'t> {
    /// f32 elements.
    F32(&'t [f32]),
    /// bf16 elements, widened exactly on read.
    BF16(&'t [bf16]),
}

impl FView<'_> {
    /// Element `i` as f32. The caller has checked `i` against the shape.
    pub(crate) fn get(&self, i: usize) -> f32 {
        match self {
            FView::F32(v) => v[i],
            FView::BF16(v) => v[i].to_f32(),
        }
    }
}

/// A widening view of a float operand.
pub(crate) fn fview<'t>(t: &'t Tensor, what: &str) -> R<FView<'t>> {
    check_len(t, what)?;
    match &t.data {
        Data::F32(v) => Ok(FView::F32(v)),
        Data::BF16(v) => Ok(FView::BF16(v)),
        _ => Err(format!("{what} must be f32 or bf16, got {}", describe(t))),
    }
}

/// The elements of an index operand as i64 (borrowed when already i64).
pub(crate) fn ints<'t>(t: &'t Tensor, what: &str) -> R<Cow<'t, [i64]>> {
    check_len(t, what)?;
    match &t.data {
        Data::I64(v) => Ok(Cow::Borrowed(v.as_slice())),
        Data::I32(v) => Ok(Cow::Owned(v.iter().map(|&x| i64::from(x)).collect())),
        _ => Err(format!("{what} must be i64 or i32, got {}", describe(t))),
    }
}

/// Stores f32 results in a float dtype (bf16: round to nearest even).
pub(crate) fn store(dtype: DType, shape: Vec<usize>, values: Vec<f32>) -> R<Tensor> {
    let n = numel(&shape)?;
    if n != values.len() {
        // An interpreter bug, reported rather than panicking.
        return Err(format!(
            "internal: {} values computed for a result of shape {}",
            values.len(),
            fmt_shape(&shape)
        ));
    }
    let data = match dtype {
        DType::F32 => Data::F32(values),
        DType::BF16 => Data::BF16(values.into_iter().map(bf16::from_f32).collect()),
        DType::I64 | DType::I32 | DType::U8 => {
            return Err(format!(
                "the result is declared {dtype}, but this op computes floats"
            ));
        }
    };
    Ok(Tensor { shape, data })
}

/// The error of a family's `eval` given an op of another family (an interpreter
/// bug: `dispatch` routes each op to its family).
pub(crate) fn not_in_family<T>(op: &crate::Op, family: &str) -> R<T> {
    Err(format!("internal: `{}` is not {family}", op.mnemonic()))
}

/// The `N` dims of an operand whose rank `N` its op's shape rule checked (the
/// instance it is bound to).
pub(crate) fn dims<const N: usize>(shape: &[usize]) -> [usize; N] {
    std::array::from_fn(|i| shape[i])
}

/// Checks a rank-1 operand and returns its size.
pub(crate) fn dims1(t: &Tensor, what: &str) -> R<usize> {
    match t.shape.as_slice() {
        &[a] => Ok(a),
        _ => Err(format!("{what} must have rank 1, got {}", describe(t))),
    }
}

/// The size of a dimension: fixed, or the symbol's binding.
pub(crate) fn resolve_dim(d: &Dim, syms: &HashMap<String, usize>) -> R<usize> {
    match d {
        Dim::Fixed(n) => Ok(*n),
        Dim::Sym(s) => syms
            .get(s)
            .copied()
            .ok_or_else(|| format!("symbol {s} is not bound")),
        Dim::Expr(e) => e
            .eval(&|s| syms.get(s).copied())
            .ok_or_else(|| format!("dimension {e} has an unbound symbol or is negative")),
    }
}

/// The concrete shape of a declared type (every symbol must be bound).
pub(crate) fn resolve_shape(ty: &TensorType, syms: &HashMap<String, usize>) -> R<Vec<usize>> {
    ty.shape
        .iter()
        .map(|d| resolve_dim(d, syms))
        .collect::<R<Vec<usize>>>()
        .map_err(|e| format!("cannot resolve {ty}: {e}"))
}

/// A loss normaliser: `denom` resolved and converted to f32; zero is an error.
pub(crate) fn denom(d: &Dim, syms: &HashMap<String, usize>) -> R<f32> {
    let n = resolve_dim(d, syms).map_err(|e| format!("denom {d}: {e}"))?;
    if n == 0 {
        return Err(format!("denom {d} is 0"));
    }
    Ok(n as f32)
}

/// Converts a tensor's elements to `to` for the data-movement ops: same dtype is
/// borrowed; float to float goes through f32 (bf16 rounds to nearest even); i32 to
/// i64 widens; i64 to i32 must fit; floats and indices never convert into each other.
pub(crate) fn convert<'t>(t: &'t Tensor, to: DType, what: &str) -> R<Cow<'t, Data>> {
    check_len(t, what)?;
    let from = t.dtype();
    if from == to {
        return Ok(Cow::Borrowed(&t.data));
    }
    let bad = || format!("{what} {} cannot be converted to {to}", describe(t));
    let data = match (&t.data, to) {
        (Data::F32(v), DType::BF16) => Data::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect()),
        (Data::BF16(v), DType::F32) => Data::F32(v.iter().map(|x| x.to_f32()).collect()),
        (Data::I32(v), DType::I64) => Data::I64(v.iter().map(|&x| i64::from(x)).collect()),
        (Data::I64(v), DType::I32) => Data::I32(
            v.iter()
                .map(|&x| i32::try_from(x).map_err(|_| bad()))
                .collect::<R<Vec<i32>>>()?,
        ),
        _ => return Err(bad()),
    };
    Ok(Cow::Owned(data))
}

/// Where element `flat` of an index tensor of shape `shape` sits, for messages:
/// `sample s, position p` for `[S, L]` indices, `position i` for a flat list.
pub(crate) fn index_location(shape: &[usize], flat: usize) -> String {
    match shape {
        [_, l] if *l > 0 => format!("sample {}, position {}", flat / l, flat % l),
        [_] => format!("position {flat}"),
        _ => {
            let mut rest = flat;
            let mut coords = vec![0usize; shape.len()];
            for (c, &d) in coords.iter_mut().zip(shape).rev() {
                if d > 0 {
                    *c = rest % d;
                    rest /= d;
                }
            }
            format!("element {}", fmt_shape(&coords))
        }
    }
}

/// The out-of-range message shared by every op that indexes a table.
pub(crate) fn out_of_range(index: i64, location: &str, rows: usize) -> String {
    format!("index {index} at {location} is out of range for a table of {rows} rows")
}
