//! ONNX models through the library the binaries use: canonicalisation is exact and
//! complete on PyTorch-style DLRMs, an ONNX DLRM compiles to the same optimised plan
//! as its JSON twin, and ONNX models train (with `--label`).

use dlrm_ir::interp::{bind_symbols, run};
use dlrm_ir::ops::interaction_blocked;
use dlrm_ir::{Graph, InteractionKind, Op, SingleRank, Tensor};
use dlrm_passes::egraph::Limits;
use dlrm_passes::egraph::canon::{GENERIC, canonicalise};
use dlrm_runtime::driver::run_with_params;
use dlrm_runtime::infer_once;
use dlrm_runtime::{Backend, Executor, KernelChoice};
use dlrm_runtime::{RunOptions, RunSettings, job_for};
use dlrmc::Inspection;
use dlrmc::compile::{CompileOptions, compile};
use dlrmc::model::{Overrides, load_model};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn case(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("frontends/onnx/test_cases")
        .join(name)
}

/// The cases that are whole DLRMs (dense MLP, bags, interaction).
const DLRMS: &[&str] = &[
    "dlrm_dot",
    "dlrm_cat",
    "dynamic_batch",
    "external_data",
    "dlrm_pytorch",
    "dlrm_slice",
    "dlrm_slice_self",
    "dlrm_gather_nd",
    "dlrm_gather_nd_self",
];

fn generic_ops(g: &Graph) -> Vec<String> {
    g.nodes()
        .iter()
        .map(|n| n.op.mnemonic())
        .filter(|m| GENERIC.contains(m))
        .map(str::to_string)
        .collect()
}

fn eval(g: &Graph, inputs: &HashMap<String, Tensor>, params: &[(String, Tensor)]) -> Vec<Tensor> {
    let mut params: HashMap<String, Tensor> = params.iter().cloned().collect();
    let inputs: HashMap<String, Tensor> = inputs
        .iter()
        .filter(|(n, _)| g.find(n).is_some())
        .map(|(n, t)| (n.clone(), t.clone()))
        .collect();
    let syms = bind_symbols(g, &inputs, &params).expect("bind");
    run(g, &inputs, &mut params, &syms, &SingleRank).expect("run")
}

/// Every DLRM case canonicalises to DLRM ops only (no generic op left), and the
/// canonical graph computes bit for bit what the imported graph computes.
#[test]
fn canonicalisation_is_complete_and_exact_on_onnx_dlrms() {
    for name in DLRMS {
        let m = dlrm_onnx::load(&case(name).join("model.onnx")).expect("import");
        assert!(!generic_ops(&m.graph).is_empty(), "{name}: nothing to do");
        let mut params = m.params.clone();
        let (g, stats) =
            canonicalise(&m.graph, Some(&mut params), &Limits::default()).expect("canon");
        dlrm_ir::verify(&g).expect("verifies");
        assert_eq!(generic_ops(&g), Vec::<String>::new(), "{name}");
        let kinds: Vec<&str> = g.nodes().iter().map(|n| n.op.mnemonic()).collect();
        assert!(kinds.contains(&"embedding_bag"), "{name}: {kinds:?}");
        assert!(kinds.contains(&"interaction"), "{name}: {kinds:?}");
        assert_eq!(stats.stop_reason, "saturated", "{name}");
        let outs = |g: &Graph| -> Vec<String> {
            g.outputs()
                .iter()
                .map(|&v| g.name_of(v).to_string())
                .collect()
        };
        assert_eq!(outs(&g), outs(&m.graph), "{name}: output names kept");
        let inputs: HashMap<String, Tensor> = dlrm_onnx::npz::read(&case(name).join("inputs.npz"))
            .expect("inputs")
            .into_iter()
            .map(|(n, t)| (dlrm_onnx::ir_name(&n), t))
            .collect();
        let before = eval(&m.graph, &inputs, &m.params);
        let after = eval(&g, &inputs, &params);
        assert_eq!(before.len(), after.len());
        for (a, b) in before.iter().zip(&after) {
            assert_eq!(a.shape, b.shape, "{name}");
            let (a, b) = (a.to_f32_vec(), b.to_f32_vec());
            let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{name}: canonical graph differs: {a:?} vs {b:?}");
        }
    }
}

/// The dot interactions of a graph (`Some(self_interaction)` per node).
fn dot_interactions(g: &Graph) -> Vec<bool> {
    g.nodes()
        .iter()
        .filter_map(|n| match &n.op {
            Op::Interaction {
                kind: InteractionKind::Dot,
                self_interaction,
            } => Some(*self_interaction),
            // Written straight in the top MLP's blocked layout.
            Op::Module(m) if m.mnemonic() == interaction_blocked::MNEMONIC => {
                Some(interaction_blocked::attrs_of(m).0)
            }
            _ => None,
        })
        .collect()
}

/// The largest difference of a compiled plan's inference outputs on a case's
/// `inputs.npz` from ONNX Runtime's `outputs.npz`.
fn plan_vs_onnxruntime(name: &str, plan: dlrm_runtime::plan::Plan) -> f32 {
    let dir = case(name);
    let inputs: Vec<(String, Tensor)> = dlrm_onnx::npz::read(&dir.join("inputs.npz"))
        .expect("inputs")
        .into_iter()
        .map(|(n, t)| (dlrm_onnx::ir_name(&n), t))
        .filter(|(n, _)| plan.infer.find(n).is_some())
        .collect();
    let want = dlrm_onnx::npz::read(&dir.join("outputs.npz")).expect("outputs");
    let got = infer_once(plan, inputs, Backend::default(), KernelChoice::default()).expect("infer");
    assert_eq!(got.len(), want.len(), "{name}: outputs");
    let mut max = 0.0f32;
    for ((_, w), (_, g)) in want.iter().zip(&got) {
        assert_eq!(w.shape, g.shape, "{name}");
        for (a, b) in w.to_f32_vec().iter().zip(g.to_f32_vec()) {
            max = max.max((a - b).abs());
        }
    }
    max
}

/// The lower triangle taken by Slice (per-row slices, with and without the
/// diagonal) or GatherND compiles to `interaction {kind=dot}` with no generic op
/// left, and the compiled plan matches ONNX Runtime within 1e-5; the triangle in
/// another order (`dlrm_tril_order`: column-major pairs) stays generic and still
/// matches.
#[test]
fn sliced_and_gather_nd_triangles_compile_to_the_interaction() {
    for (name, want) in [
        ("dlrm_slice", Some(false)),
        ("dlrm_slice_self", Some(true)),
        ("dlrm_gather_nd", Some(false)),
        ("dlrm_gather_nd_self", Some(true)),
        ("dlrm_tril_order", None),
    ] {
        let model = load_model(&case(name).join("model.onnx"), Overrides::default()).expect("load");
        let infer_only = CompileOptions {
            infer_only: true,
            ..CompileOptions::default()
        };
        let plan = compile(model, &infer_only, &mut |_, _| {}).expect("compile");
        let ops = &Inspection::of(&plan).graphs["infer"].ops;
        let dots = dot_interactions(&plan.infer);
        match want {
            Some(self_interaction) => {
                assert_eq!(dots, vec![self_interaction], "{name}: {ops:?}");
                assert!(
                    ops.keys().all(|k| !GENERIC.contains(&k.as_str())),
                    "{name}: generic ops left: {ops:?}"
                );
            }
            None => {
                assert!(dots.is_empty(), "{name}: rewritten: {ops:?}");
                for kind in ["gather_nd", "matmul"] {
                    assert!(ops.contains_key(kind), "{name}: no {kind} in {ops:?}");
                }
            }
        }
        let diff = plan_vs_onnxruntime(name, plan);
        assert!(diff <= 1e-5, "{name}: differs from ONNX Runtime by {diff}");
    }
}

fn plan_of(path: &Path, batch: usize) -> dlrm_runtime::plan::Plan {
    let overrides = Overrides {
        batch_size: Some(batch),
        ..Overrides::default()
    };
    let model = load_model(path, overrides).expect("load");
    compile(model, &CompileOptions::default(), &mut |_, _| {}).expect("compile")
}

/// The PyTorch-style ONNX DLRM (`gen_dlrm.py` on `dlrm_pytorch/model.json`) compiles
/// to exactly the ops of its JSON twin, by kind, in both graphs: blocked GEMMs,
/// embedding bags (and their fused updates), the interaction, no generic leftovers.
#[test]
fn onnx_dlrm_plan_is_as_optimised_as_its_json_twin() {
    let dir = case("dlrm_pytorch");
    let onnx = Inspection::of(&plan_of(&dir.join("model.onnx"), 64));
    let json = Inspection::of(&plan_of(&dir.join("model.json"), 64));
    for graph in ["infer", "train"] {
        let (o, j) = (&onnx.graphs[graph].ops, &json.graphs[graph].ops);
        assert_eq!(o, j, "{graph}: ONNX plan vs JSON plan ops by kind");
        for kind in ["brgemm", "embedding_bag", "interaction_blocked"] {
            assert!(j.contains_key(kind), "{graph}: no {kind} in {j:?}");
        }
        assert!(
            o.keys().all(|k| !GENERIC.contains(&k.as_str())),
            "{graph}: generic ops left: {o:?}"
        );
    }
    assert_eq!(onnx.stats.flops_per_sample, json.stats.flops_per_sample);
}

/// TorchRec's own `DLRM_DCN` exported by both exporters
/// (`real/{ts17,dynamo}_torchrec_dcn`, `export_torchrec.py`: the shape of
/// `examples/dlrm-dcnv2-tiny.json`) compiles to the ops of that JSON model, by kind,
/// in both graphs (both with row-wise Adagrad): its jagged bags (`embedding_bag`
/// with last_offset, over `offsets_from_lengths`) where the JSON model's are
/// fixed-size, the `cat` interaction, the cross layers contracted to `brgemm` +
/// `cross_mix` (`contract-cross`, then `cross_brgemm` in the GEMMs' epilogues:
/// `fuse-cross-epilogue`), no generic leftovers. One difference, in
/// training, that every last_offset bag has (`*_dot_last_offset`,
/// `ts17_torchrec`): its table update is `embedding_bag_grad` + `sparse_adagrad`,
/// not yet the fused `embedding_update_adagrad`.
#[test]
fn torchrec_dcn_exports_are_as_optimised_as_the_json_dcn() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let plan = |path: &Path| {
        let overrides = Overrides {
            batch_size: Some(64),
            optimizer: Some("rowwise_adagrad".into()),
            ..Overrides::default()
        };
        let model = load_model(path, overrides).expect("load");
        compile(model, &CompileOptions::default(), &mut |_, _| {}).expect("compile")
    };
    let json = Inspection::of(&plan(&root.join("examples/dlrm-dcnv2-tiny.json")));
    for name in ["ts17_torchrec_dcn", "dynamo_torchrec_dcn"] {
        let onnx = Inspection::of(&plan(&case("real").join(name).join("model.onnx")));
        for graph in ["infer", "train"] {
            let (mut o, j) = (onnx.graphs[graph].ops.clone(), &json.graphs[graph].ops);
            if graph == "train" {
                // The last_offset bags' unfused update (see above).
                let grads = o.remove("embedding_bag_grad");
                assert_eq!(grads, o.remove("sparse_adagrad"), "{name}");
                if let Some(n) = grads {
                    *o.entry("embedding_update_adagrad".to_string()).or_default() += n;
                }
            }
            assert_eq!(&o, j, "{name} {graph}: ONNX plan vs JSON plan ops by kind");
            for kind in ["brgemm", "embedding_bag", "interaction"] {
                assert!(j.contains_key(kind), "{graph}: no {kind} in {j:?}");
            }
            // The cross layers' steps in their GEMMs' epilogues.
            assert!(
                j.keys().any(|k| k.starts_with("cross_brgemm")),
                "{graph}: no cross_brgemm in {j:?}"
            );
            assert!(
                o.keys().all(|k| !GENERIC.contains(&k.as_str())),
                "{name} {graph}: generic ops left: {o:?}"
            );
        }
        // (FLOPs per sample differ by the bags' sizes: 3, 1 and 2 ids in the
        // JSON model, an estimate for jagged bags.)
    }
}

/// An ONNX model trains like a JSON one (the loss falls on the synthetic teacher's
/// labels); `--label NAME` makes an input of the model the training graph's label.
#[test]
fn onnx_models_train() {
    for (name, label) in [("dlrm_dot", None), ("dlrm_pytorch", Some("click"))] {
        let overrides = Overrides {
            batch_size: Some(256),
            learning_rate: Some(0.2),
            label: label.map(str::to_string),
            ..Overrides::default()
        };
        let model = load_model(&case(name).join("model.onnx"), overrides).expect("load");
        let plan = compile(model, &CompileOptions::default(), &mut |_, _| {}).expect("compile");
        let train = plan.train.as_ref().expect("a training graph");
        if let Some(l) = label {
            assert!(
                plan.infer.find(l).is_none(),
                "{name}: the label left the forward graph"
            );
            assert!(
                train.find(l).is_some(),
                "{name}: the training label is `{l}`"
            );
            assert!(train.find("label").is_none(), "{name}");
        }
        let opts = RunOptions {
            settings: RunSettings {
                ranks: 2,
                log_every: 1,
                ..RunSettings::default()
            },
            iters: 60,
            ..RunOptions::default()
        };
        let (report, _) =
            run_with_params(job_for(plan, &opts).expect("job"), &mut |_| {}).expect("run");
        let losses: Vec<f32> = report.losses.iter().map(|l| l.1).collect();
        assert!(losses.iter().all(|l| l.is_finite()), "{name}: {losses:?}");
        let head: f32 = losses[..10].iter().sum::<f32>() / 10.0;
        let tail: f32 = losses[losses.len() - 10..].iter().sum::<f32>() / 10.0;
        assert!(tail < head, "{name}: loss did not fall: {head} -> {tail}");
    }
}

/// Bad `--label` values are refused naming the problem; a model whose generic ops
/// have no gradient fails to compile for training naming the node and the op, and
/// still compiles for inference.
#[test]
fn onnx_training_errors_are_clear() {
    let load = |name: &str, label: Option<&str>| {
        let overrides = Overrides {
            label: label.map(str::to_string),
            ..Overrides::default()
        };
        load_model(&case(name).join("model.onnx"), overrides)
    };
    let err = load("dlrm_dot", Some("nope"))
        .expect_err("no such input")
        .to_string();
    assert!(
        err.contains("no such input") && err.contains("dense"),
        "{err}"
    );
    let err = load("dlrm_dot", Some("dense"))
        .expect_err("used input")
        .to_string();
    assert!(err.contains("the label is f32[B,5]"), "{err}");
    // A generic op without a gradient (the triangle in column-major order).
    let model = load("dlrm_tril_order", None).expect("load");
    let err = compile(model.clone(), &CompileOptions::default(), &mut |_, _| {})
        .expect_err("no gradient");
    let chain = format!(
        "{err}: {}",
        std::error::Error::source(&err)
            .map(|s| s.to_string())
            .unwrap_or_default()
    );
    assert!(
        chain.contains("no gradient rule for `transpose`") && chain.contains("node #"),
        "{chain}"
    );
    let infer_only = CompileOptions {
        infer_only: true,
        ..CompileOptions::default()
    };
    let plan = compile(model, &infer_only, &mut |_, _| {}).expect("inference plan");
    assert!(plan.train.is_none());
}

/// The ONNX model on PyTorch's weighted EmbeddingBag (TorchScript Loop form,
/// per-sample weights, empty bags; `gen_ebag.py`) trains: 40 SGD steps on its
/// `inputs.npz` with fixed labels lower the loss, and the unoptimised (`-O0`) and
/// optimised (`-O1`) plans agree step by step. (The synthetic data generator does
/// not produce per-sample weights, so the steps are driven here.)
#[test]
fn weighted_bag_onnx_model_trains() {
    let dir = case("dlrm_weighted");
    let arrays = npz_inputs(&dir.join("inputs.npz"));
    let batch = arrays
        .iter()
        .find(|(n, _)| n == "offsets")
        .expect("offsets")
        .1
        .numel();
    let runs = train_both(
        &dir.join("model.onnx"),
        &arrays,
        batch,
        "embedding.weight",
        &["embedding_bag_weighted", "embedding_bag_grad", "sparse_sgd"],
        0.5,
    );
    check_runs("dlrm_weighted", &runs, 0.8, usize::MAX);
}

/// Arrays of an npz file under their IR names.
fn npz_inputs(path: &Path) -> Vec<(String, Tensor)> {
    dlrm_onnx::npz::read(path)
        .expect("inputs")
        .into_iter()
        .map(|(n, t)| (dlrm_onnx::ir_name(&n), t))
        .collect()
}

/// Trains the ONNX model at `model` for 40 steps on `arrays` (labels alternate 0
/// and 1), compiled at -O0 and at -O1: checks the training graph has `ops_wanted`
/// (at -O1 the row gradient and update may be one `embedding_update`) and that
/// `table` was updated; returns both runs' losses.
fn train_both(
    model: &Path,
    arrays: &[(String, Tensor)],
    batch: usize,
    table: &str,
    ops_wanted: &[&str],
    lr: f32,
) -> Vec<Vec<f32>> {
    let what = model.display();
    let labels = Tensor::f32(vec![batch, 1], (0..batch).map(|i| (i % 2) as f32).collect());
    let mut runs = Vec::new();
    for optimize in [false, true] {
        let overrides = Overrides {
            batch_size: Some(batch),
            learning_rate: Some(lr),
            ..Overrides::default()
        };
        let model = load_model(model, overrides).expect("load");
        let opts = CompileOptions {
            optimize,
            ..CompileOptions::default()
        };
        let plan = compile(model, &opts, &mut |_, _| {}).expect("compile");
        // The arrays are in the model's own layout; the plan's graphs take the
        // canonical inputs its input contract computes from them.
        let arrays = plan.contract.adapt(arrays.to_vec()).expect("adapt");
        let train = plan.train.expect("a training graph");
        let ops: Vec<&str> = train.nodes().iter().map(|n| n.op.mnemonic()).collect();
        for op in ops_wanted {
            // -O1 may fuse the row gradient into the update (`embedding_update`).
            let fused = optimize
                && matches!(*op, "embedding_bag_grad" | "sparse_sgd")
                && ops.contains(&"embedding_update");
            assert!(
                ops.contains(op) || fused,
                "{what} -O{}: no {op} in {ops:?}",
                u8::from(optimize)
            );
        }
        let label = train
            .inputs()
            .iter()
            .map(|&v| train.name_of(v).to_string())
            .find(|n| n.starts_with("label"))
            .expect("a label input");
        let params = dlrm_ir::init::materialize_all(&plan.params).expect("params");
        let before = params
            .iter()
            .find(|(n, _)| n == table)
            .expect("the table")
            .1
            .clone();
        let mut exec = Executor::new(train, params.into_iter().collect(), 0).expect("executor");
        let mut losses = Vec::new();
        for _ in 0..40 {
            let mut inputs: HashMap<String, Tensor> = arrays.iter().cloned().collect();
            inputs.insert(label.clone(), labels.clone());
            let syms = exec.bind_symbols(&inputs).expect("bind");
            let out = exec.step(inputs, &syms, &SingleRank).expect("step");
            losses.push(out[0].to_f32_vec()[0]);
        }
        assert_ne!(
            exec.param(table).expect("table").to_f32_vec(),
            before.to_f32_vec(),
            "{what}: the table was not updated"
        );
        runs.push(losses);
    }
    runs
}

/// The loss is finite and falls below `fall` times its first value, and -O0 and
/// -O1 agree within 1e-5 relative at the first `agree` steps.
fn check_runs(name: &str, runs: &[Vec<f32>], fall: f32, agree: usize) {
    let (o0, o1) = (&runs[0], &runs[1]);
    assert!(o0.iter().all(|l| l.is_finite()), "{name}: {o0:?}");
    let last = o0.len() - 1;
    assert!(
        o0[last] < fall * o0[0],
        "{name}: the loss did not fall: {} -> {}",
        o0[0],
        o0[last]
    );
    for (k, (a, b)) in o0.iter().zip(o1).enumerate() {
        assert!(
            k >= agree || (a - b).abs() <= 1e-5 * a.abs().max(1.0),
            "{name} step {k}: -O0 loss {a} vs -O1 loss {b}"
        );
    }
}

/// Real PyTorch exports train from their initializers, one case per bag form
/// (offsets with empty bags, fixed-size, `mean`, per-sample weights, int32
/// indices; TorchScript and dynamo; dot and cat): the training graph has the bag
/// gradient and the sparse update, the loss falls on PyTorch's batch of 7 and the
/// -O0 and -O1 plans agree over the first 10 steps.
#[test]
fn real_pytorch_exports_train() {
    let (emb, tables) = ("emb_l.0.weight", "tables.1");
    for (name, bag, table) in [
        ("ts17_dot_offsets", "embedding_bag", emb),
        ("ts17_dot_fixed", "embedding_bag", emb),
        ("ts17_dot_mean", "embedding_bag", emb),
        ("dynamo_dot_weighted", "embedding_bag_weighted", emb),
        ("ts17_dot_int32", "embedding_bag", emb),
        ("ts11_cat_offsets", "embedding_bag", emb),
        ("ts17_dot_last_offset", "embedding_bag", emb),
        ("dynamo_dot_last_offset", "embedding_bag", emb),
        // TorchRec: `values` holds every key's ids, and table 1 (25 rows) is
        // updated from its key's bags only (the others' ids reach 40).
        ("ts17_torchrec", "embedding_bag", tables),
        ("dynamo_torchrec", "embedding_bag", tables),
    ] {
        let dir = case("real").join(name);
        let arrays = npz_inputs(&dir.join("inputs_7.npz"));
        let runs = train_both(
            &dir.join("model.onnx"),
            &arrays,
            7,
            table,
            &[bag, "embedding_bag_grad", "sparse_sgd"],
            0.5,
        );
        // At lr 0.5 on three tables -O0 and -O1 (blocked GEMMs, fused updates)
        // drift apart past 1e-5 after some 30 steps (5.6e-4 at step 36 of
        // `ts17_dot_mean`): compared over the first 10. TorchRec's model (its own
        // MLP sizes) falls more slowly: 0.691 to 0.566 in 40 steps.
        let fall = if table == tables { 0.85 } else { 0.8 };
        check_runs(name, &runs, fall, 10);
    }
}

/// The real PyTorch exports (`frontends/onnx/test_cases/real/`, made by
/// `export_pytorch.py` with `torch.onnx.export`, TorchScript and dynamo) that the
/// importer takes: each compiles (training graph too) to a plan whose inference
/// graph is the fused DLRM — one bag op per table, the interaction, blocked GEMMs,
/// no generic op left — and whose outputs match PyTorch's own within 1e-5 at batch
/// 1, 7 and 2048 (TorchRec's jagged batch too: its bags' bounds come from
/// `offsets_from_lengths`).
#[test]
fn real_pytorch_exports_compile_to_fused_plans_that_match_pytorch() {
    let root = case("real");
    let mut names: Vec<String> = std::fs::read_dir(&root)
        .expect("real cases")
        .filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
        .filter(|n| root.join(n).join("model.onnx").exists())
        .collect();
    names.sort();
    assert!(names.len() >= 15, "{names:?}");
    for name in &names {
        let dir = root.join(name);
        let model = load_model(&dir.join("model.onnx"), Overrides::default())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let plan = compile(model, &CompileOptions::default(), &mut |_, _| {})
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(plan.train.is_some(), "{name}: no training graph");
        let ops = &Inspection::of(&plan).graphs["infer"].ops;
        let bags: usize = ["embedding_bag", "embedding_bag_weighted"]
            .iter()
            .filter_map(|k| ops.get(*k))
            .sum();
        // Three tables unless the case says otherwise (the reference's Kaggle mode: 26).
        let meta: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("case.json")).expect("case.json"),
        )
        .expect("case.json is JSON");
        let tables = meta["tables"].as_u64().unwrap_or(3) as usize;
        assert_eq!(bags, tables, "{name}: one bag per table: {ops:?}");
        // The interaction (a dot one written in the top MLP's blocked layout).
        assert!(
            ops.contains_key("interaction") || ops.contains_key("interaction_blocked"),
            "{name}: no interaction in {ops:?}"
        );
        assert!(ops.contains_key("brgemm"), "{name}: no brgemm in {ops:?}");
        assert!(
            ops.keys().all(|k| !GENERIC.contains(&k.as_str())),
            "{name}: generic ops left: {ops:?}"
        );
        // include_last_offset=True: the bags read their `B+1` offsets whole; so do
        // TorchRec's per-key bags, over all keys' values.
        let last_offset_bags = plan
            .infer
            .nodes()
            .iter()
            .filter(|n| {
                matches!(
                    n.op,
                    Op::EmbeddingBag {
                        last_offset: true,
                        ..
                    }
                )
            })
            .count();
        let want_last = if name.contains("last_offset") || name.contains("torchrec") {
            3
        } else {
            0
        };
        assert_eq!(last_offset_bags, want_last, "{name}: last_offset bags");
        for batch in [1, 7, 2048] {
            let inputs: Vec<(String, Tensor)> =
                dlrm_onnx::npz::read(&dir.join(format!("inputs_{batch}.npz")))
                    .expect("inputs")
                    .into_iter()
                    .map(|(n, t)| (dlrm_onnx::ir_name(&n), t))
                    .collect();
            let want =
                dlrm_onnx::npz::read(&dir.join(format!("outputs_{batch}.npz"))).expect("outputs");
            let got = infer_once(
                plan.clone(),
                inputs,
                Backend::default(),
                KernelChoice::default(),
            )
            .unwrap_or_else(|e| panic!("{name} batch {batch}: {e}"));
            assert_eq!(got.len(), want.len(), "{name}");
            for ((_, w), (_, g)) in want.iter().zip(&got) {
                assert_eq!(w.shape, g.shape, "{name} batch {batch}");
                let max = w
                    .to_f32_vec()
                    .iter()
                    .zip(g.to_f32_vec())
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0f32, f32::max);
                assert!(
                    max <= 1e-5,
                    "{name} batch {batch}: differs from PyTorch by {max}"
                );
            }
        }
    }
}
