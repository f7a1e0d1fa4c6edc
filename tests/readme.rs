//! The README's commands, executed: every `target/release/dlrmc` and
//! `target/release/dlrm-run` line of every `sh` block of README.md runs, in order,
//! with this build's binaries, plans in a temporary directory instead of `/tmp`, and
//! `--iters` lowered to 3 so the test stays fast (later commands may use what earlier
//! ones wrote). Each must succeed. The quick start (the first `sh` block under
//! "## Quick start") must have at least three of them; a README command line that
//! names a binary without starting with it (e.g. under `mpirun`) is refused, since
//! this test could not run it: such commands belong in `docs/`.

mod common;

use common::{DLRM_RUN, DLRMC, root, tempdir};
use std::process::Command;

/// The binaries a README command may start with.
const BINARIES: [&str; 2] = ["target/release/dlrmc", "target/release/dlrm-run"];

/// The `sh` code blocks of a Markdown text, in order.
fn sh_blocks(markdown: &str) -> Vec<&str> {
    markdown
        .split("```sh")
        .skip(1)
        .map(|b| b.split("```").next().unwrap_or(""))
        .collect()
}

/// A block's command lines that run one of [`BINARIES`], split into words (a
/// trailing `# comment` dropped, `\` continuation lines joined).
fn commands(block: &str) -> Vec<Vec<String>> {
    let joined = block.replace("\\\n", " ");
    let mut out = Vec::new();
    for line in joined.lines().map(str::trim) {
        let line = line.split(" #").next().unwrap_or("").trim();
        if BINARIES.iter().any(|b| line.starts_with(b)) {
            out.push(line.split_whitespace().map(str::to_string).collect());
        } else {
            assert!(
                !line.contains("target/release/dlrm"),
                "README command `{line}` runs a binary this test cannot run as written \
                 (only lines starting with {BINARIES:?}); move it to docs/"
            );
        }
    }
    out
}

fn quick_start_commands(readme: &str) -> Vec<Vec<String>> {
    let section = readme
        .split("## Quick start")
        .nth(1)
        .expect("README has a Quick start section");
    let block = sh_blocks(section)
        .into_iter()
        .next()
        .expect("Quick start has a sh block");
    commands(block)
}

fn readme_commands(readme: &str) -> Vec<Vec<String>> {
    sh_blocks(readme).into_iter().flat_map(commands).collect()
}

#[test]
fn readme_quick_start_runs() {
    let root = root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let quick = quick_start_commands(&readme);
    assert!(quick.len() >= 3, "quick start commands: {quick:?}");
    let all = readme_commands(&readme);
    assert!(
        all.windows(quick.len()).any(|w| w == quick.as_slice()),
        "the quick start's commands are among the README's: {all:?}"
    );
    let tmp = tempdir();
    let tmp_s = format!("{}/", tmp.path().display());
    for cmd in all {
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

#[test]
fn readme_commands_are_found_in_every_sh_block() {
    let md = "intro\n```sh\ncargo build\ntarget/release/dlrmc a -o /tmp/x # note\n```\n\
              text `target/release/dlrm-run` inline\n```text\ntarget/release/dlrmc no\n```\n\
              ```sh\ntarget/release/dlrm-run /tmp/x \\\n  --iters 5\n```\n";
    let found = readme_commands(md);
    assert_eq!(
        found,
        vec![
            vec!["target/release/dlrmc", "a", "-o", "/tmp/x"],
            vec!["target/release/dlrm-run", "/tmp/x", "--iters", "5"],
        ]
    );
}

#[test]
#[should_panic(expected = "move it to docs/")]
fn readme_commands_under_mpirun_are_refused() {
    readme_commands("```sh\nmpirun -n 2 target/release/dlrm-run p --comm mpi\n```\n");
}
