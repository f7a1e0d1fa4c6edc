//! One rank's run: its executor, its training steps (with the evaluations during
//! training and the checkpoints), the final evaluation; the failure rule (a panic
//! or an error aborts the group, naming the rank and the step).

use super::limits::PREALLOC;
use super::{Event, Mode, RankCfg, RankOutput, eval};
use crate::checkpoint::DataPosition;
use crate::error::{Result, RuntimeError};
use crate::exec::Executor;
use crate::prefetch::{LoaderSpec, with_loader};
use crate::progress::CommTimes;
use crate::source::Source;
use dlrm_ir::{Communicator, Dim, Graph, Tensor, batch_slice};
use std::cell::Cell;
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

/// Takes from `params` the parameters `g` declares.
pub(super) fn params_for(
    g: &Graph,
    params: &mut HashMap<String, Tensor>,
) -> HashMap<String, Tensor> {
    g.param_types()
        .filter_map(|(n, _)| params.remove_entry(n))
        .collect()
}

/// Symbols of one rank's step: those the inputs carry, plus `B` and `G`.
pub(super) fn step_syms(
    exec: &Executor,
    inputs: &HashMap<String, Tensor>,
    rank: usize,
    cfg: &RankCfg,
) -> Result<HashMap<String, usize>> {
    let mut syms = exec.bind_symbols(inputs)?;
    let local = batch_slice(cfg.global_batch, cfg.ranks, rank).len();
    for (s, v) in [(Dim::BATCH, local), (Dim::GLOBAL, cfg.global_batch)] {
        match syms.insert(s.to_string(), v) {
            Some(old) if old != v => {
                return Err(RuntimeError::Rank {
                    rank,
                    step: Some(exec.next_step()),
                    reason: format!("the inputs bind {s} = {old}, the job says {v}"),
                });
            }
            _ => {}
        }
    }
    Ok(syms)
}

/// [`rank_main`] with the failure rule: a panic becomes an error naming the rank
/// and the step it happened in, and any error aborts the group before returning.
/// The rank's parameters come from `params`, called first (the rank creates them
/// under the same rule).
pub(super) fn rank_guarded(
    rank: usize,
    comm: &dyn Communicator,
    graphs: (Option<Graph>, Graph),
    params: impl FnOnce() -> Result<HashMap<String, Tensor>>,
    data: &Source,
    cfg: &RankCfg,
    events: &mut (dyn FnMut(Event) + Send),
) -> Result<RankOutput> {
    let step = Cell::new(None);
    let out = catch_unwind(AssertUnwindSafe(|| {
        let params = params()?;
        rank_main(rank, comm, graphs, params, data, cfg, events, &step)
    }));
    let out = match out {
        Ok(r) => r,
        Err(payload) => Err(RuntimeError::Rank {
            rank,
            step: step.get(),
            reason: format!("panicked: {}", panic_message(&*payload)),
        }),
    };
    if let Err(e) = &out {
        comm.abort(&e.to_string());
    }
    out
}

/// The worker pool of `rank`: its kernels' parallel loops run on these `threads`
/// only. The rank's code runs *on* one of the workers (`install`, or a task
/// spawned into the pool), so a kernel's parallel loop is a fork-join among the
/// workers, not a hand-over from a thread outside the pool that then sleeps until
/// the loop is done (measured: 300 → 47 context switches per `dlrm-small`
/// training step, 2 threads).
pub(super) fn rank_pool(rank: usize, threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("dlrm-rank-{rank}-w{i}"))
        .build()
        .map_err(|e| RuntimeError::Rank {
            rank,
            step: None,
            reason: format!("cannot start its {threads} worker threads: {e}"),
        })
}

/// One rank's whole run: steps (with the evaluations during training), the final
/// evaluation, predictions to rank 0. `step` tracks the training (or inference)
/// step in progress, for error reports.
#[allow(clippy::too_many_arguments)]
fn rank_main(
    rank: usize,
    comm: &dyn Communicator,
    (train, infer): (Option<Graph>, Graph),
    mut params: HashMap<String, Tensor>,
    data: &Source,
    cfg: &RankCfg,
    send: &mut dyn FnMut(Event),
    at_step: &Cell<Option<u64>>,
) -> Result<RankOutput> {
    let training = train.is_some();
    let mut exec = match train {
        Some(g) => {
            let p = params_for(&g, &mut params);
            Executor::new(g, p, rank)?
        }
        None => {
            let p = params_for(&infer, &mut params);
            Executor::new(infer.clone(), p, rank)?
        }
    };
    exec.set_backend(cfg.backend, cfg.kernels);
    exec.set_overlap(cfg.overlap);
    let mut out = RankOutput {
        losses: Vec::new(),
        last_loss: None,
        step_times: Vec::with_capacity(
            usize::try_from((cfg.iters + 1).saturating_sub(cfg.start))
                .map_or(PREALLOC, |n| n.min(PREALLOC)),
        ),
        final_metrics: None,
        evals: Vec::new(),
        op_times: Vec::new(),
        node_times: Vec::new(),
        comm: CommTimes::default(),
        params: HashMap::new(),
        threads: rayon::current_num_threads(),
    };
    exec.set_step(cfg.start);
    // The step's buffers (the batch's inputs among them) before the loader
    // assembles the first batch: one too large is an error, not an abort.
    let local = batch_slice(cfg.global_batch, cfg.ranks, rank).len();
    let batch: HashMap<String, usize> = [(Dim::BATCH, local), (Dim::GLOBAL, cfg.global_batch)]
        .into_iter()
        .map(|(s, n)| (s.to_string(), n))
        .collect();
    exec.check_buffers(&batch)?;
    let loader_graph = exec.graph().clone();
    let spec = LoaderSpec {
        source: data,
        graph: &loader_graph,
        global_batch: cfg.global_batch,
        ranks: cfg.ranks,
        rank,
        depth: cfg.prefetch,
        cycle: cfg.cycle,
    };
    with_loader(spec, cfg.start - 1..cfg.iters, |next| {
        train_steps(
            rank,
            comm,
            &mut exec,
            next,
            (&infer, &params),
            data,
            cfg,
            send,
            at_step,
            &mut out,
        )
    })?;
    out.op_times = exec.op_times();
    out.node_times = exec.node_times(usize::MAX);
    out.comm = exec.comm_times();

    // The final evaluation, with the trained parameters.
    at_step.set(None);
    let mut eval = if training {
        let mut trained = exec.into_params();
        trained.extend(params.drain());
        params = trained;
        let p = params_for(&infer, &mut params);
        let mut e = Executor::new(infer, p, rank)?;
        e.set_backend(cfg.backend, cfg.kernels);
        e.set_overlap(cfg.overlap);
        e
    } else {
        exec
    };
    out.final_metrics = eval::evaluate(
        rank,
        comm,
        &mut eval,
        data,
        &cfg.final_set,
        cfg.iters,
        cfg,
        send,
        true,
    )?;
    let mut final_params = eval.into_params();
    final_params.extend(params);
    out.params = final_params;
    // Leave the group together (a late failure elsewhere still reaches us).
    comm.barrier().map_err(|e| RuntimeError::Rank {
        rank,
        step: None,
        reason: e.to_string(),
    })?;
    Ok(out)
}

/// The steps `cfg.start..=cfg.iters` of [`rank_main`], reading step k's inputs from
/// `next(k - 1)`; with `cfg.eval_every`, evaluations of a copy of the current
/// parameters (the inference graph `infer`, parameters the training graph does not
/// hold from `rest`).
#[allow(clippy::too_many_arguments)]
fn train_steps(
    rank: usize,
    comm: &dyn Communicator,
    exec: &mut Executor,
    next: &mut crate::prefetch::Next<'_>,
    (infer, rest): (&Graph, &HashMap<String, Tensor>),
    data: &Source,
    cfg: &RankCfg,
    send: &mut dyn FnMut(Event),
    at_step: &Cell<Option<u64>>,
    out: &mut RankOutput,
) -> Result<()> {
    let data_err = |step: u64, e: RuntimeError| RuntimeError::Rank {
        rank,
        step: Some(step),
        reason: e.to_string(),
    };
    let is_logged =
        |k: u64| k == cfg.iters || (cfg.log_every > 0 && k.is_multiple_of(cfg.log_every));
    let training = cfg.mode == Mode::Train;
    let start = Instant::now();
    for k in cfg.start..=cfg.iters {
        at_step.set(Some(k));
        let inputs = next(k - 1).map_err(|e| match e {
            e @ RuntimeError::Rank { .. } => e,
            e => data_err(k, e),
        })?;
        let syms = step_syms(exec, &inputs, rank, cfg)?;
        // The step's rate: a pure function of k, the same on every rank.
        let lr = if training { cfg.lr.at(k) } else { None };
        if training && cfg.lr.schedule.is_some() {
            exec.set_lr(lr)?;
        }
        let t0 = Instant::now();
        let outs = exec.step(inputs, &syms, comm)?;
        let dt = t0.elapsed().as_secs_f64();
        out.step_times.push(dt);
        if k + 1 - cfg.start == cfg.warmup && cfg.iters + 1 - cfg.start > cfg.warmup {
            // The per-op times (--bench) cover the same steps as samples/s: not
            // the warm-up, whose first step compiles and tunes the kernels.
            exec.reset_timers();
        }
        let loss = if training {
            let l = outs
                .first()
                .and_then(|t| t.to_f32_vec().first().copied())
                .ok_or_else(|| RuntimeError::Rank {
                    rank,
                    step: Some(k),
                    reason: "the training graph's first output (the loss) is empty".into(),
                })?;
            if !l.is_finite() {
                return Err(RuntimeError::NonFinite {
                    rank,
                    step: k,
                    value: l,
                });
            }
            out.last_loss = Some(l);
            Some(l)
        } else {
            None
        };
        if is_logged(k) {
            if let Some(l) = loss {
                out.losses.push((k, l));
            }
            send(Event::Step {
                iter: k,
                loss,
                lr,
                samples_per_s: if dt > 0.0 {
                    cfg.global_batch as f64 / dt
                } else {
                    0.0
                },
                elapsed: start.elapsed(),
            });
        }
        if let Some(set) = &cfg.eval_set
            && (k.is_multiple_of(cfg.eval_every) || k == cfg.iters)
        {
            let mut e = eval::snapshot(infer, exec, rest, rank, cfg)?;
            if let Some(m) = eval::evaluate(rank, comm, &mut e, data, set, k, cfg, send, false)? {
                out.evals.push(m);
            }
        }
        if let Some(w) = &cfg.writer
            && w.due(k, cfg.iters)
        {
            let pos = data_position(data, cfg, k);
            let lookup = lookup_in(exec, rest);
            let written = w.write(rank, comm, k, pos, &lookup).map_err(|e| match e {
                e @ (RuntimeError::Rank { .. } | RuntimeError::Param { .. }) => e,
                e => RuntimeError::Rank {
                    rank,
                    step: Some(k),
                    reason: format!("writing the checkpoint: {e}"),
                },
            })?;
            if let Some(w) = written {
                send(Event::Checkpoint(w));
            }
        }
    }
    Ok(())
}

/// A rank's current parameter values by name: the executor's, then `rest`.
pub(super) fn lookup_in<'t>(
    exec: &'t Executor,
    rest: &'t HashMap<String, Tensor>,
) -> impl Fn(&str) -> Option<&'t Tensor> + 't {
    move |n| exec.param(n).or_else(|| rest.get(n))
}

/// Where the data stands after step `k` (the next step reads data step `k`).
pub(super) fn data_position(data: &Source, cfg: &RankCfg, k: u64) -> DataPosition {
    let pos = data.dataset().map(|d| d.position(k));
    DataPosition {
        source: if pos.is_some() {
            "dataset"
        } else {
            "synthetic"
        }
        .to_string(),
        dataset: cfg.data_desc.as_ref().map(|d| d.0.clone()),
        train_split: cfg.data_desc.as_ref().map(|d| d.1.clone()),
        next_data_step: k,
        epoch: pos.map(|p| p.epoch),
        batch: pos.map(|p| p.batch),
    }
}

pub(super) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_string()
    }
}
