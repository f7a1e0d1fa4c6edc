//! dlrm-json: dlrmc's JSON model description frontend.
//!
//! A description names a DLRM's shape and training setup in the spirit of the
//! reference DLRM's command-line arguments (`--arch-mlp-bot`, `--arch-mlp-top`,
//! `--arch-embedding-size`, ...). [`load`] or [`from_str`] parse it, validate it and
//! build a [`Model`]: the forward [`dlrm_ir::Graph`] for one device (its only output is
//! the click probability `prob` `f32[B, 1]`), the initial parameters (initialised as the
//! reference does, deterministically from `seed`) and the [`Training`] setup.
//!
//! ```json
//! {
//!   "name": "dlrm-small",
//!   "dense_features": 13,
//!   "embedding_dim": 64,
//!   "table_rows": [100000, 100000, 100000, 100000, 100000, 100000, 100000, 100000],
//!   "pooling": 1,
//!   "pooling_mode": "sum",
//!   "bottom_mlp": "13-512-256-64",
//!   "top_mlp": [512, 256, 1],
//!   "interaction": "dot",
//!   "interaction_itself": false,
//!   "loss": "bce",
//!   "batch_size": 2048,
//!   "optimizer": "sgd",
//!   "learning_rate": 0.1,
//!   "seed": 1
//! }
//! ```
//!
//! | field | type | default | meaning |
//! | --- | --- | --- | --- |
//! | `name` | string of `A-Z a-z 0-9 _ . -` | required | the model's and graph's name |
//! | `dense_features` | integer > 0 | required | width of the dense input |
//! | `embedding_dim` | integer > 0 | required | width of every embedding vector |
//! | `table_rows` | non-empty list of integers > 0 | required | rows of each table (`--arch-embedding-size`) |
//! | `pooling` | integer > 0, or a list with one per table | `1` | lookups per sample of each table |
//! | `pooling_mode` | `"sum"` or `"mean"` | `"sum"` | how a bag's rows are combined |
//! | `bags` | `"fixed"` or `"offsets"` | `"fixed"` | `fixed`: `idx.{t}` `i64[B, pooling_t]`; `offsets`: `idx.{t}` `i64[nnz_t]` with `off.{t}` `i64[B]` (PyTorch's `EmbeddingBag` offsets), bags of any size (then `pooling` is not given) |
//! | `interaction` (`"dcn"`) | with `dcn_layers` (default 3) and `dcn_low_rank` (required) | | DLRM-DCNv2's cross network over the concatenation, then the top MLP |
//! | `bottom_mlp` | widths, list or `"13-512-64"` string | required | bottom MLP **including** the input width (`--arch-mlp-bot`); the first must equal `dense_features`; with `dot` the last must equal `embedding_dim` |
//! | `top_mlp` | widths, list or string | required | top MLP **excluding** the input width, which the interaction gives (`--arch-mlp-top` without its first entry); the last must be 1 |
//! | `interaction` | `"dot"` or `"cat"` | `"dot"` | feature interaction (`--arch-interaction-op`) |
//! | `interaction_itself` | bool | `false` | keep the self terms `i == j` (`dot` only) |
//! | `loss` | `"bce"` or `"mse"` | `"bce"` | training loss |
//! | `batch_size` | integer > 0 | required | global mini-batch size |
//! | `optimizer` | `"sgd"`, `"adagrad"` or `"rowwise_adagrad"` | `"sgd"` | optimizer: `adagrad` is `torch.optim.Adagrad` (an accumulator per element; tables updated on their touched rows with the batch's gradient coalesced); `rowwise_adagrad` gives tables one accumulator per row (the reference's `RWSAdagrad`) and MLP weights plain Adagrad |
//! | `eps` | number, finite and > 0 as f32 | `1e-10` | Adagrad's `eps` (adagrad optimizers only) |
//! | `initial_accumulator_value` | number, finite and >= 0 | `0` | Adagrad's initial accumulator (adagrad optimizers only) |
//! | `weight_decay` | number, finite and >= 0 | `0` | L2 weight decay of the MLP weights (adagrad optimizers only; tables get none, as PyTorch refuses it with sparse gradients) |
//! | `learning_rate` | number, finite and > 0 as f32 | required | learning rate |
//! | `seed` | integer >= 0 | `1` | initialisation seed |
//!
//! Unknown fields, duplicate fields and unknown enum values are errors. Every error
//! ([`Error`]) names the file (or origin) and the field; JSON errors carry serde's
//! line and column.
//!
//! The forward graph (names fixed by the dlrmc contract):
//! - inputs: `dense` `f32[B, dense_features]`, then `idx.{t}` `i64[B, pooling_t]` per table;
//! - parameters, in this order: `emb.{t}` `f32[rows_t, embedding_dim]` per table, then
//!   `bot.{i}.w` `f32[out, in]` and `bot.{i}.b` `f32[out]` per bottom layer, then
//!   `top.{i}.w` and `top.{i}.b` per top layer;
//! - nodes: the bottom MLP, `linear {act=relu}` per layer (results `bot.{i}`, ReLU after
//!   the last layer too); one `embedding_bag {mode}` per table (results `bag.{t}`);
//!   `interaction {kind, self}` of (bottom output, bag.0, ..) (result `inter`); the top
//!   MLP, `linear {act=relu}` per layer (results `top.{i}`) except the last,
//!   `linear {act=sigmoid}` named `prob`;
//! - one output: `prob` `f32[B, 1]`.
//!
//! Parameter initialisation, as the reference DLRM: linear
//! `W ~ N(0, sqrt(2/(fan_in+fan_out)))`, `b ~ N(0, sqrt(1/fan_out))`, tables
//! `U(-sqrt(1/rows), sqrt(1/rows))`, filled in
//! parallel from per-chunk ChaCha8 streams so the values depend only on `seed`
//! ([`dlrm_ir::init`]). [`ModelSpec::initial_values`] gives them without creating the
//! tables: every table is a [`dlrm_ir::Described`] initializer (any of its rows can
//! be generated alone, with the same values), the MLP parameters are stored.

#![warn(missing_docs)]

mod build;
mod error;
mod spec;

pub use build::{DESCRIBE_ABOVE, Model, Training};
pub use error::{Error, Result};
pub use spec::{Adagrad, Bags, CrossNet, Loss, ModelSpec, Optimizer};

use std::path::Path;

/// Reads, validates and builds the model described by the JSON file at `path`.
pub fn load(path: impl AsRef<Path>) -> Result<Model> {
    ModelSpec::load(path)?.build()
}

/// Parses, validates and builds the model described by `src`; `origin` names the
/// source in errors (a path, or e.g. `<inline>`).
///
/// ```
/// let src = r#"{
///     "name": "toy", "dense_features": 4, "embedding_dim": 8,
///     "table_rows": [50, 30], "pooling": [1, 3],
///     "bottom_mlp": "4-16-8", "top_mlp": "16-1",
///     "batch_size": 32, "learning_rate": 0.1
/// }"#;
/// let model = dlrm_json::from_str(src, "<inline>")?;
/// let prob = model.graph.outputs()[0];
/// assert_eq!(model.graph.name_of(prob), "prob");
/// assert_eq!(model.graph.ty(prob).to_string(), "f32[B,1]");
/// assert_eq!(model.params[0].0, "emb.0");
///
/// let err = dlrm_json::from_str(&src.replace("\"16-1\"", "\"16-2\""), "<inline>")
///     .unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     "<inline>: field `top_mlp[1]`: the last layer gives the click probability and \
///      must have width 1, got 2"
/// );
/// # Ok::<(), dlrm_json::Error>(())
/// ```
pub fn from_str(src: &str, origin: &str) -> Result<Model> {
    ModelSpec::parse(src, origin)?.build()
}
