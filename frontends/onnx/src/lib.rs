//! dlrm-onnx: the ONNX frontend of dlrmc, and npz tensor I/O.
//!
//! [`load`] reads a `.onnx` file (protobuf types generated at build time from the
//! vendored `proto/onnx.proto` without a system `protoc`), reads its initializers
//! (typed fields, `raw_data`, or `external_data` side files inside the model's
//! folder) and imports its nodes into a [`dlrm_ir::Graph`], one ONNX node to one or a
//! few IR ops, through an op registry split by theme (`ops/`). Shape computations
//! (`Shape`, `Constant`, `ConstantOfShape`, `Range`, ...) are folded at import; the
//! `Loop` forms PyTorch's exporters write for `nn.EmbeddingBag` become
//! `embedding_bag` with offsets, and so does the `Loop`-free segment sum that
//! [`export`] writes (so an exported model re-imports with its bags fused).
//! Dynamic batch dimensions become the `B` symbol.
//!
//! Every error names the node (name and index), its op type and what is wrong, and
//! no input makes the importer panic (a property test feeds it mutated bytes).
//!
//! [`npz`] reads and writes named f32/i64/i32 arrays for inference inputs/outputs.
//!
//! [`export`] goes the other way: an IR inference graph (a plan's optimised one,
//! blocked GEMMs and all) and its parameter values become a standard ONNX model
//! that ONNX Runtime runs and [`load`] reads back (`dlrmc export`).
//!
//! ```
//! use std::collections::HashMap;
//! use std::path::Path;
//! let case = Path::new(env!("CARGO_MANIFEST_DIR")).join("test_cases/dlrm_dot");
//! let m = dlrm_onnx::load(&case.join("model.onnx"))?;
//! assert_eq!(m.outputs, ["prob"]);
//! assert_eq!(m.graph.ty(m.graph.outputs()[0]).to_string(), "f32[B,1]");
//!
//! let inputs: HashMap<_, _> = dlrm_onnx::npz::read(&case.join("inputs.npz"))?.into_iter().collect();
//! let mut params: HashMap<_, _> = m.params.into_iter().collect();
//! let syms = dlrm_ir::interp::bind_symbols(&m.graph, &inputs, &params).expect("bind");
//! let out = dlrm_ir::interp::run(&m.graph, &inputs, &mut params, &syms, &dlrm_ir::SingleRank)
//!     .expect("run");
//! assert_eq!(out[0].shape, [5, 1]);
//! # Ok::<(), dlrm_onnx::OnnxError>(())
//! ```

#![warn(missing_docs)]

mod attrs;
mod bag;
mod error;
pub mod export;
mod hints;
mod import;
pub mod npz;
mod ops;
mod proto;
mod sym;
mod tensor;

pub use error::{OnnxError, Result};

use import::{Ctx, NodeCx, NodeErr, Val};
use prost::Message;
use std::path::Path;
use std::rc::Rc;

/// Oldest default-domain opset accepted.
pub const MIN_OPSET: i64 = 11;

/// An imported model.
#[derive(Clone, Debug)]
pub struct Imported {
    /// The forward graph (inputs with a dynamic batch use the `B` symbol).
    pub graph: dlrm_ir::Graph,
    /// Initial values of the graph's parameters (the initializers and constants used
    /// as tensors), in the graph's parameter order.
    pub params: Vec<(String, dlrm_ir::Tensor)>,
    /// IR names of the graph inputs, in ONNX order.
    pub inputs: Vec<String>,
    /// IR names of the graph outputs, in ONNX order.
    pub outputs: Vec<String>,
    /// The default-domain opset the model was exported with.
    pub opset: i64,
    /// `producer_name producer_version` from the model.
    pub producer: String,
}

/// The IR name the importer gives an ONNX value (graph input or output) name:
/// unchanged when it is made of ASCII letters, digits, `_` and `.` and starts with a
/// letter or `_`; otherwise other characters become `_` (and `v` is prefixed when it
/// does not start with a letter or `_`). Use it to match npz array names (ONNX
/// names) with [`Imported::inputs`] / [`Imported::outputs`].
pub fn ir_name(onnx_name: &str) -> String {
    import::sanitize(onnx_name)
}

/// Reads and imports the ONNX model at `path` (external data is looked up in the
/// model's folder).
pub fn load(path: &Path) -> Result<Imported> {
    let bytes = std::fs::read(path).map_err(|source| OnnxError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let base = path.parent().map(|p| {
        if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        }
    });
    from_bytes(&bytes, &path.display().to_string(), base)
}

/// Imports a model from its bytes; `origin` names it in errors; `base` is the folder
/// external data is read from (`None`: external data is an error).
pub fn from_bytes(bytes: &[u8], origin: &str, base: Option<&Path>) -> Result<Imported> {
    let model = proto::ModelProto::decode(bytes).map_err(|e| OnnxError::Decode {
        origin: origin.to_string(),
        reason: e.to_string(),
    })?;
    let model_err = |reason: String| OnnxError::Model {
        origin: origin.to_string(),
        reason,
    };
    let opset = model
        .opset_import
        .iter()
        .find(|o| matches!(o.domain.as_deref(), None | Some("") | Some("ai.onnx")))
        .and_then(|o| o.version)
        .ok_or_else(|| model_err("the model imports no default-domain opset".into()))?;
    if opset < MIN_OPSET {
        return Err(model_err(format!(
            "opset {opset} is not supported (opset {MIN_OPSET} or later; re-export with a newer opset)"
        )));
    }
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| model_err("the model has no graph".into()))?;
    let opsets: Vec<(&str, i64)> = model
        .opset_import
        .iter()
        .map(|o| (o.domain.as_deref().unwrap_or(""), o.version.unwrap_or(0)))
        .collect();
    let mut cx = Ctx::new(origin.to_string(), graph, &opsets);
    cx.read_inputs(base)?;
    import_nodes(&mut cx, &graph.node, usize::MAX).map_err(|e| match e {
        NodeErr::Failed(e) => e,
        NodeErr::Msg(m) => model_err(m),
    })?;
    let outputs = cx.set_outputs()?;
    hints::free_bag_lengths(&mut cx.g)
        .map_err(|e| model_err(format!("freeing the bags' id counts: {e}")))?;
    let inputs =
        cx.g.inputs()
            .iter()
            .map(|&v| cx.g.name_of(v).to_string())
            .collect();
    dlrm_ir::verify(&cx.g)
        .map_err(|e| model_err(format!("the imported graph does not verify: {e}")))?;
    let producer = format!(
        "{} {}",
        model.producer_name.as_deref().unwrap_or(""),
        model.producer_version.as_deref().unwrap_or("")
    )
    .trim()
    .to_string();
    Ok(Imported {
        graph: cx.g,
        params: cx.params,
        inputs,
        outputs,
        opset,
        producer,
    })
}

/// An output `node` names that is already bound, or that it names twice.
fn redefined<'n>(cx: &Ctx<'_>, node: &'n proto::NodeProto) -> Option<&'n str> {
    let outs = &node.output;
    outs.iter()
        .enumerate()
        .find(|(k, o)| !o.is_empty() && (cx.is_bound(o) || outs[..*k].contains(o)))
        .map(|(_, o)| o.as_str())
}

/// Imports `nodes` in order. `parent` is the index of the enclosing node for a
/// subgraph (`usize::MAX` at top level): errors inside a subgraph name the
/// enclosing top-level node's index.
pub(crate) fn import_nodes(
    cx: &mut Ctx<'_>,
    nodes: &[proto::NodeProto],
    parent: usize,
) -> std::result::Result<(), NodeErr> {
    let registry = ops::registry();
    for (i, node) in nodes.iter().enumerate() {
        let n = NodeCx {
            proto: node,
            index: if parent == usize::MAX { i } else { parent },
            attrs: attrs::Attrs::new(node),
        };
        let domain = node.domain.as_deref().unwrap_or("");
        let op = n.op_type();
        if parent == usize::MAX
            && let Some(out) = redefined(cx, node)
        {
            return Err(NodeErr::Msg(format!(
                "node {i} (`{op}`) defines `{out}`, which is already defined (a graph \
                 input, an initializer or an earlier output): every value is defined once"
            )));
        }
        // The standard ops' builders, then the op modules (`dlrm_ir::ops`).
        let built = match (import::normal_domain(domain), registry.get(op)) {
            ("", Some(b)) => b(cx, &n),
            (d, _) => ops::module(cx, &n).unwrap_or_else(|| {
                Err(NodeErr::Msg(match d {
                    "" => format!("unsupported op `{op}`"),
                    d => format!("unsupported op `{op}` of domain `{d}`"),
                }))
            }),
        };
        match built {
            Ok(vals) => {
                for (k, out) in node.output.iter().enumerate() {
                    let v = match vals.get(k) {
                        Some(v) => v.clone(),
                        None => Val::Failed(Rc::new(
                            cx.node_err(&n, format!("output {k} is not supported")),
                        )),
                    };
                    cx.bind(out, v);
                }
            }
            Err(e) => {
                let err = Rc::new(match e {
                    NodeErr::Msg(m) => cx.node_err(&n, m),
                    NodeErr::Failed(e) => e,
                });
                for out in &node.output {
                    cx.bind(out, Val::Failed(err.clone()));
                }
            }
        }
    }
    Ok(())
}
