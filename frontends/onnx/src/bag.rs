//! Recognition of `nn.EmbeddingBag` in the `Loop`s PyTorch's exporters write, by
//! what the loop computes rather than by one exporter's layout.
//!
//! The loop body is evaluated abstractly: each value is described by its meaning for
//! bag `i` (the loop's index) — `i + k`, `E[i + k]` for an outer vector `E` (a bag
//! bound), `rows[E[i] .. E[i+1]]` of a per-index value (the indices, the gathered
//! table rows, the per-sample weights), the reduction of those rows (sum or mean),
//! "the bag is empty", zeros. Wrappers that keep a value (`Identity`, `Cast`,
//! `CastLike`, `Reshape`/`Unsqueeze`/`Squeeze` of a one-element value) are looked
//! through. The loop is an EmbeddingBag when its result is, for each of its `n`
//! iterations, the reduction of bag `i` (zeros when empty), with `n` proved equal to
//! `len(E) - 1` by symbolic shape arithmetic, and its index either the trip
//! counter (TorchScript) or a carried counter that starts at 0 and grows by 1 while
//! `counter < n` (dynamo). Rows may be gathered inside the loop (`table[ids[lo..hi]]`)
//! or before it (`(table[ids])[lo..hi]`), weighted or not (a weight that is the
//! constant 1 is no weight); the result may be a scan output or a sequence built by
//! `SequenceInsert`; other loop-carried values must not change.
//!
//! `E` then says which bag form it is: `Concat(offsets, [len(ids)])` gives
//! `embedding_bag(table, ids, offsets)` (or `embedding_bag_weighted`);
//! `Range(0, len(ids), P)` as the offsets of indices that are a `[n, P]` tensor
//! flattened gives the fixed-size `embedding_bag(table, ids2d)`. A loop that does
//! not match is refused with the first reason it did not, naming the node.

use crate::import::{Ctx, NodeCx, NodeErr, SymI, Val};
use crate::ops::Built;
use crate::proto::{GraphProto, NodeProto};
use dlrm_ir::{Op, Pool, Tensor};
use std::collections::HashMap;
use std::rc::Rc;

type R<T> = Result<T, String>;

/// A value that exists once per index of the bags' flat index vector.
#[derive(Clone, Debug, PartialEq)]
enum PerIdx {
    /// The flat index vector (an outer name).
    Ids(String),
    /// Per-sample weights (an outer name).
    Weights(String),
    /// `table[ids] * weights` (weights `None`: unweighted).
    TableRows {
        table: String,
        ids: String,
        weights: Option<String>,
    },
}

/// The meaning of a value for bag `i`.
#[derive(Clone, Debug, PartialEq)]
enum A {
    /// A known integer (one element).
    Int(i64),
    /// A floating-point constant whose entries are all `v`.
    Splat(f32),
    /// `i + k`.
    Iter(i64),
    /// `arr[i + k]` (one element).
    Bound { arr: String, k: i64 },
    /// A loop-invariant per-index value.
    Per(PerIdx),
    /// `v[arr[i] .. arr[i+1]]`.
    Rows {
        v: PerIdx,
        arr: String,
        unsqueezed: bool,
    },
    /// The reduction of bag `i` over its rows (`keep`: `[1, D]`, else `[D]`).
    Bag {
        v: PerIdx,
        arr: String,
        mode: Pool,
        keep: bool,
    },
    /// `arr[i] == arr[i+1]`.
    Empty { arr: String },
    /// `arr[i+1] - arr[i]`: the size of bag `i`.
    Size { arr: String },
    /// `i + k < n` for the outer value `n`.
    Less { k: i64, n: String },
    /// The outer integer `n` plus `k`.
    OuterPlus { n: String, k: i64 },
    /// `i == n - 1`: the last bag.
    IsLast,
    /// The length of an outer vector (one element).
    Len(String),
    /// `len(x) - arr[i]`: the last bag's size, when `arr` ends at `len(x)`.
    Tail { arr: String, x: String },
    /// `Tail > 0`.
    TailPositive { arr: String },
    /// The carried sequence with bag `i` appended.
    Append(Box<A>),
    /// A loop-invariant outer value.
    Outer(String),
    /// A carried value passed through unchanged.
    Same(usize),
}

/// Where names are looked up: a (sub)graph's producers, initializers and the
/// meaning of its inputs, inside its parent scope.
struct Scope<'g> {
    producers: HashMap<&'g str, &'g NodeProto>,
    inits: HashMap<&'g str, &'g crate::proto::TensorProto>,
    inputs: HashMap<String, A>,
}

impl<'g> Scope<'g> {
    fn of(g: &'g GraphProto, inputs: HashMap<String, A>) -> Self {
        let mut producers = HashMap::new();
        for n in &g.node {
            for o in &n.output {
                producers.insert(o.as_str(), n);
            }
        }
        let inits = g
            .initializer
            .iter()
            .filter_map(|t| Some((t.name.as_deref()?, t)))
            .collect();
        Scope {
            producers,
            inits,
            inputs,
        }
    }
}

fn op_of(n: &NodeProto) -> &str {
    n.op_type.as_deref().unwrap_or("")
}

fn arg(n: &NodeProto, k: usize) -> R<&str> {
    n.input
        .get(k)
        .map(String::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("`{}` lacks operand {k}", op_of(n)))
}

/// The abstract evaluator of one loop.
struct Eval<'c, 'm> {
    cx: &'c Ctx<'m>,
    /// Scopes from the outermost subgraph in (the loop body, then an `If` branch).
    scopes: Vec<Scope<'m>>,
    /// Inside the branch taken for the last bag.
    last: bool,
}

impl<'m> Eval<'_, 'm> {
    /// The meaning of `name` seen from the innermost scope.
    fn eval(&mut self, name: &str) -> R<A> {
        self.eval_at(name, self.scopes.len())
    }

    fn eval_at(&mut self, name: &str, depth: usize) -> R<A> {
        for d in (0..depth).rev() {
            let s = &self.scopes[d];
            if let Some(a) = s.inputs.get(name) {
                return Ok(a.clone());
            }
            if let Some(t) = s.inits.get(name) {
                let t = crate::tensor::read_tensor(t, None)?;
                return Ok(const_meaning(&t).unwrap_or(A::Outer(name.to_string())));
            }
            if let Some(&n) = s.producers.get(name) {
                return self.node(n, d + 1);
            }
        }
        self.outer(name)
    }

    /// A loop-invariant value of the enclosing graph.
    fn outer(&self, name: &str) -> R<A> {
        let g = &self.cx.graph;
        let producer = g.node.iter().find(|n| n.output.iter().any(|o| o == name));
        if let Some(n) = producer {
            match op_of(n) {
                "Identity" | "Cast" | "CastLike" => return self.outer(arg(n, 0)?),
                "Gather" if int_attr(n, "axis", 0) == 0 => {
                    return Ok(A::Per(PerIdx::TableRows {
                        table: arg(n, 0)?.to_string(),
                        ids: arg(n, 1)?.to_string(),
                        weights: None,
                    }));
                }
                "Mul" => {
                    let (a, b) = (self.outer(arg(n, 0)?)?, self.outer(arg(n, 1)?)?);
                    if let Some(v) = weigh(&a, &b).or_else(|| weigh(&b, &a)) {
                        return Ok(v);
                    }
                }
                "Unsqueeze" => {
                    // Per-sample weights made a column, or a broadcast constant.
                    let x = self.outer(arg(n, 0)?)?;
                    if matches!(x, A::Splat(_)) {
                        return Ok(x);
                    }
                    if let A::Outer(w) = x
                        && self.unsqueeze_axes(n)? == [1]
                    {
                        return Ok(A::Rows {
                            v: PerIdx::Weights(w),
                            arr: String::new(),
                            unsqueezed: true,
                        });
                    }
                }
                "Expand" => {
                    if let A::Splat(v) = self.outer(arg(n, 0)?)? {
                        return Ok(A::Splat(v));
                    }
                }
                _ => {}
            }
        }
        if let Ok(v) = self.cx.lookup(name)
            && let Some(t) = self.cx.konst(&v)
            && let Some(a) = const_meaning(t)
        {
            return Ok(a);
        }
        Ok(A::Outer(name.to_string()))
    }

    fn unsqueeze_axes(&self, n: &NodeProto) -> R<Vec<i64>> {
        if let Some(a) = crate::attrs::Attrs::new(n).ints("axes") {
            return Ok(a);
        }
        let name = arg(n, 1)?;
        let v = self.cx.lookup(name).map_err(err_text)?;
        self.cx.const_ints(&v, "Unsqueeze axes")
    }

    /// The meaning of a body (or branch) node's first output.
    fn node(&mut self, n: &'m NodeProto, depth: usize) -> R<A> {
        let op = op_of(n);
        let at = |e: &mut Self, k: usize| -> R<A> { e.eval_at(arg(n, k)?, depth) };
        Ok(match op {
            "Identity" | "Cast" | "CastLike" => at(self, 0)?,
            "Reshape" | "Unsqueeze" | "Squeeze" => match at(self, 0)? {
                a @ (A::Int(_) | A::Iter(_) | A::Bound { .. } | A::Splat(_)) => a,
                A::Rows { v, arr, .. } if op == "Unsqueeze" => {
                    let axes = match crate::attrs::Attrs::new(n).ints("axes") {
                        Some(a) => a,
                        None => match at(self, 1)? {
                            A::Int(a) => vec![a],
                            other => return Err(format!("Unsqueeze axes {other:?}")),
                        },
                    };
                    if axes != [1] {
                        return Err(format!("Unsqueeze of a bag's rows at axes {axes:?}"));
                    }
                    A::Rows {
                        v,
                        arr,
                        unsqueezed: true,
                    }
                }
                other => return Err(format!("{op} of {other:?} in the loop")),
            },
            "Constant" => {
                let t = crate::attrs::Attrs::new(n)
                    .tensor("value")?
                    .ok_or("Constant without a tensor value")?;
                const_meaning(&t).ok_or("a non-uniform constant in the loop")?
            }
            "Add" | "Sub" => match (at(self, 0)?, at(self, 1)?) {
                (A::Iter(k), A::Int(c)) | (A::Int(c), A::Iter(k)) if op == "Add" => A::Iter(k + c),
                (A::Iter(k), A::Int(c)) => A::Iter(k - c),
                (A::Int(a), A::Int(b)) => A::Int(if op == "Add" { a + b } else { a - b }),
                (A::Outer(n), A::Int(c)) => A::OuterPlus {
                    n,
                    k: if op == "Add" { c } else { -c },
                },
                (A::Len(x), A::Bound { arr, k: 0 }) if op == "Sub" => A::Tail { arr, x },
                (A::Bound { arr, k: 1 }, A::Bound { arr: b, k: 0 }) if op == "Sub" && arr == b => {
                    A::Size { arr }
                }
                (a, b) => return Err(format!("{op} of {a:?} and {b:?} in the loop")),
            },
            "Gather" => match (at(self, 0)?, at(self, 1)?) {
                (A::Outer(arr), A::Iter(k)) if int_attr(n, "axis", 0) == 0 => {
                    bound(self.cx, arr, k)
                }
                (
                    A::Outer(table),
                    A::Rows {
                        v: PerIdx::Ids(ids),
                        arr,
                        ..
                    },
                ) => A::Rows {
                    v: PerIdx::TableRows {
                        table,
                        ids,
                        weights: None,
                    },
                    arr,
                    unsqueezed: false,
                },
                (a, b) => return Err(format!("Gather of {a:?} at {b:?} in the loop")),
            },
            "Slice" => self.slice(n, depth)?,
            "Mul" => {
                let (a, b) = (at(self, 0)?, at(self, 1)?);
                weigh(&a, &b)
                    .or_else(|| weigh(&b, &a))
                    .ok_or_else(|| format!("Mul of {a:?} and {b:?} in the loop"))?
            }
            "ReduceSum" | "ReduceMean" => {
                let A::Rows { v, arr, .. } = at(self, 0)? else {
                    return Err(format!("{op} of something other than a bag's rows"));
                };
                if !matches!(v, PerIdx::TableRows { .. }) {
                    return Err(format!("{op} of rows not gathered from a table"));
                }
                let axes = match crate::attrs::Attrs::new(n).ints("axes") {
                    Some(a) => a,
                    None => match n.input.get(1).filter(|s| !s.is_empty()) {
                        Some(_) => match at(self, 1)? {
                            A::Int(a) => vec![a],
                            other => return Err(format!("{op} axes {other:?}")),
                        },
                        None => return Err(format!("{op} over every axis, not the bag's rows")),
                    },
                };
                if axes != [0] {
                    return Err(format!("{op} over axes {axes:?}, not the bag's rows"));
                }
                A::Bag {
                    v,
                    arr,
                    mode: if op == "ReduceSum" {
                        Pool::Sum
                    } else {
                        Pool::Mean
                    },
                    keep: int_attr(n, "keepdims", 1) != 0,
                }
            }
            "Equal" => match (at(self, 0)?, at(self, 1)?) {
                (A::Size { arr }, A::Int(0)) | (A::Int(0), A::Size { arr }) => A::Empty { arr },
                (A::Iter(0), A::OuterPlus { k: -1, .. }) => A::IsLast,
                (A::Bound { arr, k: 0 }, A::Bound { arr: b, k: 1 })
                | (A::Bound { arr: b, k: 1 }, A::Bound { arr, k: 0 })
                    if arr == b =>
                {
                    A::Empty { arr }
                }
                (a, b) => return Err(format!("Equal of {a:?} and {b:?} in the loop")),
            },
            "Shape" => match at(self, 0)? {
                A::Outer(x)
                    if int_attr(n, "start", 0) == 0
                        && len_of(self.cx, &x).is_some()
                        && int_attr(n, "end", 1) == 1 =>
                {
                    A::Len(x)
                }
                other => return Err(format!("Shape of {other:?} in the loop")),
            },
            "Greater" => match (at(self, 0)?, at(self, 1)?) {
                (A::Tail { arr, .. }, A::Int(0)) => A::TailPositive { arr },
                (a, b) => return Err(format!("Greater of {a:?} and {b:?} in the loop")),
            },
            "Div" => match (at(self, 0)?, at(self, 1)?) {
                // The last bag's sum over its size (the size is `len - start`
                // only for the last bag, whose end is the number of indices).
                (
                    A::Bag {
                        v,
                        arr,
                        mode: Pool::Sum,
                        keep,
                    },
                    A::Tail { arr: b, x },
                ) if self.last && arr == b && same_len(self.cx, &x, &v) => A::Bag {
                    v,
                    arr,
                    mode: Pool::Mean,
                    keep,
                },
                (a, b) => return Err(format!("Div of {a:?} by {b:?} in the loop")),
            },
            "Less" => match (at(self, 0)?, at(self, 1)?) {
                (A::Iter(k), A::Outer(n)) => A::Less { k, n },
                (a, b) => return Err(format!("Less of {a:?} and {b:?} in the loop")),
            },
            "If" => self.if_(n, depth)?,
            "SequenceInsert" => {
                if n.input.len() > 2 {
                    return Err("SequenceInsert at a position".into());
                }
                match at(self, 1)? {
                    bag @ A::Bag { .. } => A::Append(Box::new(bag)),
                    other => return Err(format!("SequenceInsert of {other:?}")),
                }
            }
            other => return Err(format!("`{other}` in the loop")),
        })
    }

    fn slice(&mut self, n: &'m NodeProto, depth: usize) -> R<A> {
        let x = self.eval_at(arg(n, 0)?, depth)?;
        let lo = self.eval_at(arg(n, 1)?, depth)?;
        let hi = self.eval_at(arg(n, 2)?, depth)?;
        for (k, what) in [(3, "axes"), (4, "steps")] {
            if n.input.get(k).is_some_and(|s| !s.is_empty()) {
                let want = if k == 3 { 0 } else { 1 };
                match self.eval_at(arg(n, k)?, depth)? {
                    A::Int(v) if v == want => {}
                    other => return Err(format!("Slice {what} {other:?} in the loop")),
                }
            }
        }
        match (x, lo, hi) {
            (A::Outer(arr), A::Iter(a), A::Iter(b)) if b == a + 1 => Ok(bound(self.cx, arr, a)),
            (x, A::Bound { arr, k: 0 }, A::Bound { arr: b, k: 1 }) if arr == b => {
                let v = match x {
                    A::Per(v) => v,
                    A::Outer(name) => PerIdx::Ids(name),
                    other => return Err(format!("Slice of {other:?} by a bag's bounds")),
                };
                Ok(A::Rows {
                    v,
                    arr,
                    unsqueezed: false,
                })
            }
            (x, lo, hi) => Err(format!("Slice of {x:?} from {lo:?} to {hi:?} in the loop")),
        }
    }

    /// The `If`s of bag loops: `If(bag i is empty, zeros, bag i)` is bag `i` (an
    /// empty bag is zeros); `If(last bag, x, y)` is `x` when `x` and `y` mean the
    /// same bag (`x` evaluated knowing the bag is the last); `If(last bag's size >
    /// 0, mean, sum)` is the mean of a bag known not to be empty.
    fn if_(&mut self, n: &'m NodeProto, depth: usize) -> R<A> {
        let cond = self.eval_at(arg(n, 0)?, depth)?;
        let attrs = crate::attrs::Attrs::new(n);
        let mut outs = Vec::new();
        for br in ["then_branch", "else_branch"] {
            let g = attrs.graph(br)?;
            let out = g
                .output
                .first()
                .and_then(|o| o.name.as_deref())
                .ok_or("If branch without an output")?;
            let (scopes, last) = (self.scopes.len(), self.last);
            self.scopes.truncate(depth);
            self.scopes.push(Scope::of(g, HashMap::new()));
            self.last = last || (br == "then_branch" && cond == A::IsLast);
            let v = self.eval(out);
            self.scopes.truncate(scopes.min(depth));
            self.last = last;
            outs.push(v?);
        }
        let (a, b) = (&outs[0], &outs[1]);
        match (&cond, a, b) {
            (A::Empty { arr }, A::Splat(z), bag @ A::Bag { arr: b, .. })
                if *z == 0.0 && b == arr =>
            {
                Ok(bag.clone())
            }
            (A::IsLast, a, b) if a == b => Ok(a.clone()),
            (
                A::TailPositive { arr },
                mean @ A::Bag {
                    mode: Pool::Mean,
                    arr: ma,
                    v: mv,
                    ..
                },
                A::Bag {
                    mode: Pool::Sum,
                    arr: sa,
                    v: sv,
                    ..
                },
            ) if ma == arr && sa == arr && mv == sv => Ok(mean.clone()),
            _ => Err(format!("If on {cond:?} gives {a:?}, else {b:?}")),
        }
    }
}

/// `arr[i + k]`, with `arr` a `[c:e]` slice of another vector seen as that vector at
/// `i + k + c` (TorchScript takes a bag's end from `offsets_ext[1:]`).
fn bound(cx: &Ctx<'_>, arr: String, k: i64) -> A {
    if let Some(p) = producer(cx, &arr)
        && op_of(p) == "Slice"
        && let (Some(src), Some(s), Some(e)) = (
            p.input.first(),
            p.input.get(1).and_then(|s| sym_of(cx, s)?.as_int()),
            p.input.get(2).and_then(|e| sym_of(cx, e)?.as_int()),
        )
        && s >= 0
        && e != 0
        && p.input
            .get(3)
            .is_none_or(|a| a.is_empty() || sym_of(cx, a).and_then(|v| v.as_int()) == Some(0))
        && p.input
            .get(4)
            .is_none_or(|a| a.is_empty() || sym_of(cx, a).and_then(|v| v.as_int()) == Some(1))
    {
        return bound(cx, src.clone(), k + s);
    }
    A::Bound { arr, k }
}

/// True when the outer vector `x` has as many entries as the bag's index vector.
fn same_len(cx: &Ctx<'_>, x: &str, v: &PerIdx) -> bool {
    let PerIdx::TableRows { ids, .. } = v else {
        return false;
    };
    let n_ids = flattened(cx, ids).map(|f| f.2).or_else(|| len_of(cx, ids));
    let n_x = len_of(cx, x).or_else(|| {
        let s = shape_of(cx, x)?;
        s.first().cloned()
    });
    n_ids.is_some() && n_ids == n_x
}

fn err_text(e: NodeErr) -> String {
    match e {
        NodeErr::Msg(m) => m,
        NodeErr::Failed(e) => e.to_string(),
    }
}

fn int_attr(n: &NodeProto, name: &str, default: i64) -> i64 {
    crate::attrs::Attrs::new(n)
        .int(name, default)
        .unwrap_or(i64::MIN)
}

/// Rows times per-index weights made a column: the weighted rows (a constant
/// weight 1 is no weight).
fn weigh(rows: &A, w: &A) -> Option<A> {
    let set = |v: &PerIdx, weight: Option<String>| match v {
        PerIdx::TableRows {
            table,
            ids,
            weights: None,
        } => Some(PerIdx::TableRows {
            table: table.clone(),
            ids: ids.clone(),
            weights: weight,
        }),
        _ => None,
    };
    match (rows, w) {
        (A::Per(v), A::Splat(one)) if *one == 1.0 => Some(A::Per(set(v, None)?)),
        (A::Rows { v, arr, .. }, A::Splat(one)) if *one == 1.0 => Some(A::Rows {
            v: set(v, None)?,
            arr: arr.clone(),
            unsqueezed: false,
        }),
        (
            A::Per(v),
            A::Rows {
                v: PerIdx::Weights(w),
                unsqueezed: true,
                ..
            },
        ) => Some(A::Per(set(v, Some(w.clone()))?)),
        (
            A::Rows { v, arr, .. },
            A::Rows {
                v: PerIdx::Ids(w) | PerIdx::Weights(w),
                arr: b,
                unsqueezed: true,
            },
        ) if arr == b => Some(A::Rows {
            v: set(v, Some(w.clone()))?,
            arr: arr.clone(),
            unsqueezed: false,
        }),
        _ => None,
    }
}

/// The meaning of a constant: a one-element integer, or a float splat.
fn const_meaning(t: &Tensor) -> Option<A> {
    if t.dtype().is_int() {
        let v = t.to_i64_vec()?;
        return (v.len() == 1).then(|| A::Int(v[0]));
    }
    let v = t.to_f32_vec();
    let first = *v.first()?;
    v.iter().all(|&x| x == first).then_some(A::Splat(first))
}

/// What a loop computes, once recognised.
struct Found {
    v: PerIdx,
    arr: String,
    mode: Pool,
    /// The loop output that holds the bags, and whether they come as a sequence.
    out: usize,
    /// The bound on the index (`n`): trip count or the `Less` limit.
    count: String,
}

/// A loop's body seen from outside: names of its inputs and outputs.
struct Body<'m> {
    node: &'m NodeProto,
    body: &'m GraphProto,
    carried: usize,
}

impl Body<'_> {
    fn input(&self, k: usize) -> String {
        self.body
            .input
            .get(k)
            .and_then(|v| v.name.clone())
            .unwrap_or_default()
    }
    fn output(&self, k: usize) -> String {
        self.body
            .output
            .get(k)
            .and_then(|v| v.name.clone())
            .unwrap_or_default()
    }
}

fn recognise<'m>(cx: &Ctx<'m>, node: &'m NodeProto, body: &'m GraphProto) -> R<Found> {
    let b = Body {
        node,
        body,
        carried: node.input.len().saturating_sub(2),
    };
    let trip = node.input.first().filter(|s| !s.is_empty()).cloned();
    let (mut ev, counter, invariant) = bind_inputs(cx, &b, trip.is_some())?;
    let count = match (counter, &trip) {
        (Some(_), Some(_)) => return Err("both a trip count and a counter".into()),
        (Some(_), None) => counter_bound(cx, &mut ev, &b)?,
        (None, Some(t)) => {
            match ev.eval(&b.output(0))? {
                A::Int(c) if c != 0 => {}
                other => return Err(format!("the loop condition is {other:?}, not true")),
            }
            t.clone()
        }
        (None, None) => return Err("no trip count and no counter from 0 by 1".into()),
    };
    // The bags: a carried sequence, or a scan output.
    let mut found: Option<Found> = None;
    let mut one = |f: Found| match found.replace(f) {
        None => Ok(()),
        Some(_) => Err("the loop computes more than one bag".to_string()),
    };
    for (k, &inv) in invariant.iter().enumerate() {
        match ev.eval(&b.output(1 + k))? {
            A::Append(bag) => {
                let A::Bag { v, arr, mode, keep } = *bag else {
                    return Err("a sequence of something other than bags".into());
                };
                let init = producer(cx, arg(node, 2 + k)?).map(op_of);
                if !keep || init != Some("SequenceEmpty") {
                    return Err(
                        "bags of rank 1, or added to a sequence that is not empty at first".into(),
                    );
                }
                let count = count.clone();
                one(Found {
                    v,
                    arr,
                    mode,
                    out: k,
                    count,
                })?;
            }
            _ if inv => {}
            A::Iter(1) if Some(k) == counter => {}
            other => return Err(format!("loop-carried value {k} becomes {other:?}")),
        }
    }
    for k in 0..body.output.len().saturating_sub(1 + b.carried) {
        match ev.eval(&b.output(1 + b.carried + k))? {
            A::Bag {
                v,
                arr,
                mode,
                keep: false,
            } => {
                let count = count.clone();
                one(Found {
                    v,
                    arr,
                    mode,
                    out: b.carried + k,
                    count,
                })?;
            }
            other => return Err(format!("scan output {k} is {other:?}, not one bag")),
        }
    }
    found.ok_or_else(|| "the loop computes no bag".to_string())
}

/// The meaning of the body's inputs: the bag index (the trip counter, or the
/// carried value that starts at 0 and grows by 1), loop-invariant carried values as
/// the outer values they start as, others as themselves. Returns the evaluator, the
/// counter and which carried values are invariant.
fn bind_inputs<'c, 'm>(
    cx: &'c Ctx<'m>,
    b: &Body<'m>,
    has_trip: bool,
) -> R<(Eval<'c, 'm>, Option<usize>, Vec<bool>)> {
    let mut inputs = HashMap::new();
    for j in 0..b.carried {
        inputs.insert(b.input(2 + j), A::Same(j));
    }
    let mut probe = Eval {
        cx,
        scopes: vec![Scope::of(b.body, inputs.clone())],
        last: false,
    };
    let mut counter = None;
    for j in 0..b.carried {
        if probe.outer(arg(b.node, 2 + j)?)? == A::Int(0) {
            probe.scopes[0].inputs.insert(b.input(2 + j), A::Iter(0));
            if probe.eval(&b.output(1 + j)).ok() == Some(A::Iter(1)) {
                counter = Some(j);
                break;
            }
            probe.scopes[0].inputs.insert(b.input(2 + j), A::Same(j));
        }
    }
    let mut invariant = vec![false; b.carried];
    for (j, inv) in invariant.iter_mut().enumerate() {
        if Some(j) != counter && probe.eval(&b.output(1 + j)).ok() == Some(A::Same(j)) {
            *inv = true;
            inputs.insert(b.input(2 + j), probe.outer(arg(b.node, 2 + j)?)?);
        }
    }
    match counter {
        Some(j) => {
            inputs.insert(b.input(2 + j), A::Iter(0));
        }
        None if has_trip => {
            inputs.insert(b.input(0), A::Iter(0));
            // A condition passed through keeps its first value.
            if let Ok(first) = probe.outer(arg(b.node, 1)?) {
                inputs.insert(b.input(1), first);
            }
        }
        None => {}
    }
    let ev = Eval {
        cx,
        scopes: vec![Scope::of(b.body, inputs)],
        last: false,
    };
    Ok((ev, counter, invariant))
}

/// The bound `n` of a counter loop: the first condition is `0 < n` and the body's is
/// `counter + 1 < n`.
fn counter_bound(cx: &Ctx<'_>, ev: &mut Eval<'_, '_>, b: &Body<'_>) -> R<String> {
    let A::Less { k: 1, n } = ev.eval(&b.output(0))? else {
        return Err("the loop condition is not `counter + 1 < n`".into());
    };
    let first = arg(b.node, 1)?;
    let p = producer(cx, first)
        .filter(|p| op_of(p) == "Less")
        .ok_or("the first condition is not `0 < n`")?;
    let (lhs, rhs) = (ev.outer(arg(p, 0)?)?, ev.outer(arg(p, 1)?)?);
    match rhs {
        A::Outer(m) if lhs == A::Int(0) && same_value(cx, &m, &n) => Ok(n),
        _ => Err("the first condition is not `0 < n`".into()),
    }
}

/// The symbolic integer an outer name holds, if the import computed one.
fn sym_of(cx: &Ctx<'_>, name: &str) -> Option<SymI> {
    match cx.lookup(name).ok()? {
        Val::Shape(v, _) if v.len() == 1 => v.into_iter().next(),
        Val::Const(t, _) => {
            let v = t.to_i64_vec()?;
            (v.len() == 1).then(|| SymI::int(v[0]))
        }
        _ => None,
    }
}

fn same_value(cx: &Ctx<'_>, a: &str, b: &str) -> bool {
    a == b || matches!((int_of(cx, a), int_of(cx, b)), (Some(x), Some(y)) if x == y)
}

/// The symbolic integer an outer name holds: what the import computed, else what
/// the shape arithmetic around bag bounds computes (`Gather(Shape(x), k)`, `Size`,
/// `+ - *`), for values the import could not represent (a `Concat` of the offsets
/// with a length is data, not a shape).
fn int_of(cx: &Ctx<'_>, name: &str) -> Option<SymI> {
    if let Some(v) = sym_of(cx, name) {
        return Some(v);
    }
    let n = producer(cx, name)?;
    let input = |k: usize| n.input.get(k).map(String::as_str);
    match op_of(n) {
        "Squeeze" | "Unsqueeze" | "Reshape" => int_of(cx, input(0)?),
        "Shape" => {
            let s = shape_of(cx, input(0)?)?;
            let start = usize::try_from(int_attr(n, "start", 0)).ok()?;
            (s.len() == start + 1).then(|| s[start].clone())
        }
        "Gather" => {
            let s = producer(cx, input(0)?).filter(|s| op_of(s) == "Shape")?;
            let k = sym_of(cx, input(1)?)?.as_int()?;
            let shape = shape_of(cx, s.input.first()?)?;
            let start = int_attr(s, "start", 0);
            let at = usize::try_from(if k < 0 {
                k + shape.len() as i64
            } else {
                k + start
            })
            .ok()?;
            shape.get(at).cloned()
        }
        "Size" => shape_of(cx, input(0)?)?
            .iter()
            .try_fold(SymI::int(1), |a, d| a.mul(d)),
        op @ ("Add" | "Sub" | "Mul") => {
            let (a, b) = (int_of(cx, input(0)?)?, int_of(cx, input(1)?)?);
            match op {
                "Add" => a.add(&b),
                "Sub" => a.sub(&b),
                _ => a.mul(&b),
            }
        }
        _ => None,
    }
}

/// The symbolic shape of an outer value: its IR type, else derived through the
/// ops that compute bag bounds (`Concat` and `Slice` of vectors, `Reshape` to
/// `[-1]`, `Range`).
fn shape_of(cx: &Ctx<'_>, name: &str) -> Option<Vec<SymI>> {
    if let Ok(v) = cx.lookup(name)
        && let Ok(ty) = cx.ty(&v)
    {
        return Some(ty.shape.iter().map(crate::ops::dim_sym).collect());
    }
    let n = producer(cx, name)?;
    let input = |k: usize| n.input.get(k).map(String::as_str);
    let len = |v: Vec<SymI>| -> Option<SymI> { (v.len() == 1).then(|| v[0].clone()) };
    match op_of(n) {
        "Unsqueeze" => {
            // A scalar made a one-element vector.
            int_of(cx, input(0)?)?;
            Some(vec![SymI::int(1)])
        }
        "Concat" => {
            let mut total = SymI::int(0);
            for i in &n.input {
                total = total.add(&len(shape_of(cx, i)?)?)?;
            }
            Some(vec![total])
        }
        "Slice" => {
            // One axis of a vector, a constant start and an end past it (`[s:]`).
            let l = len(shape_of(cx, input(0)?)?)?;
            let s = sym_of(cx, input(1)?)?.as_int()?;
            let e = sym_of(cx, input(2)?)?.as_int()?;
            if let Some(st) = input(4).filter(|s| !s.is_empty()) {
                (sym_of(cx, st)?.as_int()? == 1).then_some(())?;
            }
            (s >= 0 && e >= i64::from(i32::MAX))
                .then(|| l.sub(&SymI::int(s)))?
                .map(|v| vec![v])
        }
        "Reshape" => {
            let t = cx.lookup(input(1)?).ok()?;
            (cx.const_ints(&t, "").ok()? == [-1]).then_some(())?;
            let numel = shape_of(cx, input(0)?)?
                .iter()
                .try_fold(SymI::int(1), |a, d| a.mul(d))?;
            Some(vec![numel])
        }
        "Range" => {
            let (s, l, d) = (
                int_of(cx, input(0)?)?,
                int_of(cx, input(1)?)?,
                int_of(cx, input(2)?)?,
            );
            (d.as_int()? > 0).then_some(())?;
            Some(vec![l.sub(&s)?.div(&d)?])
        }
        _ => None,
    }
}

/// The length of an outer 1-D value, symbolically.
fn len_of(cx: &Ctx<'_>, name: &str) -> Option<SymI> {
    let s = shape_of(cx, name)?;
    (s.len() == 1).then(|| s[0].clone())
}

/// The producer of an outer name, through `Identity`/`Cast`.
fn producer<'m>(cx: &Ctx<'m>, mut name: &'m str) -> Option<&'m NodeProto> {
    for _ in 0..32 {
        let n = cx
            .graph
            .node
            .iter()
            .find(|n| n.output.iter().any(|o| o == name))?;
        match op_of(n) {
            "Identity" | "Cast" => name = n.input.first()?,
            _ => return Some(n),
        }
    }
    None
}

/// An integer value before the integer `Cast`s that only widen or narrow its type
/// (the exporter casts int32 offsets to int64 to append the length; the bag takes
/// either type).
fn uncast_int(cx: &Ctx<'_>, name: &str) -> String {
    let mut name = name.to_string();
    for _ in 0..8 {
        let Some(n) = cx
            .graph
            .node
            .iter()
            .find(|n| n.output.first() == Some(&name))
        else {
            break;
        };
        let Some(src) = n.input.first() else { break };
        let int = |v: &str| {
            cx.lookup(v)
                .ok()
                .and_then(|v| cx.ty(&v).ok())
                .is_some_and(|t| t.dtype.is_int())
        };
        if !(matches!(op_of(n), "Cast" | "Identity") && int(src) && int(&name)) {
            break;
        }
        name = src.clone();
    }
    name
}

/// The flat index vector's origin: a 2-D `[n, P]` value flattened by `Reshape`s,
/// as `(name, P, numel)`.
fn flattened<'m>(cx: &Ctx<'m>, ids: &'m str) -> Option<(&'m str, usize, SymI)> {
    let mut name = ids;
    for _ in 0..8 {
        if let Ok(v) = cx.lookup(name)
            && let Ok(ty) = cx.ty(&v)
            && ty.rank() == 2
        {
            let p = ty.shape[1].fixed()?;
            return Some((name, p, crate::ops::numel_sym(&ty.shape)?));
        }
        let n = producer(cx, name)?;
        if op_of(n) != "Reshape" {
            return None;
        }
        name = n.input.first()?;
    }
    None
}

/// `Loop`: an EmbeddingBag, else an error naming what did not match.
pub(crate) fn lower_loop(cx: &mut Ctx<'_>, n: &NodeCx<'_>) -> Built {
    let body = n.attrs.graph("body")?;
    let why = |e: String| format!("unsupported Loop: it does not compute an EmbeddingBag ({e})");
    let f = recognise(cx, n.proto, body).map_err(why)?;
    let bag = emit(cx, &f, &n.out_name(f.out)).map_err(why)?;
    let carried = n.n_inputs().saturating_sub(2);
    let mut outs = Vec::new();
    for k in 0..n.proto.output.len() {
        outs.push(if k == f.out {
            bag.clone()
        } else if k < carried {
            // Other carried values are loop-invariant or the counter (unused).
            match cx.opt_input(n, 2 + k) {
                Ok(Some(v)) => v,
                _ => Val::Failed(Rc::new(
                    cx.node_err(n, format!("Loop output {k} is not supported")),
                )),
            }
        } else {
            Val::Failed(Rc::new(
                cx.node_err(n, format!("Loop scan output {k} is not supported")),
            ))
        });
    }
    Ok(outs)
}

/// Emits the bag of a recognised loop, after checking that its bound `n` is
/// `len(E) - 1` and finding what `E` is.
fn emit(cx: &mut Ctx<'_>, f: &Found, hint: &str) -> R<Val> {
    let PerIdx::TableRows {
        table,
        ids,
        weights,
    } = &f.v
    else {
        return Err("the bag's rows are not gathered from a table".into());
    };
    let count = int_of(cx, &f.count).ok_or("the loop's bound is not known at import")?;
    let get = |cx: &Ctx<'_>, name: &str| cx.lookup(name).map_err(err_text);
    let e = producer(cx, &f.arr).ok_or(
        "the bag bounds are an input used whole, as with include_last_offset=True, which is not supported yet",
    )?;
    let (offsets, fixed) = match op_of(e) {
        "Concat" if e.input.len() == 2 => {
            let (o, tail) = (arg(e, 0)?, arg(e, 1)?);
            let total = match flattened(cx, ids) {
                Some((_, _, numel)) => numel,
                None => len_of(cx, ids).ok_or("the indices are not a vector")?,
            };
            if int_of(cx, tail) != Some(total) {
                return Err("the bounds do not end at the number of indices".into());
            }
            let rng = producer(cx, o).filter(|p| op_of(p) == "Range");
            (uncast_int(cx, o), rng.map(|r| (r, flattened(cx, ids))))
        }
        _ => {
            return Err(
                "the bag bounds are not `offsets` followed by the number of indices (include_last_offset=True is not supported yet)"
                    .into(),
            );
        }
    };
    if let Some((rng, flat)) = fixed {
        // `Range(0, numel, P)` over `[n, P]` indices: fixed-size bags.
        let (src, p, numel) =
            flat.ok_or("Range offsets over indices that are not a flattened matrix")?;
        let (s, l, d) = (
            int_of(cx, arg(rng, 0)?),
            int_of(cx, arg(rng, 1)?),
            int_of(cx, arg(rng, 2)?),
        );
        if s != Some(SymI::int(0)) || l != Some(numel.clone()) || d != Some(SymI::int(p as i64)) {
            return Err("Range offsets that are not 0, P, 2P, .. over [n, P] indices".into());
        }
        let rows = numel
            .div(&SymI::int(p as i64))
            .ok_or("bad fixed bag size")?;
        if count != rows {
            return Err(format!("the loop runs {count} times over {rows} bags"));
        }
        if weights.is_some() {
            return Err("per-sample weights on fixed-size bags are not supported yet".into());
        }
        let (t, i) = (get(cx, table)?, get(cx, src)?);
        return cx.emit(Op::EmbeddingBag { mode: f.mode }, &[t, i], hint);
    }
    let n_off = len_of(cx, &offsets).ok_or("the offsets are not a vector")?;
    if count != n_off {
        return Err(format!("the loop runs {count} times over {n_off} bags"));
    }
    let (t, i, o) = (get(cx, table)?, get(cx, ids)?, get(cx, &offsets)?);
    match weights {
        None => cx.emit(Op::EmbeddingBag { mode: f.mode }, &[t, i, o], hint),
        Some(w) => {
            if f.mode != Pool::Sum {
                return Err("per-sample weights need mode sum".into());
            }
            let w = get(cx, w)?;
            cx.emit(Op::EmbeddingBagWeighted, &[t, i, o, w], hint)
        }
    }
}
