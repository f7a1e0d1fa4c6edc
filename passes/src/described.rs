//! Parameters described by an initializer ([`dlrm_ir::Described`]) through the pass
//! pipeline, without ever creating them.
//!
//! [`compile_values`] runs [`compile_params`] on the *stored* parameters only; the
//! passes leave the described ones alone (the precision pass converts, and autodiff
//! adds accumulators for, only the tensors it is given). Each parameter of the
//! result that has no stored value is then derived from the description it comes
//! from, by the rule of the pass that made it:
//! - the parameter itself, still `f32` and its shape: the same description;
//! - made `bf16` by the precision pass: rounded to nearest ([`Part::Bf16Round`]), or
//!   under Split-SGD-BF16 (a `%<name>.lo` parameter exists) the truncated high half
//!   ([`Part::Bf16High`]);
//! - `%<name>.lo`, bf16: the low 16 bits of the f32 values ([`Part::Bf16Low`]);
//! - `%<name>.acc`, f32 (an Adagrad accumulator): the optimizer's initial
//!   accumulator value ([`Init::Constant`]).
//!
//! A `[n, k]` weight the layout pass blocked (its compiled type `[n/bn, k/bk, bk,
//! bn]`) is described blocked ([`dlrm_ir::Blocking`]: the same values at their
//! blocked places, zero padding), and so are its low half and its accumulator
//! (whose padding is then 0, as the pass blocks it).
//!
//! A parameter given no value at all is left out (as [`compile_params`] leaves it
//! out). A described parameter the passes changed otherwise (reshaped)
//! is an error naming the parameter: a description is only recorded when its values are
//! exactly those the passes would have produced from the created tensor, which
//! `tests/described.rs` checks against [`compile_params`] on the created values.

use crate::pipeline::{PassLog, PipelineOptions, compile_params};
use crate::{Optimizer, PassError, Result};
use dlrm_ir::{Blocking, DType, Described, Graph, Init, ParamValue, Part, Tensor};
use std::collections::{HashMap, HashSet};

/// A compiled graph with its parameters' values (stored or described).
#[derive(Clone, Debug)]
pub struct CompiledValues {
    /// The final graph.
    pub graph: Graph,
    /// Every parameter of the graph, in its order.
    pub params: Vec<(String, ParamValue)>,
    /// What each pass did.
    pub log: PassLog,
}

/// [`compile_params`] for values that may be described (see the module docs).
pub fn compile_values(
    g: Graph,
    values: Vec<(String, ParamValue)>,
    opts: &PipelineOptions,
    on_pass: &mut dyn FnMut(&str, &Graph),
) -> Result<CompiledValues> {
    let mut stored = Vec::new();
    let mut described = HashMap::new();
    for (name, v) in values {
        match v {
            ParamValue::Described(d) => {
                described.insert(name, d);
            }
            v => {
                let t = v.into_tensor(&name).map_err(|source| PassError::Ir {
                    pass: "describe".to_string(),
                    source,
                })?;
                stored.push((name, t));
            }
        }
    }
    let c = compile_params(g, stored, opts, on_pass)?;
    let mut by_name: HashMap<String, Tensor> = c.params.into_iter().collect();
    let acc = match opts.train.map(|t| t.optimizer) {
        Some(Optimizer::Adagrad(a) | Optimizer::RowwiseAdagrad(a)) => {
            Some(a.initial_accumulator_value)
        }
        _ => None,
    };
    let names: HashSet<&str> = c.graph.param_types().map(|(n, _)| n).collect();
    let mut params = Vec::with_capacity(names.len());
    for (name, ty) in c.graph.param_types() {
        if let Some(t) = by_name.remove(name) {
            params.push((name.to_string(), ParamValue::Stored(t)));
            continue;
        }
        let bad = |reason: String| PassError::Graph {
            pass: "describe".to_string(),
            graph: c.graph.name.clone(),
            reason: format!("parameter %{name} ({ty}): {reason}"),
        };
        let shape: Option<Vec<usize>> = ty.shape.iter().map(|d| d.fixed()).collect();
        let shape = shape.ok_or_else(|| bad("a symbolic shape".into()))?;
        // A parameter given no value at all is left out, as compile_params does.
        let Some(d) = derive(name, ty.dtype, &shape, &described, &names, acc) else {
            continue;
        };
        let d = blocked_like(d, &shape);
        if d.shape != shape || d.part.dtype() != ty.dtype {
            return Err(bad(format!(
                "the passes changed it to {ty}, which its description ({}{:?}) cannot give",
                d.part.dtype(),
                d.shape
            )));
        }
        params.push((name.to_string(), ParamValue::Described(d)));
    }
    Ok(CompiledValues {
        graph: c.graph,
        params,
        log: c.log,
    })
}

/// The description of the compiled parameter `name` (see the module docs).
fn derive(
    name: &str,
    dtype: DType,
    shape: &[usize],
    described: &HashMap<String, Described>,
    names: &HashSet<&str>,
    acc: Option<f32>,
) -> Option<Described> {
    if let Some(d) = described.get(name) {
        return match dtype {
            DType::F32 => Some(d.clone()),
            DType::BF16 if names.contains(format!("{name}.lo").as_str()) => {
                Some(d.with_part(Part::Bf16High))
            }
            DType::BF16 => Some(d.with_part(Part::Bf16Round)),
            _ => None,
        };
    }
    if let Some(d) = name.strip_suffix(".lo").and_then(|b| described.get(b))
        && dtype == DType::BF16
    {
        return Some(d.with_part(Part::Bf16Low));
    }
    if let Some(d) = name.strip_suffix(".acc").and_then(|b| described.get(b))
        && dtype == DType::F32
    {
        // A dense accumulator blocked with its weight has the weight's unblocked
        // shape before blocking (its padding is then 0, not the initial value).
        let unblocked = if shape.len() == 4 && d.shape.len() == 2 {
            d.shape.clone()
        } else {
            shape.to_vec()
        };
        return Some(Described {
            init: Init::Constant { value: acc? },
            seed: d.seed,
            stream: d.stream,
            shape: unblocked,
            part: Part::F32,
            blocked: None,
        });
    }
    None
}

/// `d` blocked as the layout pass blocks a `[n, k]` weight into `shape`
/// (`[ceil(n/bn), ceil(k/bk), bk, bn]`: the block sizes are its last two
/// dimensions); `d` unchanged if `shape` is not such a blocking of its shape.
fn blocked_like(d: Described, shape: &[usize]) -> Described {
    let (&[n, k], &[nb, kb, bk, bn]) = (d.shape.as_slice(), shape) else {
        return d;
    };
    if d.blocked.is_some() || bn == 0 || bk == 0 {
        return d;
    }
    let b = Blocking { n, k, bn, bk };
    if b.shape() != [nb, kb, bk, bn] {
        return d;
    }
    Described {
        shape: b.shape(),
        blocked: Some(b),
        ..d
    }
}
