//! Collectives over a group of ranks: the interface the interpreter and runtime use.
//!
//! A [`Communicator`] is one rank's handle on its group. The IR defines what the
//! collective ops mean in terms of these primitives. [`crate::LocalGroup`] runs the
//! ranks as threads of one process (the embedded default, `local_group.rs`); the
//! runtime adds MPI.
//!
//! Failure rule: a rank that fails calls [`Communicator::abort`]; every rank blocked
//! in (or later entering) a collective then gets an error naming the failed rank,
//! so no rank hangs.

use crate::error::{IrError, Result};
use std::ops::Range;

/// One rank's view of its group.
pub trait Communicator: Send + Sync {
    /// This rank's index in `0..size()`.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn size(&self) -> usize;
    /// Elementwise sum of `data` over all ranks, in place on every rank. Ranks must
    /// call with equal lengths. Every rank gets bit-identical results; the order of
    /// the summation is the implementation's (a sequential sum up to float
    /// reassociation).
    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<()>;
    /// Personalised exchange: `send[r]` goes to rank `r`; returns `recv` where
    /// `recv[r]` came from rank `r`. Lengths may differ per pair.
    fn all_to_all_v(&self, send: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>>;
    /// Waits until every rank has called it.
    fn barrier(&self) -> Result<()>;
    /// How [`Communicator::all_reduce_sum`] reduces, for reports (e.g. `ring`, or
    /// the MPI library's own algorithm).
    fn all_reduce_algo(&self) -> String {
        "sequential".to_string()
    }
    /// Ends the group: this rank failed for `reason`. Every other rank's pending and
    /// future collectives return an error carrying the reason.
    fn abort(&self, reason: &str);
}

/// The group of one: every collective is the identity.
#[derive(Clone, Copy, Debug, Default)]
pub struct SingleRank;

impl Communicator for SingleRank {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_reduce_sum(&self, _data: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn all_to_all_v(&self, send: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>> {
        if send.len() != 1 {
            return Err(IrError::Comm(format!(
                "all_to_all_v on 1 rank with {} buffers",
                send.len()
            )));
        }
        Ok(send)
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
    fn all_reduce_algo(&self) -> String {
        "none (1 rank)".to_string()
    }
    fn abort(&self, _reason: &str) {}
}

/// The samples of a global batch of `global` that rank `rank` of `ranks` owns:
/// contiguous, in rank order, the first `global % ranks` ranks taking one more.
pub fn batch_slice(global: usize, ranks: usize, rank: usize) -> Range<usize> {
    let base = global / ranks;
    let rem = global % ranks;
    let start = rank * base + rank.min(rem);
    let len = base + usize::from(rank < rem);
    start..start + len
}

#[cfg(test)]
mod tests {
    use super::batch_slice;

    #[test]
    fn slices_cover_the_batch_in_order() {
        for global in [1usize, 7, 24, 2048] {
            for ranks in 1..=9 {
                let mut next = 0;
                for r in 0..ranks {
                    let s = batch_slice(global, ranks, r);
                    assert_eq!(s.start, next);
                    assert!(s.len() == global / ranks || s.len() == global / ranks + 1);
                    next = s.end;
                }
                assert_eq!(next, global);
            }
        }
    }
}
