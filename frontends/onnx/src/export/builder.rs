//! The ONNX graph under construction: nodes, initializers, unique tensor names and
//! the runtime values of symbolic dimensions.
//!
//! Initializers are kept as [`Init`]s (name, dims, borrowed or owned data) until the
//! model is written, so that large tables can go to an external data file without
//! first being copied into the protobuf.

use crate::proto::{
    AttributeProto, NodeProto, TensorProto, attribute_proto::AttributeType, tensor_proto::DataType,
};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

/// The data of an initializer (little-endian when written).
#[derive(Clone, Debug)]
pub(crate) enum InitData<'a> {
    /// float elements.
    F32(Cow<'a, [f32]>),
    /// int64 elements.
    I64(Vec<i64>),
    /// int32 elements.
    I32(Cow<'a, [i32]>),
    /// uint8 elements.
    U8(Cow<'a, [u8]>),
}

impl InitData<'_> {
    /// The ONNX element type.
    pub(crate) fn onnx_type(&self) -> DataType {
        match self {
            InitData::F32(_) => DataType::Float,
            InitData::I64(_) => DataType::Int64,
            InitData::I32(_) => DataType::Int32,
            InitData::U8(_) => DataType::Uint8,
        }
    }

    /// Bytes once written.
    pub(crate) fn byte_len(&self) -> usize {
        match self {
            InitData::F32(v) => v.len() * 4,
            InitData::I64(v) => v.len() * 8,
            InitData::I32(v) => v.len() * 4,
            InitData::U8(v) => v.len(),
        }
    }

    /// Appends the little-endian bytes to `out`.
    pub(crate) fn write_le(&self, out: &mut Vec<u8>) {
        out.reserve(self.byte_len());
        match self {
            InitData::F32(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            InitData::I64(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            InitData::I32(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            InitData::U8(v) => out.extend_from_slice(v),
        }
    }
}

/// An initializer waiting to be written.
#[derive(Clone, Debug)]
pub(crate) struct Init<'a> {
    /// Tensor name.
    pub name: String,
    /// Dimensions.
    pub dims: Vec<i64>,
    /// Elements.
    pub data: InitData<'a>,
}

impl Init<'_> {
    /// The tensor proto without its data (dims, type, name).
    pub(crate) fn header(&self) -> TensorProto {
        TensorProto {
            name: Some(self.name.clone()),
            dims: self.dims.clone(),
            data_type: Some(self.data.onnx_type() as i32),
            ..Default::default()
        }
    }

    /// The tensor proto with its data inline (`raw_data`).
    pub(crate) fn inline(&self) -> TensorProto {
        let mut raw = Vec::new();
        self.data.write_le(&mut raw);
        TensorProto {
            raw_data: Some(raw),
            ..self.header()
        }
    }
}

/// An attribute value.
pub(crate) enum A {
    /// `i`.
    Int(i64),
    /// `ints`.
    Ints(Vec<i64>),
    /// `f`.
    Float(f32),
    /// `floats`.
    Floats(Vec<f32>),
    /// `s`.
    Str(&'static str),
    /// `s`, owned (a module op's attribute).
    Text(String),
    /// `t`: a one-element tensor (ConstantOfShape's `value`).
    Tensor(Box<TensorProto>),
}

/// Builds `name = value`.
fn attr(name: &str, value: A) -> AttributeProto {
    let mut a = AttributeProto {
        name: Some(name.to_string()),
        ..Default::default()
    };
    match value {
        A::Int(i) => {
            a.i = Some(i);
            a.r#type = Some(AttributeType::Int as i32);
        }
        A::Ints(v) => {
            a.ints = v;
            a.r#type = Some(AttributeType::Ints as i32);
        }
        A::Float(f) => {
            a.f = Some(f);
            a.r#type = Some(AttributeType::Float as i32);
        }
        A::Floats(v) => {
            a.floats = v;
            a.r#type = Some(AttributeType::Floats as i32);
        }
        A::Str(s) => {
            a.s = Some(s.as_bytes().to_vec());
            a.r#type = Some(AttributeType::String as i32);
        }
        A::Text(s) => {
            a.s = Some(s.into_bytes());
            a.r#type = Some(AttributeType::String as i32);
        }
        A::Tensor(t) => {
            a.t = Some(*t);
            a.r#type = Some(AttributeType::Tensor as i32);
        }
    }
    a
}

/// A one-element float tensor (ConstantOfShape's `value`).
pub(crate) fn scalar_f32_tensor(v: f32) -> Box<TensorProto> {
    Box::new(TensorProto {
        dims: vec![1],
        data_type: Some(DataType::Float as i32),
        raw_data: Some(v.to_le_bytes().to_vec()),
        ..Default::default()
    })
}

/// The ONNX graph being built.
pub(crate) struct Builder<'a> {
    /// Nodes in execution order.
    pub nodes: Vec<NodeProto>,
    /// Initializers in creation order.
    pub inits: Vec<Init<'a>>,
    /// The default-domain opset written.
    pub opset: i64,
    taken: HashSet<String>,
    /// Small integer constants already made, by value (shared).
    consts: HashMap<Vec<i64>, String>,
    /// For each dimension symbol: a graph input and axis that carries it.
    sym_source: HashMap<String, (String, usize)>,
    /// For each symbol already asked for: the `[1]` int64 tensor of its value.
    sym_value: HashMap<String, String>,
}

impl<'a> Builder<'a> {
    /// An empty graph for `opset`.
    pub(crate) fn new(opset: i64) -> Self {
        Builder {
            nodes: Vec::new(),
            inits: Vec::new(),
            opset,
            taken: HashSet::new(),
            consts: HashMap::new(),
            sym_source: HashMap::new(),
            sym_value: HashMap::new(),
        }
    }

    /// Claims `name` exactly; false if it is already taken.
    pub(crate) fn claim(&mut self, name: &str) -> bool {
        self.taken.insert(name.to_string())
    }

    /// A tensor name not used yet: `hint`, or `hint_1`, `hint_2`, ...
    pub(crate) fn fresh(&mut self, hint: &str) -> String {
        if self.taken.insert(hint.to_string()) {
            return hint.to_string();
        }
        let mut k = 1usize;
        loop {
            let cand = format!("{hint}_{k}");
            if self.taken.insert(cand.clone()) {
                return cand;
            }
            k += 1;
        }
    }

    /// Records that graph input `input` carries symbol `sym` on `axis` (the first
    /// record of a symbol wins).
    pub(crate) fn note_symbol(&mut self, sym: &str, input: &str, axis: usize) {
        self.sym_source
            .entry(sym.to_string())
            .or_insert_with(|| (input.to_string(), axis));
    }

    /// Adds a node with `n_out` fresh outputs named after `hint`; returns them.
    pub(crate) fn node_n(
        &mut self,
        op: &str,
        inputs: &[&str],
        attrs: Vec<(&str, A)>,
        hint: &str,
        n_out: usize,
    ) -> Vec<String> {
        let outs: Vec<String> = (0..n_out)
            .map(|k| {
                if n_out == 1 {
                    self.fresh(hint)
                } else {
                    self.fresh(&format!("{hint}.{k}"))
                }
            })
            .collect();
        self.push(op, inputs, attrs, &outs);
        outs
    }

    /// [`Builder::node_n`] of op `op` in `domain` (the default domain when
    /// empty).
    pub(crate) fn node_in(
        &mut self,
        domain: &str,
        op: &str,
        inputs: &[&str],
        attrs: Vec<(&str, A)>,
        hint: &str,
        n_out: usize,
    ) -> Vec<String> {
        let outs = self.node_n(op, inputs, attrs, hint, n_out);
        if let (false, Some(n)) = (domain.is_empty(), self.nodes.last_mut()) {
            n.domain = Some(domain.to_string());
        }
        outs
    }

    /// Adds a node whose outputs are exactly `outs` (already claimed).
    pub(crate) fn push(
        &mut self,
        op: &str,
        inputs: &[&str],
        attrs: Vec<(&str, A)>,
        outs: &[String],
    ) {
        let name = format!("{}#{}", op, self.nodes.len());
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outs.to_vec(),
            name: Some(name),
            op_type: Some(op.to_string()),
            attribute: attrs.into_iter().map(|(n, v)| attr(n, v)).collect(),
            ..Default::default()
        });
    }

    /// Adds a one-output node; returns its output.
    pub(crate) fn node(
        &mut self,
        op: &str,
        inputs: &[&str],
        attrs: Vec<(&str, A)>,
        hint: &str,
    ) -> String {
        let mut outs = self.node_n(op, inputs, attrs, hint, 1);
        outs.pop().unwrap_or_default()
    }

    /// Adds an initializer named after `hint`; returns its name.
    pub(crate) fn init(&mut self, hint: &str, dims: &[usize], data: InitData<'a>) -> String {
        let name = self.fresh(hint);
        self.inits.push(Init {
            name: name.clone(),
            dims: dims.iter().map(|&d| d as i64).collect(),
            data,
        });
        name
    }

    /// A 1-D int64 constant (shared between uses).
    pub(crate) fn ints(&mut self, v: &[i64]) -> String {
        if let Some(n) = self.consts.get(v) {
            return n.clone();
        }
        let n = self.init("const_i64", &[v.len()], InitData::I64(v.to_vec()));
        self.consts.insert(v.to_vec(), n.clone());
        n
    }

    /// A float scalar constant.
    pub(crate) fn float(&mut self, v: f32) -> String {
        self.init("const_f32", &[], InitData::F32(Cow::Owned(vec![v])))
    }

    /// The `[1]` int64 tensor holding the runtime value of symbol `sym`, or `None`
    /// when no graph input carries it.
    pub(crate) fn symbol(&mut self, sym: &str) -> Option<String> {
        if let Some(n) = self.sym_value.get(sym) {
            return Some(n.clone());
        }
        let (input, axis) = self.sym_source.get(sym)?.clone();
        let n = self.node(
            "Shape",
            &[&input],
            vec![
                ("start", A::Int(axis as i64)),
                ("end", A::Int(axis as i64 + 1)),
            ],
            &format!("dim_{sym}"),
        );
        self.sym_value.insert(sym.to_string(), n.clone());
        Some(n)
    }
}
