//! The per-rank memory account on small graphs, every number computed by hand
//! from the graph (not by the account's formula), the planner's capacity with
//! table state and a reserve, and the refusal message.

use dlrm_ir::text;
use dlrm_passes::partition::TableInfo;
use dlrm_passes::shard::{MemoryJob, PlannerOptions, ShardKind, Suggestion, account, check, plan};

fn graph(src: &str) -> dlrm_ir::Graph {
    text::parse(src).expect("parse")
}

/// A bf16 table with its low half (updated in place), a dense layer, and a
/// gradient; sizes at B = 10:
/// - params: emb 10·4·2 = 80 (table), emb.lo 80 (low half), w 3·4·4 = 48 and
///   b 3·4 = 12 (dense, 60);
/// - inputs: idx 10·2·8 = 160, x 10·4·4 = 160 (data 320 per step);
/// - values: e 10·4·2 = 80 (bf16), s 160, t 160, y 10·3·4 = 120, d.e 160; the
///   update's results 0. Replay: e (80) → s (240, e dies: 160) → t (320, s dies:
///   160) → y (280) → d.e (280 + 160 = 440: the peak; t dies after) → update.
///   Peak: activations 280 (t, y), gradients 160 (d.e), at `d.e`.
const MODEL: &str = "
graph @m {
  input %idx: i64[B,2]
  input %x: f32[B,4]
  param %emb: bf16[10,4]
  param %w: f32[3,4]
  param %b: f32[3]
  param %emb.lo: bf16[10,4]
  %e: bf16[B,4] = embedding_bag %emb, %idx {mode=sum}
  %s: f32[B,4] = cast %e {to=f32}
  %t: f32[B,4] = add %s, %x
  %y: f32[B,3] = linear %t, %w, %b {act=none}
  %d.e: f32[B,4] = add %t, %t
  %emb.next: bf16[10,4], %emb.lo.next: bf16[10,4] = split_embedding_update %emb, %emb.lo, %d.e, %idx {mode=sum, lr=0.1}
  output %y
  update %emb <- %emb.next
  update %emb.lo <- %emb.lo.next
}
";

#[test]
fn parts_by_hand() {
    let g = graph(MODEL);
    let job = MemoryJob {
        global_batch: 10,
        ranks: 1,
        prefetch: 2,
    };
    let a = account(&g, 0, &job);
    assert_eq!(a.local_batch, 10);
    assert_eq!(a.table_bytes, 80);
    assert_eq!(a.low_half_bytes, 80);
    assert_eq!(a.optimizer_bytes, 0);
    assert_eq!(a.dense_param_bytes, 60);
    assert_eq!(a.tables.len(), 1);
    assert_eq!(a.tables[0].name, "emb");
    assert_eq!((a.tables[0].bytes, a.tables[0].state_bytes), (80, 80));
    assert_eq!(a.activation_bytes, 280);
    assert_eq!(a.gradient_bytes, 160);
    assert_eq!(a.peak_node, "d.e");
    assert_eq!(a.comm_bytes, 0);
    // One step of inputs and two prefetched.
    assert_eq!(a.data_bytes, 3 * 320);
    assert_eq!(a.total, 80 + 80 + 60 + 280 + 160 + 960);

    // Two ranks of a global batch of 19: the largest rank's batch is 10 (the same
    // sizes); the batch scales the step values linearly.
    let two = account(
        &g,
        1,
        &MemoryJob {
            global_batch: 19,
            ranks: 2,
            prefetch: 0,
        },
    );
    assert_eq!((two.rank, two.local_batch), (1, 10));
    assert_eq!(two.activation_bytes, 280);
    let big = account(
        &g,
        0,
        &MemoryJob {
            global_batch: 1000,
            ranks: 1,
            prefetch: 0,
        },
    );
    assert_eq!(big.activation_bytes, 28_000);
    assert_eq!(big.gradient_bytes, 16_000);
    assert_eq!(big.data_bytes, 32_000);
}

/// An `all_reduce` of a 3x4 f32 gradient on 4 ranks: its operand and result are
/// gradients (48 bytes each), and it needs 48 + 48/4 = 60 bytes of transient
/// buffers.
#[test]
fn all_reduce_buffers_and_gradients() {
    let g = graph(
        "
graph @r {
  input %x: f32[B,4]
  param %w: f32[3,4]
  %g: f32[3,4] = add %w, %w
  %r: f32[3,4] = all_reduce %g
  %w.next: f32[3,4] = sgd %w, %r {lr=0.1}
  output %x
  update %w <- %w.next
}
",
    );
    let a = account(
        &g,
        0,
        &MemoryJob {
            global_batch: 8,
            ranks: 4,
            prefetch: 0,
        },
    );
    assert_eq!(a.comm_bytes, 60);
    // g and r alive at once (g dies at the all_reduce), both gradients.
    assert_eq!((a.activation_bytes, a.gradient_bytes), (0, 96));
    assert_eq!(a.dense_param_bytes, 48);
    assert_eq!(a.data_bytes, 2 * 4 * 4);
}

#[test]
fn refusal_names_the_table_bytes_and_suggestion() {
    let g = graph(
        "
graph @t {
  input %idx: i64[B,1]
  param %big: f32[1000,8]
  param %small: f32[10,8]
  %e: f32[B,8] = embedding_bag %big, %idx {mode=sum}
  %f: f32[B,8] = embedding_bag %small, %idx {mode=sum}
  %s: f32[B,8] = add %e, %f
  output %s
}
",
    );
    let job = MemoryJob {
        global_batch: 4,
        ranks: 1,
        prefetch: 0,
    };
    let a = account(&g, 0, &job);
    // 32000 + 320 bytes of tables; e, f, s of 4·8·4 = 128 bytes; idx 32.
    assert_eq!(a.total, 32_000 + 320 + 3 * 128 + 32);
    let suggest = || Suggestion {
        ranks: Some(40),
        batch: None,
        precision: Some("bf16 would not help".into()),
        per_machine: None,
    };
    assert!(check(std::slice::from_ref(&a), a.total, "test", &suggest).is_ok());
    let msg = check(
        std::slice::from_ref(&a),
        10_000,
        "given by the test",
        &suggest,
    )
    .expect_err("refused")
    .to_string();
    for want in [
        "rank 0 of 1 needs",
        "(32736 bytes)",
        "budget of 9.77 KiB (10000 bytes, given by the test)",
        "table `big`: 31.2 KiB (32000 bytes)",
        "40 ranks would fit",
        "bf16 would not help",
    ] {
        assert!(msg.contains(want), "`{want}` not in: {msg}");
    }
    // The largest part comes first.
    assert!(msg.find("`big`") < msg.find("`small`"), "{msg}");
    // Ranks that are threads of one process: the advice is machines.
    let threads = Suggestion {
        per_machine: Some(1 << 30),
        ..suggest()
    };
    let advice = threads.clauses(true).join("; ");
    assert!(
        advice.contains("more machines: 40 ranks with 1.00 GiB each")
            && advice.contains("--comm mpi")
            && !advice.contains("--ranks 40"),
        "{advice}"
    );
    let none = Suggestion {
        ranks: None,
        ..threads
    };
    assert!(
        none.clauses(true)[0].contains("no machine count tried would fit"),
        "{:?}",
        none.clauses(true)
    );
}

fn table(name: &str, rows: usize, state: usize) -> TableInfo {
    TableInfo {
        name: name.into(),
        rows,
        dim: 4,
        elem_bytes: 2,
        lookups_per_sample: 1,
        bags: 1,
        state_bytes_per_row: state,
        row_wise: true,
    }
}

/// A bf16 table of 100 rows of 4: 800 bytes, 1600 with its low half (8 bytes a
/// row), which the placement counts. It fits one rank of 2000 bytes; with 1000
/// bytes reserved per rank it must be split over 2; with the whole budget
/// reserved, nothing fits.
#[test]
fn planner_reserves_the_rest_of_the_rank() {
    let opts = |ranks, reserved| PlannerOptions {
        mem_per_rank: 2000,
        reserved_per_rank: reserved,
        ..PlannerOptions::new(ranks, 64)
    };
    let t = table("t", 100, 8);
    assert_eq!(t.bytes(), 1600);
    let one = plan(std::slice::from_ref(&t), &opts(1, 0)).expect("fits");
    assert_eq!(one.tables[0].kind, ShardKind::TableWise, "{one}");
    assert!(plan(std::slice::from_ref(&t), &opts(1, 1000)).is_err());
    let p = plan(std::slice::from_ref(&t), &opts(2, 1000)).expect("2 shards");
    assert_eq!(p.tables[0].shards.len(), 2, "{p}");
    let e = plan(std::slice::from_ref(&t), &opts(4, 2000))
        .expect_err("refused")
        .to_string();
    assert!(e.contains("besides its tables"), "{e}");
}

/// The placement counts a table's per-row state: a table whose storage fits a
/// rank but not with its low half or accumulator is split.
#[test]
fn planner_splits_a_table_whose_state_does_not_fit() {
    let opts = |ranks| PlannerOptions {
        mem_per_rank: 1000,
        ..PlannerOptions::new(ranks, 64)
    };
    // 800 bytes of rows: fits alone, not with 8 bytes a row of low half.
    let plain = table("t", 100, 0);
    let one = plan(std::slice::from_ref(&plain), &opts(1)).expect("fits");
    assert_eq!(one.tables[0].kind, ShardKind::TableWise, "{one}");
    let split = table("t", 100, 8);
    let e = plan(std::slice::from_ref(&split), &opts(1))
        .expect_err("state does not fit")
        .to_string();
    assert!(e.contains("table `t`"), "{e}");
    let two = plan(std::slice::from_ref(&split), &opts(2)).expect("2 shards");
    assert_eq!(two.tables[0].kind, ShardKind::RowWise, "{two}");
    assert_eq!(two.tables[0].shards.len(), 2, "{two}");
}
