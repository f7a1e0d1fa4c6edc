//! What `dlrm-run` shows while a job runs and when it ends: a progress bar on a
//! terminal (else one line per logged step), evaluation and checkpoint lines, the
//! `--metrics` file, and the closing summary line.

use dlrm_passes::shard::human;
use dlrm_runtime::driver::{Event, Mode, Report};
use dlrm_runtime::metrics::MetricsWriter;
use dlrm_runtime::{EvalMetrics, RuntimeError};
use indicatif::{ProgressBar, ProgressStyle};

/// How the job's progress is shown on stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Show {
    /// A progress bar (stderr is a terminal), other lines printed above it.
    Bar,
    /// One line per logged step, evaluation and checkpoint.
    Lines,
    /// Nothing (`--quiet`).
    Nothing,
}

/// Takes the job's [`Event`]s: draws them ([`Show`]) and writes the metrics file.
pub struct Console {
    iters: u64,
    show: Show,
    bar: Option<ProgressBar>,
    steps_per_epoch: Option<u64>,
    metrics: Option<MetricsWriter>,
    /// The first failure to write the metrics file (reported at the end).
    metrics_err: Option<RuntimeError>,
}

impl Console {
    /// A console for a job of `iters` steps; `steps_per_epoch` (a dataset's) adds
    /// the epoch to each line.
    pub fn new(
        iters: u64,
        show: Show,
        steps_per_epoch: Option<u64>,
        metrics: Option<MetricsWriter>,
    ) -> Console {
        let bar = (show == Show::Bar).then(|| {
            let pb = ProgressBar::new(iters);
            pb.set_style(
                ProgressStyle::with_template(
                    "{bar:30} {pos}/{len} steps  {msg}  [{elapsed}<{eta}]",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            pb
        });
        Console {
            iters,
            show,
            bar,
            steps_per_epoch,
            metrics,
            metrics_err: None,
        }
    }

    /// Shows `e` and records it in the metrics file.
    pub fn event(&mut self, e: &Event) {
        if let Some(m) = self.metrics.as_mut()
            && self.metrics_err.is_none()
            && let Err(err) = m.event(e)
        {
            self.metrics_err = Some(err);
        }
        match e {
            Event::Step {
                iter,
                loss,
                lr,
                samples_per_s,
                elapsed,
            } => {
                let loss = loss.map_or(String::new(), |l| format!("loss {l:.5}  "));
                let lr = lr.map_or(String::new(), |l| format!("lr {l}  "));
                let msg = format!(
                    "{}{loss}{lr}{samples_per_s:.0} samples/s",
                    self.epoch(*iter)
                );
                match &self.bar {
                    Some(pb) => {
                        pb.set_position(*iter);
                        pb.set_message(msg);
                    }
                    None if self.show == Show::Lines => eprintln!(
                        "step {iter:>6}/{}  {msg}  ({:.1} s)",
                        self.iters,
                        elapsed.as_secs_f64()
                    ),
                    None => {}
                }
            }
            Event::Eval { batch, batches } => {
                if let Some(pb) = &self.bar {
                    pb.set_message(format!("evaluating {batch}/{batches}"));
                }
            }
            Event::Checkpoint(w) => self.line(&format!(
                "checkpoint after step {}: {} ({:.1} MB in {:.2} s, {:.2} GB/s)",
                w.step,
                w.path.display(),
                w.bytes as f64 / 1e6,
                w.seconds,
                if w.seconds > 0.0 {
                    w.bytes as f64 / w.seconds / 1e9
                } else {
                    0.0
                }
            )),
            Event::Evaluated(m) => self.line(&format!(
                "eval {}after step {}: {}",
                self.epoch(m.iter),
                m.iter,
                eval_line(m)
            )),
        }
    }

    /// Clears the bar; hands back the metrics file to finish with the report, or
    /// the first error writing it.
    pub fn finish(self) -> Result<Option<MetricsWriter>, RuntimeError> {
        if let Some(pb) = &self.bar {
            pb.finish_and_clear();
        }
        match self.metrics_err {
            Some(e) => Err(e),
            None => Ok(self.metrics),
        }
    }

    /// A line above the bar, or on its own.
    fn line(&self, line: &str) {
        match &self.bar {
            Some(pb) => pb.println(line),
            None if self.show == Show::Lines => eprintln!("{line}"),
            None => {}
        }
    }

    /// "epoch 1.25  " at step `iter` of a dataset's run, else nothing.
    fn epoch(&self, iter: u64) -> String {
        self.steps_per_epoch.map_or(String::new(), |spe| {
            format!("epoch {:.2}  ", iter as f64 / spe as f64)
        })
    }
}

/// The closing line of a job: what ran, its speed, memory and evaluation.
pub fn summary(name: &str, r: &Report) -> String {
    let what = match r.mode {
        Mode::Train => "trained",
        Mode::Infer => "served",
    };
    let mut s = format!(
        "{what} `{name}`: {} steps on {} rank{}, global batch {}",
        r.iters,
        r.ranks,
        if r.ranks == 1 { "" } else { "s" },
        r.global_batch
    );
    if let Some(l) = r.final_loss {
        s += &format!(", final loss {l:.5}");
    }
    s += &format!(", {:.0} samples/s", r.samples_per_s);
    if let Some(b) = r.peak_rss_bytes {
        s += &format!(", peak resident memory {} ({b} bytes)", human(b));
    }
    // (label, value, decimals)
    let metrics = [
        ("AUC", r.auc, 4),
        ("accuracy", r.accuracy, 4),
        ("log loss", r.log_loss, 5),
        ("NE", r.ne, 4),
    ];
    for (label, v, d) in metrics {
        if let Some(v) = v {
            s += &format!(", {label} {v:.d$}");
        }
    }
    s += &format!(
        " ({} {} samples)",
        r.eval_samples,
        if r.eval_split == "heldout" {
            "held-out".to_string()
        } else {
            format!("`{}`", r.eval_split)
        }
    );
    if r.skipped_samples > 0 {
        s += &format!(
            ", {} samples skipped (non-finite dense values or labels outside {{0, 1}})",
            r.skipped_samples
        );
    }
    if let Some(b) = &r.best {
        s += &format!(
            ", best {} AUC {:.4} at step {}",
            r.evals.first().map_or("", |m| m.split.as_str()),
            b.auc,
            b.iter
        );
    }
    s += &format!(", {:.1} s", r.wall_s);
    s
}

/// One evaluation's metrics, `-` for those it has none of.
fn eval_line(m: &EvalMetrics) -> String {
    let f = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.4}"));
    format!(
        "`{}` ({} samples): AUC {}, log loss {}, accuracy {}, NE {}",
        m.split,
        m.samples,
        f(m.auc),
        f(m.log_loss),
        f(m.accuracy),
        f(m.ne)
    )
}

/// Makes a write to a closed pipe end the process quietly, as it ends `cat`
/// or `grep` (`dlrmc plan-shards PLAN | head -1`): Rust ignores `SIGPIPE`, so
/// `println!` would panic on the broken pipe instead. Called first by both
/// binaries; a no-op off Unix.
pub fn exit_quietly_on_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: restores the default disposition of one signal before any thread
    // is started; no handler code runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
