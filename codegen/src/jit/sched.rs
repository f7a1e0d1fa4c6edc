//! Sharing a kernel's work out among the pool's threads so that they finish
//! together: [`guided_chunks`] cuts rows into chunks that shrink towards the
//! end, and [`run_dynamic`] hands tasks out in order from one counter (the
//! blocked GEMMs' row chunks, `super::brgemm`). With equal chunks
//! on a parallel iterator one thread waited at the end of every kernel for
//! up to a chunk while the other ran its last one (rayon's idle time was
//! 6.4-6.7% of a dlrm-small inference step's CPU time on an Intel Xeon model
//! 207, 2 threads; about 4% after).

/// `0..m` cut into row chunks `(r0, rows)` on tile bounds (`mr` rows) for
/// [`run_dynamic`]: chunks of about `rb` rows while much work is left, then,
/// near the end, smaller ones (a `2·threads`-th of the tiles left, at least
/// `min_tiles`), so that the threads' last chunks end close together (guided
/// self-scheduling): with equal chunks one thread idled at the end of every
/// GEMM for up to a chunk while the other ran its last one.
pub(crate) fn guided_chunks(
    m: usize,
    mr: usize,
    rb: usize,
    min_tiles: usize,
) -> Vec<(usize, usize)> {
    let mr = mr.max(1);
    let tiles = m.div_ceil(mr);
    let threads = rayon::current_num_threads().max(1);
    let base = rb.div_ceil(mr).max(1);
    let least = min_tiles.clamp(1, base);
    let mut chunks = Vec::new();
    let mut t0 = 0;
    while t0 < tiles {
        let left = tiles - t0;
        let n = left.div_ceil(2 * threads).clamp(least, base).min(left);
        // No runt chunk after the last whole one.
        let n = if left - n < least && left <= base {
            left
        } else {
            n
        };
        let r0 = t0 * mr;
        chunks.push((r0, ((t0 + n) * mr).min(m) - r0));
        t0 += n;
    }
    chunks
}

/// Runs `f` on every task, each thread of the pool taking the next task from
/// one shared counter as it finishes one, so the tasks end in about the order
/// they are listed (a parallel iterator splits the list in halves, and runs
/// the small last tasks of [`guided_chunks`] in the middle of one thread's
/// half). Stops taking tasks after a failure and returns the first error.
pub(crate) fn run_dynamic<T: Send, E: Send>(
    tasks: Vec<T>,
    f: &(dyn Fn(T) -> Result<(), E> + Sync),
) -> Result<(), E> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
    use std::sync::{Mutex, PoisonError};
    let n = tasks.len();
    let slots: Vec<Mutex<Option<T>>> = tasks.into_iter().map(|t| Mutex::new(Some(t))).collect();
    let (next, failed) = (AtomicUsize::new(0), AtomicBool::new(false));
    let error: Mutex<Option<E>> = Mutex::new(None);
    let work = || {
        while !failed.load(Relaxed) {
            let Some(slot) = slots.get(next.fetch_add(1, Relaxed)) else {
                break;
            };
            let task = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
            if let Some(Err(e)) = task.map(f) {
                failed.store(true, Relaxed);
                error
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get_or_insert(e);
            }
        }
    };
    rayon::scope(|s| {
        for _ in 1..rayon::current_num_threads().clamp(1, n.max(1)) {
            s.spawn(|_| work());
        }
        work();
    });
    match error.into_inner().unwrap_or_else(PoisonError::into_inner) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::{guided_chunks, run_dynamic};

    #[test]
    fn guided_chunks_cover_the_rows_on_tile_bounds_and_shrink_to_the_end() {
        for m in [0, 1, 11, 12, 13, 200, 2048, 2051] {
            for mr in [1, 6, 12] {
                for rb in [1, 12, 264, 384, 5000] {
                    let c = guided_chunks(m, mr, rb, 4);
                    let mut next = 0;
                    for &(r0, rows) in &c {
                        assert_eq!(r0, next, "contiguous: {m} {mr} {rb} {c:?}");
                        assert!(rows > 0 && r0 % mr == 0, "{m} {mr} {rb} {c:?}");
                        assert!(rows <= rb.div_ceil(mr).max(1) * mr, "{m} {mr} {rb} {c:?}");
                        next = r0 + rows;
                    }
                    assert_eq!(next, m, "the chunks cover 0..{m}");
                    let t: Vec<usize> = c.iter().map(|&(_, rows)| rows.div_ceil(mr)).collect();
                    // Shrinking, but for the last (a runt joined to it).
                    let head = &t[..t.len().saturating_sub(1)];
                    assert!(
                        head.windows(2).all(|w| w[0] >= w[1]),
                        "{m} {mr} {rb}: {t:?}"
                    );
                }
            }
        }
        // 2048 rows of 12-row tiles (171 tiles) in chunks of up to 22 tiles,
        // on 2 threads: a quarter of the tiles left once that is less, down
        // to 4 tiles, the last 1-tile runt joined to its neighbour.
        let t: Vec<usize> = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .expect("a pool")
            .install(|| guided_chunks(2048, 12, 264, 4))
            .iter()
            .map(|c| c.1.div_ceil(12))
            .collect();
        assert_eq!(t, [22, 22, 22, 22, 21, 16, 12, 9, 7, 5, 4, 4, 5]);
    }

    #[test]
    fn run_dynamic_runs_every_task_once_and_returns_the_first_error() {
        use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .expect("a pool");
        let runs: Vec<AtomicUsize> = (0..100).map(|_| AtomicUsize::new(0)).collect();
        pool.install(|| {
            run_dynamic((0..100).collect(), &|i: usize| {
                runs[i].fetch_add(1, Relaxed);
                Ok::<(), ()>(())
            })
        })
        .expect("no task fails");
        assert!(runs.iter().all(|r| r.load(Relaxed) == 1));
        let err = pool.install(|| {
            run_dynamic((0..100).collect(), &|i: usize| match i {
                7 => Err(format!("task {i}")),
                _ => Ok(()),
            })
        });
        assert_eq!(err, Err("task 7".to_string()));
        assert!(
            pool.install(|| run_dynamic(Vec::<usize>::new(), &|_| Ok::<(), ()>(())))
                .is_ok()
        );
    }
}
