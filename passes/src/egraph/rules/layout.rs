//! Theme `layout`: re-layouts only at the edges of an MLP.
//!
//! The `contract` theme wraps every layer in `block_act` / `unblock_act`; where
//! two layers meet, the pair cancels, so activations stay blocked through the MLP:
//! - `cancel-block-unblock-act`: `block_act(unblock_act(yb))` -> `yb`;
//! - `cancel-unblock-block-act`: `unblock_act(block_act(x))` -> `x`;
//! - `cancel-block-unblock-weight`, `cancel-unblock-block-weight`: the same for
//!   weights.
//!
//! Each applies only when the result has exactly the matched type (same blocks,
//! same dtype) and the middle value is not narrower than the ends (a round trip
//! through bf16 is not the identity). Sound because every producer of a blocked
//! value writes zeros in the padding (the IR invariant of blocked layouts).

use super::super::lang::{Dl, DlGraph, Types};
use super::{RuleConfig, bound, build_rule, same_type, ty_of};
use egg::{Id, Rewrite, Subst};

/// The rules of this theme.
pub fn rules() -> Vec<Rewrite<Dl, Types>> {
    let cfg = RuleConfig::default();
    vec![
        build_rule(
            "cancel-block-unblock-act",
            "(block_act ?bk ?dt (unblock_act ?k ?dt2 ?y))",
            cancel,
            &cfg,
        ),
        build_rule(
            "cancel-unblock-block-act",
            "(unblock_act ?k ?dt (block_act ?bk ?dt2 ?y))",
            cancel,
            &cfg,
        ),
        build_rule(
            "cancel-block-unblock-weight",
            "(block_weight ?bn ?bk (unblock_weight ?n ?k ?y))",
            cancel_w,
            &cfg,
        ),
        build_rule(
            "cancel-unblock-block-weight",
            "(unblock_weight ?n ?k (block_weight ?bn ?bk ?y))",
            cancel_w,
            &cfg,
        ),
    ]
}

/// The class of the inner node of the match (`(outer .. (inner .. ?y))`).
fn inner(eg: &DlGraph, m: Id, y: Id) -> Option<Id> {
    eg[m].nodes.iter().find_map(|n| match n {
        Dl::Op(_, ch) => ch.iter().copied().find(|&c| {
            eg[c]
                .nodes
                .iter()
                .any(|k| matches!(k, Dl::Op(_, kc) if kc.contains(&y)))
        }),
        _ => None,
    })
}

fn cancel(eg: &mut DlGraph, m: Id, s: &Subst, _cfg: &RuleConfig) -> Option<Id> {
    let y = bound(s, "y")?;
    let (yt, mid) = (ty_of(eg, y)?, inner(eg, m, y).and_then(|c| ty_of(eg, c))?);
    // The middle must hold y's values exactly: same dtype, or f32.
    if mid.dtype != yt.dtype && mid.dtype != dlrm_ir::DType::F32 {
        return None;
    }
    same_type(eg, m, y)
}

fn cancel_w(eg: &mut DlGraph, m: Id, s: &Subst, cfg: &RuleConfig) -> Option<Id> {
    cancel(eg, m, s, cfg)
}
