//! The synthetic data: roles found structurally, determinism across rank counts,
//! balanced labels, held-out batches, variable bags.

mod common;

use common::*;
use dlrm_ir::{DType, Dim, Graph, Op, Pool, Tensor, TensorType, batch_slice};
use dlrm_runtime::synthetic::{DataSchema, SyntheticData, eval_step};

#[test]
fn schema_is_found_structurally() {
    let s = DataSchema::from_graph(&tiny(1, 0, true, 0.1)).expect("schema");
    assert_eq!(s.dense.len(), 1);
    assert_eq!(
        (s.dense[0].input.as_str(), s.dense[0].width),
        ("dense", DENSE)
    );
    let sparse: Vec<(&str, usize, usize)> = s
        .sparse
        .iter()
        .map(|f| (f.input.as_str(), f.rows, f.pooling))
        .collect();
    assert_eq!(
        sparse,
        vec![("idx.0", 50, 2), ("idx.1", 30, 1), ("idx.2", 200, 3)]
    );
    assert_eq!(s.label.as_ref().map(|l| l.input.as_str()), Some("label"));
    let s = DataSchema::from_graph(&tiny(1, 0, false, 0.1)).expect("schema");
    assert!(s.label.is_none());
}

#[test]
fn roles_do_not_depend_on_names() {
    // Same structure, odd names: the label is whatever the loss compares against.
    let mut g = Graph::new("odd");
    let x = g
        .add_input("zz", TensorType::f32([Dim::batch(), Dim::Fixed(3)]))
        .expect("in");
    let i = g
        .add_input(
            "dense",
            TensorType::new(DType::I32, [Dim::batch(), Dim::Fixed(2)]),
        )
        .expect("in");
    let y = g
        .add_input("idx.0", TensorType::f32([Dim::batch(), Dim::Fixed(3)]))
        .expect("in");
    let t = g
        .add_param("label", TensorType::f32([Dim::Fixed(9), Dim::Fixed(3)]))
        .expect("p");
    let e = g
        .add(
            Op::EmbeddingBag {
                mode: Pool::Mean,
                last_offset: false,
            },
            &[t, i],
            "e",
        )
        .expect("bag");
    let s = g.add(Op::Add, &[x, e], "s").expect("add");
    let l = g
        .add(
            Op::Mse {
                denom: Dim::batch(),
            },
            &[s, y],
            "l",
        )
        .expect("mse");
    g.add_output(l);
    let sch = DataSchema::from_graph(&g).expect("schema");
    assert_eq!(sch.dense[0].input, "zz");
    assert_eq!(
        (sch.sparse[0].input.as_str(), sch.sparse[0].rows),
        ("dense", 9)
    );
    assert_eq!(sch.label.expect("label").input, "idx.0");
}

#[test]
fn a_sample_is_the_same_whatever_the_rank_count() {
    let data = SyntheticData::new(
        DataSchema::from_graph(&tiny(1, 0, true, 0.1)).expect("schema"),
        9,
    );
    let global = 37;
    let one = data
        .inputs_for(5, global, 1, 0, &tiny(1, 0, true, 0.1))
        .expect("1 rank");
    for ranks in [2usize, 3, 5] {
        let mut dense = Vec::new();
        let mut label = Vec::new();
        for rank in 0..ranks {
            let g = tiny(ranks, rank, true, 0.1);
            let ins = data.inputs_for(5, global, ranks, rank, &g).expect("inputs");
            let mine = batch_slice(global, ranks, rank);
            assert_eq!(ins["dense"].shape, vec![mine.len(), DENSE]);
            dense.extend(ins["dense"].to_f32_vec());
            label.extend(ins["label"].to_f32_vec());
            // Owned tables' indices cover the whole global batch, identical to 1 rank.
            for t in 0..TABLES.len() {
                let key = format!("idx.{t}");
                assert_eq!(
                    ins.contains_key(&key),
                    t % ranks == rank,
                    "{key} on rank {rank}"
                );
                if let Some(ix) = ins.get(&key) {
                    assert_eq!(ix, &one[&key], "{key}");
                }
            }
            assert_eq!(
                ins.len(),
                2 + (0..TABLES.len()).filter(|t| t % ranks == rank).count()
            );
        }
        assert_eq!(dense, one["dense"].to_f32_vec(), "{ranks} ranks");
        assert_eq!(label, one["label"].to_f32_vec(), "{ranks} ranks");
    }
}

#[test]
fn values_are_in_range_and_deterministic() {
    let g = tiny(1, 0, true, 0.1);
    let schema = DataSchema::from_graph(&g).expect("schema");
    let a = SyntheticData::new(schema.clone(), 1);
    let b = SyntheticData::new(schema.clone(), 1);
    let c = SyntheticData::new(schema, 2);
    let ia = a.inputs_for(3, 256, 1, 0, &g).expect("a");
    assert_eq!(ia, b.inputs_for(3, 256, 1, 0, &g).expect("b"));
    assert_ne!(
        ia["dense"],
        c.inputs_for(3, 256, 1, 0, &g).expect("c")["dense"]
    );
    assert_ne!(
        ia["dense"],
        a.inputs_for(4, 256, 1, 0, &g).expect("step 4")["dense"]
    );
    assert_ne!(
        ia["dense"],
        a.inputs_for(eval_step(3), 256, 1, 0, &g).expect("eval")["dense"]
    );
    assert!(
        ia["dense"]
            .to_f32_vec()
            .iter()
            .all(|&x| (0.0..1.0).contains(&x))
    );
    let mut hot = Vec::new();
    for (t, &(rows, l)) in TABLES.iter().enumerate() {
        let ix = ia[&format!("idx.{t}")].to_i64_vec().expect("ints");
        assert_eq!(ix.len(), 256 * l);
        assert!(ix.iter().all(|&i| (0..rows as i64).contains(&i)));
        // Skewed: the most frequent row is far above uniform.
        let mut counts = vec![0usize; rows];
        ix.iter().for_each(|&i| counts[i as usize] += 1);
        let top = *counts.iter().max().expect("rows");
        assert!(
            top as f64 > 4.0 * ix.len() as f64 / rows as f64,
            "table {t}: top row {top}"
        );
        hot.push(counts.iter().position(|&c| c == top).expect("max"));
    }
    // Hot rows are spread by a per-table bijection, not all at row 0.
    assert!(hot.iter().any(|&h| h != 0), "{hot:?}");
}

#[test]
fn labels_are_balanced_and_learnable_from_the_features() {
    let g = tiny(1, 0, true, 0.1);
    let data = SyntheticData::new(DataSchema::from_graph(&g).expect("schema"), 11);
    let labels: Vec<f32> = (0..8).flat_map(|s| data.labels(s, 0..512)).collect();
    let pos = labels.iter().filter(|&&y| y == 1.0).count() as f64 / labels.len() as f64;
    assert!((0.2..=0.45).contains(&pos), "positive share {pos}");
    assert!(labels.iter().all(|&y| y == 0.0 || y == 1.0));
    // The label depends on the dense features: their mean differs between classes
    // for at least one column.
    let ins = data.inputs_for(0, 2048, 1, 0, &g).expect("inputs");
    let (x, y) = (ins["dense"].to_f32_vec(), ins["label"].to_f32_vec());
    let gap = (0..DENSE)
        .map(|j| {
            let mean = |cls: f32| {
                let v: Vec<f32> = (0..2048)
                    .filter(|&s| y[s] == cls)
                    .map(|s| x[s * DENSE + j])
                    .collect();
                v.iter().sum::<f32>() / v.len() as f32
            };
            (mean(1.0) - mean(0.0)).abs()
        })
        .fold(0.0f32, f32::max);
    assert!(gap > 0.05, "dense features carry no signal ({gap})");
}

#[test]
fn variable_bags_with_offsets() {
    let mut g = Graph::new("var");
    let x = g
        .add_input("x", TensorType::f32([Dim::batch(), Dim::Fixed(4)]))
        .expect("x");
    let idx = g
        .add_input("ids", TensorType::new(DType::I32, [Dim::Sym("N".into())]))
        .expect("ids");
    let off = g
        .add_input("offs", TensorType::new(DType::I64, [Dim::batch()]))
        .expect("offs");
    let t = g
        .add_param("t", TensorType::f32([Dim::Fixed(17), Dim::Fixed(4)]))
        .expect("t");
    let e = g
        .add(
            Op::EmbeddingBag {
                mode: Pool::Sum,
                last_offset: false,
            },
            &[t, idx, off],
            "e",
        )
        .expect("bag");
    let s = g.add(Op::Add, &[x, e], "s").expect("add");
    g.add_output(s);
    let mut schema = DataSchema::from_graph(&g).expect("schema");
    assert_eq!(schema.sparse[0].offsets.as_deref(), Some("offs"));
    schema.sparse[0].pooling = 3;
    let data = SyntheticData::new(schema, 5);
    let ins = data.inputs_for(0, 100, 1, 0, &g).expect("inputs");
    let ids = ins["ids"].to_i64_vec().expect("ids");
    let offs = ins["offs"].to_i64_vec().expect("offs");
    assert!(matches!(
        ins["ids"],
        Tensor {
            data: dlrm_ir::Data::I32(_),
            ..
        }
    ));
    assert_eq!(offs.len(), 100);
    assert_eq!(offs[0], 0);
    let mut lens: Vec<i64> = offs.windows(2).map(|w| w[1] - w[0]).collect();
    lens.push(ids.len() as i64 - offs[99]);
    assert!(lens.iter().all(|&l| (0..=6).contains(&l)), "{lens:?}");
    assert!(lens.contains(&0) && lens.contains(&6));
    assert!(ids.iter().all(|&i| (0..17).contains(&i)));
    // Same bags on a 4-rank slice.
    let part = data.inputs_for(0, 100, 4, 1, &g).expect("rank 1");
    let r = batch_slice(100, 4, 1);
    let start = offs[r.start] as usize;
    let end = offs[r.end] as usize;
    assert_eq!(
        part["ids"].to_i64_vec().expect("ids"),
        ids[start..end].to_vec()
    );
}

#[test]
fn unknown_inputs_are_errors() {
    let mut g = Graph::new("bad");
    let x = g
        .add_input(
            "x",
            TensorType::new(DType::I64, [Dim::batch(), Dim::Fixed(2)]),
        )
        .expect("x");
    g.add_output(x);
    assert!(DataSchema::from_graph(&g).is_err());
    let data = SyntheticData::new(
        DataSchema::from_graph(&tiny(1, 0, false, 0.0)).expect("schema"),
        1,
    );
    let mut other = Graph::new("other");
    let y = other
        .add_input("mystery", TensorType::f32([Dim::batch(), Dim::Fixed(2)]))
        .expect("y");
    other.add_output(y);
    let err = data
        .inputs_for(0, 8, 1, 0, &other)
        .expect_err("not in schema");
    assert!(err.to_string().contains("mystery"), "{err}");
}

/// FNV-1a over the bits of every value of `ins`, in input-name order.
fn fingerprint(ins: &std::collections::HashMap<String, Tensor>) -> u64 {
    let mut names: Vec<&String> = ins.keys().collect();
    names.sort();
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut eat = |w: u64| {
        for b in w.to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    };
    for n in names {
        let t = &ins[n];
        match t.to_i64_vec() {
            Some(v) => v.iter().for_each(|&i| eat(i as u64)),
            None => t
                .to_f32_vec()
                .iter()
                .for_each(|x| eat(u64::from(x.to_bits()))),
        }
    }
    h
}

#[test]
fn the_data_stream_is_pinned() {
    // A sample's values are a documented pure function of (seed, step, sample,
    // feature, slot): a faster generator must reproduce them bit for bit, so
    // runs, checkpoints and measurements stay comparable across versions.
    let g = tiny(1, 0, true, 0.1);
    let data = SyntheticData::new(DataSchema::from_graph(&g).expect("schema"), 7);
    let prints: Vec<u64> = [0, 3, eval_step(2)]
        .iter()
        .map(|&step| fingerprint(&data.inputs_for(step, 300, 1, 0, &g).expect("inputs")))
        .collect();
    assert_eq!(
        prints,
        vec![
            0x8ea2_cfcb_4d84_55f7,
            0x37c0_df9e_9e57_9017,
            0x752a_40d8_29d8_c658
        ],
        "{prints:#x?}"
    );
}
