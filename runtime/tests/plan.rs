//! Plans on disk: round trip, atomic replacement, refusal to clobber, and the
//! errors of damaged plans.

mod common;

use common::*;
use dlrm_ir::{ParamValue, Tensor, text};
use dlrm_runtime::plan::{
    FailPoint, MANIFEST_FILE, WEIGHTS_FILE, read_manifest, write_plan_failing_at,
};
use dlrm_runtime::{Plan, RuntimeError, read_plan, write_plan};
use half::bf16;
use sha2::{Digest, Sha256};
use std::fs;
use std::path::Path;

fn bitwise_eq(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|((na, ta), (nb, tb))| {
            na == nb
                && ta.shape == tb.shape
                && ta.dtype() == tb.dtype()
                && match (&ta.data, &tb.data) {
                    (dlrm_ir::Data::F32(x), dlrm_ir::Data::F32(y)) => {
                        x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
                    }
                    (dlrm_ir::Data::BF16(x), dlrm_ir::Data::BF16(y)) => {
                        x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
                    }
                    (x, y) => x == y,
                }
        })
}

fn plan_with_all_dtypes() -> Plan {
    let mut p = plan(0.1);
    let extra = [
        (
            "extra.bf16",
            Tensor::bf16(vec![3], vec![bf16::from_f32(1.5), bf16::MIN, bf16::NAN]),
        ),
        (
            "extra.i64",
            Tensor::i64(vec![2, 2], vec![i64::MIN, -1, 0, i64::MAX]),
        ),
        ("extra.i32", Tensor::i32(vec![1], vec![-7])),
        ("extra.nan", Tensor::f32(vec![2], vec![f32::NAN, -0.0])),
    ];
    for (n, t) in extra {
        p.params.push((n.into(), ParamValue::Stored(t)));
    }
    p
}

fn leftovers(parent: &Path) -> Vec<String> {
    fs::read_dir(parent)
        .expect("parent")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect()
}

#[test]
fn round_trip_is_exact() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("out").join("tiny.plan");
    let p = plan_with_all_dtypes();
    write_plan(&dir, &p).expect("write");
    let back = read_plan(&dir).expect("read");
    assert_eq!(back.infer, p.infer);
    assert_eq!(back.train, p.train);
    assert!(
        bitwise_eq(
            &back.tensors().expect("back"),
            &p.tensors().expect("written")
        ),
        "params differ"
    );
    assert_eq!(
        (back.name, back.training, back.precision, back.pass_log),
        (p.name, p.training, p.precision, p.pass_log)
    );
    let m = read_manifest(&dir).expect("manifest");
    assert_eq!((m.format.as_str(), m.version), ("dlrmc-plan", 2));
    assert!(m.created_by.starts_with("dlrm-runtime "));
    assert_eq!(m.params.len(), p.params.len());
    assert_eq!(m.params[0].dtype, "f32");
    let weights = fs::read(dir.join(WEIGHTS_FILE)).expect("weights");
    let hex: String = Sha256::digest(&weights)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(m.weights.sha256, hex);
    assert_eq!(
        fs::read_to_string(dir.join("infer.ir")).expect("ir"),
        text::print(&p.infer)
    );
    assert!(leftovers(&tmp.path().join("out")).is_empty());
}

#[test]
fn inference_only_plan_has_no_train_file() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("p");
    let mut p = plan(0.1);
    p.train = None;
    write_plan(&dir, &p).expect("write");
    assert!(!dir.join("train.ir").exists());
    assert_eq!(read_plan(&dir).expect("read").train, None);
}

#[test]
fn an_existing_plan_is_replaced() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("p");
    write_plan(&dir, &plan(0.1)).expect("first");
    let mut second = plan(0.2);
    second.name = "second".into();
    write_plan(&dir, &second).expect("second");
    assert_eq!(read_plan(&dir).expect("read").name, "second");
    assert!(
        leftovers(tmp.path()).is_empty(),
        "{:?}",
        leftovers(tmp.path())
    );
}

#[test]
fn a_failed_write_leaves_the_existing_plan_intact() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("p");
    let old = plan(0.1);
    write_plan(&dir, &old).expect("first");
    let snapshot = |d: &Path| -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<_> = fs::read_dir(d)
            .expect("dir")
            .map(|e| {
                let e = e.expect("entry");
                (
                    e.file_name().to_string_lossy().into_owned(),
                    fs::read(e.path()).expect("file"),
                )
            })
            .collect();
        v.sort();
        v
    };
    let before = snapshot(&dir);
    let mut new = plan(0.3);
    new.name = "new".into();
    for at in [
        FailPoint::AfterWeights,
        FailPoint::BeforeSwap,
        FailPoint::AfterOldMovedAside,
    ] {
        let err = write_plan_failing_at(&dir, &new, at).expect_err("injected");
        assert!(err.to_string().contains("injected"), "{err}");
        assert_eq!(snapshot(&dir), before, "{at:?} damaged the plan");
        assert!(
            leftovers(tmp.path()).is_empty(),
            "{at:?} left {:?}",
            leftovers(tmp.path())
        );
    }
    // An inconsistent plan (data length does not match the shape) fails before any write.
    let mut bad = plan(0.3);
    if let ParamValue::Stored(t) = &mut bad.params[0].1 {
        t.shape = vec![51, 4];
    }
    let err = write_plan(&dir, &bad).expect_err("bad param");
    assert!(
        matches!(&err, RuntimeError::Param { name, .. } if name == "emb.0"),
        "{err}"
    );
    // A graph declaring a parameter the plan lacks, too.
    let mut bad = plan(0.3);
    bad.params.retain(|(n, _)| n != "top.1.b");
    assert!(matches!(
        write_plan(&dir, &bad),
        Err(RuntimeError::Param { .. })
    ));
    assert_eq!(snapshot(&dir), before);
    assert_eq!(read_plan(&dir).expect("still readable").name, old.name);
}

#[test]
fn refuses_to_replace_what_is_not_a_plan() {
    let tmp = tempfile::tempdir().expect("tmp");
    let file = tmp.path().join("file");
    fs::write(&file, b"precious").expect("file");
    let err = write_plan(&file, &plan(0.1)).expect_err("a file");
    assert!(err.to_string().contains("not a directory"), "{err}");
    assert_eq!(fs::read(&file).expect("file"), b"precious");
    let dir = tmp.path().join("dir");
    fs::create_dir(&dir).expect("dir");
    fs::write(dir.join("notes.txt"), b"mine").expect("notes");
    let err = write_plan(&dir, &plan(0.1)).expect_err("a non-plan dir");
    assert!(err.to_string().contains("not a dlrmc plan"), "{err}");
    assert!(dir.join("notes.txt").exists());
    // An empty directory holds nothing to lose.
    let empty = tmp.path().join("empty");
    fs::create_dir(&empty).expect("empty");
    write_plan(&empty, &plan(0.1)).expect("empty dir");
    read_plan(&empty).expect("read");
}

fn written() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("p");
    write_plan(&dir, &plan(0.1)).expect("write");
    (tmp, dir)
}

#[test]
fn corrupted_weights_are_detected_and_named() {
    let (_tmp, dir) = written();
    let path = dir.join(WEIGHTS_FILE);
    let mut bytes = fs::read(&path).expect("weights");
    let n = bytes.len();
    bytes[n - 3] ^= 0x40; // a bit of the last tensor's data
    fs::write(&path, &bytes).expect("corrupt");
    let err = read_plan(&dir).expect_err("checksum");
    assert!(
        matches!(&err, RuntimeError::Checksum { file, .. } if file.ends_with(WEIGHTS_FILE)),
        "{err}"
    );
    assert!(err.to_string().contains(WEIGHTS_FILE));
    // A truncated file (which does not even parse) is a checksum error too.
    fs::write(&path, &bytes[..n / 2]).expect("truncate");
    let err = read_plan(&dir).expect_err("truncated");
    assert!(matches!(&err, RuntimeError::Checksum { .. }), "{err}");
}

#[test]
fn corrupted_ir_is_detected_and_named() {
    let (_tmp, dir) = written();
    let path = dir.join("train.ir");
    let src = fs::read_to_string(&path).expect("ir");
    fs::write(&path, src.replacen("lr=", "lr=1", 1)).expect("edit");
    let err = read_plan(&dir).expect_err("checksum");
    assert!(
        matches!(&err, RuntimeError::Checksum { file, .. } if file.ends_with("train.ir")),
        "{err}"
    );
}

/// Rewrites a file of the plan and fixes its checksum in the manifest (a plan that
/// is consistent on disk but wrong inside).
fn replace_with_valid_checksum(dir: &Path, file: &str, contents: &[u8]) {
    fs::write(dir.join(file), contents).expect("write");
    let hex: String = Sha256::digest(contents)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mpath = dir.join(MANIFEST_FILE);
    let mut m: serde_json::Value =
        serde_json::from_slice(&fs::read(&mpath).expect("m")).expect("json");
    let slot = match file {
        "infer.ir" => &mut m["graphs"]["infer"],
        "train.ir" => &mut m["graphs"]["train"],
        _ => &mut m["weights"],
    };
    slot["sha256"] = serde_json::Value::String(hex);
    fs::write(&mpath, serde_json::to_vec(&m).expect("json")).expect("manifest");
}

#[test]
fn unparsable_ir_names_the_file_and_line() {
    let (_tmp, dir) = written();
    replace_with_valid_checksum(&dir, "infer.ir", b"graph @x {\n  input %a: f32[B,\n}\n");
    let err = read_plan(&dir).expect_err("parse");
    match &err {
        RuntimeError::Parse { file, source } => {
            assert!(file.ends_with("infer.ir"));
            assert!(
                matches!(source, dlrm_ir::IrError::Parse { line: 2 | 3, .. }),
                "{source}"
            );
        }
        other => panic!("wrong error {other}"),
    }
}

#[test]
fn graph_params_must_be_in_the_weights_with_their_type() {
    let (_tmp, dir) = written();
    let src = fs::read_to_string(dir.join("infer.ir")).expect("ir");
    // Declare emb.1 with another row count.
    let edited = src.replace("%emb.1: f32[30,4]", "%emb.1: f32[31,4]");
    assert_ne!(edited, src, "the printed form names the parameter type");
    replace_with_valid_checksum(&dir, "infer.ir", edited.as_bytes());
    let err = read_plan(&dir).expect_err("shape");
    assert!(
        matches!(&err, RuntimeError::Param { name, .. } if name == "emb.1"),
        "{err}"
    );
    // A parameter missing from the weights.
    let (_tmp2, dir2) = written();
    let src = fs::read_to_string(dir2.join("infer.ir")).expect("ir");
    let edited = src
        .replacen("param %emb.1", "param %emb.9", 1)
        .replace("%emb.1,", "%emb.9,");
    replace_with_valid_checksum(&dir2, "infer.ir", edited.as_bytes());
    let err = read_plan(&dir2).expect_err("missing");
    assert!(
        matches!(&err, RuntimeError::Param { name, reason } if name == "emb.9" && reason.contains("missing")),
        "{err}"
    );
}

#[test]
fn missing_or_foreign_plans_are_clear_errors() {
    let tmp = tempfile::tempdir().expect("tmp");
    let err = read_plan(&tmp.path().join("nope")).expect_err("missing");
    assert!(err.to_string().contains("no such plan directory"), "{err}");
    let err = read_plan(tmp.path()).expect_err("no manifest");
    assert!(err.to_string().contains("missing manifest.json"), "{err}");
    let (_t, dir) = written();
    let mpath = dir.join(MANIFEST_FILE);
    let m: serde_json::Value = serde_json::from_slice(&fs::read(&mpath).expect("m")).expect("json");
    let mut wrong = m.clone();
    wrong["format"] = "onnx".into();
    fs::write(&mpath, wrong.to_string()).expect("w");
    assert!(
        read_plan(&dir)
            .expect_err("format")
            .to_string()
            .contains("not a dlrmc plan")
    );
    let mut wrong = m.clone();
    wrong["version"] = 3.into();
    fs::write(&mpath, wrong.to_string()).expect("w");
    let err = read_plan(&dir).expect_err("version");
    assert!(
        err.to_string().contains("version 3 is not supported"),
        "{err}"
    );
    fs::write(&mpath, b"{not json").expect("w");
    assert!(
        read_plan(&dir)
            .expect_err("json")
            .to_string()
            .contains("not valid JSON")
    );
    fs::remove_file(dir.join("train.ir")).expect("rm");
    fs::write(&mpath, m.to_string()).expect("w");
    let err = read_plan(&dir).expect_err("missing file");
    assert!(err.to_string().contains("train.ir"), "{err}");
}

/// A version-1 plan (every parameter stored, no `init`: the format before tables
/// were described) still reads, with its weights.
#[test]
fn version_1_plans_still_read() {
    let (_t, dir) = written();
    let mpath = dir.join(MANIFEST_FILE);
    let mut m: serde_json::Value =
        serde_json::from_slice(&fs::read(&mpath).expect("m")).expect("json");
    assert_eq!(m["version"], 2);
    m["version"] = 1.into();
    fs::write(&mpath, m.to_string()).expect("w");
    let back = read_plan(&dir).expect("a version-1 plan reads");
    assert_eq!(back.params, plan(0.1).params);
}

/// A uniform description of a 50x4 table (`emb.0`'s shape).
fn described() -> dlrm_ir::Described {
    dlrm_ir::Described {
        init: dlrm_ir::Init::Uniform { bound: 0.5 },
        seed: 9,
        stream: 0,
        shape: vec![50, 4],
        part: dlrm_ir::Part::F32,
        blocked: None,
    }
}

/// A described parameter round-trips through the manifest (not the weights file)
/// and is created with the values its description gives; a manifest whose
/// description disagrees with the entry's shape is refused.
#[test]
fn described_parameters_live_in_the_manifest() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("p");
    let mut p = plan(0.1);
    let d = described();
    let want = d.materialize("emb.0").expect("created");
    p.params[0].1 = ParamValue::Described(d.clone());
    write_plan(&dir, &p).expect("write");
    let m: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.join(MANIFEST_FILE)).expect("m")).expect("json");
    assert_eq!(m["params"][0]["init"]["init"]["kind"], "uniform");
    let back = read_plan(&dir).expect("read");
    assert_eq!(back.params[0].1, ParamValue::Described(d));
    assert_eq!(back.tensors().expect("tensors")[0].1, want);
    let mut bad = m.clone();
    bad["params"][0]["init"]["shape"] = serde_json::json!([51, 4]);
    fs::write(dir.join(MANIFEST_FILE), bad.to_string()).expect("w");
    let err = read_plan(&dir).expect_err("mismatch");
    assert!(err.to_string().contains("initializer gives"), "{err}");
}

/// Issue 42: the manifest's meaning is sealed (editing a described parameter's
/// seed is refused at load) and its enumerated fields are enums (an unknown
/// precision is refused, naming the field and the value).
#[test]
fn an_edited_manifest_is_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("p");
    let mut p = plan(0.1);
    p.params[0].1 = ParamValue::Described(described());
    write_plan(&dir, &p).expect("write");
    let mpath = dir.join(MANIFEST_FILE);
    let m: serde_json::Value = serde_json::from_slice(&fs::read(&mpath).expect("m")).expect("json");
    assert!(m["seal"].is_string(), "{m}");
    // A cosmetic field is not sealed.
    let mut cosmetic = m.clone();
    cosmetic["created_by"] = "someone else".into();
    fs::write(&mpath, cosmetic.to_string()).expect("w");
    read_plan(&dir).expect("created_by is cosmetic");
    let mut seed = m.clone();
    seed["params"][0]["init"]["seed"] = 10.into();
    fs::write(&mpath, seed.to_string()).expect("w");
    let err = read_plan(&dir).expect_err("sealed").to_string();
    assert!(
        err.contains("manifest.json") && err.contains("do not match its seal"),
        "{err}"
    );
    let mut precision = m.clone();
    precision["precision"] = "xp32".into();
    fs::write(&mpath, precision.to_string()).expect("w");
    let err = read_manifest(&dir).expect_err("enum").to_string();
    assert!(err.contains("precision `xp32`: unknown variant"), "{err}");
    let mut unsealed = m.clone();
    unsealed.as_object_mut().expect("object").remove("seal");
    fs::write(&mpath, unsealed.to_string()).expect("w");
    read_plan(&dir).expect("a manifest written before seals still reads");
}
