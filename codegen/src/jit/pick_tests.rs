//! [`Jit::pick_variant`]'s timing race on a trial whose run times are set by
//! the test (sleeps, far apart: no speed of this machine is asserted).

use super::gemm::{Elt, GemmSpec, Micro};
use super::{Jit, JitOptions, KernelChoice};
use std::collections::HashMap;
use std::time::Duration;

/// The Cranelift candidates sleep 60 ms a run and the native ones 1 ms: each
/// Cranelift candidate runs once (its warm-up, over [`super::PRUNE`] times
/// the fastest), and a native candidate is picked.
#[test]
fn candidates_far_slower_than_the_fastest_run_once_and_are_not_picked() {
    let natives = [Micro::Native, Micro::Native512];
    if !natives.iter().any(|m| m.available()) {
        return; // Only the Cranelift kernels: nothing to race.
    }
    let jit = Jit::new().expect("a JIT");
    let spec = GemmSpec::new(48, 64, 1024, Elt::F32, Elt::F32);
    let opts = JitOptions {
        kernels: KernelChoice::Auto,
        ..JitOptions::default()
    };
    let mut runs: HashMap<GemmSpec, usize> = HashMap::new();
    let mut trial = |k: super::gemm::GemmKernel| {
        let s = *k.spec();
        *runs.entry(s).or_insert(0) += 1;
        let ms = if s.micro == Micro::Cranelift { 60 } else { 1 };
        std::thread::sleep(Duration::from_millis(ms));
        Ok(())
    };
    let picked = jit
        .pick_variant(spec, &opts, (true, false), &mut trial)
        .expect("a pick");
    assert_ne!(picked.micro, Micro::Cranelift, "picked {picked:?}");
    let slow: Vec<_> = runs
        .iter()
        .filter(|(s, _)| s.micro == Micro::Cranelift)
        .collect();
    assert!(
        !slow.is_empty(),
        "the Cranelift candidates were tried: {runs:?}"
    );
    for (s, &n) in slow {
        assert_eq!(n, 1, "{s:?} ran {n} times");
    }
    // The fastest candidate ran its warm-up and three timed rounds.
    assert!(runs.values().any(|&n| n == 4), "{runs:?}");
}
