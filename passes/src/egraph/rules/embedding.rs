//! Theme `embedding`: the embedding backward and its sparse SGD update as one op.
//!
//! - `fuse-embedding-update` (fixed pooling) and `fuse-embedding-update-offsets`:
//!   `sparse_sgd(t, idx, embedding_bag_grad(dy, idx[, off]))` ->
//!   `embedding_update(t, dy, idx[, off])` — the race-free owner-computes update of
//!   SC20; the `[S, L, D]` row gradient is never materialised.
//! - `fuse-embedding-update-adagrad` (fixed pooling) and
//!   `fuse-embedding-update-adagrad-offsets`: the same for Adagrad,
//!   `sparse_adagrad(t, acc, idx, embedding_bag_grad(dy, idx[, off]))` ->
//!   `embedding_update_adagrad(t, acc, dy, idx[, off])` (both are `(t', acc')`
//!   tuples; the race-free update coalesces each row's gradient in its owner task).

use super::super::lang::{Dl, Types};
use egg::{Rewrite, rewrite};

/// The rules of this theme.
pub fn rules() -> Vec<Rewrite<Dl, Types>> {
    vec![
        rewrite!("fuse-embedding-update";
            "(sparse_sgd ?lr ?t ?idx (embedding_bag_grad ?m ?dy ?idx))" => "(embedding_update ?m ?lr ?t ?dy ?idx)"),
        rewrite!("fuse-embedding-update-offsets";
            "(sparse_sgd ?lr ?t ?idx (embedding_bag_grad ?m ?dy ?idx ?off))" => "(embedding_update ?m ?lr ?t ?dy ?idx ?off)"),
        rewrite!("fuse-embedding-update-adagrad";
            "(sparse_adagrad ?lr ?eps ?rw ?t ?a ?idx (embedding_bag_grad ?m ?dy ?idx))"
            => "(embedding_update_adagrad ?m ?lr ?eps ?rw ?t ?a ?dy ?idx)"),
        rewrite!("fuse-embedding-update-adagrad-offsets";
            "(sparse_adagrad ?lr ?eps ?rw ?t ?a ?idx (embedding_bag_grad ?m ?dy ?idx ?off))"
            => "(embedding_update_adagrad ?m ?lr ?eps ?rw ?t ?a ?dy ?idx ?off)"),
    ]
}
