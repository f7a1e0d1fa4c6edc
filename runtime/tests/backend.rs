//! The JIT backend against the reference backend on the tiny DLRM (training
//! steps, every micro-kernel choice), index errors naming the table and the
//! sample, and the per-op cost accounting behind `--bench`.

mod common;

use common::*;
use dlrm_ir::{SingleRank, Tensor};
use dlrm_runtime::synthetic::{DataSchema, SyntheticData};
use dlrm_runtime::{Backend, Executor, Job, KernelChoice, RuntimeError, run};
use std::collections::HashMap;

fn inputs(g: &dlrm_ir::Graph, step: u64, batch: usize) -> HashMap<String, Tensor> {
    let data = SyntheticData::new(DataSchema::from_graph(g).expect("schema"), 3);
    data.inputs_for(step, batch, 1, 0, g).expect("inputs")
}

fn syms(batch: usize) -> HashMap<String, usize> {
    HashMap::from([("B".to_string(), batch)])
}

#[test]
fn jit_training_matches_the_reference_backend() {
    let g = tiny(1, 0, true, 0.05);
    let init: HashMap<String, Tensor> = params(1).into_iter().collect();
    let mut reference = Executor::new(g.clone(), init.clone(), 0).expect("executor");
    reference.set_backend(Backend::Reference, KernelChoice::Auto);
    let mut jits: Vec<Executor> = [
        KernelChoice::Cranelift,
        KernelChoice::Native,
        KernelChoice::Auto,
    ]
    .into_iter()
    .filter(|&k| k != KernelChoice::Native || dlrm_codegen::jit::micro::AVX2.available())
    .map(|k| {
        let mut e = Executor::new(g.clone(), init.clone(), 0).expect("executor");
        e.set_backend(Backend::Jit, k);
        e
    })
    .collect();
    for step in 0..4 {
        let batch = [32, 17, 1, 64][step as usize];
        let want = reference
            .step(inputs(&g, step, batch), &syms(batch), &SingleRank)
            .expect("reference step");
        for e in &mut jits {
            let got = e
                .step(inputs(&g, step, batch), &syms(batch), &SingleRank)
                .expect("jit step");
            assert!(
                close(&got[0].to_f32_vec(), &want[0].to_f32_vec(), 1e-5),
                "loss {got:?} vs {want:?}"
            );
        }
    }
    for e in &jits {
        for (name, _) in params(1) {
            let (a, b) = (
                e.param(&name).expect("p"),
                reference.param(&name).expect("p"),
            );
            assert!(
                close(&a.to_f32_vec(), &b.to_f32_vec(), 1e-4),
                "{name} drifted"
            );
        }
        // The linear layers ran on the JIT and their work was counted.
        let t = e.op_times();
        let lin = t.iter().find(|t| t.op == "linear").expect("linear timed");
        assert!(lin.flops > 0.0 && lin.bytes > 0.0, "{lin:?}");
    }
}

#[test]
fn out_of_range_index_names_table_and_sample_on_the_jit_backend() {
    let g = tiny(1, 0, false, 0.0);
    let mut exec = Executor::new(g.clone(), params(1).into_iter().collect(), 0).expect("executor");
    assert_eq!(exec.backend(), Backend::Jit);
    let mut ins = inputs(&g, 0, 4);
    ins.insert("idx.1".into(), Tensor::i64(vec![4, 1], vec![0, 1, 30, 2]));
    let err = exec
        .step(ins, &syms(4), &SingleRank)
        .expect_err("row 30 of 30");
    match &err {
        RuntimeError::Node { op, reason, .. } => {
            assert_eq!(op, "embedding_bag");
            assert!(
                reason.contains("table %emb.1") && reason.contains("sample 2"),
                "{reason}"
            );
        }
        other => panic!("wrong error {other}"),
    }
}

#[test]
fn a_job_reports_backend_jit_stats_and_a_bench_table() {
    let mut job = Job::from_plan(plan(0.05));
    job.iters = 3;
    job.settings.warmup = 1;
    job.settings.eval_batches = 1;
    job.settings.kernels = KernelChoice::Cranelift;
    let r = run(job, &mut |_| {}).expect("runs");
    assert_eq!(r.backend, Backend::Jit);
    assert_eq!(r.kernels, "cranelift");
    assert!(r.jit_kernels > 0, "kernels were compiled");
    let table = r.bench_table();
    assert!(
        table.contains("GFLOP/s") && table.contains("linear"),
        "{table}"
    );
    assert!(table.contains("samples/s"), "{table}");
    // The GEMM shapes, on the forced micro-kernel.
    assert!(
        r.gemm_picks
            .iter()
            .any(|(name, n)| name == "Cranelift" && *n > 0),
        "{:?}",
        r.gemm_picks
    );
    assert!(
        table.contains("GEMM shapes by micro-kernel: Cranelift"),
        "{table}"
    );
    // Every node, most expensive first; the table names the heaviest.
    assert!(table.contains("heaviest nodes"), "{table}");
    let nodes = &r.node_times;
    assert!(!nodes.is_empty());
    assert!(nodes.windows(2).all(|w| w[0].seconds >= w[1].seconds));
    for t in nodes.iter().take(dlrm_runtime::driver::BENCH_NODES) {
        let name = t.node.as_deref().expect("a node name");
        assert!(table.contains(&format!("%{name}")), "{name}: {table}");
    }
    // The nodes are the op kinds' parts: each node's op is a timed kind, and
    // per kind the nodes' calls and times add up to its own.
    for t in nodes {
        assert!(r.op_times.iter().any(|o| o.op == t.op), "{t:?}");
    }
    for kind in &r.op_times {
        let of_kind = nodes.iter().filter(|t| t.op == kind.op);
        let (calls, secs) = of_kind.fold((0, 0.0), |(c, s), t| (c + t.calls, s + t.seconds));
        assert_eq!(calls, kind.calls, "{}", kind.op);
        assert!(
            (secs - kind.seconds).abs() <= 1e-9 * kind.seconds.max(1.0),
            "{}",
            kind.op
        );
    }
}
