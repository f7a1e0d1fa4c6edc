//! The bounds of a job's counts (flags in parentheses), checked before anything is
//! sized by them: a count larger than a run can use is an error naming the flag and
//! the value, never an allocation the machine cannot make.

use super::{Job, job_err};
use crate::error::Result;

/// The most steps a run may take (`--iters`): 10^8 (a step's time is kept for the
/// report, 8 bytes a step).
pub const MAX_ITERS: u64 = 100_000_000;
/// The most synthetic batches generated and cycled (`--synthetic-batches`): 2^20.
pub const MAX_SYNTHETIC_BATCHES: usize = 1 << 20;
/// The most held-out batches of synthetic data evaluated (`--eval-batches`):
/// 2^20 (their predictions and labels are kept for the AUC, as they are made).
pub const MAX_EVAL_BATCHES: usize = 1 << 20;
/// The most worker threads of one rank (`--threads`): 1024.
pub const MAX_THREADS: usize = 1024;
/// The most entries preallocated for per-step or per-sample records; they grow
/// past it as the run produces them.
pub(super) const PREALLOC: usize = 1 << 16;

/// Checks the job's counts against the bounds above.
pub(super) fn check_counts(job: &Job) -> Result<()> {
    let s = &job.settings;
    if job.iters > MAX_ITERS {
        return Err(job_err(format!(
            "--iters {} is more than the {MAX_ITERS} steps a run may take",
            job.iters
        )));
    }
    if s.synthetic_batches > MAX_SYNTHETIC_BATCHES {
        return Err(job_err(format!(
            "--synthetic-batches {} is more than the {MAX_SYNTHETIC_BATCHES} batches \
             that may be cycled",
            s.synthetic_batches
        )));
    }
    if s.data.is_none() && s.eval_batches > MAX_EVAL_BATCHES {
        return Err(job_err(format!(
            "--eval-batches {} is more than the {MAX_EVAL_BATCHES} held-out batches an \
             evaluation may take",
            s.eval_batches
        )));
    }
    match s.threads {
        Some(0) => Err(job_err("a rank needs at least one thread")),
        Some(n) if n > MAX_THREADS => Err(job_err(format!(
            "--threads {n} is more than the {MAX_THREADS} worker threads a rank may have"
        ))),
        _ => Ok(()),
    }
}
