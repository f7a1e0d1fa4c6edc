//! Copying a graph with a chosen subset and order of its nodes: the common core of
//! dead-code elimination (a subset, order kept), scheduling (all nodes, a new
//! order) and the `canon` pass's storing of parameters transposed (parameters
//! retyped, some nodes replaced by a value already copied).
//!
//! The copy keeps the graph's interface (all inputs and parameters, in order; the
//! outputs and updates) and every value's name and type verbatim, except where a
//! [`Rewire`] says otherwise. A node whose operand is not defined earlier in the new
//! order, or an output or update whose value was left out, is an error naming the
//! value.

use crate::{PassError, Result};
use dlrm_ir::{Graph, Node, Op, TensorType, ValueId};

/// `g` with the nodes `order` (indices into `g.nodes()`, each at most once), in that
/// order. `pass` names the pass in errors.
/// Per value of `g`, the node that defines it (`None`: an input or a
/// parameter, defined before every node): what the peephole fusion passes
/// look up an operand's producer in.
pub(crate) fn definitions(g: &Graph) -> Vec<Option<usize>> {
    let mut def = vec![None; g.values().len()];
    for (i, n) in g.nodes().iter().enumerate() {
        for &o in &n.outputs {
            def[o.index()] = Some(i);
        }
    }
    def
}

/// Whether `v` leaves `g`: an output, or a parameter update's value or
/// parameter (a fusion that absorbs its producer would drop it).
pub(crate) fn exported(g: &Graph, v: ValueId) -> bool {
    g.outputs().contains(&v) || g.updates().iter().any(|u| u.value == v || u.param == v)
}

pub(crate) fn copy_nodes(
    g: &Graph,
    order: impl IntoIterator<Item = usize>,
    pass: &str,
) -> Result<Graph> {
    copy_rewired(g, order, pass, &Rewire::default())
}

/// A node of `g` to the value of `g` its single result is replaced by.
pub(crate) type Forward<'a> = dyn Fn(&Node) -> Option<ValueId> + 'a;

/// What [`copy_rewired`] changes in the copy.
#[derive(Default)]
pub(crate) struct Rewire<'a> {
    /// New types of some parameters (by value in `g`).
    pub param_types: Vec<(ValueId, TensorType)>,
    /// For a node of `g`, the value of `g` its single result is replaced by (the
    /// node is not copied; its result's users read that value's copy instead).
    pub forward: Option<&'a Forward<'a>>,
}

/// [`copy_nodes`] with the changes of `rw` (see [`Rewire`]).
pub(crate) fn copy_rewired(
    g: &Graph,
    order: impl IntoIterator<Item = usize>,
    pass: &str,
    rw: &Rewire<'_>,
) -> Result<Graph> {
    let mut c = Copier::new(g, pass, &rw.param_types)?;
    for n in order {
        let node = &g.nodes()[n];
        if let (Some(fwd), [o]) = (rw.forward, node.outputs.as_slice())
            && let Some(v) = fwd(node)
        {
            c.alias(*o, v)?;
            continue;
        }
        c.push(node.op.clone(), &node.inputs, &node.outputs)?;
    }
    c.finish()
}

/// A copy of `g` under construction: `g`'s inputs and parameters first (same
/// names and types, or a new type per [`Rewire::param_types`]), then nodes pushed
/// in any order that defines each operand before its use, each value of `g` mapped
/// to its copy; [`Copier::finish`] adds the outputs and updates. The passes that
/// rebuild a graph (this module's copies, `bucket`) share it.
pub(crate) struct Copier<'g> {
    g: &'g Graph,
    pass: &'g str,
    out: Graph,
    map: Vec<Option<ValueId>>,
}

impl<'g> Copier<'g> {
    /// The copy of `g`'s interface; `pass` names the pass in errors.
    pub(crate) fn new(
        g: &'g Graph,
        pass: &'g str,
        param_types: &[(ValueId, TensorType)],
    ) -> Result<Copier<'g>> {
        let err = PassError::ir(pass);
        let mut out = Graph::new(g.name.clone());
        let mut map: Vec<Option<ValueId>> = vec![None; g.values().len()];
        for &v in g.inputs() {
            map[v.index()] = Some(out.add_input(g.name_of(v), g.ty(v).clone()).map_err(&err)?);
        }
        for &v in g.params() {
            let ty = param_types
                .iter()
                .find(|(p, _)| *p == v)
                .map_or_else(|| g.ty(v).clone(), |(_, t)| t.clone());
            map[v.index()] = Some(out.add_param(g.name_of(v), ty).map_err(&err)?);
        }
        Ok(Copier { g, pass, out, map })
    }

    /// The copy of `g`'s value `v` (an error naming it if not copied yet).
    pub(crate) fn get(&self, v: ValueId) -> Result<ValueId> {
        self.map[v.index()].ok_or_else(|| PassError::Graph {
            pass: self.pass.to_string(),
            graph: self.g.name.clone(),
            reason: format!(
                "value %{} is used but not defined before",
                self.g.name_of(v)
            ),
        })
    }

    /// Maps `old` to the copy of `to` (`old`'s users read that value instead).
    pub(crate) fn alias(&mut self, old: ValueId, to: ValueId) -> Result<()> {
        self.map[old.index()] = Some(self.get(to)?);
        Ok(())
    }

    /// Appends `op` on the copies of `inputs` (values of `g`), with results named
    /// and typed as `results` (values of `g`, which then map to them).
    pub(crate) fn push(&mut self, op: Op, inputs: &[ValueId], results: &[ValueId]) -> Result<()> {
        let ins = inputs
            .iter()
            .map(|&v| self.get(v))
            .collect::<Result<Vec<_>>>()?;
        let decl = results
            .iter()
            .map(|&v| (self.g.name_of(v).to_string(), self.g.ty(v).clone()))
            .collect();
        let new = self
            .out
            .push_node_unchecked(op, ins, decl)
            .map_err(PassError::ir(self.pass))?;
        for (&old, new) in results.iter().zip(new) {
            self.map[old.index()] = Some(new);
        }
        Ok(())
    }

    /// The copy, with `g`'s outputs and updates.
    pub(crate) fn finish(mut self) -> Result<Graph> {
        let outputs = self
            .g
            .outputs()
            .iter()
            .map(|&v| self.get(v))
            .collect::<Result<Vec<_>>>()?;
        self.out.set_outputs(outputs);
        for u in self.g.updates() {
            let (p, v) = (self.get(u.param)?, self.get(u.value)?);
            self.out
                .add_update(p, v)
                .map_err(PassError::ir(self.pass))?;
        }
        Ok(self.out)
    }
}
