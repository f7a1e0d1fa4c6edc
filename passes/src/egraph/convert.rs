//! Graph -> e-graph -> graph.
//!
//! [`encode`] adds every node of a graph to a fresh e-graph (inputs and parameters
//! become `%name` leaves; a multi-result node becomes a tuple class with one `get`
//! per result) and remembers each value's e-class and name. [`decode`] rebuilds a
//! graph from the e-graph given the node to use for each e-class (the extractor's
//! choice), starting from the outputs and the update values: only what they need
//! is emitted, in a valid order (operands first). The interface is kept verbatim:
//! the graph's name, every input and parameter (name, type, order), outputs and
//! updates. Every value whose e-class is emitted keeps its original name (where
//! rules united values, the output's name, else the first in source order); new
//! values get fresh names derived from the value they help compute
//! (`<name>.<mnemonic>`), never taken from the original graph's names.

use super::lang::{Data, Dl, DlGraph, GET, Tag, Types, ValueRef, split_children};
use crate::{PassError, Result};
use dlrm_ir::{Attr, Def, Graph, Op, TensorType, ValueId};
use egg::{Id, Symbol};
use std::collections::{HashMap, HashSet};

/// A graph in an e-graph.
pub struct Encoded {
    /// The e-graph.
    pub egraph: DlGraph,
    /// Per value of the source graph (by index): its e-class.
    pub class_of: Vec<Id>,
    /// Original value names by e-class (first value wins).
    pub names: HashMap<Id, String>,
}

/// Adds an attribute tag and returns its class.
pub fn tag(eg: &mut DlGraph, key: &str, attr: &Attr) -> Id {
    eg.add(Dl::Tag(Tag::new(key, attr)))
}

/// The children of an op e-node: its attribute tags then the operands.
pub fn op_children(eg: &mut DlGraph, op: &Op, operands: &[Id]) -> Vec<Id> {
    let mut ch: Vec<Id> = op.attrs().iter().map(|(k, a)| tag(eg, k, a)).collect();
    ch.extend_from_slice(operands);
    ch
}

/// Encodes `g` (see the module docs).
pub fn encode(g: &Graph) -> Encoded {
    let mut leaves = HashMap::new();
    for &v in g.inputs().iter().chain(g.params()) {
        leaves.insert(Symbol::from(g.name_of(v)), g.ty(v).clone());
    }
    let mut eg = DlGraph::new(Types {
        leaves,
        ..Types::default()
    });
    let mut class_of = vec![Id::from(0usize); g.values().len()];
    let mut names = HashMap::new();
    for &v in g.inputs().iter().chain(g.params()) {
        let id = eg.add(Dl::Value(ValueRef(Symbol::from(g.name_of(v)))));
        class_of[v.index()] = id;
        names.insert(id, g.name_of(v).to_string());
    }
    for node in g.nodes() {
        let operands: Vec<Id> = node.inputs.iter().map(|v| class_of[v.index()]).collect();
        let ch = op_children(&mut eg, &node.op, &operands);
        let id = eg.add(Dl::Op(Symbol::from(node.op.mnemonic()), ch));
        if node.outputs.len() == 1 {
            class_of[node.outputs[0].index()] = id;
            names
                .entry(id)
                .or_insert_with(|| g.name_of(node.outputs[0]).to_string());
        } else {
            for (k, &o) in node.outputs.iter().enumerate() {
                let t = tag(&mut eg, "i", &Attr::Int(k as i64));
                let get = eg.add(Dl::Op(Symbol::from(GET), vec![t, id]));
                class_of[o.index()] = get;
                names.entry(get).or_insert_with(|| g.name_of(o).to_string());
            }
        }
    }
    eg.analysis.names = names.clone();
    eg.rebuild();
    Encoded {
        egraph: eg,
        class_of,
        names,
    }
}

struct Decoder<'a, F: Fn(Id) -> Dl> {
    src: &'a Graph,
    eg: &'a DlGraph,
    best: F,
    names: HashMap<Id, String>,
    taken: HashSet<String>,
    out: Graph,
    memo: HashMap<Id, Vec<ValueId>>,
    /// Classes being emitted (cycle guard).
    open: HashSet<Id>,
}

fn err(g: &Graph, reason: String) -> PassError {
    PassError::Graph {
        pass: super::ID.to_string(),
        graph: g.name.clone(),
        reason,
    }
}

impl<F: Fn(Id) -> Dl> Decoder<'_, F> {
    fn fresh(&mut self, hint: &str) -> String {
        let free = |s: &Self, n: &str| !s.taken.contains(n) && s.out.find(n).is_none();
        let name = if free(self, hint) {
            hint.to_string()
        } else {
            (1..)
                .map(|i| format!("{hint}.{i}"))
                .find(|n| free(self, n))
                .unwrap_or_else(|| unreachable!("an unbounded range always finds a free name"))
        };
        self.taken.insert(name.clone());
        name
    }

    /// The name of class `c`'s value: its original name, else a fresh one.
    fn name_for(&mut self, c: Id, hint: &str) -> String {
        match self.names.get(&c) {
            Some(n) if self.out.find(n).is_none() => n.clone(),
            _ => self.fresh(hint),
        }
    }

    fn single(&mut self, c: Id, hint: &str) -> Result<ValueId> {
        let vs = self.emit(c, hint)?;
        match vs.as_slice() {
            [v] => Ok(*v),
            _ => Err(err(
                self.src,
                format!("e-class {c} has {} results where one is needed", vs.len()),
            )),
        }
    }

    fn emit(&mut self, c: Id, hint: &str) -> Result<Vec<ValueId>> {
        let c = self.eg.find(c);
        if let Some(v) = self.memo.get(&c) {
            return Ok(v.clone());
        }
        if !self.open.insert(c) {
            return Err(err(self.src, format!("cycle through e-class {c}")));
        }
        let base = match self.names.get(&c) {
            Some(n) => n.clone(),
            None => super::lang::class_name(self.eg, c).unwrap_or_else(|| hint.to_string()),
        };
        let node = (self.best)(c);
        let vals = match &node {
            Dl::Tag(t) => return Err(err(self.src, format!("tag {t} used as a value"))),
            Dl::Value(v) => {
                let id = self.out.find(v.0.as_str()).ok_or_else(|| {
                    err(self.src, format!("%{} is not an input or parameter", v.0))
                })?;
                vec![id]
            }
            Dl::Op(m, children) => {
                let (attrs, operands) = split_children(self.eg, children);
                if m.as_str() == GET {
                    let k = match attrs.first() {
                        Some((_, Attr::Int(k))) => *k as usize,
                        _ => return Err(err(self.src, "get without an index".into())),
                    };
                    let t = operands
                        .first()
                        .copied()
                        .ok_or_else(|| err(self.src, "get without a tuple".into()))?;
                    let vs = self.emit(t, &base)?;
                    let v = vs
                        .get(k)
                        .copied()
                        .ok_or_else(|| err(self.src, format!("get {k} of a {}-tuple", vs.len())))?;
                    vec![v]
                } else {
                    let op = Op::from_parts(m.as_str(), &attrs)
                        .map_err(|e| err(self.src, format!("e-node `{m}`: {e}")))?;
                    let own_hint = if self.names.contains_key(&c) {
                        base.clone()
                    } else {
                        super::lang::class_name(self.eg, c).unwrap_or_else(|| format!("{hint}.{m}"))
                    };
                    let child_hint = own_hint.clone();
                    let mut ins = Vec::with_capacity(operands.len());
                    for &o in &operands {
                        ins.push(self.single(o, &child_hint)?);
                    }
                    let types = match &self.eg[c].data {
                        Data::Types(Some(t)) => t.clone(),
                        _ => return Err(err(self.src, format!("e-class {c} (`{m}`) has no type"))),
                    };
                    let names: Vec<String> = if types.len() == 1 {
                        vec![self.name_for(c, &own_hint)]
                    } else {
                        (0..types.len())
                            .map(|k| {
                                let get = self.lookup_get(c, k);
                                match get {
                                    Some(gc) => {
                                        let h = super::lang::class_name(self.eg, gc)
                                            .unwrap_or_else(|| format!("{own_hint}.{k}"));
                                        self.name_for(gc, &h)
                                    }
                                    None => self.fresh(&format!("{own_hint}.{k}")),
                                }
                            })
                            .collect()
                    };
                    let results: Vec<(String, TensorType)> = names.into_iter().zip(types).collect();
                    self.out
                        .push_node_unchecked(op, ins, results)
                        .map_err(PassError::ir(super::ID))?
                }
            }
        };
        self.open.remove(&c);
        self.memo.insert(c, vals.clone());
        Ok(vals)
    }

    fn lookup_get(&self, tuple: Id, k: usize) -> Option<Id> {
        let t = self
            .eg
            .lookup(Dl::Tag(Tag::new("i", &Attr::Int(k as i64))))?;
        self.eg
            .lookup(Dl::Op(Symbol::from(GET), vec![t, tuple]))
            .map(|c| self.eg.find(c))
    }
}

/// Rebuilds a graph from the e-graph of `enc` (see the module docs); `best` gives
/// the e-node chosen for each (canonical) e-class.
pub fn decode(src: &Graph, enc: &Encoded, best: impl Fn(Id) -> Dl) -> Result<Graph> {
    let eg = &enc.egraph;
    let mut names = HashMap::new();
    // Names of the source values, by canonical class: the outputs' names first (an
    // output keeps its name when a rule unites it with an earlier value, e.g. an
    // identity reshape), then source order (first wins).
    for &o in src.outputs() {
        let c = eg.find(enc.class_of[o.index()]);
        names.entry(c).or_insert_with(|| src.name_of(o).to_string());
    }
    for (i, v) in src.values().iter().enumerate() {
        let c = eg.find(enc.class_of[i]);
        names.entry(c).or_insert_with(|| v.name.clone());
    }
    let mut out = Graph::new(src.name.clone());
    let e = PassError::ir(super::ID);
    for &v in src.inputs() {
        out.add_input(src.name_of(v), src.ty(v).clone())
            .map_err(e)?;
    }
    for &v in src.params() {
        out.add_param(src.name_of(v), src.ty(v).clone())
            .map_err(e)?;
    }
    let mut d = Decoder {
        src,
        eg,
        best,
        names,
        taken: src.values().iter().map(|v| v.name.clone()).collect(),
        out,
        memo: HashMap::new(),
        open: HashSet::new(),
    };
    let mut outputs = Vec::new();
    for &o in src.outputs() {
        let c = enc.class_of[o.index()];
        outputs.push(d.single(c, src.name_of(o))?);
    }
    let mut updates = Vec::new();
    for u in src.updates() {
        let c = enc.class_of[u.value.index()];
        let v = d.single(c, src.name_of(u.value))?;
        updates.push((src.name_of(u.param).to_string(), v));
    }
    let mut out = d.out;
    out.set_outputs(outputs);
    for (p, v) in updates {
        let pid = out
            .find(&p)
            .filter(|&id| matches!(out.value(id).def, Def::Param(_)))
            .ok_or_else(|| err(src, format!("update target %{p} is lost")))?;
        out.add_update(pid, v).map_err(e)?;
    }
    Ok(out)
}
