//! Evaluation of a rank's inference graph on an [`EvalSet`]: every rank runs its
//! slice of each global batch and sends its predictions to rank 0 (an
//! `all_to_all_v` with empty buffers to the others), which joins them in rank order
//! (= global sample order), drops the padding of a last partial batch and computes
//! the metrics. Used during training (`--eval-every`, with a copy of the training
//! executor's current parameters) and at the end (with the trained parameters).

use super::RankCfg;
use super::limits::PREALLOC;
use super::rank::step_syms;
use crate::driver::Event;
use crate::error::{Result, RuntimeError};
use crate::exec::Executor;
use crate::metrics::EvalMetrics;
use crate::source::{EvalSet, Source};
use dlrm_ir::{Communicator, Graph, Tensor, batch_slice};
use std::collections::HashMap;

/// An inference executor for `infer` with copies of the parameters it declares,
/// taken from the training executor `train` (its current values) or, for those
/// the training graph does not hold, from `rest`.
pub(super) fn snapshot(
    infer: &Graph,
    train: &Executor,
    rest: &HashMap<String, Tensor>,
    rank: usize,
    cfg: &RankCfg,
) -> Result<Executor> {
    let params: HashMap<String, Tensor> = infer
        .param_types()
        .filter_map(|(n, _)| {
            train
                .param(n)
                .or_else(|| rest.get(n))
                .map(|t| (n.to_string(), t.clone()))
        })
        .collect();
    let mut e = Executor::new(infer.clone(), params, rank)?;
    e.set_backend(cfg.backend, cfg.kernels);
    e.set_overlap(cfg.overlap);
    Ok(e)
}

/// Evaluates `exec` on `set` after step `iter` (see the module docs). Returns the
/// metrics on rank 0, `None` on the others. The final evaluation (`last`) sends an
/// [`Event::Eval`] per batch (its metrics go in the report); one during training
/// sends its metrics as an [`Event::Evaluated`].
#[allow(clippy::too_many_arguments)]
pub(super) fn evaluate(
    rank: usize,
    comm: &dyn Communicator,
    exec: &mut Executor,
    source: &Source,
    set: &EvalSet,
    iter: u64,
    cfg: &RankCfg,
    send: &mut dyn FnMut(Event),
    last: bool,
) -> Result<Option<EvalMetrics>> {
    let batches = source.eval_batches(set);
    let local = batch_slice(cfg.global_batch, cfg.ranks, rank).len();
    let mut preds = Vec::with_capacity(batches.saturating_mul(local).min(PREALLOC));
    for b in 0..batches {
        let eval_err = |e: RuntimeError| RuntimeError::Rank {
            rank,
            step: None,
            reason: format!("evaluation batch {} of `{}`: {e}", b + 1, set.name),
        };
        let inputs = source
            .eval_inputs(set, b, cfg.global_batch, cfg.ranks, rank, exec.graph())
            .map_err(eval_err)?;
        let syms = step_syms(exec, &inputs, rank, cfg).map_err(eval_err)?;
        let outs = exec.step(inputs, &syms, comm).map_err(eval_err)?;
        let pred = outs.first().map(Tensor::to_f32_vec).unwrap_or_default();
        if pred.len() != local {
            return Err(eval_err(RuntimeError::Rank {
                rank,
                step: None,
                reason: format!(
                    "the inference graph's first output has {} values for {local} samples (expected one prediction per sample)",
                    pred.len()
                ),
            }));
        }
        preds.extend_from_slice(&pred);
        if last {
            send(Event::Eval {
                batch: b + 1,
                batches,
            });
        }
    }
    let comm_err = |e: dlrm_ir::IrError| RuntimeError::Rank {
        rank,
        step: None,
        reason: e.to_string(),
    };
    // The predictions to rank 0, which joins them in global sample order.
    let mut send_preds = vec![Vec::new(); cfg.ranks];
    send_preds[0] = preds;
    let got = comm.all_to_all_v(send_preds).map_err(comm_err)?;
    if rank != 0 {
        return Ok(None);
    }
    let valid: Vec<usize> = (0..batches)
        .map(|b| source.eval_valid(set, b, cfg.global_batch))
        .collect();
    let scores = join_predictions(got, cfg, &valid).map_err(|reason| RuntimeError::Rank {
        rank,
        step: None,
        reason,
    })?;
    let labels = source.eval_labels(set, cfg.global_batch);
    if labels.len() != scores.len() {
        return Err(RuntimeError::Rank {
            rank,
            step: None,
            reason: format!(
                "evaluation of `{}`: {} predictions for {} labels",
                set.name,
                scores.len(),
                labels.len()
            ),
        });
    }
    let m = EvalMetrics::compute(iter, &set.name, &scores, &labels);
    if !last {
        send(Event::Evaluated(m.clone()));
    }
    Ok(Some(m))
}

/// Rank 0's view of the gathered predictions: `got[r]` is rank r's predictions,
/// batch after batch; returns them in global sample order, batch after batch, the
/// first `valid[b]` of batch `b` only.
fn join_predictions(
    got: Vec<Vec<f32>>,
    cfg: &RankCfg,
    valid: &[usize],
) -> std::result::Result<Vec<f32>, String> {
    let batches = valid.len();
    let locals: Vec<usize> = (0..cfg.ranks)
        .map(|r| batch_slice(cfg.global_batch, cfg.ranks, r).len())
        .collect();
    for (r, (g, l)) in got.iter().zip(&locals).enumerate() {
        if g.len() != l * batches {
            return Err(format!(
                "rank {r} sent {} predictions, expected {} ({batches} batches of {l})",
                g.len(),
                l * batches,
            ));
        }
    }
    let mut scores = Vec::with_capacity(valid.iter().sum());
    for (b, &v) in valid.iter().enumerate() {
        let start = scores.len();
        for (g, &l) in got.iter().zip(&locals) {
            scores.extend_from_slice(&g[b * l..(b + 1) * l]);
        }
        scores.truncate(start + v);
    }
    Ok(scores)
}
