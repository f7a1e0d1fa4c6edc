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
    let dir = root().join(name);
    let m = dlrm_onnx::load(&dir.join("model.onnx")).map_err(|e| e.to_string())?;
    let bags = m
        .graph
        .nodes()
        .iter()
        .filter(|n| n.op.mnemonic().starts_with("embedding_bag"))
        .count();
    for b in batches(&dir) {
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
