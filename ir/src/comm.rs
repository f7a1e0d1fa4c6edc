//! Collectives over a group of ranks: the interface the interpreter and runtime use.
//!
//! A [`Communicator`] is one rank's handle on its group. The IR defines what the
//! collective ops mean in terms of these primitives. [`LocalGroup`] runs the ranks
//! as threads of one process (the embedded default); the runtime adds MPI.
//!
//! Failure rule: a rank that fails calls [`Communicator::abort`]; every rank blocked
//! in (or later entering) a collective then gets an error naming the failed rank,
//! so no rank hangs.

use crate::error::{IrError, Result};
use std::ops::Range;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// One rank's view of its group.
pub trait Communicator: Send + Sync {
    /// This rank's index in `0..size()`.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn size(&self) -> usize;
    /// Elementwise sum of `data` over all ranks, in place on every rank. Ranks must
    /// call with equal lengths. The sum is taken in rank order, so every rank gets
    /// bit-identical results.
    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<()>;
    /// Personalised exchange: `send[r]` goes to rank `r`; returns `recv` where
    /// `recv[r]` came from rank `r`. Lengths may differ per pair.
    fn all_to_all_v(&self, send: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>>;
    /// Waits until every rank has called it.
    fn barrier(&self) -> Result<()>;
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
    fn abort(&self, _reason: &str) {}
}

/// A group of ranks that are threads of one process.
///
/// Each collective is one or two *rounds*: every rank deposits its buffers, waits
/// until all have, then reads the others' deposits. Deposits are kept per round
/// parity (double buffering): a rank can run at most one round ahead of the slowest,
/// so it never overwrites a deposit still being read. Reductions are computed by
/// chunk owners in rank order, so every rank receives bit-identical sums, equal to a
/// sequential sum over ranks 0, 1, .., n-1.
pub struct LocalGroup;

type Deposit = Arc<Vec<Vec<f32>>>;

struct RoundState {
    generation: u64,
    arrived: usize,
    slots: [Vec<Option<Deposit>>; 2],
    aborted: Option<String>,
}

struct Shared {
    size: usize,
    state: Mutex<RoundState>,
    cv: Condvar,
}

/// One rank's handle on a [`LocalGroup`].
#[derive(Clone)]
pub struct LocalComm {
    rank: usize,
    shared: Arc<Shared>,
}

impl LocalGroup {
    /// Creates a group of `size` ranks; hand element `r` to the thread of rank `r`.
    /// `size` must be at least 1.
    #[expect(
        clippy::new_ret_no_self,
        reason = "a group is handed out as one handle per rank"
    )]
    pub fn new(size: usize) -> Vec<LocalComm> {
        assert!(size >= 1, "a group has at least one rank");
        let shared = Arc::new(Shared {
            size,
            state: Mutex::new(RoundState {
                generation: 0,
                arrived: 0,
                slots: [vec![None; size], vec![None; size]],
                aborted: None,
            }),
            cv: Condvar::new(),
        });
        (0..size)
            .map(|rank| LocalComm {
                rank,
                shared: Arc::clone(&shared),
            })
            .collect()
    }
}

impl LocalComm {
    fn lock(&self) -> MutexGuard<'_, RoundState> {
        // A poisoned lock means a rank panicked while holding it; the state is still
        // consistent for our purposes (we only read the abort flag and slots).
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One round: deposit, wait for all ranks, return every rank's deposit.
    fn round(&self, deposit: Vec<Vec<f32>>) -> Result<Vec<Deposit>> {
        let n = self.shared.size;
        let mut st = self.lock();
        if let Some(why) = &st.aborted {
            return Err(IrError::Comm(why.clone()));
        }
        let generation = st.generation;
        let parity = (generation % 2) as usize;
        st.slots[parity][self.rank] = Some(Arc::new(deposit));
        st.arrived += 1;
        if st.arrived == n {
            st.arrived = 0;
            st.generation += 1;
            self.shared.cv.notify_all();
        } else {
            while st.generation == generation && st.aborted.is_none() {
                st = self.shared.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        }
        if st.generation == generation {
            // Woken by an abort before the round completed.
            let why = st.aborted.clone().unwrap_or_else(|| "group aborted".into());
            return Err(IrError::Comm(why));
        }
        st.slots[parity]
            .iter()
            .map(|d| {
                d.clone()
                    .ok_or_else(|| IrError::Comm("a rank deposited nothing".into()))
            })
            .collect()
    }
}

impl Communicator for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<()> {
        let n = self.shared.size;
        if n == 1 {
            return Ok(());
        }
        let all = self.round(vec![data.to_vec()])?;
        if let Some(bad) = all.iter().position(|d| d[0].len() != data.len()) {
            let why = format!(
                "all_reduce length mismatch: rank {} has {}, rank {bad} has {}",
                self.rank,
                data.len(),
                all[bad][0].len()
            );
            self.abort(&why);
            return Err(IrError::Comm(why));
        }
        // Reduce my chunk in rank order, then share the chunks.
        let mine = batch_slice(data.len(), n, self.rank);
        let mut chunk = vec![0.0f32; mine.len()];
        for d in &all {
            for (c, x) in chunk.iter_mut().zip(&d[0][mine.clone()]) {
                *c += *x;
            }
        }
        let chunks = self.round(vec![chunk])?;
        for (r, c) in chunks.iter().enumerate() {
            let len = data.len();
            data[batch_slice(len, n, r)].copy_from_slice(&c[0]);
        }
        Ok(())
    }

    fn all_to_all_v(&self, send: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>> {
        let n = self.shared.size;
        if send.len() != n {
            return Err(IrError::Comm(format!(
                "all_to_all_v on rank {} with {} buffers for {n} ranks",
                self.rank,
                send.len()
            )));
        }
        if n == 1 {
            return Ok(send);
        }
        let all = self.round(send)?;
        Ok(all.iter().map(|d| d[self.rank].clone()).collect())
    }

    fn barrier(&self) -> Result<()> {
        self.round(Vec::new()).map(|_| ())
    }

    fn abort(&self, reason: &str) {
        let mut st = self.lock();
        if st.aborted.is_none() {
            st.aborted = Some(format!("rank {} failed: {reason}", self.rank));
        }
        self.shared.cv.notify_all();
    }
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
    use super::{Communicator, LocalGroup, batch_slice};
    use std::thread;

    fn on_ranks<T: Send + 'static>(
        n: usize,
        f: impl Fn(super::LocalComm) -> T + Send + Sync + Clone + 'static,
    ) -> Vec<T> {
        let handles: Vec<_> = LocalGroup::new(n)
            .into_iter()
            .map(|c| {
                let f = f.clone();
                thread::spawn(move || f(c))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    }

    #[test]
    fn all_reduce_sums_in_rank_order_on_every_rank() {
        for n in [1usize, 2, 3, 5, 8] {
            let out = on_ranks(n, move |c| {
                let mut v: Vec<f32> = (0..11).map(|i| (c.rank() * 100 + i) as f32).collect();
                for _ in 0..3 {
                    c.all_reduce_sum(&mut v).expect("allreduce");
                    v.iter_mut().for_each(|x| *x /= n as f32);
                }
                v
            });
            let want: Vec<f32> = (0..11)
                .map(|i| (0..n).map(|r| (r * 100 + i) as f32).sum::<f32>() / n as f32)
                .collect();
            for v in &out {
                for (a, b) in v.iter().zip(&want) {
                    assert!((a - b).abs() < 1e-3, "{a} vs {b}");
                }
                assert_eq!(v, &out[0], "ranks disagree bitwise");
            }
        }
    }

    #[test]
    fn all_to_all_delivers_personalised_buffers() {
        let out = on_ranks(4, |c| {
            let send = (0..4)
                .map(|d| vec![(c.rank() * 10 + d) as f32; d + 1])
                .collect();
            c.all_to_all_v(send).expect("a2a")
        });
        for (r, recv) in out.iter().enumerate() {
            for (s, buf) in recv.iter().enumerate() {
                assert_eq!(buf, &vec![(s * 10 + r) as f32; r + 1]);
            }
        }
    }

    #[test]
    fn abort_wakes_every_waiting_rank() {
        let out = on_ranks(3, |c| {
            if c.rank() == 1 {
                c.abort("boom");
                return Err("aborted".to_string());
            }
            c.barrier().map_err(|e| e.to_string())
        });
        assert!(
            out[0]
                .as_ref()
                .is_err_and(|e| e.contains("rank 1 failed: boom")),
            "{out:?}"
        );
        assert!(out[2].is_err());
    }

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
