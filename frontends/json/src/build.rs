//! From a validated [`ModelSpec`] to a [`Model`]: the forward graph and initial parameters.
//!
//! The graph (names fixed by the contract, see the crate docs):
//! - inputs: `dense` `f32[B, dense_features]`, then `idx.{t}` `i64[B, pooling_t]` per table
//!   (with `"bags": "offsets"`: `idx.{t}` `i64[nnz_t]` then `off.{t}` `i64[B]`);
//! - parameters, in this order: `emb.{t}` `f32[rows_t, dim]` per table, then
//!   `bot.{i}.w` `f32[out, in]` / `bot.{i}.b` `f32[out]` per bottom layer, then
//!   `top.{i}.w` / `top.{i}.b` per top layer;
//! - nodes: the bottom MLP (`linear {act=relu}` per layer, results `bot.{i}`), one
//!   `embedding_bag {mode}` per table (results `bag.{t}`), `interaction` of
//!   (bottom output, bag.0, ..) (result `inter`), the top MLP (`linear {act=relu}`,
//!   results `top.{i}`; the last layer is `linear {act=sigmoid}` named `prob`);
//! - one output: `prob` `f32[B, 1]`.
//!
//! The graph is checked by [`dlrm_ir::verify`] before it is returned.

use crate::error::{Error, Result};
use crate::spec::{Bags, Loss, ModelSpec, Optimizer};
use dlrm_ir::init::{self, Init};
use dlrm_ir::{
    Act, DType, Described, Dim, Graph, InteractionKind, IrError, Op, ParamValue, Part, Pool,
    Tensor, TensorType, ValueId,
};
use std::fmt::Write as _;

/// MLP parameters of more than this many bytes (f32) are described, not stored, by
/// default ([`ModelSpec::initial_values`]): 64 MiB.
pub const DESCRIBE_ABOVE: u64 = 64 << 20;

/// Training hyper-parameters of a model, as the description gives them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Training {
    /// The loss applied to `prob` and the label.
    pub loss: Loss,
    /// The optimizer.
    pub optimizer: Optimizer,
    /// Learning rate.
    pub learning_rate: f32,
    /// Global mini-batch size.
    pub batch_size: usize,
    /// Seed (parameters were initialised from it; data generators may use it too).
    pub seed: u64,
}

/// A model built from a description: forward graph, initial parameters, training setup.
#[derive(Clone, Debug)]
pub struct Model {
    /// The validated description.
    pub spec: ModelSpec,
    /// The forward graph for one device; its only output is `prob` `f32[B, 1]`.
    pub graph: Graph,
    /// Initial value of every parameter, in the graph's parameter order.
    pub params: Vec<(String, Tensor)>,
    /// Training hyper-parameters.
    pub training: Training,
}

/// One parameter: name, shape and initialisation.
struct ParamDef {
    name: String,
    shape: Vec<usize>,
    init: Init,
}

impl ModelSpec {
    /// The training hyper-parameters.
    pub fn training(&self) -> Training {
        Training {
            loss: self.loss,
            optimizer: self.optimizer,
            learning_rate: self.learning_rate,
            batch_size: self.batch_size,
            seed: self.seed,
        }
    }

    fn origin(&self) -> String {
        format!("model `{}`", self.name)
    }

    /// Every parameter in graph order (see the module docs).
    fn param_defs(&self) -> Vec<ParamDef> {
        let mut defs = Vec::new();
        for (t, &rows) in self.table_rows.iter().enumerate() {
            defs.push(ParamDef {
                name: format!("emb.{t}"),
                shape: vec![rows, self.embedding_dim],
                init: Init::embedding(rows),
            });
        }
        let nbot = self.bottom_mlp.len() - 1;
        for (k, (fan_in, fan_out)) in self.layers().enumerate() {
            let (prefix, i) = if k < nbot {
                ("bot", k)
            } else {
                ("top", k - nbot)
            };
            defs.push(ParamDef {
                name: format!("{prefix}.{i}.w"),
                shape: vec![fan_out, fan_in],
                init: Init::linear_weight(fan_in, fan_out),
            });
            defs.push(ParamDef {
                name: format!("{prefix}.{i}.b"),
                shape: vec![fan_out],
                init: Init::linear_bias(fan_out),
            });
        }
        if let Some(c) = self.cross {
            // TorchRec's LowRankCrossNet: xavier_normal_ kernels, zero biases.
            let w = self.top_input_width();
            for l in 0..c.layers {
                let normal = |fan_in, fan_out| Init::linear_weight(fan_in, fan_out);
                defs.push(ParamDef {
                    name: format!("cross.{l}.v"),
                    shape: vec![c.low_rank, w],
                    init: normal(w, c.low_rank),
                });
                defs.push(ParamDef {
                    name: format!("cross.{l}.u"),
                    shape: vec![w, c.low_rank],
                    init: normal(c.low_rank, w),
                });
                defs.push(ParamDef {
                    name: format!("cross.{l}.b"),
                    shape: vec![w],
                    init: Init::Constant { value: 0.0 },
                });
            }
        }
        defs
    }

    /// Builds the forward graph (validating the description first, with the model's
    /// name as the origin) and verifies it.
    pub fn graph(&self) -> Result<Graph> {
        let origin = self.origin();
        self.validate(&origin)?;
        self.build_graph().map_err(|source| Error::Graph {
            origin,
            model: self.name.clone(),
            source: Box::new(source),
        })
    }

    fn build_graph(&self) -> Result<Graph, IrError> {
        let b = Dim::batch;
        let f32_ty = |dims: &[usize]| TensorType::f32(dims.iter().map(|&d| Dim::Fixed(d)));
        let mut g = Graph::new(&self.name);
        let dense = g.add_input("dense", TensorType::f32([b(), self.dense_features.into()]))?;
        // Per table: its ids, and with offsets bags their offsets.
        let mut idx: Vec<(ValueId, Option<ValueId>)> = Vec::with_capacity(self.num_tables());
        for (t, &l) in self.pooling.iter().enumerate() {
            let name = format!("idx.{t}");
            idx.push(match self.bags {
                Bags::Fixed => (
                    g.add_input(&name, TensorType::new(DType::I64, [b(), l.into()]))?,
                    None,
                ),
                Bags::Offsets => {
                    let nnz = Dim::Sym(format!("nnz_{t}"));
                    let ids = g.add_input(&name, TensorType::new(DType::I64, [nnz]))?;
                    let off =
                        g.add_input(&format!("off.{t}"), TensorType::new(DType::I64, [b()]))?;
                    (ids, Some(off))
                }
            });
        }
        let mut params = Vec::new();
        for def in self.param_defs() {
            params.push(g.add_param(&def.name, f32_ty(&def.shape))?);
        }
        let ntab = self.num_tables();
        let (tables, linears) = params.split_at(ntab);
        let nbot = self.bottom_mlp.len() - 1;
        let ncross = 3 * self.cross.map_or(0, |c| c.layers);
        let (linears, cross) = linears.split_at(linears.len() - ncross);
        let (bot, top) = linears.split_at(2 * nbot);

        let mut x = dense;
        for (i, wb) in bot.chunks(2).enumerate() {
            let op = Op::Linear { act: Act::Relu };
            x = g.add(op, &[x, wb[0], wb[1]], &format!("bot.{i}"))?;
        }
        let mut feats = vec![x];
        for (t, (&table, &(ix, off))) in tables.iter().zip(&idx).enumerate() {
            let op = Op::EmbeddingBag {
                mode: self.pooling_mode,
                last_offset: false,
            };
            let operands: Vec<ValueId> = [table, ix].into_iter().chain(off).collect();
            feats.push(g.add(op, &operands, &format!("bag.{t}"))?);
        }
        let op = Op::Interaction {
            kind: self.interaction,
            self_interaction: self.interaction_itself,
        };
        let mut y = g.add(op, &feats, "inter")?;
        // DCN-v2: x_{l+1} = x0 ⊙ (u_l·(v_l·x_l) + b_l) + x_l over x0 = the concatenation.
        let x0 = y;
        for (l, vub) in cross.chunks(3).enumerate() {
            let op = dlrm_ir::module::ModOp::op("cross");
            y = g.add(op, &[x0, y, vub[0], vub[1], vub[2]], &format!("cross.{l}"))?;
        }
        let ntop = top.len() / 2;
        for (i, wb) in top.chunks(2).enumerate() {
            let last = i + 1 == ntop;
            let act = if last { Act::Sigmoid } else { Act::Relu };
            let name = if last {
                "prob".to_string()
            } else {
                format!("top.{i}")
            };
            y = g.add(Op::Linear { act }, &[y, wb[0], wb[1]], &name)?;
        }
        g.add_output(y);
        dlrm_ir::verify(&g)?;
        Ok(g)
    }

    /// Initialises every parameter (graph order) as the reference DLRM does, from
    /// `seed`; the values do not depend on the number of threads. Validates first.
    /// The values of [`ModelSpec::initial_values`], all created (fallibly: a
    /// parameter too large for this process is an error naming it).
    pub fn init_params(&self) -> Result<Vec<(String, Tensor)>> {
        let values = self.initial_values()?;
        init::materialize_all(&values).map_err(|e| self.init_err(e))
    }

    /// Every parameter's initial value (graph order), without creating the tables
    /// or the MLP parameters above [`DESCRIBE_ABOVE`] bytes
    /// ([`ModelSpec::initial_values_describing`]).
    pub fn initial_values(&self) -> Result<Vec<(String, ParamValue)>> {
        self.initial_values_describing(DESCRIBE_ABOVE)
    }

    /// Every parameter's initial value (graph order), without creating the tables:
    /// a table is [`ParamValue::Described`] (its initializer: the distribution,
    /// the seed and its parameter index, so any rows of it can be generated alone),
    /// and so is an MLP weight or bias of more than `above` bytes (f32); the other
    /// MLP parameters are created and stored. Validates first.
    pub fn initial_values_describing(&self, above: u64) -> Result<Vec<(String, ParamValue)>> {
        self.validate(&self.origin())?;
        let tables = self.num_tables();
        self.param_defs()
            .into_iter()
            .enumerate()
            .map(|(p, d)| {
                let described = Described {
                    init: d.init,
                    seed: self.seed,
                    stream: p as u64,
                    shape: d.shape,
                    part: Part::F32,
                    blocked: None,
                };
                let value = if p < tables || described.numel() * 4 > u128::from(above) {
                    ParamValue::Described(described)
                } else {
                    ParamValue::Stored(
                        described
                            .materialize(&d.name)
                            .map_err(|e| self.init_err(e))?,
                    )
                };
                Ok((d.name, value))
            })
            .collect()
    }

    fn init_err(&self, e: IrError) -> Error {
        Error::Init {
            origin: self.origin(),
            cause: Box::new(e),
        }
    }

    /// Builds the model: graph, initial parameters and training setup.
    pub fn build(self) -> Result<Model> {
        let graph = self.graph()?;
        let params = self.init_params()?;
        let training = self.training();
        Ok(Model {
            spec: self,
            graph,
            params,
            training,
        })
    }
}

impl Model {
    /// The initial value of a parameter, by name.
    pub fn param(&self, name: &str) -> Option<&Tensor> {
        self.params.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    /// A few human-readable lines: shapes, parameter counts and sizes, training setup.
    pub fn summary(&self) -> String {
        self.spec.summary()
    }
}

impl ModelSpec {
    /// A few human-readable lines: shapes, parameter counts and sizes, training setup.
    pub fn summary(&self) -> String {
        let s = self;
        let join = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join("-");
        let table_elems: u64 = s
            .table_rows
            .iter()
            .map(|&r| (r * s.embedding_dim) as u64)
            .sum();
        let total = s.param_count();
        let mlp_elems = total - table_elems;
        let pooling = if s.bags == Bags::Offsets {
            "by offsets".to_string()
        } else if s.pooling.iter().all(|&l| l == s.pooling[0]) {
            s.pooling[0].to_string()
        } else {
            format!("{:?}", s.pooling)
        };
        let mut out = String::new();
        let _ = writeln!(
            out,
            "model `{}`: {} dense features, {} tables ({} rows in all, dim {}, pooling {} {})",
            s.name,
            s.dense_features,
            s.num_tables(),
            s.table_rows.iter().sum::<usize>(),
            s.embedding_dim,
            pooling,
            match s.pooling_mode {
                Pool::Sum => "sum",
                Pool::Mean => "mean",
            },
        );
        let _ = writeln!(
            out,
            "bottom MLP {}, interaction {}{} (width {}), top MLP {}-{}",
            join(&s.bottom_mlp),
            match (s.interaction, s.cross) {
                (_, Some(c)) => format!("dcn ({} cross layers of rank {})", c.layers, c.low_rank),
                (InteractionKind::Dot, None) => "dot".to_string(),
                (InteractionKind::Cat, None) => "cat".to_string(),
            },
            if s.interaction_itself {
                " with self terms"
            } else {
                ""
            },
            s.top_input_width(),
            s.top_input_width(),
            join(&s.top_mlp),
        );
        let _ = writeln!(
            out,
            "parameters: {total} ({:.1} MB as f32): tables {table_elems}, MLPs {mlp_elems}",
            total as f64 * 4.0 / 1e6,
        );
        let t = &self.training();
        let _ = write!(
            out,
            "training: {} loss, {} lr {}, batch {}, seed {}",
            match t.loss {
                Loss::Bce => "bce",
                Loss::Mse => "mse",
            },
            t.optimizer.name(),
            t.learning_rate,
            t.batch_size,
            t.seed
        );
        out
    }
}
