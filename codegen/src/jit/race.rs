//! [`Jit::pick_variant`]'s timing race among GEMM candidates that give the
//! same bits: which candidates are timed again after their warm-up run
//! ([`PRUNE`]), and which wins ([`race_winner`]).

use super::{Jit, JitError, gemm};
use std::time::Instant;

/// How many times the fastest candidate's warm-up time a GEMM candidate's
/// may take and still be timed by [`Jit::pick_variant`]: the candidates give
/// the same bits, so dropping the slow ones early changes no number, only the
/// time the choice takes. The Cranelift kernels (3-5x the native kernels'
/// time) and, on an AVX-512 CPU, the AVX2 ones (about 2x) stop after one
/// run; variants of one micro-kernel (packed `A` or not, reduction chunks,
/// within about 1.3x of each other) stay. dlrm-mlperf's first training step
/// took 7.6 s of which 6.2 s choosing, every candidate run four times.
pub(super) const PRUNE: f64 = 1.5;

/// Up to how many times the fastest warm-up time a GEMM candidate's warm-up
/// over [`PRUNE`] is run once more before it is dropped (the better of its
/// two runs then counts). The AVX-512 kernel's first run of dlrm-small's
/// 2048×512×256 bf16 layer once took 7.5 ms against 2.2-2.4 ms in other
/// runs (Intel Xeon model 207), over 1.5 times the AVX2 kernel's 3.5 ms: the
/// AVX2 kernel was chosen and the two layers of that shape ran at half speed
/// for the whole run (5 of 14 runs of its inference in one series). The
/// Cranelift kernels (3-5x) mostly stay at one run.
pub(super) const RETRY: f64 = 4.0;

/// How much faster than the same variant without reduction chunks a chunked
/// GEMM candidate must be in [`Jit::pick_variant`]'s race to be chosen. The
/// race times a shape's first calls back to back, its operands warm in cache;
/// in a training step they come from further out, and there the chunked picks
/// of such near ties were slower: with the chunks forced off
/// (`DLRM_JIT_CHUNK_K=0`) against the race's picks, 3 interleaved pairs
/// (Intel Xeon model 207, 2026-11-30), dlrm-small trained 1.9-2.7% and
/// dlrm-mlperf 0.1-2.2% more samples/s. Where chunks pay (DLRM-DCNv2's
/// weight gradients, 20% faster chunked on a Zen 5 class CPU) they clear
/// this margin.
pub(super) const CHUNK_MARGIN: f64 = 1.05;

/// How much faster than the AVX-512 candidates a narrower one (the AVX2 or
/// the Cranelift kernel) must be in [`Jit::pick_variant`]'s race to be
/// chosen where the AVX-512 kernel was timed too. On an AMD EPYC Zen 4
/// (512-bit operations on 256-bit units) the AVX2 kernel comes within
/// 4-30% of the AVX-512 one (`DLRM_JIT_RACE_LOG`, dlrm-mlperf training:
/// k = 256 0.664 against 0.633 ms, k = 512 2.83 against 2.55, k = 13 0.26
/// against 0.20), close enough for a busy moment of this VM to hand it a
/// shape: 2 of 16 runs (dlrm-mlperf training, dlrm-small inference) gave
/// one shape to the AVX2 kernel, and in one training run profiled
/// (`perf record`) its tile took 7.2% of the step's cycles. No timed shape
/// has had the AVX2 kernel truly faster on an AVX-512 CPU.
pub(super) const NARROW_MARGIN: f64 = 1.05;

/// The race's winner among `timed` (candidate, best time): the fastest, a
/// chunked candidate ([`gemm::GemmSpec::kc`]) counted [`CHUNK_MARGIN`] times
/// slower than timed when its unchunked twin was timed too (so it wins only
/// by that margin over its twin), and a narrower kernel's
/// [`NARROW_MARGIN`] times slower when an AVX-512 one was timed. `None` if
/// empty.
pub(super) fn race_winner(timed: &[(gemm::GemmSpec, f64)]) -> Option<gemm::GemmSpec> {
    use gemm::Micro;
    let wide = timed.iter().any(|(c, _)| c.micro == Micro::Native512);
    let counted = |&(c, t): &(gemm::GemmSpec, f64)| {
        let plain = gemm::GemmSpec { kc: 0, ..c };
        let twin = c.kc > 0 && timed.iter().any(|(p, _)| *p == plain);
        let narrow = wide && matches!(c.micro, Micro::Native | Micro::Cranelift);
        let t = if twin { t * CHUNK_MARGIN } else { t };
        (c, if narrow { t * NARROW_MARGIN } else { t })
    };
    timed
        .iter()
        .map(counted)
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(c, _)| c)
}

/// `c`, and where `c` reads an f32 `B` in place across more than one panel
/// or a bf16 `B` in place, its twin that packs `B` once per call (to f32),
/// as `pack_b` allows
/// ([`super::JitOptions::pack_b`]): on an Intel Xeon model 207 (2 threads, one
/// binary, interleaved) reading dlrm-small's 64-wide weight blocks in place
/// took its inference from 195-197k to 269-272k samples/s at batch 64 and
/// 308-310k to 350-360k at 256, level at 2048; the AVX2 kernel's four
/// 16-wide panels a block were 2-5% slower in place on dlrm-mlperf at 2048.
pub(super) fn b_forms(c: gemm::GemmSpec, pack_b: Option<bool>) -> Vec<gemm::GemmSpec> {
    let packed = gemm::GemmSpec {
        b: gemm::BLayout::Packed,
        ..c
    };
    let norm = c.normalized();
    let either = match norm.b {
        gemm::BLayout::InPlace { .. } => norm.n > norm.micro.nr(),
        gemm::BLayout::InPlaceBf16 { .. } => true,
        gemm::BLayout::Packed => false,
    };
    match (either, pack_b) {
        (true, None) => vec![c, packed],
        (true, Some(true)) => vec![packed],
        _ => vec![c],
    }
}

/// Timed rounds of [`Jit::race`] for a shape whose fastest warm-up took
/// `fastest` seconds: three, or as many as give each candidate about
/// [`ROUNDS_TIME`] of runs, at most [`MAX_ROUNDS`]. At serving batches a
/// layer takes 20-100 µs, where one busy moment decides a best of three:
/// dlrm-small's batch-64 inference got the AVX2 kernel for a layer in one
/// of two runs (Intel Xeon model 207, AVX-512).
fn rounds(fastest: f64) -> usize {
    let want = (ROUNDS_TIME / fastest.max(1e-9)).ceil();
    (want.min(MAX_ROUNDS as f64) as usize).max(3)
}

/// Timed runs [`rounds`] aims at for each candidate, in seconds.
const ROUNDS_TIME: f64 = 2e-3;

/// Most timed rounds of [`Jit::race`].
const MAX_ROUNDS: usize = 16;

impl Jit {
    /// The winner of `candidates` under `trial` ([`Jit::pick_variant`]'s
    /// race): each one's warm-up run, timed (a second one for those between
    /// [`PRUNE`] and [`RETRY`] times the fastest, the better counting), then
    /// the best of three or more runs ([`rounds`]) of those within [`PRUNE`]
    /// of the fastest warm-up, taking turns, and [`race_winner`] of those
    /// times.
    pub(super) fn race(
        &self,
        candidates: &[gemm::GemmSpec],
        trial: &mut dyn FnMut(gemm::GemmKernel) -> Result<(), JitError>,
    ) -> Result<gemm::GemmSpec, JitError> {
        // Each candidate's warm-up run, timed: those over `PRUNE` times the
        // fastest warm-up's time are not timed again (the fastest always is).
        let mut warm = candidates
            .iter()
            .map(|&c| {
                let k = self.gemm(c)?;
                let t0 = Instant::now();
                trial(k)?;
                Ok((c, k, t0.elapsed().as_secs_f64()))
            })
            .collect::<Result<Vec<_>, JitError>>()?;
        // A candidate whose first run was slow but not far off gets a second
        // before it is dropped: a first run can pay a cost of its own (its
        // scratch grown and faulted in, a busy core) that later calls do not.
        let fastest = warm.iter().map(|w| w.2).fold(f64::INFINITY, f64::min);
        for w in &mut warm {
            if w.2 > PRUNE * fastest && w.2 <= RETRY * fastest {
                let t0 = Instant::now();
                trial(w.1)?;
                w.2 = w.2.min(t0.elapsed().as_secs_f64());
            }
        }
        let Some(&(first, _, fastest)) = warm.iter().min_by(|a, b| a.2.total_cmp(&b.2)) else {
            return Err(JitError::Args {
                kernel: "gemm".into(),
                reason: "no candidate kernel to time".into(),
            });
        };
        let kernels: Vec<_> = warm
            .iter()
            .filter(|w| w.2 <= PRUNE * fastest)
            .map(|&(c, k, _)| (c, k))
            .collect();
        // Best of three timed runs each (more for a short GEMM: `rounds`),
        // the candidates taking turns: robust to a busy machine, and to one
        // whose speed drifts while it is timed.
        let mut times = vec![f64::INFINITY; kernels.len()];
        for _ in 0..rounds(fastest) {
            for (&(_, k), t) in kernels.iter().zip(&mut times) {
                let t0 = Instant::now();
                trial(k)?;
                *t = t.min(t0.elapsed().as_secs_f64());
            }
        }
        let timed: Vec<_> = kernels.iter().map(|&(c, _)| c).zip(times).collect();
        let won = race_winner(&timed).unwrap_or(first);
        if std::env::var_os("DLRM_JIT_RACE_LOG").is_some() {
            let warm: Vec<_> = warm.iter().map(|&(c, _, t)| (c, t)).collect();
            eprintln!("{}", race_report(&warm, &timed, won));
        }
        Ok(won)
    }
}

/// A GEMM candidate's form as `gemm_picks` and the race log name it: its
/// micro-kernel, then what it does apart from `key` (the shape as asked):
/// `A` packed (or else widened) per row chunk, a weight block packed per
/// call, the reduction in chunks; e.g. `AVX-512, A packed, B packed`.
pub(super) fn form_name(c: gemm::GemmSpec, key: gemm::GemmSpec) -> String {
    let mut name = c.micro.name().to_string();
    if c.pack_a {
        name.push_str(", A packed");
    } else if c.a != key.a {
        name.push_str(", A widened");
    }
    if c.b == gemm::BLayout::Packed && key.b != gemm::BLayout::Packed {
        name.push_str(", B packed");
    }
    if c.kc > 0 {
        name.push_str(", k chunks");
    }
    name
}

/// One race as `DLRM_JIT_RACE_LOG` prints it on stderr: the shape, then
/// each candidate's form ([`form_name`], against the first candidate), its
/// warm-up time and its best timed run (`pruned` if it was not timed again),
/// the winner starred.
fn race_report(
    warm: &[(gemm::GemmSpec, f64)],
    timed: &[(gemm::GemmSpec, f64)],
    won: gemm::GemmSpec,
) -> String {
    let Some(&(s, _)) = warm.first() else {
        return String::new();
    };
    let mut out = format!(
        "race m={} n={} k={} kb={} a={:?} c={:?}",
        s.m, s.n, s.k, s.kb, s.a, s.c
    );
    for &(c, w) in warm {
        let form = form_name(c, s);
        let mark = if c == won { "*" } else { " " };
        let best = timed
            .iter()
            .find(|t| t.0 == c)
            .map_or("pruned".into(), |t| format!("{:.3} ms", t.1 * 1e3));
        out.push_str(&format!(
            "\n  {mark} {form:<36} warm {:.3} ms, best {best}",
            w * 1e3
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{MAX_ROUNDS, ROUNDS_TIME, race_report, rounds};
    use crate::jit::gemm::{BLayout, Elt, GemmSpec, Micro};

    /// The race log names every candidate by what sets it apart, with its
    /// times, `pruned` where it was not timed again, and stars the winner.
    #[test]
    fn race_report_names_the_forms_and_stars_the_winner() {
        let base = GemmSpec {
            b: BLayout::InPlace { ldb: 64 },
            ..GemmSpec::new(2048, 64, 512, Elt::F32, Elt::F32)
        };
        let plain = GemmSpec {
            micro: Micro::Native,
            ..base
        };
        let packed = GemmSpec {
            micro: Micro::Native512,
            pack_a: true,
            b: BLayout::Packed,
            ..base
        };
        let chunked = GemmSpec {
            micro: Micro::Native512,
            kc: 256,
            ..base
        };
        let warm = [(plain, 3e-3), (packed, 2.5e-3), (chunked, 9e-3)];
        let timed = [(plain, 2.9e-3), (packed, 2.4e-3)];
        let r = race_report(&warm, &timed, packed);
        let lines: Vec<&str> = r.lines().collect();
        assert_eq!(lines.len(), 4, "{r}");
        assert!(lines[0].starts_with("race m=2048 n=64 k=512"), "{r}");
        assert!(lines[1].starts_with("    AVX2+FMA  "), "{r}");
        assert!(lines[1].ends_with("warm 3.000 ms, best 2.900 ms"), "{r}");
        assert!(
            lines[2].starts_with("  * AVX-512, A packed, B packed "),
            "{r}"
        );
        assert!(lines[2].ends_with("best 2.400 ms"), "{r}");
        assert!(lines[3].starts_with("    AVX-512, k chunks "), "{r}");
        assert!(lines[3].ends_with("warm 9.000 ms, best pruned"), "{r}");
        assert_eq!(race_report(&[], &[], packed), "");
    }

    /// Three rounds for a GEMM of a millisecond or more, more for a
    /// shorter one (up to [`MAX_ROUNDS`]), each candidate timed for about
    /// [`ROUNDS_TIME`] in all.
    #[test]
    fn short_gemms_are_timed_in_more_rounds() {
        assert_eq!(rounds(0.5), 3);
        assert_eq!(rounds(ROUNDS_TIME / 2.5), 3);
        assert_eq!(rounds(ROUNDS_TIME / 4.5), 5);
        assert_eq!(rounds(ROUNDS_TIME / 9.5), 10);
        assert_eq!(rounds(1e-6), MAX_ROUNDS);
        assert_eq!(rounds(0.0), MAX_ROUNDS);
    }
}
