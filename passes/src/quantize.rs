//! Int8 row-wise tables for serving (pass id `quantize-tables`; run on demand,
//! not in the pipeline: `dlrmc compile --quantize-tables int8`, `dlrm-serve
//! --quantize-tables int8`, `dlrm-run --infer --quantize-tables int8`).
//!
//! Every table of an inference graph that only embedding bags read (as their
//! table operand: `embedding_bag` in any form, `embedding_bag_weighted`) is
//! stored as FBGEMM's fused 8-bit row-wise rows, `u8[R, D+8]`, and each of its
//! bags becomes `embedding_bag_q8` (`dlrm_ir::ops::embedding_bag_q8`), which
//! dequantizes the rows it reads. A bag whose result was bf16 gets a `cast`
//! after it (the int8 bag's result is f32). Tables read by anything else, of
//! symbolic shape, or already quantized are left as they are. A graph that
//! updates its parameters (a training graph) is refused: int8 tables serve only.
//!
//! The pass changes the graph; the values are the caller's
//! ([`QuantizedTable`] names each table; `embedding_bag_q8::quantize_rows`
//! writes them), because a plan's values may be descriptions or a checkpoint's
//! rows read on demand.

use crate::pass::Params;
use crate::{Pass, PassError, Ran, Result};
use dlrm_ir::module::rebuild_params;
use dlrm_ir::ops::embedding_bag_q8::{self, SCALE_BIAS_BYTES};
use dlrm_ir::{DType, Dim, Graph, Op, Pool, TensorType, ValueId};
use std::collections::HashMap;

/// The pass id.
pub const ID: &str = "quantize-tables";

/// A table the pass stored as int8 rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuantizedTable {
    /// The parameter's name.
    pub param: String,
    /// Rows.
    pub rows: usize,
    /// Row width (elements of the f32 row; the int8 row holds `dim + 8` bytes).
    pub dim: usize,
    /// The element type it had.
    pub was: DType,
}

impl QuantizedTable {
    /// Bytes of its int8 rows.
    pub fn bytes(&self) -> u64 {
        self.rows as u64 * (self.dim + SCALE_BIAS_BYTES) as u64
    }
}

/// The graph with its bag tables as int8 rows, and those tables.
pub fn quantize_tables(g: &Graph) -> Result<(Graph, Vec<QuantizedTable>)> {
    if !g.updates().is_empty() {
        return Err(PassError::Graph {
            pass: ID.into(),
            graph: g.name.clone(),
            reason: "it updates its parameters (a training graph): int8 tables serve only; \
                     quantize the inference graph"
                .into(),
        });
    }
    let users = g.users();
    let nodes = g.nodes();
    let mut tables: HashMap<ValueId, QuantizedTable> = HashMap::new();
    for &p in g.params() {
        let ty = g.ty(p);
        let (Some(rows), Some(dim)) = (
            ty.shape.first().and_then(Dim::fixed),
            ty.shape.get(1).and_then(Dim::fixed),
        ) else {
            continue;
        };
        let bags_only = !users[p.index()].is_empty()
            && users[p.index()].iter().all(|&n| {
                let node = &nodes[n];
                bag_form(&node.op).is_some()
                    && node.inputs[0] == p
                    && !node.inputs[1..].contains(&p)
            });
        if ty.shape.len() == 2 && ty.dtype.is_float() && dim > 0 && bags_only {
            let param = g.name_of(p).to_string();
            tables.insert(
                p,
                QuantizedTable {
                    param,
                    rows,
                    dim,
                    was: ty.dtype,
                },
            );
        }
    }
    let param_ty = |p: ValueId| {
        tables.get(&p).map(|t| {
            TensorType::new(
                DType::U8,
                [Dim::Fixed(t.rows), Dim::Fixed(t.dim + SCALE_BIAS_BYTES)],
            )
        })
    };
    let out = rebuild_params(g, &param_ty, &mut |_, node, out, ins, names| {
        let (mode, last_offset) = bag_form(&node.op)?;
        if !tables.contains_key(node.inputs.first()?) {
            return None;
        }
        let want = g.ty(*node.outputs.first()?).dtype;
        let y = names.first().copied().unwrap_or("bag");
        let op = embedding_bag_q8::op(mode, last_offset);
        Some((|| {
            if want == DType::F32 {
                return Ok(vec![out.add(op, ins, y)?]);
            }
            let q = out.fresh_name(&format!("{y}.q8"));
            let q = out.add(op, ins, &q)?;
            Ok(vec![out.add(Op::Cast { to: want }, &[q], y)?])
        })())
    })
    .map_err(|e| PassError::Ir {
        pass: ID.into(),
        source: e,
    })?;
    dlrm_ir::verify(&out).map_err(|e| PassError::Verify {
        after: ID.into(),
        source: e,
    })?;
    let mut list: Vec<QuantizedTable> = tables.into_values().collect();
    list.sort_by(|a, b| a.param.cmp(&b.param));
    Ok((out, list))
}

/// The pooling and `last_offset` of a bag op an int8 table can serve (an f32
/// or bf16 table's).
fn bag_form(op: &Op) -> Option<(Pool, bool)> {
    op.bag_form()
        .filter(|b| !b.int8)
        .map(|b| (b.mode, b.last_offset))
}

/// The pass (for `--dump-ir quantize-tables` and the pass tests); its values
/// are quantized when given.
#[derive(Clone, Copy, Debug, Default)]
pub struct QuantizeTables;

impl Pass for QuantizeTables {
    fn id(&self) -> &'static str {
        ID
    }

    fn run(&self, g: Graph, params: Option<&mut Params>) -> Result<Ran> {
        let (out, tables) = quantize_tables(&g)?;
        if let Some(params) = params {
            for (name, t) in params.iter_mut() {
                if let Some(q) = tables.iter().find(|q| &q.param == name) {
                    let bytes =
                        embedding_bag_q8::quantize_rows(&t.to_f32_vec(), q.dim).map_err(|e| {
                            PassError::Arg {
                                pass: ID.into(),
                                reason: format!("table `{name}`: {e}"),
                            }
                        })?;
                    *t = dlrm_ir::Tensor::u8(vec![q.rows, q.dim + SCALE_BIAS_BYTES], bytes);
                }
            }
        }
        Ok(Ran::counted(out, "tables", tables.len()))
    }
}
