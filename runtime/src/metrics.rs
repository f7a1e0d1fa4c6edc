//! Metrics: AUC, log loss, accuracy and normalized entropy of predictions, and the
//! JSON-lines metrics file ([`MetricsWriter`] writes it, [`read_curves`] reads its
//! learning curves back).
//!
//! AUC is exact over the whole evaluated set: sort-based (O(n log n) time, one index
//! per sample of memory), ties counted half. Log loss is the mean binary cross
//! entropy with each prediction clamped to `[1e-7, 1 - 1e-7]` (so a confident
//! mistake costs at most ln(1e7) ≈ 16.1, not infinity). Normalized entropy is the log
//! loss divided by the entropy of the set's positive rate (the log loss of always
//! predicting that rate): below 1 means better than the base rate.
//!
//! The metrics file has one JSON object per line: one per logged step
//! (`{"iter", "loss", "lr", "samples_per_s", "elapsed_s"}`, `loss` and `lr` (the
//! step's learning rate) null in inference mode),
//! one per evaluation during or after training (`{"iter", "split", "samples", "auc",
//! "log_loss", "accuracy", "ne"}`, `iter` the step it followed)
//! and a last summary line (`{"auc", "accuracy", "eval_samples", "final_loss",
//! "samples_per_s", "ranks", "iters", "backend", "kernels", "jit_kernels",
//! "jit_compile_s", "peak_rss_bytes", "gemm_kernels", "ops", "nodes"}`,
//! `peak_rss_bytes` rank 0's process's peak resident memory ([`peak_rss_bytes`]),
//! `gemm_kernels` counting
//! the GEMM shapes per micro-kernel the JIT picked, `ops` being the per-op-kind
//! bench table: `op`, `calls`, `seconds`, `gflops`, `gbytes_per_s`, and `nodes`
//! every node's, most expensive first). Every line is written whole and flushed
//! before the call returns, so a reader (or a crash) sees only complete lines,
//! except at worst a truncated last line if the process dies inside the write; the
//! file as a whole is not atomic (it grows while training runs, so progress can be
//! followed with `tail -f`).

use crate::driver::{Event, Report};
use crate::error::{Result, RuntimeError};
use serde_json::json;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Area under the ROC curve of `scores` against binary `labels` (1 = positive),
/// rank-based (Mann–Whitney U), tied scores getting their average rank. `None` when
/// there are no positives or no negatives (AUC is undefined), or the lengths differ.
pub fn auc(scores: &[f32], labels: &[f32]) -> Option<f64> {
    if scores.len() != labels.len() {
        return None;
    }
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let positives = labels.iter().filter(|&&y| y > 0.5).count();
    let negatives = labels.len() - positives;
    if positives == 0 || negatives == 0 {
        return None;
    }
    // Sum of the (1-based, tie-averaged) ranks of the positives.
    let mut rank_sum = 0.0f64;
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && scores[order[j + 1]] == scores[order[i]] {
            j += 1;
        }
        let avg_rank = (i + j) as f64 / 2.0 + 1.0;
        let pos_in_group = order[i..=j].iter().filter(|&&k| labels[k] > 0.5).count();
        rank_sum += avg_rank * pos_in_group as f64;
        i = j + 1;
    }
    let (p, n) = (positives as f64, negatives as f64);
    Some((rank_sum - p * (p + 1.0) / 2.0) / (p * n))
}

/// The share of predictions on the right side of `threshold` (score > threshold
/// predicts 1). `None` for empty or mismatched inputs.
pub fn accuracy(scores: &[f32], labels: &[f32], threshold: f32) -> Option<f64> {
    if scores.is_empty() || scores.len() != labels.len() {
        return None;
    }
    let right = scores
        .iter()
        .zip(labels)
        .filter(|&(&s, &y)| (s > threshold) == (y > 0.5))
        .count();
    Some(right as f64 / scores.len() as f64)
}

/// Clamp of predictions in [`log_loss`].
pub const LOG_LOSS_EPS: f64 = 1e-7;

/// Mean binary cross entropy of probabilities `scores` against binary `labels`,
/// each score clamped to `[LOG_LOSS_EPS, 1 - LOG_LOSS_EPS]`. `None` for empty or
/// mismatched inputs.
pub fn log_loss(scores: &[f32], labels: &[f32]) -> Option<f64> {
    if scores.is_empty() || scores.len() != labels.len() {
        return None;
    }
    let sum: f64 = scores
        .iter()
        .zip(labels)
        .map(|(&p, &y)| {
            let p = f64::from(p).clamp(LOG_LOSS_EPS, 1.0 - LOG_LOSS_EPS);
            if y > 0.5 { -p.ln() } else { -(1.0 - p).ln() }
        })
        .sum();
    Some(sum / scores.len() as f64)
}

/// Normalized entropy: [`log_loss`] over the entropy of the labels' positive rate.
/// `None` if the log loss is, or all labels are equal (zero entropy).
pub fn normalized_entropy(scores: &[f32], labels: &[f32]) -> Option<f64> {
    let ll = log_loss(scores, labels)?;
    let p = labels.iter().filter(|&&y| y > 0.5).count() as f64 / labels.len() as f64;
    if p <= 0.0 || p >= 1.0 {
        return None;
    }
    Some(ll / -(p * p.ln() + (1.0 - p) * (1.0 - p).ln()))
}

/// One evaluation: a set's metrics after a step.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct EvalMetrics {
    /// The step it followed (1-based).
    pub iter: u64,
    /// The evaluated split (`heldout` for synthetic data).
    pub split: String,
    /// Samples evaluated.
    pub samples: usize,
    /// Exact AUC (`None` if a class is missing).
    pub auc: Option<f64>,
    /// Mean binary cross entropy.
    pub log_loss: Option<f64>,
    /// Accuracy at threshold 0.5.
    pub accuracy: Option<f64>,
    /// Normalized entropy.
    pub ne: Option<f64>,
}

impl EvalMetrics {
    /// The metrics of `scores` against `labels`.
    pub fn compute(iter: u64, split: &str, scores: &[f32], labels: &[f32]) -> EvalMetrics {
        EvalMetrics {
            iter,
            split: split.to_string(),
            samples: scores.len(),
            auc: auc(scores, labels),
            log_loss: log_loss(scores, labels),
            accuracy: accuracy(scores, labels, 0.5),
            ne: normalized_entropy(scores, labels),
        }
    }
}

/// Writes the JSON-lines metrics file (see the module docs).
pub struct MetricsWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl MetricsWriter {
    /// Creates (truncates) the metrics file.
    pub fn create(path: &Path) -> Result<MetricsWriter> {
        let f = File::create(path).map_err(|e| RuntimeError::io(path, e))?;
        Ok(MetricsWriter {
            path: path.to_path_buf(),
            out: BufWriter::new(f),
        })
    }

    fn line(&mut self, v: &serde_json::Value) -> Result<()> {
        let mut s = v.to_string();
        s.push('\n');
        self.out
            .write_all(s.as_bytes())
            .and_then(|()| self.out.flush())
            .map_err(|e| RuntimeError::io(&self.path, e))
    }

    /// Writes one step line (`lr`: the step's learning rate, null in inference).
    pub fn step(
        &mut self,
        iter: u64,
        loss: Option<f32>,
        lr: Option<f32>,
        samples_per_s: f64,
        elapsed_s: f64,
    ) -> Result<()> {
        self.line(&json!({
            "iter": iter,
            "loss": loss,
            "lr": lr,
            "samples_per_s": samples_per_s,
            "elapsed_s": elapsed_s,
        }))
    }

    /// Writes one evaluation line.
    pub fn eval(&mut self, m: &EvalMetrics) -> Result<()> {
        self.line(&json!({
            "iter": m.iter,
            "split": m.split,
            "samples": m.samples,
            "auc": m.auc,
            "log_loss": m.log_loss,
            "accuracy": m.accuracy,
            "ne": m.ne,
        }))
    }

    /// Writes the line of a [`Event::Step`] or [`Event::Evaluated`] (other events
    /// write nothing).
    pub fn event(&mut self, e: &Event) -> Result<()> {
        match e {
            Event::Evaluated(m) => self.eval(m),
            Event::Step {
                iter,
                loss,
                lr,
                samples_per_s,
                elapsed,
            } => self.step(*iter, *loss, *lr, *samples_per_s, elapsed.as_secs_f64()),
            _ => Ok(()),
        }
    }

    /// Writes the summary line and syncs the file.
    pub fn finish(mut self, r: &Report) -> Result<()> {
        self.line(&json!({
            "auc": r.auc,
            "accuracy": r.accuracy,
            "log_loss": r.log_loss,
            "ne": r.ne,
            "eval_split": r.eval_split,
            "best_auc": r.best.as_ref().map(|b| b.auc),
            "best_auc_iter": r.best.as_ref().map(|b| b.iter),
            "eval_samples": r.eval_samples,
            "skipped_samples": r.skipped_samples,
            "final_loss": r.final_loss,
            "samples_per_s": r.samples_per_s,
            "ranks": r.ranks,
            "iters": r.iters,
            "backend": r.backend,
            "kernels": r.kernels,
            "jit_kernels": r.jit_kernels,
            "jit_compile_s": r.jit_compile_s,
            "peak_rss_bytes": r.peak_rss_bytes,
            "gemm_kernels": r.gemm_picks.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
            "bf16_dot_speedup": r.bf16_dot_speedup,
            "ops": r.op_times.iter().map(|t| json!({
                "op": t.op,
                "calls": t.calls,
                "seconds": t.seconds,
                "gflops": t.gflops(),
                "gbytes_per_s": t.gbytes(),
            })).collect::<Vec<_>>(),
            "nodes": r.node_times.iter().map(|t| json!({
                "op": t.op,
                "node": t.node,
                "calls": t.calls,
                "seconds": t.seconds,
                "gflops": t.gflops(),
                "gbytes_per_s": t.gbytes(),
            })).collect::<Vec<_>>(),
        }))?;
        self.out
            .get_ref()
            .sync_all()
            .map_err(|e| RuntimeError::io(&self.path, e))
    }
}

/// This process's peak resident memory so far, bytes: `VmHWM` of
/// `/proc/self/status` (Linux), else `None`.
pub fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = s
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kib * 1024)
}

/// One run's learning curves, read back from its metrics file ([`read_curves`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Curves {
    /// The legend label (the file's stem).
    pub label: String,
    /// `(step, loss)` of the logged training steps.
    pub loss: Vec<(f64, f64)>,
    /// `(step, AUC)` of the evaluations during training.
    pub auc: Vec<(f64, f64)>,
    /// `(step, log loss)` of the evaluations during training.
    pub log_loss: Vec<(f64, f64)>,
}

/// Reads the curves of the metrics file at `path` (evaluations of split `split`
/// only; `dlrmc plot` draws them). Its lines are told apart by their keys: a
/// line with `split` is an evaluation (`iter`, `auc`, `log_loss`), one with
/// `iter` and a numeric `loss` a training step; other lines (the summary) are
/// skipped. A file with neither is an error.
pub fn read_curves(path: &Path, split: &str) -> Result<Curves> {
    let text = std::fs::read_to_string(path).map_err(|e| RuntimeError::io(path, e))?;
    let mut c = Curves {
        label: path.file_stem().map_or_else(
            || path.display().to_string(),
            |s| s.to_string_lossy().into_owned(),
        ),
        ..Curves::default()
    };
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| bad_metrics(path, format!("line {}: {e}", n + 1)))?;
        let Some(iter) = v.get("iter").and_then(serde_json::Value::as_f64) else {
            continue;
        };
        match v.get("split").and_then(serde_json::Value::as_str) {
            Some(s) if s == split => {
                if let Some(a) = v["auc"].as_f64() {
                    c.auc.push((iter, a));
                }
                if let Some(l) = v["log_loss"].as_f64() {
                    c.log_loss.push((iter, l));
                }
            }
            Some(_) => {}
            None => {
                if let Some(l) = v.get("loss").and_then(serde_json::Value::as_f64) {
                    c.loss.push((iter, l));
                }
            }
        }
    }
    if c.loss.is_empty() && c.auc.is_empty() {
        return Err(bad_metrics(
            path,
            format!(
                "no training loss and no `{split}` evaluation lines (a dlrm-run --metrics file?)"
            ),
        ));
    }
    Ok(c)
}

fn bad_metrics(path: &Path, reason: String) -> RuntimeError {
    RuntimeError::Metrics {
        path: path.to_path_buf(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::{EvalMetrics, accuracy, auc, log_loss, normalized_entropy};

    #[test]
    fn log_loss_and_ne_by_hand() {
        let y = [1.0, 0.0, 1.0, 0.0];
        let p = [0.9f32, 0.2, 0.6, 0.5];
        let want = -((0.9f64).ln() + (0.8f64).ln() + (0.6f64).ln() + (0.5f64).ln()) / 4.0;
        let got = log_loss(&p, &y).expect("defined");
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        // Positive rate 1/2: entropy ln 2.
        let ne = normalized_entropy(&p, &y).expect("defined");
        assert!((ne - want / 2f64.ln()).abs() < 1e-6);
        // Clamped: a confident mistake costs ln(1e7), not infinity.
        let worst = log_loss(&[0.0], &[1.0]).expect("defined");
        assert!((worst - 1e7f64.ln()).abs() < 1e-6, "{worst}");
        assert_eq!(normalized_entropy(&[0.3, 0.4], &[1.0, 1.0]), None);
        assert_eq!(log_loss(&[], &[]), None);
        // Predicting the base rate has NE 1.
        let y = [1.0, 0.0, 0.0, 0.0];
        let ne = normalized_entropy(&[0.25; 4], &y).expect("defined");
        assert!((ne - 1.0).abs() < 1e-6, "{ne}");
        let m = EvalMetrics::compute(7, "val", &[0.1, 0.6, 0.5, 0.9], &[0.0, 0.0, 1.0, 1.0]);
        assert_eq!((m.iter, m.samples, m.auc), (7, 4, Some(0.75)));
        assert_eq!(m.accuracy, Some(0.5));
    }

    #[test]
    fn auc_of_known_rankings() {
        let y = [0.0, 0.0, 1.0, 1.0];
        assert_eq!(auc(&[0.1, 0.2, 0.8, 0.9], &y), Some(1.0));
        assert_eq!(auc(&[0.9, 0.8, 0.2, 0.1], &y), Some(0.0));
        assert_eq!(auc(&[0.5; 4], &y), Some(0.5));
        // One inversion out of four pairs.
        assert_eq!(auc(&[0.1, 0.6, 0.5, 0.9], &y), Some(0.75));
        // A tie between a positive and a negative counts half.
        assert_eq!(auc(&[0.1, 0.5, 0.5, 0.9], &y), Some(0.875));
        assert_eq!(auc(&[0.1, 0.2], &[1.0, 1.0]), None);
        assert_eq!(auc(&[0.1], &[1.0, 0.0]), None);
    }

    #[test]
    fn auc_matches_pair_counting_on_random_data() {
        let mut x = 12345u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let scores: Vec<f32> = (0..300).map(|_| (next() % 50) as f32 / 50.0).collect();
        let labels: Vec<f32> = (0..300).map(|_| (next() % 3 == 0) as u8 as f32).collect();
        let (mut num, mut den) = (0.0, 0.0);
        for i in 0..300 {
            for j in 0..300 {
                if labels[i] == 1.0 && labels[j] == 0.0 {
                    den += 1.0;
                    num += if scores[i] > scores[j] {
                        1.0
                    } else if scores[i] == scores[j] {
                        0.5
                    } else {
                        0.0
                    };
                }
            }
        }
        let got = auc(&scores, &labels).expect("both classes");
        assert!((got - num / den).abs() < 1e-12, "{got} vs {}", num / den);
    }

    #[test]
    fn accuracy_at_threshold() {
        assert_eq!(
            accuracy(&[0.9, 0.1, 0.6, 0.4], &[1.0, 0.0, 0.0, 0.0], 0.5),
            Some(0.75)
        );
        assert_eq!(accuracy(&[], &[], 0.5), None);
    }
}
