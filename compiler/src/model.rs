//! Model files: the frontend is chosen by the file's extension.
//!
//! `.json` is a dlrmc model description (`dlrm_json`), `.onnx` an ONNX model
//! (`dlrm_onnx`). Either becomes a [`Model`]: the forward graph for one device, its
//! initial parameters in graph order, and the training defaults that the plan
//! records (overridable on the command line). A JSON model's tables are described,
//! not created ([`dlrm_json::ModelSpec::initial_values`]); an ONNX model's
//! initializers are data and stored.
//!
//! An ONNX model trains like a JSON one: its parameters are the initializers, the
//! `canon` pass turns its generic ops into DLRM ops before autodiff adds the loss
//! (`bce`, SGD; `--lr`, `--batch-size`, `--optimizer` override the defaults). `--label NAME`
//! names a graph input of the model as the label: it leaves the forward graph and
//! becomes the training graph's label input (without it, the label input is
//! `label`, which the synthetic data fills from its teacher).

use crate::error::{Error, Result};
use dlrm_ir::{Graph, IrError, ParamValue, ValueId};
use dlrm_runtime::plan::Training;
use std::path::Path;

/// A model ready to compile.
#[derive(Clone, Debug)]
pub struct Model {
    /// The forward graph; its outputs are the predictions.
    pub graph: Graph,
    /// Initial value of every parameter (stored or described), in the graph's
    /// parameter order.
    pub params: Vec<(String, ParamValue)>,
    /// Training defaults (loss, optimizer, learning rate, batch size, seed).
    pub training: Training,
    /// The optimizer with its hyper-parameters (`training.optimizer` is its name).
    pub optimizer: dlrm_passes::Optimizer,
    /// A few human-readable lines describing the model.
    pub summary: String,
    /// Why this model can only be compiled for inference, if it can.
    pub infer_only: Option<String>,
    /// The name of the training graph's label input (`None`: `label`).
    pub label: Option<String>,
}

/// Overrides of a model description's training setup.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Overrides {
    /// Learning rate.
    pub learning_rate: Option<f32>,
    /// Optimizer by name (`sgd`, `adagrad`, `rowwise_adagrad`), with Adagrad's
    /// default hyper-parameters unless the description gives them.
    pub optimizer: Option<String>,
    /// Global batch size.
    pub batch_size: Option<usize>,
    /// Seed of the parameter initialisation and of the synthetic data.
    pub seed: Option<u64>,
    /// A graph input of the model that is the label (ONNX models only).
    pub label: Option<String>,
    /// Each table's rows, from a dataset (`dlrmc compile --data`; JSON
    /// descriptions only): they replace the description's `table_rows`.
    pub table_rows: Option<TableRows>,
    /// Describe (instead of storing) MLP parameters of more than this many bytes
    /// (JSON descriptions; `None`: [`dlrm_json::DESCRIBE_ABOVE`]). Tables are
    /// always described.
    pub describe_above: Option<u64>,
}

/// Table sizes taken from a dataset's manifest ([`table_rows_of`]).
#[derive(Clone, Debug, PartialEq)]
pub struct TableRows {
    /// The dataset (for messages).
    pub source: String,
    /// Rows per table, in column order.
    pub rows: Vec<usize>,
}

/// The row count of every table of the `.ds` dataset at `path` (from its
/// manifest; the data is not read).
pub fn table_rows_of(path: &Path) -> Result<TableRows> {
    let ds = dlrm_data::Dataset::open(path).map_err(dlrm_runtime::RuntimeError::from)?;
    let rows = ds
        .manifest()
        .tables
        .iter()
        .map(|t| {
            usize::try_from(t.rows).map_err(|_| {
                Error::Options(format!(
                    "dataset {}: table `{}` has {} rows, more than this machine can index",
                    path.display(),
                    t.name,
                    t.rows
                ))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(TableRows {
        source: path.display().to_string(),
        rows,
    })
}

/// Reads the model at `path`, choosing the frontend by extension, and applies
/// `overrides` (validated like the description's own fields).
pub fn load_model(path: &Path, overrides: Overrides) -> Result<Model> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    match ext.to_ascii_lowercase().as_str() {
        "json" => load_json(path, overrides),
        "onnx" => load_onnx(path, overrides),
        _ => Err(Error::UnknownFormat {
            path: path.to_path_buf(),
        }),
    }
}

fn load_json(path: &Path, o: Overrides) -> Result<Model> {
    if let Some(l) = &o.label {
        return Err(Error::Options(format!(
            "--label {l}: a JSON description has no label input to name (its label is \
             the synthetic data's); --label applies to ONNX models"
        )));
    }
    let mut spec = dlrm_json::ModelSpec::load(path)?;
    let mut note = None;
    if let Some(t) = &o.table_rows {
        if t.rows.len() != spec.table_rows.len() {
            return Err(Error::Options(format!(
                "--data {}: the dataset has {} tables, {} describes {}",
                t.source,
                t.rows.len(),
                path.display(),
                spec.table_rows.len()
            )));
        }
        if t.rows != spec.table_rows {
            let differ = t
                .rows
                .iter()
                .zip(&spec.table_rows)
                .filter(|(a, b)| a != b)
                .count();
            note = Some(format!(
                "note: table rows from the dataset {} ({differ} of {} differ from the description's table_rows; the data's win)",
                t.source,
                t.rows.len()
            ));
        }
        spec.table_rows = t.rows.clone();
    }
    if let Some(lr) = o.learning_rate {
        spec.learning_rate = lr;
    }
    if let Some(b) = o.batch_size {
        spec.batch_size = b;
    }
    if let Some(s) = o.seed {
        spec.seed = s;
    }
    if let Some(name) = &o.optimizer {
        let given = match spec.optimizer {
            dlrm_json::Optimizer::Adagrad(a) | dlrm_json::Optimizer::RowwiseAdagrad(a) => a,
            dlrm_json::Optimizer::Sgd => dlrm_json::Adagrad::default(),
        };
        spec.optimizer = match optimizer_by_name(name)? {
            dlrm_json::Optimizer::Adagrad(_) => dlrm_json::Optimizer::Adagrad(given),
            dlrm_json::Optimizer::RowwiseAdagrad(_) => dlrm_json::Optimizer::RowwiseAdagrad(given),
            dlrm_json::Optimizer::Sgd => dlrm_json::Optimizer::Sgd,
        };
    }
    spec.validate(&format!("{} (with command-line overrides)", path.display()))?;
    let graph = spec.graph()?;
    let params =
        spec.initial_values_describing(o.describe_above.unwrap_or(dlrm_json::DESCRIBE_ABOVE))?;
    let t = spec.training();
    let mut summary = spec.summary();
    if let Some(n) = note {
        summary = format!("{}\n{n}", summary.trim_end());
    }
    Ok(Model {
        graph,
        params,
        training: Training {
            loss: match t.loss {
                dlrm_json::Loss::Bce => "bce",
                dlrm_json::Loss::Mse => "mse",
            }
            .to_string(),
            optimizer: t.optimizer.name().to_string(),
            learning_rate: t.learning_rate,
            batch_size: t.batch_size,
            seed: t.seed,
        },
        optimizer: passes_optimizer(t.optimizer),
        summary,
        infer_only: None,
        label: None,
    })
}

/// Batch size of an ONNX model's plan unless `--batch-size` says otherwise (ONNX
/// files carry no training setup).
pub const ONNX_DEFAULT_BATCH: usize = 128;

fn load_onnx(path: &Path, o: Overrides) -> Result<Model> {
    if let Some(t) = &o.table_rows {
        return Err(Error::Options(format!(
            "--data {}: table sizes from a dataset apply to JSON descriptions; an ONNX \
             model's tables are its initializers",
            t.source
        )));
    }
    let m = dlrm_onnx::load(path)?;
    let summary = format!(
        "ONNX model `{}` (opset {}, producer `{}`): inputs {}; outputs {}; {} nodes, {} parameters",
        m.graph.name,
        m.opset,
        m.producer.trim(),
        m.inputs.join(", "),
        m.outputs.join(", "),
        m.graph.nodes().len(),
        m.params.len(),
    );
    let optimizer = match &o.optimizer {
        Some(name) => optimizer_by_name(name)?,
        None => dlrm_json::Optimizer::Sgd,
    };
    let (graph, label) = match &o.label {
        Some(name) => (
            without_label(&m.graph, name, path)?,
            Some(dlrm_onnx::ir_name(name)),
        ),
        None => (m.graph, None),
    };
    Ok(Model {
        graph,
        params: m
            .params
            .into_iter()
            .map(|(n, t)| (n, ParamValue::Stored(t)))
            .collect(),
        training: Training {
            loss: "bce".to_string(),
            optimizer: optimizer.name().to_string(),
            learning_rate: o.learning_rate.unwrap_or(0.1),
            batch_size: o.batch_size.unwrap_or(ONNX_DEFAULT_BATCH),
            seed: o.seed.unwrap_or(1),
        },
        optimizer: passes_optimizer(optimizer),
        summary,
        infer_only: None,
        label,
    })
}

/// The optimizer `--optimizer NAME` names, with Adagrad's default hyper-parameters.
fn optimizer_by_name(name: &str) -> Result<dlrm_json::Optimizer> {
    dlrm_json::Optimizer::from_name(name).ok_or_else(|| {
        Error::Options(format!(
            "--optimizer must be sgd, adagrad or rowwise_adagrad, got `{name}`"
        ))
    })
}

/// The description's optimizer as the autodiff pass takes it.
pub(crate) fn passes_optimizer(o: dlrm_json::Optimizer) -> dlrm_passes::Optimizer {
    let cfg = |a: dlrm_json::Adagrad| dlrm_passes::AdagradConfig {
        eps: a.eps,
        initial_accumulator_value: a.initial_accumulator_value,
        weight_decay: a.weight_decay,
    };
    match o {
        dlrm_json::Optimizer::Sgd => dlrm_passes::Optimizer::Sgd,
        dlrm_json::Optimizer::Adagrad(a) => dlrm_passes::Optimizer::Adagrad(cfg(a)),
        dlrm_json::Optimizer::RowwiseAdagrad(a) => dlrm_passes::Optimizer::RowwiseAdagrad(cfg(a)),
    }
}

/// `g` without its input `name` (the label, given by `--label`): it must be an
/// input that the outputs do not depend on, typed like the prediction.
fn without_label(g: &Graph, name: &str, path: &Path) -> Result<Graph> {
    let bad = |why: String| Error::Options(format!("--label {name} ({}): {why}", path.display()));
    let ir = dlrm_onnx::ir_name(name);
    let inputs: Vec<&str> = g.inputs().iter().map(|&v| g.name_of(v)).collect();
    let label = g
        .inputs()
        .iter()
        .copied()
        .find(|&v| g.name_of(v) == ir)
        .ok_or_else(|| {
            bad(format!(
                "the model has no such input (inputs: {})",
                inputs.join(", ")
            ))
        })?;
    if let Some(&pred) = g.outputs().first()
        && g.ty(pred) != g.ty(label)
    {
        return Err(bad(format!(
            "the label is {} but the prediction %{} is {}",
            g.ty(label),
            g.name_of(pred),
            g.ty(pred)
        )));
    }
    if let Some(n) = g.nodes().iter().position(|n| n.inputs.contains(&label)) {
        return Err(bad(format!(
            "node {} uses the label: a label input must not feed the prediction",
            g.node_label(n)
        )));
    }
    rebuild(g, Some(label), &|n| n.to_string()).map_err(|e| bad(e.to_string()))
}

/// A copy of `g` without the input `drop` (which nothing may use) and with every
/// value renamed by `rename`; verified.
pub(crate) fn rebuild(
    g: &Graph,
    drop: Option<ValueId>,
    rename: &dyn Fn(&str) -> String,
) -> std::result::Result<Graph, IrError> {
    let mut out = Graph::new(g.name.clone());
    let mut map: Vec<Option<ValueId>> = vec![None; g.values().len()];
    let name = |v: ValueId| rename(g.name_of(v));
    for &v in g.inputs().iter().filter(|&&v| Some(v) != drop) {
        map[v.index()] = Some(out.add_input(&name(v), g.ty(v).clone())?);
    }
    for &p in g.params() {
        map[p.index()] = Some(out.add_param(&name(p), g.ty(p).clone())?);
    }
    let get = |map: &[Option<ValueId>], v: ValueId| {
        map[v.index()].ok_or_else(|| IrError::Graph {
            graph: g.name.clone(),
            reason: format!("%{} is used before it is defined", g.name_of(v)),
        })
    };
    for node in g.nodes() {
        let ins = node
            .inputs
            .iter()
            .map(|&v| get(&map, v))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let results = node
            .outputs
            .iter()
            .map(|&o| (name(o), g.ty(o).clone()))
            .collect();
        let outs = out.push_node_unchecked(node.op.clone(), ins, results)?;
        for (&o, v) in node.outputs.iter().zip(outs) {
            map[o.index()] = Some(v);
        }
    }
    let outputs = g
        .outputs()
        .iter()
        .map(|&v| get(&map, v))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    out.set_outputs(outputs);
    for u in g.updates() {
        out.add_update(get(&map, u.param)?, get(&map, u.value)?)?;
    }
    dlrm_ir::verify(&out)?;
    Ok(out)
}
