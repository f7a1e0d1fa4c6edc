//! `canonical-bags`: every embedding bag made to take per-table graph inputs,
//! whatever layout the model takes its bags in, and the model's input contract
//! recorded ([`dlrm_ir::contract`]).
//!
//! A bag operand (ids, offsets, per-sample weights) that the graph computes from
//! its inputs is replaced by a new graph input when what it computes is known:
//! - `gather{axis=0}(X, k)` of a graph input `X [T, ...]` with a constant index
//!   `k` is row `k` of a stacked input (the reference DLRM's `lS_o`, and in its
//!   Criteo mode `lS_i`, stacked per table): [`Source::Row`];
//! - `embedding_bag[last_offset](t, values, offsets_from_lengths{keys, key}(lengths))`
//!   with `values` and `lengths` graph inputs is key `key` of TorchRec's jagged
//!   batch: the bag becomes one over key `key`'s own ids ([`Source::JaggedIds`])
//!   with offsets from 0 ([`Source::JaggedOffsets`]), the same bags.
//!
//! Roles come from what the graph computes, never from names: the canonical
//! inputs are named after their source (`offsets_2` for row 2 of `offsets`,
//! `values_k` / `lengths_k`), fresh where a name is taken. Operands computed any
//! other way are left as they are (the reference interpreter runs them; the
//! partition names them). Nodes left dead and model inputs no longer read are
//! dropped; the canonical inputs take the place of the input they come from, in
//! the graph's input order. A graph with nothing to rewrite is returned as it is,
//! with an identity contract.

use crate::{PassError, Result};
use dlrm_ir::contract::{CanonicalInput, InputContract, Layout, ModelInput, Source};
use dlrm_ir::{Def, Dim, Graph, Op, ParamValue, TensorType, ValueId, verify};
use std::collections::HashMap;

/// The pass id.
pub const ID: &str = "canonical-bags";

/// A graph in canonical form and its model's input contract.
#[derive(Clone, Debug)]
pub struct Canonical {
    /// The rewritten graph.
    pub graph: Graph,
    /// The parameters the rewritten graph still uses, in its order.
    pub params: Vec<(String, ParamValue)>,
    /// How the canonical inputs come from the model's own.
    pub contract: InputContract,
}

/// The constant integer a stored parameter holds, if it is one element.
fn const_int(g: &Graph, v: ValueId, params: &[(String, ParamValue)]) -> Option<i64> {
    if !matches!(g.value(v).def, Def::Param(_)) {
        return None;
    }
    let (_, ParamValue::Stored(t)) = params.iter().find(|(n, _)| n == g.name_of(v))? else {
        return None;
    };
    let v = t.to_i64_vec()?;
    (v.len() == 1).then(|| v[0])
}

/// A replacement of one bag operand by a canonical input.
struct Replace {
    /// The canonical input's source.
    source: Source,
    /// Its name hint.
    hint: String,
    /// Its type.
    ty: TensorType,
}

/// The node defining `v`, if a node does.
fn def_node(g: &Graph, v: ValueId) -> Option<&dlrm_ir::Node> {
    match g.value(v).def {
        Def::Node(n, 0) => g.nodes().get(n),
        _ => None,
    }
}

/// `(X, k)` if `v` is row `k` of the graph input `X`: `gather{axis=0}(X, k)` with a
/// constant `k` (TorchScript's `lS_o[k]`), or `reshape(slice{axes=[0], starts=[k],
/// ends=[k+1], steps=[1]}(X))` to `X`'s shape without its first dimension
/// (dynamo's `select`).
fn row_of(g: &Graph, v: ValueId, params: &[(String, ParamValue)]) -> Option<(ValueId, i64)> {
    let node = def_node(g, v)?;
    match (&node.op, node.inputs.as_slice()) {
        (Op::Gather { axis: 0 }, [x, k]) => Some((*x, const_int(g, *k, params)?)),
        (Op::Reshape { .. }, [s]) => {
            let sl = def_node(g, *s)?;
            let (
                Op::Slice {
                    axes,
                    starts,
                    ends,
                    steps,
                },
                [x],
            ) = (&sl.op, sl.inputs.as_slice())
            else {
                return None;
            };
            let one = axes.as_slice() == [0]
                && steps.as_slice() == [1]
                && ends.first()?.fixed()? == starts.first()? + 1;
            one.then(|| (*x, starts[0] as i64))
        }
        _ => None,
    }
}

/// Row `k` of a stacked graph input, if `v` is one ([`row_of`]).
fn stacked_row(g: &Graph, v: ValueId, params: &[(String, ParamValue)]) -> Option<Replace> {
    let (x, k) = row_of(g, v, params)?;
    if !matches!(g.value(x).def, Def::Input(_)) {
        return None;
    }
    let xty = g.ty(x);
    let rows = xty.shape.first()?.fixed()? as i64;
    let row = if k < 0 { k + rows } else { k };
    if !(0..rows).contains(&row) || g.ty(v).shape.as_slice() != &xty.shape[1..] {
        return None;
    }
    let input = g.name_of(x).to_string();
    Some(Replace {
        hint: format!("{input}_{row}"),
        source: Source::Row {
            input,
            row: row as usize,
        },
        ty: g.ty(v).clone(),
    })
}

/// Key `key`'s ids and offsets of a jagged batch, if bag node `n` is
/// `embedding_bag[last_offset](t, values, offsets_from_lengths(lengths))`.
fn jagged_key(g: &Graph, n: usize) -> Option<(Replace, Replace)> {
    let node = &g.nodes()[n];
    let (
        Op::EmbeddingBag {
            last_offset: true, ..
        },
        [_, values, off],
    ) = (&node.op, node.inputs.as_slice())
    else {
        return None;
    };
    let Def::Node(m, 0) = g.value(*off).def else {
        return None;
    };
    let src = &g.nodes()[m];
    let (&Op::OffsetsFromLengths { keys, key }, [lengths]) = (&src.op, src.inputs.as_slice())
    else {
        return None;
    };
    let is_input = |v: ValueId| matches!(g.value(v).def, Def::Input(_));
    if !is_input(*values) || !is_input(*lengths) {
        return None;
    }
    let (vn, ln) = (g.name_of(*values), g.name_of(*lengths));
    let vty = g.ty(*values);
    let ids_ty = TensorType::new(vty.dtype, [Dim::Sym(format!("{vn}_{key}_len"))]);
    let ids = Replace {
        hint: format!("{vn}_{key}"),
        source: Source::JaggedIds {
            values: vn.to_string(),
            lengths: ln.to_string(),
            key,
            keys,
        },
        ty: ids_ty,
    };
    let offs = Replace {
        hint: format!("{ln}_{key}"),
        source: Source::JaggedOffsets {
            lengths: ln.to_string(),
            key,
            keys,
        },
        ty: g.ty(*off).clone(),
    };
    Some((ids, offs))
}

/// The bag operands to replace: (node, slot) -> replacement.
fn find(g: &Graph, params: &[(String, ParamValue)]) -> Vec<((usize, usize), Replace)> {
    let mut found = Vec::new();
    for (n, node) in g.nodes().iter().enumerate() {
        if !matches!(node.op, Op::EmbeddingBag { .. } | Op::EmbeddingBagWeighted) {
            continue;
        }
        if let Some((ids, offs)) = jagged_key(g, n) {
            found.push(((n, 1), ids));
            found.push(((n, 2), offs));
            continue;
        }
        for (slot, &v) in node.inputs.iter().enumerate().skip(1) {
            if let Some(r) = stacked_row(g, v, params) {
                found.push(((n, slot), r));
            }
        }
    }
    found
}

/// Rewrites `g` to canonical bags (module docs); `params` are the graph's
/// parameters (the constant indices are read from them).
pub fn canonical_bags(g: Graph, params: Vec<(String, ParamValue)>) -> Result<Canonical> {
    let model_inputs: Vec<ModelInput> = g
        .inputs()
        .iter()
        .map(|&v| ModelInput {
            name: g.name_of(v).to_string(),
            ty: g.ty(v).to_string(),
        })
        .collect();
    let found = find(&g, &params);
    if found.is_empty() {
        return Ok(Canonical {
            graph: g,
            params,
            contract: InputContract {
                layout: Layout::PerTable,
                model_inputs,
                canonical: Vec::new(),
            },
        });
    }
    rebuild(&g, params, model_inputs, found)
}

/// The layout the sources say the model takes.
fn layout_of(canonical: &[CanonicalInput]) -> Layout {
    let stacked = canonical
        .iter()
        .any(|c| matches!(c.source, Source::Row { .. }));
    let jagged = canonical
        .iter()
        .any(|c| !matches!(c.source, Source::Row { .. }));
    match (stacked, jagged) {
        (true, true) => Layout::Mixed,
        (true, false) => Layout::Stacked,
        (false, true) => Layout::Jagged,
        (false, false) => Layout::PerTable,
    }
}

/// Whether each value of `g` is read once the operands in `replaced` are not:
/// liveness from the outputs and updates.
fn live_values(g: &Graph, replaced: &HashMap<(usize, usize), usize>) -> Vec<bool> {
    let mut live = vec![false; g.values().len()];
    for &o in g.outputs() {
        live[o.index()] = true;
    }
    for u in g.updates() {
        live[u.value.index()] = true;
        live[u.param.index()] = true;
    }
    for (n, node) in g.nodes().iter().enumerate().rev() {
        if node.outputs.iter().any(|v| live[v.index()]) {
            for (slot, &v) in node.inputs.iter().enumerate() {
                if !replaced.contains_key(&(n, slot)) {
                    live[v.index()] = true;
                }
            }
        }
    }
    live
}

fn rebuild(
    g: &Graph,
    params: Vec<(String, ParamValue)>,
    model_inputs: Vec<ModelInput>,
    found: Vec<((usize, usize), Replace)>,
) -> Result<Canonical> {
    let e = PassError::ir(ID);
    // One canonical input per distinct source.
    let mut canonical: Vec<(CanonicalInput, TensorType)> = Vec::new();
    let mut slot_of: HashMap<(usize, usize), usize> = HashMap::new();
    let mut taken: Vec<String> = g.values().iter().map(|v| v.name.clone()).collect();
    for (at, r) in found {
        let i = match canonical.iter().position(|(c, _)| c.source == r.source) {
            Some(i) => i,
            None => {
                let mut name = r.hint.clone();
                let mut k = 1;
                while taken.contains(&name) {
                    name = format!("{}_{k}", r.hint);
                    k += 1;
                }
                taken.push(name.clone());
                canonical.push((
                    CanonicalInput {
                        name,
                        source: r.source,
                    },
                    r.ty,
                ));
                canonical.len() - 1
            }
        };
        slot_of.insert(at, i);
    }
    let live = live_values(g, &slot_of);
    let mut ng = Graph::new(g.name.clone());
    let mut map: Vec<Option<ValueId>> = vec![None; g.values().len()];
    let mut canon_ids: Vec<Option<ValueId>> = vec![None; canonical.len()];
    for &v in g.inputs() {
        let name = g.name_of(v);
        if live[v.index()] {
            map[v.index()] = Some(ng.add_input(name, g.ty(v).clone()).map_err(e)?);
        }
        for (i, (c, ty)) in canonical.iter().enumerate() {
            if canon_ids[i].is_none() && c.source.reads().first() == Some(&name) {
                canon_ids[i] = Some(ng.add_input(&c.name, ty.clone()).map_err(e)?);
            }
        }
    }
    let mut kept = Vec::new();
    for &p in g.params() {
        if live[p.index()] {
            map[p.index()] = Some(ng.add_param(g.name_of(p), g.ty(p).clone()).map_err(e)?);
            if let Some(pv) = params.iter().find(|(n, _)| n == g.name_of(p)) {
                kept.push(pv.clone());
            }
        }
    }
    for (n, node) in g.nodes().iter().enumerate() {
        if !node.outputs.iter().any(|v| live[v.index()]) {
            continue;
        }
        let ins = node
            .inputs
            .iter()
            .enumerate()
            .map(|(slot, &v)| match slot_of.get(&(n, slot)) {
                Some(&i) => canon_ids[i],
                None => map[v.index()],
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| internal(g, "an operand is used before it is defined"))?;
        let results = node
            .outputs
            .iter()
            .map(|&v| (g.name_of(v).to_string(), g.ty(v).clone()))
            .collect();
        let outs = ng
            .push_node_unchecked(node.op.clone(), ins, results)
            .map_err(e)?;
        for (&old, new) in node.outputs.iter().zip(outs) {
            map[old.index()] = Some(new);
        }
    }
    let get = |v: ValueId| map[v.index()].ok_or_else(|| internal(g, "a result was dropped"));
    ng.set_outputs(g.outputs().iter().map(|&v| get(v)).collect::<Result<_>>()?);
    for u in g.updates() {
        ng.add_update(get(u.param)?, get(u.value)?).map_err(e)?;
    }
    verify(&ng).map_err(|source| PassError::Verify {
        after: ID.into(),
        source,
    })?;
    let canonical: Vec<CanonicalInput> = canonical.into_iter().map(|(c, _)| c).collect();
    Ok(Canonical {
        graph: ng,
        params: kept,
        contract: InputContract {
            layout: layout_of(&canonical),
            model_inputs,
            canonical,
        },
    })
}

fn internal(g: &Graph, what: &str) -> PassError {
    PassError::Graph {
        pass: ID.into(),
        graph: g.name.clone(),
        reason: format!("internal: {what}"),
    }
}
