//! Model lifecycle: watching a checkpoint directory (`dlrm-run --checkpoint
//! DIR`) and serving its newest checkpoint.
//!
//! Every `interval` the directory is resolved as `dlrm-run --resume DIR` resolves
//! it ([`checkpoint::resolve`]: the checkpoint its `latest` file names, else the
//! newest complete `step-<n>`; a write still under way, `.step-<n>.tmp`, is never
//! seen). A checkpoint of a higher step than the one serving is loaded whole
//! beside it (its own [`Session`], its own executors, warmed up) and swapped in
//! ([`Served::swap`]). A load that fails (a corrupt or foreign checkpoint) is
//! logged, counted in `/metrics` (`dlrm_serve_model_loads_total{outcome=
//! "failure"}`) and not retried; the old model goes on serving.

use crate::Served;
use dlrm_runtime::checkpoint::{self, Checkpoint};
use dlrm_runtime::{Backend, KernelChoice, RuntimeError, Session};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The newest complete checkpoint of `dir` (its path), as `--resume DIR` finds it.
pub fn newest(dir: &Path) -> Result<PathBuf, RuntimeError> {
    checkpoint::resolve(dir)
}

/// Loads the checkpoint at `path`: its session (with `int8` tables, quantized
/// as it loads) and its step.
pub fn load(path: &Path, int8: bool) -> Result<(Session, u64), RuntimeError> {
    let ckpt = Checkpoint::open(path)?;
    let step = ckpt.step();
    Ok((session_of(ckpt.to_plan()?, int8)?, step))
}

/// The session serving `plan`: with `int8`, its tables as int8 rows
/// ([`dlrm_runtime::Plan::quantize_tables`], logged).
pub fn session_of(plan: dlrm_runtime::Plan, int8: bool) -> Result<Session, RuntimeError> {
    let plan = if int8 {
        let (plan, report) = plan.quantize_tables()?;
        log(format_args!("{}", report.summary()));
        plan
    } else {
        plan
    };
    Session::new(plan, Backend::default(), KernelChoice::default())
}

/// A line on stderr; one that cannot be written (stderr closed) is dropped,
/// where `eprintln!` would panic.
fn log(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "dlrm-serve: {args}");
}

/// What the watcher has seen.
struct Watcher {
    dir: PathBuf,
    /// The step serving.
    step: u64,
    /// The last checkpoint whose load failed (not retried).
    failed: Option<PathBuf>,
    /// The last error resolving the directory (logged once).
    unresolved: Option<String>,
    warm_limit: Duration,
    /// Serve the tables as int8 rows (`--quantize-tables int8`).
    int8: bool,
}

impl Watcher {
    /// Looks once; loads and swaps in a newer checkpoint if there is one.
    fn poll(&mut self, served: &Served) {
        let path = match newest(&self.dir) {
            Ok(p) => {
                self.unresolved = None;
                p
            }
            Err(e) => {
                let msg = e.to_string();
                if self.unresolved.as_ref() != Some(&msg) {
                    log(format_args!("watching {}: {msg}", self.dir.display()));
                    self.unresolved = Some(msg);
                }
                return;
            }
        };
        if self.failed.as_ref() == Some(&path) {
            return;
        }
        let step = path
            .file_name()
            .and_then(|n| checkpoint::parse_step_dir(&n.to_string_lossy()));
        // `None`: the directory is itself one checkpoint, nothing newer comes.
        if step.is_none_or(|s| s <= self.step) {
            return;
        }
        let start = Instant::now();
        let loaded = load(&path, self.int8).and_then(|(session, step)| {
            served.swap(session, Some(step), self.warm_limit)?;
            Ok(step)
        });
        match loaded {
            Ok(step) => {
                log(format_args!(
                    "now serving step {step} from {} (loaded and warmed up in {} ms)",
                    path.display(),
                    start.elapsed().as_millis()
                ));
                self.step = step;
                self.failed = None;
            }
            Err(e) => {
                log(format_args!(
                    "not serving {}: {e}; step {} goes on serving",
                    path.display(),
                    self.step
                ));
                served.metrics().load_failed();
                self.failed = Some(path);
            }
        }
    }
}

/// Watches `dir` every `interval` on a thread of its own, `step` serving now;
/// a new model's warm-up is awaited at most `warm_limit` before the swap.
pub fn spawn(
    served: Arc<Served>,
    dir: PathBuf,
    step: u64,
    interval: Duration,
    warm_limit: Duration,
    int8: bool,
) -> std::io::Result<()> {
    let mut w = Watcher {
        dir,
        step,
        failed: None,
        unresolved: None,
        warm_limit,
        int8,
    };
    std::thread::Builder::new()
        .name("dlrm-serve-watch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(interval);
                w.poll(&served);
            }
        })
        .map(|_| ())
}
