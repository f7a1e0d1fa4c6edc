//! The forward graph's structure: names, types, ops and attributes.

mod common;

use common::{example, tiny_set, tiny_with};
use dlrm_ir::{Act, DType, Dim, InteractionKind, Op, Pool, TensorType};
use dlrm_json::{Loss, ModelSpec};
use serde_json::json;

fn f32t(dims: &[usize]) -> TensorType {
    TensorType::f32(dims.iter().map(|&d| Dim::Fixed(d)))
}

fn batch_f32(w: usize) -> TensorType {
    TensorType::f32([Dim::batch(), Dim::Fixed(w)])
}

#[test]
fn tiny_graph_structure() {
    let m = dlrm_json::load(example("dlrm-tiny")).expect("load");
    let g = &m.graph;

    let inputs: Vec<(&str, &TensorType)> = g
        .inputs()
        .iter()
        .map(|&v| (g.name_of(v), g.ty(v)))
        .collect();
    let idx = TensorType::new(DType::I64, [Dim::batch(), Dim::Fixed(2)]);
    assert_eq!(
        inputs,
        vec![
            ("dense", &batch_f32(4)),
            ("idx.0", &idx),
            ("idx.1", &idx),
            ("idx.2", &idx)
        ]
    );

    // F = 4 vectors of width 8: 8 + 6 = 14 features into the top MLP.
    let params: Vec<(&str, TensorType)> = g.param_types().map(|(n, t)| (n, t.clone())).collect();
    assert_eq!(
        params,
        vec![
            ("emb.0", f32t(&[50, 8])),
            ("emb.1", f32t(&[30, 8])),
            ("emb.2", f32t(&[20, 8])),
            ("bot.0.w", f32t(&[16, 4])),
            ("bot.0.b", f32t(&[16])),
            ("bot.1.w", f32t(&[8, 16])),
            ("bot.1.b", f32t(&[8])),
            ("top.0.w", f32t(&[16, 14])),
            ("top.0.b", f32t(&[16])),
            ("top.1.w", f32t(&[1, 16])),
            ("top.1.b", f32t(&[1])),
        ]
    );
    let names: Vec<&str> = m.params.iter().map(|(n, _)| n.as_str()).collect();
    let gnames: Vec<&str> = params.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, gnames);

    let relu = Op::Linear { act: Act::Relu };
    let bag = Op::EmbeddingBag {
        mode: Pool::Sum,
        last_offset: false,
    };
    let nodes: Vec<(Op, Vec<&str>, &str, TensorType)> = g
        .nodes()
        .iter()
        .map(|n| {
            assert_eq!(n.outputs.len(), 1);
            let out = n.outputs[0];
            (
                n.op.clone(),
                n.inputs.iter().map(|&v| g.name_of(v)).collect(),
                g.name_of(out),
                g.ty(out).clone(),
            )
        })
        .collect();
    assert_eq!(
        nodes,
        vec![
            (
                relu.clone(),
                vec!["dense", "bot.0.w", "bot.0.b"],
                "bot.0",
                batch_f32(16)
            ),
            (
                relu.clone(),
                vec!["bot.0", "bot.1.w", "bot.1.b"],
                "bot.1",
                batch_f32(8)
            ),
            (bag.clone(), vec!["emb.0", "idx.0"], "bag.0", batch_f32(8)),
            (bag.clone(), vec!["emb.1", "idx.1"], "bag.1", batch_f32(8)),
            (bag.clone(), vec!["emb.2", "idx.2"], "bag.2", batch_f32(8)),
            (
                Op::Interaction {
                    kind: InteractionKind::Dot,
                    self_interaction: false
                },
                vec!["bot.1", "bag.0", "bag.1", "bag.2"],
                "inter",
                batch_f32(14)
            ),
            (
                relu.clone(),
                vec!["inter", "top.0.w", "top.0.b"],
                "top.0",
                batch_f32(16)
            ),
            (
                Op::Linear { act: Act::Sigmoid },
                vec!["top.0", "top.1.w", "top.1.b"],
                "prob",
                batch_f32(1)
            ),
        ]
    );

    assert_eq!(g.outputs().len(), 1);
    assert_eq!(g.name_of(g.outputs()[0]), "prob");
    assert_eq!(g.ty(g.outputs()[0]), &batch_f32(1));
    assert!(g.updates().is_empty());
}

fn interaction_of(spec: &ModelSpec) -> (Op, TensorType) {
    let g = spec.graph().expect("graph");
    let v = g.find("inter").expect("inter");
    let dlrm_ir::Def::Node(n, _) = g.value(v).def else {
        panic!("inter is not a node result")
    };
    let w = g.find("top.0.w").expect("top.0.w");
    assert_eq!(g.ty(w).shape[1], g.ty(v).shape[1], "top MLP input width");
    (g.nodes()[n].op.clone(), g.ty(v).clone())
}

#[test]
fn cat_interaction_width_and_free_bottom_width() {
    // cat does not require the bottom output to match the embedding width.
    let src = tiny_with(|m| {
        m.insert("interaction".into(), json!("cat"));
        m.insert("bottom_mlp".into(), json!([4, 16, 5]));
    });
    let spec = ModelSpec::parse(&src, "cat.json").expect("parse");
    assert_eq!(spec.top_input_width(), 5 + 3 * 8);
    let (op, ty) = interaction_of(&spec);
    assert_eq!(
        op,
        Op::Interaction {
            kind: InteractionKind::Cat,
            self_interaction: false
        }
    );
    assert_eq!(ty, batch_f32(29));
}

#[test]
fn dot_interaction_itself_width() {
    let spec =
        ModelSpec::parse(&tiny_set("interaction_itself", json!(true)), "self.json").expect("parse");
    // F = 4: 8 + 4*5/2.
    assert_eq!(spec.top_input_width(), 18);
    let (op, ty) = interaction_of(&spec);
    assert_eq!(
        op,
        Op::Interaction {
            kind: InteractionKind::Dot,
            self_interaction: true
        }
    );
    assert_eq!(ty, batch_f32(18));
}

#[test]
fn pooling_list_gives_per_table_index_widths() {
    let spec =
        ModelSpec::parse(&tiny_set("pooling", json!([1, 2, 3])), "pool.json").expect("parse");
    assert_eq!(spec.pooling, vec![1, 2, 3]);
    let g = spec.graph().expect("graph");
    for (t, l) in [1usize, 2, 3].into_iter().enumerate() {
        let v = g.find(&format!("idx.{t}")).expect("idx");
        assert_eq!(
            g.ty(v),
            &TensorType::new(DType::I64, [Dim::batch(), Dim::Fixed(l)])
        );
    }
}

#[test]
fn mean_pooling_mode_and_mse_loss() {
    let src = tiny_with(|m| {
        m.insert("pooling_mode".into(), json!("mean"));
        m.insert("loss".into(), json!("mse"));
    });
    let model = dlrm_json::from_str(&src, "mean.json").expect("build");
    assert_eq!(model.training.loss, Loss::Mse);
    let bags: Vec<&Op> = model
        .graph
        .nodes()
        .iter()
        .map(|n| &n.op)
        .filter(|op| matches!(op, Op::EmbeddingBag { .. }))
        .collect();
    assert_eq!(bags.len(), 3);
    assert!(bags.iter().all(|op| **op
        == Op::EmbeddingBag {
            mode: Pool::Mean,
            last_offset: false
        }));
}

#[test]
fn widths_as_strings_equal_lists() {
    let src = tiny_with(|m| {
        m.insert("bottom_mlp".into(), json!("4-16-8"));
        m.insert("top_mlp".into(), json!("16-1"));
    });
    let a = ModelSpec::parse(&src, "s.json").expect("strings");
    let b = ModelSpec::load(example("dlrm-tiny")).expect("lists");
    assert_eq!(a, b);
}

#[test]
fn optional_fields_take_their_defaults() {
    let src = tiny_with(|m| {
        for f in [
            "pooling",
            "pooling_mode",
            "interaction",
            "interaction_itself",
            "loss",
            "optimizer",
            "seed",
        ] {
            m.remove(f);
        }
    });
    let s = ModelSpec::parse(&src, "defaults.json").expect("parse");
    assert_eq!(s.pooling, vec![1, 1, 1]);
    assert_eq!(s.pooling_mode, Pool::Sum);
    assert_eq!(s.interaction, InteractionKind::Dot);
    assert!(!s.interaction_itself);
    assert_eq!(s.loss, Loss::Bce);
    assert_eq!(s.seed, 1);
}

#[test]
fn deeper_mlps_name_every_layer() {
    let src = tiny_with(|m| {
        m.insert("bottom_mlp".into(), json!("4-32-16-8"));
        m.insert("top_mlp".into(), json!("64-32-16-1"));
    });
    let model = dlrm_json::from_str(&src, "deep.json").expect("build");
    let g = &model.graph;
    for n in ["bot.0", "bot.1", "bot.2", "top.0", "top.1", "top.2", "prob"] {
        assert!(g.find(n).is_some(), "{n}");
    }
    assert!(g.find("top.3").is_none());
    let acts: Vec<Act> = g
        .nodes()
        .iter()
        .filter_map(|n| match n.op {
            Op::Linear { act } => Some(act),
            _ => None,
        })
        .collect();
    assert_eq!(acts.len(), 7);
    assert!(acts[..6].iter().all(|&a| a == Act::Relu));
    assert_eq!(acts[6], Act::Sigmoid);
    assert_eq!(g.ty(g.find("top.3.w").expect("w")), &f32t(&[1, 16]));
    let summary = model.summary();
    assert!(summary.contains("4-32-16-8"), "{summary}");
}
