//! ONNX export: an IR inference graph and its parameter values as a standard ONNX
//! model that ONNX Runtime runs (and this crate's importer reads back).
//!
//! The entry points take a `(Graph, parameters)` pair, whatever it comes from (a
//! plan, a checkpoint): [`export`] builds the model, [`Exported::to_bytes`] encodes
//! it with every initializer inline, [`Exported::write`] writes a `.onnx` file
//! atomically (temporary file, fsync, rename), its initializers in an external data
//! file `<model>.data` beside it when the model would pass the 2 GB protobuf limit
//! (or when [`ExportOptions::external_data`] asks).
//!
//! The mapping, op by op (see `lower.rs`):
//! - `brgemm` (blocked weights un-blocked to `[N,K]`, the layout pass's definition)
//!   and `linear`: `Gemm(transB=1)` then `Relu`/`Sigmoid` for the fused epilogue;
//!   `block_act`/`unblock_act` only move elements, so they vanish (a `Slice` drops
//!   padding when `k` is smaller);
//! - `embedding_bag` with `[S,L]` indices: `Gather` + `ReduceSum`/`ReduceMean` over
//!   axis 1; with offsets (and `embedding_bag_weighted`): `Gather` of the rows, the
//!   bag of each index from `CumSum` of `ScatterElements(add)` marks at the
//!   offsets, the rows added into their bag by `ScatterND(reduction=add)`, no `Loop`
//!   (needs opset 16);
//! - `interaction` dot: `Concat` + `Reshape[-1,F,D]`, `MatMul` by its `Transpose`,
//!   the lower triangle `Gather`ed flat from `Z[-1,F·F]` in the IR's row-major
//!   order, `Concat` after the dense vector (PyTorch's export of the reference
//!   DLRM, which the importer's `canon` pass turns back into `interaction`);
//!   `cat`: `Concat`;
//! - the generic ops of imported models map to their ONNX namesakes;
//! - a module op (`dlrm_ir::ops`) is its native ONNX node from the opset that
//!   has it (`OpModule::onnx`, `lower/modules.rs`: `gelu` is `Gelu` from 20),
//!   else its decomposition into the ops above, with its constants as
//!   initializers (an int8 bag is lowered as a bag).
//!
//! Precision: floats are f32 in the model. bf16 parameters are widened exactly
//! (the model is twice their size); where the IR rounds a result to bf16 the model
//! has `Cast(BFLOAT16)` + `Cast(FLOAT)`, so it computes what `dlrm-run` computes.
//! The batch dimension `B` is the symbolic dimension [`ExportOptions::batch`]; other
//! IR symbols keep their names. An op with no ONNX form here (training, optimizer,
//! collective or sharded ops) is an error naming the node and op.

mod builder;
mod lower;
mod patterns;
mod write;

use crate::error::{OnnxError, Result};
use crate::proto::{
    ModelProto, OperatorSetIdProto, TensorShapeProto, TypeProto, ValueInfoProto,
    tensor_shape_proto::{Dimension, dimension},
    type_proto,
};
use builder::{Builder, Init, InitData};
use dlrm_ir::module::ModOp;
use dlrm_ir::{Def, Dim, Graph, Op, Tensor};
use lower::{Lower, Repr, onnx_elem};
use std::path::Path;

pub use write::ExportSummary;

/// The opset written by default (the importer's best-tested one; PyTorch's dynamo
/// exporter writes it too).
pub const DEFAULT_OPSET: i64 = 18;
/// The oldest opset the exporter writes (`ScatterND`/`ScatterElements` with
/// `reduction=add` need 16).
pub const MIN_EXPORT_OPSET: i64 = 16;
/// The newest opset the exporter writes.
pub const MAX_EXPORT_OPSET: i64 = 21;

/// Protobuf messages cannot exceed 2 GiB; above this many bytes of initializers
/// they go to an external data file.
pub const EXTERNAL_DATA_THRESHOLD: u64 = (1 << 31) - (64 << 20);

/// Options of an export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportOptions {
    /// The default-domain opset written (16 to 21).
    pub opset: i64,
    /// The name of the symbolic batch dimension (`dim_param`) of the inputs and outputs.
    pub batch: String,
    /// Write the initializers to an external data file even when the model fits in
    /// one protobuf.
    pub external_data: bool,
}

impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions {
            opset: DEFAULT_OPSET,
            batch: "batch".into(),
            external_data: false,
        }
    }
}

/// An exported model, ready to be encoded or written.
pub struct Exported<'a> {
    model: ModelProto,
    inits: Vec<Init<'a>>,
    external: bool,
}

impl Exported<'_> {
    /// The number of ONNX nodes.
    pub fn node_count(&self) -> usize {
        self.model.graph.as_ref().map_or(0, |g| g.node.len())
    }

    /// Bytes of initializer data.
    pub fn initializer_bytes(&self) -> u64 {
        self.inits.iter().map(|i| i.data.byte_len() as u64).sum()
    }

    /// True when [`Exported::write`] puts the initializers in an external file.
    pub fn uses_external_data(&self) -> bool {
        self.external
    }

    /// The model with every initializer inline (for models under 2 GB).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        if self.initializer_bytes() > EXTERNAL_DATA_THRESHOLD {
            return Err(export_err(format!(
                "{} bytes of parameters do not fit in one protobuf (2 GB): write the model \
                 to a file, with external data",
                self.initializer_bytes()
            )));
        }
        Ok(write::inline_bytes(&self.model, &self.inits))
    }

    /// Writes the model to `path` atomically; with external data, the initializers
    /// go to `<file name>.data` beside it (written first, also atomically).
    pub fn write(&self, path: &Path) -> Result<ExportSummary> {
        write::write(&self.model, &self.inits, self.external, path)
    }
}

fn export_err(reason: String) -> OnnxError {
    OnnxError::Export { reason }
}

fn value_info(name: &str, g: &Graph, v: dlrm_ir::ValueId, batch: &str) -> ValueInfoProto {
    let ty = g.ty(v);
    let dim = |d: &Dim| Dimension {
        value: Some(match d {
            Dim::Fixed(n) => dimension::Value::DimValue(*n as i64),
            Dim::Sym(s) if s == Dim::BATCH => dimension::Value::DimParam(batch.to_string()),
            Dim::Sym(s) => dimension::Value::DimParam(s.clone()),
            // `B+1` is written with the batch's own name, as exporters do.
            Dim::Expr(e) => dimension::Value::DimParam(
                e.substitute(Dim::BATCH, &dlrm_ir::DimExpr::sym(batch))
                    .unwrap_or_else(|| e.clone())
                    .to_string(),
            ),
        }),
        ..Default::default()
    };
    ValueInfoProto {
        name: Some(name.to_string()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(onnx_elem(ty.dtype) as i32),
                shape: Some(TensorShapeProto {
                    dim: ty.shape.iter().map(dim).collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Exports `graph` (an inference graph) with its parameter values `params` (by
/// name; bf16 ones are widened to f32).
pub fn export<'a>(
    graph: &Graph,
    params: &'a [(String, Tensor)],
    opts: &ExportOptions,
) -> Result<Exported<'a>> {
    if !(MIN_EXPORT_OPSET..=MAX_EXPORT_OPSET).contains(&opts.opset) {
        return Err(export_err(format!(
            "opset {} is not supported by the exporter (use {MIN_EXPORT_OPSET} to {MAX_EXPORT_OPSET})",
            opts.opset
        )));
    }
    if opts.batch.is_empty() {
        return Err(export_err("the batch dimension needs a name".into()));
    }
    if !graph.updates().is_empty() {
        return Err(export_err(format!(
            "graph `{}` updates its parameters (a training graph): export the inference graph",
            graph.name
        )));
    }
    let (decomposed, constants) = decompose(graph, opts.opset)?;
    let graph = decomposed.as_ref();
    let mut b = Builder::new(opts.opset);
    let mut inputs = Vec::new();
    for &v in graph.inputs() {
        let name = graph.name_of(v);
        if !b.claim(name) {
            return Err(export_err(format!("input name `{name}` is used twice")));
        }
        for (axis, d) in graph.ty(v).shape.iter().enumerate() {
            if let Dim::Sym(s) = d {
                b.note_symbol(s, name, axis);
            }
        }
        inputs.push(value_info(name, graph, v, &opts.batch));
    }
    // Output names are taken by the nodes that define them, or by an `Identity`.
    let mut low = Lower::new(b, graph, params);
    for &v in graph.inputs() {
        let name = graph.name_of(v).to_string();
        // A bf16 input is fed as float (already bf16-exact values are expected).
        low.set(v, Repr::Plain(name));
    }
    for &p in graph.params() {
        low.set(p, Repr::Param(p));
    }
    // The decompositions' constants: initializers of their own.
    for (name, t) in &constants {
        let v = graph
            .find(name)
            .ok_or_else(|| export_err(format!("the constant `{name}` is not in the graph")))?;
        let data = InitData::F32(std::borrow::Cow::Owned(t.to_f32_vec()));
        let init = low.b.init(name, &t.shape, data);
        low.set(v, Repr::Plain(init));
    }
    for (n, node) in graph.nodes().iter().enumerate() {
        low.node(node).map_err(|reason| OnnxError::ExportNode {
            node: graph.node_label(n),
            op: node.op.mnemonic().to_string(),
            reason,
        })?;
    }
    let mut outputs = Vec::new();
    for &v in graph.outputs() {
        let name = graph.name_of(v).to_string();
        let src = match (low.repr(v).cloned(), low.def(v)) {
            (Some(Repr::Plain(n)), _) => n,
            (Some(Repr::Param(_)), Def::Param(_)) => low
                .plain(v)
                .map_err(|r| export_err(format!("output `{name}`: {r}")))?,
            _ => {
                return Err(export_err(format!(
                    "output `{name}` is a blocked value; unblock it (unblock_act) first"
                )));
            }
        };
        if src != name {
            if !low.b.claim(&name) {
                return Err(export_err(format!(
                    "output name `{name}` is taken by another tensor"
                )));
            }
            low.b
                .push("Identity", &[&src], vec![], std::slice::from_ref(&name));
        }
        outputs.push(value_info(&name, graph, v, &opts.batch));
    }
    let b = low.b;
    let total: u64 = b.inits.iter().map(|i| i.data.byte_len() as u64).sum();
    let external = opts.external_data || total > EXTERNAL_DATA_THRESHOLD;
    let ir_version = match opts.opset {
        ..=18 => 8,
        19..=20 => 9,
        _ => 10,
    };
    let model = ModelProto {
        ir_version: Some(ir_version),
        opset_import: opset_imports(graph, opts.opset),
        producer_name: Some("dlrmc".into()),
        producer_version: Some(env!("CARGO_PKG_VERSION").into()),
        graph: Some(crate::proto::GraphProto {
            node: b.nodes,
            name: Some(graph.name.clone()),
            input: inputs,
            output: outputs,
            ..Default::default()
        }),
        ..Default::default()
    };
    Ok(Exported {
        model,
        inits: b.inits,
        external,
    })
}

/// Exports `graph` with `params` and writes it to `path` (see [`Exported::write`]).
pub fn export_to_file(
    graph: &Graph,
    params: &[(String, Tensor)],
    path: &Path,
    opts: &ExportOptions,
) -> Result<ExportSummary> {
    export(graph, params, opts)?.write(path)
}

/// The graph and the values of the constants it adds.
type WithConstants<'g> = (std::borrow::Cow<'g, Graph>, Vec<(String, Tensor)>);

/// `graph` with the module ops that have no native ONNX node at `opset` written
/// as the primitive ops they decompose into (a whole-table bag, such as an
/// int8 one, is kept and lowered as a bag: `lower/bags.rs`), and the constants
/// the decompositions added.
fn decompose(graph: &Graph, opset: i64) -> Result<WithConstants<'_>> {
    let decomposed = |m: &ModOp| !lower::keeps(m, opset);
    let any = graph
        .nodes()
        .iter()
        .any(|n| matches!(&n.op, Op::Module(m) if decomposed(m)));
    if !any {
        return Ok((std::borrow::Cow::Borrowed(graph), Vec::new()));
    }
    let d = dlrm_ir::module::decompose_modules_where(graph, &decomposed)
        .map_err(|e| export_err(format!("decomposing the module ops: {e}")))?;
    Ok((std::borrow::Cow::Owned(d.graph), d.constants))
}

/// The opsets the model imports: the default domain's at `opset`, and each
/// custom domain a module op's native node is in, at the newest version its
/// nodes need.
fn opset_imports(graph: &Graph, opset: i64) -> Vec<OperatorSetIdProto> {
    let mut custom: std::collections::BTreeMap<String, i64> = Default::default();
    for n in graph.nodes() {
        if let Op::Module(m) = &n.op
            && let Some(node) = lower::native(m, opset)
            && !node.in_default_domain()
        {
            let v = custom.entry(node.domain).or_insert(node.opset);
            *v = (*v).max(node.opset);
        }
    }
    let default = (String::new(), opset);
    std::iter::once(default)
        .chain(custom)
        .map(|(domain, version)| OperatorSetIdProto {
            domain: Some(domain),
            version: Some(version),
        })
        .collect()
}
