//! Merging several requests' graph inputs into one batch, and splitting the
//! batch's outputs back per request.
//!
//! [`Layout::of`] reads, from the inference graph, what each graph input is
//! ([`dlrm_ir::contract::roles`] and the nodes that read it): rows along the
//! batch axis (dense features, labels, fixed-pooling ids `[B, P]`: concatenated
//! along axis 0), a bag's ids or per-sample weights (concatenated), or a bag's
//! offsets into its ids (concatenated and rebased by the ids before them, the
//! last one appended when the bag takes `[B+1]` offsets). It refuses, naming
//! why, a graph where that would not be exact: an output without the batch axis,
//! an input without it that no bag reads, an ids or offsets input shared by bags
//! over different partners or read by anything but a bag. Such a model runs each
//! request alone.
//!
//! [`Layout::key`] checks one request before it may join others: its sample
//! count agrees across inputs, its offsets start at 0, never decrease and stay
//! within its ids (with `[B+1]` offsets the last is the ids' count), weights
//! match their ids. A request that fails a check runs alone, where the executor
//! reports the problem naming the input; merging never turns a bad request into
//! a wrong answer for another.
//!
//! The graph is assumed per-sample: output row `s` depends only on sample `s`'s
//! inputs (true of DLRM inference graphs; the server's tests compare merged
//! answers with requests run one at a time).

use dlrm_ir::contract::roles;
use dlrm_ir::{DType, Data, Def, Dim, Graph, Tensor};
use std::collections::HashMap;

/// What one graph input is, for merging.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Rows along the batch axis (axis 0).
    Rows,
    /// A bag's ids (1-D), concatenated.
    Ids,
    /// Per-sample weights of the bag over ids input `ids` (1-D), concatenated.
    Weights {
        /// The index of the ids input.
        ids: usize,
    },
    /// Offsets of the bag over ids input `ids`, rebased (`last`: `[B+1]`).
    Offsets {
        /// The index of the ids input.
        ids: usize,
        /// The offsets carry the end of the last bag.
        last: bool,
    },
}

/// How a graph's inputs merge (module docs).
#[derive(Clone, Debug)]
pub struct Layout {
    /// The graph inputs' names, in graph order.
    pub names: Vec<String>,
    /// Each one's kind.
    pub kinds: Vec<Kind>,
    /// Each one's dtype and, for [`Kind::Rows`], its declared dimensions past
    /// the batch axis (`None`: one is not fixed, no padding is made).
    pad: Option<Vec<(DType, Vec<usize>)>>,
}

/// The batch sizes batches are padded to: the powers of two and their halfway
/// points (1, 2, 3, 4, 6, 8, 12, 16, 24, ...): at most a third of a batch is
/// padding, and the executors see few distinct sizes (each new size costs its
/// kernels' compilation once).
pub fn bucket(n: usize) -> usize {
    let mut b = 1usize;
    loop {
        if n <= b {
            return b;
        }
        if b >= 2 && n <= b + b / 2 {
            return b + b / 2;
        }
        match b.checked_mul(2) {
            Some(x) => b = x,
            None => return n,
        }
    }
}

/// A request that may join others: its sample count and the signature (dtypes,
/// per-sample shapes) every request of a batch shares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key {
    /// Samples in the request.
    pub samples: usize,
    /// Per input: dtype and the shape past the batch axis.
    signature: Vec<(dlrm_ir::DType, Vec<usize>)>,
}

impl Key {
    /// True when requests of `self` and `other` may share a batch.
    pub fn fits(&self, other: &Key) -> bool {
        self.signature == other.signature
    }
}

/// The bag operand slots each graph input is read at: (node, slot).
fn bag_uses(g: &Graph) -> HashMap<usize, Vec<(usize, usize)>> {
    let mut uses: HashMap<usize, Vec<(usize, usize)>> = HashMap::new();
    for (n, node) in g.nodes().iter().enumerate() {
        for (slot, &v) in node.inputs.iter().enumerate() {
            if matches!(g.value(v).def, Def::Input(_)) {
                let bag = node.op.bag_form().is_some();
                uses.entry(v.index())
                    .or_default()
                    .push((n, if bag { slot } else { usize::MAX }));
            }
        }
    }
    uses
}

/// The symbol of the batch axis: every output's first dimension.
fn batch_axis(g: &Graph) -> Result<&str, String> {
    let mut batch: Option<&str> = None;
    for &o in g.outputs() {
        let ty = g.ty(o);
        match ty.shape.first() {
            Some(Dim::Sym(s)) if batch.is_none_or(|b| b == s) => batch = Some(s),
            _ => {
                return Err(format!(
                    "output `{}` ({ty}) is not per sample along one batch axis",
                    g.name_of(o)
                ));
            }
        }
    }
    batch.ok_or_else(|| "the model has no outputs".to_string())
}

/// Per input of `g`: its dtype and, for [`Kind::Rows`], its dimensions past
/// the batch axis; `None` if one of those is not fixed.
fn pad_shapes(g: &Graph, kinds: &[Kind]) -> Option<Vec<(DType, Vec<usize>)>> {
    g.inputs()
        .iter()
        .zip(kinds)
        .map(|(&v, k)| {
            let ty = g.ty(v);
            let rest: Option<Vec<usize>> = match k {
                Kind::Rows => ty.shape.iter().skip(1).map(Dim::fixed).collect(),
                _ => Some(Vec::new()),
            };
            rest.map(|r| (ty.dtype, r))
        })
        .collect()
}

impl Layout {
    /// The merge layout of inference graph `g`, or why its requests must run
    /// one at a time.
    pub fn of(g: &Graph) -> Result<Layout, String> {
        let batch = batch_axis(g)?;
        let uses = bag_uses(g);
        let index: HashMap<usize, usize> = g
            .inputs()
            .iter()
            .enumerate()
            .map(|(i, v)| (v.index(), i))
            .collect();
        let roles = roles(g);
        let mut kinds = Vec::new();
        for (i, &v) in g.inputs().iter().enumerate() {
            let name = g.name_of(v);
            let ty = g.ty(v);
            let u = uses.get(&v.index()).map_or(&[][..], Vec::as_slice);
            let batched = matches!(ty.shape.first(), Some(Dim::Sym(s)) if s == batch);
            let slots: Vec<usize> = u.iter().map(|&(_, s)| s).collect();
            // The graph input at `slot` of each bag node reading `v`, which must be
            // one and the same graph input.
            let partner = |slot: usize| -> Result<Option<usize>, String> {
                let mut found: Option<Option<usize>> = None;
                for &(n, _) in u {
                    let p = match g.nodes()[n].inputs.get(slot) {
                        None => None,
                        Some(p) => Some(*index.get(&p.index()).ok_or_else(|| {
                            format!("a bag reading `{name}` computes its operand {slot}")
                        })?),
                    };
                    if found.is_some_and(|f| f != p) {
                        return Err(format!(
                            "input `{name}` is read by bags over different operands {slot}"
                        ));
                    }
                    found = Some(p);
                }
                Ok(found.flatten())
            };
            let kind = if slots.is_empty() || slots.iter().all(|&s| s == usize::MAX) {
                if !batched {
                    return Err(format!(
                        "input `{name}` ({ty}) has no batch axis `{batch}` and no bag reads it"
                    ));
                }
                Kind::Rows
            } else if slots.iter().all(|&s| s == 1) {
                let offsets = partner(2)?;
                match (offsets, ty.shape.len()) {
                    (None, 2) if batched => Kind::Rows,
                    (Some(_), 1) => Kind::Ids,
                    _ => {
                        return Err(format!(
                            "bag ids `{name}` ({ty}) are neither [{batch}, P] nor 1-D with \
                             offsets given as an input"
                        ));
                    }
                }
            } else if slots.iter().all(|&s| s == 2) && ty.shape.len() == 1 {
                let ids = partner(1)?.ok_or_else(|| format!("offsets `{name}`: no ids input"))?;
                let last_of = |n: usize| g.nodes()[n].op.bag_form().map(|b| b.last_offset);
                let last = u.iter().all(|&(n, _)| last_of(n) == Some(true));
                let same = u.iter().all(|&(n, _)| last_of(n) == Some(last));
                if !same {
                    return Err(format!(
                        "offsets `{name}` are read both with and without the last"
                    ));
                }
                Kind::Offsets { ids, last }
            } else if slots.iter().all(|&s| s == 3) && ty.shape.len() == 1 {
                let ids = partner(1)?.ok_or_else(|| format!("weights `{name}`: no ids input"))?;
                Kind::Weights { ids }
            } else {
                return Err(format!(
                    "input `{name}` ({}) is read in several roles",
                    roles.get(i).map_or("?".to_string(), |r| r.1.to_string())
                ));
            };
            kinds.push(kind);
        }
        // Each ids input's offsets must name it back.
        for (i, k) in kinds.iter().enumerate() {
            if let Kind::Offsets { ids, .. } | Kind::Weights { ids } = k
                && kinds.get(*ids) != Some(&Kind::Ids)
            {
                return Err(format!(
                    "`{}` belongs to bag ids `{}`, which are not 1-D bag ids",
                    g.name_of(g.inputs()[i]),
                    g.name_of(g.inputs()[*ids])
                ));
            }
        }
        let pad = pad_shapes(g, &kinds);
        Ok(Layout {
            pad,
            names: g
                .inputs()
                .iter()
                .map(|&v| g.name_of(v).to_string())
                .collect(),
            kinds,
        })
    }

    /// Graph inputs of `n` samples that change no other sample's answer, to pad
    /// a batch with (dense rows and fixed-size bags of zeros, empty variable
    /// bags), or `None` when an input's per-sample shape is not fixed.
    pub fn padding(&self, n: usize) -> Option<HashMap<String, Tensor>> {
        let pad = self.pad.as_ref()?;
        let mut out = HashMap::new();
        for ((name, k), (dtype, rest)) in self.names.iter().zip(&self.kinds).zip(pad) {
            let shape = match k {
                Kind::Rows => std::iter::once(n).chain(rest.iter().copied()).collect(),
                Kind::Ids | Kind::Weights { .. } => vec![0],
                Kind::Offsets { last, .. } => vec![n + usize::from(*last)],
            };
            out.insert(name.clone(), Tensor::zeros(*dtype, shape));
        }
        Some(out)
    }

    /// The request's [`Key`], or why it must run alone (module docs).
    pub fn key(&self, inputs: &HashMap<String, Tensor>) -> Result<Key, String> {
        let get = |i: usize| {
            inputs
                .get(&self.names[i])
                .ok_or_else(|| format!("no input `{}`", self.names[i]))
        };
        let mut samples: Option<usize> = None;
        let mut agree = |n: usize, name: &str| match samples {
            Some(s) if s != n => Err(format!("`{name}` holds {n} samples, not {s}")),
            _ => {
                samples = Some(n);
                Ok(())
            }
        };
        let mut signature = Vec::with_capacity(self.kinds.len());
        for (i, k) in self.kinds.iter().enumerate() {
            let t = get(i)?;
            let name = &self.names[i];
            match k {
                Kind::Rows => {
                    let (&b, rest) = t.shape.split_first().ok_or("a scalar input")?;
                    agree(b, name)?;
                    signature.push((t.dtype(), rest.to_vec()));
                    continue;
                }
                Kind::Ids => {}
                Kind::Weights { ids } => {
                    if t.numel() != get(*ids)?.numel() {
                        return Err(format!("weights `{name}` do not match their ids"));
                    }
                }
                Kind::Offsets { ids, last } => {
                    let n = get(*ids)?.numel() as i64;
                    let o = t.to_i64_vec().ok_or("offsets not integer")?;
                    let ok = o.first().is_none_or(|&f| f == 0)
                        && o.windows(2).all(|w| w[0] <= w[1])
                        && o.last().is_none_or(|&l| l <= n)
                        && (!last || o.last() == Some(&n));
                    if !ok {
                        return Err(format!("offsets `{name}` are not from 0 to the ids' count"));
                    }
                    agree(o.len() - usize::from(*last), name)?;
                }
            }
            if t.shape.len() != 1 {
                return Err(format!("`{name}` is not 1-D"));
            }
            signature.push((t.dtype(), Vec::new()));
        }
        let samples = samples.ok_or("no input carries the batch")?;
        Ok(Key { samples, signature })
    }

    /// The graph inputs of requests `reqs` (each passed [`Layout::key`], all of
    /// one signature) merged into one batch.
    pub fn merge(
        &self,
        reqs: &[&HashMap<String, Tensor>],
    ) -> Result<HashMap<String, Tensor>, String> {
        let mut out = HashMap::new();
        for (i, k) in self.kinds.iter().enumerate() {
            let name = &self.names[i];
            let parts: Vec<&Tensor> = reqs
                .iter()
                .map(|r| r.get(name).ok_or_else(|| format!("no input `{name}`")))
                .collect::<Result<_, _>>()?;
            let t = match k {
                Kind::Rows | Kind::Ids | Kind::Weights { .. } => concat(&parts)?,
                Kind::Offsets { ids, last } => {
                    let ids_name = &self.names[*ids];
                    let mut v: Vec<i64> = Vec::new();
                    let mut base = 0i64;
                    for (r, p) in reqs.iter().zip(&parts) {
                        let o = p.to_i64_vec().ok_or("offsets not integer")?;
                        let keep = o.len() - usize::from(*last && !o.is_empty());
                        v.extend(o[..keep].iter().map(|x| x + base));
                        base += r.get(ids_name).map_or(0, Tensor::numel) as i64;
                    }
                    if *last {
                        v.push(base);
                    }
                    let n = v.len();
                    match parts[0].data {
                        Data::I32(_) => Tensor::i32(
                            vec![n],
                            v.into_iter()
                                .map(i32::try_from)
                                .collect::<Result<_, _>>()
                                .map_err(|_| format!("merged offsets `{name}` pass i32"))?,
                        ),
                        _ => Tensor::i64(vec![n], v),
                    }
                }
            };
            out.insert(name.clone(), t);
        }
        Ok(out)
    }
}

/// `parts` concatenated along axis 0 (one dtype, equal trailing dimensions).
fn concat(parts: &[&Tensor]) -> Result<Tensor, String> {
    let first = parts.first().ok_or("nothing to merge")?;
    let rows: usize = parts
        .iter()
        .map(|t| t.shape.first().copied().unwrap_or(1))
        .sum();
    let mut shape = first.shape.clone();
    if let Some(b) = shape.first_mut() {
        *b = rows;
    }
    macro_rules! cat {
        ($variant:ident, $make:ident) => {{
            let mut v = Vec::with_capacity(parts.iter().map(|t| t.numel()).sum());
            for t in parts {
                match &t.data {
                    Data::$variant(x) if t.shape.get(1..) == first.shape.get(1..) => {
                        v.extend_from_slice(x)
                    }
                    _ => return Err("inputs of different types in one batch".to_string()),
                }
            }
            Tensor::$make(shape, v)
        }};
    }
    Ok(match first.data {
        Data::F32(_) => cat!(F32, f32),
        Data::BF16(_) => cat!(BF16, bf16),
        Data::I64(_) => cat!(I64, i64),
        Data::I32(_) => cat!(I32, i32),
        Data::U8(_) => cat!(U8, u8),
    })
}

/// Rows `lo..lo+n` of `t` (axis 0).
fn rows(t: &Tensor, lo: usize, n: usize) -> Result<Tensor, String> {
    let per: usize = t.shape.iter().skip(1).product();
    let (a, b) = (lo * per, (lo + n) * per);
    let mut shape = t.shape.clone();
    shape[0] = n;
    let data = t
        .data
        .slice(a..b)
        .ok_or_else(|| format!("an output holds fewer than {} samples", lo + n))?;
    Ok(Tensor { shape, data })
}

/// A batch's outputs split back into `counts` samples per request.
pub fn split(
    outputs: &[(String, Tensor)],
    counts: &[usize],
) -> Result<Vec<Vec<(String, Tensor)>>, String> {
    let total: usize = counts.iter().sum();
    for (name, t) in outputs {
        if t.shape.first() != Some(&total) {
            return Err(format!(
                "output `{name}` has shape {:?}, not {total} samples",
                t.shape
            ));
        }
    }
    let mut lo = 0;
    let mut out = Vec::with_capacity(counts.len());
    for &n in counts {
        out.push(
            outputs
                .iter()
                .map(|(name, t)| Ok((name.clone(), rows(t, lo, n)?)))
                .collect::<Result<_, String>>()?,
        );
        lo += n;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![expect(clippy::unwrap_used, reason = "tests fail loudly")]
    use super::*;

    const BAGS: &str = "graph @bags {
  input %x: f32[B,2]
  input %ids: i64[N]
  input %offsets: i64[B+1]
  input %wids: i32[M]
  input %woffsets: i32[B]
  input %w: f32[M]
  param %t: f32[10,2]
  %y: f32[B,2] = embedding_bag %t, %ids, %offsets {mode=sum, last_offset=true}
  %z: f32[B,2] = embedding_bag_weighted %t, %wids, %woffsets, %w
  %s: f32[B,2] = add %y, %z
  %o: f32[B,2] = add %s, %x
  output %o
}";

    fn req(
        b: usize,
        ids: &[i64],
        offsets: &[i64],
        wids: &[i32],
        wo: &[i32],
    ) -> HashMap<String, Tensor> {
        let w: Vec<f32> = wids.iter().map(|&i| i as f32).collect();
        HashMap::from([
            (
                "x".to_string(),
                Tensor::f32(vec![b, 2], vec![b as f32; 2 * b]),
            ),
            (
                "ids".to_string(),
                Tensor::i64(vec![ids.len()], ids.to_vec()),
            ),
            (
                "offsets".to_string(),
                Tensor::i64(vec![offsets.len()], offsets.to_vec()),
            ),
            (
                "wids".to_string(),
                Tensor::i32(vec![wids.len()], wids.to_vec()),
            ),
            (
                "woffsets".to_string(),
                Tensor::i32(vec![wo.len()], wo.to_vec()),
            ),
            ("w".to_string(), Tensor::f32(vec![w.len()], w)),
        ])
    }

    #[test]
    fn bags_merge_with_rebased_offsets() {
        let g = dlrm_ir::text::parse(BAGS).unwrap();
        let l = Layout::of(&g).unwrap();
        assert_eq!(
            l.kinds,
            [
                Kind::Rows,
                Kind::Ids,
                Kind::Offsets { ids: 1, last: true },
                Kind::Ids,
                Kind::Offsets {
                    ids: 3,
                    last: false
                },
                Kind::Weights { ids: 3 },
            ]
        );
        let a = req(2, &[1, 2, 3], &[0, 1, 3], &[4], &[0, 1]);
        let b = req(1, &[5], &[0, 1], &[6, 7], &[0]);
        let (ka, kb) = (l.key(&a).unwrap(), l.key(&b).unwrap());
        assert_eq!((ka.samples, kb.samples), (2, 1));
        assert!(ka.fits(&kb));
        let m = l.merge(&[&a, &b]).unwrap();
        assert_eq!(
            m["x"],
            Tensor::f32(vec![3, 2], vec![2.0, 2.0, 2.0, 2.0, 1.0, 1.0])
        );
        assert_eq!(m["ids"], Tensor::i64(vec![4], vec![1, 2, 3, 5]));
        assert_eq!(m["offsets"], Tensor::i64(vec![4], vec![0, 1, 3, 4]));
        assert_eq!(m["wids"], Tensor::i32(vec![3], vec![4, 6, 7]));
        assert_eq!(m["woffsets"], Tensor::i32(vec![3], vec![0, 1, 1]));
        assert_eq!(m["w"], Tensor::f32(vec![3], vec![4.0, 6.0, 7.0]));
        let outs = vec![(
            "o".to_string(),
            Tensor::f32(vec![3, 1], vec![0.0, 1.0, 2.0]),
        )];
        let parts = split(&outs, &[2, 1]).unwrap();
        assert_eq!(parts[1][0].1, Tensor::f32(vec![1, 1], vec![2.0]));
        assert!(split(&outs, &[2, 2]).unwrap_err().contains("not 4 samples"));
        // Requests whose bags cannot be merged exactly run alone.
        for (bad, why) in [
            (
                req(2, &[1, 2, 3], &[0, 1, 2], &[4], &[0, 1]),
                "not from 0 to the ids' count",
            ),
            (req(2, &[1, 2, 3], &[1, 1, 3], &[4], &[0, 1]), "not from 0"),
            (
                req(2, &[1, 2, 3], &[0, 2, 1, 3], &[4], &[0, 1]),
                "not from 0",
            ),
            (
                req(2, &[1, 2, 3], &[0, 1, 3], &[4], &[0, 1, 1]),
                "holds 3 samples, not 2",
            ),
        ] {
            let e = l.key(&bad).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn buckets_waste_at_most_a_third() {
        let b: Vec<usize> = (1..=13).map(bucket).collect();
        assert_eq!(b, [1, 2, 3, 4, 6, 6, 8, 8, 12, 12, 12, 12, 16]);
        assert_eq!((bucket(512), bucket(513), bucket(769)), (512, 768, 1024));
        assert!((1..5000).all(|n| bucket(n) >= n && 3 * (bucket(n) - n) <= bucket(n)));
    }

    #[test]
    fn graphs_that_cannot_merge_say_why() {
        let last = "graph @g {
  input %ids: i64[N]
  input %offsets: i64[B+1]
  param %t: f32[10,4]
  %m: f32[B+1,4] = embedding_bag %t, %ids, %offsets {mode=mean}
  output %m
}";
        let e = Layout::of(&dlrm_ir::text::parse(last).unwrap()).unwrap_err();
        assert!(e.contains("output `m`"), "{e}");
        let fixed = "graph @g {
  input %ids: i64[B,3]
  input %x: f32[4,2]
  param %t: f32[10,2]
  %y: f32[B,2] = embedding_bag %t, %ids {mode=sum}
  output %y
}";
        let g = dlrm_ir::text::parse(fixed).unwrap();
        let e = Layout::of(&g).unwrap_err();
        assert!(e.contains("input `x` (f32[4,2]) has no batch axis"), "{e}");
    }
}
