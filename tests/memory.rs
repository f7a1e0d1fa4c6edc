//! Memory planning through the binaries: `dlrmc plan-shards` prints every rank's
//! memory account and refuses what does not fit (the MLPerf-Terabyte model, planned
//! from its description without materialising its ~100 GB of tables); `dlrm-run`
//! refuses a batch that cannot fit before allocating it, and reports its peak
//! resident memory; without the check, a step buffer the process cannot allocate is
//! a clean error, not an abort.

mod common;

use common::{
    DLRM_RUN, DLRMC, assert_contains_all, compile, example, fails, ok, s, stderr, tempdir,
};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A command's stdout and stderr, for what either may print.
fn printed(bin: &str, args: &[&str]) -> String {
    let out = ok(bin, args);
    String::from_utf8_lossy(&out.stdout).into_owned() + &stderr(&out)
}

/// The bytes of a plan's files.
fn plan_bytes(plan: &Path) -> u64 {
    std::fs::read_dir(plan)
        .expect("the plan")
        .map(|e| e.expect("entry").metadata().expect("metadata").len())
        .sum()
}

/// `examples/dlrm-mlperf-terabyte.json` (26 tables, 204,184,588 rows at dimension
/// 128: 104.5 GB of fp32 tables) compiled into `dir` — quickly, since a plan
/// describes its tables instead of storing them.
fn terabyte(dir: &Path) -> PathBuf {
    let plan = dir.join("terabyte.plan");
    compile(&example("dlrm-mlperf-terabyte.json"), &plan, &[]);
    let bytes = plan_bytes(&plan);
    assert!(bytes < 64 << 20, "the terabyte plan holds {bytes} bytes");
    plan
}

#[test]
fn terabyte_fits_64_ranks_and_is_refused_on_one() {
    let dir = tempdir();
    let model = terabyte(dir.path());
    let m = s(&model);
    let json = printed(DLRMC, &["plan-shards", m, "--ranks", "64", "--json"]);
    let v: Value = serde_json::from_str(&json).expect("plan-shards --json");
    let mem = v["memory"].as_array().expect("memory");
    assert_eq!(mem.len(), 64);
    let budget = v["options"]["mem_per_rank"].as_u64().expect("budget");
    let tables: u64 = mem
        .iter()
        .map(|a| a["table_bytes"].as_u64().expect("a number"))
        .sum();
    // Every table's bytes are on some rank, data-parallel ones on every rank.
    assert!(tables >= 5 * 40_000_000 * 128 * 4, "{tables}");
    for a in mem {
        let total = a["total"].as_u64().expect("a number");
        assert!(total > 0 && total <= budget, "{a}");
        let parts = [
            "table_bytes",
            "low_half_bytes",
            "optimizer_bytes",
            "dense_param_bytes",
            "activation_bytes",
            "gradient_bytes",
            "comm_bytes",
            "data_bytes",
        ];
        let sum: u64 = parts.iter().map(|p| a[p].as_u64().expect("a number")).sum();
        assert_eq!(sum, total, "{a}");
        assert_eq!(a["local_batch"], 32);
    }
    let text = printed(DLRMC, &["plan-shards", m, "--ranks", "64"]);
    assert!(
        text.contains("memory per rank (MiB, local batch 32)"),
        "{text}"
    );
    assert!(text.contains("of a 16.0 GiB budget"), "{text}");

    let err = fails(
        DLRMC,
        &["plan-shards", m, "--ranks", "1", "--mem-per-rank", "24GiB"],
    );
    assert_contains_all(
        &err,
        &[
            "not enough memory",
            "rank 0 of 1 needs 97.5 GiB",
            "budget of 24.0 GiB (25769803776 bytes, --mem-per-rank)",
            "table `emb.0`: 19.1 GiB (20480000000 bytes)",
            "5 ranks would fit",
            "Split-SGD-BF16",
        ],
    );
    assert!(
        !err.contains("plan-shards:"),
        "the planner pass's prefix: {err}"
    );
}

#[test]
fn huge_batch_is_refused_before_allocation_and_peak_memory_is_reported() {
    let dir = tempdir();
    let plan = tiny(dir.path());
    let p = s(&plan);
    let start = Instant::now();
    let err = fails(DLRM_RUN, &[p, "--batch-size", "1000000000", "--iters", "1"]);
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "took {:?}",
        start.elapsed()
    );
    assert_contains_all(
        &err,
        &[
            "not enough memory",
            "activations at a local batch of 1000000000",
            "this machine's available memory",
            // Thread ranks share this machine's memory: the advice is machines.
            "the model needs more machines",
            "--comm mpi",
            "a global batch of at most",
        ],
    );
    // Given a budget: that one.
    let err = fails(
        DLRM_RUN,
        &[
            p,
            "--batch-size",
            "1000000",
            "--iters",
            "1",
            "--mem-per-rank",
            "1MiB",
        ],
    );
    assert!(
        err.contains("budget of 1.00 MiB (1048576 bytes, --mem-per-rank)"),
        "{err}"
    );

    let metrics = dir.path().join("m.jsonl");
    let out = printed(
        DLRM_RUN,
        &[p, "--iters", "2", "--quiet", "--metrics", s(&metrics)],
    );
    assert!(out.contains("peak resident memory"), "{out}");
    let last = std::fs::read_to_string(&metrics).expect("metrics");
    let summary: Value =
        serde_json::from_str(last.lines().last().expect("a line")).expect("json line");
    assert!(
        summary["peak_rss_bytes"].as_u64().expect("a number") > 1 << 20,
        "{summary}"
    );
}

/// An embedding dimension of 1e9 (the terabyte model's, widened): a `[1e9, 256]`
/// bottom weight and a `[1024, 1e9 + 351]` top weight, 4 TB of MLPs, are above
/// `--describe-above` and described (blocked), so the plan compiles quickly and
/// small; `dlrm-run` refuses it with the memory account, not an abort.
#[test]
fn a_billion_wide_model_compiles_described_and_is_refused_by_the_account() {
    let dir = tempdir();
    let src = example("dlrm-mlperf-terabyte.json");
    let mut v: Value =
        serde_json::from_str(&std::fs::read_to_string(src).expect("read")).expect("json");
    v["embedding_dim"] = 1_000_000_000u64.into();
    v["bottom_mlp"] = "13-512-256-1000000000".into();
    let json = dir.path().join("wide.json");
    std::fs::write(&json, v.to_string()).expect("write");
    let plan = dir.path().join("wide.plan");
    let p = s(&plan);
    let start = Instant::now();
    compile(&json, &plan, &[]);
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "{:?}",
        start.elapsed()
    );
    let bytes = plan_bytes(&plan);
    assert!(bytes < 64 << 20, "the plan holds {bytes} bytes");
    let m: Value = serde_json::from_str(
        &std::fs::read_to_string(plan.join("manifest.json")).expect("manifest"),
    )
    .expect("json");
    let entry = |name: &str| {
        m["params"]
            .as_array()
            .expect("params")
            .iter()
            .find(|e| e["name"] == name)
            .cloned()
            .expect(name)
    };
    assert_eq!(entry("bot.2.w")["init"]["blocked"]["n"], 1_000_000_000u64);
    assert_eq!(entry("top.0.w")["init"]["blocked"]["n"], 1024);
    assert!(entry("bot.2.b")["init"].is_object());
    assert!(
        entry("bot.0.w")["init"].is_null(),
        "small weights are stored"
    );
    let err = fails(DLRM_RUN, &[p, "--iters", "1", "--mem-per-rank", "16GiB"]);
    assert!(err.contains("not enough memory"), "{err}");
}

/// `examples/dlrm-tiny.json` compiled into `dir`.
fn tiny(dir: &Path) -> PathBuf {
    let plan = dir.join("tiny.plan");
    compile(&example("dlrm-tiny.json"), &plan, &[]);
    plan
}

#[test]
fn an_unallocatable_step_buffer_is_an_error_not_an_abort() {
    let dir = tempdir();
    let plan = tiny(dir.path());
    let p = s(&plan);
    // 10^15 samples: every batch buffer asks for petabytes, more than the address
    // space, so the reservation fails at once without touching memory.
    for extra in [&[][..], &["--infer"], &["--ranks", "2"]] {
        let mut args = vec![
            p,
            "--batch-size",
            "1000000000000000",
            "--iters",
            "1",
            "--no-mem-check",
            "--quiet",
        ];
        args.extend_from_slice(extra);
        let start = Instant::now();
        let err = fails(DLRM_RUN, &args);
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "took {:?}",
            start.elapsed()
        );
        assert!(
            err.contains("needs") && err.contains(" bytes: "),
            "{extra:?}: {err}"
        );
        assert!(
            err.contains("rank 0") || err.contains("rank 1"),
            "{extra:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{extra:?}: {err}");
        assert!(!err.contains("memory allocation of"), "{extra:?}: {err}");
    }
}

/// `dlrm-run` places the tables in the budget it checks (not the planner's 16 GiB
/// default), and on the thread backend advises machines, not threads: ranks that
/// are threads of one process share its memory.
#[test]
fn dlrm_run_places_and_checks_one_budget_and_advises_machines() {
    let dir = tempdir();
    let model = terabyte(dir.path());
    let m = s(&model);
    // The check (one rank: no placement): 5 ranks of 24 GiB, one per machine.
    let err = fails(
        DLRM_RUN,
        &[m, "--iters", "1", "--mem-per-rank", "24GiB", "--quiet"],
    );
    assert_contains_all(
        &err,
        &[
            "not enough memory",
            "rank 0 of 1 needs 97.5 GiB",
            "budget of 24.0 GiB (25769803776 bytes, --mem-per-rank)",
            "the model needs more machines: 5 ranks with 24.0 GiB each would fit, one per machine",
            "mpirun -n 5 --host ... dlrm-run PLAN --comm mpi",
            "more --ranks here are threads sharing this machine's memory",
        ],
    );
    assert!(!err.contains("--ranks 5"), "{err}");
    // The placement (two thread ranks): in this machine's memory, not 16 GiB.
    let err = fails(DLRM_RUN, &[m, "--iters", "1", "--ranks", "2", "--quiet"]);
    assert_contains_all(
        &err,
        &[
            "26 tables do not fit 2 ranks",
            "the model needs more machines",
            "--comm mpi",
        ],
    );
    assert!(
        !err.contains("16.0 GiB"),
        "the planner's default budget: {err}"
    );
}
