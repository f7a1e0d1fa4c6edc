//! Parameter initialisation: the reference's distributions, determinism, thread
//! independence.

mod common;

use common::{example, tiny_set, tiny_with};
use dlrm_ir::Tensor;
use dlrm_json::ModelSpec;
use serde_json::json;

fn bits(t: &Tensor) -> Vec<u32> {
    t.as_f32()
        .expect("f32")
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

fn mean_std(v: &[f32]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
    let var = v
        .iter()
        .map(|&x| (f64::from(x) - mean).powi(2))
        .sum::<f64>()
        / n;
    (mean, var.sqrt())
}

fn param<'a>(params: &'a [(String, Tensor)], name: &str) -> &'a [f32] {
    params
        .iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, t)| t.as_f32())
        .unwrap_or_else(|| panic!("no f32 param {name}"))
}

#[test]
fn same_seed_gives_bitwise_equal_params() {
    let a = dlrm_json::load(example("dlrm-tiny")).expect("a");
    let b = dlrm_json::load(example("dlrm-tiny")).expect("b");
    assert_eq!(a.params.len(), b.params.len());
    for ((na, ta), (nb, tb)) in a.params.iter().zip(&b.params) {
        assert_eq!(na, nb);
        assert_eq!(ta.shape, tb.shape);
        assert_eq!(bits(ta), bits(tb), "{na}");
    }
}

#[test]
fn different_seed_changes_every_param() {
    let a = dlrm_json::load(example("dlrm-tiny")).expect("a");
    let b = dlrm_json::from_str(&tiny_set("seed", json!(2)), "seed2.json").expect("b");
    for ((name, ta), (_, tb)) in a.params.iter().zip(&b.params) {
        assert_ne!(bits(ta), bits(tb), "{name}");
    }
}

#[test]
fn params_are_independent_of_other_params_shapes() {
    // Table 2 grows: every other parameter (same index, same shape) is unchanged.
    let a = dlrm_json::load(example("dlrm-tiny")).expect("a");
    let b = dlrm_json::from_str(&tiny_set("table_rows", json!([50, 30, 40])), "b.json").expect("b");
    for ((name, ta), (_, tb)) in a.params.iter().zip(&b.params) {
        if name == "emb.2" {
            assert_ne!(ta.shape, tb.shape);
        } else {
            assert_eq!(bits(ta), bits(tb), "{name}");
        }
    }
}

#[test]
fn values_do_not_depend_on_thread_count() {
    // 200k x 8 = 1.6M elements: many chunks, so the threads really split the work.
    let src = tiny_with(|m| {
        m.insert("table_rows".into(), json!([200_000, 30]));
        m.insert("pooling".into(), json!(1));
    });
    let spec = ModelSpec::parse(&src, "threads.json").expect("parse");
    let run = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool")
            .install(|| spec.init_params().expect("init"))
    };
    let one = run(1);
    let three = run(3);
    for ((name, a), (_, b)) in one.iter().zip(&three) {
        assert_eq!(bits(a), bits(b), "{name}");
    }
}

#[test]
fn embedding_init_is_uniform_in_reference_range() {
    // One 1M x 64 table, the size of an SC20 table.
    let src = tiny_with(|m| {
        m.insert("table_rows".into(), json!([1_000_000]));
        m.insert("pooling".into(), json!(1));
        m.insert("embedding_dim".into(), json!(64));
        m.insert("bottom_mlp".into(), json!([4, 64]));
        m.insert("top_mlp".into(), json!([1]));
    });
    let spec = ModelSpec::parse(&src, "big.json").expect("parse");
    let params = spec.init_params().expect("init");
    let t = param(&params, "emb.0");
    assert_eq!(t.len(), 1_000_000 * 64);
    let bound = (1.0f64 / 1e6).sqrt();
    let b32 = bound as f32;
    let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
    let mut bins = [0usize; 10];
    for &x in t {
        assert!((-b32..b32).contains(&x), "{x} outside [-{b32}, {b32})");
        lo = lo.min(x);
        hi = hi.max(x);
        let k = ((f64::from(x) + bound) / (2.0 * bound) * 10.0) as usize;
        bins[k.min(9)] += 1;
    }
    // The extremes are reached (within a few steps of 2^-23 of the range).
    assert!(f64::from(lo) < -bound * (1.0 - 1e-5), "min {lo}");
    assert!(f64::from(hi) > bound * (1.0 - 1e-5), "max {hi}");
    let n = t.len() as f64;
    let (mean, std) = mean_std(t);
    let want_std = bound / 3f64.sqrt();
    assert!(mean.abs() < 5.0 * want_std / n.sqrt(), "mean {mean}");
    assert!(
        (std / want_std - 1.0).abs() < 1e-3,
        "std {std} vs {want_std}"
    );
    // Every tenth of the range holds a tenth of the values (5 sigma of a binomial).
    let sigma = (n * 0.1 * 0.9).sqrt();
    for (k, &c) in bins.iter().enumerate() {
        assert!((c as f64 - n / 10.0).abs() < 5.0 * sigma, "bin {k}: {c}");
    }
}

#[test]
fn linear_init_is_normal_with_reference_std() {
    let src = tiny_with(|m| {
        m.insert("dense_features".into(), json!(512));
        m.insert("bottom_mlp".into(), json!([512, 1024, 8]));
        m.insert("top_mlp".into(), json!([1024, 1]));
    });
    let spec = ModelSpec::parse(&src, "mlp.json").expect("parse");
    let params = spec.init_params().expect("init");

    // bot.0.w: [1024, 512], std sqrt(2 / 1536).
    let w = param(&params, "bot.0.w");
    assert_eq!(w.len(), 1024 * 512);
    let want = (2.0f64 / 1536.0).sqrt();
    let (mean, std) = mean_std(w);
    let n = w.len() as f64;
    assert!(mean.abs() < 5.0 * want / n.sqrt(), "mean {mean}");
    // The std estimate has relative error ~ 1/sqrt(2n) = 0.1%.
    assert!((std / want - 1.0).abs() < 5e-3, "std {std} vs {want}");
    let within_1sd = w.iter().filter(|&&x| f64::from(x).abs() < want).count() as f64 / n;
    assert!(
        (within_1sd - 0.6827).abs() < 0.005,
        "P(|x| < sd) = {within_1sd}"
    );
    let within_2sd = w
        .iter()
        .filter(|&&x| f64::from(x).abs() < 2.0 * want)
        .count() as f64
        / n;
    assert!(
        (within_2sd - 0.9545).abs() < 0.003,
        "P(|x| < 2 sd) = {within_2sd}"
    );

    // Biases: std sqrt(1 / fan_out); bot.0.b and top.0.b have 1024 elements.
    for name in ["bot.0.b", "top.0.b"] {
        let b = param(&params, name);
        assert_eq!(b.len(), 1024);
        let want = (1.0f64 / 1024.0).sqrt();
        let (mean, std) = mean_std(b);
        assert!(mean.abs() < 5.0 * want / 32.0, "{name} mean {mean}");
        assert!(
            (std / want - 1.0).abs() < 0.12,
            "{name} std {std} vs {want}"
        );
    }
    // top.0.w: [1024, 8 + 6], std sqrt(2 / 1038).
    let w = param(&params, "top.0.w");
    let want = (2.0f64 / (1024.0 + 14.0)).sqrt();
    let (_, std) = mean_std(w);
    assert!(
        (std / want - 1.0).abs() < 0.03,
        "top.0.w std {std} vs {want}"
    );
    // Weights and biases of the same layer are different streams.
    assert_ne!(&w[..4], &param(&params, "top.0.b")[..4]);
}
