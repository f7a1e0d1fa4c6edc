//! The loader's prefetch: a producer thread per rank assembles the inputs of the next
//! training steps into a bounded channel (`std::sync::mpsc::sync_channel` of
//! `depth` batches); the training thread only receives. The producer stops at the
//! last step, at its first error (which the consumer receives in order, at the step
//! it belongs to), or as soon as the consumer is gone (an early exit drops the
//! receiver, so a blocked `send` fails and the thread ends before the scope joins
//! it). Sources that do not prefetch ([`Source::prefetches`]) are read in place.
//! With a cycle of `n` batches (synthetic data, `dlrm-run --synthetic-batches`),
//! step `s` takes batch `s mod n`, each generated once, then copied.

use crate::error::{Result, RuntimeError};
use crate::source::Source;
use dlrm_ir::{Graph, Tensor};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::mpsc::sync_channel;

/// The inputs of one step.
pub(crate) type Inputs = HashMap<String, Tensor>;

/// What the body of [`with_loader`] calls for the inputs of step `s` (0-based), in
/// increasing order over the loader's steps.
pub(crate) type Next<'a> = dyn FnMut(u64) -> Result<Inputs> + 'a;

/// Where a rank's loader reads.
pub(crate) struct LoaderSpec<'a> {
    pub source: &'a Source,
    pub graph: &'a Graph,
    pub global_batch: usize,
    pub ranks: usize,
    pub rank: usize,
    pub depth: usize,
    /// Batches generated once and cycled (0: a new batch every step).
    pub cycle: usize,
}

/// Runs `body` with a loader of steps `steps` (see the module docs).
pub(crate) fn with_loader<R>(
    spec: LoaderSpec<'_>,
    steps: Range<u64>,
    body: impl FnOnce(&mut Next<'_>) -> R,
) -> R {
    let LoaderSpec {
        source,
        graph,
        global_batch,
        ranks,
        rank,
        depth,
        cycle,
    } = spec;
    let load = move |s: u64| source.train_inputs(s, global_batch, ranks, rank, graph);
    if cycle > 0 {
        // Made as the steps first reach them: never more than the steps run.
        let mut made: HashMap<u64, Inputs> = HashMap::new();
        let mut next = move |s: u64| -> Result<Inputs> {
            let k = s % cycle as u64;
            if let Some(inputs) = made.get(&k) {
                return Ok(inputs.clone());
            }
            let inputs = load(k)?;
            made.insert(k, inputs.clone());
            Ok(inputs)
        };
        return body(&mut next);
    }
    if !source.prefetches() {
        let mut next = load;
        return body(&mut next);
    }
    std::thread::scope(|scope| {
        let (tx, rx) = sync_channel::<(u64, Result<Inputs>)>(depth.max(1));
        let producer = std::thread::Builder::new()
            .name(format!("dlrm-loader-{rank}"))
            .spawn_scoped(scope, move || {
                for s in steps {
                    let r = load(s);
                    let failed = r.is_err();
                    if tx.send((s, r)).is_err() || failed {
                        break;
                    }
                }
            });
        let start_err = producer.err().map(|e| e.to_string());
        let mut next = move |want: u64| -> Result<Inputs> {
            if let Some(e) = &start_err {
                return Err(RuntimeError::Rank {
                    rank,
                    step: Some(want + 1),
                    reason: format!("cannot start the loader thread: {e}"),
                });
            }
            match rx.recv() {
                Ok((s, r)) if s == want => r,
                Ok((s, _)) => Err(RuntimeError::Rank {
                    rank,
                    step: Some(want + 1),
                    reason: format!("the loader delivered step {} for step {}", s + 1, want + 1),
                }),
                Err(_) => Err(RuntimeError::Rank {
                    rank,
                    step: Some(want + 1),
                    reason: "the loader stopped before this step".into(),
                }),
            }
        };
        let out = body(&mut next);
        // Unblock the producer (if still sending) before the scope joins it.
        drop(next);
        out
    })
}
