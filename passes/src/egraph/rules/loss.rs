//! Theme `loss`: the numerically stable BCE on logits (training graphs).
//!
//! - `split-linear-sigmoid`: `linear {act=sigmoid}` is `sigmoid` of the plain
//!   linear (exposes the logits);
//! - `bce-logits`: `bce(sigmoid(z), y)` -> `bce_logits(z, y)`;
//! - `bce-logits-grad`: `sigmoid_grad(bce_grad(sigmoid(z), y), sigmoid(z))` ->
//!   `bce_logits_grad(z, y)` (the gradient of the logits, `(σ(z) - y)/denom`).

use super::super::lang::{Dl, Types};
use egg::{Rewrite, rewrite};

/// The rules of this theme.
pub fn rules() -> Vec<Rewrite<Dl, Types>> {
    vec![
        rewrite!("split-linear-sigmoid"; "(linear act=sigmoid ?x ?w ?b)" => "(sigmoid (linear act=none ?x ?w ?b))"),
        rewrite!("bce-logits";           "(bce ?d (sigmoid ?z) ?y)"      => "(bce_logits ?d ?z ?y)"),
        rewrite!("bce-logits-grad";
            "(sigmoid_grad (bce_grad ?d (sigmoid ?z) ?y) (sigmoid ?z))" => "(bce_logits_grad ?d ?z ?y)"),
    ]
}
