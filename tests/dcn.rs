//! DLRM-DCNv2 end to end: `examples/dlrm-dcnv2-tiny.json` (`"interaction": "dcn"`,
//! per-table pooling) compiles to a plan with `cross` layers, trains on synthetic
//! multi-hot bags and on a generated multi-hot `.ds` dataset at 1 and 3 thread ranks
//! alike, with a falling loss; its ONNX export compiles back to the same cross
//! layers (the import rule `cross-layer`) and trains; `--dump-ir fuse` shows them
//! as blocked GEMMs (`contract-cross`), and at `-O0` as `cross_save` /
//! `cross_grad_saved` in the training graph (`save-activations`).
//!
//! Stated tolerance: every logged loss at N ranks within 1e-5 relative of one
//! rank's (that of `tests/e2e.rs`), the AUC within 1e-4.

mod common;

use common::{DLRM_RUN, DLRMC, compile, example, max_rel, ok, run_metrics, s, tempdir};
use std::path::Path;

fn agree(plan: &Path, ranks: usize, args: &[&str]) -> Vec<f32> {
    let (want, auc) = run_metrics(plan, 1, args);
    assert!(want.iter().all(|l| l.is_finite()), "{want:?}");
    let (got, a) = run_metrics(plan, ranks, args);
    let d = max_rel(&want, &got, 0.0);
    assert!(
        d <= 1e-5,
        "losses at {ranks} ranks differ by {d} rel: {want:?} vs {got:?}"
    );
    assert!((a - auc).abs() <= 1e-4, "auc {a} vs {auc}");
    want
}

fn mean(v: &[f32]) -> f32 {
    v.iter().sum::<f32>() / v.len() as f32
}

#[test]
fn dcnv2_trains_on_synthetic_bags_at_1_and_3_ranks_with_a_falling_loss() {
    let dir = tempdir();
    let plan = dir.path().join("dcn.plan");
    compile(&example("dlrm-dcnv2-tiny.json"), &plan, &[]);
    let inspect = String::from_utf8(ok(DLRMC, &["inspect", s(&plan)]).stdout).expect("utf-8");
    // The elementwise steps in the GEMMs' epilogues (`fuse-cross-epilogue`).
    for op in ["cross_brgemm_save", "cross_brgemm_dgrad"] {
        assert!(inspect.contains(op), "no {op}: {inspect}");
    }
    let args = ["--iters", "120", "--log-every", "10", "--pooling", "3,1,2"];
    let losses = agree(&plan, 3, &args);
    let (head, tail) = (mean(&losses[..3]), mean(&losses[losses.len() - 3..]));
    assert!(tail < 0.8 * head, "the loss does not fall: {losses:?}");
}

#[test]
fn dcnv2_trains_on_a_multi_hot_dataset_at_1_and_2_ranks() {
    let dir = tempdir();
    let ds = dir.path().join("mh.ds");
    let generate = [
        "data", "generate", "--rows", "800", "--dense", "4", "--tables", "50,30,20",
    ];
    ok(
        DLRMC,
        &[&generate[..], &["--pooling", "3,1,2", "-o", s(&ds), "-q"]].concat(),
    );
    let plan = dir.path().join("dcn.plan");
    compile(&example("dlrm-dcnv2-tiny.json"), &plan, &[]);
    agree(
        &plan,
        2,
        &[
            "--data",
            s(&ds),
            "--iters",
            "8",
            "--log-every",
            "1",
            "--batch-size",
            "48",
        ],
    );
}

#[test]
fn the_fuse_dump_shows_cross_layers_and_an_export_compiles_back_to_them() {
    let dir = tempdir();
    let plan = dir.path().join("dcn.plan");
    let model = example("dlrm-dcnv2-tiny.json");
    let out = ok(
        DLRMC,
        &[
            "compile",
            s(&model),
            "-o",
            s(&plan),
            "-q",
            "--dump-ir",
            "fuse",
        ],
    );
    let dump = String::from_utf8(out.stdout).expect("utf-8");
    // Each layer's two products are blocked GEMMs (the first without a bias),
    // its gradient brgemm_dgrad / brgemm_wgrad reusing the forward's z and w.
    for l in 0..2 {
        for want in [
            format!("%cross.{l}.z: f32[1,B,4] = brgemm %"),
            format!(
                "%cross.{l}.w: f32[1,B,32] = brgemm %cross.{l}.z, %cross.{l}.u.blk, %cross.{l}.b"
            ),
            format!("= brgemm_wgrad %d.cross.{l}.g, %cross.{l}.z {{act=none, n=32}}"),
        ] {
            assert!(dump.contains(&want), "no `{want}` in the fuse dump: {dump}");
        }
    }
    for op in ["= cross_mix ", "= cross_mix_grad ", "= brgemm_dgrad "] {
        assert!(dump.contains(op), "no `{op}` in the fuse dump: {dump}");
    }
    for op in ["= cross ", "= cross_grad ", "= cross_save "] {
        assert!(!dump.contains(op), "`{op}` left in the fuse dump: {dump}");
    }
    // Without optimisation the training graph keeps each layer's z and w for
    // its gradient instead.
    let plain = dir.path().join("o0.plan");
    let out = ok(
        DLRMC,
        &[
            "compile",
            s(&model),
            "-o",
            s(&plain),
            "-q",
            "-O0",
            "--dump-ir",
            "dce",
        ],
    );
    let dump = String::from_utf8(out.stdout).expect("utf-8");
    for op in ["= cross ", "= cross_save ", "= cross_grad_saved "] {
        assert!(dump.contains(op), "no `{op}` in the -O0 dump: {dump}");
    }
    let onnx = dir.path().join("dcn.onnx");
    ok(DLRMC, &["export", s(&plan), "-o", s(&onnx)]);
    let back = dir.path().join("back.plan");
    compile(&onnx, &back, &[]);
    let inspect = String::from_utf8(ok(DLRMC, &["inspect", s(&back)]).stdout).expect("utf-8");
    assert!(
        inspect.contains("cross_mix_grad"),
        "the import did not find the cross layers: {inspect}"
    );
    ok(DLRM_RUN, &[s(&back), "--ranks", "2", "--iters", "5", "-q"]);
}

/// A plan trained with (row-wise) Adagrad serves `--infer --inputs` (its
/// accumulators are training state the inference graph does not declare; they
/// were once passed to it and refused), and its outputs equal the interpreter's
/// run of the exported-and-reimported model's inference graph.
#[test]
fn an_adagrad_plan_serves_inputs_and_matches_its_export() {
    use dlrm_ir::Tensor;
    let dir = tempdir();
    let plan = dir.path().join("dcn.plan");
    compile(&example("dlrm-dcnv2-tiny.json"), &plan, &[]);
    let (s_, d) = (5usize, 4usize);
    let ids = |rows: i64, l: usize, salt: i64| {
        Tensor::i64(
            vec![s_, l],
            (0..(s_ * l) as i64)
                .map(|i| (i * 7 + salt) % rows)
                .collect(),
        )
    };
    let dense: Vec<f32> = (0..s_ * d).map(|i| (i as f32 * 0.37).sin()).collect();
    let inputs = vec![
        ("dense".to_string(), Tensor::f32(vec![s_, d], dense)),
        ("idx.0".to_string(), ids(50, 3, 1)),
        ("idx.1".to_string(), ids(30, 1, 2)),
        ("idx.2".to_string(), ids(20, 2, 3)),
    ];
    let (inp, out) = (dir.path().join("in.npz"), dir.path().join("out.npz"));
    dlrm_onnx::npz::write(&inp, &inputs).expect("write inputs");
    ok(
        DLRM_RUN,
        &[
            s(&plan),
            "--infer",
            "--inputs",
            s(&inp),
            "--outputs",
            s(&out),
            "-q",
        ],
    );
    let got = dlrm_onnx::npz::read(&out).expect("outputs");
    let prob = got[0].1.to_f32_vec();
    assert_eq!(prob.len(), s_);
    assert!(prob.iter().all(|p| (0.0..=1.0).contains(p)), "{prob:?}");
    // The same inputs through the export, compiled back, served the same way.
    let onnx = dir.path().join("dcn.onnx");
    ok(DLRMC, &["export", s(&plan), "-o", s(&onnx), "-q"]);
    let back = dir.path().join("back.plan");
    compile(&onnx, &back, &[]);
    let out2 = dir.path().join("out2.npz");
    ok(
        DLRM_RUN,
        &[
            s(&back),
            "--infer",
            "--inputs",
            s(&inp),
            "--outputs",
            s(&out2),
            "-q",
        ],
    );
    let again = dlrm_onnx::npz::read(&out2).expect("outputs")[0]
        .1
        .to_f32_vec();
    let d = max_rel(&prob, &again, 1e-7);
    assert!(
        d <= 1e-5,
        "export differs by {d} rel: {prob:?} vs {again:?}"
    );
}

/// `examples/dlrm-dcnv2-tiny.json` with `"bags": "offsets"` (ids and offsets per
/// table, no `pooling`): bags of any size, synthetic (1 to 5 ids) at 1 and 3
/// ranks and from a multi-hot `.ds` of 1 to 6 ids at 1 and 2 ranks; an explicit
/// `pooling` with offsets is refused naming the field.
#[test]
fn dcnv2_with_offsets_bags_trains_on_variable_bags() {
    let dir = tempdir();
    let text = std::fs::read_to_string(example("dlrm-dcnv2-tiny.json")).expect("example");
    let mut v: serde_json::Value = serde_json::from_str(&text).expect("json");
    let with_pooling = v.clone();
    v["bags"] = "offsets".into();
    v.as_object_mut().expect("object").remove("pooling");
    let model = dir.path().join("dcn-off.json");
    std::fs::write(&model, v.to_string()).expect("write");
    let plan = dir.path().join("dcn-off.plan");
    compile(&model, &plan, &[]);
    let inspect = String::from_utf8(ok(DLRMC, &["inspect", s(&plan)]).stdout).expect("utf-8");
    assert!(inspect.contains("offsets of %emb.0"), "{inspect}");
    let losses = agree(
        &plan,
        3,
        &["--iters", "60", "--log-every", "10", "--pooling", "1-5"],
    );
    assert!(losses.iter().all(|l| l.is_finite()));
    let ds = dir.path().join("mh.ds");
    let generate = [
        "data", "generate", "--rows", "600", "--dense", "4", "--tables", "50,30,20",
    ];
    ok(
        DLRMC,
        &[&generate[..], &["--pooling", "1-6", "-o", s(&ds), "-q"]].concat(),
    );
    agree(
        &plan,
        2,
        &[
            "--data",
            s(&ds),
            "--iters",
            "6",
            "--log-every",
            "1",
            "--batch-size",
            "48",
        ],
    );
    let mut bad = with_pooling;
    bad["bags"] = "offsets".into();
    let bad_model = dir.path().join("bad.json");
    std::fs::write(&bad_model, bad.to_string()).expect("write");
    let err = common::fails(
        DLRMC,
        &["compile", s(&bad_model), "-o", s(&dir.path().join("x"))],
    );
    assert!(err.contains("pooling") && err.contains("offsets"), "{err}");
}

/// `--precision bf16` (with SGD: bf16 with Adagrad is refused) stores the cross
/// layers' weights bf16 under Split-SGD-BF16 and their blocked activations bf16,
/// so every GEMM of a layer runs on bf16 operands; it trains at 1 and 2 ranks
/// alike with a falling loss.
#[test]
fn bf16_cross_layers_run_on_bf16_operands_and_train() {
    let dir = tempdir();
    let plan = dir.path().join("dcn16.plan");
    let model = example("dlrm-dcnv2-tiny.json");
    let out = ok(
        DLRMC,
        &[
            "compile",
            s(&model),
            "-o",
            s(&plan),
            "-q",
            "--precision",
            "bf16",
            "--optimizer",
            "sgd",
            "--dump-ir",
            "dce",
        ],
    );
    let dump = String::from_utf8(out.stdout).expect("utf-8");
    for want in [
        "%cross.0.z: bf16[1,B,4] = brgemm %inter.blk, %cross.0.v {act=none}",
        // The mix in the second product's epilogue, `w` kept for the gradient.
        "%cross.1.blk: bf16[1,B,32], %cross.1.w: bf16[1,B,32] = cross_brgemm_save \
         %cross.1.z, %cross.1.u, %cross.1.b, %inter.blk, %cross.0.blk",
        // The residual and the layer below's product step in the dgrad's.
        "= cross_brgemm_dgrad %d.cross.1.t, %cross.1.v, %d.cross.1.blk, %inter.blk, %cross.0.w",
        "= split_sgd %cross.0.v, %cross.0.v.lo,",
        "%d.cross.0.t: bf16[1,B,4] = brgemm_dgrad",
    ] {
        assert!(dump.contains(want), "no `{want}` in the dump: {dump}");
    }
    // SGD learns more slowly than the example's Adagrad: 300 steps.
    let losses = agree(
        &plan,
        2,
        &["--iters", "300", "--log-every", "10", "--pooling", "3,1,2"],
    );
    let (head, tail) = (mean(&losses[..3]), mean(&losses[losses.len() - 3..]));
    assert!(tail < 0.8 * head, "the loss does not fall: {losses:?}");
}
