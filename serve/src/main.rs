//! `dlrm-serve PLAN|CHECKPOINT --port N`: the model behind the Open Inference
//! Protocol (KServe v2) over HTTP (see the crate docs).

use anyhow::{Context, Result};
use clap::Parser;
use dlrm_serve::batch::BatchOptions;
use dlrm_serve::{DEFAULT_MAX_BODY, ServeOptions, Served, router, watch};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// mimalloc, as `dlrm-run` uses: a batch's activations and every request's
/// tensors are allocated and freed again and again, and mimalloc's per-thread
/// free lists serve them without the system allocator's consolidation.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

// A function of the mimalloc library linked above (`mimalloc.h`).
unsafe extern "C" {
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
}

/// `mi_option_purge_delay` in the `mi_option_t` of the bundled mimalloc (as
/// `dlrm-run` sets it: `src/bin/dlrm-run.rs`).
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;

/// Keeps freed pages ten seconds (mimalloc's default: one) so that a batch's
/// activations reuse the last batch's pages, not fresh zeroed ones; an idle
/// server still returns them. Left alone when `MIMALLOC_PURGE_DELAY` is set.
fn keep_freed_pages_across_batches() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: a plain call into the allocator's option table (no pointers);
    // mimalloc's options may be set at any time.
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, 10_000) };
}

/// Serves a dlrmc plan or checkpoint over the Open Inference Protocol (KServe v2,
/// HTTP/REST): `GET /v2/health/ready`, `GET /v2/models/NAME`,
/// `POST /v2/models/NAME/infer`.
#[derive(Parser, Debug)]
#[command(name = "dlrm-serve", version)]
struct Cli {
    /// A plan directory (`dlrmc compile`) or a checkpoint (`dlrm-run --checkpoint`);
    /// with --watch, the watched directory's newest checkpoint when not given.
    #[arg(required_unless_present = "watch")]
    plan: Option<PathBuf>,
    /// Watch a checkpoint directory (`dlrm-run --checkpoint DIR`): serve its
    /// newest complete checkpoint, and load each newer one beside the model
    /// serving and swap it in (a load that fails keeps the old one serving).
    #[arg(long, value_name = "DIR")]
    watch: Option<PathBuf>,
    /// With --watch: how often to look, in milliseconds.
    #[arg(long, default_value_t = 1000, requires = "watch",
          value_parser = clap::value_parser!(u64).range(1..))]
    watch_interval_ms: u64,
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
    /// The most samples merged into one batch (a larger request runs alone).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..))]
    max_batch: u64,
    /// How long, in microseconds, the oldest queued request waits for others to
    /// merge with (0: batches only what is already queued).
    #[arg(long, default_value_t = 500)]
    max_delay_us: u64,
    /// The most requests waiting in the queue (more are answered 503).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..))]
    max_queue: u64,
    /// Executors running batches at once, over one shared copy of the parameters
    /// (their kernels share one pool of this process's threads: on 2 cores, one
    /// executor served dlrm-small faster than two).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=256))]
    instances: u64,
    /// The deadline, in milliseconds, of a request without a `timeout` parameter
    /// (0: none); a request still queued at its deadline is answered 504.
    #[arg(long, default_value_t = 0)]
    deadline_ms: u64,
    /// Do not compile the kernels of the padded batch sizes at start (they are
    /// then compiled on first use, a few tens of ms each).
    #[arg(long)]
    no_warm_up: bool,
    /// Serve the tables as int8 rows with an f32 scale and bias per row
    /// (FBGEMM's fused 8-bit row-wise format), quantized as each plan or
    /// checkpoint loads (also the ones --watch swaps in).
    #[arg(long, value_name = "FORMAT", value_parser = ["int8"])]
    quantize_tables: Option<String>,
}

fn main() -> Result<()> {
    keep_freed_pages_across_batches();
    let cli = Cli::parse();
    let (session, step) = initial(&cli)?;
    let name = cli
        .model_name
        .clone()
        .unwrap_or_else(|| session.name().to_string());
    let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    let opts = ServeOptions {
        batch: BatchOptions {
            max_batch: size(cli.max_batch),
            max_delay: Duration::from_micros(cli.max_delay_us),
            max_queue: size(cli.max_queue),
            instances: size(cli.instances),
            warm_up: !cli.no_warm_up,
        },
        deadline: (cli.deadline_ms > 0).then(|| Duration::from_millis(cli.deadline_ms)),
    };
    let served = Arc::new(Served::new(name.clone(), session, step, opts)?);
    let unmerged = served.unmerged();
    if let Some(dir) = &cli.watch {
        let every = Duration::from_millis(cli.watch_interval_ms);
        // A new model's warm-up is awaited at most a minute before the swap.
        let warm_limit = Duration::from_secs(60);
        watch::spawn(
            Arc::clone(&served),
            dir.clone(),
            step.unwrap_or(0),
            every,
            warm_limit,
            cli.quantize_tables.is_some(),
        )
        .context("starting the --watch thread")?;
    }
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
        if let Some(why) = unmerged {
            eprintln!("dlrm-serve: requests run one at a time, not merged: {why}");
        }
        axum::serve(listener, router(served, cli.max_body_bytes))
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
        Ok(())
    })
}

/// The model served at start and its checkpoint step (`None`: a plan): the
/// positional plan or checkpoint, else the watched directory's newest checkpoint.
fn initial(cli: &Cli) -> Result<(dlrm_runtime::Session, Option<u64>)> {
    let path = match (&cli.plan, &cli.watch) {
        (Some(p), _) => p.clone(),
        (None, Some(dir)) => {
            watch::newest(dir).with_context(|| format!("--watch {}", dir.display()))?
        }
        (None, None) => anyhow::bail!("give a plan or checkpoint, or --watch DIR"),
    };
    let int8 = cli.quantize_tables.is_some();
    if dlrm_runtime::checkpoint::is_checkpoint(&path) {
        let (session, step) =
            watch::load(&path, int8).with_context(|| format!("loading {}", path.display()))?;
        Ok((session, Some(step)))
    } else {
        let plan = dlrm_runtime::read_plan(&path)
            .with_context(|| format!("loading {}", path.display()))?;
        let session =
            watch::session_of(plan, int8).with_context(|| format!("loading {}", path.display()))?;
        Ok((session, None))
    }
}
