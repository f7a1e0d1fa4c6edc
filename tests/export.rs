//! `dlrmc export`: a plan's inference graph as standard ONNX. Without Python: the
//! exported model is read back by the repository's own importer, run by the
//! reference interpreter on the same inputs as the plan (equal within 1e-5), and
//! compiled again (`export -> dlrmc compile`) to the same plan ops by kind. With
//! ONNX Runtime's outputs committed (`tests/golden/export/`, made by
//! `scripts/compare-onnxruntime --plan`): `dlrm-run`'s inference equals them.

mod common;

use common::{DLRMC, ok, root, run, s, stderr, tempdir};
use dlrm_ir::interp::bind_symbols;
use dlrm_ir::{Graph, Op, SingleRank, Tensor};
use dlrm_onnx::export::{ExportOptions, MIN_EXPORT_OPSET, export, export_to_file};
use dlrm_passes::pipeline::Precision;
use dlrm_runtime::infer_once;
use dlrm_runtime::plan::Plan;
use dlrm_runtime::{Backend, KernelChoice};
use dlrmc::Inspection;
use dlrmc::compile::{CompileOptions, compile};
use dlrmc::model::{Overrides, load_model};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn compile_file(path: &Path, precision: Precision, optimizer: Option<&str>) -> Plan {
    let overrides = Overrides {
        optimizer: optimizer.map(str::to_string),
        ..Overrides::default()
    };
    let model = load_model(path, overrides).expect("load");
    let opts = CompileOptions {
        precision,
        ..CompileOptions::default()
    };
    compile(model, &opts, &mut |_, _| {}).expect("compile")
}

/// An example description with its tables cut to `rows` rows (`None`: as is).
fn example(dir: &Path, name: &str, rows: Option<usize>) -> PathBuf {
    let src = root().join("examples").join(format!("{name}.json"));
    let Some(rows) = rows else { return src };
    let mut d: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&src).expect("read")).expect("json");
    let n = d["table_rows"].as_array().expect("table_rows").len();
    d["table_rows"] = serde_json::json!(vec![rows; n]);
    let p = dir.join(format!("{name}.json"));
    std::fs::write(&p, d.to_string()).expect("write");
    p
}

/// Deterministic inputs for `g`: floats in [-1, 1), each bag's indices in its
/// table's rows.
fn inputs_for(g: &Graph, batch: usize, seed: u64) -> HashMap<String, Tensor> {
    let mut rows = HashMap::new();
    let mut offsets = std::collections::HashSet::new();
    for n in g.nodes() {
        if matches!(n.op, Op::EmbeddingBag { .. } | Op::EmbeddingBagWeighted) {
            let r = g.ty(n.inputs[0]).shape[0].fixed().expect("rows");
            rows.insert(n.inputs[1], r);
            if let Some(&o) = n.inputs.get(2) {
                offsets.insert(o);
            }
        }
    }
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    };
    let mut out = HashMap::new();
    for &v in g.inputs() {
        let ty = g.ty(v);
        let shape: Vec<usize> = ty
            .shape
            .iter()
            .map(|d| d.fixed().unwrap_or(batch))
            .collect();
        let n: usize = shape.iter().product();
        let t = if ty.dtype.is_float() {
            Tensor::f32(
                shape,
                (0..n)
                    .map(|_| (next() % 2000) as f32 / 1000.0 - 1.0)
                    .collect(),
            )
        } else {
            let r = rows.get(&v).copied().unwrap_or(10) as u64;
            let v: Vec<i64> = if offsets.contains(&v) {
                // Offsets into `batch` indices: from 0, non-decreasing (some bags
                // empty, the last ones too when the draw ends at `batch`).
                let mut o: Vec<i64> = (0..n)
                    .map(|k| {
                        if k == 0 {
                            0
                        } else {
                            (next() % (batch as u64 + 1)) as i64
                        }
                    })
                    .collect();
                o.sort_unstable();
                o
            } else {
                (0..n).map(|_| (next() % r) as i64).collect()
            };
            if ty.dtype == dlrm_ir::DType::I32 {
                Tensor::i32(shape, v.into_iter().map(|x| x as i32).collect())
            } else {
                Tensor::i64(shape, v)
            }
        };
        out.insert(g.name_of(v).to_string(), t);
    }
    out
}

fn eval(g: &Graph, inputs: &HashMap<String, Tensor>, params: &[(String, Tensor)]) -> Vec<Tensor> {
    let mut params: HashMap<String, Tensor> = params.iter().cloned().collect();
    let syms = bind_symbols(g, inputs, &params).expect("bind");
    dlrm_ir::interp::run(g, inputs, &mut params, &syms, &SingleRank).expect("run")
}

/// The largest difference, relative above 1 in magnitude.
fn max_err(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.shape, b.shape);
    a.to_f32_vec()
        .iter()
        .zip(b.to_f32_vec())
        .map(|(x, y)| (x - y).abs() / y.abs().max(1.0))
        .fold(0.0, f32::max)
}

/// Exports `plan` to `dir/<name>.onnx`, reads it back; the imported graph computes
/// what the plan computes (within 1e-5) on a batch of 37.
fn export_and_check(plan: &Plan, dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(format!("{name}.onnx"));
    export_to_file(
        &plan.infer,
        &plan.tensors().expect("params"),
        &path,
        &ExportOptions::default(),
    )
    .expect("export");
    let m = dlrm_onnx::load(&path).expect("re-import");
    let inputs = inputs_for(&plan.infer, 37, 7);
    let want = eval(&plan.infer, &inputs, &plan.tensors().expect("params"));
    let got = eval(&m.graph, &inputs, &m.params);
    assert_eq!(want.len(), got.len());
    for (w, g) in want.iter().zip(&got) {
        let e = max_err(g, w);
        assert!(e <= 1e-5, "{name}: exported model differs by {e}");
    }
    path
}

fn ops(plan: &Plan) -> Vec<(&'static str, std::collections::BTreeMap<String, usize>)> {
    Inspection::of(plan)
        .graphs
        .into_iter()
        .map(|(g, s)| (g, s.ops))
        .collect()
}

/// JSON examples (tables cut to keep the test fast): export -> import runs the
/// same function, and `export -> dlrmc compile` gives the same plan, op kind by op
/// kind, in the inference and the training graph.
#[test]
fn export_round_trip_same_outputs_and_plan_ops() {
    let dir = tempdir();
    for (name, rows) in [
        ("dlrm-tiny", None),
        ("dlrm-small", Some(1000)),
        ("dlrm-intel-small", Some(300)),
        ("dlrm-kaggle", Some(200)),
    ] {
        let plan = compile_file(&example(dir.path(), name, rows), Precision::Fp32, None);
        let onnx = export_and_check(&plan, dir.path(), name);
        let again = compile_file(&onnx, Precision::Fp32, Some(&plan.training.optimizer));
        assert_eq!(
            ops(&again),
            ops(&plan),
            "{name}: plan ops after the round trip"
        );
        let st = |p: &Plan| Inspection::of(p).graphs["infer"].flops_per_sample;
        assert_eq!(st(&again), st(&plan), "{name}: FLOPs");
    }
}

/// Forced small GEMM blocks pad the blocked weights (K and N not multiples of the
/// block): un-blocking drops the padding.
#[test]
fn padded_blocked_weights_unblock() {
    let dir = tempdir();
    for block in [3, 5] {
        let model = load_model(
            &root().join("examples/dlrm-tiny.json"),
            Overrides::default(),
        )
        .expect("load");
        let opts = CompileOptions {
            block: Some(block),
            ..CompileOptions::default()
        };
        let plan = compile(model, &opts, &mut |_, _| {}).expect("compile");
        let w = plan.infer.find("bot.0.w").expect("bot.0.w");
        let shape = &plan.infer.ty(w).shape;
        let padded_n = shape[0].fixed().unwrap_or(0) * shape[3].fixed().unwrap_or(0);
        assert!(padded_n > 16, "blocked by {block}, padded: {shape:?}");
        export_and_check(&plan, dir.path(), &format!("tiny-block{block}"));
    }
}

/// Plans of imported ONNX models, generic ops included (`dlrm_tril_order` keeps
/// its GatherND triangle in a non-canonical order): the export computes the same.
#[test]
fn onnx_test_case_plans_export() {
    let dir = tempdir();
    for case in [
        "dlrm_tril_order",
        "dlrm_pytorch",
        "dlrm_cat",
        "dynamic_batch",
        "dlrm_slice_self",
        "dlrm_gather_nd",
    ] {
        let model = root()
            .join("frontends/onnx/test_cases")
            .join(case)
            .join("model.onnx");
        let m = load_model(&model, Overrides::default()).expect("load");
        let opts = CompileOptions {
            infer_only: true,
            ..CompileOptions::default()
        };
        let plan = compile(m, &opts, &mut |_, _| {}).expect("compile");
        export_and_check(&plan, dir.path(), case);
    }
}

/// bf16 and mixed plans: weights widened to f32, the IR's bf16 roundings as
/// Cast pairs: the exported model computes what the plan computes.
#[test]
fn bf16_plans_export_with_their_roundings() {
    let dir = tempdir();
    for p in [Precision::Bf16, Precision::Mixed] {
        let plan = compile_file(&example(dir.path(), "dlrm-small", Some(500)), p, None);
        let path = export_and_check(&plan, dir.path(), &format!("small-{p}"));
        let m = dlrm_onnx::load(&path).expect("import");
        assert!(
            m.params
                .iter()
                .all(|(_, t)| t.dtype() != dlrm_ir::DType::BF16),
            "weights are f32"
        );
        let casts = m
            .graph
            .nodes()
            .iter()
            .filter(|n| matches!(n.op, Op::Cast { .. }));
        assert!(casts.count() > 0, "{p}: bf16 roundings kept");
    }
}

/// Variable-size bags (offsets, from PyTorch `EmbeddingBag` exports; sum, mean,
/// weighted) export in the segment-sum form and re-import with the bags fused:
/// the same outputs as the plan, and `export -> dlrmc compile` gives the same plan
/// ops; the training graph is refused with a clear error.
#[test]
fn offsets_bags_and_errors() {
    let dir = tempdir();
    for case in [
        "ebag_torchscript",
        "ebag_dynamo",
        "dlrm_weighted",
        "ebag_torchscript_weighted",
        "real/ts17_dot_mean",
        "real/ts17_dot_int32",
        "real/dynamo_dot_weighted",
    ] {
        let model = root()
            .join("frontends/onnx/test_cases")
            .join(case)
            .join("model.onnx");
        let plan = compile_file(&model, Precision::Fp32, None);
        let params = plan.tensors().expect("params");
        let e = export(&plan.infer, &params, &ExportOptions::default()).expect(case);
        let bytes = e.to_bytes().expect("encode");
        assert!(bytes.len() > 100, "{case}");
        let onnx = export_and_check(&plan, dir.path(), &case.replace('/', "_"));
        let again = compile_file(&onnx, Precision::Fp32, Some(&plan.training.optimizer));
        assert_eq!(
            ops(&again),
            ops(&plan),
            "{case}: plan ops after the round trip"
        );
        let train = plan.train.as_ref().expect("trains");
        let err = export(
            train,
            &plan.tensors().expect("params"),
            &ExportOptions::default(),
        )
        .err()
        .expect("training graph refused")
        .to_string();
        assert!(err.contains("training graph"), "{err}");
    }
    let plan = compile_file(
        &root().join("examples/dlrm-tiny.json"),
        Precision::Fp32,
        None,
    );
    let bad = ExportOptions {
        opset: 13,
        ..ExportOptions::default()
    };
    let err = export(&plan.infer, &plan.tensors().expect("params"), &bad)
        .err()
        .expect("opset")
        .to_string();
    assert!(err.contains("opset 13"), "{err}");
}

/// `--external-data`: the weights go to `<model>.data`, and the importer reads
/// them back to the same outputs.
#[test]
fn external_data_round_trip() {
    let dir = tempdir();
    let plan = compile_file(
        &example(dir.path(), "dlrm-small", Some(400)),
        Precision::Fp32,
        None,
    );
    let path = dir.path().join("ext.onnx");
    let opts = ExportOptions {
        external_data: true,
        ..ExportOptions::default()
    };
    let s = export_to_file(&plan.infer, &plan.tensors().expect("params"), &path, &opts)
        .expect("export");
    let (data, n) = s.external.expect("external data");
    assert_eq!(data, dir.path().join("ext.onnx.data"));
    assert!(
        n > s.model_bytes * 10,
        "weights outside: {n} vs {}",
        s.model_bytes
    );
    let m = dlrm_onnx::load(&path).expect("import");
    let inputs = inputs_for(&plan.infer, 5, 1);
    let want = eval(&plan.infer, &inputs, &plan.tensors().expect("params"));
    let got = eval(&m.graph, &inputs, &m.params);
    assert!(max_err(&got[0], &want[0]) <= 1e-5);
}

/// ONNX Runtime's outputs of exported models, committed: `dlrm-run`'s inference
/// (the JIT backend) and the reference interpreter equal them within 1e-5.
///
/// Made by (see `tests/golden/export/README.md`):
/// `scripts/compare-onnxruntime --plan PLAN MODEL.onnx --save-golden DIR/NAME`.
#[test]
fn dlrm_run_matches_committed_onnxruntime_outputs() {
    let golden = root().join("tests/golden/export");
    for (name, model) in [
        ("tiny", root().join("examples/dlrm-tiny.json")),
        (
            "ebag_torchscript",
            root().join("frontends/onnx/test_cases/ebag_torchscript/model.onnx"),
        ),
        (
            "dlrm_weighted",
            root().join("frontends/onnx/test_cases/dlrm_weighted/model.onnx"),
        ),
        (
            "ts17_dot_last_offset",
            root().join("frontends/onnx/test_cases/real/ts17_dot_last_offset/model.onnx"),
        ),
        (
            "dynamo_dot_last_offset",
            root().join("frontends/onnx/test_cases/real/dynamo_dot_last_offset/model.onnx"),
        ),
        // DCN-v2: the cross layers contracted to blocked GEMMs (`contract-cross`),
        // exported as Gemm (with and without C), Mul and Add.
        ("dcnv2_tiny", root().join("examples/dlrm-dcnv2-tiny.json")),
        // Int8 row-wise tables (`--quantize-tables int8`): codes, scales and
        // biases as initializers, dequantized after the gather, in every bag form
        // (fixed pooling, weighted bags with offsets, last-offset bags).
        ("tiny_int8", root().join("examples/dlrm-tiny.json")),
        (
            "dlrm_weighted_int8",
            root().join("frontends/onnx/test_cases/dlrm_weighted/model.onnx"),
        ),
        (
            "ts17_dot_last_offset_int8",
            root().join("frontends/onnx/test_cases/real/ts17_dot_last_offset/model.onnx"),
        ),
    ] {
        let mut plan = compile_file(&model, Precision::Fp32, None);
        if name.ends_with("_int8") {
            plan = plan.quantize_tables().expect("int8 tables").0;
        }
        let inputs = dlrm_onnx::npz::read(&golden.join(format!("{name}.inputs.npz"))).expect("in");
        let want: HashMap<String, Tensor> =
            dlrm_onnx::npz::read(&golden.join(format!("{name}.ort.npz")))
                .expect("ort")
                .into_iter()
                .collect();
        let ins: HashMap<String, Tensor> = inputs.iter().cloned().collect();
        let reference = eval(&plan.infer, &ins, &plan.tensors().expect("params"));
        let got =
            infer_once(plan, inputs, Backend::default(), KernelChoice::default()).expect("infer");
        for ((out, t), r) in got.iter().zip(&reference) {
            let w = want.get(out).expect("output in the golden file");
            let (e, er) = (max_err(t, w), max_err(r, w));
            assert!(
                e <= 1e-5 && er <= 1e-5,
                "{name} {out}: dlrm-run {e}, interpreter {er}"
            );
        }
    }
}

/// The command line: `dlrmc export PLAN -o FILE` writes a model the importer reads.
#[test]
fn dlrmc_export_command() {
    let dir = tempdir();
    let plan = dir.path().join("tiny.plan");
    common::compile(&common::example("dlrm-tiny.json"), &plan, &["--infer-only"]);
    let onnx = dir.path().join("tiny.onnx");
    let out = ok(DLRMC, &["export", "--batch", "N", s(&plan), "-o", s(&onnx)]);
    let msg = stderr(&out);
    assert!(msg.contains("wrote") && msg.contains("nodes"), "{msg}");
    let m = dlrm_onnx::load(&onnx).expect("import");
    assert_eq!(m.graph.ty(m.graph.outputs()[0]).to_string(), "f32[B,1]");
    let bad = run(
        DLRMC,
        &[
            "export",
            "--opset",
            "99",
            s(&plan),
            "-o",
            s(&dir.path().join("x.onnx")),
        ],
    );
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("opset 99"));
    assert!(!dir.path().join("x.onnx").exists());
}

/// `plan` trained `steps` steps on one rank (synthetic data), with its trained
/// parameters in place of the initial ones: what a checkpoint will give.
fn trained(plan: Plan, steps: u64) -> Plan {
    let opts = dlrm_runtime::RunOptions {
        settings: dlrm_runtime::RunSettings {
            log_every: 0,
            eval_batches: 0,
            ..dlrm_runtime::RunSettings::default()
        },
        iters: steps,
        ..dlrm_runtime::RunOptions::default()
    };
    let job = dlrm_runtime::job_for(plan.clone(), &opts).expect("job");
    let (_, mut ranks) = dlrm_runtime::driver::run_with_params(job, &mut |_| {}).expect("train");
    let mut after = ranks.swap_remove(0);
    let params = plan
        .params
        .iter()
        .map(|(n, v)| {
            let trained = after.remove(n).map(dlrm_ir::ParamValue::Stored);
            (n.clone(), trained.unwrap_or_else(|| v.clone()))
        })
        .collect();
    Plan { params, ..plan }
}

/// Trained weights export: the exported model computes the trained plan's
/// function (not the initial one's).
#[test]
fn trained_weights_export() {
    let dir = tempdir();
    let plan = compile_file(
        &root().join("examples/dlrm-tiny.json"),
        Precision::Fp32,
        None,
    );
    let t = trained(plan.clone(), 40);
    assert_ne!(t.params, plan.params, "training changed the weights");
    let path = export_and_check(&t, dir.path(), "tiny-trained");
    let m = dlrm_onnx::load(&path).expect("import");
    let inputs = inputs_for(&plan.infer, 37, 7);
    let before = eval(&plan.infer, &inputs, &plan.tensors().expect("params"));
    let got = eval(&m.graph, &inputs, &m.params);
    assert!(
        max_err(&got[0], &before[0]) > 1e-4,
        "the export holds the trained weights"
    );
}

/// Not a check: writes dlrm-small trained 300 steps as a plan, for
/// `dlrmc export` + `scripts/compare-onnxruntime --plan` until checkpoints exist
/// (`DLRM_TRAINED_PLAN`, default `/tmp/dlrm-small-trained.plan`):
/// `cargo test --release --test export -- --ignored write_trained_dlrm_small`.
#[test]
#[ignore = "writes a trained dlrm-small plan for docs/onnx.md's measurement"]
fn write_trained_dlrm_small() {
    let out = std::env::var("DLRM_TRAINED_PLAN")
        .unwrap_or_else(|_| "/tmp/dlrm-small-trained.plan".into());
    let plan = compile_file(
        &root().join("examples/dlrm-small.json"),
        Precision::Fp32,
        None,
    );
    let t = trained(plan, 300);
    dlrm_runtime::plan::write_plan(Path::new(&out), &t).expect("write plan");
}

/// `gelu` and `gelu_grad` export at the oldest opset and at 20, as `Gelu`
/// or as their decompositions (`gelu_grad` has no ONNX op), and the model read
/// back computes what the graph computes.
#[test]
fn gelu_exports_compute_the_graph() {
    let g = dlrm_ir::text::parse(
        "graph @g {\n  input %x: f32[B,4]\n  input %dy: f32[B,4]\n  \
         %y: f32[B,4] = gelu %x\n  %dx: f32[B,4] = gelu_grad %dy, %x\n  \
         output %y\n  output %dx\n}\n",
    )
    .expect("parse");
    let inputs = inputs_for(&g, 9, 5);
    let want = eval(&g, &inputs, &[]);
    for opset in [MIN_EXPORT_OPSET, 20] {
        let opts = ExportOptions {
            opset,
            ..ExportOptions::default()
        };
        let bytes = export(&g, &[], &opts)
            .expect("export")
            .to_bytes()
            .expect("bytes");
        let m = dlrm_onnx::from_bytes(&bytes, "gelu", None).expect("import");
        let got = eval(&m.graph, &inputs, &m.params);
        assert!(max_err(&got[0], &want[0]) <= 1e-5, "gelu at opset {opset}");
        assert!(max_err(&got[1], &want[1]) <= 1e-5, "gelu_grad at {opset}");
    }
}

/// `gelu` exports as ONNX `Gelu(approximate="tanh")` from opset 20 (read back by
/// the importer), and as its decomposition into primitive ops before.
#[test]
fn gelu_exports_by_opset() {
    let g = dlrm_ir::text::parse(
        "graph @g {\n  input %x: f32[B,4]\n  %y: f32[B,4] = gelu %x\n  output %y\n}\n",
    )
    .expect("parse");
    let new = ExportOptions {
        opset: 20,
        ..ExportOptions::default()
    };
    let bytes = export(&g, &[], &new)
        .expect("export")
        .to_bytes()
        .expect("bytes");
    let m = dlrm_onnx::from_bytes(&bytes, "gelu", None).expect("import");
    let inputs = inputs_for(&g, 9, 3);
    let (want, got) = (eval(&g, &inputs, &[]), eval(&m.graph, &inputs, &m.params));
    assert!(max_err(&got[0], &want[0]) <= 1e-6);
    let old = export(&g, &[], &ExportOptions::default()).expect("export");
    assert!(old.node_count() > 5, "the formula at opset 18");
}
