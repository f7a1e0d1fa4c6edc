//! `dlrm-serve` driven by a real client, Triton's `tritonclient[http]`, through
//! `serve/tests/client.py` (JSON and binary tensors against PyTorch's outputs,
//! concurrent requests against the same ones sent alone, a bad request).
//!
//! The client is installed with pip into a venv under the target directory
//! (`target/serve-venv`, made once and reused; `scripts/load-test` uses it too).
//! The test is skipped, saying so, only when pip cannot reach the package index;
//! any other failure to set it up fails the test.

#![expect(clippy::unwrap_used, reason = "tests fail loudly")]

mod common;

use common::{case, plan, start};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The venv's python with tritonclient and numpy, or why there is none.
fn client_python() -> Result<PathBuf, String> {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("../serve-venv");
    let python = venv.join("bin/python");
    let ready = |p: &Path| {
        Command::new(p)
            .args(["-c", "import tritonclient.http, numpy"])
            .status()
            .is_ok_and(|s| s.success())
    };
    if ready(&python) {
        return Ok(python);
    }
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .unwrap_or_else(|e| panic!("python3 -m venv {}: {e}", venv.display()));
    assert!(made.success(), "python3 -m venv {} failed", venv.display());
    let out = Command::new(venv.join("bin/pip"))
        .args(["install", "-q", "--disable-pip-version-check"])
        .args(["--retries", "1", "--timeout", "20"])
        .args(["tritonclient[http]", "numpy"])
        .output()
        .unwrap();
    if out.status.success() && ready(&python) {
        return Ok(python);
    }
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let offline = [
        "NewConnectionError",
        "Temporary failure in name resolution",
        "Network is unreachable",
        "Could not find a version that satisfies",
        "ConnectTimeoutError",
        "ProxyError",
    ];
    if offline.iter().any(|m| err.contains(m)) {
        return Err(err);
    }
    panic!("pip install tritonclient[http] numpy failed:\n{err}");
}

#[test]
fn tritonclient_drives_json_binary_and_concurrent_requests() {
    let python = match client_python() {
        Ok(p) => p,
        Err(why) => {
            println!("SKIPPED: pip cannot reach the package index for tritonclient:\n{why}");
            eprintln!("SKIPPED: pip cannot reach the package index for tritonclient");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let s = start(&plan(dir.path()), &["--max-delay-us", "20000"]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/client.py");
    let out = Command::new(&python)
        .arg(&script)
        .args(["--url", &s.addr, "--model", "dlrm", "--case"])
        .arg(case())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "client.py failed:\n{text}");
    assert!(text.contains("client.py: ok"), "{text}");
    println!("{text}");
}
