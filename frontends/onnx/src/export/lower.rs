//! IR ops to standard ONNX ops, node by node.
//!
//! Every IR value gets a [`Repr`]: a plain ONNX tensor of the same shape, a blocked
//! activation held *unblocked* (`xb[Kb,S,bk]` as `x[S,k]`), a blocked weight held
//! unblocked (`wb[Nb,Kb,bk,bn]` as `w[N,K]`), or a parameter not written yet
//! (written on first use in the form that use needs: as is, or un-blocked with the
//! `n`, `k` its `brgemm` gives). Blocking only moves elements and pads with zeros,
//! so the unblocked forms compute the same values.
//!
//! Floats are f32 in the ONNX model: bf16 parameters are widened exactly to f32,
//! and an op whose IR result is bf16 is followed by `Cast(to=BFLOAT16)` +
//! `Cast(to=FLOAT)`, the round to nearest even the IR's bf16 storage applies, so
//! the model computes what `dlrm-run` computes.

use super::builder::{A, Builder, InitData};
use crate::proto::tensor_proto::DataType;
use dlrm_ir::{
    Act, BinaryKind, DType, Data, Def, Dim, Graph, InteractionKind, Node, Op, Pool, Tensor, ValueId,
};
use std::borrow::Cow;
use std::collections::HashMap;

/// How an IR value exists in the ONNX graph.
#[derive(Clone, Debug)]
pub(crate) enum Repr {
    /// A tensor of the IR value's shape.
    Plain(String),
    /// A blocked activation `[Kb,S,bk]`, held as `[S,k]`.
    Act { name: String, k: usize },
    /// A blocked weight `[Nb,Kb,bk,bn]`, held as `[N,K]`.
    Weight(String),
    /// A parameter not written yet.
    Param(ValueId),
}

/// A lowering failure: the reason (the caller names the node).
pub(crate) type Fail = String;

/// The lowering context of one graph.
pub(crate) struct Lower<'g, 'a> {
    pub b: Builder<'a>,
    g: &'g Graph,
    params: HashMap<&'a str, &'a Tensor>,
    repr: HashMap<ValueId, Repr>,
    /// Written parameters: (plain name, unblocked-weight name).
    written: HashMap<ValueId, (Option<String>, Option<String>)>,
    /// Written int8 tables: their codes, scales and biases.
    int8: HashMap<ValueId, [String; 3]>,
}

mod bags;
mod modules;

pub(crate) use modules::{keeps, native};

fn dims_of(t: &Tensor) -> &[usize] {
    &t.shape
}

/// The f32 data of a float tensor (bf16 widened exactly), or its int data.
fn init_data(t: &Tensor) -> InitData<'_> {
    match &t.data {
        Data::F32(v) => InitData::F32(Cow::Borrowed(v)),
        Data::BF16(v) => InitData::F32(Cow::Owned(v.iter().map(|x| x.to_f32()).collect())),
        Data::I64(v) => InitData::I64(v.clone()),
        Data::I32(v) => InitData::I32(Cow::Borrowed(v)),
        Data::U8(v) => InitData::U8(Cow::Borrowed(v)),
    }
}

/// `w[n,k]` from its blocked form `wb[Nb,Kb,bk,bn]` (`wb[nb][kb][i][j] =
/// w[nb·bn+j][kb·bk+i]`), widened to f32.
fn unblock_weight(t: &Tensor, n: usize, k: usize) -> Result<Vec<f32>, Fail> {
    let [nb, kb, bk, bn] = t.shape[..] else {
        return Err(format!(
            "a blocked weight must have rank 4, got {:?}",
            t.shape
        ));
    };
    if n > nb * bn || k > kb * bk {
        return Err(format!(
            "blocked weight {:?} cannot hold a [{n},{k}] weight",
            t.shape
        ));
    }
    let src = t.to_f32_vec();
    let mut w = vec![0f32; n * k];
    for (r, row) in w.chunks_exact_mut(k.max(1)).enumerate().take(n) {
        let (rb, j) = (r / bn, r % bn);
        for (c, x) in row.iter_mut().enumerate() {
            let (cb, i) = (c / bk, c % bk);
            *x = src[((rb * kb + cb) * bk + i) * bn + j];
        }
    }
    Ok(w)
}

/// The fixed size of a dimension, or an error naming `what`.
fn fixed(d: &Dim, what: &str) -> Result<usize, Fail> {
    d.fixed()
        .ok_or_else(|| format!("{what} must be a fixed size, got `{d}`"))
}

fn act_op(act: Act) -> Option<&'static str> {
    match act {
        Act::None => None,
        Act::Relu => Some("Relu"),
        Act::Sigmoid => Some("Sigmoid"),
    }
}

/// The ONNX element type of an IR dtype as exported (bf16 is carried as float).
pub(crate) fn onnx_elem(d: DType) -> DataType {
    match d {
        DType::F32 | DType::BF16 => DataType::Float,
        DType::I64 => DataType::Int64,
        DType::I32 => DataType::Int32,
        DType::U8 => DataType::Uint8,
    }
}

impl<'g, 'a> Lower<'g, 'a> {
    /// A lowering of `g` whose parameters are `params` (by name).
    pub(crate) fn new(b: Builder<'a>, g: &'g Graph, params: &'a [(String, Tensor)]) -> Self {
        Lower {
            b,
            g,
            params: params.iter().map(|(n, t)| (n.as_str(), t)).collect(),
            repr: HashMap::new(),
            written: HashMap::new(),
            int8: HashMap::new(),
        }
    }

    /// Sets the representation of `v`.
    pub(crate) fn set(&mut self, v: ValueId, r: Repr) {
        self.repr.insert(v, r);
    }

    fn param_tensor(&self, v: ValueId) -> Result<&'a Tensor, Fail> {
        let name = self.g.name_of(v);
        let t = self
            .params
            .get(name)
            .copied()
            .ok_or_else(|| format!("parameter `{name}` has no value"))?;
        let want: Option<Vec<usize>> = self.g.ty(v).shape.iter().map(Dim::fixed).collect();
        if want.as_deref() != Some(dims_of(t)) || t.dtype() != self.g.ty(v).dtype {
            return Err(format!(
                "parameter `{name}` is {}{:?}, the graph declares {}",
                t.dtype(),
                t.shape,
                self.g.ty(v)
            ));
        }
        Ok(t)
    }

    /// `v` as a plain tensor name.
    pub(crate) fn plain(&mut self, v: ValueId) -> Result<String, Fail> {
        match self.repr.get(&v).cloned() {
            Some(Repr::Plain(n)) => Ok(n),
            Some(Repr::Param(p)) => {
                if let Some((Some(n), _)) = self.written.get(&p) {
                    return Ok(n.clone());
                }
                let t = self.param_tensor(p)?;
                let name = self.b.init(self.g.name_of(p), &t.shape, init_data(t));
                self.written.entry(p).or_default().0 = Some(name.clone());
                Ok(name)
            }
            Some(Repr::Act { .. } | Repr::Weight(_)) => Err(format!(
                "`%{}` is blocked where a plain tensor is expected",
                self.g.name_of(v)
            )),
            None => Err(format!(
                "`%{}` is used before it is defined",
                self.g.name_of(v)
            )),
        }
    }

    /// A blocked activation: its unblocked name and feature count.
    fn act(&mut self, v: ValueId) -> Result<(String, usize), Fail> {
        match self.repr.get(&v) {
            Some(Repr::Act { name, k }) => Ok((name.clone(), *k)),
            _ => Err(format!(
                "`%{}` is not a blocked activation (block_act or brgemm result)",
                self.g.name_of(v)
            )),
        }
    }

    /// A blocked weight as an unblocked `[n,k]` tensor name.
    fn weight(&mut self, v: ValueId, n: usize, k: usize) -> Result<String, Fail> {
        match self.repr.get(&v).cloned() {
            Some(Repr::Weight(w)) => Ok(w),
            Some(Repr::Param(p)) => {
                if let Some((_, Some(w))) = self.written.get(&p) {
                    return Ok(w.clone());
                }
                let t = self.param_tensor(p)?;
                let data = unblock_weight(t, n, k)?;
                let hint = self.g.name_of(p).to_string();
                let name = self.b.init(&hint, &[n, k], InitData::F32(Cow::Owned(data)));
                self.written.entry(p).or_default().1 = Some(name.clone());
                Ok(name)
            }
            _ => Err(format!(
                "`%{}` is not a blocked weight (a parameter or block_weight result)",
                self.g.name_of(v)
            )),
        }
    }

    /// Rounds `x` to bf16 and back when `dtype` is bf16 (the IR's bf16 storage).
    fn round(&mut self, x: String, dtype: DType, hint: &str) -> String {
        if dtype != DType::BF16 {
            return x;
        }
        let h = self.b.node(
            "Cast",
            &[&x],
            vec![("to", A::Int(DataType::Bfloat16 as i64))],
            &format!("{hint}.bf16"),
        );
        self.b.node(
            "Cast",
            &[&h],
            vec![("to", A::Int(DataType::Float as i64))],
            hint,
        )
    }

    /// A runtime shape vector for `dims` (constant when all are fixed; `-1` for a
    /// single symbol; else `Shape` slices of the inputs carrying the symbols).
    fn shape_of(&mut self, dims: &[Dim]) -> Result<String, Fail> {
        let syms = dims.iter().filter(|d| d.fixed().is_none()).count();
        if syms <= 1 {
            let v: Vec<i64> = dims
                .iter()
                .map(|d| d.fixed().map_or(-1, |n| n as i64))
                .collect();
            return Ok(self.b.ints(&v));
        }
        let mut parts = Vec::new();
        for d in dims {
            parts.push(match d {
                Dim::Fixed(n) => self.b.ints(&[*n as i64]),
                Dim::Sym(s) => self
                    .b
                    .symbol(s)
                    .ok_or_else(|| format!("no graph input carries the dimension `{s}`"))?,
                Dim::Expr(e) => {
                    return Err(format!(
                        "the dimension {e} is an expression, which export does not write yet"
                    ));
                }
            });
        }
        let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
        Ok(self
            .b
            .node("Concat", &refs, vec![("axis", A::Int(0))], "shape"))
    }

    /// Lowers node `node`; sets its results' representations.
    pub(crate) fn node(&mut self, node: &Node) -> Result<(), Fail> {
        let g = self.g;
        let out = node
            .outputs
            .first()
            .copied()
            .ok_or("a node without results")?;
        let hint = g.name_of(out).to_string();
        let out_ty = g.ty(out).clone();
        let ins = &node.inputs;
        let inp = |k: usize| operand(ins, k);
        let r = match &node.op {
            op if op.bag_form().is_some() => self.bag(node, &hint, &out_ty)?,
            Op::Module(m) => return self.module(node, m),
            Op::Linear { act } => {
                let x = self.plain(inp(0)?)?;
                let w = self.plain(inp(1)?)?;
                let b = self.plain(inp(2)?)?;
                let y = self.gemm(&x, &w, &b, *act, &hint);
                Repr::Plain(self.round(y, out_ty.dtype, &hint))
            }
            Op::Relu | Op::Sigmoid => {
                let x = self.plain(inp(0)?)?;
                let op = if node.op == Op::Relu {
                    "Relu"
                } else {
                    "Sigmoid"
                };
                let y = self.b.node(op, &[&x], vec![], &hint);
                Repr::Plain(self.round(y, out_ty.dtype, &hint))
            }
            Op::Add | Op::Binary { .. } | Op::MatMul => {
                self.binary(node, inp(0)?, inp(1)?, out_ty.dtype, &hint)?
            }
            Op::Interaction {
                kind,
                self_interaction,
            } => {
                let parts = ins
                    .iter()
                    .map(|&v| self.plain(v))
                    .collect::<Result<Vec<_>, _>>()?;
                let y = match kind {
                    InteractionKind::Cat => {
                        let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
                        self.b
                            .node("Concat", &refs, vec![("axis", A::Int(1))], &hint)
                    }
                    InteractionKind::Dot => {
                        let d = fixed(&g.ty(inp(0)?).shape[1], "the interaction width")?;
                        self.dot(&parts, d, *self_interaction, &hint)
                    }
                };
                Repr::Plain(self.round(y, out_ty.dtype, &hint))
            }
            Op::Concat { .. }
            | Op::Split { .. }
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Gather { .. }
            | Op::GatherElements { .. }
            | Op::GatherNd { .. }
            | Op::Slice { .. } => match self.shape_op(node, &hint)? {
                Some(r) => r,
                None => return Ok(()),
            },
            Op::Reduce {
                kind,
                axes,
                keepdims,
            } => {
                let x = self.plain(inp(0)?)?;
                let y = self.reduce(&x, *kind, axes, *keepdims, &hint);
                Repr::Plain(self.round(y, out_ty.dtype, &hint))
            }
            Op::Cast { to } => {
                let x = self.plain(inp(0)?)?;
                let y = self.b.node(
                    "Cast",
                    &[&x],
                    vec![("to", A::Int(onnx_elem(*to) as i64))],
                    &hint,
                );
                let from = g.ty(inp(0)?).dtype;
                Repr::Plain(if from == DType::BF16 {
                    y
                } else {
                    self.round(y, *to, &hint)
                })
            }
            Op::BlockAct { .. }
            | Op::UnblockAct { .. }
            | Op::Brgemm { .. }
            | Op::BlockWeight { .. }
            | Op::UnblockWeight { .. } => self.blocked(node, &hint, &out_ty)?,
            other => {
                return Err(format!(
                    "`{}` has no ONNX form here: the exporter writes inference graphs \
                     (training, optimizer, sharded and collective ops are not exported)",
                    other.mnemonic()
                ));
            }
        };
        self.set(out, r);
        Ok(())
    }

    /// The ops that only move or select values (`concat`, `split`, `reshape`,
    /// `transpose`, the gathers, `slice`): their ONNX node, or `None` when the
    /// results are already set (`split`'s several).
    fn shape_op(&mut self, node: &Node, hint: &str) -> Result<Option<Repr>, Fail> {
        let ins = &node.inputs;
        let inp = |k: usize| operand(ins, k);
        let r = match &node.op {
            Op::Concat { axis } => {
                let parts = ins
                    .iter()
                    .map(|&v| self.plain(v))
                    .collect::<Result<Vec<_>, _>>()?;
                let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
                Repr::Plain(self.b.node(
                    "Concat",
                    &refs,
                    vec![("axis", A::Int(*axis as i64))],
                    hint,
                ))
            }
            Op::Split { axis, sizes } => {
                let x = self.plain(inp(0)?)?;
                let s: Vec<i64> = sizes.iter().map(|&n| n as i64).collect();
                let s = self.b.ints(&s);
                let outs = self.b.node_n(
                    "Split",
                    &[&x, &s],
                    vec![("axis", A::Int(*axis as i64))],
                    hint,
                    node.outputs.len(),
                );
                for (&v, n) in node.outputs.iter().zip(outs) {
                    self.set(v, Repr::Plain(n));
                }
                return Ok(None);
            }
            Op::Reshape { shape } => {
                let x = self.plain(inp(0)?)?;
                let s = self.shape_of(shape)?;
                Repr::Plain(self.b.node("Reshape", &[&x, &s], vec![], hint))
            }
            Op::Transpose { perm } => {
                let x = self.plain(inp(0)?)?;
                let p = perm.iter().map(|&a| a as i64).collect();
                Repr::Plain(
                    self.b
                        .node("Transpose", &[&x], vec![("perm", A::Ints(p))], hint),
                )
            }
            Op::Gather { axis } | Op::GatherElements { axis } => {
                let x = self.plain(inp(0)?)?;
                let i = self.plain(inp(1)?)?;
                let op = if matches!(node.op, Op::Gather { .. }) {
                    "Gather"
                } else {
                    "GatherElements"
                };
                Repr::Plain(
                    self.b
                        .node(op, &[&x, &i], vec![("axis", A::Int(*axis as i64))], hint),
                )
            }
            Op::GatherNd { batch_dims } => {
                let x = self.plain(inp(0)?)?;
                let i = self.plain(inp(1)?)?;
                Repr::Plain(self.b.node(
                    "GatherND",
                    &[&x, &i],
                    vec![("batch_dims", A::Int(*batch_dims as i64))],
                    hint,
                ))
            }
            Op::Slice {
                axes,
                starts,
                ends,
                steps,
            } => {
                let x = self.plain(inp(0)?)?;
                let v = |s: &[usize]| s.iter().map(|&n| n as i64).collect::<Vec<_>>();
                let ends = ends
                    .iter()
                    .map(|d| {
                        d.fixed().ok_or_else(|| {
                            format!(
                                "the slice end {d} is symbolic, which export does not write yet"
                            )
                        })
                    })
                    .collect::<Result<Vec<usize>, String>>()?;
                let (st, en, ax, sp) = (
                    self.b.ints(&v(starts)),
                    self.b.ints(&v(&ends)),
                    self.b.ints(&v(axes)),
                    self.b.ints(&v(steps)),
                );
                Repr::Plain(
                    self.b
                        .node("Slice", &[&x, &st, &en, &ax, &sp], vec![], hint),
                )
            }
            other => {
                return Err(format!(
                    "internal: `{}` is not handled here",
                    other.mnemonic()
                ));
            }
        };
        Ok(Some(r))
    }

    /// The blocked layouts and the blocked layer (`block_act`, `unblock_act`,
    /// `brgemm`, `block_weight`, `unblock_weight`).
    fn blocked(
        &mut self,
        node: &Node,
        hint: &str,
        out_ty: &dlrm_ir::TensorType,
    ) -> Result<Repr, Fail> {
        let g = self.g;
        let ins = &node.inputs;
        let inp = |k: usize| operand(ins, k);
        let r = match &node.op {
            Op::BlockAct { dtype, .. } => {
                let x = self.plain(inp(0)?)?;
                let k = fixed(&g.ty(inp(0)?).shape[1], "the blocked features")?;
                let from = g.ty(inp(0)?).dtype;
                let name = if from == DType::BF16 {
                    x
                } else {
                    self.round(x, *dtype, hint)
                };
                Repr::Act { name, k }
            }
            Op::UnblockAct { k, dtype } => {
                let (x, k0) = self.act(inp(0)?)?;
                let from = g.ty(inp(0)?).dtype;
                let x = if *k == k0 {
                    x
                } else if *k < k0 {
                    let (st, en, ax) = (
                        self.b.ints(&[0]),
                        self.b.ints(&[*k as i64]),
                        self.b.ints(&[1]),
                    );
                    self.b.node("Slice", &[&x, &st, &en, &ax], vec![], hint)
                } else {
                    return Err(format!(
                        "unblock_act k={k} exceeds the {k0} features of its operand"
                    ));
                };
                Repr::Plain(if from == DType::BF16 {
                    x
                } else {
                    self.round(x, *dtype, hint)
                })
            }
            Op::Brgemm { act } if node.inputs.len() == 2 => {
                self.product(inp(0)?, inp(1)?, *act, out_ty.dtype, hint)?
            }
            Op::Brgemm { act } => {
                let (x, k) = self.act(inp(0)?)?;
                let n = fixed(&g.ty(inp(2)?).shape[0], "the bias length")?;
                let w = self.weight(inp(1)?, n, k)?;
                let b = self.plain(inp(2)?)?;
                let y = self.gemm(&x, &w, &b, *act, hint);
                Repr::Act {
                    name: self.round(y, out_ty.dtype, hint),
                    k: n,
                }
            }
            Op::BlockWeight { .. } => Repr::Weight(self.plain(inp(0)?)?),
            Op::UnblockWeight { n, k } => Repr::Plain(self.weight(inp(0)?, *n, *k)?),
            other => {
                return Err(format!(
                    "internal: `{}` is not handled here",
                    other.mnemonic()
                ));
            }
        };
        Ok(r)
    }

    /// `add`, `binary` or `matmul` of `a` and `b`; elementwise over two blocked
    /// activations of one width (a cross layer's `x0 ⊙ w + x`), on their `[S,k]`
    /// forms, blocked again.
    fn binary(
        &mut self,
        node: &Node,
        a: ValueId,
        b: ValueId,
        dtype: DType,
        hint: &str,
    ) -> Result<Repr, Fail> {
        let blocked = match (self.repr.get(&a), self.repr.get(&b)) {
            (Some(Repr::Act { k: ka, .. }), Some(Repr::Act { k: kb, .. }))
                if ka == kb && node.op != Op::MatMul =>
            {
                Some(*ka)
            }
            _ => None,
        };
        let (a, b) = match blocked {
            Some(_) => (self.act(a)?.0, self.act(b)?.0),
            None => (self.plain(a)?, self.plain(b)?),
        };
        let op = match &node.op {
            Op::MatMul => "MatMul",
            Op::Binary {
                kind: BinaryKind::Sub,
            } => "Sub",
            Op::Binary {
                kind: BinaryKind::Mul,
            } => "Mul",
            Op::Binary {
                kind: BinaryKind::Div,
            } => "Div",
            _ => "Add",
        };
        let y = self.b.node(op, &[&a, &b], vec![], hint);
        let name = self.round(y, dtype, hint);
        Ok(match blocked {
            Some(k) => Repr::Act { name, k },
            None => Repr::Plain(name),
        })
    }

    /// The bias-free `brgemm(xb, wb)` of a cross layer: `Gemm` without `C`, over
    /// all `Nb·bn` columns (the padding ones are 0; an `unblock_act` after it
    /// drops them).
    fn product(
        &mut self,
        xb: ValueId,
        wb: ValueId,
        act: Act,
        dtype: DType,
        hint: &str,
    ) -> Result<Repr, Fail> {
        let (x, k) = self.act(xb)?;
        let wt = self.g.ty(wb);
        let n = fixed(&wt.shape[0], "the weight's row blocks")?
            * fixed(&wt.shape[3], "the weight's bn")?;
        let w = self.weight(wb, n, k)?;
        let y = self
            .b
            .node("Gemm", &[&x, &w], vec![("transB", A::Int(1))], hint);
        let y = match act_op(act) {
            Some(op) => self.b.node(op, &[&y], vec![], hint),
            None => y,
        };
        Ok(Repr::Act {
            name: self.round(y, dtype, hint),
            k: n,
        })
    }

    /// `act(x · wᵀ + b)` as `Gemm(transB=1)` and the activation.
    fn gemm(&mut self, x: &str, w: &str, b: &str, act: Act, hint: &str) -> String {
        let pre = if act == Act::None {
            hint.to_string()
        } else {
            format!("{hint}.gemm")
        };
        let y = self
            .b
            .node("Gemm", &[x, w, b], vec![("transB", A::Int(1))], &pre);
        match act_op(act) {
            Some(op) => self.b.node(op, &[&y], vec![], hint),
            None => y,
        }
    }

    /// `ReduceSum`/`ReduceMean` over `axes` (as an input from opset 18, and for
    /// ReduceSum from 13).
    fn reduce(
        &mut self,
        x: &str,
        kind: Pool,
        axes: &[usize],
        keepdims: bool,
        hint: &str,
    ) -> String {
        let op = match kind {
            Pool::Sum => "ReduceSum",
            Pool::Mean => "ReduceMean",
        };
        let ax: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
        let keep = ("keepdims", A::Int(i64::from(keepdims)));
        if kind == Pool::Mean && self.b.opset < 18 {
            return self
                .b
                .node(op, &[x], vec![("axes", A::Ints(ax)), keep], hint);
        }
        let a = self.b.ints(&ax);
        self.b.node(op, &[x, &a], vec![keep], hint)
    }

    /// The representation of `v` (for the graph outputs).
    pub(crate) fn repr(&self, v: ValueId) -> Option<&Repr> {
        self.repr.get(&v)
    }

    /// Where `v` comes from.
    pub(crate) fn def(&self, v: ValueId) -> Def {
        self.g.value(v).def
    }
}

/// Operand `k` of a node's `ins`, or the error naming the missing one.
fn operand(ins: &[ValueId], k: usize) -> Result<ValueId, Fail> {
    ins.get(k)
        .copied()
        .ok_or_else(|| format!("missing operand {k}"))
}
