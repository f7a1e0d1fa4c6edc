//! [`Jit::pick_variant`]'s timing race on a trial whose run times are set by
//! the test (sleeps, far apart: no speed of this machine is asserted).

use super::gemm::{Elt, GemmSpec, Micro};
use super::{Jit, JitOptions, KernelChoice};
use std::collections::HashMap;
use std::time::Duration;

/// The Cranelift candidates sleep 60 ms a run and the native ones 1 ms: each
/// Cranelift candidate runs once (its warm-up, over [`super::race::PRUNE`] times
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

/// A chunked candidate ([`GemmSpec::kc`]) wins the race only when it beats
/// its unchunked twin by [`super::race::CHUNK_MARGIN`]: a near tie goes to the
/// plain one, a clear win to the chunked one, and without its twin among the
/// timed candidates the fastest wins as it is.
#[test]
fn a_chunked_candidate_needs_the_margin_over_its_unchunked_twin() {
    let plain = GemmSpec {
        micro: Micro::Native512,
        ..GemmSpec::new(48, 64, 1024, Elt::F32, Elt::F32)
    };
    let chunked = GemmSpec { kc: 256, ..plain };
    let packed = GemmSpec {
        pack_a: true,
        ..plain
    };
    let near = 1.0 / (super::race::CHUNK_MARGIN - 0.01);
    let far = 1.0 / (super::race::CHUNK_MARGIN + 0.01);
    let pick = |t: &[(GemmSpec, f64)]| super::race::race_winner(t).expect("a winner");
    assert_eq!(pick(&[(plain, 1.0), (chunked, near)]), plain);
    assert_eq!(pick(&[(plain, 1.0), (chunked, far)]), chunked);
    // The margin is against the chunked one's own twin, not the field.
    assert_eq!(pick(&[(packed, 1.0), (chunked, near)]), chunked);
    assert_eq!(
        pick(&[(plain, 1.0), (packed, 0.99), (chunked, near * 0.99)]),
        packed
    );
    assert_eq!(pick(&[(plain, 2.0), (chunked, 1.0)]), chunked);
    assert_eq!(pick(&[(plain, 1.0), (chunked, 2.0)]), plain);
    assert_eq!(super::race::race_winner(&[]), None);
}

/// An AVX2 (or Cranelift) candidate wins over a timed AVX-512 one only by
/// [`super::race::NARROW_MARGIN`]; among narrow kernels alone the fastest
/// wins as it is.
#[test]
fn a_narrower_kernel_needs_the_margin_over_the_avx512_one() {
    let wide = GemmSpec {
        micro: Micro::Native512,
        ..GemmSpec::new(48, 64, 256, Elt::F32, Elt::F32)
    };
    let avx2 = GemmSpec {
        micro: Micro::Native,
        ..wide
    };
    let clif = GemmSpec {
        micro: Micro::Cranelift,
        ..wide
    };
    let near = 1.0 / (super::race::NARROW_MARGIN - 0.01);
    let far = 1.0 / (super::race::NARROW_MARGIN + 0.01);
    let pick = |t: &[(GemmSpec, f64)]| super::race::race_winner(t).expect("a winner");
    assert_eq!(pick(&[(wide, 1.0), (avx2, near)]), wide);
    assert_eq!(pick(&[(avx2, near), (wide, 1.0)]), wide);
    assert_eq!(pick(&[(wide, 1.0), (avx2, far)]), avx2);
    assert_eq!(pick(&[(wide, 1.0), (clif, near)]), wide);
    assert_eq!(pick(&[(avx2, 1.0), (clif, 0.99)]), clif);
    // With chunks too: both margins count.
    let chunked = GemmSpec { kc: 128, ..avx2 };
    let both = 1.0 / (super::race::NARROW_MARGIN * super::race::CHUNK_MARGIN - 0.01);
    assert_eq!(pick(&[(wide, 1.0), (avx2, 2.0), (chunked, both)]), wide);
}

/// Through the race itself: a chunked variant twice as fast as its twin (by
/// the trial's sleeps) is picked, and one as fast as its twin is not.
#[test]
fn the_race_picks_chunks_only_when_they_clearly_pay() {
    if !Micro::Native512.available() && !Micro::Native.available() {
        return; // Only the Cranelift kernels: no chunked candidate.
    }
    for (chunked_ms, want_chunks) in [(10, true), (20, false)] {
        let jit = Jit::new().expect("a JIT");
        let spec = GemmSpec::new(48, 64, 1024, Elt::F32, Elt::F32);
        let opts = JitOptions {
            kernels: KernelChoice::Auto,
            ..JitOptions::default()
        };
        let mut trial = |k: super::gemm::GemmKernel| {
            let s = *k.spec();
            let ms = match (s.micro, s.pack_a, s.kc > 0) {
                (Micro::Cranelift, ..) => 200,
                (_, true, _) => 60,
                (_, false, true) => chunked_ms,
                (_, false, false) => 20,
            };
            std::thread::sleep(Duration::from_millis(ms));
            Ok(())
        };
        let picked = jit
            .pick_variant(spec, &opts, (true, false), &mut trial)
            .expect("a pick");
        assert_eq!(picked.kc > 0, want_chunks, "picked {picked:?}");
        assert!(!picked.pack_a, "picked {picked:?}");
    }
}

/// A candidate whose first run is slow (here 3x its later runs, 2x the
/// fastest first run) is run once more before it is pruned, and wins on its
/// later speed; one far slower ([`super::race::RETRY`] times) still runs once.
#[test]
fn a_slow_first_run_within_retry_gets_a_second_and_can_win() {
    if !(Micro::Native.available() && Micro::Native512.available()) {
        return; // The race under test is between the two native kernels.
    }
    let jit = Jit::new().expect("a JIT");
    let spec = GemmSpec::new(48, 64, 1024, Elt::F32, Elt::F32);
    let opts = JitOptions {
        kernels: KernelChoice::Auto,
        chunk_k: Some(false),
        pack_a: Some(false),
        ..JitOptions::default()
    };
    let mut runs: HashMap<GemmSpec, usize> = HashMap::new();
    let mut trial = |k: super::gemm::GemmKernel| {
        let s = *k.spec();
        let n = runs.entry(s).or_insert(0);
        *n += 1;
        let ms = match (s.micro, *n) {
            (Micro::Cranelift, _) => 400,
            (Micro::Native512, 1) => 60,
            (Micro::Native512, _) => 20,
            _ => 30,
        };
        std::thread::sleep(Duration::from_millis(ms));
        Ok(())
    };
    let picked = jit
        .pick_variant(spec, &opts, (true, false), &mut trial)
        .expect("a pick");
    assert_eq!(
        picked.micro,
        Micro::Native512,
        "picked {picked:?}: {runs:?}"
    );
    for (s, &n) in &runs {
        if s.micro == Micro::Cranelift {
            assert_eq!(n, 1, "{s:?} ran {n} times");
        }
    }
}
