//! How a rank's idle workers wait for the next parallel loop (`dlrm-run
//! --wait-policy`, OpenMP's `OMP_WAIT_POLICY` names): between two kernels'
//! loops, and while the rank's own thread runs a serial stretch, rayon's idle
//! workers spin briefly and then sleep, and the next loop waits for a futex wake
//! on a vCPU that may have halted. A dlrm-small training step slept and woke
//! its workers about 32 times (`perf stat -e context-switches` over 100 and
//! 300 steps, 2 threads).
//!
//! [`WaitPolicy::Active`] keeps every worker but the rank's own looking for
//! work for the whole run ([`hot_workers`]): they take each loop's tasks as
//! soon as they are pushed, and yield the CPU (`sched_yield`) between looks, so
//! a runnable thread of another process still gets it. That cut the switches to
//! about 5 a step. Against passive waiting, 3 interleaved rounds (Intel Xeon
//! model 207, 2 threads, `dlrm-run --bench`): dlrm-small trained 2.7-3.5% and
//! served 0.9-7.6% more samples a second, dlrm-kaggle served -1.3 to +4.5%,
//! dlrm-mlperf (long kernels, few waits) level within the noise.
//!
//! Like OpenMP's active wait, it keeps the rank's cores busy while the rank
//! has no parallel work (evaluation, checkpoints, reading data);
//! [`WaitPolicy::Auto`] uses it only where this process's workers fit the
//! machine's CPUs ([`WaitPolicy::active`], [`cpus`]).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// How a rank's idle workers wait (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WaitPolicy {
    /// Active where the process's workers fit its CPUs and it is the only
    /// process of its job on this machine (as far as the MPI launcher says);
    /// passive otherwise.
    #[default]
    Auto,
    /// The idle workers keep looking for work (and yield between looks).
    Active,
    /// rayon's own waiting: a short spin, then sleep until woken.
    Passive,
}

impl WaitPolicy {
    /// Every policy, in `--help` order.
    pub const ALL: [WaitPolicy; 3] = [WaitPolicy::Auto, WaitPolicy::Active, WaitPolicy::Passive];

    /// The policy's flag value.
    pub fn name(self) -> &'static str {
        match self {
            WaitPolicy::Auto => "auto",
            WaitPolicy::Active => "active",
            WaitPolicy::Passive => "passive",
        }
    }

    /// Whether the workers wait actively: `threads` workers in each of
    /// `ranks_here` ranks of this process, on `cpus` CPUs, with `procs_here`
    /// processes of the job on this machine (`None`: unknown, e.g. under an MPI
    /// launcher that does not say). One worker a rank has no one to keep hot.
    pub fn active(
        self,
        threads: usize,
        ranks_here: usize,
        cpus: usize,
        procs_here: Option<usize>,
    ) -> bool {
        match self {
            WaitPolicy::Active => threads > 1,
            WaitPolicy::Passive => false,
            WaitPolicy::Auto => {
                threads > 1
                    && procs_here.is_some_and(|p| {
                        p.saturating_mul(ranks_here).saturating_mul(threads) <= cpus
                    })
            }
        }
    }
}

impl fmt::Display for WaitPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for WaitPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        WaitPolicy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown wait policy `{s}` (auto, active, passive)"))
    }
}

/// The CPUs this process may run on (its affinity and cgroup quota, as the
/// standard library reads them; 1 if unknown). Not `RAYON_NUM_THREADS`: that
/// sets how many workers to start, not how many CPUs they share.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The processes of this job on this machine, as an MPI launcher tells its
/// processes (Open MPI's `OMPI_COMM_WORLD_LOCAL_SIZE`, MPICH's and Intel
/// MPI's `MPI_LOCALNRANKS`); `None` when none of them is set to a number.
pub fn mpi_local_size() -> Option<usize> {
    ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
}

/// Runs `f` on the current rayon worker with every other worker of its pool
/// looking for work until `f` returns or unwinds, when `active`; else just
/// runs `f`. Each other worker runs one broadcast task that takes jobs
/// (`rayon::yield_now`: its own, stolen, injected) and yields the CPU when it
/// finds none; the current worker's share of the broadcast returns at once, so
/// it never runs a spinning task beneath `f`.
pub(super) fn hot_workers<R>(active: bool, f: impl FnOnce() -> R) -> R {
    hot_workers_counted(active, &Arc::new(AtomicUsize::new(0)), f)
}

/// [`hot_workers`], counting the spinning tasks running in `live`.
fn hot_workers_counted<R>(active: bool, live: &Arc<AtomicUsize>, f: impl FnOnce() -> R) -> R {
    /// Sets the flag when dropped: the spinning tasks end however `f` ends.
    struct Stop(Arc<AtomicBool>);
    impl Drop for Stop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }
    let me = rayon::current_thread_index();
    if !active || me.is_none() {
        return f();
    }
    let stop = Stop(Arc::new(AtomicBool::new(false)));
    let (flag, live) = (Arc::clone(&stop.0), Arc::clone(live));
    rayon::spawn_broadcast(move |ctx| {
        if Some(ctx.index()) == me {
            return;
        }
        live.fetch_add(1, Ordering::AcqRel);
        while !flag.load(Ordering::Acquire) {
            if rayon::yield_now() != Some(rayon::Yield::Executed) {
                std::thread::yield_now();
            }
        }
        live.fetch_sub(1, Ordering::AcqRel);
    });
    f()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;
    use std::time::{Duration, Instant};

    /// Waits (up to a minute) until no spinning task runs.
    fn until_none_live(live: &AtomicUsize) -> usize {
        let t0 = Instant::now();
        while live.load(Ordering::Acquire) > 0 && t0.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(1));
        }
        live.load(Ordering::Acquire)
    }

    #[test]
    fn names_round_trip_and_unknown_ones_are_refused() {
        for p in WaitPolicy::ALL {
            assert_eq!(p.name().parse::<WaitPolicy>(), Ok(p));
            assert_eq!(p.to_string(), p.name());
        }
        let e = "spin".parse::<WaitPolicy>().expect_err("an unknown policy");
        assert!(e.contains("auto, active, passive"), "{e}");
    }

    #[test]
    fn auto_is_active_only_where_the_workers_fit_the_cpus() {
        let auto = WaitPolicy::Auto;
        assert!(auto.active(2, 1, 2, Some(1)));
        assert!(
            !auto.active(1, 1, 2, Some(1)),
            "one worker: no one to keep hot"
        );
        assert!(!auto.active(2, 2, 2, Some(1)), "two ranks of 2 on 2 CPUs");
        assert!(
            !auto.active(2, 1, 2, Some(2)),
            "two processes of 2 on 2 CPUs"
        );
        assert!(
            !auto.active(2, 1, 64, None),
            "an MPI launcher that does not say"
        );
        assert!(auto.active(4, 2, 16, Some(2)));
        assert!(!auto.active(usize::MAX, 2, 16, Some(usize::MAX)));
        assert!(WaitPolicy::Active.active(2, 4, 2, None));
        assert!(!WaitPolicy::Active.active(1, 1, 2, Some(1)));
        assert!(!WaitPolicy::Passive.active(2, 1, 64, Some(1)));
    }

    /// With the other workers kept looking for work, parallel loops give the
    /// same results and the run ends: the spinning tasks run while `f` does
    /// and stop when it returns, and when it unwinds.
    #[test]
    fn hot_workers_run_the_loops_and_stop_with_f() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .expect("a pool");
        let live = Arc::new(AtomicUsize::new(0));
        let (sum, spinning) = pool.install(|| {
            hot_workers_counted(true, &live, || {
                let sum = (0..50u64)
                    .map(|k| (0..10_000u64).into_par_iter().map(|i| i * k).sum::<u64>())
                    .sum::<u64>();
                // Both other workers pick up their spinning task.
                let t0 = Instant::now();
                while live.load(Ordering::Acquire) < 2 && t0.elapsed() < Duration::from_secs(60) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                (sum, live.load(Ordering::Acquire))
            })
        });
        assert_eq!(sum, (0..50u64).sum::<u64>() * (0..10_000u64).sum::<u64>());
        assert_eq!(spinning, 2);
        assert_eq!(until_none_live(&live), 0);
        let caught = pool.install(|| {
            std::panic::catch_unwind(|| hot_workers_counted(true, &live, || panic!("f fails")))
        });
        assert!(caught.is_err());
        assert_eq!(until_none_live(&live), 0);
        // Outside a pool, or passive, `f` just runs, and nothing spins.
        assert_eq!(hot_workers_counted(true, &live, || 7), 7);
        assert_eq!(pool.install(|| hot_workers_counted(false, &live, || 8)), 8);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(live.load(Ordering::Acquire), 0);
    }
}
