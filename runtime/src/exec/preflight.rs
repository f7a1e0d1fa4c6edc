//! What is checked before a step's nodes run. The graph's symbols are bound from
//! the inputs' and parameters' shapes ([`Executor::bind_symbols`]); inputs are
//! checked against their declared types (dtype, fixed dims, bound symbols) like
//! `interp::run`, and so are parameters with symbolic dimensions.
//!
//! Instances ([`Executor::instantiate`]): under a new binding every compute node's
//! [`NodeInstance`] is built once — its concrete operand and result types, the
//! op's shape rule run on them — and kept while the binding holds; each call then
//! only checks its operands against it (O(rank) per operand).
//!
//! Memory ([`Executor::check_buffers`]): before the first step under a symbol
//! binding (e.g. a batch size), every buffer of the step that binding sizes (the
//! inputs, each node's results: activations, gradients, all-to-all buffers) is
//! reserved once with [`dlrm_ir::init::try_reserve`] and released, so a buffer this
//! process cannot hold is an error naming the value and its bytes ("`%bot.0`
//! needs N bytes") instead of an abort inside a kernel. The driver runs the check
//! before its loader assembles the first batch. It is a check of each buffer on
//! its own, not of their sum (that is the memory account's, `dlrm-run`'s check
//! before anything is allocated); with the kernel's overcommit an allocation the
//! machine cannot back still succeeds and fails later when touched.

use super::{Executor, Resolved, stored_len};
use crate::error::{Result, RuntimeError};
use dlrm_ir::{Def, Dim, NodeInstance, Tensor, TensorType, ValueId};
use std::collections::HashMap;

impl Executor {
    /// Binds the graph's symbols from the shapes of `inputs` and the parameters
    /// (conflicts are errors naming the input). Symbols carried by no input (e.g.
    /// `G` on a rank that owns no table) are absent: the caller adds them.
    pub fn bind_symbols(&self, inputs: &HashMap<String, Tensor>) -> Result<HashMap<String, usize>> {
        let mut syms: HashMap<String, usize> = HashMap::new();
        let g = &self.graph;
        let sources = g
            .inputs()
            .iter()
            .map(|&v| (v, inputs.get(g.name_of(v))))
            .chain(g.params().iter().map(|&v| match g.value(v).def {
                Def::Param(p) => (v, self.params[p].as_deref()),
                _ => (v, None),
            }));
        let mut exprs: Vec<(dlrm_ir::DimExpr, usize)> = Vec::new();
        let mut expr_input = String::new();
        for (v, t) in sources {
            let Some(t) = t else { continue };
            let ty = g.ty(v);
            for (d, &n) in ty.shape.iter().zip(&t.shape) {
                if let Dim::Expr(e) = d {
                    if exprs.is_empty() {
                        expr_input = g.name_of(v).to_string();
                    }
                    exprs.push((e.clone(), n));
                    continue;
                }
                let Dim::Sym(s) = d else { continue };
                match syms.get(s) {
                    None => {
                        syms.insert(s.clone(), n);
                    }
                    Some(&b) if b == n => {}
                    Some(&b) => {
                        return Err(RuntimeError::Input {
                            rank: self.rank,
                            step: self.step,
                            name: g.name_of(v).to_string(),
                            reason: format!("symbol {s} is {n} here but {b} from an earlier input"),
                        });
                    }
                }
            }
        }
        // `B+1 = 8`: solved for a symbol no plain dimension bound, then checked.
        dlrm_ir::dim::bind_exprs(&exprs, &mut syms).map_err(|reason| RuntimeError::Input {
            rank: self.rank,
            step: self.step,
            name: expr_input,
            reason,
        })?;
        Ok(syms)
    }

    /// Checks that each buffer a step under `syms` allocates can be allocated (see
    /// the module docs): every input and node result whose shape `syms` resolves
    /// (but the results of updates in place, which take their operands' storage) is
    /// reserved ([`dlrm_ir::init::try_reserve`]) and released. A buffer that cannot
    /// be is an error naming the rank, the step, the value and its bytes. What
    /// passed is remembered: the same binding again costs a comparison, another one
    /// (a last partial batch, variable bags) reserves only the buffers larger than
    /// before.
    pub fn check_buffers(&mut self, syms: &HashMap<String, usize>) -> Result<()> {
        if self.checked.0.as_ref() == Some(syms) {
            return Ok(());
        }
        let g = &self.graph;
        for (i, v) in g.values().iter().enumerate() {
            // Parameters are held already; an in-place update's results take its
            // operands' storage.
            let in_place = matches!(v.def, Def::Node(n, _) if self.may_move[n]);
            if matches!(v.def, Def::Param(_)) || in_place {
                continue;
            }
            let ty = g.ty(ValueId(i as u32));
            let dims: Option<Vec<u128>> = ty
                .shape
                .iter()
                .map(|d| d.resolve(&|s| syms.get(s).copied()).map(|n| n as u128))
                .collect();
            let Some(dims) = dims else { continue };
            let elems = dims.iter().fold(1u128, |a, &d| a.saturating_mul(d));
            let bytes = elems.saturating_mul(ty.dtype.size_bytes() as u128);
            if bytes <= self.checked.1[i] {
                continue;
            }
            let what = format!("%{}", g.name_of(ValueId(i as u32)));
            dlrm_ir::init::try_reserve::<u8>(&what, bytes).map_err(|e| RuntimeError::Rank {
                rank: self.rank,
                step: Some(self.step),
                reason: e.to_string(),
            })?;
            self.checked.1[i] = bytes;
        }
        self.checked.0 = Some(syms.clone());
        Ok(())
    }

    /// Builds each node's instance under `syms` ([`NodeInstance::new`]: its
    /// operand types resolved, its shape rule run once on them and its declared
    /// results checked). Under a new binding only the nodes whose types name a
    /// symbol whose size changed are rebuilt (variable bags: the nodes of the
    /// bags' index count). The kernels then take operands checked against the
    /// instance ([`dlrm_codegen::try_eval_instance`]; an update's parameters too,
    /// [`dlrm_codegen::update_in_place_instance`]) and re-derive no shape.
    /// Collectives have none, and so has a node whose types do not resolve or
    /// verify: its kernel call verifies the operands it is given, per call, and
    /// reports what does not fit.
    pub(super) fn instantiate(&mut self, syms: &HashMap<String, usize>) {
        let old = self.instances.0.take();
        if old.as_ref() == Some(syms) {
            self.instances.0 = old;
            return;
        }
        let changed = |s: &str| old.as_ref().is_none_or(|o| o.get(s) != syms.get(s));
        let g = &self.graph;
        let n_nodes = g.nodes().len();
        self.instances.1.resize(n_nodes, None);
        self.resolved.resize(n_nodes, Resolved::default());
        let nodes = g.nodes().iter().zip(&mut self.instances.1);
        for ((node, slot), resolved) in nodes.zip(&mut self.resolved) {
            if node.op.is_collective() {
                continue;
            }
            let values = || node.inputs.iter().chain(&node.outputs);
            let stale = values()
                .flat_map(|&v| g.ty(v).shape.iter())
                .any(|d| d.symbols().into_iter().any(changed));
            if slot.is_some() && !stale {
                continue;
            }
            let ins: Vec<TensorType> = node.inputs.iter().map(|&v| g.ty(v).clone()).collect();
            let outs: Vec<TensorType> = node.outputs.iter().map(|&v| g.ty(v).clone()).collect();
            *slot = NodeInstance::new(&node.op, &ins, &outs, syms).ok();
            *resolved = Resolved::default();
        }
        self.instances.0 = Some(syms.clone());
    }

    pub(super) fn bind_inputs(
        &mut self,
        mut inputs: HashMap<String, Tensor>,
        syms: &HashMap<String, usize>,
    ) -> Result<()> {
        let bind = |s: &str| syms.get(s).copied();
        for i in 0..self.graph.inputs().len() {
            let v = self.graph.inputs()[i];
            let name = self.graph.name_of(v);
            let ty = self.graph.ty(v);
            let t = inputs
                .remove(name)
                .ok_or_else(|| self.input_err(name, format!("missing (declared {ty})")))?;
            if !t.matches(ty, &bind) || stored_len(&t) != t.numel() {
                return Err(self.input_err(
                    name,
                    format!(
                        "given {}{:?} but declared {ty}{}",
                        t.dtype(),
                        t.shape,
                        fmt_syms(ty, syms)
                    ),
                ));
            }
            self.slots[v.index()] = Some(t);
        }
        if let Some(extra) = inputs.keys().min() {
            return Err(self.input_err(
                extra,
                format!("graph `{}` has no such input", self.graph.name),
            ));
        }
        // Parameters with symbolic dimensions are checked under this binding.
        for (p, &v) in self.graph.params().iter().enumerate() {
            let ty = self.graph.ty(v);
            if ty.shape.iter().all(|d| d.fixed().is_some()) {
                continue;
            }
            if let Some(t) = self.params[p].as_deref()
                && !t.matches(ty, &bind)
            {
                return Err(RuntimeError::Param {
                    name: self.graph.name_of(v).to_string(),
                    reason: format!(
                        "rank {}: is {:?} but declared {ty}{}",
                        self.rank,
                        t.shape,
                        fmt_syms(ty, syms)
                    ),
                });
            }
        }
        Ok(())
    }

    fn input_err(&self, name: &str, reason: String) -> RuntimeError {
        RuntimeError::Input {
            rank: self.rank,
            step: self.step,
            name: name.to_string(),
            reason,
        }
    }
}

fn fmt_syms(ty: &TensorType, syms: &HashMap<String, usize>) -> String {
    let mut parts: Vec<String> = Vec::new();
    for s in ty.shape.iter().flat_map(Dim::symbols) {
        let p = syms
            .get(s)
            .map_or_else(|| format!("{s} unbound"), |v| format!("{s}={v}"));
        if !parts.contains(&p) {
            parts.push(p);
        }
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" (with {})", parts.join(", "))
    }
}
