//! Real exports: every case under `test_cases/real/` is a reference-style DLRM (or a
//! TorchRec-style one) exported by PyTorch's own `torch.onnx.export`
//! (`test_cases/real/export_pytorch.py`), with PyTorch's own outputs at batch sizes
//! 1, 7 and 2048. Each imports with every `Loop` recognised as an EmbeddingBag
//! (one bag op per table, no generic loop left) and runs through the reference
//! interpreter to PyTorch's outputs within 1e-5 at every batch size, so the batch and
//! index counts change at run time.
//!
//! Cases the importer cannot take yet are listed in `NOT_YET` with the reason; the
//! test checks they still fail with that reason, so a fix shows up as a failure to
//! update the list.

#![expect(clippy::unwrap_used, reason = "tests fail loudly")]

use dlrm_ir::interp::{bind_symbols, run};
use dlrm_ir::{SingleRank, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Cases that do not import yet, and a fragment of the error they give.
const NOT_YET: &[(&str, &str)] = &[];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("test_cases/real")
}

fn cases() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root())
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            e.path()
                .join("model.onnx")
                .exists()
                .then(|| e.file_name().to_string_lossy().into_owned())
        })
        .collect();
    v.sort();
    v
}

fn npz(path: &Path) -> Vec<(String, Tensor)> {
    dlrm_onnx::npz::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn batches(dir: &Path) -> Vec<usize> {
    let case: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
    case["batches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_u64().unwrap() as usize)
        .collect()
}

/// Imports a case and checks it against PyTorch at every batch size; returns the
/// number of bag ops.
fn check(name: &str) -> Result<usize, String> {
    check_dir(&root().join(name), name)
}

/// [`check`] of the case in `dir`.
fn check_dir(dir: &Path, name: &str) -> Result<usize, String> {
    let m = dlrm_onnx::load(&dir.join("model.onnx")).map_err(|e| e.to_string())?;
    let bags = m
        .graph
        .nodes()
        .iter()
        .filter(|n| n.op.mnemonic().starts_with("embedding_bag"))
        .count();
    for b in batches(dir) {
        let ins: HashMap<String, Tensor> = npz(&dir.join(format!("inputs_{b}.npz")))
            .into_iter()
            .map(|(k, v)| (dlrm_onnx::ir_name(&k), v))
            .collect();
        let want = npz(&dir.join(format!("outputs_{b}.npz")));
        let mut params: HashMap<String, Tensor> = m.params.iter().cloned().collect();
        let syms = bind_symbols(&m.graph, &ins, &params).map_err(|e| format!("batch {b}: {e}"))?;
        let got = run(&m.graph, &ins, &mut params, &syms, &SingleRank)
            .map_err(|e| format!("batch {b}: {e}"))?;
        assert_eq!(got.len(), want.len(), "{name}: output count");
        for ((_, w), g) in want.iter().zip(&got) {
            assert_eq!(w.shape, g.shape, "{name} batch {b}: output shape");
            let max = w
                .to_f32_vec()
                .iter()
                .zip(g.to_f32_vec())
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(
                max <= 1e-5,
                "{name} batch {b}: differs from PyTorch by {max}"
            );
        }
    }
    Ok(bags)
}

#[test]
fn every_real_export_matches_pytorch_at_every_batch_size() {
    let all = cases();
    assert!(
        all.len() >= 15,
        "expected the committed real exports, found {all:?}"
    );
    let mut failures = Vec::new();
    for name in &all {
        let expected_failure = NOT_YET.iter().find(|(n, _)| n == name).map(|(_, e)| *e);
        match (check(name), expected_failure) {
            (Ok(bags), None) => {
                // Three tables unless the case says otherwise (the reference's
                // Kaggle mode: 26).
                let meta: serde_json::Value = serde_json::from_str(
                    &std::fs::read_to_string(root().join(name).join("case.json"))
                        .expect("case.json"),
                )
                .expect("case.json is JSON");
                let tables = meta["tables"].as_u64().unwrap_or(3) as usize;
                assert_eq!(bags, tables, "{name}: one bag op per table");
            }
            (Err(e), Some(frag)) if e.contains(frag) => {}
            (Ok(_), Some(frag)) => failures.push(format!(
                "{name}: imports now (was expected to fail with `{frag}`): update NOT_YET"
            )),
            (Err(e), _) => failures.push(format!("{name}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// TorchRec's own `DLRM_DCN` with other numbers of keys than the 3 of
/// `{ts17,dynamo}_torchrec_dcn` (`test_cases/torchrec_keys/`, made by
/// `real/export_torchrec.py --rows .. --batches 1,7`): 5 tables through the
/// TorchScript exporter (an `Add` chain of 5 id counts), 2 through dynamo (a
/// `Split` of the values in 2). Each imports with one `embedding_bag`
/// (last_offset, over `offsets_from_lengths`) per table and matches TorchRec.
#[test]
fn torchrec_dcn_with_2_and_5_keys_matches_torchrec() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("test_cases/torchrec_keys");
    for (name, tables) in [("ts17_torchrec_dcn_k5", 5), ("dynamo_torchrec_dcn_k2", 2)] {
        let bags = check_dir(&dir.join(name), name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(bags, tables, "{name}");
        let m = dlrm_onnx::load(&dir.join(name).join("model.onnx")).unwrap();
        let offsets: Vec<_> = m
            .graph
            .nodes()
            .iter()
            .filter_map(|n| match n.op {
                dlrm_ir::Op::OffsetsFromLengths { keys, key } => Some((keys, key)),
                _ => None,
            })
            .collect();
        let want: Vec<_> = (0..tables).map(|k| (tables, k)).collect();
        assert_eq!(offsets, want, "{name}: one key's offsets per table");
    }
}
