//! Split-Adagrad end to end (issue 43): `--precision bf16` with Adagrad trains
//! bf16 MLP weights with `split_adagrad` and bf16 tables with
//! `split_embedding_update_adagrad` (the f32 master as two bf16 halves, f32
//! accumulators).
//!
//! - dlrm-tiny (one table cut to 3 rows, as `tests/adagrad.rs`) with Adagrad and
//!   row-wise Adagrad learns, and 3 and 8 ranks with tables placed table-wise,
//!   row-wise (both halves and the accumulator split at the same rows) and
//!   data-parallel (dense `split_adagrad` on an all-reduced gradient) train like
//!   one rank;
//! - the JIT backend (JIT GEMMs, the reference Split-Adagrad kernels) trains like
//!   the reference backend;
//! - DLRM-DCNv2 (`examples/dlrm-dcnv2-tiny.json`, its own Adagrad) compiles with
//!   `--precision bf16` to the split updates and trains at 1 and 2 ranks alike
//!   with a falling loss.
//!
//! Stated tolerance: that of the other bf16 multi-rank and backend tests
//! (`tests/e2e.rs`): losses within 1e-3 relative, trained parameters within 1e-2
//! relative (bf16 storage; the `.lo` halves, raw low bits, compared through their
//! masters' high halves).

mod common;

use common::{DLRMC, example, losses, max_rel, ok, run_metrics, s, tempdir, trained_value};
use dlrm_ir::Tensor;
use dlrm_passes::ShardKind;
use dlrm_passes::pipeline::Precision;
use dlrm_runtime::driver::{Report, run_with_params};
use dlrm_runtime::plan::Plan;
use dlrm_runtime::{Backend, RunOptions, RunSettings, ShardSettings, job_for};
use dlrmc::compile::{CompileOptions, compile};
use dlrmc::model::{Overrides, load_model};
use std::collections::HashMap;
use std::path::Path;

/// dlrm-tiny with a 3-row table, bf16, compiled with `optimizer`.
fn tiny3(dir: &Path, optimizer: &str) -> Plan {
    let src = std::fs::read_to_string(example("dlrm-tiny.json"))
        .expect("read")
        .replace("[50, 30, 20]", "[50, 30, 3]");
    let path = dir.join("tiny3.json");
    std::fs::write(&path, src).expect("write");
    let o = Overrides {
        optimizer: Some(optimizer.to_string()),
        ..Overrides::default()
    };
    let model = load_model(&path, o).expect("model");
    let opts = CompileOptions {
        precision: Precision::Bf16,
        ..CompileOptions::default()
    };
    compile(model, &opts, &mut |_, _| {}).expect("compile")
}

/// The placements of `tests/adagrad.rs` (a bf16 table with its low half is as
/// large as an f32 one): row-wise and data-parallel tables on 3 and 8 ranks.
fn shards(optimizer: &str) -> ShardSettings {
    ShardSettings {
        mem_per_rank: if optimizer == "adagrad" { 2048 } else { 1152 },
        network: dlrm_passes::shard::Network {
            latency_us: 0.0,
            gbps: 100.0,
        },
        ..ShardSettings::default()
    }
}

type Params = Vec<HashMap<String, Tensor>>;

fn run(plan: &Plan, optimizer: &str, ranks: usize, backend: Backend) -> (Report, Params) {
    let o = RunOptions {
        settings: RunSettings {
            ranks,
            log_every: 1,
            backend,
            ..RunSettings::default()
        },
        iters: 40,
        shards: shards(optimizer),
        ..RunOptions::default()
    };
    run_with_params(job_for(plan.clone(), &o).expect("job"), &mut |_| {}).expect("run")
}

fn mean(v: &[f32]) -> f32 {
    v.iter().sum::<f32>() / v.len() as f32
}

/// Every trained parameter but the low halves within 1e-2 relative.
fn params_agree(want: &Params, got: &Params, what: &str) {
    for (name, t) in want[0].iter().filter(|(n, _)| !n.ends_with(".lo")) {
        let d = max_rel(&t.to_f32_vec(), &trained_value(got, name), 1e-3);
        assert!(d <= 1e-2, "{what}: {name} differs by {d} rel");
    }
}

#[test]
fn bf16_adagrad_learns_and_ranks_train_like_one() {
    let dir = tempdir();
    for optimizer in ["adagrad", "rowwise_adagrad"] {
        let plan = tiny3(dir.path(), optimizer);
        let train = plan.train.as_ref().expect("train graph");
        let count = |m: &str| train.nodes().iter().filter(|n| n.op.is_module(m)).count();
        assert_eq!(count("split_embedding_update_adagrad"), 3, "{optimizer}");
        assert_eq!(count("split_adagrad"), 4, "{optimizer}: the MLP weights");
        let (one, p1) = run(&plan, optimizer, 1, Backend::Jit);
        let l1 = losses(&one);
        assert!(
            mean(&l1[30..]) < 0.9 * mean(&l1[..10]),
            "{optimizer}: the loss does not fall: {l1:?}"
        );
        let mut placed = Vec::new();
        for ranks in [3, 8] {
            let sp = dlrm_runtime::launch::shard::shard_plan(&plan, ranks, 24, &shards(optimizer))
                .expect("shard plan");
            let kinds: Vec<ShardKind> = sp.tables.iter().map(|t| t.kind).collect();
            placed.extend(kinds.iter().copied());
            let (rep, pn) = run(&plan, optimizer, ranks, Backend::Jit);
            let d = max_rel(&l1, &losses(&rep), 0.0);
            let what = format!("{optimizer}, {ranks} ranks ({kinds:?})");
            assert!(d <= 1e-3, "{what}: losses differ by {d} rel");
            params_agree(&p1, &pn, &what);
        }
        for kind in [ShardKind::RowWise, ShardKind::DataParallel] {
            assert!(
                placed.contains(&kind),
                "{optimizer}: no {kind:?} table: {placed:?}"
            );
        }
    }
}

#[test]
fn bf16_adagrad_trains_alike_on_both_backends() {
    let dir = tempdir();
    let plan = tiny3(dir.path(), "rowwise_adagrad");
    let (jit, pj) = run(&plan, "rowwise_adagrad", 1, Backend::Jit);
    let (reference, pr) = run(&plan, "rowwise_adagrad", 1, Backend::Reference);
    let d = max_rel(&losses(&jit), &losses(&reference), 0.0);
    assert!(d <= 1e-3, "jit vs reference losses differ by {d} rel");
    params_agree(&pr, &pj, "jit vs reference");
}

#[test]
fn bf16_dcnv2_trains_with_its_adagrad_at_1_and_2_ranks() {
    let dir = tempdir();
    let plan = dir.path().join("dcn16.plan");
    let model = example("dlrm-dcnv2-tiny.json");
    let args = [
        "compile",
        s(&model),
        "-o",
        s(&plan),
        "-q",
        "--precision",
        "bf16",
        "--dump-ir",
        "dce",
    ];
    let dump = String::from_utf8(ok(DLRMC, &args).stdout).expect("utf-8");
    for want in [
        "= split_adagrad %cross.0.v, %cross.0.v.lo, %cross.0.v.acc,",
        "= split_embedding_update_adagrad %emb.0, %emb.0.lo, %emb.0.acc,",
        "rowwise=true, lo=0, rows=50}",
    ] {
        assert!(dump.contains(want), "no `{want}` in the dump: {dump}");
    }
    let run_args = ["--iters", "120", "--log-every", "10", "--pooling", "3,1,2"];
    let (one, auc1) = run_metrics(&plan, 1, &run_args);
    let (two, auc2) = run_metrics(&plan, 2, &run_args);
    let d = max_rel(&one, &two, 0.0);
    assert!(
        d <= 1e-3,
        "losses at 2 ranks differ by {d} rel: {one:?} vs {two:?}"
    );
    assert!((auc1 - auc2).abs() <= 1e-3, "auc {auc1} vs {auc2}");
    let (head, tail) = (mean(&one[..3]), mean(&one[one.len() - 3..]));
    assert!(tail < 0.8 * head, "the loss does not fall: {one:?}");
}
