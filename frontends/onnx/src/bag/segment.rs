//! Recognition of the segment-sum form of bags given by offsets, the form
//! `dlrmc export` writes (`crate::export`, `Lower::segment`) so that an exported
//! model re-imports with its bags fused:
//!
//! ```text
//! marks = ScatterElements(zeros[N+1], Cast(offsets), ones[S], axis=0, reduction=add)
//! bag   = Unsqueeze(Cast(Sub(Slice(CumSum(marks, 0), 0, -1), 1)), 1)   // bag of index i
//! sum   = ScatterND(zeros[S,D], bag, rows, reduction=add)
//! rows  = Gather(table, ids) | Mul(Gather(table, ids), Unsqueeze(weights, 1))
//! mean  = Div(sum, Unsqueeze(Max(Cast(Sub(Concat(Slice(offsets, 1, ∞), [N]), offsets)), 1), 1))
//! ```
//!
//! `sum` becomes `embedding_bag(table, ids, offsets)` (or `embedding_bag_weighted`),
//! and `mean` `embedding_bag {mean}` of the same operands. The parts are checked by
//! what they compute (each name's producer, looked through `Identity`/`Cast`), not
//! by node names. `ScatterElements`, `CumSum` and `Max` have no IR form of their
//! own: outside this form they are an error that says so.

use super::eval::{arg, err_text, op_of};
use super::shapes::{len_of, producer, sym_of, uncast_int};
use crate::import::{Ctx, NodeCx, SymI, Val};
use crate::ops::Built;
use crate::proto::NodeProto;
use dlrm_ir::Pool;

type R<T> = Result<T, String>;

/// `ScatterND`: the sum of a segment-sum bag, else an error saying what differs.
pub(crate) fn scatter_nd(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let why = |e: String| {
        format!(
            "ScatterND is supported only as the segment sum of bags given by offsets (the form `dlrmc export` writes): {e}"
        )
    };
    let bag = segment_sum(cx, n.proto).map_err(why)?;
    let v = emit_bag(cx, &bag, Pool::Sum, &n.out_name(0)).map_err(why)?;
    Ok(vec![v])
}

/// An op that only appears inside the segment-sum form: its outputs are used by
/// the recognised `ScatterND`/`Div`, any other use is this error.
pub(crate) fn part_of_segment(_cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    Err(format!(
        "`{}` is supported only inside the segment-sum form of bags given by offsets (as `dlrmc export` writes them)",
        n.op_type()
    )
    .into())
}

/// `Div(sum, lengths)` where `sum` is a recognised segment sum and `lengths` the
/// bags' lengths (at least 1) from the same offsets: the `mean` bag. `None` when
/// the node is not of that form (an ordinary division).
pub(crate) fn mean_div(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Option<Built> {
    let lhs = producer(cx, n.proto.input.first()?)?;
    if op_of(lhs) != "ScatterND" {
        return None;
    }
    let bag = segment_sum(cx, lhs).ok()?;
    if bag.weights.is_some() || !lengths_of(cx, n.proto.input.get(1)?, &bag) {
        return None;
    }
    Some(
        emit_bag(cx, &bag, Pool::Mean, &n.out_name(0))
            .map(|v| vec![v])
            .map_err(Into::into),
    )
}

/// The operands of a recognised segment sum (ONNX names).
struct Seg {
    table: String,
    ids: String,
    offsets: String,
    weights: Option<String>,
}

fn emit_bag(cx: &mut Ctx<'_>, b: &Seg, mode: Pool, hint: &str) -> R<Val> {
    let get = |cx: &Ctx<'_>, name: &str| cx.lookup(name).map_err(err_text);
    let (t, i, o) = (get(cx, &b.table)?, get(cx, &b.ids)?, get(cx, &b.offsets)?);
    super::emit_offsets_bag(cx, mode, [t, i, o], b.weights.as_deref(), hint)
}

/// The node producing `name` (through `Identity`/`Cast`), which must be `op`.
fn expect<'m>(cx: &Ctx<'m>, name: &'m str, op: &str, what: &str) -> R<&'m NodeProto> {
    producer(cx, name)
        .filter(|p| op_of(p) == op)
        .ok_or_else(|| format!("{what} is not a `{op}`"))
}

fn attr_str(n: &NodeProto, name: &str) -> String {
    crate::attrs::Attrs::new(n)
        .string(name, "none")
        .unwrap_or_default()
}

fn attr_int(n: &NodeProto, name: &str, default: i64) -> Option<i64> {
    crate::attrs::Attrs::new(n).int(name, default).ok()
}

/// The single float a constant name holds.
fn const_f32(cx: &Ctx<'_>, name: &str) -> Option<f32> {
    let v = cx.lookup(name).ok()?;
    let t = cx.konst(&v)?;
    let v = t.to_f32_vec();
    (v.len() == 1).then(|| v[0])
}

/// The constant integers a name holds.
fn const_ints(cx: &Ctx<'_>, name: &str) -> Option<Vec<i64>> {
    let v = cx.lookup(name).ok()?;
    cx.konst(&v)?.to_i64_vec()
}

/// `Unsqueeze(x, [axis])` (axes as attribute or input): `x`.
fn unsqueezed<'m>(cx: &Ctx<'m>, name: &'m str, axis: i64, what: &str) -> R<&'m str> {
    let u = expect(cx, name, "Unsqueeze", what)?;
    let axes = match crate::attrs::Attrs::new(u).ints("axes") {
        Some(a) => a,
        None => const_ints(cx, arg(u, 1)?).ok_or("Unsqueeze axes that are not constant")?,
    };
    if axes != [axis] {
        return Err(format!(
            "{what} is unsqueezed on axes {axes:?}, not [{axis}]"
        ));
    }
    arg(u, 0)
}

/// `ConstantOfShape(shape)` with the single value `v` (0 when absent): its shape.
fn filled(cx: &Ctx<'_>, name: &str, v: f32, what: &str) -> R<Vec<SymI>> {
    let c = expect(cx, name, "ConstantOfShape", what)?;
    let value = crate::attrs::Attrs::new(c)
        .tensor("value")?
        .map_or(0.0, |t| t.to_f32_vec().first().copied().unwrap_or(f32::NAN));
    if value != v {
        return Err(format!("{what} is filled with {value}, not {v}"));
    }
    match cx.lookup(arg(c, 0)?).map_err(err_text)? {
        Val::Shape(s, false) => Ok(s),
        Val::Const(t, _) => Ok(t
            .to_i64_vec()
            .ok_or("a shape that is not integers")?
            .into_iter()
            .map(SymI::int)
            .collect()),
        _ => Err(format!("the shape of {what} is not known at import")),
    }
}

/// `Shape(x)` (whole): `x`.
fn shape_src<'m>(cx: &Ctx<'m>, name: &'m str, what: &str) -> R<&'m str> {
    let s = expect(cx, name, "Shape", what)?;
    if attr_int(s, "start", 0) != Some(0) || crate::attrs::Attrs::new(s).has("end") {
        return Err(format!("{what} is a part of a shape"));
    }
    arg(s, 0)
}

/// The dimensions of a value, symbolically.
fn dims_of(cx: &Ctx<'_>, name: &str) -> Option<Vec<SymI>> {
    let v = cx.lookup(name).ok()?;
    let ty = cx.ty(&v).ok()?;
    Some(ty.shape.iter().map(crate::ops::dim_sym).collect())
}

/// Checks a `ScatterND` node is the segment sum and returns its operands.
fn segment_sum(cx: &Ctx<'_>, sc: &NodeProto) -> R<Seg> {
    if attr_str(sc, "reduction") != "add" {
        return Err("its reduction is not `add`".into());
    }
    // The bag of each index.
    let bag = unsqueezed(cx, arg(sc, 1)?, 1, "the scatter indices")?;
    let sub = expect(cx, bag, "Sub", "the bag of each index")?;
    if const_f32(cx, arg(sub, 1)?) != Some(1.0) {
        return Err("the bag of each index is not a count minus 1".into());
    }
    let sl = expect(
        cx,
        arg(sub, 0)?,
        "Slice",
        "the count of offsets up to each index",
    )?;
    let (st, en) = (const_ints(cx, arg(sl, 1)?), const_ints(cx, arg(sl, 2)?));
    let axes = sl.input.get(3).and_then(|a| const_ints(cx, a));
    if st.as_deref() != Some(&[0]) || en.as_deref() != Some(&[-1]) || axes.is_some_and(|a| a != [0])
    {
        return Err("the running count is not cut to the indices (`[0:-1]`)".into());
    }
    if sl.input.get(4).is_some_and(|s| !s.is_empty()) {
        return Err("the running count is sliced with steps".into());
    }
    let cs = expect(cx, arg(sl, 0)?, "CumSum", "the running count")?;
    if const_ints(cx, arg(cs, 1)?).as_deref() != Some(&[0])
        || attr_int(cs, "exclusive", 0) != Some(0)
        || attr_int(cs, "reverse", 0) != Some(0)
    {
        return Err("the running count is not an inclusive forward CumSum on axis 0".into());
    }
    let marks = expect(cx, arg(cs, 0)?, "ScatterElements", "the offset marks")?;
    if attr_str(marks, "reduction") != "add" || attr_int(marks, "axis", 0) != Some(0) {
        return Err("the offset marks are not added on axis 0".into());
    }
    let offsets = uncast_int(cx, arg(marks, 1)?);
    let n_off = len_of(cx, &offsets).ok_or("the offsets are not a vector")?;
    if filled(cx, arg(marks, 2)?, 1.0, "the marks' updates")? != [n_off.clone()] {
        return Err("the marks' updates are not one 1 per offset".into());
    }
    let zeros = filled(cx, arg(marks, 0)?, 0.0, "the marks")?;
    // The rows: gathered from a table, maybe weighted.
    let rows = arg(sc, 2)?;
    let (gathered, weights) = match producer(cx, rows).map(op_of) {
        Some("Mul") => {
            let m = expect(cx, rows, "Mul", "the rows")?;
            let (a, b) = (arg(m, 0)?, arg(m, 1)?);
            let is_gather = |x: &str| producer(cx, x).is_some_and(|p| op_of(p) == "Gather");
            let (g, w) = if is_gather(a) { (a, b) } else { (b, a) };
            let w = unsqueezed(cx, w, 1, "the per-sample weights")?;
            (g, Some(w.to_string()))
        }
        _ => (rows, None),
    };
    let g = expect(cx, gathered, "Gather", "the rows")?;
    if attr_int(g, "axis", 0) != Some(0) {
        return Err("the rows are not gathered on axis 0".into());
    }
    let (table, ids) = (arg(g, 0)?, arg(g, 1)?);
    let n_ids = len_of(cx, ids).ok_or("the indices are not a vector")?;
    let n1 = n_ids.add(&SymI::int(1)).ok_or("too many indices")?;
    if zeros != [n1] {
        return Err("the marks are not one per index and one more".into());
    }
    if let Some(w) = &weights
        && len_of(cx, w) != Some(n_ids.clone())
    {
        return Err("the weights are not one per index".into());
    }
    let width = dims_of(cx, table)
        .filter(|d| d.len() == 2)
        .ok_or("the table is not a matrix")?;
    if filled(cx, arg(sc, 0)?, 0.0, "the scatter target")? != [n_off, width[1].clone()] {
        return Err("the scatter target is not zeros [bags, width]".into());
    }
    Ok(Seg {
        table: table.to_string(),
        ids: ids.to_string(),
        offsets,
        weights,
    })
}

/// `name` is `Unsqueeze(Max(Cast(Sub(Concat(offsets[1:], [N]), offsets)), 1), 1)`:
/// each bag's length, at least 1.
fn lengths_of(cx: &Ctx<'_>, name: &str, b: &Seg) -> bool {
    let check = || -> R<()> {
        let mx = unsqueezed(cx, name, 1, "the lengths")?;
        let m = expect(cx, mx, "Max", "the lengths")?;
        if m.input.len() != 2 || const_f32(cx, arg(m, 1)?) != Some(1.0) {
            return Err("not at least 1".into());
        }
        let sub = expect(cx, arg(m, 0)?, "Sub", "the lengths")?;
        if uncast_int(cx, arg(sub, 1)?) != b.offsets {
            return Err("not from the offsets".into());
        }
        let cat = expect(cx, arg(sub, 0)?, "Concat", "the bag ends")?;
        if cat.input.len() != 2 {
            return Err("bag ends of more than two parts".into());
        }
        let tail = expect(cx, arg(cat, 0)?, "Slice", "the bag ends")?;
        let (st, en) = (const_ints(cx, arg(tail, 1)?), const_ints(cx, arg(tail, 2)?));
        if uncast_int(cx, arg(tail, 0)?) != b.offsets
            || st.as_deref() != Some(&[1])
            || !en.is_some_and(|e| e.len() == 1 && e[0] >= i64::from(i32::MAX))
            || tail.input.get(4).is_some_and(|s| !s.is_empty())
        {
            return Err("not offsets[1:]".into());
        }
        let last = arg(cat, 1)?;
        let n_ids = len_of(cx, &b.ids);
        if shape_src(cx, last, "the last end").ok() != Some(b.ids.as_str())
            && (n_ids.is_none() || sym_of(cx, last) != n_ids)
        {
            return Err("the last bag does not end at the number of indices".into());
        }
        Ok(())
    };
    check().is_ok()
}

#[cfg(test)]
mod tests {
    //! The exporter's form of a TorchScript EmbeddingBag re-imports as the fused bag;
    //! the same form with one part changed is refused, naming the part.

    use crate::proto::attribute_proto::AttributeType;
    use crate::proto::{AttributeProto, ModelProto};
    use prost::Message;
    use std::path::Path;

    fn exported() -> ModelProto {
        let case = Path::new(env!("CARGO_MANIFEST_DIR")).join("test_cases/ebag_torchscript");
        let m = crate::load(&case.join("model.onnx")).expect("import");
        let opts = crate::export::ExportOptions::default();
        let bytes = crate::export::export(&m.graph, &m.params, &opts)
            .expect("export")
            .to_bytes()
            .expect("encode");
        ModelProto::decode(bytes.as_slice()).expect("decode")
    }

    fn import(m: &ModelProto) -> crate::Result<crate::Imported> {
        crate::from_bytes(&m.encode_to_vec(), "m.onnx", None)
    }

    /// Sets attribute `name` of the first `op` node (replacing it if present).
    fn set(m: &mut ModelProto, op: &str, a: AttributeProto) {
        let g = m.graph.as_mut().expect("graph");
        let n = g
            .node
            .iter_mut()
            .find(|n| n.op_type.as_deref() == Some(op))
            .expect("the op");
        n.attribute.retain(|x| x.name != a.name);
        n.attribute.push(a);
    }

    fn int(name: &str, v: i64) -> AttributeProto {
        AttributeProto {
            name: Some(name.into()),
            i: Some(v),
            r#type: Some(AttributeType::Int as i32),
            ..Default::default()
        }
    }

    #[test]
    fn segment_sum_reimports_fused_and_a_changed_part_is_named() {
        let m = exported();
        let ops: Vec<&str> = m
            .graph
            .as_ref()
            .expect("graph")
            .node
            .iter()
            .filter_map(|n| n.op_type.as_deref())
            .collect();
        assert!(
            ops.contains(&"ScatterND") && ops.contains(&"CumSum"),
            "{ops:?}"
        );
        let back = import(&m).expect("re-import");
        let bags: Vec<usize> = back
            .graph
            .nodes()
            .iter()
            .filter(|n| n.op.mnemonic() == "embedding_bag")
            .map(|n| n.inputs.len())
            .collect();
        assert_eq!(bags, [3], "one bag with offsets");

        let mut rev = m.clone();
        set(&mut rev, "CumSum", int("reverse", 1));
        let err = import(&rev).expect_err("reverse cumsum").to_string();
        assert!(
            err.contains("ScatterND is supported only as the segment sum")
                && err.contains("not an inclusive forward CumSum"),
            "{err}"
        );
        let mut mul = m.clone();
        let reduction = AttributeProto {
            name: Some("reduction".into()),
            s: Some(b"mul".to_vec()),
            r#type: Some(AttributeType::String as i32),
            ..Default::default()
        };
        set(&mut mul, "ScatterND", reduction);
        let err = import(&mul).expect_err("scatter mul").to_string();
        assert!(
            err.contains("node #") && err.contains("reduction is not `add`"),
            "{err}"
        );
    }
}
