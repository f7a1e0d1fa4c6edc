//! The data sources on last_offset bags (`include_last_offset=True`): an offsets
//! input `[B+1]` (or `[G+1]`) gets the usual offsets plus the index count, `[B]` /
//! `[G]` (a partitioned graph's plain offsets) the usual ones; both read the same
//! bags as the plain twin of the graph, from the synthetic teacher and a dataset.

use dlrm_data::{Learnable, write_learnable};
use dlrm_ir::{DType, Dim, DimExpr, Graph, Op, Pool, Tensor, TensorType, batch_slice};
use dlrm_runtime::synthetic::{DataSchema, SyntheticData};
use dlrm_runtime::{DataConfig, DatasetSource};
use std::collections::HashMap;

const ROWS: [usize; 3] = [40, 7, 300];

fn plus_one(d: Dim) -> Dim {
    Dim::from_expr(d.to_expr().add(&DimExpr::int(1)).expect("d+1")).expect("dim")
}

/// Dense `x: [B,4]` and one bag per table of [`ROWS`] over `ids.t: [N_t]` and
/// `offs.t` with leading dimension `off` (`last_offset` when `last`).
fn graph(off: Dim, last: bool) -> Graph {
    let mut g = Graph::new("bags");
    g.add_input("x", TensorType::f32([Dim::batch(), Dim::Fixed(4)]))
        .expect("x");
    for (t, &rows) in ROWS.iter().enumerate() {
        let n = Dim::Sym(format!("N{t}"));
        let idx = g
            .add_input(&format!("ids.{t}"), TensorType::new(DType::I64, [n]))
            .expect("ids");
        let o = g
            .add_input(
                &format!("offs.{t}"),
                TensorType::new(DType::I64, [off.clone()]),
            )
            .expect("offs");
        let table = g
            .add_param(
                &format!("t.{t}"),
                TensorType::f32([Dim::Fixed(rows), Dim::Fixed(4)]),
            )
            .expect("t");
        let op = Op::EmbeddingBag {
            mode: Pool::Sum,
            last_offset: last,
        };
        let e = g.add(op, &[table, idx, o], &format!("e.{t}")).expect("bag");
        g.add_output(e);
    }
    g
}

fn ints(ins: &HashMap<String, Tensor>, name: &str) -> Vec<i64> {
    ins[name].to_i64_vec().expect(name)
}

/// Checks `last` (a `[.. + 1]` graph's inputs) against `plain` (its twin's):
/// the same indices, the same offsets and one more, the index count.
fn same_bags_and_the_count(last: &HashMap<String, Tensor>, plain: &HashMap<String, Tensor>) {
    for t in 0..ROWS.len() {
        let (ids, offs) = (format!("ids.{t}"), format!("offs.{t}"));
        let lo = ints(last, &offs);
        let po = ints(plain, &offs);
        assert_eq!(ints(last, &ids), ints(plain, &ids), "{ids}");
        assert_eq!(lo.len(), po.len() + 1, "{offs}");
        assert_eq!(lo[..po.len()], po[..], "{offs}");
        assert_eq!(lo[po.len()], ints(last, &ids).len() as i64, "{offs}");
        assert_eq!(lo[0], 0);
    }
}

#[test]
fn synthetic_last_offset_bags_get_the_index_count_as_last_offset() {
    let last = graph(plus_one(Dim::batch()), true);
    let plain = graph(Dim::batch(), false);
    let schema = DataSchema::from_graph(&last).expect("schema");
    assert_eq!(schema, DataSchema::from_graph(&plain).expect("twin"));
    assert_eq!(schema.sparse[0].offsets.as_deref(), Some("offs.0"));
    let data = SyntheticData::new(schema, 5);
    for step in [0, 3] {
        let l = data.inputs_for(step, 50, 1, 0, &last).expect("last");
        let p = data.inputs_for(step, 50, 1, 0, &plain).expect("plain");
        assert_eq!(ints(&l, "offs.1").len(), 51);
        same_bags_and_the_count(&l, &p);
        // A rank's slice: its own bags, offsets from 0.
        let r = batch_slice(50, 3, 2);
        let lr = data.inputs_for(step, 50, 3, 2, &last).expect("rank 2");
        let pr = data.inputs_for(step, 50, 3, 2, &plain).expect("rank 2");
        assert_eq!(ints(&lr, "offs.0").len(), r.len() + 1);
        same_bags_and_the_count(&lr, &pr);
        // The whole batch's offsets with the count (`po[r.end]` of the last rank).
        let po = ints(&l, "offs.0");
        let (a, b) = (po[r.start] as usize, po[r.end] as usize);
        assert_eq!(ints(&lr, "ids.0"), ints(&p, "ids.0")[a..b].to_vec());
    }
    // The partition's per-rank form: plain `[G]` offsets of the whole batch, or
    // `[G+1]` ones with the count.
    let rank_plain = graph(Dim::global(), false);
    let rank_last = graph(plus_one(Dim::global()), true);
    let p = data.inputs_for(1, 50, 1, 0, &plain).expect("plain");
    let g = data.inputs_for(1, 50, 3, 1, &rank_plain).expect("[G]");
    for t in 0..ROWS.len() {
        let (ids, offs) = (format!("ids.{t}"), format!("offs.{t}"));
        assert_eq!(ints(&g, &offs), ints(&p, &offs));
        assert_eq!(ints(&g, &ids), ints(&p, &ids));
    }
    let gl = data.inputs_for(1, 50, 3, 0, &rank_last).expect("[G+1]");
    same_bags_and_the_count(&gl, &g);
    // A length that is neither: a clear error naming the input.
    let odd = graph(plus_one(plus_one(Dim::batch())), true);
    let err = data.inputs_for(0, 50, 1, 0, &odd).expect_err("B+2");
    assert!(err.to_string().contains("%offs.0"), "{err}");
}

#[test]
fn dataset_last_offset_bags_get_the_index_count_as_last_offset() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("t.ds");
    let spec = Learnable {
        samples: 400,
        dense: 4,
        rows: ROWS.iter().map(|&r| r as u64).collect(),
        generator: "last_offset_data test".into(),
    };
    write_learnable(&path, &spec).expect("dataset");
    let last = graph(plus_one(Dim::batch()), true);
    let plain = graph(Dim::batch(), false);
    let open = |g: &Graph| {
        let schema = DataSchema::from_graph(g).expect("schema");
        DatasetSource::open(&DataConfig::new(&path), schema, 3, 32).expect("source")
    };
    let (ls, ps) = (open(&last), open(&plain));
    for step in [0, 5] {
        let samples = ls.train_samples(step);
        assert_eq!(samples, ps.train_samples(step));
        let l = ls.inputs(&samples, 1, 0, &last).expect("last");
        let p = ps.inputs(&samples, 1, 0, &plain).expect("plain");
        assert_eq!(ints(&l, "offs.2"), (0..=32).collect::<Vec<i64>>());
        same_bags_and_the_count(&l, &p);
        let lr = ls.inputs(&samples, 2, 1, &last).expect("rank 1");
        let pr = ps.inputs(&samples, 2, 1, &plain).expect("rank 1");
        assert_eq!(ints(&lr, "offs.0").len(), 17);
        same_bags_and_the_count(&lr, &pr);
    }
}
