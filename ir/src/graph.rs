//! The graph: SSA values, nodes, inputs, parameters, outputs and state updates.
//!
//! Invariants (checked by [`crate::verify()`]):
//! - every value is defined exactly once: as an input, a parameter, or a node result;
//! - value names are unique within a graph;
//! - nodes are in a valid execution order: operands are defined before use;
//! - every result's declared type equals what [`crate::infer()`] derives;
//! - an update `param <- value` names a parameter and a value of the same type, each
//!   parameter at most once. After a step the runtime replaces the parameter by the
//!   value (optimizer updates are functional in the IR; the runtime does them in place).

use crate::error::{IrError, Result};
use crate::infer::infer;
use crate::op::{Attr, Op};
use crate::types::{Dim, TensorType};
use std::collections::HashMap;

/// Identifies a value in its graph (an index into the value table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

impl ValueId {
    /// The index into the value table.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Where a value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Def {
    /// The i-th graph input (data fed each step).
    Input(usize),
    /// The i-th parameter (persistent state, initial values in the plan).
    Param(usize),
    /// Result `k` of node `n`.
    Node(usize, usize),
}

/// A value: its name (without `%`), type and definition.
#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    /// Unique name.
    pub name: String,
    /// Type.
    pub ty: TensorType,
    /// Definition.
    pub def: Def,
}

/// One operation applied to values.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// The op and its attributes.
    pub op: Op,
    /// Operands.
    pub inputs: Vec<ValueId>,
    /// Results.
    pub outputs: Vec<ValueId>,
}

/// A parameter replaced by a new value at the end of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Update {
    /// The parameter.
    pub param: ValueId,
    /// Its new value.
    pub value: ValueId,
}

/// A typed SSA tensor graph.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    /// The graph's name (`@name` in the text form).
    pub name: String,
    values: Vec<Value>,
    inputs: Vec<ValueId>,
    params: Vec<ValueId>,
    nodes: Vec<Node>,
    outputs: Vec<ValueId>,
    updates: Vec<Update>,
    by_name: HashMap<String, ValueId>,
}

impl Graph {
    /// An empty graph.
    pub fn new(name: impl Into<String>) -> Self {
        Graph {
            name: name.into(),
            ..Default::default()
        }
    }

    /// Replaces the symbol `sym` by the expression `by` in every type and every
    /// dimension attribute (an importer that learns `n = B+1` from an equation the
    /// model implies). The graph stays well typed: types were inferred from the
    /// same dimensions.
    pub fn substitute(&mut self, sym: &str, by: &crate::DimExpr) -> Result<()> {
        let name = self.name.clone();
        let bad = |d: &Dim| IrError::Graph {
            graph: name.clone(),
            reason: format!("substituting {sym} := {by} in {d} gives no dimension"),
        };
        let sub = |d: &Dim| -> Result<Dim> {
            if !d.symbols().contains(&sym) {
                return Ok(d.clone());
            }
            d.to_expr()
                .substitute(sym, by)
                .and_then(Dim::from_expr)
                .ok_or_else(|| bad(d))
        };
        for v in &mut self.values {
            for d in &mut v.ty.shape {
                *d = sub(d)?;
            }
        }
        for n in &mut self.nodes {
            let mut attrs: Vec<(String, Attr)> = Vec::new();
            let mut changed = false;
            for (k, a) in n.op.attrs() {
                let a2 = match &a {
                    Attr::Dim(d) => Attr::Dim(sub(d)?),
                    Attr::List(ds) => Attr::List(ds.iter().map(sub).collect::<Result<_>>()?),
                    other => other.clone(),
                };
                changed |= a2 != a;
                attrs.push((k.to_string(), a2));
            }
            if changed {
                n.op =
                    Op::from_parts(n.op.mnemonic(), &attrs).map_err(|reason| IrError::Graph {
                        graph: name.clone(),
                        reason,
                    })?;
            }
        }
        Ok(())
    }

    /// Gives graph input `v` the type `ty` (an importer that learns a dimension
    /// name was a hint: the caller keeps the graph well typed, e.g. by changing a
    /// length only its users do not constrain; [`crate::verify()`] checks it).
    pub fn set_input_type(&mut self, v: ValueId, ty: TensorType) -> Result<()> {
        let value = self
            .values
            .get_mut(v.index())
            .ok_or_else(|| IrError::Graph {
                graph: self.name.clone(),
                reason: format!("no value {}", v.index()),
            })?;
        if !matches!(value.def, Def::Input(_)) {
            return Err(IrError::Graph {
                graph: self.name.clone(),
                reason: format!("%{} is not a graph input", value.name),
            });
        }
        value.ty = ty;
        Ok(())
    }

    // ------------------------------------------------------------ accessors

    /// All values, indexed by [`ValueId`].
    pub fn values(&self) -> &[Value] {
        &self.values
    }
    /// A value.
    pub fn value(&self, id: ValueId) -> &Value {
        &self.values[id.index()]
    }
    /// A value's type.
    pub fn ty(&self, id: ValueId) -> &TensorType {
        &self.values[id.index()].ty
    }
    /// A value's name.
    pub fn name_of(&self, id: ValueId) -> &str {
        &self.values[id.index()].name
    }
    /// Looks a value up by name.
    pub fn find(&self, name: &str) -> Option<ValueId> {
        self.by_name.get(name).copied()
    }
    /// Graph inputs, in order.
    pub fn inputs(&self) -> &[ValueId] {
        &self.inputs
    }
    /// Parameters, in order.
    pub fn params(&self) -> &[ValueId] {
        &self.params
    }
    /// Nodes, in execution order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }
    /// Graph outputs, in order.
    pub fn outputs(&self) -> &[ValueId] {
        &self.outputs
    }
    /// State updates, in order.
    pub fn updates(&self) -> &[Update] {
        &self.updates
    }

    /// A short description of node `n` for diagnostics: `#n %first_result`.
    pub fn node_label(&self, n: usize) -> String {
        match self.nodes.get(n).and_then(|node| node.outputs.first()) {
            Some(&v) => format!("#{n} %{}", self.name_of(v)),
            None => format!("#{n}"),
        }
    }

    /// For each value, the indices of the nodes that use it (in order).
    pub fn users(&self) -> Vec<Vec<usize>> {
        let mut users = vec![Vec::new(); self.values.len()];
        for (n, node) in self.nodes.iter().enumerate() {
            for &v in &node.inputs {
                users[v.index()].push(n);
            }
        }
        users
    }

    // -------------------------------------------------------------- builder

    /// Makes `hint` unique among this graph's names (`hint`, `hint.1`, `hint.2`, ...).
    pub fn fresh_name(&self, hint: &str) -> String {
        if !self.by_name.contains_key(hint) {
            return hint.to_string();
        }
        (1..)
            .map(|i| format!("{hint}.{i}"))
            .find(|n| !self.by_name.contains_key(n))
            .unwrap_or_else(|| unreachable!("an unbounded range always finds a free name"))
    }

    fn push_value(&mut self, name: &str, ty: TensorType, def: Def) -> Result<ValueId> {
        if self.by_name.contains_key(name) {
            return Err(IrError::Graph {
                graph: self.name.clone(),
                reason: format!("value %{name} is defined twice"),
            });
        }
        let id = ValueId(self.values.len() as u32);
        self.values.push(Value {
            name: name.to_string(),
            ty,
            def,
        });
        self.by_name.insert(name.to_string(), id);
        Ok(id)
    }

    /// Adds a graph input. The name must be unique.
    pub fn add_input(&mut self, name: &str, ty: TensorType) -> Result<ValueId> {
        let id = self.push_value(name, ty, Def::Input(self.inputs.len()))?;
        self.inputs.push(id);
        Ok(id)
    }

    /// Adds a parameter. The name must be unique.
    pub fn add_param(&mut self, name: &str, ty: TensorType) -> Result<ValueId> {
        let id = self.push_value(name, ty, Def::Param(self.params.len()))?;
        self.params.push(id);
        Ok(id)
    }

    /// Adds a node whose result types are inferred; result names are made unique
    /// from `names` (one hint per result). Returns the results.
    pub fn add_node(&mut self, op: Op, inputs: &[ValueId], names: &[&str]) -> Result<Vec<ValueId>> {
        self.add_node_typed(op, inputs, names, &[])
    }

    /// Adds a node with a single result; returns it.
    pub fn add(&mut self, op: Op, inputs: &[ValueId], name: &str) -> Result<ValueId> {
        let outs = self.add_node(op, inputs, &[name])?;
        Ok(outs[0])
    }

    /// Adds a node with declared result types (needed by ops whose results depend on
    /// other ranks, see [`Op::AllToAll`]); the declared types are checked.
    pub fn add_node_typed(
        &mut self,
        op: Op,
        inputs: &[ValueId],
        names: &[&str],
        declared: &[TensorType],
    ) -> Result<Vec<ValueId>> {
        let n = self.nodes.len();
        let node_err = |g: &Graph, reason: String| IrError::Node {
            node: format!("#{n} %{}", names.first().copied().unwrap_or("?")),
            op: op.mnemonic().to_string(),
            reason: format!("{reason} (in graph `{}`)", g.name),
        };
        for &v in inputs {
            if v.index() >= self.values.len() {
                return Err(node_err(self, format!("operand {v:?} does not exist")));
            }
        }
        let in_tys: Vec<&TensorType> = inputs.iter().map(|&v| self.ty(v)).collect();
        let out_tys = infer(&op, &in_tys, declared).map_err(|r| node_err(self, r))?;
        if names.len() != out_tys.len() {
            return Err(node_err(
                self,
                format!(
                    "{} result names given for {} results",
                    names.len(),
                    out_tys.len()
                ),
            ));
        }
        let mut outputs = Vec::with_capacity(out_tys.len());
        for (k, (ty, hint)) in out_tys.into_iter().zip(names).enumerate() {
            let name = self.fresh_name(hint);
            outputs.push(self.push_value(&name, ty, Def::Node(n, k))?);
        }
        self.nodes.push(Node {
            op,
            inputs: inputs.to_vec(),
            outputs: outputs.clone(),
        });
        Ok(outputs)
    }

    /// Appends a node exactly as given (result names and types taken verbatim, not
    /// re-inferred): for parsers and passes that copy nodes. Run the verifier after.
    pub fn push_node_unchecked(
        &mut self,
        op: Op,
        inputs: Vec<ValueId>,
        results: Vec<(String, TensorType)>,
    ) -> Result<Vec<ValueId>> {
        let n = self.nodes.len();
        let mut outputs = Vec::with_capacity(results.len());
        for (k, (name, ty)) in results.into_iter().enumerate() {
            outputs.push(self.push_value(&name, ty, Def::Node(n, k))?);
        }
        self.nodes.push(Node {
            op,
            inputs,
            outputs: outputs.clone(),
        });
        Ok(outputs)
    }

    /// Marks a value as a graph output.
    pub fn add_output(&mut self, v: ValueId) {
        self.outputs.push(v);
    }

    /// Replaces the output list.
    pub fn set_outputs(&mut self, outs: Vec<ValueId>) {
        self.outputs = outs;
    }

    /// Declares that `param` takes `value` at the end of each step.
    pub fn add_update(&mut self, param: ValueId, value: ValueId) -> Result<()> {
        if !matches!(self.value(param).def, Def::Param(_)) {
            return Err(IrError::Graph {
                graph: self.name.clone(),
                reason: format!("update target %{} is not a parameter", self.name_of(param)),
            });
        }
        self.updates.push(Update { param, value });
        Ok(())
    }

    /// The parameter names in order, with their types.
    pub fn param_types(&self) -> impl Iterator<Item = (&str, &TensorType)> {
        self.params.iter().map(|&p| (self.name_of(p), self.ty(p)))
    }
}

impl PartialEq for Graph {
    /// Structural equality: same name, same inputs/params/outputs/updates by name and
    /// type, same nodes (op, operand names, result names and types) in the same order.
    /// Value ids are not compared, so graphs built in different orders can be equal.
    fn eq(&self, other: &Self) -> bool {
        let vals = |g: &Graph, ids: &[ValueId]| -> Vec<(String, TensorType)> {
            ids.iter()
                .map(|&v| (g.name_of(v).to_string(), g.ty(v).clone()))
                .collect()
        };
        let names = |g: &Graph, ids: &[ValueId]| -> Vec<String> {
            ids.iter().map(|&v| g.name_of(v).to_string()).collect()
        };
        let upd = |g: &Graph| -> Vec<(String, String)> {
            g.updates
                .iter()
                .map(|u| {
                    (
                        g.name_of(u.param).to_string(),
                        g.name_of(u.value).to_string(),
                    )
                })
                .collect()
        };
        self.name == other.name
            && vals(self, &self.inputs) == vals(other, &other.inputs)
            && vals(self, &self.params) == vals(other, &other.params)
            && names(self, &self.outputs) == names(other, &other.outputs)
            && upd(self) == upd(other)
            && self.nodes.len() == other.nodes.len()
            && self.nodes.iter().zip(&other.nodes).all(|(a, b)| {
                a.op == b.op
                    && names(self, &a.inputs) == names(other, &b.inputs)
                    && vals(self, &a.outputs) == vals(other, &b.outputs)
            })
    }
}
