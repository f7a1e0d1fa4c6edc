//! Tensor types: element types, dimensions (fixed or symbolic) and shapes.
//!
//! Symbolic dimensions are named; the runtime binds each symbol to a size when a
//! graph runs. Two symbols have fixed meanings throughout dlrmc:
//! - [`Dim::BATCH`] (`B`): the samples this rank (or the single device) processes;
//! - [`Dim::GLOBAL`] (`G`): the global batch of a partitioned program (sum of all
//!   ranks' `B`); embedding lookups of the tables a rank owns run over `G` samples.
//!
//! Other symbols (e.g. `N`, the number of indices of variable-size bags) are free.
//! A dimension may also be an expression over symbols ([`Dim::Expr`]: `B+1`
//! offsets with a last one, `F*B` lengths of `F` features), evaluated once its
//! symbols are bound; the runtime solves a linear one for its unbound symbol.

pub(crate) use crate::dim::DimExpr;
use std::fmt;

/// Element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// bfloat16: the high 16 bits of an f32 (storage format; compute is f32).
    BF16,
    /// 64-bit signed integer (indices, offsets).
    I64,
    /// 32-bit signed integer (indices, offsets).
    I32,
    /// Unsigned byte: the storage of quantized tables (FBGEMM's fused 8-bit
    /// row-wise rows: a row's codes, then its f32 scale and bias as 8 bytes,
    /// [`crate::ops::embedding_bag_q8`]). No arithmetic reads it directly.
    U8,
}

impl DType {
    /// The mnemonic used in the text form and in plans (`f32`, `bf16`, `i64`, `i32`, `u8`).
    pub fn mnemonic(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::U8 => "u8",
        }
    }

    /// Parses a mnemonic.
    pub fn from_mnemonic(s: &str) -> Option<DType> {
        Some(match s {
            "f32" => DType::F32,
            "bf16" => DType::BF16,
            "i64" => DType::I64,
            "i32" => DType::I32,
            "u8" => DType::U8,
            _ => return None,
        })
    }

    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::BF16 => 2,
            DType::I64 => 8,
            DType::U8 => 1,
        }
    }

    /// True for the floating-point types.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::BF16)
    }

    /// True for the index types.
    pub fn is_int(self) -> bool {
        matches!(self, DType::I64 | DType::I32)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.mnemonic())
    }
}

/// One dimension of a shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dim {
    /// A size known at compile time.
    Fixed(usize),
    /// A named size bound when the graph runs.
    Sym(String),
    /// A size computed from symbols (`B+1`, `F*B`): never a constant nor a single
    /// symbol (build it with [`Dim::from_expr`], which gives those as `Fixed` and
    /// `Sym`).
    Expr(DimExpr),
}

impl Dim {
    /// Name of the per-rank batch symbol.
    pub const BATCH: &'static str = "B";
    /// Name of the global batch symbol (partitioned programs).
    pub const GLOBAL: &'static str = "G";

    /// The per-rank batch dimension `B`.
    pub fn batch() -> Dim {
        Dim::Sym(Self::BATCH.to_string())
    }

    /// The global batch dimension `G`.
    pub fn global() -> Dim {
        Dim::Sym(Self::GLOBAL.to_string())
    }

    /// The fixed size, if this dimension is fixed.
    pub fn fixed(&self) -> Option<usize> {
        match self {
            Dim::Fixed(n) => Some(*n),
            Dim::Sym(_) | Dim::Expr(_) => None,
        }
    }

    /// The dimension for an expression: `Fixed` for a constant (`None` when it is
    /// negative), `Sym` for a single symbol, else `Expr`.
    pub fn from_expr(e: DimExpr) -> Option<Dim> {
        if let Some(k) = e.as_int() {
            return usize::try_from(k).ok().map(Dim::Fixed);
        }
        if let Some(s) = e.as_sym() {
            return Some(Dim::Sym(s.to_string()));
        }
        Some(Dim::Expr(e))
    }

    /// The dimension as an expression.
    pub fn to_expr(&self) -> DimExpr {
        match self {
            Dim::Fixed(n) => DimExpr::int(i64::try_from(*n).unwrap_or(i64::MAX)),
            Dim::Sym(s) => DimExpr::sym(s),
            Dim::Expr(e) => e.clone(),
        }
    }

    /// The symbols this dimension mentions.
    pub fn symbols(&self) -> Vec<&str> {
        match self {
            Dim::Fixed(_) => Vec::new(),
            Dim::Sym(s) => vec![s.as_str()],
            Dim::Expr(e) => e.symbols(),
        }
    }

    /// True if this is the symbol `name`.
    pub fn is_sym(&self, name: &str) -> bool {
        matches!(self, Dim::Sym(s) if s == name)
    }

    /// Resolves the dimension with a symbol binding.
    pub fn resolve(&self, bind: &dyn Fn(&str) -> Option<usize>) -> Option<usize> {
        match self {
            Dim::Fixed(n) => Some(*n),
            Dim::Sym(s) => bind(s),
            Dim::Expr(e) => e.eval(bind),
        }
    }
}

impl From<usize> for Dim {
    fn from(n: usize) -> Dim {
        Dim::Fixed(n)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Sym(s) => f.write_str(s),
            Dim::Expr(e) => write!(f, "{e}"),
        }
    }
}

/// A shape: a list of dimensions (empty for a scalar).
pub type Shape = Vec<Dim>;

/// The type of an SSA value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first (row-major).
    pub shape: Shape,
}

impl TensorType {
    /// Builds a type.
    pub fn new(dtype: DType, shape: impl IntoIterator<Item = Dim>) -> Self {
        TensorType {
            dtype,
            shape: shape.into_iter().collect(),
        }
    }

    /// An f32 type.
    pub fn f32(shape: impl IntoIterator<Item = Dim>) -> Self {
        Self::new(DType::F32, shape)
    }

    /// A scalar f32.
    pub fn scalar_f32() -> Self {
        Self::new(DType::F32, [])
    }

    /// Rank (number of dimensions).
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements if every dimension is fixed.
    pub fn fixed_numel(&self) -> Option<usize> {
        self.shape.iter().map(Dim::fixed).product()
    }

    /// Number of elements under a symbol binding.
    pub fn numel_with(&self, bind: &dyn Fn(&str) -> Option<usize>) -> Option<usize> {
        self.shape.iter().map(|d| d.resolve(bind)).product()
    }

    /// The same shape with another element type.
    pub fn with_dtype(&self, dtype: DType) -> Self {
        TensorType {
            dtype,
            shape: self.shape.clone(),
        }
    }
}

impl fmt::Display for TensorType {
    /// Text form: `f32[B,13]`, `f32[]` for a scalar.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}
