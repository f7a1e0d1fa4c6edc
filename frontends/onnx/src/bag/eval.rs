//! The abstract evaluation of a loop body: what each value is for bag `i` (see the
//! parent module).

use super::shapes::{flattened, len_of, producer, shape_of, sym_of};
use crate::import::{Ctx, NodeErr};
use crate::proto::{GraphProto, NodeProto};
use dlrm_ir::{Pool, Tensor};
use std::collections::HashMap;

pub(super) type R<T> = Result<T, String>;

/// A value that exists once per index of the bags' flat index vector.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum PerIdx {
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
pub(super) enum A {
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
pub(super) struct Scope<'g> {
    producers: HashMap<&'g str, &'g NodeProto>,
    inits: HashMap<&'g str, &'g crate::proto::TensorProto>,
    pub(super) inputs: HashMap<String, A>,
}

impl<'g> Scope<'g> {
    pub(super) fn of(g: &'g GraphProto, inputs: HashMap<String, A>) -> Self {
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

pub(super) fn op_of(n: &NodeProto) -> &str {
    n.op_type.as_deref().unwrap_or("")
}

pub(super) fn arg(n: &NodeProto, k: usize) -> R<&str> {
    n.input
        .get(k)
        .map(String::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("`{}` lacks operand {k}", op_of(n)))
}

/// The abstract evaluator of one loop.
pub(super) struct Eval<'c, 'm> {
    pub(super) cx: &'c Ctx<'m>,
    /// Scopes from the outermost subgraph in (the loop body, then an `If` branch).
    pub(super) scopes: Vec<Scope<'m>>,
    /// Inside the branch taken for the last bag.
    pub(super) last: bool,
}

impl<'m> Eval<'_, 'm> {
    /// The meaning of `name` seen from the innermost scope.
    pub(super) fn eval(&mut self, name: &str) -> R<A> {
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
    pub(super) fn outer(&self, name: &str) -> R<A> {
        let budget = std::cell::Cell::new(16 * self.cx.graph.node.len() + 256);
        self.outer_within(name, &budget)
    }

    /// [`Eval::outer`] following at most `budget` producers in all: an acyclic
    /// graph's patterns need a few per node, so running out means a cycle (a
    /// malformed model: once an unbounded recursion that overflowed the stack) or
    /// a chain of products reusing their operands (once exponential).
    fn outer_within(&self, name: &str, budget: &std::cell::Cell<usize>) -> R<A> {
        let Some(left) = budget.get().checked_sub(1) else {
            return Err(format!(
                "`{name}`: too many producers followed (the graph has a cycle through it)"
            ));
        };
        budget.set(left);
        let outer = |v: &str| self.outer_within(v, budget);
        let g = &self.cx.graph;
        let producer = g.node.iter().find(|n| n.output.iter().any(|o| o == name));
        if let Some(n) = producer {
            match op_of(n) {
                "Identity" | "Cast" | "CastLike" => return outer(arg(n, 0)?),
                "Gather" if int_attr(n, "axis", 0) == 0 => {
                    return Ok(A::Per(PerIdx::TableRows {
                        table: arg(n, 0)?.to_string(),
                        ids: arg(n, 1)?.to_string(),
                        weights: None,
                    }));
                }
                "Mul" => {
                    let (a, b) = (outer(arg(n, 0)?)?, outer(arg(n, 1)?)?);
                    if let Some(v) = weigh(&a, &b).or_else(|| weigh(&b, &a)) {
                        return Ok(v);
                    }
                }
                "Unsqueeze" => {
                    // Per-sample weights made a column, or a broadcast constant.
                    let x = outer(arg(n, 0)?)?;
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
                    if let A::Splat(v) = outer(arg(n, 0)?)? {
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
            "Reshape" | "Unsqueeze" | "Squeeze" => self.reshaped(n, depth, op)?,
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
            "ReduceSum" | "ReduceMean" => self.reduce(n, depth, op)?,
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

    /// `Reshape`, `Unsqueeze`, `Squeeze`: one-element values pass; a bag's rows
    /// made a column (`Unsqueeze` at axis 1) for weighting.
    fn reshaped(&mut self, n: &'m NodeProto, depth: usize, op: &str) -> R<A> {
        Ok(match self.eval_at(arg(n, 0)?, depth)? {
            a @ (A::Int(_) | A::Iter(_) | A::Bound { .. } | A::Splat(_)) => a,
            A::Rows { v, arr, .. } if op == "Unsqueeze" => {
                let axes = match crate::attrs::Attrs::new(n).ints("axes") {
                    Some(a) => a,
                    None => match self.eval_at(arg(n, 1)?, depth)? {
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
        })
    }

    /// `ReduceSum` / `ReduceMean` of a bag's table rows over axis 0: the bag.
    fn reduce(&mut self, n: &'m NodeProto, depth: usize, op: &str) -> R<A> {
        let A::Rows { v, arr, .. } = self.eval_at(arg(n, 0)?, depth)? else {
            return Err(format!("{op} of something other than a bag's rows"));
        };
        if !matches!(v, PerIdx::TableRows { .. }) {
            return Err(format!("{op} of rows not gathered from a table"));
        }
        let axes = match crate::attrs::Attrs::new(n).ints("axes") {
            Some(a) => a,
            None => match n.input.get(1).filter(|s| !s.is_empty()) {
                Some(_) => match self.eval_at(arg(n, 1)?, depth)? {
                    A::Int(a) => vec![a],
                    other => return Err(format!("{op} axes {other:?}")),
                },
                None => return Err(format!("{op} over every axis, not the bag's rows")),
            },
        };
        if axes != [0] {
            return Err(format!("{op} over axes {axes:?}, not the bag's rows"));
        }
        Ok(A::Bag {
            v,
            arr,
            mode: if op == "ReduceSum" {
                Pool::Sum
            } else {
                Pool::Mean
            },
            keep: int_attr(n, "keepdims", 1) != 0,
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
pub(super) fn bound(cx: &Ctx<'_>, arr: String, k: i64) -> A {
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
pub(super) fn same_len(cx: &Ctx<'_>, x: &str, v: &PerIdx) -> bool {
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

pub(super) fn err_text(e: NodeErr) -> String {
    match e {
        NodeErr::Msg(m) => m,
        NodeErr::Failed(e) => e.to_string(),
    }
}

pub(super) fn int_attr(n: &NodeProto, name: &str, default: i64) -> i64 {
    crate::attrs::Attrs::new(n)
        .int(name, default)
        .unwrap_or(i64::MIN)
}

/// Rows times per-index weights made a column: the weighted rows (a constant
/// weight 1 is no weight).
pub(super) fn weigh(rows: &A, w: &A) -> Option<A> {
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
pub(super) fn const_meaning(t: &Tensor) -> Option<A> {
    if t.dtype().is_int() {
        let v = t.to_i64_vec()?;
        return (v.len() == 1).then(|| A::Int(v[0]));
    }
    let v = t.to_f32_vec();
    let first = *v.first()?;
    v.iter().all(|&x| x == first).then_some(A::Splat(first))
}
