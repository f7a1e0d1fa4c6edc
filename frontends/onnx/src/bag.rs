//! Lowering of the `Loop`s PyTorch's exporters write for `nn.EmbeddingBag` with
//! offsets, to `embedding_bag {mode}(table, indices, offsets)` or, with per-sample
//! weights, `embedding_bag_weighted(table, indices, offsets, weights)`.
//!
//! Recognised structures (the loop runs once per bag `i`):
//! - TorchScript exporter: no loop-carried values; the body slices
//!   `indices[start:end]` with `start`/`end` gathered from (slices of)
//!   `Concat(offsets, [len(indices)])` at `i`, gathers the table rows,
//!   optionally multiplies by the same slice of the per-sample weights (unsqueezed),
//!   and reduces over axis 0 (`ReduceSum` / `ReduceMean`); the scan output is the bag.
//! - dynamo exporter: the rows `Gather(table, indices)` (optionally `Mul` by the
//!   unsqueezed per-sample weights) are computed before the loop; the loop carries a
//!   sequence (and, in any order, loop-invariant values such as the rows and the
//!   extended offsets); the body's `If` yields zeros for an empty bag or the
//!   reduction of `rows[start:end]`; `SequenceInsert` appends it; after the loop
//!   `ConcatFromSequence` joins the bags.
//!
//! Only the roles (table, indices, offsets, weights, mode) are read from the body;
//! anything else in the loop must not feed its outputs. Empty bags give zeros in
//! both forms (`embedding_bag`'s rule), as PyTorch does.

use crate::import::{Ctx, NodeCx, Val};
use crate::ops::Built;
use crate::proto::{GraphProto, NodeProto};
use dlrm_ir::{Op, Pool};
use std::collections::HashMap;
use std::rc::Rc;

type R<T> = Result<T, String>;

/// One (sub)graph's nodes by output name.
struct Scope<'g> {
    producers: HashMap<&'g str, &'g NodeProto>,
}

impl<'g> Scope<'g> {
    fn of(nodes: &'g [NodeProto]) -> Self {
        let mut producers = HashMap::new();
        for n in nodes {
            for o in &n.output {
                producers.insert(o.as_str(), n);
            }
        }
        Scope { producers }
    }

    fn node(&self, name: &str) -> Option<&'g NodeProto> {
        self.producers.get(name).copied()
    }

    /// Follows value-preserving wrappers (`Identity`, `Cast`, `Unsqueeze`,
    /// `Squeeze`, `Reshape`) back to the first other producer's output name.
    fn through<'a>(&self, mut name: &'a str) -> &'a str
    where
        'g: 'a,
    {
        for _ in 0..64 {
            match self.node(name) {
                Some(n)
                    if matches!(
                        n.op_type.as_deref(),
                        Some("Identity" | "Cast" | "Unsqueeze" | "Squeeze" | "Reshape")
                    ) =>
                {
                    match n.input.first() {
                        Some(i) => name = i.as_str(),
                        None => return name,
                    }
                }
                _ => return name,
            }
        }
        name
    }

    /// The producer of `name` (after wrappers) if it is `op`.
    fn op(&self, name: &str, op: &str) -> Option<&'g NodeProto> {
        self.node(self.through(name))
            .filter(|n| n.op_type.as_deref() == Some(op))
    }
}

fn input(n: &NodeProto, k: usize) -> R<&str> {
    n.input.get(k).map(String::as_str).ok_or_else(|| {
        format!(
            "`{}` lacks operand {k}",
            n.op_type.as_deref().unwrap_or("?")
        )
    })
}

fn reduce_mode(n: &NodeProto) -> Option<Pool> {
    match n.op_type.as_deref() {
        Some("ReduceSum") => Some(Pool::Sum),
        Some("ReduceMean") => Some(Pool::Mean),
        _ => None,
    }
}

/// The roles found in a loop.
struct BagParts {
    table: String,
    indices: String,
    offsets: String,
    weights: Option<String>,
    mode: Pool,
}

/// The offsets input behind an "extended offsets" value of the outer graph:
/// through `Slice`s and wrappers to `Concat(offsets, len)`'s first operand.
fn offsets_root<'g>(outer: &Scope<'g>, name: &'g str) -> R<String> {
    let mut name = name;
    for _ in 0..16 {
        name = outer.through(name);
        match outer.node(name) {
            Some(n) if n.op_type.as_deref() == Some("Slice") => name = input(n, 0)?,
            Some(n) if n.op_type.as_deref() == Some("Concat") => {
                return Ok(input(n, 0)?.to_string());
            }
            _ => return Ok(name.to_string()),
        }
    }
    Err("offsets are computed by too long a chain".into())
}

/// The array a `start` or `end` value is gathered from at the loop index.
fn gathered_from<'a>(s: &Scope<'a>, name: &str) -> R<&'a str> {
    let g = s
        .op(name, "Gather")
        .ok_or("bag bounds are not gathered from the offsets")?;
    input(g, 0)
}

fn torchscript(outer: &Scope<'_>, body: &GraphProto) -> R<BagParts> {
    let s = Scope::of(&body.node);
    let scan = body
        .output
        .get(1)
        .and_then(|o| o.name.as_deref())
        .ok_or("no scan output")?;
    let red = s
        .node(s.through(scan))
        .ok_or("scan output has no producer")?;
    let mode = reduce_mode(red).ok_or("the bag is not a ReduceSum/ReduceMean")?;
    let rows = input(red, 0)?;
    let (gather, weights) = match s.op(rows, "Mul") {
        Some(m) => {
            let (a, b) = (input(m, 0)?, input(m, 1)?);
            let (g, w) = match (s.op(a, "Gather"), s.op(b, "Gather")) {
                (Some(g), _) => (g, b),
                (None, Some(g)) => (g, a),
                _ => return Err("Mul in the loop does not scale gathered rows".into()),
            };
            let ws = s
                .op(w, "Slice")
                .ok_or("per-sample weights are not sliced")?;
            (g, Some(input(ws, 0)?.to_string()))
        }
        None => (
            s.op(rows, "Gather")
                .ok_or("the bag's rows are not gathered")?,
            None,
        ),
    };
    let table = input(gather, 0)?.to_string();
    let slice = s
        .op(input(gather, 1)?, "Slice")
        .ok_or("indices are not sliced per bag")?;
    let indices = input(slice, 0)?.to_string();
    let offx = gathered_from(&s, input(slice, 1)?)?;
    Ok(BagParts {
        table,
        indices,
        offsets: offsets_root(outer, offx)?,
        weights,
        mode,
    })
}

/// The dynamo form; also returns the carried position of the sequence.
fn dynamo(outer: &Scope<'_>, loop_node: &NodeProto, body: &GraphProto) -> R<(BagParts, usize)> {
    let s = Scope::of(&body.node);
    let n_carried = loop_node.input.len().saturating_sub(2);
    let body_in = |k: usize| {
        body.input
            .get(k)
            .and_then(|v| v.name.as_deref())
            .unwrap_or("")
    };
    let body_out = |k: usize| {
        body.output
            .get(k)
            .and_then(|v| v.name.as_deref())
            .unwrap_or("")
    };
    // A body name that is a loop-invariant carried value resolves to its initial
    // outer value; outer names resolve to themselves.
    let resolve = |name: &str| -> R<String> {
        match (0..n_carried).find(|&j| body_in(2 + j) == name) {
            Some(j) => {
                if s.through(body_out(1 + j)) != name {
                    return Err(format!("loop-carried `{name}` changes in the loop"));
                }
                Ok(input(loop_node, 2 + j)?.to_string())
            }
            None => Ok(name.to_string()),
        }
    };
    let mut found = None;
    for j in 0..n_carried {
        if let Some(ins) = s.op(body_out(1 + j), "SequenceInsert")
            && input(ins, 0)? == body_in(2 + j)
        {
            found = Some((j, input(ins, 1)?));
        }
    }
    let (j, value) = found.ok_or("no loop-carried sequence built with SequenceInsert")?;
    let iff = s.op(value, "If").ok_or("the bag is not chosen by an If")?;
    let attrs = crate::attrs::Attrs::new(iff);
    let mut parts = None;
    for br in ["then_branch", "else_branch"] {
        let g = attrs.graph(br)?;
        let bs = Scope::of(&g.node);
        let out = g
            .output
            .first()
            .and_then(|o| o.name.as_deref())
            .ok_or("If branch without output")?;
        let Some(red) = bs.node(bs.through(out)) else {
            continue;
        };
        let Some(mode) = reduce_mode(red) else {
            continue;
        };
        let slice = bs
            .op(input(red, 0)?, "Slice")
            .ok_or("reduced rows are not a slice")?;
        let rows = resolve(input(slice, 0)?)?;
        // The start bound may be computed in the branch or the body.
        let start = input(slice, 1)?;
        let start = bs.through(start);
        let offx = resolve(gathered_from(&s, start)?)?;
        parts = Some((rows, offx, mode));
    }
    let (rows, offx, mode) = parts.ok_or("no If branch reduces the bag's rows")?;
    let (gather, weights) = match outer.op(&rows, "Mul") {
        Some(m) => {
            let (a, b) = (input(m, 0)?, input(m, 1)?);
            match (outer.op(a, "Gather"), outer.op(b, "Gather")) {
                (Some(g), _) => (g, Some(outer.through(b).to_string())),
                (None, Some(g)) => (g, Some(outer.through(a).to_string())),
                _ => return Err("rows are not gathered from a table".into()),
            }
        }
        None => (
            outer
                .op(&rows, "Gather")
                .ok_or("rows are not gathered from a table")?,
            None,
        ),
    };
    Ok((
        BagParts {
            table: input(gather, 0)?.to_string(),
            indices: input(gather, 1)?.to_string(),
            offsets: offsets_root(outer, &offx)?,
            weights,
            mode,
        },
        j,
    ))
}

/// Emits the bag for the recognised roles.
fn emit(cx: &mut Ctx<'_>, p: &BagParts, hint: &str) -> R<Val> {
    let get = |cx: &Ctx<'_>, name: &str| {
        cx.lookup(name).map_err(|e| match e {
            crate::import::NodeErr::Msg(m) => m,
            crate::import::NodeErr::Failed(e) => e.to_string(),
        })
    };
    let table = get(cx, &p.table)?;
    let indices = get(cx, &p.indices)?;
    let offsets = get(cx, &p.offsets)?;
    match &p.weights {
        None => cx.emit(
            Op::EmbeddingBag { mode: p.mode },
            &[table, indices, offsets],
            hint,
        ),
        Some(w) => {
            if p.mode != Pool::Sum {
                return Err("per-sample weights need mode sum".into());
            }
            let w = get(cx, w)?;
            cx.emit(
                Op::EmbeddingBagWeighted,
                &[table, indices, offsets, w],
                hint,
            )
        }
    }
}

/// `Loop`: the EmbeddingBag forms, else an error naming what did not match.
pub(crate) fn lower_loop(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let body = n.attrs.graph("body")?;
    let outer = Scope::of(&cx.graph.node);
    let hint = n.out_name(0);
    if n.n_inputs() <= 2 {
        let parts = torchscript(&outer, body).map_err(|e| {
            format!("unsupported Loop: only PyTorch's EmbeddingBag loops are supported ({e})")
        })?;
        return Ok(vec![emit(cx, &parts, &hint)?]);
    }
    let (parts, j) = dynamo(&outer, n.proto, body).map_err(|e| {
        format!("unsupported Loop: only PyTorch's EmbeddingBag loops are supported ({e})")
    })?;
    let bag = emit(cx, &parts, &n.out_name(j))?;
    let mut outs = Vec::new();
    for k in 0..n.proto.output.len() {
        outs.push(if k == j {
            bag.clone()
        } else if k < n.n_inputs() - 2 {
            // Other carried values are loop-invariant (checked for the ones used).
            match cx.opt_input(n, 2 + k) {
                Ok(Some(v)) => v,
                _ => Val::Failed(Rc::new(
                    cx.node_err(n, format!("Loop output {k} is not supported")),
                )),
            }
        } else {
            Val::Failed(Rc::new(
                cx.node_err(n, format!("Loop scan output {k} is not supported")),
            ))
        });
    }
    Ok(outs)
}
