//! Who gets which parameter (step 2 of the module docs of [`crate::driver`]).

use crate::checkpoint::{Checkpoint, RowPiece};
use crate::error::{Result, RuntimeError};
use dlrm_ir::{Graph, ParamValue, Tensor};
use std::collections::{HashMap, HashSet};

/// The job's parameters handed to its ranks (step 2 of the module docs): what
/// each rank is given ready and what it creates itself, on its own thread
/// ([`Handout::create`]), from the shared values or the checkpoint.
pub(super) struct Handout {
    /// Per rank: stored parameters only it needs, moved to it.
    pub(super) moved: Vec<HashMap<String, Tensor>>,
    /// Per rank: the parameters it creates.
    create: Vec<Vec<String>>,
    /// The values the ranks create from (read by all of them).
    values: HashMap<String, ParamValue>,
    /// The row shards by parameter name.
    shards: HashMap<String, RowPiece>,
}

/// Decides who gets which parameter: those its graphs declare (see step 2 of the
/// module docs). With `only = Some(r)`, the other ranks get nothing (a process
/// running rank r), but a parameter missing for any rank is still an error. A
/// stored whole parameter needed by one rank only is moved to it; everything else
/// is created by the ranks ([`Handout::create`]): a described parameter generated,
/// a stored one needed by several ranks cloned, a row shard in `row_shards` as its
/// rows of its table's value, and with a checkpoint (`resume`) every value read
/// from it.
pub(super) fn hand_out(
    params: Vec<(String, ParamValue)>,
    (train, infer): (Option<&[Graph]>, &[Graph]),
    only: Option<usize>,
    row_shards: &[RowPiece],
    resume: bool,
) -> Result<Handout> {
    let shards: HashMap<String, RowPiece> = row_shards
        .iter()
        .map(|p| (p.param.clone(), p.clone()))
        .collect();
    let ranks = infer.len();
    let mut need: HashMap<String, Vec<usize>> = HashMap::new();
    for r in 0..ranks {
        let mut names: HashSet<&str> = infer[r].param_types().map(|(n, _)| n).collect();
        if let Some(t) = train {
            names.extend(t[r].param_types().map(|(n, _)| n));
        }
        for n in names {
            need.entry(n.to_string()).or_default().push(r);
        }
    }
    let mut values: HashMap<String, ParamValue> = params.into_iter().collect();
    // Whatever has no value is an error, whichever rank needs it.
    let has_value = |n: &str| match shards.get(n) {
        Some(p) => values.contains_key(&p.table),
        None => values.contains_key(n),
    };
    if let Some((name, rs)) = need
        .iter()
        .filter(|(n, _)| !has_value(n))
        .min_by(|a, b| a.0.cmp(b.0))
    {
        return Err(RuntimeError::Param {
            name: name.clone(),
            reason: format!("needed by rank {} but the job has no value for it", rs[0]),
        });
    }
    // Tables whose rows some rank creates stay shared.
    let split: HashSet<String> = need
        .keys()
        .filter_map(|n| shards.get(n.as_str()).map(|p| p.table.clone()))
        .collect();
    let mut need: Vec<(String, Vec<usize>)> = need
        .into_iter()
        .map(|(n, mut rs)| {
            rs.retain(|&r| only.is_none_or(|o| o == r));
            rs.sort_unstable();
            (n, rs)
        })
        .filter(|(_, rs)| !rs.is_empty())
        .collect();
    need.sort();
    let mut out = Handout {
        moved: vec![HashMap::new(); ranks],
        create: vec![Vec::new(); ranks],
        values: HashMap::new(),
        shards,
    };
    for (name, rs) in need {
        let alone = !resume
            && rs.len() == 1
            && !out.shards.contains_key(&name)
            && !split.contains(&name)
            && matches!(values.get(&name), Some(ParamValue::Stored(_)));
        match values.remove(&name) {
            Some(v) if alone => {
                out.moved[rs[0]].insert(name.clone(), v.into_tensor(&name)?);
            }
            other => {
                if let Some(v) = other {
                    values.insert(name.clone(), v);
                }
                for r in rs {
                    out.create[r].push(name.clone());
                }
            }
        }
    }
    out.values = values;
    Ok(out)
}

impl Handout {
    /// Rank `rank`'s parameters: those moved to it (`moved`, taken from
    /// [`Handout::moved`]) and those it creates, from the shared values or, with a
    /// checkpoint, read from it (a row shard read as its rows of the full
    /// parameter): each rank creates, or reads, only what it holds.
    pub(super) fn create(
        &self,
        rank: usize,
        mut moved: HashMap<String, Tensor>,
        resume: Option<&Checkpoint>,
    ) -> Result<HashMap<String, Tensor>> {
        for name in &self.create[rank] {
            let t = match (resume, self.shards.get(name)) {
                (Some(c), Some(p)) => c.read_rows(&p.table, p.lo..p.hi)?,
                (Some(c), None) => c.read_param(name)?,
                (None, Some(p)) => match self.values.get(&p.table) {
                    Some(v) => v.rows(name, p.lo, p.hi)?,
                    None => unreachable_value(name)?,
                },
                (None, None) => match self.values.get(name) {
                    Some(v) => v.materialize(name)?,
                    None => unreachable_value(name)?,
                },
            };
            moved.insert(name.clone(), t);
        }
        Ok(moved)
    }
}

/// A value checked to exist that is missing after all (not reachable).
fn unreachable_value(name: &str) -> Result<Tensor> {
    Err(RuntimeError::Param {
        name: name.to_string(),
        reason: "has no value".into(),
    })
}
