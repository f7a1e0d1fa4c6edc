//! Adagrad and row-wise Adagrad end to end: dlrm-tiny (one table cut to 3 rows)
//! compiled with each optimizer learns (the loss falls), and 3 and 8 ranks, with
//! tables placed table-wise, row-wise (tables and accumulators split at the same
//! rows) and data-parallel (dense `adagrad` on an all-reduced gradient), train like
//! one rank: losses within 1e-5 relative, every parameter and accumulator within
//! 1e-4 relative (the stated tolerance of the SGD tests in `e2e.rs`: float
//! reassociation of the all-reduces only), differences below 1e-6 ignored. The unfused `-O0` graph trains on one
//! rank like the fused one and is refused by the partition with a clear error.

mod common;

use common::{O0, losses, max_rel, s, tempdir, trained_value};
use dlrm_ir::Tensor;
use dlrm_runtime::driver::{Report, run_with_params};
use dlrm_runtime::plan::Plan;
use dlrm_runtime::{RunOptions, RunSettings, ShardSettings, job_for};
use dlrmc::compile::{CompileOptions, compile};
use dlrmc::model::{Overrides, load_model};
use std::collections::HashMap;
use std::path::Path;

/// dlrm-tiny with a 3-row table, compiled with `optimizer`.
fn tiny3(dir: &Path, optimizer: &str, opts: &CompileOptions) -> Plan {
    let src = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/dlrm-tiny.json"),
    )
    .expect("read")
    .replace("[50, 30, 20]", "[50, 30, 3]");
    let path = dir.join("tiny3.json");
    std::fs::write(&path, src).expect("write");
    let o = Overrides {
        optimizer: Some(optimizer.to_string()),
        ..Overrides::default()
    };
    let model = load_model(&path, o).expect("model");
    compile(model, opts, &mut |_, _| {}).expect("compile")
}

/// Placements with row-wise and data-parallel tables on 3 and 8 ranks (as in
/// `e2e.rs`): a zero-latency network and 1 KiB of table rows per rank, plus their
/// accumulators, which the planner places with them (Adagrad's double an f32
/// table: 2 KiB; row-wise Adagrad's add 4 bytes to a 32-byte row: 1152 bytes), so
/// the placements are SGD's.
fn settings(plan: &Plan) -> ShardSettings {
    ShardSettings {
        mem_per_rank: match plan.training.optimizer.as_str() {
            "adagrad" => 2048,
            "rowwise_adagrad" => 1152,
            _ => 1024,
        },
        network: dlrm_passes::shard::Network {
            latency_us: 0.0,
            gbps: 100.0,
        },
        ..ShardSettings::default()
    }
}

type Params = Vec<HashMap<String, Tensor>>;

/// An error with its chain of sources.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(&format!(": {c}"));
        src = c.source();
    }
    s
}

fn run(plan: &Plan, ranks: usize, iters: u64) -> Result<(Report, Params), String> {
    let o = RunOptions {
        settings: RunSettings {
            ranks,
            log_every: 1,
            ..RunSettings::default()
        },
        iters,
        shards: settings(plan),
        ..RunOptions::default()
    };
    let job = job_for(plan.clone(), &o).map_err(|e| chain(&e))?;
    run_with_params(job, &mut |_| {}).map_err(|e| chain(&e))
}

fn mean(v: &[f32]) -> f32 {
    v.iter().sum::<f32>() / v.len() as f32
}

#[test]
fn adagrad_learns_and_ranks_train_like_one() {
    let dir = tempdir();
    for optimizer in ["adagrad", "rowwise_adagrad"] {
        let plan = tiny3(dir.path(), optimizer, &CompileOptions::default());
        let train = plan.train.as_ref().expect("train graph");
        let accs: Vec<&str> = train
            .params()
            .iter()
            .map(|&p| train.name_of(p))
            .filter(|n| n.ends_with(".acc"))
            .collect();
        // Three tables and eight MLP tensors, each with its accumulator.
        assert_eq!(accs.len(), 11, "{optimizer}: {accs:?}");
        let (one, p1) = run(&plan, 1, 40).expect("one rank");
        let l1 = losses(&one);
        assert!(
            mean(&l1[30..]) < 0.9 * mean(&l1[..10]),
            "{optimizer}: the loss does not fall: {l1:?}"
        );
        for ranks in [3, 8] {
            let (rep, pn) = run(&plan, ranks, 40).expect("ranks");
            let d = max_rel(&l1, &losses(&rep), 0.0);
            assert!(
                d <= 1e-5,
                "{optimizer}, {ranks} ranks: losses differ by {d} rel"
            );
            for (name, t1) in &p1[0] {
                // Differences below 1e-6 are ignored (1e-7 for SGD): Adagrad divides
                // each step by the root of its accumulator, so a small element's
                // reassociation noise is not scaled down with it.
                let d = max_rel(&t1.to_f32_vec(), &trained_value(&pn, name), 1e-6);
                assert!(
                    d <= 1e-4,
                    "{optimizer}, {ranks} ranks: {name} differs by {d} rel"
                );
            }
        }
    }
}

#[test]
fn unfused_adagrad_trains_on_one_rank_and_is_refused_by_the_partition() {
    let dir = tempdir();
    for optimizer in ["adagrad", "rowwise_adagrad"] {
        let fused = tiny3(dir.path(), optimizer, &CompileOptions::default());
        let plain = tiny3(dir.path(), optimizer, &O0);
        let (a, _) = run(&fused, 1, 10).expect("fused");
        let (b, _) = run(&plain, 1, 10).expect("-O0");
        let d = max_rel(&losses(&a), &losses(&b), 0.0);
        assert!(d <= 1e-5, "{optimizer}: -O0 and -O1 differ by {d} rel");
        let err = run(&plain, 3, 2).expect_err("partitioned -O0 adagrad");
        assert!(
            err.contains("sparse_adagrad") && err.contains("-O1"),
            "{err}"
        );
    }
}

#[test]
fn an_unknown_optimizer_is_refused() {
    // (bf16 storage with Adagrad trains as Split-Adagrad: `tests/split_adagrad.rs`.)
    let dir = tempdir();
    let src = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/dlrm-tiny.json"),
    )
    .expect("read");
    let path = dir.path().join("tiny.json");
    std::fs::write(&path, src).expect("write");
    let bad = Overrides {
        optimizer: Some("adam".into()),
        ..Overrides::default()
    };
    let err = load_model(&path, bad).expect_err("unknown optimizer");
    assert!(chain(&err).contains("rowwise_adagrad"), "{err}");
}

#[test]
fn dlrmc_compile_takes_the_optimizer_flag() {
    let dir = tempdir();
    let plan = dir.path().join("tiny.plan");
    let model = common::example("dlrm-tiny.json");
    common::compile(&model, &plan, &["--optimizer", "rowwise_adagrad"]);
    let p = dlrm_runtime::plan::read_plan(&plan).expect("plan");
    assert_eq!(p.training.optimizer, "rowwise_adagrad");
    let train = p.train.expect("train graph");
    let fused = train
        .nodes()
        .iter()
        .filter(|n| {
            matches!(
                n.op,
                dlrm_ir::Op::EmbeddingUpdateAdagrad { rowwise: true, .. }
            )
        })
        .count();
    assert_eq!(fused, 3, "one fused row-wise update per table");
    let bad_plan = dir.path().join("bad.plan");
    let bad = common::run(
        common::DLRMC,
        &[
            "compile",
            "-q",
            "--optimizer",
            "adam",
            "-o",
            s(&bad_plan),
            s(&model),
        ],
    );
    assert!(!bad.status.success());
    let err = common::stderr(&bad);
    assert!(
        err.contains("--optimizer must be sgd, adagrad or rowwise_adagrad"),
        "{err}"
    );
}
