//! The roofline report of `dlrm-run --bench`: each op class's achieved GFLOP/s and
//! GB/s against the bound this machine allows it (Williams et al.'s roofline:
//! `min(FMA peak, arithmetic intensity × memory bandwidth)`), and the fraction of
//! that bound it reaches; the same for the whole step.
//!
//! The executor runs one node after another, so each node's work is bounded
//! on its own: its least time is that of its flops at the peak or of its bytes
//! at the bandwidth, whichever is longer. A class's least time is the sum of
//! its nodes' (so a memory-bound layer, such as a 13-wide first layer or a
//! one-column last one, adds its memory time to the class's rather than
//! hiding behind the large layers' flops), its bound that class's flops over
//! that time; the step's bound is the sum of its classes'. The report also
//! gives the looser bound of the step's work as one mix (`step, one roof`: all
//! its flops at the peak when its blended intensity is past the ridge), which
//! would need the memory-bound work overlapped with the compute-bound work.
//!
//! The machine's two numbers are measured here, on the rank's threads
//! ([`measure`]): the **FMA peak**, independent fused multiply-adds in registers
//! (16-wide AVX-512 where the CPU has it, else 8-wide AVX2+FMA, else scalar),
//! twelve independent accumulators per thread so the FMA latency is hidden; the
//! **bf16 peak**, the same with `vdpbf16ps` (two bf16 products per f32 lane) where
//! the CPU has AVX512_BF16, else the FMA peak (the kernels widen bf16 to f32
//! there; AMX tiles are not measured, so on an AMX CPU a bf16 product may pass
//! it); and
//! the **memory bandwidth**, a STREAM triad `a = b + s·c` over three 64 MiB
//! arrays (12 bytes per element: two reads and a write; the write-allocate read is
//! not counted, as STREAM does not). Each is the best of five runs.
//!
//! The work of an op is [`dlrm_codegen::work`]'s (compulsory bytes, not cache
//! traffic), so a fraction above 1 for a memory-bound class means its operands
//! were served from cache.

use crate::exec::OpTime;
use rayon::prelude::*;
use serde::Serialize;
use std::time::Instant;

/// This machine's bounds, as measured by [`measure`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Machine {
    /// FMA peak of the threads, GFLOP/s (an FMA counts 2).
    pub peak_gflops: f64,
    /// Triad memory bandwidth of the threads, GB/s.
    pub bandwidth_gbps: f64,
    /// Threads measured.
    pub threads: usize,
    /// The vector width measured (`avx512`, `avx2`, `scalar`).
    pub isa: &'static str,
    /// Peak of the matrix products on bf16 operands, GFLOP/s: `vdpbf16ps`'s
    /// where the CPU has AVX512_BF16, else `peak_gflops`.
    pub bf16_peak_gflops: f64,
}

impl Machine {
    /// The higher of two measurements of the same threads, field by field
    /// (`self` alone if they measured different threads or ISAs): a VM's
    /// speed drifts by up to 2x between minutes, so a bound measured once,
    /// in a slow second, can put a step above 100% of it; the higher rate is
    /// the one the machine showed it can reach.
    pub fn best_of(self, other: Machine) -> Machine {
        if self.threads != other.threads || self.isa != other.isa {
            return self;
        }
        Machine {
            peak_gflops: self.peak_gflops.max(other.peak_gflops),
            bandwidth_gbps: self.bandwidth_gbps.max(other.bandwidth_gbps),
            bf16_peak_gflops: self.bf16_peak_gflops.max(other.bf16_peak_gflops),
            ..self
        }
    }
}

/// One row of the report: an op class, or the whole step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// The class (see [`class_of`]) or `step`.
    pub class: &'static str,
    /// Milliseconds per step.
    pub ms_per_step: f64,
    /// Achieved GFLOP/s.
    pub gflops: f64,
    /// Achieved GB/s.
    pub gbps: f64,
    /// Flops per byte.
    pub intensity: f64,
    /// The roof of the row's work: its flops over its least time (each node's
    /// work at its own roof: `min(FMA peak, intensity × bandwidth)` for one
    /// node), GFLOP/s; for a class without flops, its bytes over that time
    /// (the bandwidth), GB/s.
    pub bound: f64,
    /// Achieved over bound.
    pub fraction: f64,
    /// The least milliseconds per step the row's work takes at its bound (the
    /// step: the sum of its classes').
    pub least_ms: f64,
}

/// The report: the machine and one row per class, then the step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Roofline {
    /// The bounds.
    pub machine: Machine,
    /// Per class, heaviest first.
    pub classes: Vec<Row>,
    /// The whole step (every op's time), bounded by the sum of its classes'
    /// least times.
    pub step: Row,
    /// The whole step as one mix of work under one roof (a looser bound: the
    /// memory-bound classes' bytes blended into the GEMMs' intensity).
    pub step_one_roof: Row,
    /// Why the fractions may read high ([`probe_warning`]); empty when
    /// nothing was seen.
    pub warnings: Vec<String>,
}

/// How far above the measured FMA peak a node's f32 products must run before
/// the report says the peak was probed low: the flops counted include each
/// GEMM's epilogue (a bias add and an activation an output) beside its FMAs,
/// a few percent of a narrow layer's.
const ABOVE_PEAK: f64 = 1.05;

/// A warning when a node whose flops are all f32 products ran faster than the
/// FMA peak measured (by [`ABOVE_PEAK`]), which no kernel can: the peak was
/// probed while the machine ran slower than during the steps (a VM's speed
/// drifts by up to 2x, in phases of seconds that can cover both probes), so
/// the report's compute bounds are low and its fractions high. The fastest
/// such node is named. Memory-bound work above its bound is not flagged: its
/// operands were served from cache (module docs).
fn probe_warning(op_times: &[OpTime], m: &Machine) -> Option<String> {
    let fastest = op_times
        .iter()
        .filter(|t| t.bf16_flops == 0.0)
        .max_by(|a, b| a.gflops().total_cmp(&b.gflops()))?;
    let rate = fastest.gflops();
    (m.peak_gflops > 0.0 && rate > ABOVE_PEAK * m.peak_gflops).then(|| {
        format!(
            "`{}` ran its f32 products at {rate:.1} GFLOP/s, above the FMA peak measured \
             ({:.1}): the peak was probed while this machine ran slower than during the \
             steps, so the fractions read high",
            fastest.node.as_deref().unwrap_or(&fastest.op),
            m.peak_gflops
        )
    })
}

/// The class of an op mnemonic: GEMMs by product (forward, dgrad, wgrad), the
/// cross layers (forward and the fused backward), bags, updates, the
/// interaction, collectives, the rest.
pub fn class_of(op: &str) -> &'static str {
    match op {
        // The cross layers' products with their elementwise steps fused.
        "brgemm" | "linear" | "matmul" | "cross_brgemm" | "cross_brgemm_save" => "gemm forward",
        "brgemm_dgrad" | "linear_dx" | "cross_brgemm_dgrad" => "gemm dgrad",
        "brgemm_wgrad" | "linear_dw" => "gemm wgrad",
        "cross" | "cross_save" => "cross forward",
        "cross_grad" | "cross_grad_saved" => "cross backward",
        "all_reduce" | "all_to_all" => "collectives",
        "interaction" | "interaction_grad" | "interaction_blocked" | "interaction_grad_blocked" => {
            "interaction"
        }
        o if o.starts_with("embedding_bag") || o == "embedding_grad_dense" => "bags",
        o if o.contains("sgd")
            || o.contains("adagrad")
            || o.starts_with("embedding_update")
            || o.starts_with("split_embedding_update") =>
        {
            "updates"
        }
        _ => "rest",
    }
}

/// The least seconds `t`'s work takes on `m`: its flops at the compute roof
/// (the bf16 products at the bf16 peak, the rest at the FMA peak) or its bytes
/// at the bandwidth, whichever is longer.
fn least_seconds(t: &OpTime, m: &Machine) -> f64 {
    let bf16 = t.bf16_flops.min(t.flops);
    let compute = (t.flops - bf16) / (m.peak_gflops * 1e9)
        + bf16 / (m.bf16_peak_gflops.max(m.peak_gflops) * 1e9);
    let memory = if m.bandwidth_gbps > 0.0 {
        t.bytes / (m.bandwidth_gbps * 1e9)
    } else {
        0.0
    };
    compute.max(memory)
}

/// The row of the work `ts` (each one node's, or one op kind's, run on its
/// own): the achieved rates over their summed time, and the bound of the mix,
/// each at its own roof ([`least_seconds`], summed).
fn row(class: &'static str, ts: &[&OpTime], steps: f64, m: &Machine) -> Row {
    let (seconds, flops, bytes) = ts.iter().fold((0.0, 0.0, 0.0), |(s, f, b), t| {
        (s + t.seconds, f + t.flops, b + t.bytes)
    });
    let per_s = |x: f64| {
        if seconds > 0.0 {
            x / seconds / 1e9
        } else {
            0.0
        }
    };
    let (gflops, gbps) = (per_s(flops), per_s(bytes));
    let intensity = if bytes > 0.0 { flops / bytes } else { 0.0 };
    let least: f64 = ts.iter().map(|t| least_seconds(t, m)).sum();
    // The roof of the mix: its flops (or, without flops, as for copies and
    // gathers of ints, its bytes) over the least time they take.
    let work = if flops > 0.0 { flops } else { bytes };
    let bound = if least > 0.0 {
        work / least / 1e9
    } else if flops > 0.0 {
        m.peak_gflops
    } else {
        m.bandwidth_gbps
    };
    let got = if flops > 0.0 { gflops } else { gbps };
    Row {
        class,
        ms_per_step: 1e3 * seconds / steps,
        gflops,
        gbps,
        intensity,
        bound,
        fraction: if bound > 0.0 { got / bound } else { 0.0 },
        least_ms: 1e3 * least / steps,
    }
}

/// The step's row from its classes': their times and least times summed; the
/// bound is the step's flops over that least time (GFLOP/s; the bandwidth's
/// GB/s if the step has no flops).
fn step_row(classes: &[Row], one_roof: &Row) -> Row {
    let ms: f64 = classes.iter().map(|r| r.ms_per_step).sum();
    let least: f64 = classes.iter().map(|r| r.least_ms).sum();
    let flops = one_roof.gflops * ms; // GFLOP/s × ms: MFLOP per step
    let bound = match (least > 0.0, one_roof.intensity > 0.0) {
        (true, true) => flops / least,
        _ => one_roof.bound,
    };
    Row {
        class: "step",
        bound,
        fraction: if ms > 0.0 { least / ms } else { 0.0 },
        least_ms: least,
        ..one_roof.clone()
    }
}

/// The report of `op_times` (totals over `steps` steps) on machine `m`: each
/// entry the work of one node (`dlrm-run` passes every node's), or of one op
/// kind, each bounded on its own.
pub fn roofline(op_times: &[OpTime], steps: u64, m: Machine) -> Roofline {
    let steps = steps.max(1) as f64;
    let mut names: Vec<&'static str> = op_times.iter().map(|t| class_of(&t.op)).collect();
    names.sort_unstable();
    names.dedup();
    let mut classes: Vec<Row> = names
        .into_iter()
        .map(|c| {
            let ts: Vec<&OpTime> = op_times.iter().filter(|t| class_of(&t.op) == c).collect();
            row(c, &ts, steps, &m)
        })
        .collect();
    classes.sort_by(|a, b| b.ms_per_step.total_cmp(&a.ms_per_step));
    // All the work as one blended mix under one roof.
    let all = op_times.iter().fold(
        OpTime {
            op: "step".into(),
            ..OpTime::default()
        },
        |mut a, t| {
            a.calls += t.calls;
            a.seconds += t.seconds;
            a.flops += t.flops;
            a.bytes += t.bytes;
            a.bf16_flops += t.bf16_flops;
            a
        },
    );
    let one_roof = row("step, one roof", &[&all], steps, &m);
    Roofline {
        machine: m,
        step: step_row(&classes, &one_roof),
        step_one_roof: one_roof,
        classes,
        warnings: probe_warning(op_times, &m).into_iter().collect(),
    }
}

impl Roofline {
    /// The table `dlrm-run --bench` prints.
    pub fn table(&self) -> String {
        let m = &self.machine;
        let bf16 = if m.bf16_peak_gflops > m.peak_gflops {
            format!(", bf16 dot peak {:.1}", m.bf16_peak_gflops)
        } else {
            String::new()
        };
        let mut s = format!(
            "roofline: FMA peak {:.1} GFLOP/s{bf16} ({}, {} thread{}), triad bandwidth {:.1} GB/s\n",
            m.peak_gflops,
            m.isa,
            m.threads,
            if m.threads == 1 { "" } else { "s" },
            m.bandwidth_gbps
        );
        s.push_str(&format!(
            "{:<16} {:>9} {:>9} {:>8} {:>9} {:>11} {:>8}\n",
            "class", "ms/step", "GFLOP/s", "GB/s", "flop/B", "bound", "of bound"
        ));
        let steps = [&self.step, &self.step_one_roof];
        for r in self.classes.iter().chain(steps) {
            let unit = if r.intensity > 0.0 { "GFLOP/s" } else { "GB/s" };
            s.push_str(&format!(
                "{:<16} {:>9.3} {:>9.2} {:>8.2} {:>9.2} {:>7.1} {:<3} {:>7.1}%\n",
                r.class,
                r.ms_per_step,
                r.gflops,
                r.gbps,
                r.intensity,
                r.bound,
                if unit == "GB/s" { "GB" } else { "GF" },
                100.0 * r.fraction
            ));
        }
        for w in &self.warnings {
            s.push_str(&format!("warning: {w}\n"));
        }
        s
    }
}

/// Measures the FMA peak and the triad bandwidth on `threads` threads (about a
/// second in all).
pub fn measure(threads: usize) -> Machine {
    let threads = threads.max(1);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build();
    let run = |f: &(dyn Fn() -> (f64, &'static str) + Sync)| match &pool {
        Ok(p) => p.install(f),
        Err(_) => f(),
    };
    let (peak_gflops, isa) = run(&|| best_of(5, || fma_peak(threads)));
    let (bandwidth_gbps, _) = run(&|| best_of(5, || (triad(), "")));
    let (bf16, _) = run(&|| best_of(5, || (bf16_peak(threads), "")));
    Machine {
        peak_gflops,
        bandwidth_gbps,
        threads,
        isa,
        bf16_peak_gflops: bf16.max(peak_gflops),
    }
}

fn best_of(n: usize, f: impl Fn() -> (f64, &'static str)) -> (f64, &'static str) {
    (0..n)
        .map(|_| f())
        .fold((0.0, "scalar"), |b, r| if r.0 > b.0 { r } else { b })
}

/// GFLOP/s of `threads` threads each running the FMA loop at once.
fn fma_peak(threads: usize) -> (f64, &'static str) {
    const ITERS: u64 = 2_000_000;
    let t0 = Instant::now();
    let results: Vec<(f64, &'static str)> = (0..threads)
        .into_par_iter()
        .map(|i| fma_loop(ITERS, 1.0 + i as f32 * 1e-7))
        .collect();
    let secs = t0.elapsed().as_secs_f64();
    let flops: f64 = results.iter().map(|r| r.0).sum();
    let isa = results.first().map_or("scalar", |r| r.1);
    (flops / secs / 1e9, isa)
}

/// Runs `iters` rounds of 12 independent vector FMAs; returns the flops done and the
/// ISA used. The accumulators are consumed, so the loop is not optimised away.
fn fma_loop(iters: u64, seed: f32) -> (f64, &'static str) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked above).
            let sink = unsafe { x86::fma512(iters, seed) };
            return (
                sink.1 * iters as f64,
                if sink.0.is_nan() { "?" } else { "avx512" },
            );
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA (checked above).
            let sink = unsafe { x86::fma256(iters, seed) };
            return (
                sink.1 * iters as f64,
                if sink.0.is_nan() { "?" } else { "avx2" },
            );
        }
    }
    let mut acc = [seed; 12];
    for _ in 0..iters {
        for a in &mut acc {
            *a = a.mul_add(0.999_999, 1e-7);
        }
    }
    let sink: f32 = acc.iter().sum();
    (
        24.0 * iters as f64 * f64::from(u8::from(!sink.is_nan())),
        "scalar",
    )
}

/// GFLOP/s of `threads` threads each running the bf16 dot loop at once (0
/// where the CPU has no AVX512_BF16).
fn bf16_peak(threads: usize) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512bf16") {
        const ITERS: u64 = 2_000_000;
        let t0 = Instant::now();
        let flops: f64 = (0..threads)
            .into_par_iter()
            // SAFETY: the CPU has AVX512_BF16 (checked above), so AVX-512F too.
            .map(|_| unsafe { x86::dpbf16(ITERS) })
            .sum();
        return flops / t0.elapsed().as_secs_f64() / 1e9;
    }
    let _ = threads;
    0.0
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// 12 accumulators of 16 lanes: 384 flops per round. Returns (a sum of the
    /// accumulators, flops per round).
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn fma512(iters: u64, seed: f32) -> (f32, f64) {
        let (m, c) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
        let mut a = [_mm512_set1_ps(seed); 12];
        for _ in 0..iters {
            for x in &mut a {
                *x = _mm512_fmadd_ps(*x, m, c);
            }
        }
        let s = a
            .iter()
            .fold(_mm512_setzero_ps(), |s, &x| _mm512_add_ps(s, x));
        (_mm512_reduce_add_ps(s), 12.0 * 16.0 * 2.0)
    }

    /// 12 accumulators of 16 lanes, each `vdpbf16ps` two products and two adds
    /// per lane: 768 flops per round. Returns the flops done (0 if the sum is not
    /// finite, which it always is: the loop is kept by using it).
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn dpbf16(iters: u64) -> f64 {
        // bf16 pairs (1/256, 1/256): small products, so the sums stay finite.
        let ones = _mm512_set1_epi32(0x3b80_3b80);
        // SAFETY: same size; any bits are a valid __m512bh.
        let x = unsafe { std::mem::transmute::<__m512i, __m512bh>(ones) };
        let mut a = [_mm512_setzero_ps(); 12];
        for _ in 0..iters {
            for acc in &mut a {
                *acc = _mm512_dpbf16_ps(*acc, x, x);
            }
        }
        let s = a
            .iter()
            .fold(_mm512_setzero_ps(), |s, &v| _mm512_add_ps(s, v));
        let sum = _mm512_reduce_add_ps(s);
        if sum.is_finite() {
            iters as f64 * 12.0 * 16.0 * 4.0
        } else {
            0.0
        }
    }

    /// 12 accumulators of 8 lanes: 192 flops per round.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn fma256(iters: u64, seed: f32) -> (f32, f64) {
        let (m, c) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
        let mut a = [_mm256_set1_ps(seed); 12];
        for _ in 0..iters {
            for x in &mut a {
                *x = _mm256_fmadd_ps(*x, m, c);
            }
        }
        let s = a
            .iter()
            .fold(_mm256_setzero_ps(), |s, &x| _mm256_add_ps(s, x));
        let mut out = [0.0f32; 8];
        // SAFETY: `out` holds the 8 floats an unaligned store writes.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), s) };
        (out.iter().sum(), 12.0 * 8.0 * 2.0)
    }
}

/// GB/s of one parallel triad over 3 × 64 MiB.
fn triad() -> f64 {
    const N: usize = 16 << 20;
    let b = vec![1.0f32; N];
    let c = vec![2.0f32; N];
    let mut a = vec![0.0f32; N];
    // Touch every page first, so no page fault is timed.
    a.par_chunks_mut(1 << 16).for_each(|x| x.fill(0.5));
    let t0 = Instant::now();
    a.par_chunks_mut(1 << 16)
        .zip(b.par_chunks(1 << 16))
        .zip(c.par_chunks(1 << 16))
        .for_each(|((a, b), c)| {
            for ((x, &y), &z) in a.iter_mut().zip(b).zip(c) {
                *x = y + 3.0 * z;
            }
        });
    let secs = t0.elapsed().as_secs_f64();
    std::hint::black_box(&a);
    (12 * N) as f64 / secs / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(name: &str, seconds: f64, flops: f64, bytes: f64) -> OpTime {
        OpTime {
            op: name.into(),
            node: None,
            calls: 1,
            seconds,
            flops,
            bytes,
            bf16_flops: 0.0,
        }
    }

    #[test]
    fn the_best_of_two_measurements_takes_each_higher_rate() {
        let m = |peak, bw, bf16, threads, isa| Machine {
            peak_gflops: peak,
            bandwidth_gbps: bw,
            threads,
            isa,
            bf16_peak_gflops: bf16,
        };
        let slow_peak = m(200.0, 38.0, 400.0, 2, "avx512");
        let slow_memory = m(350.0, 20.0, 380.0, 2, "avx512");
        assert_eq!(
            slow_peak.best_of(slow_memory),
            m(350.0, 38.0, 400.0, 2, "avx512")
        );
        assert_eq!(
            slow_memory.best_of(slow_peak),
            slow_peak.best_of(slow_memory)
        );
        // Other threads or another ISA: not the same bound, kept apart.
        let one_thread = m(180.0, 19.0, 190.0, 1, "avx512");
        assert_eq!(slow_peak.best_of(one_thread), slow_peak);
        let avx2 = m(500.0, 50.0, 500.0, 2, "avx2");
        assert_eq!(slow_peak.best_of(avx2), slow_peak);
    }

    #[test]
    fn ops_fall_in_their_classes() {
        for (op, class) in [
            ("brgemm", "gemm forward"),
            ("cross_brgemm", "gemm forward"),
            ("cross_brgemm_save", "gemm forward"),
            ("cross_brgemm_dgrad", "gemm dgrad"),
            ("brgemm_wgrad", "gemm wgrad"),
            ("embedding_update_adagrad", "updates"),
            ("split_embedding_update", "updates"),
            ("split_embedding_update_adagrad", "updates"),
            ("split_sgd", "updates"),
            ("embedding_bag_q8", "bags"),
            ("cross_mix", "rest"),
        ] {
            assert_eq!(class_of(op), class, "{op}");
        }
    }

    #[test]
    fn classes_and_bounds_follow_the_roofline() {
        let m = Machine {
            peak_gflops: 100.0,
            bandwidth_gbps: 10.0,
            threads: 2,
            isa: "avx2",
            bf16_peak_gflops: 100.0,
        };
        let times = [
            op("brgemm", 1.0, 80e9, 1e9),       // intensity 80: compute bound 100
            op("brgemm_wgrad", 1.0, 40e9, 1e9), // 40 of 100
            op("embedding_bag", 1.0, 1e9, 5e9), // intensity 0.2: bound 2 GF/s
            op("sgd", 0.5, 0.0, 2e9),           // no flops: bandwidth bound
        ];
        let r = roofline(&times, 1, m);
        let get = |c: &str| r.classes.iter().find(|x| x.class == c).expect(c).clone();
        assert!((get("gemm forward").fraction - 0.8).abs() < 1e-12);
        assert!((get("gemm wgrad").fraction - 0.4).abs() < 1e-12);
        let bags = get("bags");
        assert!((bags.bound - 2.0).abs() < 1e-12 && (bags.fraction - 0.5).abs() < 1e-12);
        let upd = get("updates");
        assert!((upd.bound - 10.0).abs() < 1e-12 && (upd.fraction - 0.4).abs() < 1e-12);
        assert!((r.step.ms_per_step - 3500.0).abs() < 1e-9);
        // The step's bound: each class at its own roof, one after another
        // (0.8 + 0.4 + 0.5 + 0.2 s), so 121 GFLOP in 1.9 s at best.
        assert!((r.step.least_ms - 1900.0).abs() < 1e-9, "{:?}", r.step);
        assert!((r.step.fraction - 1900.0 / 3500.0).abs() < 1e-12);
        assert!((r.step.bound - 121.0 / 1.9).abs() < 1e-9);
        // As one mix (121 GFLOP over 9 GB, past the ridge): 1.21 s at the peak.
        let one = &r.step_one_roof;
        assert!((one.bound - 100.0).abs() < 1e-12 && (one.least_ms - 1210.0).abs() < 1e-9);
        assert!((one.fraction - 1210.0 / 3500.0).abs() < 1e-12);
        assert_eq!(r.classes[0].class, "bags"); // ties by time keep a stable order
        let t = r.table();
        assert!(
            t.contains("FMA peak 100.0 GFLOP/s")
                && t.contains("gemm wgrad")
                && t.contains("step, one roof"),
            "{t}"
        );
    }

    /// Each node is bounded on its own: a memory-bound layer beside a
    /// compute-bound one in the same class adds its memory time to the
    /// class's least time, where the blended mix would hide it behind the
    /// other's flops.
    #[test]
    fn each_node_is_bounded_on_its_own() {
        let m = Machine {
            peak_gflops: 100.0,
            bandwidth_gbps: 10.0,
            threads: 2,
            isa: "avx512",
            bf16_peak_gflops: 100.0,
        };
        let big = op("brgemm", 1.0, 80e9, 1e9); // 0.8 s at the peak
        let thin = op("brgemm", 1.0, 1e9, 5e9); // 0.5 s at the bandwidth
        let r = roofline(&[big.clone(), thin.clone()], 1, m);
        let fwd = r
            .classes
            .iter()
            .find(|x| x.class == "gemm forward")
            .expect("the forward class");
        assert!((fwd.least_ms - 1300.0).abs() < 1e-9, "{fwd:?}");
        assert!((fwd.bound - 81.0 / 1.3).abs() < 1e-9, "{fwd:?}");
        assert!((fwd.fraction - 0.65).abs() < 1e-12, "{fwd:?}");
        assert!((r.step.least_ms - 1300.0).abs() < 1e-9);
        // As one mix (81 GFLOP over 6 GB, past the ridge): 0.81 s at the peak.
        assert!((r.step_one_roof.least_ms - 810.0).abs() < 1e-9);
        assert!((r.step_one_roof.bound - 100.0).abs() < 1e-12);
        // The op kind's total alone, one entry, is the blended mix again.
        let kind = OpTime {
            calls: 2,
            seconds: 2.0,
            flops: 81e9,
            bytes: 6e9,
            ..big
        };
        let blended = roofline(&[kind], 1, m);
        assert!((blended.step.least_ms - 810.0).abs() < 1e-9);
    }

    /// A node of f32 products faster than the measured FMA peak means the
    /// peak was probed in a slow moment: the report says so and names it;
    /// at the peak (within the epilogue's margin), or in bf16 products (an
    /// AMX CPU passes the measured bf16 peak), or memory-bound work above its
    /// bandwidth (served from cache), it says nothing.
    #[test]
    fn a_node_above_the_fma_peak_flags_the_probe() {
        let m = Machine {
            peak_gflops: 100.0,
            bandwidth_gbps: 10.0,
            threads: 2,
            isa: "avx512",
            bf16_peak_gflops: 200.0,
        };
        let named = |name: &str, t: OpTime| OpTime {
            node: Some(name.into()),
            ..t
        };
        let at_peak = named("top.0.blk", op("brgemm", 1.0, 104e9, 1e9));
        let cached = op("embedding_bag", 1.0, 0.0, 30e9);
        let mut amx = op("brgemm", 1.0, 300e9, 1e9);
        amx.bf16_flops = 300e9;
        assert!(
            roofline(&[at_peak.clone(), cached, amx], 1, m)
                .warnings
                .is_empty()
        );
        let fast = named("top.1.blk", op("brgemm_wgrad", 1.0, 131e9, 1e9));
        let r = roofline(&[at_peak, fast], 1, m);
        assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
        assert!(r.warnings[0].contains("`top.1.blk`") && r.warnings[0].contains("131.0"));
        assert!(r.table().contains("warning: `top.1.blk`"), "{}", r.table());
    }

    /// Products on bf16 operands are bounded by the bf16 peak, the rest of a
    /// class by the FMA peak: the compute roof of a mix is its flops over the
    /// least time they take.
    #[test]
    fn bf16_products_are_bounded_by_the_bf16_peak() {
        let m = Machine {
            peak_gflops: 100.0,
            bandwidth_gbps: 1e6,
            threads: 2,
            isa: "avx512",
            bf16_peak_gflops: 200.0,
        };
        let mut all = op("brgemm", 1.0, 160e9, 1e6);
        all.bf16_flops = 160e9;
        let mut half = op("brgemm_wgrad", 1.0, 90e9, 1e6);
        half.bf16_flops = 60e9;
        let r = roofline(&[all, half], 1, m);
        let get = |c: &str| r.classes.iter().find(|x| x.class == c).expect(c).clone();
        assert!((get("gemm forward").bound - 200.0).abs() < 1e-9);
        assert!((get("gemm forward").fraction - 0.8).abs() < 1e-12);
        // 30 GF at 100 and 60 GF at 200: 0.6 s at best, so a roof of 150.
        assert!((get("gemm wgrad").bound - 150.0).abs() < 1e-9);
        assert!(r.table().contains("bf16 dot peak 200.0"), "{}", r.table());
    }

    #[test]
    fn the_measured_machine_is_positive() {
        let m = measure(1);
        assert!(m.peak_gflops > 0.0 && m.bandwidth_gbps > 0.0, "{m:?}");
        assert!(m.bf16_peak_gflops >= m.peak_gflops, "{m:?}");
    }
}
