//! Criteo TSV end to end: generated Criteo-format text, converted to `.ds` by `dlrmc
//! data convert`, trains with exactly the losses (bit for bit) of `dlrm-run --data`
//! given the TSV itself (converted on the fly with the same defaults).

mod common;

use common::{DLRM_RUN, DLRMC, compile, ok, s, tempdir};
use std::path::{Path, PathBuf};

/// A small Criteo-shaped model (13 dense, 26 tables whose rows the data sets).
fn write_model(dir: &Path) -> PathBuf {
    let path = dir.join("model.json");
    let src = serde_json::json!({
        "name": "criteo-small",
        "dense_features": 13,
        "embedding_dim": 8,
        "table_rows": vec![1; 26],
        "pooling": 1,
        "pooling_mode": "sum",
        "bottom_mlp": "13-32-8",
        "top_mlp": "32-1",
        "interaction": "dot",
        "interaction_itself": false,
        "loss": "bce",
        "batch_size": 128,
        "optimizer": "sgd",
        "learning_rate": 0.1,
        "seed": 1
    });
    std::fs::write(&path, src.to_string()).expect("write model");
    path
}

/// `(iter, loss bits)` of every training line of a metrics file.
fn losses(metrics: &Path) -> Vec<(u64, u32)> {
    std::fs::read_to_string(metrics)
        .expect("metrics")
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json line"))
        .filter(|v| v.get("split").is_none())
        .filter_map(|v| {
            let loss = v.get("loss")?.as_f64()? as f32;
            Some((v.get("iter")?.as_u64()?, loss.to_bits()))
        })
        .collect()
}

#[test]
fn training_from_tsv_and_from_its_dataset_gives_the_same_losses_bit_for_bit() {
    let dir = tempdir();
    let tsv = dir.path().join("train.txt");
    let ds = dir.path().join("train.ds");
    let plan = dir.path().join("plan");
    ok(
        DLRMC,
        &[
            "data",
            "generate",
            "--rows",
            "7000",
            "--seed",
            "5",
            "-q",
            "-o",
            s(&tsv),
        ],
    );
    ok(DLRMC, &["data", "convert", "-q", s(&tsv), "-o", s(&ds)]);
    let model = write_model(dir.path());
    compile(&model, &plan, &["--data", s(&ds)]);
    let train = |data: &Path, metrics: &Path| {
        ok(
            DLRM_RUN,
            &[
                s(&plan),
                "--data",
                s(data),
                "--iters",
                "24",
                "--log-every",
                "1",
                "--metrics",
                s(metrics),
                "--quiet",
            ],
        )
    };
    let (a, b) = (dir.path().join("ds.jsonl"), dir.path().join("tsv.jsonl"));
    train(&ds, &a);
    train(&tsv, &b);
    let (la, lb) = (losses(&a), losses(&b));
    assert_eq!(la.len(), 24, "{la:?}");
    assert_eq!(la, lb, "the TSV run's losses differ from the dataset's");
    // The losses are real training losses, not a constant.
    assert!(la.windows(2).any(|w| w[0].1 != w[1].1));
}
