//! Theme `recognise` (pass `fuse`): an activation folded into the layer before it.
//!
//! - `fuse-linear-relu`, `fuse-linear-sigmoid`: an activation after a plain
//!   `linear` becomes the linear's epilogue.
//!
//! The DLRM ops of an imported model's generic ops (matmul + add of a bias ->
//! `linear`, the exported interaction -> `interaction`, gather + reduce ->
//! `embedding_bag`) are recognised earlier, by the theme `canon` ([`super::canon`])
//! in the `canon` pass, before autodiff; by the time these rules run, the graph
//! holds DLRM ops only.

use super::super::lang::{Dl, Types};
use egg::{Rewrite, rewrite};

/// The rules of this theme.
pub fn rules() -> Vec<Rewrite<Dl, Types>> {
    vec![
        rewrite!("fuse-linear-relu";    "(relu (linear act=none ?x ?w ?b))"    => "(linear act=relu ?x ?w ?b)"),
        rewrite!("fuse-linear-sigmoid"; "(sigmoid (linear act=none ?x ?w ?b))" => "(linear act=sigmoid ?x ?w ?b)"),
    ]
}
