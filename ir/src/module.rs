//! Ops defined in one module each: the [`OpModule`] trait and the registry.
//!
//! An op written as a module keeps every aspect of its meaning in one file under
//! `ir/src/ops/`: its mnemonic and attributes (the text form and the e-graph form
//! come from them), its shape rule, its interpreter definition, its gradient rule
//! (the IR it adds to the backward graph), its work count (one model: flops and
//! bytes, read by the graph statistics, the e-graph cost and the planner), its
//! decomposition into primitive ops and its ONNX form (a native node the exporter
//! writes from the opset that has it, and the importer reads back; the
//! decomposition is written before it, or always when there is none). The trait
//! has no default for any of them, so an aspect cannot be forgotten: a module that
//! lacks one does not compile. The op reaches the IR as [`Op::Module`]; every
//! consumer of ops has one arm for all modules, which calls the trait.
//!
//! Adding an op is therefore: its file under `ir/src/ops/`, one line in
//! [`MODULES`] (`ir/src/ops/mod.rs`), and, for speed, a kernel file in `codegen/`
//! with one line in that crate's kernel registry (`codegen/src/modules/mod.rs`:
//! its reference kernel, its JIT kernel, its in-place update; without one the
//! interpreter runs). `docs/adding-an-op.md` walks through it with `gelu` as the
//! example.

use crate::error::Result;
use crate::graph::{Graph, ValueId};
use crate::instance::Checked;
use crate::op::{Attr, Op, Pool, State};
use crate::tensor::Tensor;
use crate::types::TensorType;
use std::fmt;
use std::ops::{Deref, DerefMut};

pub use crate::ops::MODULES;

/// Floating-point operations of the matrix product of `linear`, `linear_dx` and
/// `linear_dw`: `m·n` dot products of length `k`, a multiply-add (2 flops) per
/// term. The one formula of the graph statistics (`dlrm_passes::stats`) and the
/// executed work (`dlrm_codegen::work`), which adds `linear`'s epilogue.
pub fn gemm_flops(m: f64, n: f64, k: f64) -> f64 {
    2.0 * m * n * k
}

/// The work of one execution of a node, for the cost model and the reports.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Work {
    /// Floating-point operations (a multiply-add counts 2).
    pub flops: f64,
    /// Bytes read and written at least once (operands and results, in their dtypes).
    pub bytes: f64,
}

/// What the gradient rule of an op sees and may do ([`OpModule::backward`]): the
/// forward node's operands and results, the gradients reaching its results, and a
/// builder for the backward graph (which holds every forward value under the same
/// id).
pub trait GradCx {
    /// The forward node's operands.
    fn inputs(&self) -> &[ValueId];
    /// The forward node's results.
    fn outputs(&self) -> &[ValueId];
    /// The gradient reaching result `k`, `None` where none flows.
    fn dy(&self, k: usize) -> Option<ValueId>;
    /// Whether operand `k` needs a gradient.
    fn needs(&self, k: usize) -> bool;
    /// The name hint for the gradient of operand `k`.
    fn hint(&self, k: usize) -> String;
    /// Adds a node to the backward graph; its results' names are made unique from
    /// `names` (one hint per result).
    fn add(&mut self, op: Op, operands: &[ValueId], names: &[&str]) -> Result<Vec<ValueId>>;
    /// Adds `grad` to the gradient of operand `k` (ignored when it needs none).
    fn contribute(&mut self, k: usize, grad: ValueId);
}

/// What an optimizer update op is ([`OpModule::update`]): the executor, the
/// learning-rate schedule, the memory account and the passes read it through
/// [`Op::lr`], [`Op::with_lr`], [`Op::is_update`], [`Op::state_operands`],
/// [`Op::in_place_operands`], [`Op::dense_grad_operand`] and [`Op::bag_update`].
///
/// Conventions an update module follows: operand 0 is the parameter and
/// operands `1..=states.len()` its states, all updated in place and returned as
/// the results in that order; the learning rate is the attribute `lr`
/// ([`Attr::Float`], replaced by [`Op::with_lr`]); an embedding update's row
/// shard is the attributes `lo` and `rows` ([`Attr::Int`], replaced by
/// [`Op::with_rows`]).
#[derive(Clone, Debug, PartialEq)]
pub struct OptimizerUpdate {
    /// The learning rate (the attribute `lr`).
    pub lr: f32,
    /// What each state operand holds, operands `1..` in order.
    pub states: Vec<State>,
    /// Where the gradient comes from.
    pub grad: UpdateGrad,
}

/// The gradient of an [`OptimizerUpdate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdateGrad {
    /// A dense gradient of the parameter's shape, operand `k` (what the
    /// data-parallel partition all-reduces).
    Dense(usize),
    /// A fused embedding update: the operand after the states is the bags'
    /// output gradient `dy`, then the bags' `indices[, offsets]`; the parameter
    /// holds rows `lo .. lo+Rs` of a table of `rows` rows (the attributes `lo`
    /// and `rows`; the whole table is `lo = 0`, `rows = R`), so the partition
    /// pass can shard it by rows.
    Bags {
        /// The forward bags' pooling.
        mode: Pool,
        /// The first table row the parameter holds.
        lo: usize,
        /// Rows of the whole table.
        rows: usize,
    },
}

/// One op's definition (see the module docs). Implemented by a unit struct per op,
/// listed once in [`MODULES`].
pub trait OpModule: Send + Sync + 'static {
    /// The op's name in the text form and the e-graph (snake case, unique among all
    /// ops).
    fn mnemonic(&self) -> &'static str;

    /// The attribute keys, in printed order (the parser accepts exactly these).
    fn attr_keys(&self) -> &'static [&'static str];

    /// Checks parsed attribute values (keys already match [`OpModule::attr_keys`]).
    fn check_attrs(&self, attrs: &[(&'static str, Attr)]) -> std::result::Result<(), String>;

    /// The shape rule: result types from operand types (arity, ranks, dtypes and
    /// dimensions checked). The interpreter and the kernels rely on it: they read
    /// dims from the checked operands without checking them again.
    fn infer(
        &self,
        op: &ModOp,
        ins: &[&TensorType],
    ) -> std::result::Result<Vec<TensorType>, String>;

    /// The interpreter definition: the op's specification in plain sequential
    /// loops, which every kernel is tested against.
    fn eval(&self, c: &Checked<'_>) -> std::result::Result<Vec<Tensor>, String>;

    /// The work of one execution with these operand and result types; symbolic
    /// dimensions are given by `dim` (the caller's binding or estimate).
    fn work(
        &self,
        op: &ModOp,
        ins: &[&TensorType],
        outs: &[&TensorType],
        dim: &dyn Fn(&crate::Dim) -> f64,
    ) -> Work;

    /// The gradient rule: adds the backward of one forward node through `cx`.
    /// `Err` for an op that has none (an integer op, a gradient op itself).
    fn backward(&self, op: &ModOp, cx: &mut dyn GradCx) -> Result<()>;

    /// The op as primitive ops (those an exporter writes): appends nodes computing
    /// the same results from `operands` to the graph of `g` and returns them;
    /// the constants they need come from [`DecomposeCx::scalar`]. `names` holds
    /// one name hint per result.
    fn decompose(
        &self,
        op: &ModOp,
        g: &mut DecomposeCx<'_>,
        operands: &[ValueId],
        names: &[&str],
    ) -> Result<Vec<ValueId>>;

    /// The op's native ONNX node ([`OnnxNode`]: op type, domain, the oldest opset
    /// of that domain that has it, attributes), `None` for an op ONNX has none
    /// for. The exporter writes it, one result per ONNX output, from that opset
    /// on and the [`OpModule::decompose`] before it (and always when `None`).
    fn onnx(&self, op: &ModOp) -> Option<OnnxNode>;

    /// The op an ONNX node the importer has no builder for stands for: `None`
    /// when `node` is not this module's ONNX op (another module may take it),
    /// `Some(Err(reason))` when it is but its attributes have no exact
    /// equivalent here (never an approximation; the importer names the node).
    /// Its operands are the node's inputs, in order.
    fn onnx_import(&self, node: &OnnxNode) -> Option<std::result::Result<ModOp, String>>;

    /// The op as an optimizer update ([`OptimizerUpdate`]: its rate, its in-place
    /// state, its gradient), `None` for an op that is not one.
    fn update(&self, op: &ModOp) -> Option<OptimizerUpdate>;
}

/// The ONNX domain of the standard ops (`ai.onnx`, written as the empty string).
pub const ONNX_DEFAULT_DOMAIN: &str = "";

/// One ONNX node as a module op sees it: the native form it exports to
/// ([`OpModule::onnx`]) and the node it imports from ([`OpModule::onnx_import`]).
#[derive(Clone, Debug, PartialEq)]
pub struct OnnxNode {
    /// The op type (`Gelu`).
    pub op_type: String,
    /// The operator set domain: [`ONNX_DEFAULT_DOMAIN`] for the standard ops
    /// (`ai.onnx` is read as it), else a custom domain (`com.microsoft`).
    pub domain: String,
    /// The opset version of `domain`: on export the oldest one that has the op
    /// in this form, on import the model's.
    pub opset: i64,
    /// The attributes, by name.
    pub attrs: Vec<(String, OnnxAttr)>,
}

impl OnnxNode {
    /// A node of `op_type` in `domain` from opset `opset`, without attributes yet.
    pub fn new(op_type: &str, domain: &str, opset: i64) -> OnnxNode {
        OnnxNode {
            op_type: op_type.to_string(),
            domain: domain.to_string(),
            opset,
            attrs: Vec::new(),
        }
    }

    /// This node with attribute `name` set to `value`.
    pub fn with(mut self, name: &str, value: OnnxAttr) -> OnnxNode {
        self.attrs.push((name.to_string(), value));
        self
    }

    /// Whether the node is in the default domain ([`ONNX_DEFAULT_DOMAIN`], or
    /// `ai.onnx`, its other name).
    pub fn in_default_domain(&self) -> bool {
        is_default_domain(&self.domain)
    }

    /// Whether this is the node `op_type` of `domain` (`ai.onnx` read as the
    /// default domain).
    pub fn is(&self, op_type: &str, domain: &str) -> bool {
        let same_domain =
            self.domain == domain || (self.in_default_domain() && is_default_domain(domain));
        self.op_type == op_type && same_domain
    }

    /// The value of attribute `name`, if the node has it.
    pub fn attr(&self, name: &str) -> Option<&OnnxAttr> {
        self.attrs.iter().find(|(k, _)| k == name).map(|(_, a)| a)
    }

    /// The string attribute `name`, `default` when absent; an error naming it
    /// when it is not a string.
    pub fn string(&self, name: &str, default: &str) -> std::result::Result<String, String> {
        match self.attr(name) {
            None => Ok(default.to_string()),
            Some(OnnxAttr::Str(s)) => Ok(s.clone()),
            Some(other) => Err(format!(
                "attribute `{name}` must be a string, got {other:?}"
            )),
        }
    }

    /// An error naming the first attribute not in `known` (an importer refuses
    /// what it would otherwise ignore).
    pub fn only_attrs(&self, known: &[&str]) -> std::result::Result<(), String> {
        match self
            .attrs
            .iter()
            .find(|(k, _)| !known.contains(&k.as_str()))
        {
            Some((k, _)) => Err(format!("unsupported attribute `{k}`")),
            None => Ok(()),
        }
    }
}

/// Whether `domain` names the default domain (`""` or `ai.onnx`).
fn is_default_domain(domain: &str) -> bool {
    matches!(domain, ONNX_DEFAULT_DOMAIN | "ai.onnx")
}

/// An ONNX attribute value ([`OnnxNode`]).
#[derive(Clone, Debug, PartialEq)]
pub enum OnnxAttr {
    /// `i`.
    Int(i64),
    /// `f`.
    Float(f32),
    /// `s` (UTF-8).
    Str(String),
    /// `ints`.
    Ints(Vec<i64>),
    /// `floats`.
    Floats(Vec<f32>),
    /// A kind no module reads (a tensor, a graph, a list of strings): present,
    /// so that an importer can refuse it by name.
    Other,
}

/// The op of an ONNX node that a module imports ([`OpModule::onnx_import`], the
/// first module of [`MODULES`] that takes it): `None` when none does.
pub fn onnx_import(node: &OnnxNode) -> Option<std::result::Result<Op, String>> {
    MODULES
        .iter()
        .find_map(|m| m.onnx_import(node))
        .map(|r| r.map(Op::Module))
}

/// Where [`OpModule::decompose`] writes: the graph being built (the context
/// dereferences to it: `g.add(..)`) and the constants the decomposition needs,
/// which become parameters of that graph with their values recorded
/// ([`DecomposeCx::scalar`]; [`Decomposed::constants`]).
pub struct DecomposeCx<'a> {
    graph: &'a mut Graph,
    constants: &'a mut Vec<(String, Tensor)>,
}

impl<'a> DecomposeCx<'a> {
    /// A context writing into `graph`, recording constants in `constants`.
    pub fn new(graph: &'a mut Graph, constants: &'a mut Vec<(String, Tensor)>) -> Self {
        DecomposeCx { graph, constants }
    }

    /// The f32 scalar `value` (shape `[]`) as a new parameter named after
    /// `hint`, its value recorded.
    pub fn scalar(&mut self, hint: &str, value: f32) -> Result<ValueId> {
        let name = self.graph.fresh_name(hint);
        let v = self.graph.add_param(&name, TensorType::f32([]))?;
        self.constants
            .push((name, Tensor::f32(Vec::new(), vec![value])));
        Ok(v)
    }
}

impl Deref for DecomposeCx<'_> {
    type Target = Graph;

    fn deref(&self) -> &Graph {
        self.graph
    }
}

impl DerefMut for DecomposeCx<'_> {
    fn deref_mut(&mut self) -> &mut Graph {
        self.graph
    }
}

/// A graph whose module ops were decomposed ([`decompose_modules`]): the graph,
/// and the values of the parameters the decompositions added (their constants).
#[derive(Clone, Debug)]
pub struct Decomposed {
    /// The graph.
    pub graph: Graph,
    /// The added parameters' values, by name (every other parameter is the
    /// original graph's).
    pub constants: Vec<(String, Tensor)>,
}

/// A module op with its attribute values: the payload of [`Op::Module`].
#[derive(Clone)]
pub struct ModOp {
    def: &'static dyn OpModule,
    attrs: Vec<(&'static str, Attr)>,
}

impl ModOp {
    /// The op of `def` with attribute values `attrs` (in [`OpModule::attr_keys`]
    /// order, checked by [`OpModule::check_attrs`]).
    pub fn new(
        def: &'static dyn OpModule,
        attrs: Vec<(&'static str, Attr)>,
    ) -> std::result::Result<ModOp, String> {
        let keys: Vec<&str> = attrs.iter().map(|(k, _)| *k).collect();
        if keys != def.attr_keys() {
            return Err(format!(
                "`{}` takes the attributes [{}], got [{}]",
                def.mnemonic(),
                def.attr_keys().join(", "),
                keys.join(", ")
            ));
        }
        def.check_attrs(&attrs)?;
        Ok(ModOp { def, attrs })
    }

    /// The module op named `mnemonic` with no attributes, as an [`Op`].
    ///
    /// # Panics
    /// If no module has that mnemonic or it takes attributes (a programming error
    /// in the caller, which names a module it links against).
    pub fn op(mnemonic: &str) -> Op {
        let def = find(mnemonic).unwrap_or_else(|| panic!("no op module `{mnemonic}`"));
        Op::Module(ModOp::new(def, Vec::new()).unwrap_or_else(|e| panic!("{e}")))
    }

    /// The op's definition.
    pub fn def(&self) -> &'static dyn OpModule {
        self.def
    }

    /// The op's mnemonic.
    pub fn mnemonic(&self) -> &'static str {
        self.def.mnemonic()
    }

    /// The attribute values, in printed order.
    pub fn attrs(&self) -> &[(&'static str, Attr)] {
        &self.attrs
    }

    /// The value of attribute `key`.
    pub fn attr(&self, key: &str) -> Option<&Attr> {
        self.attrs.iter().find(|(k, _)| *k == key).map(|(_, a)| a)
    }

    /// This op with attribute `key` set to `value` (checked again); an error if
    /// it has no such attribute or the value is invalid.
    pub fn with_attr(&self, key: &str, value: Attr) -> std::result::Result<ModOp, String> {
        let mut attrs = self.attrs.clone();
        let slot = attrs
            .iter_mut()
            .find(|(k, _)| *k == key)
            .ok_or_else(|| format!("`{}` has no attribute `{key}`", self.mnemonic()))?;
        slot.1 = value;
        ModOp::new(self.def, attrs)
    }

    /// The op as an optimizer update ([`OpModule::update`]).
    pub fn update(&self) -> Option<OptimizerUpdate> {
        self.def.update(self)
    }

    /// The op's native ONNX node ([`OpModule::onnx`]).
    pub fn onnx(&self) -> Option<OnnxNode> {
        self.def.onnx(self)
    }
}

impl PartialEq for ModOp {
    fn eq(&self, other: &ModOp) -> bool {
        self.mnemonic() == other.mnemonic() && self.attrs == other.attrs
    }
}

impl fmt::Debug for ModOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.mnemonic())?;
        for (k, a) in &self.attrs {
            write!(f, " {k}={a}")?;
        }
        Ok(())
    }
}

/// What the consumers of a bag's operands need to know of an embedding-bag
/// op (the data generator, the input contract, a server merging requests):
/// its operands are `table, indices, offsets?, weights?` ([`Op::bag_form`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BagForm {
    /// Sum or mean.
    pub mode: crate::op::Pool,
    /// Offsets carry a last entry ending the last bag.
    pub last_offset: bool,
    /// The table is int8 row-wise (`embedding_bag_q8`).
    pub int8: bool,
}

impl Op {
    /// The form of a whole-table embedding bag (`embedding_bag`,
    /// `embedding_bag_weighted`, `embedding_bag_q8`), `None` for other ops
    /// (row shards and gradients included). A fourth operand is the per-sample
    /// weights.
    pub fn bag_form(&self) -> Option<BagForm> {
        use crate::op::Pool;
        match self {
            Op::EmbeddingBag { mode, last_offset } => Some(BagForm {
                mode: *mode,
                last_offset: *last_offset,
                int8: false,
            }),
            Op::EmbeddingBagWeighted => Some(BagForm {
                mode: Pool::Sum,
                last_offset: false,
                int8: false,
            }),
            Op::Module(m) if m.mnemonic() == crate::ops::embedding_bag_q8::MNEMONIC => {
                let (mode, last_offset) = crate::ops::embedding_bag_q8::attrs_of(m);
                Some(BagForm {
                    mode,
                    last_offset,
                    int8: true,
                })
            }
            _ => None,
        }
    }

    /// Whether this is the module op named `mnemonic` (the passes that rewrite
    /// particular module ops find them by it).
    pub fn is_module(&self, mnemonic: &str) -> bool {
        matches!(self, Op::Module(m) if m.mnemonic() == mnemonic)
    }
}

/// The module with this mnemonic.
pub fn find(mnemonic: &str) -> Option<&'static dyn OpModule> {
    MODULES.iter().copied().find(|m| m.mnemonic() == mnemonic)
}

/// Builds a module op from parsed parts (the text parser's and the e-graph's
/// fallback after the op table): `None` when no module has this mnemonic.
pub(crate) fn from_parts(
    mnemonic: &str,
    attrs: &[(String, Attr)],
) -> Option<std::result::Result<Op, String>> {
    let def = find(mnemonic)?;
    let mut out = Vec::with_capacity(attrs.len());
    for key in def.attr_keys() {
        match attrs.iter().find(|(k, _)| k == key) {
            Some((_, a)) => out.push((*key, a.clone())),
            None => return Some(Err(format!("`{mnemonic}` needs attribute `{key}`"))),
        }
    }
    if let Some((k, _)) = attrs
        .iter()
        .find(|(k, _)| !def.attr_keys().contains(&k.as_str()))
    {
        return Some(Err(format!("`{mnemonic}` has no attribute `{k}`")));
    }
    Some(ModOp::new(def, out).map(Op::Module))
}

/// `g` with every module op replaced by its [`OpModule::decompose`] (inputs,
/// parameters, outputs, updates and every other value's name kept), and the
/// constants the decompositions added: a second definition the tests check
/// the module's own against.
pub fn decompose_modules(g: &Graph) -> Result<Decomposed> {
    decompose_modules_where(g, &|_| true)
}

/// [`decompose_modules`] of the module ops `which` selects (the others kept):
/// what the ONNX exporter writes for the ops without a native form. A
/// decomposition may use other module ops (`cross_brgemm` is `brgemm` then
/// `cross_mix`): those `which` selects are decomposed in turn, up to
/// [`DECOMPOSE_DEPTH`] levels.
pub fn decompose_modules_where(g: &Graph, which: &dyn Fn(&ModOp) -> bool) -> Result<Decomposed> {
    let selected = |g: &Graph| {
        g.nodes()
            .iter()
            .any(|n| matches!(&n.op, Op::Module(m) if which(m)))
    };
    let mut constants = Vec::new();
    let mut graph = g.clone();
    for _ in 0..DECOMPOSE_DEPTH {
        if !selected(&graph) {
            break;
        }
        graph = rebuild(&graph, &mut |_, node, out, ins, names| match &node.op {
            Op::Module(m) if which(m) => {
                let mut cx = DecomposeCx::new(out, &mut constants);
                Some(m.def().decompose(m, &mut cx, ins, names))
            }
            _ => None,
        })?;
    }
    Ok(Decomposed { graph, constants })
}

/// How deep [`decompose_modules_where`] follows decompositions into module ops.
pub const DECOMPOSE_DEPTH: usize = 4;

/// What [`rebuild`] asks of each node: `(index, node, the new graph, its operands
/// there, its results' names)`; `Some(results)` adds the node's replacement (its
/// results, one per original result), `None` copies it unchanged.
pub type Rewrite<'a> = dyn FnMut(
        usize,
        &crate::graph::Node,
        &mut Graph,
        &[ValueId],
        &[&str],
    ) -> Option<Result<Vec<ValueId>>>
    + 'a;

/// A copy of `g` node by node in order, each node replaced where `f` says so
/// (see [`Rewrite`]); inputs, parameters, outputs, updates and names kept.
pub fn rebuild(g: &Graph, f: &mut Rewrite<'_>) -> Result<Graph> {
    rebuild_params(g, &|_| None, f)
}

/// [`rebuild`] with some parameters' types changed: `param_ty(p)` is
/// parameter `p`'s new type, `None` keeps its own (a pass that changes a
/// parameter's storage, as `quantize-tables` does).
pub fn rebuild_params(
    g: &Graph,
    param_ty: &dyn Fn(ValueId) -> Option<TensorType>,
    f: &mut Rewrite<'_>,
) -> Result<Graph> {
    let mut out = Graph::new(g.name.clone());
    let mut map: Vec<Option<ValueId>> = vec![None; g.values().len()];
    for &v in g.inputs() {
        map[v.index()] = Some(out.add_input(g.name_of(v), g.ty(v).clone())?);
    }
    for &v in g.params() {
        let ty = param_ty(v).unwrap_or_else(|| g.ty(v).clone());
        map[v.index()] = Some(out.add_param(g.name_of(v), ty)?);
    }
    let get = |map: &[Option<ValueId>], v: ValueId| {
        map[v.index()].ok_or_else(|| crate::IrError::Graph {
            graph: g.name.clone(),
            reason: format!("%{} is used before it is defined", g.name_of(v)),
        })
    };
    for (n, node) in g.nodes().iter().enumerate() {
        let ins = node
            .inputs
            .iter()
            .map(|&v| get(&map, v))
            .collect::<Result<Vec<_>>>()?;
        let names: Vec<&str> = node.outputs.iter().map(|&v| g.name_of(v)).collect();
        let outs = match f(n, node, &mut out, &ins, &names) {
            Some(r) => r?,
            None => {
                let tys: Vec<TensorType> = node.outputs.iter().map(|&v| g.ty(v).clone()).collect();
                out.add_node_typed(node.op.clone(), &ins, &names, &tys)?
            }
        };
        for (&o, n) in node.outputs.iter().zip(outs) {
            map[o.index()] = Some(n);
        }
    }
    for &v in g.outputs() {
        out.add_output(get(&map, v)?);
    }
    for u in g.updates() {
        out.add_update(get(&map, u.param)?, get(&map, u.value)?)?;
    }
    Ok(out)
}
