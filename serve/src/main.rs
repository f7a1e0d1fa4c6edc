//! `dlrm-serve PLAN|CHECKPOINT --port N`: the model behind the Open Inference
//! Protocol (KServe v2) over HTTP (see the crate docs).

use anyhow::{Context, Result};
use clap::Parser;
use dlrm_serve::{DEFAULT_MAX_BODY, Served, router};
use std::path::PathBuf;
use std::sync::Arc;

/// Serves a dlrmc plan or checkpoint over the Open Inference Protocol (KServe v2,
/// HTTP/REST): `GET /v2/health/ready`, `GET /v2/models/NAME`,
/// `POST /v2/models/NAME/infer`.
#[derive(Parser, Debug)]
#[command(name = "dlrm-serve", version)]
struct Cli {
    /// A plan directory (`dlrmc compile`) or a checkpoint (`dlrm-run --checkpoint`).
    plan: PathBuf,
    /// The port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The model's name in the URLs (default: the plan's).
    #[arg(long)]
    model_name: Option<String>,
    /// The largest request body accepted, in bytes (a larger one is answered 413).
    #[arg(long, default_value_t = DEFAULT_MAX_BODY)]
    max_body_bytes: usize,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let session = dlrm_runtime::Session::open(&cli.plan)
        .with_context(|| format!("loading {}", cli.plan.display()))?;
    let name = cli
        .model_name
        .clone()
        .unwrap_or_else(|| session.name().to_string());
    let served = Arc::new(Served::new(name.clone(), session));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((cli.host.as_str(), cli.port))
            .await
            .with_context(|| format!("listening on {}:{}", cli.host, cli.port))?;
        let addr = listener.local_addr()?;
        eprintln!("dlrm-serve: model `{name}` at http://{addr}/v2/models/{name}");
        axum::serve(listener, router(served, cli.max_body_bytes))
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
        Ok(())
    })
}
