//! The import context: ONNX value names mapped to IR values, constants and symbolic
//! shape vectors; initializers materialised as parameters on first use; constant
//! folding through the reference interpreter; graph inputs and outputs.
//!
//! Invariants:
//! - nodes are imported in file order (ONNX requires a topological order);
//! - a node that fails to import does not stop the import at once: its outputs
//!   become `Failed` and the error is reported, naming that node, when the value is
//!   used (so dead code and the helper nodes of a recognised `Loop` cost nothing);
//! - an operation whose operands are all small constants is evaluated at import
//!   (shape arithmetic, `Range`, folded initializer transposes);
//! - dimension symbols: the batch `dim_param` becomes `B`; other named dims keep
//!   their (sanitised) name; unnamed ones get `N0`, `N1`, ...

use crate::attrs::Attrs;
use crate::error::{OnnxError, Result};
use crate::proto::{
    GraphProto, NodeProto, ValueInfoProto, tensor_proto::DataType, tensor_shape_proto, type_proto,
};
use crate::tensor::{dtype_of, read_tensor};
use dlrm_ir::interp::{EvalCtx, eval_op};
use dlrm_ir::{DType, Dim, Graph, Op, SingleRank, Tensor, TensorType, ValueId};
use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;

/// Largest constant folded at import (elements of all operands together).
const FOLD_LIMIT: usize = 1 << 16;

/// What an ONNX value name stands for during import.
#[derive(Clone, Debug)]
pub(crate) enum Val {
    /// An IR value.
    Ir(ValueId),
    /// A constant (initializer, `Constant` node or folded); `name` is the ONNX name,
    /// used for the parameter it becomes when used as a tensor operand.
    Const(Rc<Tensor>, String),
    /// A 1-D (or scalar, when `scalar`) i64 vector whose entries may be symbolic:
    /// the result of `Shape` on a value with a dynamic batch, and what is computed
    /// from it (`Gather`, `Concat`, `Unsqueeze`, `Slice`, `Cast`).
    Shape(Vec<SymI>, bool),
    /// The producing node failed; the error is reported on use.
    Failed(Rc<OnnxError>),
}

pub(crate) use crate::sym::SymI;

/// One node being imported: its proto, index and attributes.
pub(crate) struct NodeCx<'a> {
    pub(crate) proto: &'a NodeProto,
    pub(crate) index: usize,
    pub(crate) attrs: Attrs<'a>,
}

impl NodeCx<'_> {
    pub(crate) fn op_type(&self) -> &str {
        self.proto.op_type.as_deref().unwrap_or("")
    }
    /// The node's name, or its first output's when unnamed.
    pub(crate) fn name(&self) -> String {
        match self.proto.name.as_deref() {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => self.proto.output.first().cloned().unwrap_or_default(),
        }
    }
    pub(crate) fn n_inputs(&self) -> usize {
        self.proto.input.len()
    }
    /// Output name `k` (as a name hint).
    pub(crate) fn out_name(&self, k: usize) -> String {
        sanitize(self.proto.output.get(k).map_or("v", String::as_str))
    }
}

/// Makes an ONNX name usable as an IR value name.
pub(crate) fn sanitize(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    match s.chars().next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => s,
        _ => format!("v{s}"),
    }
}

/// The importer's state.
pub(crate) struct Ctx<'m> {
    pub(crate) origin: String,
    pub(crate) g: Graph,
    pub(crate) params: Vec<(String, Tensor)>,
    vals: HashMap<String, Val>,
    /// Constants already made parameters, by the address of their shared tensor
    /// (the map keeps the tensor alive, so an address is never reused).
    materialised: HashMap<*const Tensor, (Rc<Tensor>, ValueId)>,
    pub(crate) graph: &'m GraphProto,
    batch_param: Option<String>,
    unnamed: usize,
    /// The model's opset of each domain it imports (`ai.onnx` as `""`).
    opsets: HashMap<String, i64>,
}

impl<'m> Ctx<'m> {
    /// The import of `graph`, a graph of a model importing `opsets` (domain,
    /// version).
    pub(crate) fn new(origin: String, graph: &'m GraphProto, opsets: &[(&str, i64)]) -> Self {
        Ctx {
            origin,
            g: Graph::new(sanitize(graph.name.as_deref().unwrap_or("onnx"))),
            params: Vec::new(),
            vals: HashMap::new(),
            materialised: HashMap::new(),
            graph,
            batch_param: None,
            unnamed: 0,
            opsets: opsets
                .iter()
                .map(|&(d, v)| (normal_domain(d).to_string(), v))
                .collect(),
        }
    }

    /// The model's opset of `domain` (0 when it imports none).
    pub(crate) fn opset(&self, domain: &str) -> i64 {
        self.opsets.get(normal_domain(domain)).copied().unwrap_or(0)
    }

    fn model_err(&self, reason: String) -> OnnxError {
        OnnxError::Model {
            origin: self.origin.clone(),
            reason,
        }
    }

    /// Reads the initializers and the graph inputs.
    pub(crate) fn read_inputs(&mut self, base: Option<&Path>) -> Result<()> {
        for t in &self.graph.initializer {
            let name = t.name.clone().unwrap_or_default();
            let tensor = read_tensor(t, base).map_err(|reason| OnnxError::Tensor {
                origin: self.origin.clone(),
                tensor: name.clone(),
                reason,
            })?;
            self.vals
                .insert(name.clone(), Val::Const(Rc::new(tensor), name));
        }
        // The batch symbol: dim 0 of the first output, else of the first input of
        // rank >= 2, when symbolic.
        let dim0_param = |vi: &ValueInfoProto| -> Option<(String, usize)> {
            let (dims, _) = tensor_dims(vi)?;
            match dims.first()?.value.as_ref()? {
                tensor_shape_proto::dimension::Value::DimParam(p) => Some((p.clone(), dims.len())),
                _ => None,
            }
        };
        self.batch_param = self
            .graph
            .output
            .first()
            .and_then(dim0_param)
            .map(|(p, _)| p)
            .or_else(|| {
                self.graph
                    .input
                    .iter()
                    .filter_map(dim0_param)
                    .find(|(_, r)| *r >= 2)
                    .map(|(p, _)| p)
            });
        for vi in &self.graph.input {
            let name = vi.name.clone().unwrap_or_default();
            if self.vals.contains_key(&name) {
                continue; // an initializer listed as an input (IR version < 4)
            }
            let ty = self.value_type(vi)?;
            let id = self
                .g
                .add_input(&sanitize(&name), ty)
                .map_err(|e| self.model_err(format!("input `{name}`: {e}")))?;
            self.vals.insert(name, Val::Ir(id));
        }
        Ok(())
    }

    /// The IR type of a graph input.
    fn value_type(&mut self, vi: &ValueInfoProto) -> Result<TensorType> {
        let name = vi.name.as_deref().unwrap_or("");
        let err = |r: String| OnnxError::Model {
            origin: self.origin.clone(),
            reason: format!("graph input `{name}`: {r}"),
        };
        let Some((dims, elem)) = tensor_dims(vi) else {
            return Err(err("needs a tensor type with a shape".into()));
        };
        let dtype = dtype_of(elem).map_err(err)?;
        let mut shape = Vec::with_capacity(dims.len());
        for (k, d) in dims.iter().enumerate() {
            use tensor_shape_proto::dimension::Value as V;
            shape.push(match &d.value {
                Some(V::DimValue(v)) if *v > 0 => Dim::Fixed(*v as usize),
                Some(V::DimParam(p)) if Some(p) == self.batch_param.as_ref() => Dim::batch(),
                Some(V::DimParam(p)) if !p.is_empty() => {
                    // Symbols are identifiers in the text form: no `.`; `B` and `G`
                    // are dlrmc's own.
                    let batch = self.batch_param.clone();
                    let name = |p: &str| {
                        let s = sanitize(p).replace('.', "_");
                        if Some(p) == batch.as_deref() {
                            Dim::BATCH.to_string()
                        } else if s == Dim::BATCH || s == Dim::GLOBAL {
                            format!("{s}_")
                        } else {
                            s
                        }
                    };
                    // An expression such as dynamo's `s32 + 1` (offsets with a last
                    // one) is a dimension expression; anything else names a symbol.
                    match SymI::parse(p, &name)
                        .filter(|e| e.as_sym().is_none())
                        .and_then(|e| e.to_dim_expr())
                        .and_then(Dim::from_expr)
                    {
                        Some(d) => d,
                        None => Dim::Sym(name(p)),
                    }
                }
                _ if k == 0 && dims.len() >= 2 && self.batch_param.is_none() => Dim::batch(),
                _ => {
                    self.unnamed += 1;
                    Dim::Sym(format!("N{}", self.unnamed - 1))
                }
            });
        }
        Ok(TensorType::new(dtype, shape))
    }

    /// Marks the graph outputs.
    pub(crate) fn set_outputs(&mut self) -> Result<Vec<String>> {
        let mut names = Vec::new();
        for vi in &self.graph.output {
            let name = vi.name.clone().unwrap_or_default();
            let v = self.lookup(&name).map_err(|e| match e {
                NodeErr::Failed(e) => e,
                NodeErr::Msg(m) => self.model_err(format!("graph output `{name}`: {m}")),
            })?;
            let id = match v {
                Val::Ir(id) => id,
                other => self
                    .tensor(&other)
                    .map_err(|m| self.model_err(format!("graph output `{name}`: {m}")))?,
            };
            self.check_output_type(vi, id)?;
            // Outputs carry their ONNX names (an aliased value, e.g. through
            // `Identity`, gets a no-op reshape under the output's name).
            let want = sanitize(&name);
            let id = if self.g.name_of(id) != want && self.g.find(&want).is_none() {
                let shape = self.g.ty(id).shape.clone();
                self.g
                    .add(Op::Reshape { shape }, &[id], &want)
                    .map_err(|e| self.model_err(format!("graph output `{name}`: {e}")))?
            } else {
                id
            };
            self.g.add_output(id);
            names.push(self.g.name_of(id).to_string());
        }
        Ok(names)
    }

    /// Refuses a graph output whose declared element type is not the one the graph
    /// computes (an int64 output computed as float would be served as float).
    fn check_output_type(&self, vi: &ValueInfoProto, id: ValueId) -> Result<()> {
        let Some((_, elem)) = tensor_dims(vi) else {
            return Ok(());
        };
        let name = vi.name.as_deref().unwrap_or("");
        let declared =
            dtype_of(elem).map_err(|m| self.model_err(format!("graph output `{name}`: {m}")))?;
        let computed = self.g.ty(id).dtype;
        if declared != computed {
            let onnx = DataType::try_from(elem).map_or("?", |d| d.as_str_name());
            return Err(self.model_err(format!(
                "graph output `{name}` is declared {onnx} ({declared}) but the graph computes it \
                 as {computed}"
            )));
        }
        Ok(())
    }

    /// The value bound to an ONNX name.
    pub(crate) fn lookup(&self, name: &str) -> Result<Val, NodeErr> {
        match self.vals.get(name) {
            Some(Val::Failed(e)) => Err(NodeErr::Failed(clone_err(e))),
            Some(v) => Ok(v.clone()),
            None => Err(NodeErr::Msg(format!(
                "input `{name}` is not defined before this node"
            ))),
        }
    }

    /// Operand `k` of a node (`None` when absent or given as the empty name).
    pub(crate) fn opt_input(&self, n: &NodeCx<'_>, k: usize) -> Result<Option<Val>, NodeErr> {
        match n.proto.input.get(k).map(String::as_str) {
            None | Some("") => Ok(None),
            Some(name) => self.lookup(name).map(Some),
        }
    }

    /// Operand `k` of a node, required.
    pub(crate) fn input(&self, n: &NodeCx<'_>, k: usize) -> Result<Val, NodeErr> {
        self.opt_input(n, k)?
            .ok_or_else(|| NodeErr::Msg(format!("missing operand {k}")))
    }

    /// True when `name` is already a graph input, an initializer or a node's output.
    pub(crate) fn is_bound(&self, name: &str) -> bool {
        self.vals.contains_key(name)
    }

    /// Binds an output name.
    pub(crate) fn bind(&mut self, name: &str, v: Val) {
        if !name.is_empty() {
            self.vals.insert(name.to_string(), v);
        }
    }

    /// The IR type of a value.
    pub(crate) fn ty(&self, v: &Val) -> Result<TensorType, String> {
        Ok(match v {
            Val::Ir(id) => self.g.ty(*id).clone(),
            Val::Const(t, _) => TensorType::new(t.dtype(), t.shape.iter().map(|&d| Dim::Fixed(d))),
            Val::Shape(d, scalar) => TensorType::new(
                DType::I64,
                if *scalar {
                    vec![]
                } else {
                    vec![Dim::Fixed(d.len())]
                },
            ),
            Val::Failed(e) => return Err(e.to_string()),
        })
    }

    /// Makes the dimensions `a` and `b` equal when the model says they are (an ONNX
    /// `Concat` needs equal sizes off its axis, so `n - 1 == B` at every run): a
    /// symbol other than `B` and `G` that occurs in `a - b` once, to the first power
    /// with coefficient ±1, is replaced everywhere by its solution (`n := B+1`).
    /// Returns whether `a` and `b` are now equal.
    pub(crate) fn unify(&mut self, a: &Dim, b: &Dim) -> bool {
        if a == b {
            return true;
        }
        let Some(diff) = a.to_expr().sub(&b.to_expr()) else {
            return false;
        };
        let solved = diff
            .symbols()
            .into_iter()
            .filter(|s| *s != Dim::BATCH && *s != Dim::GLOBAL)
            .find_map(|s| Some((s.to_string(), diff.solve_for(s)?)));
        let Some((s, by)) = solved else {
            return false;
        };
        if self.g.substitute(&s, &by).is_err() {
            return false;
        }
        let Some(by_i) = SymI::from_dim_expr(&by) else {
            return true;
        };
        for v in self.vals.values_mut() {
            if let Val::Shape(d, _) = v {
                for x in d.iter_mut() {
                    if let Some(y) = x.substitute(&s, &by_i) {
                        *x = y;
                    }
                }
            }
        }
        true
    }

    /// The value as an IR operand (constants become parameters, once per name).
    pub(crate) fn tensor(&mut self, v: &Val) -> Result<ValueId, String> {
        match v {
            Val::Ir(id) => Ok(*id),
            Val::Const(t, name) => {
                let key = Rc::as_ptr(t);
                if let Some((_, id)) = self.materialised.get(&key) {
                    let id = *id;
                    return Ok(id);
                }
                let ty = self.ty(v)?;
                let pname = self.g.fresh_name(&sanitize(name));
                let id = self.g.add_param(&pname, ty).map_err(|e| e.to_string())?;
                self.params.push((pname, (**t).clone()));
                self.materialised.insert(key, (t.clone(), id));
                Ok(id)
            }
            Val::Shape(..) => Err(
                "a shape that depends on the dynamic batch is used as data (unsupported)".into(),
            ),
            Val::Failed(e) => Err(e.to_string()),
        }
    }

    /// The constant behind a value, if it is one.
    pub(crate) fn konst<'v>(&self, v: &'v Val) -> Option<&'v Tensor> {
        match v {
            Val::Const(t, _) => Some(t),
            _ => None,
        }
    }

    /// A constant integer vector (an attribute given as an input).
    pub(crate) fn const_ints(&self, v: &Val, what: &str) -> Result<Vec<i64>, String> {
        self.konst(v)
            .and_then(Tensor::to_i64_vec)
            .ok_or_else(|| format!("{what} must be a constant integer tensor"))
    }

    /// Adds `op` on `ins`: folded when every operand is a small constant.
    pub(crate) fn emit(&mut self, op: Op, ins: &[Val], hint: &str) -> Result<Val, String> {
        let consts: Option<Vec<&Tensor>> = ins.iter().map(|v| self.konst(v)).collect();
        if let Some(cs) = consts {
            let total: usize = cs.iter().map(|t| t.numel()).sum();
            if total <= FOLD_LIMIT {
                let tys: Vec<TensorType> =
                    ins.iter().map(|v| self.ty(v)).collect::<Result<_, _>>()?;
                let refs: Vec<&TensorType> = tys.iter().collect();
                let out = dlrm_ir::infer(&op, &refs, &[])?;
                let small = out
                    .iter()
                    .all(|t| t.fixed_numel().is_some_and(|n| n <= 4 * FOLD_LIMIT));
                if !small {
                    return self.emit_node(op, ins, hint);
                }
                let syms = HashMap::new();
                let ctx = EvalCtx {
                    syms: &syms,
                    comm: &SingleRank,
                };
                let mut r = eval_op(&op, &cs, &out, &ctx)?;
                if r.len() == 1
                    && let Some(t) = r.pop()
                {
                    return Ok(Val::Const(Rc::new(t), hint.to_string()));
                }
            }
        }
        self.emit_node(op, ins, hint)
    }

    /// Adds `op` on `ins` with one result per name of `names` ([`Ctx::emit`]
    /// for one result: folded when its operands are small constants).
    pub(crate) fn emit_all(
        &mut self,
        op: Op,
        ins: &[Val],
        names: &[String],
    ) -> Result<Vec<Val>, String> {
        if let [name] = names {
            return Ok(vec![self.emit(op, ins, name)?]);
        }
        let ids: Vec<ValueId> = ins
            .iter()
            .map(|v| self.tensor(v))
            .collect::<Result<_, _>>()?;
        let hints: Vec<&str> = names.iter().map(String::as_str).collect();
        let outs = self.g.add_node(op, &ids, &hints).map_err(node_reason)?;
        Ok(outs.into_iter().map(Val::Ir).collect())
    }

    /// Adds `op` as an IR node (constants become parameters).
    fn emit_node(&mut self, op: Op, ins: &[Val], hint: &str) -> Result<Val, String> {
        let ids: Vec<ValueId> = ins
            .iter()
            .map(|v| self.tensor(v))
            .collect::<Result<_, _>>()?;
        let id = self.g.add(op, &ids, hint).map_err(node_reason)?;
        Ok(Val::Ir(id))
    }

    /// Wraps a builder error with the node.
    pub(crate) fn node_err(&self, n: &NodeCx<'_>, reason: String) -> OnnxError {
        let op = match n.proto.domain.as_deref() {
            None | Some("") | Some("ai.onnx") => n.op_type().to_string(),
            Some(d) => format!("{d}::{}", n.op_type()),
        };
        OnnxError::Node {
            origin: self.origin.clone(),
            index: n.index,
            name: n.name(),
            op,
            reason,
        }
    }
}

/// The reason of an error adding a node (the importer names the node itself).
fn node_reason(e: dlrm_ir::IrError) -> String {
    match e {
        dlrm_ir::IrError::Node { reason, .. } => reason,
        other => other.to_string(),
    }
}

/// The default domain `ai.onnx` as the empty string; other domains as given.
pub(crate) fn normal_domain(domain: &str) -> &str {
    if domain == "ai.onnx" { "" } else { domain }
}

/// A builder's failure: its own message, or the error of a failed operand.
#[derive(Debug)]
pub(crate) enum NodeErr {
    /// What is wrong with this node.
    Msg(String),
    /// An operand's producer failed (reported as is).
    Failed(OnnxError),
}

impl From<String> for NodeErr {
    fn from(s: String) -> Self {
        NodeErr::Msg(s)
    }
}

impl From<&str> for NodeErr {
    fn from(s: &str) -> Self {
        NodeErr::Msg(s.to_string())
    }
}

fn clone_err(e: &OnnxError) -> OnnxError {
    match e {
        OnnxError::Node {
            origin,
            index,
            name,
            op,
            reason,
        } => OnnxError::Node {
            origin: origin.clone(),
            index: *index,
            name: name.clone(),
            op: op.clone(),
            reason: reason.clone(),
        },
        other => OnnxError::Model {
            origin: String::new(),
            reason: other.to_string(),
        },
    }
}

/// The dims and element type of a tensor-typed value info.
fn tensor_dims(vi: &ValueInfoProto) -> Option<(&[tensor_shape_proto::Dimension], i32)> {
    match vi.r#type.as_ref()?.value.as_ref()? {
        type_proto::Value::TensorType(t) => {
            Some((t.shape.as_ref()?.dim.as_slice(), t.elem_type.unwrap_or(0)))
        }
        _ => None,
    }
}
