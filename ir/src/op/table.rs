//! The op table: every op's mnemonic and attributes, in one list.
//!
//! `op_table!` (below) takes one entry per [`Op`] variant,
//! `Variant "mnemonic" { field: kind "key", .. }` (no braces for an op without
//! attributes), and generates from it [`MNEMONICS`], [`Op::mnemonic`],
//! [`Op::attrs`] (the printer's view) and [`Op::from_parts`] (the parser's), so
//! the text form has no other per-op code. The attributes are listed in their
//! printed order; `kind` names both a reader method of [`AttrReader`] (parsing,
//! with its error message) and a function of [`mod@print`] (the [`Attr`] printed,
//! `None` to omit it). A variant missing from the table, or a field missing from
//! its entry, is a compile error (the generated matches are exhaustive).

use super::{A2aDir, Act, Attr, BinaryKind, InteractionKind, Op, Pool};
use crate::types::{DType, Dim};

macro_rules! op_table {
    ($(
        $variant:ident $mn:literal $({ $($field:ident : $kind:ident $key:literal),* $(,)? })?
    ),* $(,)?) => {
        /// Every op mnemonic, in table order, for diagnostics ("expected one of ...").
        pub const MNEMONICS: &[&str] = &[$($mn),*];

        impl Op {
            /// The op's name in the text form (snake case).
            pub fn mnemonic(&self) -> &'static str {
                match self {
                    $(Op::$variant { .. } => $mn,)*
                    Op::Module(m) => m.mnemonic(),
                }
            }

            /// The attributes in their canonical (printed) order.
            pub fn attrs(&self) -> Vec<(&'static str, Attr)> {
                let mut out = Vec::new();
                match self {
                    $(Op::$variant { $($($field),*)? } => {
                        $($(if let Some(a) = print::$kind($field) {
                            out.push(($key, a));
                        })*)?
                    })*
                    Op::Module(m) => out.extend(m.attrs().iter().cloned()),
                }
                out
            }

            /// Builds an op from its mnemonic and attributes (the parser's entry
            /// point). Unknown mnemonics, missing, unknown or ill-typed attributes
            /// are errors.
            pub fn from_parts(mnemonic: &str, attrs: &[(String, Attr)]) -> Result<Op, String> {
                let mut a = AttrReader {
                    attrs,
                    used: vec![false; attrs.len()],
                };
                let op = match mnemonic {
                    $($mn => Op::$variant { $($($field: a.$kind($key)?),*)? },)*
                    other => {
                        if let Some(op) = crate::module::from_parts(other, attrs) {
                            return op;
                        }
                        return Err(format!(
                            "unknown op `{other}` (expected one of: {})",
                            MNEMONICS.join(", ")
                        ));
                    }
                };
                if let Some(i) = a.used.iter().position(|u| !u) {
                    return Err(format!("op `{mnemonic}` has no attribute `{}`", attrs[i].0));
                }
                Ok(op)
            }
        }
    };
}

// One line per op, in the order of the enum's sections. Kinds: `pool`, `act`,
// `opt_act` (printed only when not `none`), `kind` (interaction), `bool`,
// `opt_bool` (printed only when true),
// `usize`, `usizes`, `float`, `dim`, `list` (a shape), `dtype` (f32 or bf16),
// `opt_dtype` (printed only when not f32), `any_dtype`, `a2a_dir`, `binary_kind`.
op_table! {
    EmbeddingBag "embedding_bag" { mode: pool "mode", last_offset: opt_bool "last_offset" },
    Linear "linear" { act: act "act" },
    Relu "relu",
    Add "add",
    Sigmoid "sigmoid",
    Interaction "interaction" { kind: kind "kind", self_interaction: bool "self" },
    Concat "concat" { axis: usize "axis" },
    Split "split" { axis: usize "axis", sizes: usizes "sizes" },
    Reshape "reshape" { shape: list "shape" },
    Bce "bce" { denom: dim "denom" },
    Mse "mse" { denom: dim "denom" },
    ReluGrad "relu_grad",
    SigmoidGrad "sigmoid_grad",
    LinearDx "linear_dx",
    LinearDw "linear_dw",
    LinearDb "linear_db",
    InteractionGrad "interaction_grad" { kind: kind "kind", self_interaction: bool "self" },
    EmbeddingBagGrad "embedding_bag_grad" { mode: pool "mode", last_offset: opt_bool "last_offset" },
    BceGrad "bce_grad" { denom: dim "denom" },
    MseGrad "mse_grad" { denom: dim "denom" },
    Sgd "sgd" { lr: float "lr" },
    SparseSgd "sparse_sgd" { lr: float "lr" },
    Adagrad "adagrad" { lr: float "lr", eps: float "eps", wd: float "wd", rowwise: bool "rowwise" },
    SparseAdagrad "sparse_adagrad" { lr: float "lr", eps: float "eps", rowwise: bool "rowwise" },
    AllReduce "all_reduce",
    AllToAll "all_to_all" { dir: a2a_dir "dir", counts: usizes "counts", rank: usize "rank" },
    // ---- fused / blocked ops (e-graph, precision)
    BlockAct "block_act" { bk: usize "bk", dtype: dtype "dtype" },
    UnblockAct "unblock_act" { k: usize "k", dtype: dtype "dtype" },
    BlockWeight "block_weight" { bn: usize "bn", bk: usize "bk" },
    UnblockWeight "unblock_weight" { n: usize "n", k: usize "k" },
    Brgemm "brgemm" { act: act "act" },
    BrgemmDgrad "brgemm_dgrad" { act: act "act", mask: opt_act "mask", dtype: opt_dtype "dtype" },
    BrgemmWgrad "brgemm_wgrad" { act: act "act", n: usize "n" },
    BceLogits "bce_logits" { denom: dim "denom" },
    BceLogitsGrad "bce_logits_grad" { denom: dim "denom" },
    SplitSgd "split_sgd" { lr: float "lr" },
    EmbeddingUpdate "embedding_update" { mode: pool "mode", lr: float "lr" },
    SplitEmbeddingUpdate "split_embedding_update" { mode: pool "mode", lr: float "lr" },
    EmbeddingUpdateAdagrad "embedding_update_adagrad" {
        mode: pool "mode", lr: float "lr", eps: float "eps", rowwise: bool "rowwise"
    },
    // ---- sharded embeddings
    EmbeddingBagRows "embedding_bag_rows" { mode: pool "mode", lo: usize "lo", rows: usize "rows" },
    SparseSgdRows "sparse_sgd_rows" { lr: float "lr", lo: usize "lo", rows: usize "rows" },
    EmbeddingUpdateRows "embedding_update_rows" {
        mode: pool "mode", lr: float "lr", lo: usize "lo", rows: usize "rows"
    },
    SplitEmbeddingUpdateRows "split_embedding_update_rows" {
        mode: pool "mode", lr: float "lr", lo: usize "lo", rows: usize "rows"
    },
    EmbeddingUpdateAdagradRows "embedding_update_adagrad_rows" {
        mode: pool "mode", lr: float "lr", eps: float "eps", rowwise: bool "rowwise",
        lo: usize "lo", rows: usize "rows"
    },
    EmbeddingGradDense "embedding_grad_dense" { mode: pool "mode", rows: usize "rows" },
    // ---- generic ops (ONNX import)
    MatMul "matmul",
    Binary "binary" { kind: binary_kind "kind" },
    Transpose "transpose" { perm: usizes "perm" },
    Gather "gather" { axis: usize "axis" },
    GatherElements "gather_elements" { axis: usize "axis" },
    GatherNd "gather_nd" { batch_dims: usize "batch_dims" },
    Slice "slice" {
        axes: usizes "axes", starts: usizes "starts", ends: list "ends", steps: usizes "steps"
    },
    Reduce "reduce" { kind: pool "kind", axes: usizes "axes", keepdims: bool "keepdims" },
    Cast "cast" { to: any_dtype "to" },
    EmbeddingBagWeighted "embedding_bag_weighted",
    OffsetsFromLengths "offsets_from_lengths" { keys: usize "keys", key: usize "key" },
}

/// The printed form of each attribute kind (`None`: not printed).
mod print {
    use super::{A2aDir, Act, Attr, BinaryKind, DType, Dim, InteractionKind, Pool};

    fn id(s: &str) -> Option<Attr> {
        Some(Attr::Ident(s.to_string()))
    }

    pub(super) fn pool(v: &Pool) -> Option<Attr> {
        id(v.name())
    }

    pub(super) fn act(v: &Act) -> Option<Attr> {
        id(v.name())
    }

    /// Omitted when `none` (the reader's default).
    pub(super) fn opt_act(v: &Act) -> Option<Attr> {
        (*v != Act::None).then(|| Attr::Ident(v.name().to_string()))
    }

    pub(super) fn kind(v: &InteractionKind) -> Option<Attr> {
        id(v.name())
    }

    pub(super) fn bool(v: &bool) -> Option<Attr> {
        Some(Attr::Bool(*v))
    }

    /// Omitted when false (the reader's default).
    pub(super) fn opt_bool(v: &bool) -> Option<Attr> {
        v.then_some(Attr::Bool(true))
    }

    pub(super) fn usize(v: &usize) -> Option<Attr> {
        Some(Attr::Int(*v as i64))
    }

    /// A list attribute of non-negative integers.
    pub(super) fn usizes(v: &[usize]) -> Option<Attr> {
        Some(Attr::List(v.iter().map(|&x| Dim::Fixed(x)).collect()))
    }

    pub(super) fn float(v: &f32) -> Option<Attr> {
        Some(Attr::Float(*v))
    }

    pub(super) fn dim(v: &Dim) -> Option<Attr> {
        Some(Attr::Dim(v.clone()))
    }

    pub(super) fn list(v: &[Dim]) -> Option<Attr> {
        Some(Attr::List(v.to_vec()))
    }

    pub(super) fn dtype(v: &DType) -> Option<Attr> {
        id(v.mnemonic())
    }

    /// Omitted when f32 (the reader's default).
    pub(super) fn opt_dtype(v: &DType) -> Option<Attr> {
        (*v != DType::F32).then(|| Attr::Ident(v.mnemonic().to_string()))
    }

    pub(super) fn any_dtype(v: &DType) -> Option<Attr> {
        id(v.mnemonic())
    }

    pub(super) fn a2a_dir(v: &A2aDir) -> Option<Attr> {
        id(v.name())
    }

    pub(super) fn binary_kind(v: &BinaryKind) -> Option<Attr> {
        id(v.name())
    }
}

/// Reads an op's attributes by key, remembering which were used (the rest are
/// errors). One method per attribute kind of the table.
struct AttrReader<'a> {
    attrs: &'a [(String, Attr)],
    used: Vec<bool>,
}

impl AttrReader<'_> {
    fn get(&mut self, key: &str) -> Result<&Attr, String> {
        let i = self
            .attrs
            .iter()
            .position(|(k, _)| k == key)
            .ok_or_else(|| format!("missing attribute `{key}`"))?;
        self.used[i] = true;
        Ok(&self.attrs[i].1)
    }

    fn ident(&mut self, key: &str) -> Result<String, String> {
        match self.get(key)? {
            Attr::Ident(s) => Ok(s.clone()),
            // A single-letter identifier may have been read as a symbolic dimension.
            Attr::Dim(Dim::Sym(s)) => Ok(s.clone()),
            other => Err(format!("attribute `{key}` must be a name, got `{other}`")),
        }
    }

    fn pool(&mut self, key: &str) -> Result<Pool, String> {
        match self.ident(key)?.as_str() {
            "sum" => Ok(Pool::Sum),
            "mean" => Ok(Pool::Mean),
            o => Err(format!("`{key}` must be sum or mean, got `{o}`")),
        }
    }

    fn act(&mut self, key: &str) -> Result<Act, String> {
        match self.ident(key)?.as_str() {
            "none" => Ok(Act::None),
            "relu" => Ok(Act::Relu),
            "sigmoid" => Ok(Act::Sigmoid),
            o => Err(format!("`{key}` must be none, relu or sigmoid, got `{o}`")),
        }
    }

    /// [`Self::act`] if `key` is given, else `none`.
    fn opt_act(&mut self, key: &str) -> Result<Act, String> {
        if self.attrs.iter().any(|(k, _)| k == key) {
            self.act(key)
        } else {
            Ok(Act::None)
        }
    }

    // ---- fused / blocked ops (e-graph, precision)
    fn dtype(&mut self, key: &str) -> Result<DType, String> {
        let s = self.ident(key)?;
        match DType::from_mnemonic(&s) {
            Some(d) if d.is_float() => Ok(d),
            _ => Err(format!("`{key}` must be f32 or bf16, got `{s}`")),
        }
    }

    /// [`Self::dtype`] if `key` is given, else f32.
    fn opt_dtype(&mut self, key: &str) -> Result<DType, String> {
        if self.attrs.iter().any(|(k, _)| k == key) {
            self.dtype(key)
        } else {
            Ok(DType::F32)
        }
    }

    fn kind(&mut self, key: &str) -> Result<InteractionKind, String> {
        match self.ident(key)?.as_str() {
            "dot" => Ok(InteractionKind::Dot),
            "cat" => Ok(InteractionKind::Cat),
            o => Err(format!("`{key}` must be dot or cat, got `{o}`")),
        }
    }

    fn bool(&mut self, key: &str) -> Result<bool, String> {
        match self.get(key)? {
            Attr::Bool(b) => Ok(*b),
            other => Err(format!(
                "attribute `{key}` must be true or false, got `{other}`"
            )),
        }
    }

    /// [`Self::bool`] if `key` is given, else false.
    fn opt_bool(&mut self, key: &str) -> Result<bool, String> {
        if self.attrs.iter().any(|(k, _)| k == key) {
            self.bool(key)
        } else {
            Ok(false)
        }
    }

    fn usize(&mut self, key: &str) -> Result<usize, String> {
        match self.get(key)? {
            Attr::Int(v) if *v >= 0 => Ok(*v as usize),
            Attr::Dim(Dim::Fixed(v)) => Ok(*v),
            other => Err(format!(
                "attribute `{key}` must be a non-negative integer, got `{other}`"
            )),
        }
    }

    fn float(&mut self, key: &str) -> Result<f32, String> {
        match self.get(key)? {
            Attr::Float(v) => Ok(*v),
            Attr::Int(v) => Ok(*v as f32),
            other => Err(format!("attribute `{key}` must be a number, got `{other}`")),
        }
    }

    fn dim(&mut self, key: &str) -> Result<Dim, String> {
        match self.get(key)? {
            Attr::Dim(d) => Ok(d.clone()),
            Attr::Int(v) if *v >= 0 => Ok(Dim::Fixed(*v as usize)),
            Attr::Ident(s) => Ok(Dim::Sym(s.clone())),
            other => Err(format!(
                "attribute `{key}` must be a dimension, got `{other}`"
            )),
        }
    }

    fn list(&mut self, key: &str) -> Result<Vec<Dim>, String> {
        match self.get(key)? {
            Attr::List(ds) => Ok(ds.clone()),
            other => Err(format!("attribute `{key}` must be a list, got `{other}`")),
        }
    }

    fn usizes(&mut self, key: &str) -> Result<Vec<usize>, String> {
        self.list(key)?
            .iter()
            .map(|d| {
                d.fixed()
                    .ok_or_else(|| format!("attribute `{key}` must list integers, got `{d}`"))
            })
            .collect()
    }

    // ---- kinds of one op each (their messages predate the table)
    fn a2a_dir(&mut self, key: &str) -> Result<A2aDir, String> {
        match self.ident(key)?.as_str() {
            "scatter" => Ok(A2aDir::Scatter),
            "gather" => Ok(A2aDir::Gather),
            other => Err(format!("{key} must be scatter or gather, got `{other}`")),
        }
    }

    fn binary_kind(&mut self, key: &str) -> Result<BinaryKind, String> {
        match self.ident(key)?.as_str() {
            "add" => Ok(BinaryKind::Add),
            "sub" => Ok(BinaryKind::Sub),
            "mul" => Ok(BinaryKind::Mul),
            "div" => Ok(BinaryKind::Div),
            o => Err(format!("`{key}` must be add, sub, mul or div, got `{o}`")),
        }
    }

    /// Any dtype (`dtype` is the float-only kind).
    fn any_dtype(&mut self, key: &str) -> Result<DType, String> {
        let t = self.ident(key)?;
        DType::from_mnemonic(&t)
            .ok_or_else(|| format!("`{key}` must be f32, bf16, i64 or i32, got `{t}`"))
    }
}
