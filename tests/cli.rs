//! The binaries as a user runs them: exit status, what they print and write, and
//! that bad input is a clear error that damages nothing already written.

mod common;

use common::{DLRM_RUN, DLRMC, compile, example, fails_silently as fails, ok, run, s, tempdir};
use dlrm_ir::text;
use dlrm_passes::pipeline::{self, PipelineOptions};
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn compile_tiny(dir: &Path, extra: &[&str]) -> PathBuf {
    let plan = dir.join("tiny.plan");
    compile(&example("dlrm-tiny.json"), &plan, extra);
    plan
}

/// The dump headers the pipelines produce for `graph` (`infer` or `train`).
fn stages(graph: &str, optimize: bool) -> Vec<String> {
    let train = (graph == "train").then_some(dlrm_passes::TrainConfig {
        loss: dlrm_passes::LossKind::Bce,
        lr: 0.1,
        optimizer: Default::default(),
    });
    let opts = if optimize {
        PipelineOptions::optimized(train)
    } else {
        PipelineOptions {
            train,
            ..PipelineOptions::default()
        }
    };
    std::iter::once("input")
        .chain(pipeline::pass_ids_for(&opts))
        .map(|p| format!("{graph}: after {p}"))
        .collect()
}

/// `dlrm-run PLAN --infer --inputs INPUTS --outputs OUT`: serves the named inputs
/// of an `.npz` and writes the outputs to another.
fn serve_npz(plan: &Path, inputs: &Path, out: &Path) {
    let args = [
        s(plan),
        "--infer",
        "--inputs",
        s(inputs),
        "--outputs",
        s(out),
        "-q",
    ];
    ok(DLRM_RUN, &args);
}

#[test]
fn inspect_json_counts_ops_and_params() {
    let dir = tempdir();
    let plan = compile_tiny(dir.path(), &["-O0"]);
    let out = ok(DLRMC, &["inspect", s(&plan), "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");

    // Expected counts from the description itself.
    let spec: Value =
        serde_json::from_str(&fs::read_to_string(example("dlrm-tiny.json")).expect("read"))
            .expect("spec");
    let dim = spec["embedding_dim"].as_u64().expect("dim");
    let rows: Vec<u64> = spec["table_rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r.as_u64().expect("row"))
        .collect();
    let widths = |k: &str| -> Vec<u64> {
        match &spec[k] {
            Value::String(s) => s.split('-').map(|w| w.parse().expect("width")).collect(),
            Value::Array(a) => a.iter().map(|w| w.as_u64().expect("width")).collect(),
            other => panic!("{k}: {other}"),
        }
    };
    let bottom = widths("bottom_mlp");
    let f = rows.len() as u64 + 1;
    let mut top = vec![dim + f * (f - 1) / 2];
    top.extend(widths("top_mlp"));
    let mlp = |w: &[u64]| w.windows(2).map(|p| p[0] * p[1] + p[1]).sum::<u64>();
    let expected = rows.iter().map(|r| r * dim).sum::<u64>() + mlp(&bottom) + mlp(&top);
    assert_eq!(v["params"]["f32"].as_u64(), Some(expected), "{v}");

    let layers = (bottom.len() - 1 + top.len() - 1) as u64;
    let ops = &v["ops"];
    assert_eq!(ops["linear"].as_u64(), Some(layers));
    assert_eq!(ops["linear_dw"].as_u64(), Some(layers));
    assert_eq!(ops["embedding_bag"].as_u64(), Some(rows.len() as u64));
    assert_eq!(ops["sparse_sgd"].as_u64(), Some(rows.len() as u64));
    assert_eq!(ops["sgd"].as_u64(), Some(2 * layers));
    assert_eq!(v["graphs"]["infer"]["ops"]["linear"].as_u64(), Some(layers));
    assert!(v["graphs"]["infer"]["ops"].get("sgd").is_none());
    assert!(v["flops_per_sample"].as_f64().expect("flops") > 0.0);

    let human = String::from_utf8(ok(DLRMC, &["inspect", s(&plan)]).stdout).expect("utf8");
    assert!(
        human.contains("train graph:") && human.contains("embedding_bag"),
        "{human}"
    );

    // Optimised (the default): the same parameters, MLP layers as blocked GEMMs.
    let plan = compile_tiny(dir.path(), &[]);
    let out = ok(DLRMC, &["inspect", s(&plan), "--json"]);
    let o: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(o["params"]["f32"].as_u64(), Some(expected), "{o}");
    let count = |k: &str| o["ops"][k].as_u64().unwrap_or(0);
    assert!(count("brgemm") >= 3, "{o}");
    assert_eq!(count("brgemm") + count("linear"), layers);
    assert_eq!(count("relu") + count("relu_grad") + count("bce"), 0, "{o}");
    assert_eq!(count("embedding_update"), rows.len() as u64);
    let fuse = &o["pass_log"]["train"]["passes"]
        .as_array()
        .expect("passes")
        .iter()
        .find(|p| p["id"] == "fuse")
        .expect("fuse pass logged")["egraph"];
    assert!(
        fuse["stop_reason"].is_string() && fuse["nodes"].as_u64() > Some(0),
        "{fuse}"
    );
}

#[test]
fn optimised_small_model_is_fused_and_bf16_stores_bf16() {
    let dir = tempdir();
    let plan = dir.path().join("small.plan");
    let model = example("dlrm-small.json");
    for precision in ["fp32", "bf16"] {
        let args = [
            "compile",
            s(&model),
            "-o",
            s(&plan),
            "-q",
            "--precision",
            precision,
        ];
        ok(DLRMC, &args);
        let out = ok(DLRMC, &["inspect", s(&plan), "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).expect("json");
        let ops = v["ops"].as_object().expect("ops");
        assert!(ops["brgemm"].as_u64() >= Some(5), "{precision}: {v}");
        for unfused in [
            "linear",
            "relu",
            "relu_grad",
            "linear_dx",
            "linear_dw",
            "linear_db",
        ] {
            assert!(
                !ops.contains_key(unfused),
                "{precision}: `{unfused}` left: {v}"
            );
        }
        let params = &v["params"];
        let tables = 8 * 100_000 * 64;
        match precision {
            "fp32" => assert!(params.get("bf16").is_none(), "{v}"),
            _ => {
                // Weights and tables bf16 (plus their Split-SGD low halves); biases f32.
                let bf16 = params["bf16"].as_u64().expect("bf16 params");
                assert!(bf16 >= 2 * tables, "{v}");
                assert!(params["f32"].as_u64().expect("f32 biases") < 2_000, "{v}");
            }
        }
    }
}

#[test]
fn dump_ir_prints_every_stage_in_a_form_that_parses_back() {
    let dir = tempdir();
    let plan = dir.path().join("p");
    let out = ok(
        DLRMC,
        &[
            "compile",
            s(&example("dlrm-tiny.json")),
            "-o",
            s(&plan),
            "--dump-ir",
            "all",
            "--ranks",
            "3",
            "-q",
        ],
    );
    let dump = String::from_utf8(out.stdout).expect("utf8");
    let sections: Vec<&str> = dump.split("; ---- ").skip(1).collect();
    let headers: Vec<&str> = sections
        .iter()
        .map(|s| s.lines().next().expect("header"))
        .collect();
    let mut want = stages("infer", true);
    want.extend(stages("train", true));
    for g in ["infer", "train"] {
        for stage in std::iter::once("partition").chain(pipeline::RANK_PASSES.iter().copied()) {
            want.extend((0..3).map(|r| format!("{g}: after {stage} (rank {r} of 3)")));
        }
    }
    assert_eq!(headers, want);
    for sec in &sections {
        let body = sec.split_once('\n').expect("body").1;
        let g = text::parse(body).unwrap_or_else(|e| panic!("{e}\n{body}"));
        assert_eq!(text::print(&g).trim_end(), body.trim_end());
    }
    let after = |h: &str| sections[headers.iter().position(|x| *x == h).expect(h)];
    assert!(after("train: after autodiff").contains("sparse_sgd"));
    assert!(after("train: after fuse").contains("brgemm"));
    let rank1 = after("train: after partition (rank 1 of 3)");
    assert!(rank1.contains("all_to_all") && rank1.contains("all_reduce"));

    let only = ok(
        DLRMC,
        &[
            "compile",
            s(&example("dlrm-tiny.json")),
            "-o",
            s(&plan),
            "--dump-ir",
            "autodiff",
        ],
    );
    let only = String::from_utf8(only.stdout).expect("utf8");
    assert_eq!(only.matches("; ---- ").count(), 1);
    assert!(only.starts_with("; ---- train: after autodiff\n"));

    // The per-rank passes and the dgrad-mask fusion are stages of their own.
    let ranks = ok(
        DLRMC,
        &[
            "compile",
            s(&example("dlrm-tiny.json")),
            "-o",
            s(&plan),
            "--dump-ir",
            "fuse-dgrad-mask,bucket,schedule",
            "--ranks",
            "2",
            "-q",
        ],
    );
    let ranks = String::from_utf8(ranks.stdout).expect("utf8");
    let headers: Vec<&str> = ranks
        .lines()
        .filter_map(|l| l.strip_prefix("; ---- "))
        .collect();
    let mut want = vec![
        "infer: after fuse-dgrad-mask".to_string(),
        "train: after fuse-dgrad-mask".to_string(),
    ];
    for g in ["infer", "train"] {
        for stage in ["bucket", "schedule"] {
            want.extend((0..2).map(|r| format!("{g}: after {stage} (rank {r} of 2)")));
        }
    }
    assert_eq!(headers, want);
    let scheduled = ranks
        .split("; ---- train: after schedule (rank 0 of 2)\n")
        .nth(1)
        .expect("schedule section");
    assert!(scheduled.contains("all_reduce") && scheduled.contains("all_to_all"));

    let err = fails(
        DLRMC,
        &[
            "compile",
            s(&example("dlrm-tiny.json")),
            "-o",
            s(&plan),
            "--dump-ir",
            "fusion",
        ],
    );
    assert!(err.contains("fusion") && err.contains("autodiff"), "{err}");
}

#[test]
fn dot_output_is_graphviz() {
    let dir = tempdir();
    let dot = dir.path().join("g.dot");
    ok(
        DLRMC,
        &[
            "compile",
            s(&example("dlrm-tiny.json")),
            "-o",
            s(&dir.path().join("p")),
            "--dot",
            s(&dot),
            "-q",
        ],
    );
    let g = fs::read_to_string(&dot).expect("dot file");
    assert!(g.starts_with("digraph"), "{g}");
    assert!(g.contains("brgemm") && g.trim_end().ends_with('}'), "{g}");
}

#[test]
fn dlrm_run_trains_and_writes_metrics() {
    let dir = tempdir();
    let plan = compile_tiny(dir.path(), &[]);
    let metrics = dir.path().join("m.jsonl");
    let out = ok(
        DLRM_RUN,
        &[
            s(&plan),
            "--ranks",
            "2",
            "--iters",
            "60",
            "--log-every",
            "20",
            "--metrics",
            s(&metrics),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().expect("summary");
    assert!(
        last.starts_with("trained `dlrm-tiny`: 60 steps on 2 ranks") && last.contains("AUC"),
        "{stderr}"
    );
    let lines: Vec<Value> = fs::read_to_string(&metrics)
        .expect("metrics")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(lines.len(), 4, "3 step lines and a summary");
    let iters: Vec<u64> = lines[..3]
        .iter()
        .map(|l| l["iter"].as_u64().expect("iter"))
        .collect();
    assert_eq!(iters, [20, 40, 60]);
    for l in &lines[..3] {
        assert!(l["loss"].as_f64().expect("loss").is_finite());
        assert!(l["samples_per_s"].as_f64().expect("samples/s") > 0.0);
    }
    let auc = lines[3]["auc"].as_f64().expect("auc");
    assert!((0.5..=1.0).contains(&auc), "{auc}");
    assert!(lines[3]["accuracy"].as_f64().is_some());
    // The plan's learning rate (dlrm-tiny: 0.2) on every step line.
    assert!(
        lines[..3]
            .iter()
            .all(|l| l["lr"].as_f64().map(|v| v as f32) == Some(0.2))
    );

    // A schedule under the reference's flag names: LRPolicyScheduler(4, 6, 2) at
    // --lr 0.5 is 0.125, 0.25, 0.375, 0.375, 0.375, 0.5, 0.125, then 0.125.
    let out = ok(
        DLRM_RUN,
        &[
            s(&plan),
            "--iters",
            "8",
            "--log-every",
            "1",
            "--lr",
            "0.5",
            "--lr-num-warmup-steps",
            "4",
            "--lr-decay-start-step",
            "6",
            "--lr-num-decay-steps",
            "2",
            "--metrics",
            s(&metrics),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("lr 0.375"), "{stderr}");
    let rates: Vec<f64> = fs::read_to_string(&metrics)
        .expect("metrics")
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).expect("json")["lr"].as_f64())
        .collect();
    assert_eq!(rates, [0.125, 0.25, 0.375, 0.375, 0.375, 0.5, 0.125, 0.125]);

    let out = ok(
        DLRM_RUN,
        &[s(&plan), "--infer", "--iters", "3", "--json", "-q"],
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("report json");
    assert_eq!(report["mode"], "infer");
    assert!(report["final_loss"].is_null());
}

#[test]
fn bad_models_are_clear_errors_and_leave_the_plan_alone() {
    let dir = tempdir();
    let plan = compile_tiny(dir.path(), &[]);
    let manifest = fs::read(plan.join("manifest.json")).expect("manifest");
    let weights = fs::read(plan.join("weights.safetensors")).expect("weights");

    let good: Value =
        serde_json::from_str(&fs::read_to_string(example("dlrm-tiny.json")).expect("read"))
            .expect("json");
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        fs::write(&p, text).expect("write model");
        p
    };
    let with = |k: &str, v: Value| {
        let mut m = good.clone();
        m[k] = v;
        m.to_string()
    };
    let cases = [
        (
            write("malformed.json", "{\"name\": \"x\",,}"),
            "malformed.json",
        ),
        (
            write("unknown.json", &with("embeding_dim", Value::from(8))),
            "embeding_dim",
        ),
        (
            write("shapes.json", &with("bottom_mlp", Value::from("4-16-7"))),
            "bottom_mlp",
        ),
        (
            write(
                "zero.json",
                &with("table_rows", serde_json::json!([50, 0, 20])),
            ),
            "table_rows",
        ),
        (write("model.txt", "{}"), "unknown model format"),
    ];
    for (model, expect) in &cases {
        let err = fails(DLRMC, &["compile", s(model), "-o", s(&plan), "-q"]);
        assert!(err.starts_with("dlrmc: error: "), "{err}");
        assert!(err.contains(expect), "{model:?}: {err}");
        assert_eq!(
            fs::read(plan.join("manifest.json")).expect("manifest"),
            manifest
        );
        assert_eq!(
            fs::read(plan.join("weights.safetensors")).expect("w"),
            weights
        );
    }
    let missing = dir.path().join("nope.json");
    let err = fails(DLRMC, &["compile", s(&missing), "-o", s(&plan)]);
    assert!(err.contains("nope.json"), "{err}");
}

#[test]
fn bad_runs_are_clear_errors() {
    let dir = tempdir();
    let plan = compile_tiny(dir.path(), &[]);

    let err = fails(DLRM_RUN, &[s(&plan), "--ranks", "0"]);
    assert!(err.contains("--ranks must be at least 1"), "{err}");
    let err = fails(DLRM_RUN, &[s(&plan), "--ranks", "100"]);
    assert!(err.contains("more than the global batch"), "{err}");
    let err = fails(DLRM_RUN, &[s(&plan), "--threads", "0"]);
    assert!(err.contains("--threads"), "{err}");
    // Learning rates: negative or NaN, a decay before the warmup ends, two kinds
    // of schedule at once.
    for (args, expect) in [
        (&["--lr=-0.1"][..], "learning rate"),
        (&["--lr", "NaN"][..], "learning rate"),
        (
            &["--lr-warmup-steps", "10", "--lr-decay-start", "5"][..],
            "warmup",
        ),
        (
            &["--lr-step-size", "3", "--lr-warmup-steps", "2"][..],
            "cannot be used",
        ),
        (&["--lr-gamma", "0.5"][..], "--lr-step-size"),
    ] {
        let out = run(DLRM_RUN, &[&[s(&plan), "--iters", "2"][..], args].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(expect),
            "{args:?}: {err}"
        );
    }
    // An unknown micro-kernel is a usage error listing the choices.
    let out = run(DLRM_RUN, &[s(&plan), "--kernels", "fastest"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("avx512bf16"), "{err}");
    // The BF16 kernel runs a bf16 plan where the CPU has it, and is a clear
    // error where it does not.
    let bf16 = dir.path().join("bf16");
    fs::create_dir(&bf16).expect("mkdir");
    let bf16_plan = compile_tiny(&bf16, &["--precision", "bf16"]);
    let args = [s(&bf16_plan), "--kernels", "avx512bf16", "--iters", "2"];
    if dlrm_codegen::jit::micro::AVX512_BF16.available() {
        ok(DLRM_RUN, &args);
    } else {
        let err = fails(DLRM_RUN, &args);
        assert!(err.contains("AVX-512 BF16"), "{err}");
    }
    // The AMX kernel likewise; `auto` picks it for the bf16 forward GEMMs where
    // the CPU and OS allow it, and `--bench` names it.
    let amx = dlrm_codegen::jit::micro::AMX_BF16.available();
    for kernels in ["amxbf16", "auto"] {
        let args = [
            s(&bf16_plan),
            "--kernels",
            kernels,
            "--iters",
            "2",
            "--bench",
        ];
        if amx {
            let out = ok(DLRM_RUN, &args);
            let all = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(all.contains("AMX-BF16"), "{kernels}: {all}");
        } else if kernels == "amxbf16" {
            let err = fails(DLRM_RUN, &args);
            assert!(err.contains("AMX-BF16"), "{err}");
        }
    }
    let err = fails(DLRM_RUN, &[s(&dir.path().join("missing.plan"))]);
    assert!(err.contains("missing.plan"), "{err}");
    let err = fails(DLRMC, &["inspect", s(&dir.path().join("missing.plan"))]);
    assert!(err.contains("missing.plan"), "{err}");

    // A corrupted weight file is caught by its checksum, not trained on.
    let w = plan.join("weights.safetensors");
    let mut bytes = fs::read(&w).expect("weights");
    let n = bytes.len();
    bytes[n - 3] ^= 0x40;
    fs::write(&w, &bytes).expect("corrupt");
    let err = fails(DLRM_RUN, &[s(&plan), "--iters", "1"]);
    assert!(err.contains("weights.safetensors"), "{err}");

    let other = dir.path().join("other.plan");
    fs::create_dir(&other).expect("mkdir");
    fs::write(other.join("manifest.json"), "{\"format\": 1}").expect("write");
    let err = fails(DLRM_RUN, &[s(&other)]);
    assert!(err.contains("manifest.json"), "{err}");
}

#[test]
fn comm_mpi_runs_as_one_mpi_rank_or_says_the_build_lacks_mpi() {
    let dir = tempdir();
    let plan = compile_tiny(dir.path(), &[]);
    let args = [s(&plan), "--comm", "mpi", "--iters", "2"];
    if cfg!(feature = "mpi") {
        // Started without mpirun, the process is an MPI group of one.
        let out = Command::new(DLRM_RUN)
            .args(args)
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .output()
            .expect("spawn");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(stderr.contains("2 steps on 1 rank,"), "{stderr}");
    } else {
        let err = fails(DLRM_RUN, &args);
        assert!(
            err.contains("built without MPI support; rebuild with `--features mpi`"),
            "{err}"
        );
    }
    let out = run(DLRM_RUN, &[s(&plan), "--comm", "nccl"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("expected threads or mpi"), "{stderr}");
}

/// Every ONNX test case through the product: `dlrmc compile model.onnx --infer-only`
/// (optimised, canonicalised)
/// then `dlrm-run --infer --inputs inputs.npz --outputs out.npz`, whose arrays must
/// match what ONNX Runtime computed (`outputs.npz`) within 1e-5. Cases without an
/// `outputs.npz` are error cases: compiling them must fail naming the node.
#[test]
fn onnx_models_compile_and_serve_onnx_runtimes_answers() {
    let cases = Path::new(env!("CARGO_MANIFEST_DIR")).join("frontends/onnx/test_cases");
    let dir = tempdir();
    let mut served = 0;
    let mut refused = 0;
    let mut entries: Vec<_> = fs::read_dir(&cases)
        .expect("test cases")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.join("model.onnx").exists())
        .collect();
    entries.sort();
    for case in entries {
        let name = case
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        let plan = dir.path().join(format!("{name}.plan"));
        let model = case.join("model.onnx");
        if !case.join("outputs.npz").exists() {
            let err = fails(DLRMC, &["compile", s(&model), "-o", s(&plan), "-q"]);
            assert!(err.contains("node #"), "{name}: {err}");
            assert!(!plan.exists(), "{name}: a failed compile left a plan");
            refused += 1;
            continue;
        }
        // Inference plans: some cases (per-sample weights) have no gradient; ONNX
        // training is tested in tests/onnx.rs.
        let compile = ["compile", s(&model), "-o", s(&plan), "--infer-only", "-q"];
        ok(DLRMC, &compile);
        let out = dir.path().join(format!("{name}.out.npz"));
        let inputs = case.join("inputs.npz");
        serve_npz(&plan, &inputs, &out);
        let want = dlrm_onnx::npz::read(&case.join("outputs.npz")).expect("expected");
        let got = dlrm_onnx::npz::read(&out).expect("written");
        assert_eq!(want.len(), got.len(), "{name}");
        for (n, w) in &want {
            let (_, g) = got
                .iter()
                .find(|(m, _)| dlrm_onnx::ir_name(m) == dlrm_onnx::ir_name(n))
                .unwrap_or_else(|| panic!("{name}: output `{n}` missing"));
            assert_eq!(w.shape, g.shape, "{name}: `{n}`");
            for (a, b) in w.to_f32_vec().iter().zip(g.to_f32_vec()) {
                let tol = 1e-5 * a.abs().max(1.0);
                assert!((a - b).abs() <= tol, "{name}: `{n}`: {a} vs {b}");
            }
        }
        served += 1;
    }
    assert!(
        served >= 8 && refused >= 1,
        "served {served}, refused {refused}"
    );
}

/// The real PyTorch exports (`frontends/onnx/test_cases/real/`) through the
/// product, as the "done when" says: `dlrmc compile model.onnx` (training
/// graph too), `dlrmc inspect` shows one fused bag per table and the interaction
/// and no generic op (include_last_offset=True is the bag's `last_offset`
/// attribute, not a slice of the offsets), and `dlrm-run PLAN --infer --inputs inputs_B.npz` writes
/// PyTorch's own outputs within 1e-5 at every committed batch size (1, 7, 2048),
/// TorchRec's jagged batch (`values`, `lengths`) too.
#[test]
fn real_pytorch_exports_compile_inspect_and_serve_pytorchs_answers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("frontends/onnx/test_cases/real");
    let dir = tempdir();
    let mut names: Vec<String> = fs::read_dir(&root)
        .expect("real cases")
        .filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
        .filter(|n| root.join(n).join("model.onnx").exists())
        .collect();
    names.sort();
    let mut served = 0;
    for name in &names {
        let case = root.join(name);
        let plan = dir.path().join(format!("{name}.plan"));
        let model = case.join("model.onnx");
        ok(DLRMC, &["compile", s(&model), "-o", s(&plan), "-q"]);
        let v: Value = serde_json::from_slice(&ok(DLRMC, &["inspect", s(&plan), "--json"]).stdout)
            .expect("inspect json");
        let ops = v["graphs"]["infer"]["ops"].as_object().expect("infer ops");
        let bags: u64 = ["embedding_bag", "embedding_bag_weighted"]
            .iter()
            .filter_map(|k| ops.get(*k).and_then(Value::as_u64))
            .sum();
        let case_json: Value =
            serde_json::from_str(&fs::read_to_string(case.join("case.json")).expect("case"))
                .expect("case json");
        // Three tables unless the case says otherwise (the reference's Kaggle mode: 26).
        let tables = case_json["tables"].as_u64().unwrap_or(3);
        assert_eq!(bags, tables, "{name}: {ops:?}");
        // One interaction (a dot one written in the top MLP's blocked layout).
        let interactions: u64 = ["interaction", "interaction_blocked"]
            .iter()
            .filter_map(|k| ops.get(*k).and_then(Value::as_u64))
            .sum();
        assert_eq!(interactions, 1, "{name}: {ops:?}");
        let generic = dlrm_passes::egraph::canon::GENERIC;
        assert!(
            ops.keys().all(|k| !generic.contains(&k.as_str())),
            "{name}: generic ops left: {ops:?}"
        );
        let train = v["graphs"]["train"]["ops"].as_object().expect("train ops");
        assert!(
            train
                .keys()
                .any(|k| k.starts_with("embedding_update") || k == "sparse_sgd"),
            "{name}: no sparse table update in {train:?}"
        );
        let batches: Vec<u64> = case_json["batches"]
            .as_array()
            .expect("batches")
            .iter()
            .filter_map(Value::as_u64)
            .collect();
        assert!(batches.len() >= 2, "{name}: {batches:?}");
        for b in batches {
            let out = dir.path().join(format!("{name}.{b}.npz"));
            let inputs = case.join(format!("inputs_{b}.npz"));
            serve_npz(&plan, &inputs, &out);
            let want = dlrm_onnx::npz::read(&case.join(format!("outputs_{b}.npz"))).expect("want");
            let got = dlrm_onnx::npz::read(&out).expect("written");
            assert_eq!(want.len(), got.len(), "{name}");
            for ((n, w), (_, g)) in want.iter().zip(&got) {
                assert_eq!(w.shape, g.shape, "{name} batch {b}: `{n}`");
                for (a, c) in w.to_f32_vec().iter().zip(g.to_f32_vec()) {
                    assert!((a - c).abs() <= 1e-5, "{name} batch {b}: `{n}`: {a} vs {c}");
                }
            }
        }
        served += 1;
    }
    assert!(served >= 18, "served {served} of {names:?}");
}

/// Output into a pipe whose reader has gone (`dlrmc inspect PLAN | head -0`,
/// `dlrm-run PLAN --json | ...`)
/// ends the process as `SIGPIPE` ends `cat`: no panic message, no exit code 101.
#[cfg(unix)]
#[test]
fn a_closed_stdout_pipe_ends_the_binaries_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempdir();
    let plan = compile_tiny(dir.path(), &[]);
    for (exe, args) in [
        (DLRMC, vec!["inspect", s(&plan)]),
        (DLRMC, vec!["plan-shards", s(&plan), "--ranks", "2"]),
        (DLRM_RUN, vec![s(&plan), "--iters", "2", "--json"]),
    ] {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let out = Command::new(exe)
            .args(&args)
            .stdout(writer)
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{exe} {args:?}: {err}");
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGPIPE),
            "{exe} {args:?}: {err}"
        );
    }
}
