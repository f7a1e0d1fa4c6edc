//! The input contract: how a model's own inputs, laid out as its exporter wrote
//! them, become the canonical inputs of the compiled graphs.
//!
//! Inside, every embedding bag takes per-table graph inputs: its ids, its bag
//! bounds (offsets `[B]`, offsets with the last `[B+1]`, or a fixed pooling
//! `[B, P]` of ids) and its per-sample weights. Outside, models take them in
//! several layouts ([`Layout`]): one tensor per table, the reference DLRM's
//! offsets (and in its Criteo mode also its ids) stacked into one `[T, B]`
//! tensor, or TorchRec's jagged batch (`values`, every table's ids one after
//! another, cut by `lengths[T·B]`). The `canonical-bags` pass rewrites the
//! graph to the canonical form and records here, per canonical input, the
//! [`Source`] it is computed from; [`InputContract::adapt`] computes them from
//! arrays in the model's own names (as ONNX Runtime is fed), checking every
//! count and bound against the data before it allocates.
//!
//! Invariants: every canonical input of the graph that is not a model input
//! itself has exactly one [`CanonicalInput`]; sources read only model inputs
//! listed in [`InputContract::model_inputs`]; a contract with no canonical
//! inputs is the identity.

use crate::{Data, Def, Graph, IrError, Op, Result, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt;

/// How a canonical input is computed from the model's own inputs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "from", rename_all = "snake_case", deny_unknown_fields)]
pub enum Source {
    /// Row `row` of a stacked input `[T, ...]` (the reference DLRM's `lS_o`, and
    /// in its Criteo mode `lS_i`, stacked per table).
    Row {
        /// The stacked model input.
        input: String,
        /// The table's row.
        row: usize,
    },
    /// Key `key`'s ids of a jagged batch: `values[G[key·R] .. G[(key+1)·R]]`,
    /// where `G` are the exclusive prefix sums of `lengths` (`keys·R` entries).
    JaggedIds {
        /// The model input holding every key's ids.
        values: String,
        /// The model input holding the bag lengths, key-major.
        lengths: String,
        /// This key.
        key: usize,
        /// Number of keys.
        keys: usize,
    },
    /// Key `key`'s bag offsets from 0: `G[key·R + s] - G[key·R]` for `s` in
    /// `0..=R` (`R + 1` entries, the last one the key's id count).
    JaggedOffsets {
        /// The model input holding the bag lengths, key-major.
        lengths: String,
        /// This key.
        key: usize,
        /// Number of keys.
        keys: usize,
    },
}

impl Source {
    /// The model inputs this source reads.
    pub fn reads(&self) -> Vec<&str> {
        match self {
            Source::Row { input, .. } => vec![input],
            Source::JaggedIds {
                values, lengths, ..
            } => vec![values, lengths],
            Source::JaggedOffsets { lengths, .. } => vec![lengths],
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Row { input, row } => write!(f, "{input}[{row}]"),
            Source::JaggedIds {
                values,
                lengths,
                key,
                keys,
            } => write!(f, "ids of key {key}/{keys} of jagged ({values}, {lengths})"),
            Source::JaggedOffsets { lengths, key, keys } => {
                write!(f, "offsets of key {key}/{keys} of jagged lengths {lengths}")
            }
        }
    }
}

/// A canonical graph input that is not a model input itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CanonicalInput {
    /// The graph input's name.
    pub name: String,
    /// How it is computed.
    pub source: Source,
}

/// How the model takes its bags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// One ids tensor (and bounds, weights) per table: the canonical form itself.
    #[default]
    PerTable,
    /// Offsets stacked `[T, B]` (ids per table, or also stacked).
    Stacked,
    /// TorchRec's jagged batch: one `values` tensor cut by `lengths`.
    Jagged,
    /// More than one of the above.
    Mixed,
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layout::PerTable => "per-table tensors",
            Layout::Stacked => "stacked [T, B] tensors",
            Layout::Jagged => "jagged values + lengths",
            Layout::Mixed => "mixed",
        })
    }
}

/// One model input as the model declares it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelInput {
    /// Its name.
    pub name: String,
    /// Its type in the IR's text form, e.g. `i64[26,B]`.
    pub ty: String,
}

/// The model's inputs and how the canonical inputs come from them (module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputContract {
    /// The bag layout the model takes.
    pub layout: Layout,
    /// The model's own inputs, in its order.
    pub model_inputs: Vec<ModelInput>,
    /// The canonical inputs computed from them (empty: the identity).
    pub canonical: Vec<CanonicalInput>,
}

fn contract_err(reason: String) -> IrError {
    IrError::Contract { reason }
}

/// The integers of `t` (i64 or i32), or an error naming `input`.
fn ints<'t>(t: &'t Tensor, input: &str) -> Result<IntView<'t>> {
    match &t.data {
        Data::I64(v) => Ok(IntView::I64(v)),
        Data::I32(v) => Ok(IntView::I32(v)),
        _ => Err(contract_err(format!(
            "input `{input}` must be integer (i64 or i32), got {:?}",
            t.dtype()
        ))),
    }
}

enum IntView<'t> {
    I64(&'t [i64]),
    I32(&'t [i32]),
}

impl IntView<'_> {
    fn len(&self) -> usize {
        match self {
            IntView::I64(v) => v.len(),
            IntView::I32(v) => v.len(),
        }
    }
    fn get(&self, i: usize) -> i64 {
        match self {
            IntView::I64(v) => v[i],
            IntView::I32(v) => i64::from(v[i]),
        }
    }
    /// A tensor of the same dtype holding `f(i)` for `i` in `0..n`; for i32 data a
    /// value past i32 (offsets summing i32 lengths) is an error naming `input`.
    fn tensor_of(&self, n: usize, input: &str, f: impl Fn(usize) -> i64) -> Result<Tensor> {
        match self {
            IntView::I64(_) => Ok(Tensor::i64(vec![n], (0..n).map(f).collect())),
            IntView::I32(_) => (0..n)
                .map(|i| {
                    let x = f(i);
                    i32::try_from(x).map_err(|_| {
                        contract_err(format!("`{input}`: {x} at [{i}] does not fit i32"))
                    })
                })
                .collect::<Result<Vec<i32>>>()
                .map(|v| Tensor::i32(vec![n], v)),
        }
    }
}

/// The exclusive prefix sums of `lengths` at key boundaries: `G[key·R]` and
/// `G[(key+1)·R]`, checking every length is non-negative.
fn key_bounds(lengths: &IntView<'_>, name: &str, key: usize, keys: usize) -> Result<(i64, i64)> {
    let n = lengths.len();
    if keys == 0 || !n.is_multiple_of(keys) {
        return Err(contract_err(format!(
            "jagged lengths `{name}` hold {n} entries, not a multiple of the {keys} keys"
        )));
    }
    let r = n / keys;
    let (mut lo, mut sum) = (0i64, 0i64);
    for i in 0..(key + 1) * r {
        if i == key * r {
            lo = sum;
        }
        let l = lengths.get(i);
        if l < 0 {
            return Err(contract_err(format!(
                "jagged lengths `{name}`[{i}] is {l}: a bag length is not negative"
            )));
        }
        sum = sum.checked_add(l).ok_or_else(|| {
            contract_err(format!(
                "jagged lengths `{name}`: the sum overflows at [{i}]"
            ))
        })?;
    }
    Ok((lo, sum))
}

impl InputContract {
    /// True when the canonical inputs are the model's own.
    pub fn is_identity(&self) -> bool {
        self.canonical.is_empty()
    }

    /// The canonical inputs computed from arrays in the model's own names.
    /// Model inputs that are canonical inputs themselves pass through; inputs
    /// read only by sources are dropped. Every array must be a model input and
    /// every model input given once.
    pub fn adapt(&self, given: Vec<(String, Tensor)>) -> Result<Vec<(String, Tensor)>> {
        if self.is_identity() {
            return Ok(given);
        }
        let mut by_name: HashMap<String, Tensor> = HashMap::new();
        for (name, t) in given {
            if !self.model_inputs.iter().any(|m| m.name == name) {
                return Err(contract_err(format!(
                    "array `{name}` is not an input of the model (its inputs: {})",
                    self.input_names().join(", ")
                )));
            }
            if by_name.insert(name.clone(), t).is_some() {
                return Err(contract_err(format!("array `{name}` is given twice")));
            }
        }
        if let Some(m) = self
            .model_inputs
            .iter()
            .find(|m| !by_name.contains_key(&m.name))
        {
            return Err(contract_err(format!(
                "no array for the model input `{}` {} (its inputs: {})",
                m.name,
                m.ty,
                self.input_names().join(", ")
            )));
        }
        let mut out = Vec::new();
        for c in &self.canonical {
            out.push((c.name.clone(), self.compute(&c.source, &by_name)?));
        }
        let read: Vec<&str> = self
            .canonical
            .iter()
            .flat_map(|c| c.source.reads())
            .collect();
        for m in &self.model_inputs {
            if !read.contains(&m.name.as_str())
                && let Some(t) = by_name.remove(&m.name)
            {
                out.push((m.name.clone(), t));
            }
        }
        Ok(out)
    }

    fn input_names(&self) -> Vec<&str> {
        self.model_inputs.iter().map(|m| m.name.as_str()).collect()
    }

    fn compute(&self, s: &Source, by_name: &HashMap<String, Tensor>) -> Result<Tensor> {
        // `adapt` checked that every model input is present; sources read only those.
        let get = |n: &str| {
            by_name
                .get(n)
                .ok_or_else(|| contract_err(format!("the contract reads `{n}`, not a model input")))
        };
        match s {
            Source::Row { input, row } => row_of(get(input)?, input, *row),
            Source::JaggedIds {
                values,
                lengths,
                key,
                keys,
            } => {
                let l = ints(get(lengths)?, lengths)?;
                let v = ints(get(values)?, values)?;
                let (lo, hi) = key_bounds(&l, lengths, *key, *keys)?;
                if hi as u64 > v.len() as u64 {
                    return Err(contract_err(format!(
                        "jagged lengths `{lengths}` sum to {hi} ids up to key {key}, but \
                         `{values}` holds {}",
                        v.len()
                    )));
                }
                let lo = lo as usize;
                v.tensor_of((hi as usize) - lo, values, |i| v.get(lo + i))
            }
            Source::JaggedOffsets { lengths, key, keys } => {
                let l = ints(get(lengths)?, lengths)?;
                key_bounds(&l, lengths, *key, *keys)?;
                let r = l.len() / keys;
                let base = key * r;
                let mut acc = vec![0i64; r + 1];
                for s in 0..r {
                    acc[s + 1] = acc[s] + l.get(base + s);
                }
                l.tensor_of(r + 1, lengths, |i| acc[i])
            }
        }
    }
}

/// What a canonical graph input is for, found from what the graph computes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "role")]
pub enum Role {
    /// A dense feature (any input that is none of the others).
    Dense,
    /// The label (the loss's target).
    Label,
    /// Ids of the bags over a table.
    Ids {
        /// The table parameter.
        table: String,
    },
    /// Bag offsets (`last`: with the last, `[B+1]`).
    Offsets {
        /// The table parameter.
        table: String,
        /// The offsets carry the end of the last bag.
        last: bool,
    },
    /// Per-sample weights of a weighted bag.
    Weights {
        /// The table parameter.
        table: String,
    },
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Role::Dense => f.write_str("dense"),
            Role::Label => f.write_str("label"),
            Role::Ids { table } => write!(f, "ids of %{table}"),
            Role::Offsets { table, last: false } => write!(f, "offsets of %{table}"),
            Role::Offsets { table, last: true } => {
                write!(f, "offsets with the last of %{table}")
            }
            Role::Weights { table } => write!(f, "per-sample weights of %{table}"),
        }
    }
}

/// The role of each input of `g`, in input order (the first role an input has:
/// an input read by several bags is named after the first).
pub fn roles(g: &Graph) -> Vec<(String, Role)> {
    let mut role: Vec<Option<Role>> = vec![None; g.values().len()];
    for node in g.nodes() {
        let (bag, last) = match node.op.bag_form() {
            Some(b) => (true, b.last_offset),
            None => (false, false),
        };
        let mut set = |v: crate::ValueId, r: Role| {
            if matches!(g.value(v).def, Def::Input(_)) && role[v.index()].is_none() {
                role[v.index()] = Some(r);
            }
        };
        if bag && let Some(&t) = node.inputs.first() {
            let table = g.name_of(t).to_string();
            for (slot, &v) in node.inputs.iter().enumerate().skip(1) {
                let table = table.clone();
                set(
                    v,
                    match slot {
                        1 => Role::Ids { table },
                        2 => Role::Offsets { table, last },
                        _ => Role::Weights { table },
                    },
                );
            }
        }
        if matches!(
            node.op,
            Op::Bce { .. } | Op::BceLogits { .. } | Op::Mse { .. }
        ) && let Some(&y) = node.inputs.get(1)
        {
            set(y, Role::Label);
        }
    }
    g.inputs()
        .iter()
        .map(|&v| {
            let r = role[v.index()].clone().unwrap_or(Role::Dense);
            (g.name_of(v).to_string(), r)
        })
        .collect()
}

/// Row `row` of a `[T, ...]` tensor.
fn row_of(t: &Tensor, input: &str, row: usize) -> Result<Tensor> {
    let Some((&rows, rest)) = t.shape.split_first() else {
        return Err(contract_err(format!(
            "input `{input}` is a scalar; a stacked input is [T, ...]"
        )));
    };
    if row >= rows {
        return Err(contract_err(format!(
            "input `{input}` has {rows} rows; the model reads row {row}"
        )));
    }
    let n: usize = rest.iter().product();
    let (lo, hi) = (row * n, (row + 1) * n);
    let shape = rest.to_vec();
    Ok(match &t.data {
        Data::I64(v) => Tensor::i64(shape, v[lo..hi].to_vec()),
        Data::I32(v) => Tensor::i32(shape, v[lo..hi].to_vec()),
        Data::F32(v) => Tensor::f32(shape, v[lo..hi].to_vec()),
        Data::BF16(v) => Tensor::bf16(shape, v[lo..hi].to_vec()),
        Data::U8(v) => Tensor::u8(shape, v[lo..hi].to_vec()),
    })
}

#[cfg(test)]
mod tests {
    #![expect(clippy::unwrap_used, reason = "tests fail loudly")]
    use super::*;

    fn contract(canonical: Vec<(&str, Source)>, inputs: &[&str]) -> InputContract {
        InputContract {
            layout: Layout::Mixed,
            model_inputs: inputs
                .iter()
                .map(|n| ModelInput {
                    name: n.to_string(),
                    ty: "i64[?]".into(),
                })
                .collect(),
            canonical: canonical
                .into_iter()
                .map(|(n, s)| CanonicalInput {
                    name: n.into(),
                    source: s,
                })
                .collect(),
        }
    }

    #[test]
    fn stacked_rows_and_passthrough() {
        let c = contract(
            vec![(
                "offsets_1",
                Source::Row {
                    input: "offsets".into(),
                    row: 1,
                },
            )],
            &["dense", "offsets"],
        );
        let out = c
            .adapt(vec![
                (
                    "offsets".into(),
                    Tensor::i64(vec![2, 3], vec![0, 1, 2, 0, 2, 5]),
                ),
                ("dense".into(), Tensor::f32(vec![1], vec![0.5])),
            ])
            .unwrap();
        assert_eq!(out[0].0, "offsets_1");
        assert_eq!(out[0].1, Tensor::i64(vec![3], vec![0, 2, 5]));
        assert_eq!(out[1].0, "dense");
        assert_eq!(out.len(), 2);
        let e = c
            .adapt(vec![("offsets".into(), Tensor::i64(vec![1, 1], vec![0]))])
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("no array for the model input `dense`"),
            "{e}"
        );
    }

    #[test]
    fn jagged_keys() {
        // 2 keys, R = 3: lengths key 0 [1, 0, 2], key 1 [2, 1, 0].
        let l = Tensor::i64(vec![6], vec![1, 0, 2, 2, 1, 0]);
        let v = Tensor::i64(vec![6], vec![10, 11, 12, 20, 21, 22]);
        let c = contract(
            vec![
                (
                    "ids_1",
                    Source::JaggedIds {
                        values: "v".into(),
                        lengths: "l".into(),
                        key: 1,
                        keys: 2,
                    },
                ),
                (
                    "off_1",
                    Source::JaggedOffsets {
                        lengths: "l".into(),
                        key: 1,
                        keys: 2,
                    },
                ),
            ],
            &["v", "l"],
        );
        let out = c
            .adapt(vec![("v".into(), v.clone()), ("l".into(), l.clone())])
            .unwrap();
        assert_eq!(out[0].1, Tensor::i64(vec![3], vec![20, 21, 22]));
        assert_eq!(out[1].1, Tensor::i64(vec![4], vec![0, 2, 3, 3]));
        // A negative length and too few values are refused, naming the input.
        let bad = Tensor::i64(vec![6], vec![1, -1, 2, 2, 1, 0]);
        let e = c
            .adapt(vec![("v".into(), v.clone()), ("l".into(), bad)])
            .unwrap_err();
        assert!(e.to_string().contains("`l`[1] is -1"), "{e}");
        let short = Tensor::i64(vec![2], vec![10, 11]);
        let e = c
            .adapt(vec![("v".into(), short), ("l".into(), l)])
            .unwrap_err();
        assert!(e.to_string().contains("`v` holds 2"), "{e}");
        // i32 lengths whose offsets pass i32 are an error, not a wrapped value.
        let offs = contract(
            vec![(
                "off_1",
                Source::JaggedOffsets {
                    lengths: "l".into(),
                    key: 1,
                    keys: 2,
                },
            )],
            &["l"],
        );
        let big = Tensor::i32(vec![6], vec![0, 0, 0, i32::MAX, 1, 0]);
        let e = offs.adapt(vec![("l".into(), big)]).unwrap_err();
        assert!(
            e.to_string()
                .contains("`l`: 2147483648 at [2] does not fit i32"),
            "{e}"
        );
    }
}
