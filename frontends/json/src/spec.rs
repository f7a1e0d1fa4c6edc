//! The model description: its JSON form, parsing and validation.
//!
//! Parsing goes through a private serde mirror ([`RawSpec`], `deny_unknown_fields`)
//! whose errors carry serde's line and column and the path of the field being read;
//! it is then normalised into the public [`ModelSpec`] (one pooling factor per
//! table, IR enums) and checked by [`ModelSpec::validate`].
//!
//! Invariant: a [`ModelSpec`] returned by [`ModelSpec::parse`] or [`ModelSpec::load`]
//! has passed [`ModelSpec::validate`], so building its graph cannot fail and every
//! parameter's element count fits in `usize`.

use crate::error::{Error, Result};
use dlrm_ir::{InteractionKind, Pool};
use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use std::fmt;
use std::path::Path;

/// The training loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Loss {
    /// Binary cross-entropy of the probability (`"bce"`).
    Bce,
    /// Mean squared error of the probability (`"mse"`, the reference DLRM's default).
    Mse,
}

/// The optimizer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Optimizer {
    /// Plain SGD: dense for MLP weights, sparse (touched rows only) for tables (`"sgd"`).
    Sgd,
    /// Adagrad (`torch.optim.Adagrad`) with an accumulator per element, dense for MLP
    /// weights, sparse (touched rows, gradient coalesced) for tables (`"adagrad"`).
    Adagrad(Adagrad),
    /// Row-wise Adagrad on tables (one accumulator per row: the reference's
    /// `RWSAdagrad`, FBGEMM's `EXACT_ROWWISE_ADAGRAD`), plain Adagrad on MLP weights
    /// (`"rowwise_adagrad"`).
    RowwiseAdagrad(Adagrad),
}

impl Optimizer {
    /// The spelling in the description (`sgd`, `adagrad`, `rowwise_adagrad`).
    pub fn name(&self) -> &'static str {
        match self {
            Optimizer::Sgd => "sgd",
            Optimizer::Adagrad(_) => "adagrad",
            Optimizer::RowwiseAdagrad(_) => "rowwise_adagrad",
        }
    }

    /// Parses an optimizer name with Adagrad's default hyper-parameters (the
    /// `--optimizer` flag); `None` for an unknown name.
    pub fn from_name(name: &str) -> Option<Optimizer> {
        match name {
            "sgd" => Some(Optimizer::Sgd),
            "adagrad" => Some(Optimizer::Adagrad(Adagrad::default())),
            "rowwise_adagrad" => Some(Optimizer::RowwiseAdagrad(Adagrad::default())),
            _ => None,
        }
    }
}

/// Adagrad's hyper-parameters beside the learning rate (PyTorch's names and
/// defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adagrad {
    /// Added to the accumulator's root (finite, > 0; default 1e-10).
    pub eps: f32,
    /// Every accumulator's initial value (finite, >= 0; default 0).
    pub initial_accumulator_value: f32,
    /// L2 weight decay of the MLP weights (finite, >= 0; default 0). Tables get none:
    /// PyTorch and the reference refuse weight decay with sparse gradients.
    pub weight_decay: f32,
}

impl Default for Adagrad {
    fn default() -> Adagrad {
        Adagrad {
            eps: 1e-10,
            initial_accumulator_value: 0.0,
            weight_decay: 0.0,
        }
    }
}

/// A validated model description (see the crate docs for the JSON form).
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    /// The model's (and graph's) name: one or more of `A-Z a-z 0-9 _ . -`.
    pub name: String,
    /// Width of the dense input `dense` `f32[B, dense_features]`.
    pub dense_features: usize,
    /// Width of every embedding vector.
    pub embedding_dim: usize,
    /// Rows of each embedding table, one entry per table.
    pub table_rows: Vec<usize>,
    /// Lookups per sample of each table (one entry per table; a single number in the
    /// file is repeated for every table). With [`Bags::Offsets`] every entry is 1
    /// and unused: the data gives each bag's size.
    pub pooling: Vec<usize>,
    /// How each table's bags come in: a fixed number of ids a sample, or ids with
    /// offsets (bags of any size).
    pub bags: Bags,
    /// How a bag's rows are combined.
    pub pooling_mode: Pool,
    /// Bottom MLP widths, the input width (`dense_features`) first.
    pub bottom_mlp: Vec<usize>,
    /// Top MLP widths without the input width; the last is 1.
    pub top_mlp: Vec<usize>,
    /// Feature interaction.
    pub interaction: InteractionKind,
    /// Keep the self-interaction terms `i == j` (dot only).
    pub interaction_itself: bool,
    /// DCN-v2's cross network over the concatenated features (`"interaction":
    /// "dcn"`, whose `interaction` is then [`InteractionKind::Cat`]); `None` for
    /// the dot and cat interactions.
    pub cross: Option<CrossNet>,
    /// Training loss.
    pub loss: Loss,
    /// Global mini-batch size.
    pub batch_size: usize,
    /// Optimizer.
    pub optimizer: Optimizer,
    /// Learning rate (finite, > 0).
    pub learning_rate: f32,
    /// Seed of the parameter initialisation (and of anything else random).
    pub seed: u64,
}

/// The most cross layers a description may ask for (MLPerf's model has 3; each
/// layer is nodes and parameters of the graph built before any size check).
pub const MAX_DCN_LAYERS: usize = 1024;

/// DCN-v2's low-rank cross network (TorchRec's `LowRankCrossNet`): `layers` layers
/// `x_{l+1} = x0 ⊙ (U_l V_l x_l + b_l) + x_l` of rank `low_rank` over the
/// concatenation `x0` of the bottom MLP's output and the pooled embeddings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrossNet {
    /// Number of cross layers (`dcn_layers`).
    pub layers: usize,
    /// The rank `R` of each layer's `W = U·V` (`dcn_low_rank`).
    pub low_rank: usize,
}

/// How a model takes each table's bags (`"bags"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Bags {
    /// `idx.{t}` `i64[B, pooling_t]`: every bag holds `pooling_t` ids.
    #[default]
    Fixed,
    /// `idx.{t}` `i64[nnz_t]` and `off.{t}` `i64[B]` (PyTorch's `EmbeddingBag`
    /// offsets: bag `s` is `idx[off[s] .. off[s+1]]`, the last to the end): bags
    /// of any size, as multi-hot data has them.
    Offsets,
}

// ------------------------------------------------------------------ raw form

/// The JSON form exactly as written; see the crate docs.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    name: String,
    dense_features: usize,
    embedding_dim: usize,
    table_rows: Vec<usize>,
    pooling: Option<RawPooling>,
    #[serde(default)]
    bags: RawBags,
    #[serde(default)]
    pooling_mode: RawPoolingMode,
    bottom_mlp: Widths,
    top_mlp: Widths,
    #[serde(default)]
    interaction: RawInteraction,
    #[serde(default)]
    interaction_itself: bool,
    dcn_layers: Option<usize>,
    dcn_low_rank: Option<usize>,
    #[serde(default)]
    loss: RawLoss,
    batch_size: usize,
    #[serde(default)]
    optimizer: RawOptimizer,
    learning_rate: f64,
    eps: Option<f64>,
    initial_accumulator_value: Option<f64>,
    weight_decay: Option<f64>,
    #[serde(default = "default_seed")]
    seed: u64,
}

fn default_seed() -> u64 {
    1
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum RawBags {
    #[default]
    Fixed,
    Offsets,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "lowercase")]
enum RawPoolingMode {
    #[default]
    Sum,
    Mean,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum RawInteraction {
    #[default]
    Dot,
    Cat,
    Dcn,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "lowercase")]
enum RawLoss {
    #[default]
    Bce,
    Mse,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "lowercase")]
enum RawOptimizer {
    #[default]
    Sgd,
    Adagrad,
    #[serde(rename = "rowwise_adagrad")]
    RowwiseAdagrad,
}

/// `pooling`: one number for every table, or a list with one number per table.
enum RawPooling {
    Uniform(usize),
    PerTable(Vec<usize>),
}

impl Default for RawPooling {
    fn default() -> Self {
        RawPooling::Uniform(1)
    }
}

impl<'de> Deserialize<'de> for RawPooling {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawPooling;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number of lookups per table, or a list with one per table")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawPooling, E> {
                usize::try_from(v)
                    .map(RawPooling::Uniform)
                    .map_err(|_| E::custom(format!("{v} lookups is too many")))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawPooling, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = seq.next_element::<usize>()? {
                    v.push(x);
                }
                Ok(RawPooling::PerTable(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// MLP widths: a list of numbers or a string of numbers joined by `-`.
struct Widths(Vec<usize>);

impl<'de> Deserialize<'de> for Widths {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Widths;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a list of layer widths like [13, 512, 64] or a string like \"13-512-64\"",
                )
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Widths, E> {
                s.split('-')
                    .map(|part| {
                        part.trim().parse::<usize>().map_err(|_| {
                            E::custom(format!(
                                "`{part}` in \"{s}\" is not a layer width \
                                 (expected numbers joined by `-`, like \"13-512-64\")"
                            ))
                        })
                    })
                    .collect::<Result<Vec<_>, E>>()
                    .map(Widths)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Widths, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = seq.next_element::<usize>()? {
                    v.push(x);
                }
                Ok(Widths(v))
            }
        }
        d.deserialize_any(V)
    }
}

// ------------------------------------------------------------------ parsing

impl ModelSpec {
    /// Reads and parses a description file; the path is the origin in errors.
    pub fn load(path: impl AsRef<Path>) -> Result<ModelSpec> {
        let path = path.as_ref();
        let src = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.display().to_string(),
            source,
        })?;
        ModelSpec::parse(&src, &path.display().to_string())
    }

    /// Parses and validates a description. `origin` names the source in errors (a
    /// file path, or e.g. `<inline>`).
    pub fn parse(src: &str, origin: &str) -> Result<ModelSpec> {
        let mut de = serde_json::Deserializer::from_str(src);
        let raw: RawSpec = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            // `.` is the root; `?` marks a segment serde could not name.
            let field = (path != "." && !path.contains('?')).then_some(path);
            json_error(origin, field, e.into_inner())
        })?;
        // Trailing characters after the object are an error too.
        de.end().map_err(|e| json_error(origin, None, e))?;
        let spec = raw.into_spec(origin)?;
        spec.validate(origin)?;
        Ok(spec)
    }
}

fn json_error(origin: &str, field: Option<String>, e: serde_json::Error) -> Error {
    let (line, column) = (e.line(), e.column());
    let full = e.to_string();
    let suffix = format!(" at line {line} column {column}");
    let message = full.strip_suffix(&suffix).unwrap_or(&full).to_string();
    Error::Json {
        origin: origin.to_string(),
        field,
        line,
        column,
        message,
    }
}

impl RawSpec {
    fn into_spec(self, origin: &str) -> Result<ModelSpec> {
        let given = self.pooling.is_some();
        let pooling = match (self.bags, self.pooling.unwrap_or_default()) {
            (RawBags::Offsets, _) if given => {
                return Err(invalid(
                    origin,
                    "pooling",
                    "applies to fixed bags; with \"bags\": \"offsets\" the data gives each \
                     bag's size (`dlrm-run --pooling` for synthetic data)",
                ));
            }
            (RawBags::Offsets, _) => vec![1; self.table_rows.len()],
            (_, RawPooling::Uniform(0)) => {
                return Err(invalid(origin, "pooling", "must be > 0, got 0"));
            }
            (_, RawPooling::Uniform(l)) => vec![l; self.table_rows.len()],
            (_, RawPooling::PerTable(v)) => v,
        };
        Ok(ModelSpec {
            bags: match self.bags {
                RawBags::Fixed => Bags::Fixed,
                RawBags::Offsets => Bags::Offsets,
            },
            name: self.name,
            dense_features: self.dense_features,
            embedding_dim: self.embedding_dim,
            table_rows: self.table_rows,
            pooling,
            pooling_mode: match self.pooling_mode {
                RawPoolingMode::Sum => Pool::Sum,
                RawPoolingMode::Mean => Pool::Mean,
            },
            bottom_mlp: self.bottom_mlp.0,
            top_mlp: self.top_mlp.0,
            interaction: match self.interaction {
                RawInteraction::Dot => InteractionKind::Dot,
                RawInteraction::Cat | RawInteraction::Dcn => InteractionKind::Cat,
            },
            cross: match (self.interaction, self.dcn_layers, self.dcn_low_rank) {
                (RawInteraction::Dcn, layers, Some(low_rank)) => Some(CrossNet {
                    layers: layers.unwrap_or(3),
                    low_rank,
                }),
                (RawInteraction::Dcn, _, None) => {
                    return Err(invalid(
                        origin,
                        "dcn_low_rank",
                        "is required with interaction \"dcn\" (the rank of each cross layer, \
                         e.g. 512 as MLPerf's DLRM-DCNv2)",
                    ));
                }
                (_, Some(_), _) | (_, _, Some(_)) => {
                    return Err(invalid(
                        origin,
                        if self.dcn_layers.is_some() {
                            "dcn_layers"
                        } else {
                            "dcn_low_rank"
                        },
                        "applies only to interaction \"dcn\"",
                    ));
                }
                _ => None,
            },
            interaction_itself: self.interaction_itself,
            loss: match self.loss {
                RawLoss::Bce => Loss::Bce,
                RawLoss::Mse => Loss::Mse,
            },
            batch_size: self.batch_size,
            optimizer: {
                let d = Adagrad::default();
                let a = Adagrad {
                    eps: self.eps.map_or(d.eps, |v| v as f32),
                    initial_accumulator_value: self
                        .initial_accumulator_value
                        .map_or(d.initial_accumulator_value, |v| v as f32),
                    weight_decay: self.weight_decay.map_or(d.weight_decay, |v| v as f32),
                };
                match self.optimizer {
                    RawOptimizer::Sgd => {
                        let given = [
                            ("eps", self.eps),
                            ("initial_accumulator_value", self.initial_accumulator_value),
                            ("weight_decay", self.weight_decay),
                        ];
                        if let Some((field, _)) = given.iter().find(|(_, v)| v.is_some()) {
                            return Err(invalid(
                                origin,
                                *field,
                                "applies to the adagrad optimizers only (optimizer is sgd)",
                            ));
                        }
                        Optimizer::Sgd
                    }
                    RawOptimizer::Adagrad => Optimizer::Adagrad(a),
                    RawOptimizer::RowwiseAdagrad => Optimizer::RowwiseAdagrad(a),
                }
            },
            learning_rate: self.learning_rate as f32,
            seed: self.seed,
        })
    }
}

fn invalid(origin: &str, field: impl Into<String>, reason: impl Into<String>) -> Error {
    Error::Invalid {
        origin: origin.to_string(),
        field: field.into(),
        reason: reason.into(),
    }
}

// ------------------------------------------------------------------ validation

/// A count that must be above 0.
fn positive(origin: &str, field: String, v: usize) -> Result<()> {
    if v == 0 {
        Err(invalid(origin, field, "must be > 0, got 0"))
    } else {
        Ok(())
    }
}

impl ModelSpec {
    /// Checks every rule of the description; `origin` names the source in errors.
    /// The first violation is returned, naming its field.
    pub fn validate(&self, origin: &str) -> Result<()> {
        self.validate_inputs(origin)?;
        self.validate_mlps(origin)?;
        self.validate_training(origin)
    }

    /// The graph's name, the dense features and the tables: widths, rows and
    /// lookups per table.
    fn validate_inputs(&self, origin: &str) -> Result<()> {
        let bad = |field: String, reason: String| Err(invalid(origin, field, reason));
        let positive = |field: String, v: usize| positive(origin, field, v);
        if !dlrm_ir::text::is_graph_name(&self.name) {
            return bad(
                "name".into(),
                format!(
                    "must be one or more of A-Z a-z 0-9 _ . - (it names the graph), got {:?}",
                    self.name
                ),
            );
        }
        positive("dense_features".into(), self.dense_features)?;
        positive("embedding_dim".into(), self.embedding_dim)?;
        if self.table_rows.is_empty() {
            return bad("table_rows".into(), "must list at least one table".into());
        }
        for (t, &rows) in self.table_rows.iter().enumerate() {
            positive(format!("table_rows[{t}]"), rows)?;
            if rows.checked_mul(self.embedding_dim).is_none() {
                return bad(
                    format!("table_rows[{t}]"),
                    format!(
                        "{rows} rows x embedding_dim {} elements do not fit in memory",
                        self.embedding_dim
                    ),
                );
            }
        }
        if self.pooling.len() != self.table_rows.len() {
            return bad(
                "pooling".into(),
                format!(
                    "lists {} lookup counts but `table_rows` has {} tables (give one per table, \
                     or a single number)",
                    self.pooling.len(),
                    self.table_rows.len()
                ),
            );
        }
        for (t, &l) in self.pooling.iter().enumerate() {
            positive(format!("pooling[{t}]"), l)?;
        }
        Ok(())
    }

    /// The MLPs' widths: the bottom MLP from the dense features (to the
    /// embedding width for `dot`), the top MLP to the one click probability;
    /// the interaction's options.
    fn validate_mlps(&self, origin: &str) -> Result<()> {
        let bad = |field: String, reason: String| Err(invalid(origin, field, reason));
        let positive = |field: String, v: usize| positive(origin, field, v);
        if self.bottom_mlp.len() < 2 {
            return bad(
                "bottom_mlp".into(),
                format!(
                    "must give the input width and at least one layer (like \"13-512-64\"), got {:?}",
                    self.bottom_mlp
                ),
            );
        }
        for (i, &w) in self.bottom_mlp.iter().enumerate() {
            positive(format!("bottom_mlp[{i}]"), w)?;
        }
        if self.bottom_mlp[0] != self.dense_features {
            return bad(
                "bottom_mlp[0]".into(),
                format!(
                    "is the bottom MLP's input width and must equal dense_features {}, got {}",
                    self.dense_features, self.bottom_mlp[0]
                ),
            );
        }
        let last_bot = self.bottom_mlp.len() - 1;
        if self.interaction == InteractionKind::Dot
            && self.bottom_mlp[last_bot] != self.embedding_dim
        {
            return bad(
                format!("bottom_mlp[{last_bot}]"),
                format!(
                    "the bottom MLP's output width must equal embedding_dim {} for interaction \
                     \"dot\", got {}",
                    self.embedding_dim, self.bottom_mlp[last_bot]
                ),
            );
        }
        if self.interaction == InteractionKind::Cat && self.interaction_itself {
            return bad(
                "interaction_itself".into(),
                "applies only to interaction \"dot\"; remove it or set it to false".into(),
            );
        }
        if let Some(c) = self.cross {
            positive("dcn_layers".into(), c.layers)?;
            positive("dcn_low_rank".into(), c.low_rank)?;
            if c.layers > MAX_DCN_LAYERS {
                return bad(
                    "dcn_layers".into(),
                    format!("{} cross layers is more than {MAX_DCN_LAYERS}", c.layers),
                );
            }
        }
        if self.top_mlp.is_empty() {
            return bad(
                "top_mlp".into(),
                "must list at least the output layer (width 1)".into(),
            );
        }
        for (i, &w) in self.top_mlp.iter().enumerate() {
            positive(format!("top_mlp[{i}]"), w)?;
        }
        let last_top = self.top_mlp.len() - 1;
        if self.top_mlp[last_top] != 1 {
            return bad(
                format!("top_mlp[{last_top}]"),
                format!(
                    "the last layer gives the click probability and must have width 1, got {}",
                    self.top_mlp[last_top]
                ),
            );
        }
        Ok(())
    }

    /// The batch, the learning rate, the optimizer's hyper-parameters and the
    /// parameter count.
    fn validate_training(&self, origin: &str) -> Result<()> {
        let bad = |field: String, reason: String| Err(invalid(origin, field, reason));
        positive(origin, "batch_size".into(), self.batch_size)?;
        if !(self.learning_rate.is_finite() && self.learning_rate > 0.0) {
            return bad(
                "learning_rate".into(),
                format!(
                    "must be a finite number > 0 (as f32), got {}",
                    self.learning_rate
                ),
            );
        }
        if let Optimizer::Adagrad(a) | Optimizer::RowwiseAdagrad(a) = self.optimizer {
            if !(a.eps.is_finite() && a.eps > 0.0) {
                return bad(
                    "eps".into(),
                    format!("must be a finite number > 0 (as f32), got {}", a.eps),
                );
            }
            for (field, v) in [
                ("initial_accumulator_value", a.initial_accumulator_value),
                ("weight_decay", a.weight_decay),
            ] {
                if !(v.is_finite() && v >= 0.0) {
                    return bad(
                        field.into(),
                        format!("must be a finite number >= 0 (as f32), got {v}"),
                    );
                }
            }
        }
        if self.checked_param_count().is_none() {
            return bad(
                "table_rows".into(),
                "the model's parameter count overflows 64 bits".into(),
            );
        }
        Ok(())
    }

    /// Number of embedding tables.
    pub fn num_tables(&self) -> usize {
        self.table_rows.len()
    }

    /// Width of the interaction's output, the top MLP's input.
    pub fn top_input_width(&self) -> usize {
        let bot_out = self.bottom_mlp.last().copied().unwrap_or(0);
        let mut widths = vec![bot_out];
        widths.extend(std::iter::repeat_n(self.embedding_dim, self.num_tables()));
        dlrm_ir::interaction_width(self.interaction, self.interaction_itself, &widths)
    }

    /// Total number of parameter elements (tables and MLPs), or `None` on overflow.
    pub(crate) fn checked_param_count(&self) -> Option<u64> {
        let mut n = 0u64;
        for &rows in &self.table_rows {
            n = n.checked_add((rows as u64).checked_mul(self.embedding_dim as u64)?)?;
        }
        for (fan_in, fan_out) in self.layers() {
            let w = (fan_in as u64).checked_mul(fan_out as u64)?;
            n = n.checked_add(w)?.checked_add(fan_out as u64)?;
        }
        if let Some(c) = self.cross {
            // v[R,W], u[W,R], b[W] per layer.
            let w = self.top_input_width() as u64;
            let layer = w.checked_mul(2 * c.low_rank as u64)?.checked_add(w)?;
            n = n.checked_add(layer.checked_mul(c.layers as u64)?)?;
        }
        Some(n)
    }

    /// Total number of parameter elements (tables and MLPs) of a validated spec.
    pub fn param_count(&self) -> u64 {
        self.checked_param_count().unwrap_or(u64::MAX)
    }

    /// Every linear layer as `(fan_in, fan_out)`: bottom layers, then top layers.
    pub(crate) fn layers(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let bot = self.bottom_mlp.windows(2).map(|w| (w[0], w[1]));
        let top_in = std::iter::once(self.top_input_width()).chain(self.top_mlp.iter().copied());
        let top = top_in.zip(self.top_mlp.iter().copied());
        bot.chain(top)
    }
}
