//! The reference interpreter: the executable definition of every op.
//! (being written: the signatures below are the contract)

use crate::{Communicator, Graph, Op, Result, Tensor, TensorType};
use std::collections::HashMap;

/// What an op may need besides its operands: symbol sizes and the rank's group.
pub struct EvalCtx<'a> {
    /// Sizes bound to symbolic dimensions (`B`, `G`, ...).
    pub syms: &'a HashMap<String, usize>,
    /// This rank's communicator ([`crate::SingleRank`] when alone).
    pub comm: &'a dyn Communicator,
}

/// Evaluates one op on concrete operands. `out_types` are the node's declared
/// result types (the result dtypes; the shapes of data received from other ranks).
/// Errors are plain messages; [`run`] attaches the node.
pub fn eval_op(
    op: &Op,
    inputs: &[&Tensor],
    out_types: &[TensorType],
    ctx: &EvalCtx<'_>,
) -> std::result::Result<Vec<Tensor>, String> {
    let _ = (op, inputs, out_types, ctx);
    unimplemented!("interpreter being written")
}

/// Binds symbolic dimensions from the shapes of the given inputs and parameters
/// (conflicting sizes for one symbol are an error naming the value).
pub fn bind_symbols(
    g: &Graph,
    inputs: &HashMap<String, Tensor>,
    params: &HashMap<String, Tensor>,
) -> Result<HashMap<String, usize>> {
    let _ = (g, inputs, params);
    unimplemented!("interpreter being written")
}

/// Runs a graph once: checks every input and parameter against its declared type
/// (under `syms`), evaluates the nodes in order, applies the updates to `params`,
/// and returns the outputs in order.
pub fn run(
    g: &Graph,
    inputs: &HashMap<String, Tensor>,
    params: &mut HashMap<String, Tensor>,
    syms: &HashMap<String, usize>,
    comm: &dyn Communicator,
) -> Result<Vec<Tensor>> {
    let _ = (g, inputs, params, syms, comm);
    unimplemented!("interpreter being written")
}
