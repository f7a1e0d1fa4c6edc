//! dlrm-serve: a dlrmc plan (or checkpoint) behind the Open Inference Protocol
//! (KServe v2) over HTTP/REST, as Triton, KServe, MLServer and TorchServe speak
//! it, so their clients (`tritonclient`, `perf_analyzer`) drive it unchanged.
//!
//! Endpoints: `GET /v2` (server metadata), `GET /v2/health/live`,
//! `GET /v2/health/ready`, `GET /v2/models/{name}` (model metadata: inputs and
//! outputs in the model's own names, datatypes, shapes with -1 for the batch and
//! bag axes), `GET /v2/models/{name}/ready`, `POST /v2/models/{name}/infer`
//! (JSON tensors, [`protocol`]). The model runs on a [`dlrm_runtime::Session`]
//! (loaded once; inputs in the model's own layout, its input contract computing
//! the rest); requests run one at a time on it, off the I/O threads.
//!
//! A bad request (malformed JSON, an unknown or missing input, a wrong datatype
//! or shape, an id out of range, NaN) is answered `400` with `{"error": ...}`
//! naming the input; a body over the limit `413`; an unknown model `404`. The
//! server never panics on a request and keeps serving the others.
//!
//! Not yet (issue 44): dynamic batching across requests, several executors over
//! one copy of the parameters, the binary tensor extension, gRPC, model reload,
//! `/metrics`, int8 tables.

#![warn(missing_docs)]

pub mod protocol;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use dlrm_runtime::{RuntimeError, Session};
use protocol::{InferRequest, InferResponse, TensorMetadata, from_tensor, metadata_of, to_tensor};
use serde_json::json;
use std::sync::{Arc, Mutex};

/// The default limit on a request body.
pub const DEFAULT_MAX_BODY: usize = 64 << 20;

/// The model a server serves.
pub struct Served {
    name: String,
    session: Mutex<Session>,
    inputs: Vec<TensorMetadata>,
    outputs: Vec<TensorMetadata>,
}

impl Served {
    /// Serves `session` under `name`.
    pub fn new(name: String, session: Session) -> Served {
        let meta = |v: Vec<dlrm_ir::contract::ModelInput>| {
            v.iter().map(|m| metadata_of(&m.name, &m.ty)).collect()
        };
        Served {
            inputs: meta(session.model_inputs()),
            outputs: meta(session.model_outputs()),
            name,
            session: Mutex::new(session),
        }
    }
}

/// A JSON error answer.
fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, axum::Json(json!({ "error": msg.into() }))).into_response()
}

/// The HTTP status of a failed inference: the request's fault or the server's.
fn status_of(e: &RuntimeError) -> StatusCode {
    match e {
        RuntimeError::Data { .. }
        | RuntimeError::Input { .. }
        | RuntimeError::NonFinite { .. }
        | RuntimeError::Node { .. }
        | RuntimeError::Ir(_) => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The router of a server of `model`, refusing bodies over `max_body` bytes.
pub fn router(model: Arc<Served>, max_body: usize) -> Router {
    Router::new()
        .route("/v2", get(server_metadata))
        .route("/v2/health/live", get(|| async { StatusCode::OK }))
        .route("/v2/health/ready", get(|| async { StatusCode::OK }))
        .route("/v2/models/{name}", get(model_metadata))
        .route("/v2/models/{name}/ready", get(model_ready))
        .route("/v2/models/{name}/infer", post(infer))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(model)
}

async fn server_metadata() -> Response {
    axum::Json(json!({
        "name": "dlrm-serve",
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": [],
    }))
    .into_response()
}

/// A 404 naming the model served, unless `name` is it.
fn not_served(m: &Served, name: &str) -> Option<Response> {
    (name != m.name).then(|| {
        error(
            StatusCode::NOT_FOUND,
            format!("no model `{name}` (this server serves `{}`)", m.name),
        )
    })
}

async fn model_metadata(State(m): State<Arc<Served>>, Path(name): Path<String>) -> Response {
    if let Some(r) = not_served(&m, &name) {
        return r;
    }
    axum::Json(json!({
        "name": m.name,
        "versions": ["1"],
        "platform": "dlrmc",
        "inputs": m.inputs,
        "outputs": m.outputs,
    }))
    .into_response()
}

async fn model_ready(State(m): State<Arc<Served>>, Path(name): Path<String>) -> Response {
    not_served(&m, &name).unwrap_or_else(|| StatusCode::OK.into_response())
}

async fn infer(State(m): State<Arc<Served>>, Path(name): Path<String>, body: Bytes) -> Response {
    if let Some(r) = not_served(&m, &name) {
        return r;
    }
    let req: InferRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("malformed request: {e}")),
    };
    let mut inputs = Vec::with_capacity(req.inputs.len());
    for t in &req.inputs {
        match to_tensor(t) {
            Ok(x) => inputs.push((t.name.clone(), x)),
            Err(e) => return error(StatusCode::BAD_REQUEST, e),
        }
    }
    for o in &req.outputs {
        if !m.outputs.iter().any(|x| x.name == o.name) {
            return error(
                StatusCode::BAD_REQUEST,
                format!("the model has no output `{}`", o.name),
            );
        }
    }
    let model = Arc::clone(&m);
    let ran = tokio::task::spawn_blocking(move || {
        let mut s = model.session.lock().map_err(|_| {
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the model is unusable after an earlier failure".to_string(),
            )
        })?;
        s.infer(inputs).map_err(|e| (status_of(&e), e.to_string()))
    })
    .await;
    let outputs = match ran {
        Ok(Ok(o)) => o,
        Ok(Err((status, msg))) => return error(status, msg),
        Err(e) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("inference failed: {e}"),
            );
        }
    };
    let wanted = |n: &str| req.outputs.is_empty() || req.outputs.iter().any(|o| o.name == n);
    let outputs = outputs
        .iter()
        .filter(|(n, _)| wanted(n))
        .map(|(n, t)| from_tensor(n, t))
        .collect();
    axum::Json(InferResponse {
        model_name: m.name.clone(),
        id: req.id,
        outputs,
    })
    .into_response()
}
