//! The e-graph machinery: rule names, the attribute tags, block-size choice,
//! runner limits and the stop reason.

#![allow(clippy::unwrap_used)]

use dlrm_ir::{Act, Attr, Dim, Graph, Op, TensorType};
use dlrm_passes::egraph::extract::{MAX_BLOCK, MAX_WIDE_BLOCK, block_for, lanes};
use dlrm_passes::egraph::lang::{Tag, parse_attr};
use dlrm_passes::egraph::rules::{RuleConfig, names};
use dlrm_passes::egraph::{FuseOptions, Limits, fuse};

#[test]
fn rule_names_are_kebab_case_and_unique() {
    let cfg = RuleConfig {
        fuse_embedding: true,
        ..Default::default()
    };
    let mut all = names(&cfg);
    assert!(all.len() >= 17, "{all:?}");
    // The canon pass runs its theme with `recognise`: names unique there too.
    all.extend(
        dlrm_passes::egraph::rules::canon::rules(&cfg)
            .iter()
            .map(|r| r.name.to_string()),
    );
    for n in &all {
        assert!(
            n.chars().all(|c| c.is_ascii_lowercase() || c == '-') && !n.starts_with('-'),
            "{n}"
        );
    }
    let mut sorted = all.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), all.len());
    assert!(
        !names(&RuleConfig::default())
            .iter()
            .any(|n| n.contains("embedding"))
    );
}

#[test]
fn attribute_tags_round_trip() {
    for a in [
        Attr::Int(64),
        Attr::Float(0.2),
        Attr::Float(1e-7),
        Attr::Bool(true),
        Attr::Ident("relu".into()),
        Attr::Dim(Dim::batch()),
        Attr::List(vec![Dim::batch(), Dim::Fixed(3)]),
    ] {
        let t = Tag::new("k", &a);
        let back: Tag = t.to_string().parse().unwrap();
        assert_eq!(back, t);
        let parsed = back.attr();
        // A symbolic dimension reads back as an identifier (the op builder takes both).
        match (&a, &parsed) {
            (Attr::Dim(Dim::Sym(s)), Attr::Ident(i)) => assert_eq!(s, i),
            _ => assert_eq!(parsed, a),
        }
    }
    assert_eq!(parse_attr("sum"), Attr::Ident("sum".into()));
}

#[test]
fn block_sizes_depend_on_the_dimension_only() {
    let padded = |d: usize, b: usize| d.div_ceil(b) * b;
    for d in 1..600 {
        let b = block_for(d, None);
        assert!((1..=MAX_WIDE_BLOCK).contains(&b), "{d} -> {b}");
        assert!(d > MAX_BLOCK || b <= d, "{d} -> {b}");
        // A block wider than MAX_BLOCK only to pad less than blocks of 64
        // (to the next multiple of 32), or as one block of the whole
        // dimension computing fewer micro-kernel lanes than blocks of 64 or
        // of any divisor of it (at most as many).
        if b > MAX_BLOCK && b != d {
            assert!(b.is_multiple_of(32), "{d} -> {b}");
            assert_eq!(padded(d, b), padded(d, 32), "{d} -> {b}");
            assert!(padded(d, b) < padded(d, 64), "{d} -> {b}");
        }
        if b == d && d > MAX_BLOCK {
            assert!(d <= MAX_WIDE_BLOCK, "{d}");
            for n in (8..=MAX_BLOCK).filter(|n| d.is_multiple_of(*n)).chain([64]) {
                assert!(
                    lanes(d, d) <= lanes(d, n),
                    "{d}: lanes {} against {} in blocks of {n}",
                    lanes(d, d),
                    lanes(d, n)
                );
            }
        }
    }
    // Lanes: 32-lane panels, the last one 16 wide for at most 16 columns.
    assert_eq!(
        (
            lanes(100, 50),
            lanes(100, 100),
            lanes(479, 160),
            lanes(13, 13)
        ),
        (128, 112, 480, 16)
    );
    // dlrm-small's interaction width: one block of 100 (112 lanes), not two
    // of 50 (128).
    assert_eq!(block_for(100, None), 100);
    assert_eq!(block_for(160, None), 160);
    assert_eq!(block_for(13, None), 13);
    assert_eq!(block_for(512, None), 64);
    assert_eq!(block_for(1024, None), 64);
    // dlrm-mlperf's interaction width: 480 in 3 blocks, not 512 in 8.
    assert_eq!(block_for(479, None), 160);
    assert_eq!(block_for(1, None), 1);
    assert_eq!(block_for(100, Some(16)), 16);
    assert_eq!(block_for(8, Some(16)), 8);
}

fn mlp(layers: usize) -> Graph {
    let mut g = Graph::new("mlp");
    let mut x = g
        .add_input("x", TensorType::f32([Dim::batch(), Dim::Fixed(64)]))
        .unwrap();
    for i in 0..layers {
        let w = g
            .add_param(
                &format!("l{i}.w"),
                TensorType::f32([Dim::Fixed(64), Dim::Fixed(64)]),
            )
            .unwrap();
        let b = g
            .add_param(&format!("l{i}.b"), TensorType::f32([Dim::Fixed(64)]))
            .unwrap();
        x = g
            .add(
                Op::Linear { act: Act::None },
                &[x, w, b],
                &format!("l{i}.pre"),
            )
            .unwrap();
        x = g.add(Op::Relu, &[x], &format!("l{i}")).unwrap();
    }
    g.add_output(x);
    g
}

#[test]
fn runner_limits_are_enforced_and_reported() {
    let g = mlp(6);
    let (full, st) = fuse(&g, &FuseOptions::default()).unwrap();
    assert_eq!(st.stop_reason, "saturated");
    assert!(st.iterations >= 2 && st.nodes > 0 && st.classes > 0);
    assert!(st.rules_applied["fuse-linear-relu"] == 6, "{st:?}");
    assert_eq!(
        full.nodes()
            .iter()
            .filter(|n| n.op.mnemonic() == "brgemm")
            .count(),
        6
    );
    let one = FuseOptions {
        limits: Limits {
            iterations: 1,
            ..Limits::default()
        },
        ..Default::default()
    };
    let (g1, st) = fuse(&g, &one).unwrap();
    assert!(
        st.stop_reason.starts_with("iteration limit"),
        "{}",
        st.stop_reason
    );
    dlrm_ir::verify(&g1).unwrap();
    let tiny = FuseOptions {
        limits: Limits {
            nodes: 10,
            ..Limits::default()
        },
        ..Default::default()
    };
    let (g2, st) = fuse(&g, &tiny).unwrap();
    assert!(
        st.stop_reason.starts_with("node limit"),
        "{}",
        st.stop_reason
    );
    // Stopped early, the result is still a valid graph computing the same.
    dlrm_ir::verify(&g2).unwrap();
}
