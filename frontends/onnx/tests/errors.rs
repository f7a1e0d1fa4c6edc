//! Bad input: corrupt and truncated files, missing or escaping external data, old
//! opsets, unsupported loops — each an error naming what is wrong; and a property
//! test: no mutation of a valid model's bytes makes the importer panic.

#![expect(clippy::unwrap_used, reason = "tests fail loudly")]

use proptest::prelude::*;
use std::path::{Path, PathBuf};

fn case(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("test_cases")
        .join(name)
}

fn model_bytes(name: &str) -> Vec<u8> {
    std::fs::read(case(name).join("model.onnx")).unwrap()
}

#[test]
fn truncated_file_is_a_decode_error() {
    let b = model_bytes("dlrm_dot");
    let err = dlrm_onnx::from_bytes(&b[..b.len() / 2], "m.onnx", None)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("m.onnx: not a valid ONNX model (truncated or corrupt"),
        "{err}"
    );
}

#[test]
fn missing_file_is_an_io_error() {
    let err = dlrm_onnx::load(Path::new("/nonexistent/m.onnx"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot read"), "{err}");
}

fn copy_external(to: &Path) {
    for f in ["model.onnx", "weights.bin"] {
        std::fs::copy(case("external_data").join(f), to.join(f)).unwrap();
    }
}

#[test]
fn missing_external_data_file_names_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    copy_external(dir.path());
    std::fs::remove_file(dir.path().join("weights.bin")).unwrap();
    let err = dlrm_onnx::load(&dir.path().join("model.onnx"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tensor `") && err.contains("missing external data file"),
        "{err}"
    );
}

#[test]
fn truncated_external_data_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    copy_external(dir.path());
    let w = dir.path().join("weights.bin");
    let len = std::fs::metadata(&w).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&w)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let err = dlrm_onnx::load(&dir.path().join("model.onnx"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("too short"), "{err}");
}

#[test]
fn external_data_outside_the_model_folder_is_refused() {
    let b = model_bytes("external_data");
    // Same length as `weights.bin`, so the protobuf stays valid.
    let patched = replace(&b, b"weights.bin", b"../etc/pwd_");
    let err = dlrm_onnx::from_bytes(&patched, "m.onnx", Some(&case("external_data")))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("must be a relative path inside the model's folder"),
        "{err}"
    );
    let abs = replace(&b, b"weights.bin", b"/etc/passwd");
    let err = dlrm_onnx::from_bytes(&abs, "m.onnx", Some(&case("external_data")))
        .unwrap_err()
        .to_string();
    assert!(err.contains("inside the model's folder"), "{err}");
}

fn replace(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let mut out = hay.to_vec();
    let mut i = 0;
    let mut n = 0;
    while i + from.len() <= out.len() {
        if &out[i..i + from.len()] == from {
            out[i..i + from.len()].copy_from_slice(to);
            n += 1;
        }
        i += 1;
    }
    assert!(n > 0);
    out
}

#[test]
fn old_opset_is_refused() {
    let b = model_bytes("ebag_torchscript"); // opset 11
    // The opset_import entry is `{domain: "", version: 11}`: tag 0x10 then 11.
    let p = b.windows(2).rposition(|w| w == [0x10, 11]).unwrap();
    let mut m = b.clone();
    m[p + 1] = 9;
    let err = dlrm_onnx::from_bytes(&m, "m.onnx", None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("opset 9 is not supported"), "{err}");
}

#[test]
fn unrecognised_loop_names_the_node() {
    let b = model_bytes("ebag_torchscript");
    // Turn the body's ReduceSum into ReduceMax (same length): no longer a bag.
    let m = replace(&b, b"ReduceSum", b"ReduceMax");
    let err = dlrm_onnx::from_bytes(&m, "m.onnx", None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`/EmbeddingBag/Loop` (Loop): unsupported Loop"),
        "{err}"
    );
}

/// TorchRec's `KeyedJaggedTensor.to_dict()` whose per-key offsets are not the
/// prefix sums of the lengths (`CumSum` made `CumMax`, the same length of name):
/// the bag loop is refused naming the loop and what its bounds are not.
#[test]
fn jagged_bags_over_other_bounds_name_the_loop() {
    for (name, node) in [
        (
            "real/ts17_torchrec_dcn",
            "`/model/sparse_arch/embedding_bag_collection/t0/Loop` (Loop)",
        ),
        ("real/dynamo_torchrec_dcn", "`n19_2` (Loop)"),
    ] {
        let m = replace(&model_bytes(name), b"CumSum", b"CumMax");
        let err = dlrm_onnx::from_bytes(&m, "m.onnx", None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(node)
                && err.contains("the indices are `values` sliced at prefix sums of `lengths`")
                && err.contains("nor a row of the lengths' per-row offsets"),
            "{name}: {err}"
        );
    }
}

#[test]
fn npz_round_trip() {
    use dlrm_ir::Tensor;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.npz");
    let arrays = vec![
        (
            "x".to_string(),
            Tensor::f32(vec![2, 3], vec![1., 2., 3., 4., 5., 6.]),
        ),
        ("idx.0".to_string(), Tensor::i64(vec![3], vec![7, -1, 0])),
        ("n".to_string(), Tensor::i32(vec![], vec![5])),
    ];
    dlrm_onnx::npz::write(&p, &arrays).unwrap();
    assert_eq!(dlrm_onnx::npz::read(&p).unwrap(), arrays);
    let err = dlrm_onnx::npz::read(&case("dlrm_dot").join("model.onnx"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a zip archive"), "{err}");
}

proptest! {
    // 256 cases by default; PROPTEST_CASES=N runs more.
    #![proptest_config(ProptestConfig::default())]
    /// Mutated models (byte flips, truncation, insertions) give `Ok` or `Err`, never
    /// a panic.
    #[test]
    fn mutated_bytes_never_panic(
        which in 0usize..7,
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..8),
    ) {
        let name = [
            "dlrm_dot",
            "dlrm_cat",
            "ebag_torchscript_weighted",
            "ebag_dynamo",
            "dlrm_pytorch",
            "real/ts17_torchrec_dcn",
            "real/dynamo_torchrec_dcn",
        ][which];
        let mut b = model_bytes(name);
        for (at, byte, kind) in edits {
            if b.is_empty() { break; }
            let i = at.index(b.len());
            match kind {
                0 => b[i] = byte,
                1 => b.truncate(i),
                _ => b.insert(i, byte),
            }
        }
        let _ = dlrm_onnx::from_bytes(&b, "fuzz.onnx", None);
    }
}

#[test]
fn ir_names_of_onnx_names() {
    assert_eq!(dlrm_onnx::ir_name("idx_0"), "idx_0");
    assert_eq!(dlrm_onnx::ir_name("emb.0.weight"), "emb.0.weight");
    assert_eq!(
        dlrm_onnx::ir_name("/bot/Gemm_output_0"),
        "_bot_Gemm_output_0"
    );
    assert_eq!(dlrm_onnx::ir_name("input:0"), "input_0");
    assert_eq!(dlrm_onnx::ir_name("0x"), "v0x");
}

/// Inputs the fuzzer (`scripts/fuzz onnx`) found to panic the importer, kept as
/// regression cases: each is now an error (`test_cases/fuzz/`).
#[test]
fn fuzzer_findings_are_errors() {
    // A `Slice` with more starts than its operand has axes, and no axes input.
    let b = std::fs::read(case("fuzz").join("slice_starts_past_rank.onnx")).unwrap();
    let err = dlrm_onnx::from_bytes(&b, "m.onnx", None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("Slice") || err.contains("starts"), "{err}");
    // A bag `Loop` whose loop-invariant operand is produced through a cycle
    // (`val_6` feeds itself): the bag recogniser followed producers without
    // bound and overflowed the stack (fuzzer, seed 11, 2026-11-29).
    let b = std::fs::read(case("fuzz").join("loop_bag_cycle.onnx")).unwrap();
    let err = dlrm_onnx::from_bytes(&b, "m.onnx", None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`val_6`: too many producers followed"),
        "{err}"
    );
}
