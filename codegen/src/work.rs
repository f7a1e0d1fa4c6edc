//! Work and traffic of one op execution, for the `--bench` table: floating-point
//! operations and bytes moved, computed from the operands' and results' shapes.
//!
//! Conventions: a multiply-add counts 2 flops; elementwise ops count one flop
//! per result element, losses one per input element; bytes are the bytes every
//! operand and result occupies, except for embedding tables, of which only the
//! rows an index touches count (read for `embedding_bag`, read and written for
//! `sparse_sgd`, `embedding_update` and `split_embedding_update`, whose table
//! element is the 4 bytes of both halves; the Adagrad forms also read and write
//! the touched rows' accumulators: `D` floats per row, or one row-wise). These are the compulsory traffic, not
//! cache-level measurements.

use dlrm_ir::{Act, InteractionKind, Op, Tensor, gemm_flops};

/// Work and traffic of one execution.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Cost {
    /// Floating-point operations.
    pub flops: f64,
    /// Bytes read and written.
    pub bytes: f64,
}

impl Cost {
    fn new(flops: f64, bytes: f64) -> Cost {
        Cost { flops, bytes }
    }
}

fn bytes(ts: &[&Tensor]) -> f64 {
    ts.iter().map(|t| t.size_bytes() as f64).sum()
}

/// The cost of a module op: its own work model on the tensors' concrete types.
fn module_cost(m: &dlrm_ir::module::ModOp, inputs: &[&Tensor], outputs: &[&Tensor]) -> Cost {
    let ty = |t: &&Tensor| {
        dlrm_ir::TensorType::new(t.dtype(), t.shape.iter().map(|&d| dlrm_ir::Dim::Fixed(d)))
    };
    let (ins, outs): (Vec<_>, Vec<_>) = (
        inputs.iter().map(ty).collect(),
        outputs.iter().map(ty).collect(),
    );
    let (ins, outs): (Vec<_>, Vec<_>) = (ins.iter().collect(), outs.iter().collect());
    let w = m
        .def()
        .work(m, &ins, &outs, &|d| d.fixed().unwrap_or(1) as f64);
    Cost::new(w.flops, w.bytes)
}

/// The cost of `op` run on `inputs` producing `outputs`.
pub fn op_cost(op: &Op, inputs: &[&Tensor], outputs: &[&Tensor]) -> Cost {
    let out_elems: f64 = outputs.iter().map(|t| t.numel() as f64).sum();
    let io = bytes(inputs) + bytes(outputs);
    match op {
        Op::Module(m) => module_cost(m, inputs, outputs),
        Op::Linear { .. } | Op::LinearDx | Op::LinearDw | Op::LinearDb => {
            dense_cost(op, inputs, io)
        }
        Op::EmbeddingBag { .. }
        | Op::EmbeddingBagRows { .. }
        | Op::SparseSgd { .. }
        | Op::SparseSgdRows { .. }
        | Op::EmbeddingUpdate { .. }
        | Op::SplitEmbeddingUpdate { .. }
        | Op::SparseAdagrad { .. }
        | Op::EmbeddingUpdateAdagrad { .. }
        | Op::EmbeddingUpdateAdagradRows { .. } => embedding_cost(op, inputs, outputs),
        Op::Adagrad { .. } => Cost {
            flops: 7.0 * inputs.first().map_or(0.0, |t| t.numel() as f64),
            bytes: io,
        },
        Op::SplitSgd { .. } => Cost {
            flops: 2.0 * inputs.first().map_or(0.0, |t| t.numel() as f64),
            bytes: io,
        },
        Op::BceLogits { .. } | Op::Bce { .. } | Op::Mse { .. } => Cost {
            flops: inputs.first().map_or(0.0, |t| t.numel() as f64),
            bytes: io,
        },
        Op::Interaction {
            kind: InteractionKind::Dot,
            ..
        }
        | Op::InteractionGrad {
            kind: InteractionKind::Dot,
            ..
        } => interaction_cost(op, inputs, io),
        // The blocked GEMM family: the work the kernels do, over the padded
        // (blocked) dims `S × Nb·bn × Kb·bk`.
        Op::Brgemm { .. } | Op::BrgemmDgrad { .. } | Op::BrgemmWgrad { .. } => {
            brgemm_cost(op, inputs, io)
        }
        Op::Sgd { .. } => Cost {
            flops: 2.0 * out_elems,
            bytes: io,
        },
        _ => Cost {
            flops: out_elems,
            bytes: io,
        },
    }
}

/// `(rows, columns)` of a matrix operand (zeros if not rank 2).
fn dims2(t: Option<&&Tensor>) -> (f64, f64) {
    match t.map(|t| &t.shape[..]) {
        Some(&[a, b]) => (a as f64, b as f64),
        _ => (0.0, 0.0),
    }
}

/// `linear` and its gradients.
fn dense_cost(op: &Op, inputs: &[&Tensor], io: f64) -> Cost {
    match op {
        Op::Linear { .. } => {
            let (s, k) = dims2(inputs.first());
            let (n, _) = dims2(inputs.get(1));
            Cost {
                // The product, then two flops per result element (the epilogue).
                flops: gemm_flops(s, n, k) + 2.0 * s * n,
                bytes: io,
            }
        }
        // dz[S,N] · w[N,K], and dz[S,N]ᵀ · x[S,K].
        Op::LinearDx | Op::LinearDw => {
            let (s, n) = dims2(inputs.first());
            let (_, k) = dims2(inputs.get(1));
            Cost::new(gemm_flops(s, n, k), io)
        }
        Op::LinearDb => {
            let (s, n) = dims2(inputs.first());
            Cost {
                flops: s * n,
                bytes: io,
            }
        }
        _ => unreachable!("`{}` is not a linear op", op.mnemonic()),
    }
}

/// The embedding ops: only the table rows an index touches count.
fn embedding_cost(op: &Op, inputs: &[&Tensor], outputs: &[&Tensor]) -> Cost {
    match op {
        Op::EmbeddingBag { .. } | Op::EmbeddingBagRows { .. } => {
            let (_, d) = dims2(inputs.first());
            let nidx = inputs.get(1).map_or(0.0, |t| t.numel() as f64);
            let es = inputs
                .first()
                .map_or(4.0, |t| t.dtype().size_bytes() as f64);
            Cost {
                flops: nidx * d,
                bytes: nidx * d * es + bytes(&inputs[1.min(inputs.len())..]) + bytes(outputs),
            }
        }
        Op::SparseSgd { .. } | Op::SparseSgdRows { .. } => {
            let (_, d) = dims2(inputs.first());
            let nidx = inputs.get(1).map_or(0.0, |t| t.numel() as f64);
            let es = inputs
                .first()
                .map_or(4.0, |t| t.dtype().size_bytes() as f64);
            Cost {
                flops: 2.0 * nidx * d,
                bytes: 2.0 * nidx * d * es + bytes(&inputs[1.min(inputs.len())..]),
            }
        }
        Op::EmbeddingUpdate { mode, .. } | Op::SplitEmbeddingUpdate { mode, .. } => {
            // Operands: the table (or its two halves), dy, indices[, offsets].
            let halves = usize::from(matches!(op, Op::SplitEmbeddingUpdate { .. }));
            let (_, d) = dims2(inputs.first());
            let nidx = inputs.get(2 + halves).map_or(0.0, |t| t.numel() as f64);
            let es = if halves == 1 {
                4.0
            } else {
                inputs
                    .first()
                    .map_or(4.0, |t| t.dtype().size_bytes() as f64)
            };
            let div = if *mode == dlrm_ir::Pool::Mean {
                1.0
            } else {
                0.0
            };
            Cost {
                flops: (2.0 + div) * nidx * d,
                bytes: 2.0 * nidx * d * es + bytes(&inputs[(1 + halves).min(inputs.len())..]),
            }
        }
        Op::SparseAdagrad { rowwise, .. }
        | Op::EmbeddingUpdateAdagrad { rowwise, .. }
        | Op::EmbeddingUpdateAdagradRows { rowwise, .. } => {
            // Operands: table, accumulator, then indices and row gradient, or dy,
            // indices[, offsets]; every index counted (an upper bound).
            let sparse = matches!(op, Op::SparseAdagrad { .. });
            let (_, d) = dims2(inputs.first());
            let nidx = inputs
                .get(if sparse { 2 } else { 3 })
                .map_or(0.0, |t| t.numel() as f64);
            let acc = if *rowwise { 1.0 } else { d };
            Cost {
                flops: 7.0 * nidx * d,
                bytes: 2.0 * nidx * (d + acc) * 4.0 + bytes(&inputs[2.min(inputs.len())..]),
            }
        }
        _ => unreachable!("`{}` is not an embedding op", op.mnemonic()),
    }
}

/// The dot interaction and its gradient.
fn interaction_cost(op: &Op, inputs: &[&Tensor], io: f64) -> Cost {
    match op {
        Op::Interaction {
            self_interaction, ..
        }
        | Op::InteractionGrad {
            self_interaction, ..
        } => {
            let base = usize::from(matches!(op, Op::InteractionGrad { .. }));
            let (s, d) = dims2(inputs.get(base));
            let f = (inputs.len() - base) as f64;
            let pairs = if *self_interaction {
                f * (f + 1.0) / 2.0
            } else {
                f * (f - 1.0) / 2.0
            };
            let per = if base == 1 { 4.0 } else { 2.0 };
            Cost {
                flops: per * s * pairs * d,
                bytes: io,
            }
        }
        _ => unreachable!("`{}` is not an interaction", op.mnemonic()),
    }
}

/// The blocked GEMM family, over the padded dims.
fn brgemm_cost(op: &Op, inputs: &[&Tensor], io: f64) -> Cost {
    match op {
        Op::Brgemm { .. } => {
            let (kp, s) = blocked_act(inputs.first());
            let np = blocked_rows(inputs.get(1));
            Cost {
                flops: 2.0 * s * np * kp + 2.0 * s * np,
                bytes: io,
            }
        }
        Op::BrgemmDgrad { mask, .. } => {
            let (np, s) = blocked_act(inputs.first());
            // The weight is last but for the mask operand.
            let w = inputs
                .len()
                .saturating_sub(1 + usize::from(*mask != Act::None));
            let kp = blocked_cols(inputs.get(w));
            Cost {
                flops: 2.0 * s * np * kp,
                bytes: io,
            }
        }
        Op::BrgemmWgrad { .. } => {
            let (np, s) = blocked_act(inputs.first());
            let (kp, _) = blocked_act(inputs.last());
            Cost {
                flops: 2.0 * s * np * kp + s * np,
                bytes: io,
            }
        }
        _ => unreachable!("`{}` is not a blocked GEMM", op.mnemonic()),
    }
}

/// `(Kb·bk, S)` of a blocked activation `[Kb, S, bk]` (zeros if not rank 3).
fn blocked_act(t: Option<&&Tensor>) -> (f64, f64) {
    match t.map(|t| &t.shape[..]) {
        Some(&[kb, s, bk]) => ((kb * bk) as f64, s as f64),
        _ => (0.0, 0.0),
    }
}

/// `Nb·bn` of a blocked weight `[Nb, Kb, bk, bn]` (0 if not rank 4).
fn blocked_rows(t: Option<&&Tensor>) -> f64 {
    match t.map(|t| &t.shape[..]) {
        Some(&[nb, _, _, bn]) => (nb * bn) as f64,
        _ => 0.0,
    }
}

/// `Kb·bk` of a blocked weight `[Nb, Kb, bk, bn]` (0 if not rank 4).
fn blocked_cols(t: Option<&&Tensor>) -> f64 {
    match t.map(|t| &t.shape[..]) {
        Some(&[_, kb, bk, _]) => (kb * bk) as f64,
        _ => 0.0,
    }
}
