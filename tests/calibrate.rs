//! `dlrmc calibrate` measures this machine's rates and the sharding planner uses
//! them: read back from `--calibration FILE` or from the default file
//! (`DLRMC_CALIBRATION`), overridden by `--machine`/`--network`, refused when the
//! file is not a calibration. Under MPI the exchanges are between processes
//! (tests/mpi.rs).

mod common;

use common::{DLRMC, example, fails, ok, run_env, s, stderr, tempdir};
use serde_json::Value;

/// `plan-shards` of dlrm-small on 2 ranks, with `extra` flags and `env`.
fn plan_shards(extra: &[&str], env: &[(&str, &str)]) -> (String, Value) {
    let m = example("dlrm-small.json");
    let mut args = vec!["plan-shards", s(&m), "--ranks", "2"];
    args.extend_from_slice(extra);
    let text = run_env(DLRMC, &args, env);
    assert!(text.status.success(), "{}", stderr(&text));
    args.push("--json");
    let json = run_env(DLRMC, &args, env);
    assert!(json.status.success(), "{}", stderr(&json));
    let v = serde_json::from_slice(&json.stdout).expect("plan-shards --json");
    (String::from_utf8_lossy(&text.stdout).into_owned(), v)
}

#[test]
fn calibrate_measures_rates_that_the_planner_reads() {
    let dir = tempdir();
    let file = dir.path().join("sub").join("cal.json");
    let out = ok(
        DLRMC,
        &[
            "calibrate",
            "--quick",
            "-o",
            s(&file),
            "--ranks",
            "2",
            "--json",
        ],
    );
    let c: Value = serde_json::from_slice(&out.stdout).expect("--json prints the calibration");
    let on_disk: Value =
        serde_json::from_slice(&std::fs::read(&file).expect("written")).expect("the file is JSON");
    assert_eq!(c, on_disk);
    assert_eq!(c["format"], "dlrmc-calibration");
    assert_eq!(c["comm"], "threads");
    assert_eq!(c["ranks"], 2);
    let rate = |a: &str, b: &str| c[a][b].as_f64().expect("a number");
    let (gflops, mem, lat, gbps) = (
        rate("machine", "gflops"),
        rate("machine", "mem_gbps"),
        rate("network", "latency_us"),
        rate("network", "gbps"),
    );
    // Plausible for any CPU this runs on: above what a scalar loop gives, below
    // what a core can reach; a measurement, not a constant.
    assert!((0.5..5000.0).contains(&gflops), "{gflops} GFLOP/s");
    assert!((0.05..1000.0).contains(&mem), "{mem} GB/s");
    assert!((0.0..1e5).contains(&lat), "{lat} µs");
    assert!(gbps > 0.01, "{gbps} GB/s");
    assert!(stderr(&out).contains(&format!("{}", file.display())));

    // The planner: from the file given, from the default file, or the flags.
    let (text, v) = plan_shards(&["--calibration", s(&file)], &[]);
    assert!(text.contains("measured by `dlrmc calibrate`"), "{text}");
    assert_eq!(v["options"]["machine"], c["machine"]);
    assert_eq!(v["options"]["network"], c["network"]);
    assert_eq!(v["rates"], "calibrated");
    let (_, by_env) = plan_shards(&[], &[("DLRMC_CALIBRATION", s(&file))]);
    assert_eq!(by_env["options"]["machine"], c["machine"]);
    assert_eq!(by_env["rates"], "calibrated");
    let (text, flags) = plan_shards(&["--calibration", s(&file), "--machine", "30,5"], &[]);
    assert!(text.contains("from --machine/--network"), "{text}");
    assert_eq!(flags["options"]["machine"]["gflops"], 30.0);
    assert_eq!(
        flags["options"]["network"], c["network"],
        "the other rate is measured"
    );
    let (text, none) = plan_shards(&[], &[]);
    assert!(text.contains("built-in guesses"), "{text}");
    assert_eq!(none["rates"], "default");
    assert_eq!(none["options"]["machine"]["gflops"], 20.0);
}

/// The error of `plan-shards` of dlrm-small with `--calibration file`.
fn refused(file: &std::path::Path) -> String {
    let m = example("dlrm-small.json");
    fails(
        DLRMC,
        &[
            "plan-shards",
            s(&m),
            "--ranks",
            "2",
            "--calibration",
            s(file),
        ],
    )
}

#[test]
fn a_bad_calibration_file_is_an_error_naming_it() {
    let dir = tempdir();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"format\": \"something-else\"}").expect("write");
    let err = refused(&bad);
    assert!(
        err.contains("calibration") && err.contains("bad.json"),
        "{err}"
    );
    let missing = dir.path().join("missing.json");
    let err = refused(&missing);
    assert!(err.contains("missing.json"), "{err}");
    // A rate that is not positive (hand-edited) is refused too.
    let zero = dir.path().join("zero.json");
    std::fs::write(
        &zero,
        r#"{"format":"dlrmc-calibration","cpu":"x","threads":1,"ranks":2,"comm":"threads",
            "machine":{"gflops":0.0,"mem_gbps":4.0},"network":{"latency_us":2.0,"gbps":12.5},
            "measured_at":0}"#,
    )
    .expect("write");
    let err = refused(&zero);
    assert!(err.contains("not a positive number"), "{err}");
    let err = fails(DLRMC, &["calibrate", "--ranks", "1", "-o", s(&zero)]);
    assert!(err.contains("--ranks must be at least 2"), "{err}");
}
