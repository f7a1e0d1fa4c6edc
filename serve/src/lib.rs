//! dlrm-serve: a dlrmc plan (or checkpoint) behind the Open Inference Protocol
//! (KServe v2) over HTTP, as Triton, KServe, MLServer and TorchServe speak it, so
//! their clients (`tritonclient`, `perf_analyzer`) drive it unchanged.
//!
//! Endpoints: `GET /v2` (server metadata), `GET /v2/health/live`,
//! `GET /v2/health/ready`, `GET /v2/models/{name}` (model metadata: inputs and
//! outputs in the model's own names, datatypes, shapes with -1 for the batch and
//! bag axes), `GET /v2/models/{name}/ready`, `POST /v2/models/{name}/infer`
//! (JSON tensors, [`protocol`], and the binary tensor extension, [`binary`]),
//! `GET /metrics` (Prometheus text, [`metrics`]). The model is loaded once
//! ([`dlrm_runtime::Session`]); a request's inputs in the model's own layout are
//! turned into the graph's inputs and checked on arrival, then queued, merged
//! with others into batches and run on a pool of executors sharing one copy of
//! the parameters ([`batch`], [`merge`]). A request may carry a deadline (its
//! `timeout` parameter in microseconds, else the server's default); one still
//! queued at its deadline is answered `504` without being computed. A full queue
//! answers `503`.
//!
//! A bad request (malformed JSON or binary data, an unknown or missing input, a
//! wrong datatype or shape, an id out of range, NaN) is answered `400` with
//! `{"error": ...}` naming the input; a body over the limit `413`; an unknown
//! model `404`. The server never panics on a request and keeps serving the
//! others.
//!
//! With a watched checkpoint directory ([`watch`]), a newer complete checkpoint
//! is loaded beside the model serving and swapped in whole ([`Served::swap`]):
//! each request is answered by one version, none fails for the swap.
//!
//! Not yet (issue 44): gRPC, int8 tables.

#![warn(missing_docs)]

pub mod batch;
pub mod binary;
pub mod merge;
pub mod metrics;
pub mod protocol;
pub mod watch;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use batch::{BatchOptions, Batcher, status_of};
use dlrm_runtime::Session;
use merge::Layout;
use metrics::{Metrics, Outcome};
use protocol::{InferRequest, TensorMetadata, metadata_of};
use serde_json::json;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// The default limit on a request body.
pub const DEFAULT_MAX_BODY: usize = 64 << 20;

/// How a model is served.
#[derive(Clone, Copy, Debug)]
pub struct ServeOptions {
    /// Batching, the queue and the executors.
    pub batch: BatchOptions,
    /// The deadline of a request that gives none (`None`: no deadline).
    pub deadline: Option<Duration>,
}

impl Default for ServeOptions {
    fn default() -> ServeOptions {
        ServeOptions {
            batch: BatchOptions {
                max_batch: 512,
                max_delay: Duration::from_micros(500),
                max_queue: 1024,
                instances: 1,
                warm_up: true,
            },
            deadline: None,
        }
    }
}

/// One loaded version of the model: its session, metadata and executors.
/// Requests hold it (an `Arc`) until answered, so a version swapped out is
/// released, its executors stopped, when its last request is answered.
pub struct Model {
    /// Turns requests into graph inputs (the executors run forks of it).
    session: Session,
    inputs: Vec<TensorMetadata>,
    outputs: Vec<TensorMetadata>,
    batcher: Batcher,
    /// Why requests run one at a time, if they do.
    unmerged: Option<String>,
    /// The checkpoint step it was loaded from (`None`: a plan).
    step: Option<u64>,
}

impl Model {
    fn start(
        session: Session,
        step: Option<u64>,
        opts: BatchOptions,
        metrics: &Arc<Metrics>,
    ) -> Result<Model, dlrm_runtime::RuntimeError> {
        let meta = |v: Vec<dlrm_ir::contract::ModelInput>| {
            v.iter().map(|m| metadata_of(&m.name, &m.ty)).collect()
        };
        let layout = Layout::of(session.graph());
        let unmerged = layout.as_ref().err().cloned();
        let batcher = Batcher::start(&session, layout.ok(), opts, Arc::clone(metrics))?;
        Ok(Model {
            inputs: meta(session.model_inputs()),
            outputs: meta(session.model_outputs()),
            session,
            batcher,
            unmerged,
            step,
        })
    }

    /// The version clients see: the checkpoint's step, "1" for a plan.
    pub fn version(&self) -> String {
        self.step.map_or_else(|| "1".to_string(), |s| s.to_string())
    }
}

/// The model a server serves: the current [`Model`], replaced whole by
/// [`Served::swap`].
pub struct Served {
    name: String,
    model: RwLock<Arc<Model>>,
    metrics: Arc<Metrics>,
    opts: ServeOptions,
}

impl Served {
    /// Serves `session` under `name`, starting its executors; `step`: the
    /// checkpoint step it was loaded from (`None`: a plan).
    pub fn new(
        name: String,
        session: Session,
        step: Option<u64>,
        opts: ServeOptions,
    ) -> Result<Served, dlrm_runtime::RuntimeError> {
        let metrics = Arc::new(Metrics::default());
        metrics.set_version(step.unwrap_or(0));
        let model = Model::start(session, step, opts.batch, &metrics)?;
        Ok(Served {
            name,
            model: RwLock::new(Arc::new(model)),
            metrics,
            opts,
        })
    }

    /// The model serving now.
    pub fn current(&self) -> Arc<Model> {
        Arc::clone(&self.model.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// The server's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Why requests are not merged into batches (`None`: they are).
    pub fn unmerged(&self) -> Option<String> {
        self.current().unmerged.clone()
    }

    /// Starts `session` (checkpoint step `step`) beside the model serving, waits
    /// for its warm-up (at most `warm_limit`), then makes it the one new requests
    /// go to. Requests already queued on the old model are answered by it; the
    /// old model is released after the last of them.
    pub fn swap(
        &self,
        session: Session,
        step: Option<u64>,
        warm_limit: Duration,
    ) -> Result<(), dlrm_runtime::RuntimeError> {
        let model = Model::start(session, step, self.opts.batch, &self.metrics)?;
        let start = Instant::now();
        while !model.batcher.is_warm() && start.elapsed() < warm_limit {
            std::thread::sleep(Duration::from_millis(2));
        }
        let old = {
            let mut m = self.model.write().unwrap_or_else(|p| p.into_inner());
            std::mem::replace(&mut *m, Arc::new(model))
        };
        self.metrics.loaded(step.unwrap_or(0));
        drop(old);
        Ok(())
    }
}

/// A JSON error answer.
fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, axum::Json(json!({ "error": msg.into() }))).into_response()
}

/// The router of a server of `model`, refusing bodies over `max_body` bytes.
pub fn router(model: Arc<Served>, max_body: usize) -> Router {
    Router::new()
        .route("/v2", get(server_metadata))
        .route("/v2/health/live", get(|| async { StatusCode::OK }))
        .route("/v2/health/ready", get(server_ready))
        .route("/v2/models/{name}", get(model_metadata))
        .route("/v2/models/{name}/ready", get(model_ready))
        .route(
            "/v2/models/{name}/infer",
            post(infer).layer(from_fn_with_state(Arc::clone(&model), track)),
        )
        .route("/metrics", get(metrics_text))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(model)
}

async fn server_metadata() -> Response {
    axum::Json(json!({
        "name": "dlrm-serve",
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": ["binary_tensor_data"],
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
    let model = m.current();
    axum::Json(json!({
        "name": m.name,
        "versions": [model.version()],
        "platform": "dlrmc",
        "inputs": model.inputs,
        "outputs": model.outputs,
    }))
    .into_response()
}

/// 200 once the model serving has compiled the kernels of every padded batch
/// size (at once with `--no-warm-up`), 503 before: requests are served
/// meanwhile, but slower.
fn readiness(m: &Served) -> Response {
    if m.current().batcher.is_warm() {
        StatusCode::OK.into_response()
    } else {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            "warming up: compiling the kernels of the padded batch sizes",
        )
    }
}

async fn server_ready(State(m): State<Arc<Served>>) -> Response {
    readiness(&m)
}

async fn model_ready(State(m): State<Arc<Served>>, Path(name): Path<String>) -> Response {
    not_served(&m, &name).unwrap_or_else(|| readiness(&m))
}

/// Counts an inference request's outcome and latency.
async fn track(State(m): State<Arc<Served>>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let r = next.run(req).await;
    m.metrics
        .request(Outcome::of_status(r.status().as_u16()), start.elapsed());
    r
}

async fn metrics_text(State(m): State<Arc<Served>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        m.metrics.render(),
    )
        .into_response()
}

/// The request's deadline: its `timeout` parameter (microseconds; 0: none),
/// else the server's default.
fn deadline_of(
    req: &InferRequest,
    default: Option<Duration>,
    now: Instant,
) -> Result<Option<Instant>, String> {
    let d = match req.parameters.get("timeout") {
        None => default,
        Some(v) => match v.as_u64() {
            Some(0) => None,
            Some(us) => Some(Duration::from_micros(us)),
            None => {
                return Err(format!(
                    "parameter `timeout` is {v}, not a whole number of microseconds"
                ));
            }
        },
    };
    Ok(d.and_then(|d| now.checked_add(d)))
}

async fn infer(
    State(m): State<Arc<Served>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let now = Instant::now();
    if let Some(r) = not_served(&m, &name) {
        return r;
    }
    // Too large (413) or cut short: answered in JSON as every other error.
    let body = match body {
        Ok(b) => b,
        Err(e) => return error(e.status(), format!("request body: {}", e.body_text())),
    };
    // Held until answered: a swap meanwhile does not release this version.
    let model = m.current();
    let json_len = match headers.get(binary::HEADER).map(|v| v.to_str()) {
        None => None,
        Some(Ok(v)) if v.trim().parse::<usize>().is_ok() => v.trim().parse().ok(),
        Some(v) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("header Inference-Header-Content-Length is {v:?}, not a byte count"),
            );
        }
    };
    let (req, inputs) = match binary::parse(&body, json_len) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    for o in &req.outputs {
        if !model.outputs.iter().any(|x| x.name == o.name) {
            return error(
                StatusCode::BAD_REQUEST,
                format!("the model has no output `{}`", o.name),
            );
        }
    }
    let deadline = match deadline_of(&req, m.opts.deadline, now) {
        Ok(d) => d,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let given = match model.session.graph_inputs(inputs) {
        Ok(g) => g,
        Err(e) => return error(code(status_of(&e)), e.to_string()),
    };
    let rx = match model.batcher.submit(given, deadline) {
        Ok(rx) => rx,
        Err(reason) => return error(StatusCode::SERVICE_UNAVAILABLE, reason),
    };
    let outputs = match rx.await {
        Ok(Ok(o)) => o,
        Ok(Err((status, msg))) => return error(code(status), msg),
        Err(_) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the executor stopped before answering this request",
            );
        }
    };
    let (body, json_len) = binary::respond(&req, &m.name, &model.version(), &outputs);
    match json_len {
        None => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Some(n) => (
            [
                (header::CONTENT_TYPE, "application/octet-stream".to_string()),
                (
                    header::HeaderName::from_static(binary::HEADER),
                    n.to_string(),
                ),
            ],
            body,
        )
            .into_response(),
    }
}

fn code(status: u16) -> StatusCode {
    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

#[cfg(test)]
mod tests {
    #![expect(clippy::unwrap_used, reason = "tests fail loudly")]
    use super::*;
    use serde_json::Value;

    #[test]
    fn deadlines_from_the_request_or_the_default() {
        let now = Instant::now();
        let req = |p: Value| -> InferRequest {
            serde_json::from_value(json!({"inputs": [], "parameters": p})).unwrap()
        };
        let five = Duration::from_millis(5);
        let ms = Some(five);
        assert_eq!(
            deadline_of(&req(json!({"timeout": 100})), ms, now).unwrap(),
            Some(now + Duration::from_micros(100))
        );
        assert_eq!(
            deadline_of(&req(json!({})), ms, now).unwrap(),
            Some(now + five)
        );
        assert_eq!(
            deadline_of(&req(json!({"timeout": 0})), ms, now).unwrap(),
            None
        );
        let e = deadline_of(&req(json!({"timeout": "soon"})), ms, now).unwrap_err();
        assert!(e.contains("parameter `timeout` is \"soon\""), "{e}");
    }
}
