//! Control flow: `If` with a condition known at import (the taken branch is inlined),
//! and `Loop` in the two forms PyTorch's exporters write for `nn.EmbeddingBag`,
//! lowered to `embedding_bag` (or `embedding_bag_weighted`) with offsets (see
//! `crate::bag`). Other loops are an error naming the node. `ConcatFromSequence`
//! accepts the lowered bag (already the concatenation of the loop's sequence).
//! `ScatterND` (with `ScatterElements`, `CumSum`, `Max` as its parts) is the
//! `Loop`-free bag `dlrmc export` writes, recognised by `crate::bag::scatter_nd`.

use super::{Builder, Built};
use crate::import::{Ctx, NodeCx, Val};
use std::collections::HashMap;

pub(super) fn register(r: &mut HashMap<&'static str, Builder>) {
    r.insert("If", if_);
    r.insert("Loop", crate::bag::lower_loop);
    r.insert("ConcatFromSequence", concat_from_sequence);
    r.insert("SequenceEmpty", |_, _| Ok(vec![]));
    r.insert("ScatterND", crate::bag::scatter_nd);
    for op in ["ScatterElements", "CumSum", "Max"] {
        r.insert(op, crate::bag::part_of_segment);
    }
}

fn if_(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let c = cx.input(n, 0)?;
    let cond = cx
        .konst(&c)
        .and_then(|t| t.to_i64_vec())
        .and_then(|v| v.first().copied())
        .ok_or("If with a condition computed at run time is supported only inside a recognised EmbeddingBag loop")?;
    let branch = n.attrs.graph(if cond != 0 {
        "then_branch"
    } else {
        "else_branch"
    })?;
    crate::import_nodes(cx, &branch.node, n.index)?;
    let mut outs = Vec::new();
    for o in &branch.output {
        outs.push(cx.lookup(o.name.as_deref().unwrap_or(""))?);
    }
    Ok(outs)
}

fn concat_from_sequence(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let s = cx.input(n, 0)?;
    match s {
        Val::Ir(_) if n.attrs.int("axis", 0)? == 0 && n.attrs.int("new_axis", 0)? == 0 => Ok(vec![s]),
        _ => Err("ConcatFromSequence is supported only on the sequence of a recognised EmbeddingBag loop (axis 0)".into()),
    }
}
