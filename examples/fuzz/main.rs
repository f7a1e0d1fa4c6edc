//! A mutation fuzzer for every reader of `dlrmc` and `dlrm-run`, on the stable
//! toolchain: `scripts/fuzz TARGET SECONDS [SEED]` (or `cargo run --release
//! --example fuzz -- TARGET SECONDS [SEED]`), TARGET one of `onnx`, `ir`, `json`,
//! `npz`, `plan`, `ds`, `model`, `tsv`, `mlperf`, `calib`, `metrics`, or `all`; `scripts/fuzz TARGET replay FILE` runs one
//! input (a finding) again with its panic message in full.
//!
//! Each target starts from a seed corpus of the repository's own files (real
//! PyTorch exports, golden IR files, the example models, PyTorch's npz inputs, a
//! compiled plan's manifest, a dataset's manifest) and mutates them (bit flips,
//! interesting bytes, inserted, deleted and repeated ranges, splices of two seeds,
//! numbers in text replaced by huge, negative or overflowing ones). Every case is
//! fed to the reader the binaries use; an `Err` is the expected answer to a bad
//! input. A panic is a finding: the input is written to
//! `target/fuzz/crashes/TARGET-N.bin` and the run fails. A case running past
//! [`HANG`] is a finding too: the watchdog names the input (written to
//! `target/fuzz/current-TARGET.bin` before each case) and ends the process; so does
//! an abort (e.g. an allocation failure), which leaves the same file behind.
//! `FUZZ_CASES=N` stops each target after N cases as well (CI's short run: the same
//! cases whatever the machine's speed). Findings become regression cases
//! (`frontends/onnx/test_cases/fuzz/`, `data/tests/ds.rs`), and every `.onnx` under
//! the test cases is a seed.

mod files;
mod model;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The message of the last panic (the hook keeps it).
static LAST_PANIC: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

/// The longest one case may run.
const HANG: Duration = Duration::from_secs(5);

/// Inputs larger than this are cut (the readers' own limits are tested by the
/// regression tests; this keeps cases fast).
const MAX_INPUT: usize = 1 << 20;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// splitmix64: the fuzzer's random stream.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Files under `dir` (recursively) whose names end with `suffix`.
fn files(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files(&p, suffix));
        } else if p.to_string_lossy().ends_with(suffix) {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// Feeds one input to a reader; `true` if the reader accepted it.
type Feed = Box<dyn Fn(&[u8]) -> bool>;

/// A reader under test: its seeds and how one input is fed to it.
struct Target {
    name: &'static str,
    seeds: Vec<Vec<u8>>,
    feed: Feed,
}

fn read_all(paths: &[PathBuf]) -> Vec<Vec<u8>> {
    paths
        .iter()
        .filter_map(|p| std::fs::read(p).ok())
        .filter(|b| b.len() <= MAX_INPUT)
        .collect()
}

/// The fuzzer's scratch directory: in `/dev/shm` where it exists (the data
/// readers' writers fsync every file; on a memory file system that costs nothing,
/// so a case takes milliseconds), else the system's temporary directory.
fn work_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dlrm-fuzz-")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .expect("a temporary directory")
}

/// A directory holding a compiled plan of the tiny example model.
fn tiny_plan(work: &Path) -> PathBuf {
    let dir = work.join("tiny.plan");
    let model = dlrm_compiler::model::load_model(
        &root().join("examples/dlrm-tiny.json"),
        dlrm_compiler::model::Overrides::default(),
    )
    .expect("tiny model");
    let opts = dlrm_compiler::compile::CompileOptions::default();
    let plan = dlrm_compiler::compile::compile(model, &opts, &mut |_, _| {}).expect("tiny plan");
    dlrm_runtime::write_plan(&dir, &plan).expect("write the plan");
    dir
}

fn targets(work: &Path) -> Vec<Target> {
    let onnx_dir = root().join("frontends/onnx/test_cases");
    let plan = tiny_plan(work);
    let mut v = vec![
        Target {
            name: "onnx",
            seeds: read_all(&files(&onnx_dir, ".onnx")),
            feed: Box::new(|b| dlrm_onnx::from_bytes(b, "fuzz", None).is_ok()),
        },
        Target {
            name: "ir",
            // A compiled plan's graphs (valid IR), and the golden files (whose
            // headers the parser refuses: error paths).
            seeds: read_all(
                &[
                    vec![plan.join("infer.ir"), plan.join("train.ir")],
                    files(&root().join("tests/filetests"), ".ir"),
                ]
                .concat(),
            ),
            feed: Box::new(|b| dlrm_ir::text::parse(&String::from_utf8_lossy(b)).is_ok()),
        },
    ];
    // JSON models through the loader `dlrmc compile` uses (tables above a size
    // described, not created).
    let json_file = work.join("model.json");
    v.push(Target {
        name: "json",
        seeds: read_all(&files(&root().join("examples"), ".json")),
        feed: Box::new(move |b| {
            std::fs::write(&json_file, b).is_ok()
                && dlrm_compiler::model::load_model(
                    &json_file,
                    dlrm_compiler::model::Overrides::default(),
                )
                .is_ok()
        }),
    });
    let npz_file = work.join("case.npz");
    v.push(Target {
        name: "npz",
        seeds: read_all(&files(&onnx_dir.join("real"), "inputs_7.npz")),
        feed: Box::new(move |b| {
            std::fs::write(&npz_file, b).is_ok() && dlrm_onnx::npz::read(&npz_file).is_ok()
        }),
    });
    let manifest = plan.join("manifest.json");
    v.push(Target {
        name: "plan",
        seeds: read_all(std::slice::from_ref(&manifest)),
        feed: Box::new(move |b| {
            std::fs::write(&manifest, b).is_ok() && dlrm_runtime::read_plan(&plan).is_ok()
        }),
    });
    // Structure-aware: the bytes choose a model, compiled with and without the
    // optimising passes, the two runs compared (model.rs).
    let model_work = work.to_path_buf();
    v.push(Target {
        name: "model",
        // Any bytes are a model: a few fixed seeds, then mutations.
        seeds: (0u8..16)
            .map(|k| (0..64u8).map(|i| i.wrapping_mul(37) ^ k).collect())
            .collect(),
        feed: Box::new(move |b| model::check(b, &model_work)),
    });
    let ds = work.join("data.ds");
    let spec = dlrm_data::Learnable {
        samples: 64,
        dense: 13,
        rows: vec![40, 25, 60],
        generator: "examples/fuzz.rs".into(),
    };
    dlrm_data::write_learnable(&ds, &spec).expect("a dataset");
    let ds_manifest = ds.join("manifest.json");
    v.push(Target {
        name: "ds",
        seeds: read_all(std::slice::from_ref(&ds_manifest)),
        feed: Box::new(move |b| {
            std::fs::write(&ds_manifest, b).is_ok() && dlrm_data::Dataset::open(&ds).is_ok()
        }),
    });
    v.extend(files::targets(work));
    v
}

/// Numbers that make declared sizes lie.
const NUMBERS: [&str; 7] = [
    "0",
    "-1",
    "4294967296",
    "1099511627776",
    "18446744073709551615",
    "99999999999999999999999",
    "1e308",
];

/// One mutation of `seed` (`other`: a second seed to splice in).
fn mutate(rng: &mut Rng, seed: &[u8], other: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let n = b.len();
        match rng.below(7) {
            0 if n > 0 => {
                let i = rng.below(n);
                b[i] ^= 1 << rng.below(8);
            }
            1 if n > 0 => {
                let i = rng.below(n);
                b[i] = [0u8, 0xff, 0x7f, 0x80, b'9', b'{', b'[', b'"'][rng.below(8)];
            }
            2 => {
                let i = rng.below(n + 1);
                let k = 1 + rng.below(16);
                let ins: Vec<u8> = (0..k).map(|_| rng.next() as u8).collect();
                b.splice(i..i, ins);
            }
            3 if n > 1 => {
                let i = rng.below(n);
                let k = 1 + rng.below((n - i).min(64));
                b.drain(i..i + k);
            }
            4 if n > 1 => {
                let i = rng.below(n);
                let k = 1 + rng.below((n - i).min(256));
                let piece = b[i..i + k].to_vec();
                let at = rng.below(n);
                b.splice(at..at, piece);
            }
            5 if !other.is_empty() => {
                let cut = rng.below(b.len() + 1);
                let from = rng.below(other.len());
                b.truncate(cut);
                b.extend_from_slice(&other[from..]);
            }
            _ => replace_number(rng, &mut b),
        }
    }
    b.truncate(MAX_INPUT);
    b
}

/// Replaces one run of ASCII digits by one of [`NUMBERS`].
fn replace_number(rng: &mut Rng, b: &mut Vec<u8>) {
    let starts: Vec<usize> = (0..b.len())
        .filter(|&i| b[i].is_ascii_digit() && (i == 0 || !b[i - 1].is_ascii_digit()))
        .collect();
    if starts.is_empty() {
        return;
    }
    let s = starts[rng.below(starts.len())];
    let e = (s..b.len())
        .find(|&i| !b[i].is_ascii_digit())
        .unwrap_or(b.len());
    b.splice(s..e, NUMBERS[rng.below(NUMBERS.len())].bytes());
}

/// When the running case started (milliseconds after the origin, plus one; 0: none
/// is running), for the watchdog.
type Clock = (Instant, Arc<AtomicU64>);

/// Runs `t` for `secs` seconds; returns (cases, accepted, crashes).
fn run(t: &Target, secs: f64, seed: u64, out: &Path, clock: &Clock) -> (u64, u64, u64) {
    let mut rng = Rng(seed ^ t.name.bytes().fold(0, |h, c| h * 31 + u64::from(c)));
    let start = Instant::now();
    let current = out.join(format!("current-{}.bin", t.name));
    let (mut cases, mut ok, mut crashes) = (0u64, 0u64, 0u64);
    if t.seeds.is_empty() {
        eprintln!("{}: no seeds found", t.name);
        return (0, 0, 1);
    }
    // `FUZZ_CASES=N` also stops a target after N cases (CI: the same cases on any
    // machine).
    let max_cases: u64 = std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(u64::MAX);
    while start.elapsed().as_secs_f64() < secs && cases < max_cases {
        let a = &t.seeds[rng.below(t.seeds.len())];
        let b = &t.seeds[rng.below(t.seeds.len())];
        let input = if cases < t.seeds.len() as u64 {
            a.clone()
        } else {
            mutate(&mut rng, a, b)
        };
        let _ = std::fs::write(&current, &input);
        clock
            .1
            .store(clock.0.elapsed().as_millis() as u64 + 1, Ordering::SeqCst);
        match catch_unwind(AssertUnwindSafe(|| (t.feed)(&input))) {
            Ok(true) => ok += 1,
            Ok(false) => {}
            Err(_) => {
                let p = out.join(format!("crashes/{}-{crashes}.bin", t.name));
                let _ = std::fs::write(&p, &input);
                eprintln!(
                    "{}: PANIC on case {cases}: input in {}",
                    t.name,
                    p.display()
                );
                if crashes == 0 {
                    let m = LAST_PANIC.lock().map(|m| m.clone()).unwrap_or_default();
                    eprintln!("  {}", m.chars().take(600).collect::<String>());
                }
                crashes += 1;
            }
        }
        clock.1.store(0, Ordering::SeqCst);
        cases += 1;
    }
    (cases, ok, crashes)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let which = args.get(1).map_or("all", String::as_str).to_string();
    // `fuzz TARGET replay FILE`: one case, its panic (if any) printed in full.
    if args.get(2).map(String::as_str) == Some("replay") {
        let Some(file) = args.get(3) else {
            eprintln!("usage: fuzz TARGET replay FILE");
            std::process::exit(2);
        };
        let work = work_dir();
        let all = targets(work.path());
        let Some(t) = all.iter().find(|t| t.name == which) else {
            eprintln!("unknown target `{which}`");
            std::process::exit(2);
        };
        let input = match std::fs::read(file) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("cannot read {file}: {e}");
                std::process::exit(2);
            }
        };
        let ok = (t.feed)(&input);
        println!(
            "{which}: {}",
            if ok { "accepted" } else { "refused (an error)" }
        );
        return;
    }
    let secs: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10.0);
    let seed: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1);
    let out = root().join("target/fuzz");
    std::fs::create_dir_all(out.join("crashes")).expect("target/fuzz");
    let work = work_dir();
    let all = targets(work.path());
    let chosen: Vec<&Target> = all
        .iter()
        .filter(|t| which == "all" || t.name == which)
        .collect();
    if chosen.is_empty() {
        let names: Vec<&str> = all.iter().map(|t| t.name).collect();
        eprintln!(
            "unknown target `{which}` (targets: {}, all)",
            names.join(", ")
        );
        std::process::exit(2);
    }
    // Watchdog: a case running past HANG ends the process, naming the input.
    let clock: Clock = (Instant::now(), Arc::new(AtomicU64::new(0)));
    let (origin, watch) = (clock.0, Arc::clone(&clock.1));
    let current_name = out.clone();
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(200));
            let started = watch.load(Ordering::SeqCst);
            let now = origin.elapsed().as_millis() as u64;
            if started > 0 && now.saturating_sub(started) > HANG.as_millis() as u64 {
                eprintln!(
                    "HANG: a case ran past {} s; its input is target/fuzz/current-*.bin under {}",
                    HANG.as_secs(),
                    current_name.display()
                );
                std::process::exit(3);
            }
        }
    });
    // A finding's message is kept (not printed by the default hook) and shown
    // with the first finding of each target.
    std::panic::set_hook(Box::new(|info| {
        if let Ok(mut m) = LAST_PANIC.lock() {
            *m = info.to_string();
        }
    }));
    let mut failed = false;
    for t in chosen {
        let t0 = Instant::now();
        let (cases, ok, crashes) = run(t, secs, seed, &out, &clock);
        println!(
            "{:<5} {:>8} cases in {:>6.1} s, {:>6} accepted, {} seeds, {} findings",
            t.name,
            cases,
            t0.elapsed().as_secs_f64(),
            ok,
            t.seeds.len(),
            crashes
        );
        failed |= crashes > 0;
    }
    if failed {
        std::process::exit(1);
    }
}
