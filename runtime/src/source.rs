//! The data of a run, whichever it is: the synthetic teacher ([`SyntheticData`]) or
//! a dataset ([`DatasetSource`]). The driver asks for "training batch k" and
//! "evaluation batch b of set S" without knowing which; both are pure functions of
//! the seed and the step, so every rank (and every process) computes its own slice.

use crate::dataset::DatasetSource;
use crate::error::Result;
use crate::synthetic::{SyntheticData, eval_step};
use dlrm_ir::{Graph, Tensor};
use std::collections::HashMap;
use std::ops::Range;

/// A run's data.
#[derive(Debug)]
pub enum Source {
    /// Synthetic samples labelled by a hidden teacher (identical on every rank).
    Synthetic(SyntheticData),
    /// A memory-mapped `.ds` dataset.
    Dataset(Box<DatasetSource>),
}

/// A set of samples an evaluation runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvalSet {
    /// Its name in reports and metrics: a split's name, or `heldout` (synthetic).
    pub name: String,
    kind: EvalKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum EvalKind {
    /// Synthetic held-out batches ([`eval_step`]).
    Heldout(usize),
    /// A dataset split's samples.
    Split(Range<usize>),
}

impl EvalSet {
    /// `batches` synthetic held-out global batches.
    pub fn heldout(batches: usize) -> EvalSet {
        EvalSet {
            name: "heldout".into(),
            kind: EvalKind::Heldout(batches),
        }
    }
}

impl Source {
    /// Whether batches are assembled on a producer thread ahead of the step (the
    /// dataset); the synthetic data is generated in place, on the rank's pool.
    pub fn prefetches(&self) -> bool {
        matches!(self, Source::Dataset(_))
    }

    /// The dataset, if the data is one.
    pub fn dataset(&self) -> Option<&DatasetSource> {
        match self {
            Source::Dataset(d) => Some(d),
            Source::Synthetic(_) => None,
        }
    }

    /// Training steps per epoch (a dataset's; `None` for synthetic data).
    pub fn steps_per_epoch(&self) -> Option<u64> {
        self.dataset().map(DatasetSource::steps_per_epoch)
    }

    /// The evaluation set of split `name` (a dataset), or the `batches` held-out
    /// batches (synthetic data).
    pub fn eval_set(&self, name: &str, batches: usize) -> Result<EvalSet> {
        Ok(match self {
            Source::Synthetic(_) => EvalSet::heldout(batches),
            Source::Dataset(d) => EvalSet {
                name: name.to_string(),
                kind: EvalKind::Split(d.dataset().split(name)?),
            },
        })
    }

    /// One rank's inputs of training step `step` (0-based).
    pub fn train_inputs(
        &self,
        step: u64,
        global_batch: usize,
        ranks: usize,
        rank: usize,
        graph: &Graph,
    ) -> Result<HashMap<String, Tensor>> {
        match self {
            Source::Synthetic(s) => s.inputs_for(step, global_batch, ranks, rank, graph),
            Source::Dataset(d) => d.inputs(&d.train_samples(step), ranks, rank, graph),
        }
    }

    /// Global batches of an evaluation of `set`.
    pub fn eval_batches(&self, set: &EvalSet) -> usize {
        match (&set.kind, self) {
            (EvalKind::Heldout(n), _) => *n,
            (EvalKind::Split(r), Source::Dataset(d)) => d.eval_batches(r),
            (EvalKind::Split(_), Source::Synthetic(_)) => 0,
        }
    }

    /// Real (not padding) samples of evaluation batch `b` of `set`.
    pub fn eval_valid(&self, set: &EvalSet, b: usize, global_batch: usize) -> usize {
        match &set.kind {
            EvalKind::Heldout(_) => global_batch,
            EvalKind::Split(r) => r.len().saturating_sub(b * global_batch).min(global_batch),
        }
    }

    /// One rank's inputs of evaluation batch `b` of `set`.
    pub fn eval_inputs(
        &self,
        set: &EvalSet,
        b: usize,
        global_batch: usize,
        ranks: usize,
        rank: usize,
        graph: &Graph,
    ) -> Result<HashMap<String, Tensor>> {
        match (&set.kind, self) {
            (EvalKind::Heldout(_), Source::Synthetic(s)) => {
                s.inputs_for(eval_step(b as u64), global_batch, ranks, rank, graph)
            }
            (EvalKind::Split(r), Source::Dataset(d)) => {
                d.inputs(&d.eval_samples(r, b), ranks, rank, graph)
            }
            _ => Err(crate::error::RuntimeError::Data {
                reason: format!("evaluation set `{}` does not belong to this data", set.name),
            }),
        }
    }

    /// The labels of every real sample of `set`, in order.
    pub fn eval_labels(&self, set: &EvalSet, global_batch: usize) -> Vec<f32> {
        match (&set.kind, self) {
            (EvalKind::Heldout(n), Source::Synthetic(s)) => (0..*n)
                .flat_map(|b| s.labels(eval_step(b as u64), 0..global_batch))
                .collect(),
            (EvalKind::Split(r), Source::Dataset(d)) => d.labels(r),
            _ => Vec::new(),
        }
    }
}
