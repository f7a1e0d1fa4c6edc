//! Dimension names are hints, not facts.
//!
//! An exporter names an input's dynamic axes; the importer gives axes of one
//! name one symbol. The reference DLRM's `--save-onnx` labels every `indices_k`
//! length with the batch's own name, though a bag holds any number of ids: taken
//! as a fact, every batch whose bags do not hold one id each is refused ("symbol
//! B is 16 here but 7"), where ONNX Runtime runs it. So after import, an ids
//! input (and its per-sample weights) of bags with offsets that was typed `[B]`
//! gets a length of its own, `{name}_len`, when the graph reads it only as the ids
//! (weights) of such bags: nothing in the graph needs the two equal.

use dlrm_ir::{Def, Dim, Graph, Op, TensorType, ValueId};
use std::collections::HashMap;

/// The ids (and weights) inputs typed `[B]` that only bags with offsets read as
/// their ids (weights), each with its own length symbol (module docs).
fn free_lengths(g: &Graph) -> HashMap<ValueId, TensorType> {
    let (users, nodes) = (g.users(), g.nodes());
    let is_var_bag = |n: usize| {
        let node = &nodes[n];
        matches!(node.op, Op::EmbeddingBag { .. } | Op::EmbeddingBagWeighted)
            && node.inputs.len() >= 3
    };
    let mut out = HashMap::new();
    for (n, node) in nodes.iter().enumerate() {
        if !is_var_bag(n) {
            continue;
        }
        let sym = Dim::Sym(format!("{}_len", g.name_of(node.inputs[1])));
        for v in [Some(node.inputs[1]), node.inputs.get(3).copied()]
            .into_iter()
            .flatten()
        {
            let ty = g.ty(v);
            // Every use of `v` is as the ids (1) or weights (3) of a variable bag.
            let only_bags = users[v.index()].iter().all(|&m| {
                nodes[m]
                    .inputs
                    .iter()
                    .enumerate()
                    .all(|(slot, &x)| x != v || (is_var_bag(m) && (slot == 1 || slot == 3)))
            });
            if matches!(g.value(v).def, Def::Input(_))
                && ty.rank() == 1
                && ty.shape[0].is_sym(Dim::BATCH)
                && only_bags
                && !g.outputs().contains(&v)
            {
                out.entry(v)
                    .or_insert_with(|| TensorType::new(ty.dtype, [sym.clone()]));
            }
        }
    }
    out
}

/// Gives the bag inputs whose `[B]` length was only a name (module docs) their
/// own lengths.
pub(crate) fn free_bag_lengths(g: &mut Graph) -> dlrm_ir::Result<()> {
    for (v, ty) in free_lengths(g) {
        g.set_input_type(v, ty)?;
    }
    Ok(())
}
