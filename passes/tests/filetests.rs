//! Golden IR tests: every `*.ir` file under `tests/filetests/` (at the workspace
//! root) is a header, an input graph and the expected output of the passes.
//!
//! ```text
//! ; passes: fuse, dce          (required: pass ids, in order)
//! ; train: bce 0.1 [adagrad]   (optional: loss, learning rate and optimizer —
//!                               sgd, adagrad, rowwise_adagrad — for autodiff)
//! ; precision: bf16            (optional: fp32, bf16, mixed)
//! ; block: 16                  (optional: forced block size)
//! ; const: %idx = 1, 2, 5      (optional, repeatable: an i64[n] parameter's value,
//!                               for the `canon` rules that read constants)
//! graph @name { ... }          (the input)
//! ; expected:
//! graph @name { ... }          (the expected output, canonical text)
//! ```
//!
//! Options default to the optimised pipeline (embedding update fused). With
//! `BLESS=1` the expected section is rewritten with the actual output.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use dlrm_ir::Tensor;
use dlrm_passes::pipeline::run_passes_with;
use dlrm_passes::{AdagradConfig, LossKind, Optimizer, PipelineOptions, Precision, TrainConfig};
use std::path::{Path, PathBuf};

const EXPECTED: &str = "; expected:";

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "ir") {
            out.push(p);
        }
    }
}

/// Runs one file; returns (file text with the actual output, matched?).
fn run_file(path: &Path) -> Result<(String, bool), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let (head, expected) = match text.find(EXPECTED) {
        Some(i) => (&text[..i], Some(text[i + EXPECTED.len()..].trim())),
        None => (text.as_str(), None),
    };
    let mut opts = PipelineOptions::optimized(None);
    let mut passes: Vec<String> = Vec::new();
    let mut consts: Vec<(String, Tensor)> = Vec::new();
    for line in head.lines() {
        let Some(rest) = line.trim().strip_prefix(';') else {
            continue;
        };
        let Some((key, val)) = rest.split_once(':') else {
            continue;
        };
        let val = val.trim();
        match key.trim() {
            "passes" => passes = val.split(',').map(|s| s.trim().to_string()).collect(),
            "train" => {
                let mut it = val.split_whitespace();
                let loss = match it.next() {
                    Some("bce") => LossKind::Bce,
                    Some("mse") => LossKind::Mse,
                    other => return Err(format!("bad loss {other:?}")),
                };
                let lr = it
                    .next()
                    .and_then(|s| s.parse().ok())
                    .ok_or("train: needs a learning rate")?;
                // An optional optimizer with PyTorch's default hyper-parameters.
                let optimizer = match it.next() {
                    None | Some("sgd") => Optimizer::Sgd,
                    Some("adagrad") => Optimizer::Adagrad(AdagradConfig::default()),
                    Some("rowwise_adagrad") => Optimizer::RowwiseAdagrad(AdagradConfig::default()),
                    other => return Err(format!("bad optimizer {other:?}")),
                };
                opts.train = Some(TrainConfig {
                    loss,
                    lr,
                    optimizer,
                });
            }
            "precision" => {
                opts.precision = val.parse::<Precision>().map_err(|e| e.to_string())?;
            }
            "block" => opts.block = Some(val.parse().map_err(|_| "bad block")?),
            "const" => {
                let (name, vals) = val.split_once('=').ok_or("const: needs %name = values")?;
                let name = name.trim().trim_start_matches('%').to_string();
                let vals: Vec<i64> = vals
                    .split(',')
                    .map(|v| {
                        v.trim()
                            .parse()
                            .map_err(|_| format!("const: bad value `{v}`"))
                    })
                    .collect::<Result<_, String>>()?;
                consts.push((name, Tensor::i64(vec![vals.len()], vals)));
            }
            _ => {}
        }
    }
    if passes.is_empty() {
        return Err("no `; passes:` header".into());
    }
    let input: String = head
        .lines()
        .filter(|l| !l.trim_start().starts_with(';'))
        .collect::<Vec<_>>()
        .join("\n");
    let g = dlrm_ir::text::parse(&input).map_err(|e| format!("input: {e}"))?;
    let ids: Vec<&str> = passes.iter().map(String::as_str).collect();
    let params = (!consts.is_empty()).then_some(&mut consts);
    let (out, _) = run_passes_with(&g, &ids, &opts, params).map_err(|e| e.to_string())?;
    let actual = dlrm_ir::text::print(&out);
    let ok = expected.is_some_and(|e| e == actual.trim());
    Ok((
        format!("{}{EXPECTED}\n{actual}", head.trim_end().to_string() + "\n"),
        ok,
    ))
}

#[test]
fn filetests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/filetests");
    let mut all = Vec::new();
    files(&root, &mut all);
    assert!(!all.is_empty(), "no filetests under {}", root.display());
    let bless = std::env::var("BLESS").is_ok_and(|v| v == "1");
    let mut failures = Vec::new();
    for path in &all {
        match run_file(path) {
            Ok((_, true)) => {}
            Ok((new, false)) if bless => std::fs::write(path, new).unwrap(),
            Ok((new, false)) => failures.push(format!(
                "{}: output differs (BLESS=1 rewrites it); actual:\n{}",
                path.display(),
                new.split(EXPECTED).nth(1).unwrap_or("")
            )),
            Err(e) => failures.push(format!("{}: {e}", path.display())),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
