//! The roles of a model's inputs, found from what its graph computes
//! ([`DataSchema::from_graph`]; see the [`super`] module docs).

use super::data_err;
use crate::error::Result;
use dlrm_ir::{Def, Dim, Graph, Op};
use std::collections::HashMap;

/// A dense float input `[B,width]`.
#[derive(Clone, Debug, PartialEq)]
pub struct DenseFeature {
    /// Input name.
    pub input: String,
    /// Number of columns.
    pub width: usize,
}

/// A sparse feature: the indices (and offsets) of embedding bags.
#[derive(Clone, Debug, PartialEq)]
pub struct SparseFeature {
    /// The indices input.
    pub input: String,
    /// The offsets input (variable bags), if any.
    pub offsets: Option<String>,
    /// Rows of the table(s) it indexes (the smallest, if several tables share it).
    pub rows: usize,
    /// Pooling factor: lookups per sample for fixed pooling; the mean bag size for
    /// variable bags (1 unless set; bags have 0..=2L lookups).
    pub pooling: usize,
    /// Variable bags whose indices are one a sample (`[B]` indices beside `[B]`
    /// offsets, as the reference DLRM's Criteo mode feeds them): every bag holds
    /// exactly one id.
    pub one_per_bag: bool,
    /// The per-sample weights input of a weighted bag (one weight an index,
    /// U(0.5, 1.5)), if any.
    pub weights: Option<String>,
    /// The bag sizes synthetic variable bags are drawn from
    /// ([`DataSchema::with_bag_sizes`]); `None`: 0..=2L lookups.
    pub bag_sizes: Option<BagSizes>,
}

/// How many ids the bags of a table hold (`dlrm-run --pooling`, `dlrmc data
/// generate --pooling`): dlrm-data's, shared.
pub use dlrm_data::BagSizes;

/// The label input (the loss's second operand).
#[derive(Clone, Debug, PartialEq)]
pub struct LabelSpec {
    /// Input name.
    pub input: String,
}

/// The roles of a model's inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct DataSchema {
    /// Dense features, in graph input order.
    pub dense: Vec<DenseFeature>,
    /// Sparse features, in graph input order of their indices.
    pub sparse: Vec<SparseFeature>,
    /// The label, if the graph has a loss.
    pub label: Option<LabelSpec>,
}

impl DataSchema {
    /// The schema with its sparse features' synthetic bag sizes set: `sizes` holds
    /// one item for every feature, or one per feature in order (empty: unchanged).
    /// A fixed-pooling feature `[B, L]` takes only `L`; a feature whose bags hold
    /// one id each (`[B]` ids) only 1.
    pub fn with_bag_sizes(mut self, sizes: &[BagSizes]) -> Result<DataSchema> {
        if sizes.is_empty() {
            return Ok(self);
        }
        let n = self.sparse.len();
        if sizes.len() != 1 && sizes.len() != n {
            return Err(data_err(format!(
                "--pooling lists {} bag sizes, but the model has {n} sparse features \
                 (give one for all, or one per feature in input order: {})",
                sizes.len(),
                self.sparse
                    .iter()
                    .map(|f| f.input.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        for (k, f) in self.sparse.iter_mut().enumerate() {
            let s = sizes[if sizes.len() == 1 { 0 } else { k }];
            let only = if f.offsets.is_none() {
                Some(f.pooling)
            } else if f.one_per_bag {
                Some(1)
            } else {
                None
            };
            match only {
                Some(l) if s != BagSizes::Fixed(l) => {
                    return Err(data_err(format!(
                        "--pooling {s} for %{}: the model's bags there hold exactly {l} \
                         id(s)",
                        f.input
                    )));
                }
                Some(_) => {}
                None => f.bag_sizes = Some(s),
            }
        }
        Ok(self)
    }

    /// Finds the roles of `g`'s inputs (see the module docs). `g` must be an
    /// unpartitioned graph (inference or training).
    pub fn from_graph(g: &Graph) -> Result<DataSchema> {
        let is_input = |v| matches!(g.value(v).def, Def::Input(_));
        let mut sparse: HashMap<String, SparseFeature> = HashMap::new();
        let mut offsets_of: HashMap<String, String> = HashMap::new();
        let mut label = None;
        for (n, node) in g.nodes().iter().enumerate() {
            match &node.op {
                op if op.bag_form().is_some() => {
                    if let Some(f) = bag_feature(g, n, &mut offsets_of)? {
                        let rows = f.rows;
                        sparse
                            .entry(f.input.clone())
                            .and_modify(|e| e.rows = e.rows.min(rows))
                            .or_insert(f);
                    }
                }
                Op::Bce { .. } | Op::BceLogits { .. } | Op::Mse { .. } => {
                    if let Some(&y) = node.inputs.get(1)
                        && is_input(y)
                    {
                        label = Some(LabelSpec {
                            input: g.name_of(y).to_string(),
                        });
                    }
                }
                _ => {}
            }
        }
        let mut schema = DataSchema {
            dense: Vec::new(),
            sparse: Vec::new(),
            label,
        };
        for &v in g.inputs() {
            let name = g.name_of(v);
            let ty = g.ty(v);
            if let Some(f) = sparse.remove(name) {
                if f.rows == 0 {
                    return Err(data_err(format!(
                        "sparse feature %{name} indexes a table with 0 rows"
                    )));
                }
                schema.sparse.push(f);
            } else if offsets_of.contains_key(name)
                || schema.label.as_ref().is_some_and(|l| l.input == name)
            {
                // Generated with its feature / the label.
            } else if ty.dtype.is_float()
                && ty.rank() == 2
                && ty.shape[0].is_sym(Dim::BATCH)
                && let Some(width) = ty.shape[1].fixed()
            {
                schema.dense.push(DenseFeature {
                    input: name.to_string(),
                    width,
                });
            } else {
                return Err(data_err(format!(
                    "input %{name} {ty} of graph `{}` has no role the data generator knows \
                     (dense float [B,k], embedding indices/offsets, or the loss's label)",
                    g.name
                )));
            }
        }
        Ok(schema)
    }
}

/// The sparse feature bag node `n` reads (`None` for a node without ids), its
/// offsets and weights inputs recorded in `offsets_of` (input -> ids input).
fn bag_feature(
    g: &Graph,
    n: usize,
    offsets_of: &mut HashMap<String, String>,
) -> Result<Option<SparseFeature>> {
    let node = &g.nodes()[n];
    let is_input = |v| matches!(g.value(v).def, Def::Input(_));
    let (Some(&table), Some(&idx)) = (node.inputs.first(), node.inputs.get(1)) else {
        return Ok(None);
    };
    let rows = match g.ty(table).shape.first().and_then(Dim::fixed) {
        Some(r) if matches!(g.value(table).def, Def::Param(_)) => r,
        _ => {
            return Err(data_err(format!(
                "node {}: the table %{} is not a parameter with a fixed row count",
                g.node_label(n),
                g.name_of(table)
            )));
        }
    };
    // Operand `slot` as an input's name, or an error naming it `what`.
    let input_at = |slot: usize, what: &str| match node.inputs.get(slot) {
        Some(&v) if is_input(v) => Ok(Some(g.name_of(v).to_string())),
        Some(&v) => Err(data_err(format!(
            "node {}: the {what} %{} are not a graph input",
            g.node_label(n),
            g.name_of(v)
        ))),
        None => Ok(None),
    };
    input_at(1, "indices")?;
    let offsets = input_at(2, "offsets")?;
    let weights = input_at(3, "per-sample weights")?;
    let ity = g.ty(idx);
    let pooling = match (&offsets, ity.shape.get(1).and_then(Dim::fixed)) {
        (None, Some(l)) if ity.rank() == 2 => l,
        (None, _) => {
            return Err(data_err(format!(
                "node {}: indices %{} {ity} need a fixed pooling [B,L]",
                g.node_label(n),
                g.name_of(idx)
            )));
        }
        (Some(_), _) => 1,
    };
    let name = g.name_of(idx).to_string();
    for bound in offsets.iter().chain(&weights) {
        offsets_of.insert(bound.clone(), name.clone());
    }
    let one_per_bag = offsets.is_some()
        && ity.rank() == 1
        && (ity.shape[0].is_sym(Dim::BATCH) || ity.shape[0].is_sym(Dim::GLOBAL));
    Ok(Some(SparseFeature {
        input: name,
        offsets,
        rows,
        pooling,
        one_per_bag,
        weights,
        bag_sizes: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::BagSizes;

    #[test]
    fn bag_sizes_parse_counts_ranges_and_lists() {
        assert_eq!(BagSizes::parse("3"), Ok(BagSizes::Fixed(3)));
        assert_eq!(BagSizes::parse("1-100"), Ok(BagSizes::Uniform(1, 100)));
        assert_eq!(BagSizes::parse("4-4"), Ok(BagSizes::Fixed(4)));
        assert_eq!(
            BagSizes::parse_list("3,2,1-5"),
            Ok(vec![
                BagSizes::Fixed(3),
                BagSizes::Fixed(2),
                BagSizes::Uniform(1, 5)
            ])
        );
        for bad in ["", "x", "5-2", "-3", "1-", "70000", "1,,2"] {
            assert!(BagSizes::parse_list(bad).is_err(), "{bad:?} was accepted");
        }
        // The draw covers the range and stays in it.
        let u = BagSizes::Uniform(2, 4);
        let seen: std::collections::BTreeSet<usize> = (0..64).map(|h| u.pick(h)).collect();
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), [2, 3, 4]);
    }
}
