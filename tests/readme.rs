//! The README's quick start, executed: every `target/release/dlrmc` and
//! `target/release/dlrm-run` line of its first `sh` block under "## Quick start" runs
//! with this build's binaries, plans in a temporary directory instead of `/tmp`, and
//! `--iters` lowered to 3 so the test stays fast. Each must succeed.

mod common;

use common::{DLRM_RUN, DLRMC, root, tempdir};
use std::process::Command;

fn quick_start_commands(readme: &str) -> Vec<Vec<String>> {
    let section = readme
        .split("## Quick start")
        .nth(1)
        .expect("README has a Quick start section");
    let block = section
        .split("```sh")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("Quick start has a sh block");
    block
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("target/release/"))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

#[test]
fn readme_quick_start_runs() {
    let root = root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let commands = quick_start_commands(&readme);
    assert!(commands.len() >= 3, "quick start commands: {commands:?}");
    let tmp = tempdir();
    let tmp_s = format!("{}/", tmp.path().display());
    for cmd in commands {
        let bin = match cmd[0].as_str() {
            "target/release/dlrmc" => DLRMC,
            "target/release/dlrm-run" => DLRM_RUN,
            other => panic!("unknown binary in the README: {other}"),
        };
        let mut args: Vec<String> = cmd[1..]
            .iter()
            .map(|a| a.replace("/tmp/", &tmp_s))
            .collect();
        if let Some(i) = args.iter().position(|a| a == "--iters") {
            args[i + 1] = "3".into();
        }
        let out = Command::new(bin)
            .args(&args)
            .current_dir(root)
            .output()
            .expect("spawn");
        assert!(
            out.status.success(),
            "README command {cmd:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
