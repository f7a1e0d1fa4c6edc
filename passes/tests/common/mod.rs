//! Shared test helpers: small DLRM-like forward graphs built with the IR builder,
//! deterministic parameters and data, and a runner for partitioned graphs.

#![allow(dead_code, clippy::unwrap_used)]

use dlrm_ir::{
    Act, DType, Def, Dim, DimExpr, Graph, InteractionKind, LocalGroup, Op, Pool, SingleRank,
    Tensor, TensorType, ValueId, batch_slice, interp,
};
use dlrm_passes::shard::{Shard, ShardKind, ShardPlan, TablePlan};
use dlrm_passes::{Partitioned, TableInfo};
use std::collections::HashMap;

pub const DENSE: usize = 4;
pub const DIM: usize = 4;

/// How a bag reads its indices.
#[derive(Clone, Copy, Debug)]
pub enum Form {
    /// `indices: [B, L]`.
    Fixed(usize),
    /// `indices: [N<t>]`, `offsets: [B]`.
    Offsets,
    /// `indices: [N<t>]`, `offsets: [B+1]` (`last_offset=true`,
    /// `include_last_offset=True`).
    LastOffset,
}

/// A bag: which table, how it is fed, sum or mean.
#[derive(Clone, Copy, Debug)]
pub struct BagSpec {
    pub table: usize,
    pub form: Form,
    pub mode: Pool,
}

/// A small DLRM-like model.
#[derive(Clone, Debug)]
pub struct Spec {
    pub name: &'static str,
    /// Rows per table.
    pub tables: Vec<usize>,
    pub bags: Vec<BagSpec>,
    pub interaction: InteractionKind,
    /// The bottom MLP output is used twice: `interaction(x, add(x, e0), ..)`.
    pub twice: bool,
    /// The bottom output goes through concat/split/reshape/relu/sigmoid (cat only).
    pub exotic: bool,
}

fn bag(table: usize, form: Form, mode: Pool) -> BagSpec {
    BagSpec { table, form, mode }
}

impl Spec {
    /// 3 tables, fixed pooling 2, dot interaction.
    pub fn dot() -> Spec {
        Spec {
            name: "dlrm_dot",
            tables: vec![7, 11, 5],
            bags: (0..3).map(|t| bag(t, Form::Fixed(2), Pool::Sum)).collect(),
            interaction: InteractionKind::Dot,
            twice: false,
            exotic: false,
        }
    }

    /// Like [`Spec::dot`] with a cat interaction and a mean bag.
    pub fn cat() -> Spec {
        Spec {
            name: "dlrm_cat",
            bags: vec![
                bag(0, Form::Fixed(2), Pool::Sum),
                bag(1, Form::Fixed(3), Pool::Mean),
                bag(2, Form::Fixed(1), Pool::Sum),
            ],
            interaction: InteractionKind::Cat,
            ..Spec::dot()
        }
    }

    /// Bags with offsets (variable size), one of them mean.
    pub fn offsets() -> Spec {
        Spec {
            name: "dlrm_offsets",
            bags: vec![
                bag(0, Form::Offsets, Pool::Sum),
                bag(1, Form::Offsets, Pool::Mean),
                bag(2, Form::Fixed(2), Pool::Sum),
            ],
            ..Spec::dot()
        }
    }

    /// Like [`Spec::offsets`] with last_offset bags (`[B+1]` offsets).
    pub fn last_offset() -> Spec {
        Spec {
            name: "dlrm_last_offset",
            bags: vec![
                bag(0, Form::LastOffset, Pool::Sum),
                bag(1, Form::LastOffset, Pool::Mean),
                bag(2, Form::Fixed(2), Pool::Sum),
            ],
            ..Spec::dot()
        }
    }

    /// Table 0 serves two bags.
    pub fn shared() -> Spec {
        Spec {
            name: "dlrm_shared",
            bags: vec![
                bag(0, Form::Fixed(2), Pool::Sum),
                bag(1, Form::Fixed(2), Pool::Sum),
                bag(0, Form::Fixed(3), Pool::Sum),
                bag(2, Form::Fixed(1), Pool::Sum),
            ],
            ..Spec::dot()
        }
    }

    /// The bottom output is used twice.
    pub fn twice() -> Spec {
        Spec {
            name: "dlrm_twice",
            twice: true,
            ..Spec::dot()
        }
    }

    /// concat, split, reshape, relu and sigmoid on the way (cat interaction).
    pub fn exotic() -> Spec {
        Spec {
            name: "dlrm_exotic",
            exotic: true,
            interaction: InteractionKind::Cat,
            ..Spec::dot()
        }
    }

    /// Builds the forward graph: output `prob: f32[B,1]`.
    pub fn build(&self) -> Graph {
        let b = Dim::batch;
        let f = |n: usize| Dim::Fixed(n);
        let mut g = Graph::new(self.name);
        let dense = g
            .add_input("dense", TensorType::f32([b(), f(DENSE)]))
            .unwrap();
        let mut idx = Vec::new();
        for (k, bs) in self.bags.iter().enumerate() {
            let ops = match bs.form {
                Form::Fixed(l) => vec![
                    g.add_input(
                        &format!("idx.{k}"),
                        TensorType::new(DType::I64, [b(), f(l)]),
                    )
                    .unwrap(),
                ],
                Form::Offsets | Form::LastOffset => {
                    let lead = match bs.form {
                        Form::LastOffset => {
                            Dim::from_expr(b().to_expr().add(&DimExpr::int(1)).unwrap()).unwrap()
                        }
                        _ => b(),
                    };
                    vec![
                        g.add_input(
                            &format!("idx.{k}"),
                            TensorType::new(DType::I64, [Dim::Sym(format!("N{k}"))]),
                        )
                        .unwrap(),
                        g.add_input(&format!("off.{k}"), TensorType::new(DType::I64, [lead]))
                            .unwrap(),
                    ]
                }
            };
            idx.push(ops);
        }
        let tables: Vec<ValueId> = self
            .tables
            .iter()
            .enumerate()
            .map(|(t, &rows)| {
                g.add_param(&format!("emb.{t}"), TensorType::f32([f(rows), f(DIM)]))
                    .unwrap()
            })
            .collect();
        let linear = |g: &mut Graph, x: ValueId, name: &str, out: usize, act: Act| {
            let k = g.ty(x).shape[1].clone();
            let w = g
                .add_param(&format!("{name}.w"), TensorType::f32([f(out), k]))
                .unwrap();
            let bias = g
                .add_param(&format!("{name}.b"), TensorType::f32([f(out)]))
                .unwrap();
            g.add(Op::Linear { act }, &[x, w, bias], name).unwrap()
        };
        let h = linear(&mut g, dense, "bot.0", 8, Act::Relu);
        let mut x = linear(&mut g, h, "bot.1", DIM, Act::Relu);
        let mut es = Vec::new();
        for (k, bs) in self.bags.iter().enumerate() {
            let mut ins = vec![tables[bs.table]];
            ins.extend_from_slice(&idx[k]);
            es.push(
                g.add(
                    Op::EmbeddingBag {
                        mode: bs.mode,
                        last_offset: matches!(bs.form, Form::LastOffset),
                    },
                    &ins,
                    &format!("e.{k}"),
                )
                .unwrap(),
            );
        }
        if self.twice {
            es[0] = g.add(Op::Add, &[x, es[0]], "xe").unwrap();
        }
        if self.exotic {
            let c = g.add(Op::Concat { axis: 1 }, &[x, es[0]], "c").unwrap();
            let parts = g
                .add_node(
                    Op::Split {
                        axis: 1,
                        sizes: vec![3, 5],
                    },
                    &[c],
                    &["p0", "p1"],
                )
                .unwrap();
            let q = g
                .add(Op::Concat { axis: 1 }, &[parts[1], parts[0]], "q")
                .unwrap();
            let r = g
                .add(
                    Op::Reshape {
                        shape: vec![b(), f(2), f(DIM)],
                    },
                    &[q],
                    "r3",
                )
                .unwrap();
            let r = g
                .add(
                    Op::Reshape {
                        shape: vec![b(), f(2 * DIM)],
                    },
                    &[r],
                    "r2",
                )
                .unwrap();
            let s = g.add(Op::Sigmoid, &[r], "sg").unwrap();
            x = g.add(Op::Relu, &[s], "rl").unwrap();
            es.remove(0);
        }
        let mut ins = vec![x];
        ins.extend(es);
        let inter = g
            .add(
                Op::Interaction {
                    kind: self.interaction,
                    self_interaction: false,
                },
                &ins,
                "inter",
            )
            .unwrap();
        let t = linear(&mut g, inter, "top.0", 8, Act::Relu);
        let p = linear(&mut g, t, "prob", 1, Act::Sigmoid);
        g.add_output(p);
        dlrm_ir::verify(&g).unwrap();
        g
    }
}

/// A tiny deterministic generator (SplitMix64).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-a, a).
    pub fn uniform(&mut self, a: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        (2.0 * u - 1.0) * a
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Parameters for every param of `g` (fixed shapes), uniform in [-0.6, 0.6).
pub fn init_params(g: &Graph, seed: u64) -> HashMap<String, Tensor> {
    let mut rng = Rng(seed);
    g.params()
        .iter()
        .map(|&p| {
            let shape: Vec<usize> = g.ty(p).shape.iter().map(|d| d.fixed().unwrap()).collect();
            let n = shape.iter().product();
            let data = (0..n).map(|_| rng.uniform(0.6)).collect();
            (g.name_of(p).to_string(), Tensor::f32(shape, data))
        })
        .collect()
}

/// A global batch for a forward or training graph: inputs and symbol sizes.
pub struct Batch {
    pub inputs: HashMap<String, Tensor>,
    pub syms: HashMap<String, usize>,
    /// Per offsets-form index input name: the bag sizes per sample.
    pub bag_sizes: HashMap<String, Vec<usize>>,
}

/// For each input of `g` used by a bag: (table rows, is offsets, the indices input).
fn bag_roles(g: &Graph) -> HashMap<ValueId, (usize, bool, ValueId)> {
    let mut roles = HashMap::new();
    for node in g.nodes() {
        if let Op::EmbeddingBag { .. } = node.op {
            let rows = g.ty(node.inputs[0]).shape[0].fixed().unwrap();
            roles.insert(node.inputs[1], (rows, false, node.inputs[1]));
            if let Some(&off) = node.inputs.get(2) {
                roles.insert(off, (rows, true, node.inputs[1]));
            }
        }
    }
    roles
}

/// Random data for `g` with batch `batch`: dense ~ U(-1,1), labels in {0,1}, indices
/// in range (variable bags of 0..=3 indices for offsets form).
pub fn make_batch(g: &Graph, batch: usize, seed: u64) -> Batch {
    let mut rng = Rng(seed);
    let roles = bag_roles(g);
    let mut syms = HashMap::from([("B".to_string(), batch)]);
    let mut inputs = HashMap::new();
    let mut bag_sizes = HashMap::new();
    // Offsets first so that the index counts are known.
    for &v in g.inputs() {
        if let Some(&(_, true, idx)) = roles.get(&v) {
            let sizes: Vec<usize> = (0..batch).map(|_| rng.below(4)).collect();
            let mut offs = Vec::with_capacity(batch);
            let mut acc = 0i64;
            for &s in &sizes {
                offs.push(acc);
                acc += s as i64;
            }
            if let Dim::Sym(n) = &g.ty(idx).shape[0] {
                syms.insert(n.clone(), acc as usize);
            }
            // `[B+1]` offsets (last_offset) end with the index count.
            if !g.ty(v).shape[0].is_sym("B") {
                offs.push(acc);
            }
            bag_sizes.insert(g.name_of(idx).to_string(), sizes);
            let n = offs.len();
            inputs.insert(g.name_of(v).to_string(), Tensor::i64(vec![n], offs));
        }
    }
    for &v in g.inputs() {
        let name = g.name_of(v).to_string();
        if inputs.contains_key(&name) {
            continue;
        }
        let ty = g.ty(v);
        let shape: Vec<usize> = ty
            .shape
            .iter()
            .map(|d| {
                d.resolve(&|s| syms.get(s).copied())
                    .expect("every symbol bound")
            })
            .collect();
        let n: usize = shape.iter().product();
        let t = match roles.get(&v) {
            Some(&(rows, _, _)) => {
                Tensor::i64(shape, (0..n).map(|_| rng.below(rows) as i64).collect())
            }
            None if is_label(g, v) => Tensor::f32(
                shape,
                (0..n).map(|_| f32::from(rng.below(2) == 1)).collect(),
            ),
            None => Tensor::f32(shape, (0..n).map(|_| rng.uniform(1.0)).collect()),
        };
        inputs.insert(name, t);
    }
    Batch {
        inputs,
        syms,
        bag_sizes,
    }
}

/// The label is the second operand of the loss.
pub fn is_label(g: &Graph, v: ValueId) -> bool {
    g.nodes()
        .iter()
        .any(|n| matches!(n.op, Op::Bce { .. } | Op::Mse { .. }) && n.inputs[1] == v)
}

/// Runs `g` on one device; returns the outputs and the updated parameters.
pub fn run1(
    g: &Graph,
    batch: &Batch,
    params: &HashMap<String, Tensor>,
) -> (Vec<Tensor>, HashMap<String, Tensor>) {
    let mut p = params.clone();
    let out = interp::run(g, &batch.inputs, &mut p, &batch.syms, &SingleRank)
        .unwrap_or_else(|e| panic!("running {}: {e}", g.name));
    (out, p)
}

/// Rows `r` of a tensor's leading axis.
pub fn rows(t: &Tensor, r: std::ops::Range<usize>) -> Tensor {
    let row: usize = t.shape[1..].iter().product();
    let mut shape = t.shape.clone();
    shape[0] = r.len();
    let e = r.start * row..r.end * row;
    let data = t.data.slice(e).expect("rows in range");
    Tensor { shape, data }
}

/// Runs the per-rank graphs on threads with a [`LocalGroup`]; rank `r` gets its
/// slice of the dense inputs and the whole global batch of its index inputs.
/// Returns per rank: outputs and updated parameters.
pub fn run_ranks(
    graphs: &[Graph],
    global: &Batch,
    params: &HashMap<String, Tensor>,
) -> Vec<(Vec<Tensor>, HashMap<String, Tensor>)> {
    let n = graphs.len();
    let gsize = global.syms["B"];
    let comms = LocalGroup::new(n);
    std::thread::scope(|s| {
        let handles: Vec<_> = graphs
            .iter()
            .zip(comms)
            .enumerate()
            .map(|(r, (g, comm))| {
                s.spawn(move || {
                    let slice = batch_slice(gsize, n, r);
                    let mut syms = global.syms.clone();
                    syms.insert("B".into(), slice.len());
                    syms.insert("G".into(), gsize);
                    let mut inputs = HashMap::new();
                    let bags = offsets_inputs(g);
                    for (&off, &idx) in &bags {
                        let (o, i) = rank_bags(g, (off, idx), global, slice.clone(), &mut syms);
                        inputs.insert(g.name_of(off).to_string(), o);
                        inputs.insert(g.name_of(idx).to_string(), i);
                    }
                    for &v in g.inputs() {
                        let name = g.name_of(v);
                        if inputs.contains_key(name) {
                            continue;
                        }
                        let t = &global.inputs[name];
                        let local = g.ty(v).shape.first().is_some_and(|d| d.is_sym("B"));
                        let t = if local {
                            rows(t, slice.clone())
                        } else {
                            t.clone()
                        };
                        inputs.insert(name.to_string(), t);
                    }
                    let mut p: HashMap<String, Tensor> = g
                        .params()
                        .iter()
                        .map(|&v| (g.name_of(v).to_string(), params[g.name_of(v)].clone()))
                        .collect();
                    match interp::run(g, &inputs, &mut p, &syms, &comm) {
                        Ok(out) => (out, p),
                        Err(e) => {
                            dlrm_ir::Communicator::abort(&comm, &e.to_string());
                            panic!("rank {r} ({}): {e}", g.name)
                        }
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The offsets inputs of `g`'s bags (any form: bag, row shard, gradient, dense
/// gradient, fused update) with their indices inputs.
fn offsets_inputs(g: &Graph) -> HashMap<ValueId, ValueId> {
    let mut pairs = HashMap::new();
    for node in g.nodes() {
        let (i, o) = match node.op {
            Op::EmbeddingBag { .. }
            | Op::EmbeddingBagRows { .. }
            | Op::EmbeddingBagGrad { .. }
            | Op::EmbeddingGradDense { .. } => (1, 2),
            Op::EmbeddingUpdate { .. } | Op::EmbeddingUpdateRows { .. } => (2, 3),
            Op::SplitEmbeddingUpdate { .. }
            | Op::SplitEmbeddingUpdateRows { .. }
            | Op::EmbeddingUpdateAdagrad { .. }
            | Op::EmbeddingUpdateAdagradRows { .. } => (3, 4),
            _ => continue,
        };
        if let (Some(&idx), Some(&off)) = (node.inputs.get(i), node.inputs.get(o))
            && is_input(g, off)
        {
            pairs.insert(off, idx);
        }
    }
    pairs
}

/// A rank's offsets and indices of an offsets bag from the global batch's: the
/// whole global batch for `[G]` (`[G+1]`) offsets, the rank's samples (offsets
/// from 0, their indices only) for `[B]` (`[B+1]`) ones; the one more entry, the
/// end of the last bag, when the rank's offsets have it. Binds the indices' symbol.
fn rank_bags(
    g: &Graph,
    (off, idx): (ValueId, ValueId),
    global: &Batch,
    slice: std::ops::Range<usize>,
    syms: &mut HashMap<String, usize>,
) -> (Tensor, Tensor) {
    let all_off = global.inputs[g.name_of(off)].to_i64_vec().unwrap();
    let all_idx = global.inputs[g.name_of(idx)].to_i64_vec().unwrap();
    let lead = &g.ty(off).shape[0];
    let want = lead.resolve(&|s| syms.get(s).copied()).unwrap();
    let r = if lead.symbols().contains(&"B") {
        slice
    } else {
        0..global.syms["B"]
    };
    let at = |k: usize| all_off.get(k).map_or(all_idx.len(), |&o| o as usize);
    let (start, end) = (at(r.start), at(r.end));
    let mut o: Vec<i64> = all_off[r.clone()]
        .iter()
        .map(|&x| x - start as i64)
        .collect();
    if want == r.len() + 1 {
        o.push((end - start) as i64);
    }
    assert_eq!(o.len(), want, "offsets %{}", g.name_of(off));
    let ids = all_idx[start..end].to_vec();
    if let Dim::Sym(n) = &g.ty(idx).shape[0] {
        syms.insert(n.clone(), ids.len());
    }
    (
        Tensor::i64(vec![o.len()], o),
        Tensor::i64(vec![ids.len()], ids),
    )
}

/// Asserts `a` and `b` agree within `rel` relative tolerance (elementwise).
pub fn assert_close(what: &str, a: &[f32], b: &[f32], rel: f32) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        let tol = rel * x.abs().max(y.abs()).max(1e-2);
        assert!((x - y).abs() <= tol, "{what}[{i}]: {x} vs {y} (tol {tol})");
    }
}

/// Counts nodes with this mnemonic.
pub fn count(g: &Graph, mnemonic: &str) -> usize {
    g.nodes()
        .iter()
        .filter(|n| n.op.mnemonic() == mnemonic)
        .count()
}

/// True if `v` is an input of `g`.
pub fn is_input(g: &Graph, v: ValueId) -> bool {
    matches!(g.value(v).def, Def::Input(_))
}

/// The table-wise [`ShardPlan`] that places table `i` (parameter order) on rank
/// `i % ranks`: every table exchanged whole, for the tests of the table-wise
/// structure (the planner, `dlrm_passes::shard::plan`, may also split or replicate
/// tables; `shard.rs` tests those placements).
pub fn table_wise(g: &Graph, ranks: usize) -> ShardPlan {
    table_wise_of(&dlrm_passes::partition::tables(g).unwrap(), ranks)
}

/// A plan from per-table kinds `(kind, arg)`: a table-wise table on rank `arg`, a
/// row-wise one in `arg` even shards (shard `k` on rank `(k+1) % ranks`), a
/// data-parallel one everywhere.
pub fn hand_plan(ts: &[TableInfo], ranks: usize, kinds: &[(ShardKind, usize)]) -> ShardPlan {
    ShardPlan {
        ranks,
        tables: ts
            .iter()
            .zip(kinds)
            .map(|(t, &(kind, arg))| TablePlan {
                table: t.name.clone(),
                kind,
                shards: match kind {
                    ShardKind::TableWise => vec![Shard {
                        rank: arg,
                        lo: 0,
                        hi: t.rows,
                    }],
                    ShardKind::DataParallel => vec![],
                    ShardKind::RowWise => (0..arg)
                        .map(|k| Shard {
                            rank: (k + 1) % ranks,
                            lo: k * t.rows / arg,
                            hi: (k + 1) * t.rows / arg,
                        })
                        .collect(),
                },
            })
            .collect(),
    }
}

fn table_wise_of(tables: &[TableInfo], ranks: usize) -> ShardPlan {
    ShardPlan {
        ranks,
        tables: tables
            .iter()
            .enumerate()
            .map(|(i, t)| TablePlan {
                table: t.name.clone(),
                kind: ShardKind::TableWise,
                shards: vec![Shard {
                    rank: i % ranks,
                    lo: 0,
                    hi: t.rows,
                }],
            })
            .collect(),
    }
}

/// `g` partitioned for `ranks` ranks under [`table_wise`], one `all_reduce` per
/// gradient (the per-rank passes run).
pub fn partition(g: &Graph, ranks: usize) -> dlrm_passes::Result<Partitioned> {
    let plan = table_wise_of(&dlrm_passes::partition::tables(g)?, ranks);
    dlrm_passes::partition_with(g, &plan)
}
