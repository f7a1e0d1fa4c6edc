//! Model files: the frontend is chosen by the file's extension.
//!
//! `.json` is a dlrmc model description (`dlrm_json`), `.onnx` an ONNX model
//! (`dlrm_onnx`). Either becomes a [`Model`]: the forward graph for one device, its
//! initial parameters in graph order, and the training defaults that the plan
//! records (overridable on the command line).

use crate::error::{Error, Result};
use dlrm_ir::{Graph, Tensor};
use dlrm_runtime::plan::Training;
use std::path::Path;

/// A model ready to compile.
#[derive(Clone, Debug)]
pub struct Model {
    /// The forward graph; its outputs are the predictions.
    pub graph: Graph,
    /// Initial value of every parameter, in the graph's parameter order.
    pub params: Vec<(String, Tensor)>,
    /// Training defaults (loss, optimizer, learning rate, batch size, seed).
    pub training: Training,
    /// A few human-readable lines describing the model.
    pub summary: String,
    /// Why this model can only be compiled for inference, if it can.
    pub infer_only: Option<String>,
}

/// Overrides of a model description's training setup.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Overrides {
    /// Learning rate.
    pub learning_rate: Option<f32>,
    /// Global batch size.
    pub batch_size: Option<usize>,
    /// Seed of the parameter initialisation and of the synthetic data.
    pub seed: Option<u64>,
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
    let mut spec = dlrm_json::ModelSpec::load(path)?;
    if let Some(lr) = o.learning_rate {
        spec.learning_rate = lr;
    }
    if let Some(b) = o.batch_size {
        spec.batch_size = b;
    }
    if let Some(s) = o.seed {
        spec.seed = s;
    }
    spec.validate(&format!("{} (with command-line overrides)", path.display()))?;
    let m = spec.build()?;
    let t = m.training;
    let summary = m.summary();
    Ok(Model {
        graph: m.graph,
        params: m.params,
        training: Training {
            loss: match t.loss {
                dlrm_json::Loss::Bce => "bce",
                dlrm_json::Loss::Mse => "mse",
            }
            .to_string(),
            optimizer: match t.optimizer {
                dlrm_json::Optimizer::Sgd => "sgd",
            }
            .to_string(),
            learning_rate: t.learning_rate,
            batch_size: t.batch_size,
            seed: t.seed,
        },
        summary,
        infer_only: None,
    })
}

/// Batch size of an ONNX model's plan unless `--batch-size` says otherwise (ONNX
/// files carry no training setup).
pub const ONNX_DEFAULT_BATCH: usize = 128;

fn load_onnx(path: &Path, o: Overrides) -> Result<Model> {
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
    Ok(Model {
        graph: m.graph,
        params: m.params,
        training: Training {
            loss: "bce".to_string(),
            optimizer: "sgd".to_string(),
            learning_rate: o.learning_rate.unwrap_or(0.1),
            batch_size: o.batch_size.unwrap_or(ONNX_DEFAULT_BATCH),
            seed: o.seed.unwrap_or(1),
        },
        summary,
        infer_only: Some(
            "training from ONNX models is not supported yet (the generic ops have no \
             gradients until canonicalisation lands)"
                .to_string(),
        ),
    })
}
