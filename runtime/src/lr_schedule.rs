//! Learning-rate schedules: the rate of each training step as a pure function of
//! the step, so that schedules need no recompile and a resumed run only needs the
//! step and the [`LrSchedule`] (it is serde-serialisable for checkpoints).
//!
//! The rate is a run-time value: each update op's `lr` attribute is the rate the
//! plan was compiled with, and the driver gives the executor each step's rate
//! ([`crate::Executor::set_lr`]), which every update of that step then runs with
//! (the JIT kernels, the reference kernels and the interpreter alike:
//! [`dlrm_ir::Op::with_lr`]). Every rank computes the same rate from the step: no
//! communication.
//!
//! Steps are numbered from 1 (the driver's `iter`): step `k` is the k-th optimizer
//! step, which is the reference's `_step_count` when its scheduler's `get_lr` gives
//! that step's rate (PyTorch's scheduler constructor steps once, and the reference
//! calls `lr_scheduler.step()` after each `optimizer.step()`).
//!
//! Arithmetic: the scale of a step is computed in f64, multiplied by the base rate
//! (as f64), and rounded once to f32 — as PyTorch's Python-float learning rate
//! reaches its f32 kernels. A constant schedule returns the base rate itself, bit
//! for bit.

use crate::error::{Result, RuntimeError};
use dlrm_ir::Graph;
use serde::{Deserialize, Serialize};

/// The reference's floor on a decayed rate (`min_lr` in `LRPolicyScheduler`).
pub const POLY_MIN_LR: f64 = 1e-7;

/// Beyond this many decays, [`LrPolicy::Step`] uses `powf` instead of repeated
/// multiplication (PyTorch's chained form), which it then matches only to f64
/// rounding.
const STEP_CHAIN_MAX: u64 = 1 << 16;

/// How the learning rate moves with the step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LrPolicy {
    /// The base rate at every step.
    #[default]
    Constant,
    /// The reference DLRM's `LRPolicyScheduler` (facebookresearch/dlrm,
    /// `dlrm_s_pytorch.py`; its flags `--lr-num-warmup-steps`,
    /// `--lr-decay-start-step`, `--lr-num-decay-steps`), exactly: with `W`, `D`,
    /// `N` the three fields and `k` the step,
    /// - `k < W` (warmup): `lr·(1.0 - (W - k)/W)`, i.e. `lr·k/W`;
    /// - `D <= k < D + N` (decay): `max(1e-7, lr·((N - (k - D))/N)²)`;
    /// - otherwise, if `N > 0`: the rate of the last step that was in one of the
    ///   two phases ("freeze at last"): between warmup and decay that is step
    ///   `W - 1`'s rate `lr·(W-1)/W` (not `lr`: the reference's warmup never
    ///   reaches the base rate unless the decay starts right at `W`), after the
    ///   decay step `D + N - 1`'s `lr/N²` (not 0);
    /// - otherwise (`N = 0`): `lr`.
    ///
    /// Where the reference has no last rate to freeze at (`N > 0`, `W <= 1` and a
    /// step before `D`: it fails with an `AttributeError`), this gives `lr`. `D >=
    /// W` is required, as the reference requires it.
    Poly {
        /// `W`: warmup steps (`--lr-warmup-steps`).
        warmup_steps: u64,
        /// `D`: the first step of the decay (`--lr-decay-start`).
        decay_start: u64,
        /// `N`: decay steps (`--lr-decay-steps`).
        decay_steps: u64,
    },
    /// Step decay, as `torch.optim.lr_scheduler.StepLR` stepped once per training
    /// step: step `k` runs at `lr·gammaⁿ` with `n = (k - 1) / step_size` (integer
    /// division), the product taken as PyTorch does, one multiplication by `gamma`
    /// per decay in f64.
    Step {
        /// Steps between two decays (`--lr-step-size`), at least 1.
        step_size: u64,
        /// The factor of each decay (`--lr-gamma`).
        gamma: f64,
    },
}

/// A learning-rate schedule: a base rate and a policy. [`LrSchedule::lr_at`] is a
/// pure function of the step.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    /// The base rate: the plan's (the rate its update ops were compiled with), or
    /// `dlrm-run --lr`.
    pub lr: f32,
    /// How the rate moves with the step.
    #[serde(default)]
    pub policy: LrPolicy,
}

impl LrSchedule {
    /// A constant schedule at `lr`.
    pub fn constant(lr: f32) -> LrSchedule {
        LrSchedule {
            lr,
            policy: LrPolicy::Constant,
        }
    }

    /// Checks the settings: a finite base rate >= 0, the decay starting no earlier
    /// than the end of the warmup, a step size >= 1 and a finite `gamma >= 0`.
    pub fn check(&self) -> Result<()> {
        let bad = |reason: String| Err(RuntimeError::LearningRate { reason });
        if !(self.lr.is_finite() && self.lr >= 0.0) {
            return bad(format!(
                "the base rate {} is not a finite rate >= 0",
                self.lr
            ));
        }
        match self.policy {
            LrPolicy::Constant => Ok(()),
            LrPolicy::Poly {
                warmup_steps,
                decay_start,
                ..
            } if decay_start < warmup_steps => bad(format!(
                "the warmup ({warmup_steps} steps) must finish before the decay starts \
                 (step {decay_start}), as in the reference DLRM"
            )),
            LrPolicy::Poly { .. } => Ok(()),
            LrPolicy::Step { step_size: 0, .. } => bad("the step size must be at least 1".into()),
            LrPolicy::Step { gamma, .. } if !(gamma.is_finite() && gamma >= 0.0) => {
                bad(format!("gamma {gamma} is not a finite factor >= 0"))
            }
            LrPolicy::Step { .. } => Ok(()),
        }
    }

    /// True when every step runs at the base rate.
    pub fn is_constant(&self) -> bool {
        match self.policy {
            LrPolicy::Constant => true,
            LrPolicy::Poly {
                warmup_steps,
                decay_steps,
                ..
            } => warmup_steps <= 1 && decay_steps == 0,
            LrPolicy::Step { gamma, .. } => gamma == 1.0,
        }
    }

    /// The rate of step `step` (1-based, see the module docs).
    pub fn lr_at(&self, step: u64) -> f32 {
        let base = f64::from(self.lr);
        match self.policy {
            LrPolicy::Constant => self.lr,
            LrPolicy::Poly {
                warmup_steps: w,
                decay_start: d,
                decay_steps: n,
            } => {
                let warm = |k: u64| base * (1.0 - (w - k) as f64 / w as f64);
                let decay = |k: u64| {
                    let s = (n - (k - d)) as f64 / n as f64;
                    (base * (s * s)).max(POLY_MIN_LR)
                };
                // The first step after the decay (`None`: beyond u64).
                let end = d.checked_add(n);
                let v = if step < w {
                    warm(step)
                } else if d <= step && end.is_none_or(|e| step < e) {
                    decay(step)
                } else if n == 0 {
                    return self.lr;
                } else if let Some(e) = end.filter(|&e| step >= e) {
                    // After the decay: frozen at its last step (>= d since n > 0).
                    decay(e - 1)
                } else if w >= 2 {
                    // Between warmup and decay: frozen at the warmup's last step.
                    warm(w - 1)
                } else {
                    return self.lr;
                };
                v as f32
            }
            LrPolicy::Step { step_size, gamma } => {
                let decays = step.saturating_sub(1) / step_size.max(1);
                if decays == 0 {
                    return self.lr;
                }
                let v = if decays <= STEP_CHAIN_MAX {
                    (0..decays).fold(base, |lr, _| lr * gamma)
                } else {
                    base * gamma.powf(decays as f64)
                };
                v as f32
            }
        }
    }
}

/// The learning rate the updates of `g` were compiled with: `None` when `g` has no
/// update; an error when its updates have different rates (a schedule, which gives
/// every update the same rate, cannot apply to it).
pub fn graph_lr(g: &Graph) -> Result<Option<f32>> {
    let mut rate: Option<f32> = None;
    for node in g.nodes() {
        let Some(lr) = node.op.lr() else { continue };
        match rate {
            Some(r) if r.to_bits() != lr.to_bits() => {
                return Err(RuntimeError::LearningRate {
                    reason: format!(
                        "graph `{}` updates with different rates ({r} and {lr}): one \
                         step's rate cannot replace them all",
                        g.name
                    ),
                });
            }
            _ => rate = Some(lr),
        }
    }
    Ok(rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The base rate of the reference values below: `float(np.float32(0.1))`.
    const BASE: f32 = 0.1;

    fn rates(s: &LrSchedule, steps: u64) -> Vec<f32> {
        (1..=steps).map(|k| s.lr_at(k)).collect()
    }

    fn poly(w: u64, d: u64, n: u64) -> LrSchedule {
        LrSchedule {
            lr: BASE,
            policy: LrPolicy::Poly {
                warmup_steps: w,
                decay_start: d,
                decay_steps: n,
            },
        }
    }

    fn step(size: u64, gamma: f64) -> LrSchedule {
        LrSchedule {
            lr: BASE,
            policy: LrPolicy::Step {
                step_size: size,
                gamma,
            },
        }
    }

    // The expected rates were computed with PyTorch 2.15 (/tmp/torch-venv) by
    // driving the reference's `LRPolicyScheduler` (copied from facebookresearch/dlrm
    // `dlrm_s_pytorch.py`) and `torch.optim.lr_scheduler.StepLR` as the reference's
    // training loop does (`optimizer.step(); lr_scheduler.step()`, recording
    // `param_groups[0]["lr"]` before each optimizer step) on an SGD optimizer with
    // `lr = float(np.float32(0.1))`, each rate printed as `np.float32(lr)`.

    #[test]
    fn poly_matches_the_reference() {
        let want = [
            0.025,
            0.05,
            0.075,
            0.075,
            0.075,
            0.075,
            0.075,
            0.1,
            0.064,
            0.036000002,
            0.016,
            0.004,
            0.004,
            0.004,
            0.004,
            0.004,
        ];
        assert_eq!(rates(&poly(4, 8, 5), 16), want);
        assert_eq!(rates(&poly(0, 0, 0), 3), [0.1, 0.1, 0.1]);
        let want = [
            0.033333335,
            0.06666667,
            0.1,
            0.025,
            0.025,
            0.025,
            0.025,
            0.025,
        ];
        assert_eq!(rates(&poly(3, 3, 2), 8), want);
        let want = [0.02, 0.04, 0.060000002, 0.08, 0.1, 0.1, 0.1, 0.1];
        assert_eq!(rates(&poly(5, 5, 0), 8), want);
    }

    #[test]
    fn step_decay_matches_torch_step_lr() {
        let want = [0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025, 0.0125];
        assert_eq!(rates(&step(3, 0.5), 10), want);
        let want = [
            0.1,
            0.1,
            0.030000001,
            0.030000001,
            0.009000001,
            0.009000001,
            0.0027,
            0.0027,
            0.00081,
            0.00081,
            0.000243,
            0.000243,
        ];
        assert_eq!(rates(&step(2, 0.3), 12), want);
    }

    #[test]
    fn constant_is_the_base_rate_bit_for_bit() {
        for lr in [0.0, 0.01, 0.1, 1.0 / 3.0, 7.5e-5] {
            let s = LrSchedule::constant(lr);
            assert!(s.is_constant());
            assert!((1..100).all(|k| s.lr_at(k).to_bits() == lr.to_bits()));
        }
        assert!(step(5, 1.0).is_constant());
        assert!(!poly(2, 2, 0).is_constant());
    }

    #[test]
    fn bad_settings_are_errors() {
        for s in [
            LrSchedule::constant(-0.1),
            LrSchedule::constant(f32::NAN),
            LrSchedule::constant(f32::INFINITY),
            poly(10, 5, 3),
            step(0, 0.5),
            step(3, f64::NAN),
            step(3, -1.0),
        ] {
            assert!(s.check().is_err(), "{s:?} should be refused");
        }
        assert!(poly(4, 8, 5).check().is_ok());
        assert!(step(3, 0.5).check().is_ok());
    }

    #[test]
    fn the_schedule_round_trips_through_json() {
        for s in [LrSchedule::constant(0.5), poly(4, 8, 5), step(3, 0.5)] {
            let text = serde_json::to_string(&s).expect("serialise");
            let back: LrSchedule = serde_json::from_str(&text).expect("parse");
            assert_eq!(back, s);
        }
        let old: LrSchedule = serde_json::from_str(r#"{"lr": 0.25}"#).expect("parse");
        assert_eq!(old, LrSchedule::constant(0.25));
    }

    #[test]
    fn huge_steps_do_not_overflow() {
        let s = poly(u64::MAX, u64::MAX, u64::MAX);
        assert!(s.lr_at(u64::MAX).is_finite());
        assert!(step(1, 0.5).lr_at(u64::MAX) == 0.0);
    }
}
