//! A tiny DLRM built by hand with the graph builder: forward, hand-written backward
//! and SGD, unpartitioned or partitioned by hand for N ranks (table t owned by rank
//! t % N; embedding outputs scattered with `all_to_all`, their gradients gathered
//! back, dense gradients and the loss `all_reduce`d, loss `denom = G`).

#![allow(dead_code)]

use dlrm_ir::{
    A2aDir, Act, DType, Dim, Graph, InteractionKind, Op, Pool, Tensor, TensorType, ValueId,
};
use dlrm_runtime::{Plan, Training};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub const DENSE: usize = 4;
pub const D: usize = 4;
/// (rows, pooling) per table.
pub const TABLES: [(usize, usize); 3] = [(50, 2), (30, 1), (200, 3)];
pub const BOT: [usize; 2] = [8, D];
pub const TOP: [usize; 2] = [8, 1];

fn f32t(dims: impl IntoIterator<Item = Dim>) -> TensorType {
    TensorType::new(DType::F32, dims)
}

fn fx(n: usize) -> Dim {
    Dim::Fixed(n)
}

/// The parameters' names and shapes, in order.
pub fn param_shapes() -> Vec<(String, Vec<usize>)> {
    let mut v = Vec::new();
    for (t, &(rows, _)) in TABLES.iter().enumerate() {
        v.push((format!("emb.{t}"), vec![rows, D]));
    }
    let mut k = DENSE;
    for (i, &n) in BOT.iter().enumerate() {
        v.push((format!("bot.{i}.w"), vec![n, k]));
        v.push((format!("bot.{i}.b"), vec![n]));
        k = n;
    }
    let f = TABLES.len() + 1;
    let mut k = D + f * (f - 1) / 2;
    for (i, &n) in TOP.iter().enumerate() {
        v.push((format!("top.{i}.w"), vec![n, k]));
        v.push((format!("top.{i}.b"), vec![n]));
        k = n;
    }
    v
}

/// Initial values (Glorot-uniform weights, U(±sqrt(1/rows)) tables).
pub fn params(seed: u64) -> Vec<(String, Tensor)> {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    param_shapes()
        .into_iter()
        .map(|(name, shape)| {
            let a = if name.starts_with("emb") {
                (1.0 / shape[0] as f32).sqrt()
            } else if shape.len() == 2 {
                (6.0 / (shape[0] + shape[1]) as f32).sqrt()
            } else {
                (1.0 / shape[0] as f32).sqrt()
            };
            let n = shape.iter().product();
            let v = (0..n).map(|_| r.random_range(-a..a)).collect();
            (name, Tensor::f32(shape, v))
        })
        .collect()
}

/// The tiny DLRM for rank `rank` of `ranks` (1 = unpartitioned), inference or a
/// training step with learning rate `lr`.
pub fn tiny(ranks: usize, rank: usize, train: bool, lr: f32) -> Graph {
    build(ranks, rank, train, lr).expect("tiny DLRM builds")
}

fn build(ranks: usize, rank: usize, train: bool, lr: f32) -> dlrm_ir::Result<Graph> {
    let part = ranks > 1;
    let name = match (train, part) {
        (false, false) => "tiny".to_string(),
        (true, false) => "tiny.train".to_string(),
        (false, true) => format!("tiny.infer.r{rank}"),
        (true, true) => format!("tiny.train.r{rank}"),
    };
    let mut g = Graph::new(name);
    let b = Dim::batch;
    let owner = |t: usize| t % ranks;
    let counts: Vec<usize> = (0..ranks)
        .map(|r| (0..TABLES.len()).filter(|&t| owner(t) == r).count())
        .collect();
    let mine: Vec<usize> = (0..TABLES.len()).filter(|&t| owner(t) == rank).collect();
    let sample_dim = if part { Dim::global() } else { b() };

    let dense = g.add_input("dense", f32t([b(), fx(DENSE)]))?;
    let mut idx = vec![None; TABLES.len()];
    for &t in &mine {
        let l = TABLES[t].1;
        idx[t] = Some(g.add_input(
            &format!("idx.{t}"),
            TensorType::new(DType::I64, [sample_dim.clone(), fx(l)]),
        )?);
    }
    let label = if train {
        Some(g.add_input("label", f32t([b(), fx(1)]))?)
    } else {
        None
    };
    let mut emb = vec![None; TABLES.len()];
    for &t in &mine {
        emb[t] = Some(g.add_param(&format!("emb.{t}"), f32t([fx(TABLES[t].0), fx(D)]))?);
    }
    let layer_params = |g: &mut Graph,
                        pre: &str,
                        sizes: &[usize],
                        k0: usize|
     -> dlrm_ir::Result<Vec<(ValueId, ValueId)>> {
        let mut k = k0;
        let mut v = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let w = g.add_param(&format!("{pre}.{i}.w"), f32t([fx(n), fx(k)]))?;
            let bb = g.add_param(&format!("{pre}.{i}.b"), f32t([fx(n)]))?;
            v.push((w, bb));
            k = n;
        }
        Ok(v)
    };
    let bot = layer_params(&mut g, "bot", &BOT, DENSE)?;
    let f = TABLES.len() + 1;
    let top = layer_params(&mut g, "top", &TOP, D + f * (f - 1) / 2)?;

    // Forward.
    let mut acts = vec![dense];
    for (i, &(w, bb)) in bot.iter().enumerate() {
        let x = *acts.last().expect("acts");
        acts.push(g.add(
            Op::Linear { act: Act::Relu },
            &[x, w, bb],
            &format!("bot.{i}"),
        )?);
    }
    let x = *acts.last().expect("bottom output");
    let mut own_out = Vec::new();
    for &t in &mine {
        let (e, i) = (emb[t].expect("own"), idx[t].expect("own"));
        own_out.push(g.add(
            Op::EmbeddingBag {
                mode: Pool::Sum,
                last_offset: false,
            },
            &[e, i],
            &format!("bag.{t}"),
        )?);
    }
    let bags: Vec<ValueId> = if part {
        // Results in owner order: rank 0's tables, rank 1's, ...
        let order: Vec<usize> = (0..ranks)
            .flat_map(|r| (0..TABLES.len()).filter(move |&t| owner(t) == r))
            .collect();
        let names: Vec<String> = order.iter().map(|t| format!("e.{t}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let declared: Vec<TensorType> = order.iter().map(|_| f32t([b(), fx(D)])).collect();
        let outs = g.add_node_typed(
            Op::AllToAll {
                dir: A2aDir::Scatter,
                counts: counts.clone(),
                rank,
            },
            &own_out,
            &refs,
            &declared,
        )?;
        let mut by_table = vec![None; TABLES.len()];
        for (&t, v) in order.iter().zip(outs) {
            by_table[t] = Some(v);
        }
        by_table
            .into_iter()
            .map(|v| v.expect("every table"))
            .collect()
    } else {
        own_out.clone()
    };
    let mut inter_ops = vec![x];
    inter_ops.extend(&bags);
    let r = g.add(
        Op::Interaction {
            kind: InteractionKind::Dot,
            self_interaction: false,
        },
        &inter_ops,
        "inter",
    )?;
    let mut tacts = vec![r];
    for (i, &(w, bb)) in top.iter().enumerate() {
        let act = if i + 1 == top.len() {
            Act::Sigmoid
        } else {
            Act::Relu
        };
        let xin = *tacts.last().expect("acts");
        tacts.push(g.add(Op::Linear { act }, &[xin, w, bb], &format!("top.{i}"))?);
    }
    let prob = *tacts.last().expect("prob");
    if !train {
        g.add_output(prob);
        return Ok(g);
    }

    // Loss and backward.
    let label = label.expect("train");
    let denom = if part { Dim::global() } else { b() };
    let loss = g.add(
        Op::Bce {
            denom: denom.clone(),
        },
        &[prob, label],
        "loss",
    )?;
    let loss_out = if part {
        g.add(Op::AllReduce, &[loss], "loss.all")?
    } else {
        loss
    };
    g.add_output(loss_out);
    let mut dy = g.add(Op::BceGrad { denom }, &[prob, label], "d.prob")?;
    let mut dense_grads: Vec<(ValueId, ValueId)> = Vec::new(); // (param, grad)
    for (i, &(w, bb)) in top.iter().enumerate().rev() {
        let y = tacts[i + 1];
        let xin = tacts[i];
        let dz = if i + 1 == top.len() {
            g.add(Op::SigmoidGrad, &[dy, y], &format!("d.top.{i}.pre"))?
        } else {
            g.add(Op::ReluGrad, &[dy, y], &format!("d.top.{i}.pre"))?
        };
        dense_grads.push((w, g.add(Op::LinearDw, &[dz, xin], &format!("d.top.{i}.w"))?));
        dense_grads.push((bb, g.add(Op::LinearDb, &[dz], &format!("d.top.{i}.b"))?));
        dy = g.add(Op::LinearDx, &[dz, w], &format!("d.top.{i}.x"))?;
    }
    let mut ig_ins = vec![dy];
    ig_ins.extend(&inter_ops);
    let names: Vec<String> = (0..inter_ops.len())
        .map(|k| format!("d.inter.{k}"))
        .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let ig = g.add_node(
        Op::InteractionGrad {
            kind: InteractionKind::Dot,
            self_interaction: false,
        },
        &ig_ins,
        &refs,
    )?;
    let mut dy = ig[0];
    let d_bags = &ig[1..];
    for (i, &(w, bb)) in bot.iter().enumerate().rev() {
        let y = acts[i + 1];
        let xin = acts[i];
        let dz = g.add(Op::ReluGrad, &[dy, y], &format!("d.bot.{i}.pre"))?;
        dense_grads.push((w, g.add(Op::LinearDw, &[dz, xin], &format!("d.bot.{i}.w"))?));
        dense_grads.push((bb, g.add(Op::LinearDb, &[dz], &format!("d.bot.{i}.b"))?));
        if i > 0 {
            dy = g.add(Op::LinearDx, &[dz, w], &format!("d.bot.{i}.x"))?;
        }
    }
    // Embedding gradients back to the owners.
    let own_d: Vec<ValueId> = if part {
        let order: Vec<usize> = (0..ranks)
            .flat_map(|r| (0..TABLES.len()).filter(move |&t| owner(t) == r))
            .collect();
        let grouped: Vec<ValueId> = order.iter().map(|&t| d_bags[t]).collect();
        let names: Vec<String> = mine.iter().map(|t| format!("d.bag.{t}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        g.add_node(
            Op::AllToAll {
                dir: A2aDir::Gather,
                counts: counts.clone(),
                rank,
            },
            &grouped,
            &refs,
        )?
    } else {
        d_bags.to_vec()
    };
    // Dense gradients summed over the ranks.
    let grads: Vec<ValueId> = if part {
        let ins: Vec<ValueId> = dense_grads.iter().map(|&(_, gv)| gv).collect();
        let names: Vec<String> = ins
            .iter()
            .map(|&v| format!("{}.sum", g.name_of(v)))
            .collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        g.add_node(Op::AllReduce, &ins, &refs)?
    } else {
        dense_grads.iter().map(|&(_, gv)| gv).collect()
    };
    for (&(p, _), &gv) in dense_grads.iter().zip(&grads) {
        let next = format!("{}.next", g.name_of(p));
        let nv = g.add(Op::Sgd { lr }, &[p, gv], &next)?;
        g.add_update(p, nv)?;
    }
    for (k, &t) in mine.iter().enumerate() {
        let (e, i) = (emb[t].expect("own"), idx[t].expect("own"));
        let rows = g.add(
            Op::EmbeddingBagGrad {
                mode: Pool::Sum,
                last_offset: false,
            },
            &[own_d[k], i],
            &format!("d.emb.{t}.rows"),
        )?;
        let nv = g.add(
            Op::SparseSgd { lr },
            &[e, i, rows],
            &format!("emb.{t}.next"),
        )?;
        g.add_update(e, nv)?;
    }
    dlrm_ir::verify(&g)?;
    Ok(g)
}

/// A plan of the tiny DLRM (unpartitioned graphs).
pub fn plan(lr: f32) -> Plan {
    Plan {
        name: "tiny".into(),
        infer: tiny(1, 0, false, lr),
        train: Some(tiny(1, 0, true, lr)),
        params: params(42)
            .into_iter()
            .map(|(n, t)| (n, dlrm_ir::ParamValue::Stored(t)))
            .collect(),
        training: Training {
            loss: "bce".into(),
            optimizer: "sgd".into(),
            learning_rate: lr,
            batch_size: 64,
            seed: 7,
        },
        precision: "fp32".into(),
        pass_log: serde_json::json!([{"pass": "verify", "ms": 0.1}]),
        contract: Default::default(),
    }
}

/// Relative closeness of two f32 slices.
pub fn close(a: &[f32], b: &[f32], rel: f32) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= rel * (1.0 + x.abs().max(y.abs())))
}
