//! Jagged batches (TorchRec's `KeyedJaggedTensor`): `offsets_from_lengths`, the
//! bag bounds of every key from the bag lengths, and [`narrow_to_bags`], the part
//! of a sparse update's indices that a `last_offset` bag reads (the others are
//! other keys' ids, which the update neither checks nor applies).

use super::common::{R, check_len, describe, dims1, ints};
use crate::{Checked, Data, Tensor};

/// `offsets_from_lengths {keys, key}(lengths[N]) -> [N/keys + 1]`: `G[key·R + s]`,
/// `s` in `0..=R`, `R = N/keys`, `G` the exclusive prefix sums of the lengths
/// with the total appended. Every length is checked (a negative one is an error
/// naming its position, key and sample). Same integer dtype as the lengths.
/// The count of lengths and `key < keys` are the op's rule, checked by its
/// instance (`c`).
pub(super) fn offsets_from_lengths(keys: usize, key: usize, c: &Checked<'_>) -> R<Tensor> {
    let l = c.input(0);
    let n = c.in_shape(0)[0];
    let per_key = n / keys;
    let lens = ints(l, "lengths")?;
    let max = match l.data {
        Data::I32(_) => i64::from(i32::MAX),
        _ => i64::MAX,
    };
    let first = key * per_key;
    let mut out = Vec::with_capacity(per_key + 1);
    let mut sum = 0i64;
    for (j, &len) in lens.iter().enumerate() {
        if j == first {
            out.push(sum);
        }
        if len < 0 {
            let (k, s) = (j / per_key.max(1), j % per_key.max(1));
            return Err(format!(
                "length {len} at position {j} (key {k}, sample {s}) is negative"
            ));
        }
        sum = sum
            .checked_add(len)
            .filter(|&v| v <= max)
            .ok_or_else(|| format!("the lengths' sum passes the largest index at position {j}"))?;
        if j >= first && j < first + per_key {
            out.push(sum);
        }
    }
    if per_key == 0 || n == 0 {
        // No bag: the one bound is the sum before the key (all of it).
        out = vec![sum];
    }
    let shape = vec![per_key + 1];
    Ok(match l.data {
        Data::I32(_) => Tensor {
            shape,
            // Every value is at most i32::MAX (checked above).
            data: Data::I32(out.iter().map(|&v| v as i32).collect()),
        },
        _ => Tensor {
            shape,
            data: Data::I64(out),
        },
    })
}

/// The indices `indices[N]` and row gradient `rowgrad[N, D]` of a sparse update
/// restricted to the positions `bounds[0] .. bounds[S]` (`bounds[S+1]`, the
/// offsets of the `last_offset` bag they come from): the indices the bag reads.
/// The bounds must not be empty and must satisfy `0 <= bounds[0] <= bounds[S] <=
/// N`; the indices outside are returned to no one (not checked).
pub fn narrow_to_bags(indices: &Tensor, rowgrad: &Tensor, bounds: &Tensor) -> R<(Tensor, Tensor)> {
    let n = dims1(indices, "indices")?;
    check_len(rowgrad, "row gradient")?;
    let b = ints(bounds, "bag bounds")?;
    if bounds.shape.len() != 1 || b.is_empty() {
        return Err(format!(
            "bag bounds {} must be a vector of at least one offset",
            describe(bounds)
        ));
    }
    let (lo, hi) = (b[0], b[b.len() - 1]);
    let (Ok(lo), Ok(hi)) = (usize::try_from(lo), usize::try_from(hi)) else {
        return Err(format!("bag bounds {lo} .. {hi} are negative"));
    };
    if lo > hi || hi > n {
        return Err(format!(
            "bag bounds {lo} .. {hi} are not a range of the {n} indices"
        ));
    }
    if rowgrad.shape.len() != 2 || rowgrad.shape[0] != n {
        return Err(format!(
            "row gradient {} must have one row per index of {}",
            describe(rowgrad),
            describe(indices)
        ));
    }
    let d = rowgrad.shape[1];
    let short = || format!("{} holds fewer elements than its shape", describe(rowgrad));
    let idx = Tensor {
        shape: vec![hi - lo],
        data: indices.data.slice(lo..hi).ok_or_else(short)?,
    };
    let g = Tensor {
        shape: vec![hi - lo, d],
        data: rowgrad.data.slice(lo * d..hi * d).ok_or_else(short)?,
    };
    Ok((idx, g))
}
