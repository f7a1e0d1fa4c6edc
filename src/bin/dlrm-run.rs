//! `dlrm-run`: trains or serves a plan on N ranks (threads in this process).

use anyhow::{Result, bail};
use clap::Parser;
use dlrm_runtime::driver::{Event, Mode, Report, run};
use dlrm_runtime::metrics::MetricsWriter;
use dlrm_runtime::plan::read_plan;
use dlrmc::{RunOptions, job_for};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

/// Trains (or, with --infer, serves) a plan written by `dlrmc compile` on synthetic
/// data whose labels come from a hidden teacher model, then reports AUC and
/// accuracy on held-out batches.
#[derive(Parser, Debug)]
#[command(name = "dlrm-run", version, about, long_about = None)]
struct Cli {
    /// The plan directory.
    plan: PathBuf,
    /// Ranks: threads in this process, each running its share of the global batch
    /// and owning a share of the embedding tables.
    #[arg(long, default_value_t = 1, value_name = "N")]
    ranks: usize,
    /// Steps to run.
    #[arg(long, default_value_t = 100, value_name = "K")]
    iters: u64,
    /// Seed of the synthetic data (default: the plan's).
    #[arg(long)]
    seed: Option<u64>,
    /// Global batch (default: the plan's); the same whatever --ranks is.
    #[arg(long, value_name = "N")]
    batch_size: Option<usize>,
    /// Run inference instead of training.
    #[arg(long)]
    infer: bool,
    /// Write JSON lines (one per logged step, then a summary with auc and accuracy).
    #[arg(long, value_name = "FILE")]
    metrics: Option<PathBuf>,
    /// Log a step every N steps (0: only the last).
    #[arg(long, default_value_t = 10, value_name = "N")]
    log_every: u64,
    /// Held-out batches evaluated at the end.
    #[arg(long, default_value_t = 4, value_name = "N")]
    eval_batches: usize,
    /// Steps left out of the samples/s median.
    #[arg(long, default_value_t = 3, value_name = "N")]
    warmup: u64,
    /// Print the final report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// No progress output, only the summary.
    #[arg(short, long)]
    quiet: bool,
}

fn main() -> ExitCode {
    match real_main(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dlrm-run: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn real_main(cli: Cli) -> Result<()> {
    let opts = RunOptions {
        ranks: cli.ranks,
        iters: cli.iters,
        seed: cli.seed,
        batch_size: cli.batch_size,
        infer: cli.infer,
        log_every: cli.log_every,
        eval_batches: cli.eval_batches,
        warmup: cli.warmup,
    };
    if cli.ranks == 0 {
        bail!("--ranks must be at least 1");
    }
    let plan = read_plan(&cli.plan)?;
    let name = plan.name.clone();
    let job = job_for(plan, &opts)?;
    let mut metrics = cli
        .metrics
        .as_deref()
        .map(MetricsWriter::create)
        .transpose()?;

    let bar = (!cli.quiet && std::io::stderr().is_terminal()).then(|| {
        let pb = ProgressBar::new(cli.iters);
        pb.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {msg}  [{elapsed}<{eta}]")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        pb
    });
    let mut metrics_err = None;
    let report = run(job, &mut |e| {
        if let Some(m) = metrics.as_mut()
            && metrics_err.is_none()
            && let Err(err) = m.event(e)
        {
            metrics_err = Some(err);
        }
        match e {
            Event::Step {
                iter,
                loss,
                samples_per_s,
                elapsed,
            } => {
                let loss = loss.map_or(String::new(), |l| format!("loss {l:.5}  "));
                let msg = format!("{loss}{samples_per_s:.0} samples/s");
                match &bar {
                    Some(pb) => {
                        pb.set_position(*iter);
                        pb.set_message(msg);
                    }
                    None if !cli.quiet => eprintln!(
                        "step {iter:>6}/{}  {msg}  ({:.1} s)",
                        cli.iters,
                        elapsed.as_secs_f64()
                    ),
                    None => {}
                }
            }
            Event::Eval { batch, batches } => {
                if let Some(pb) = &bar {
                    pb.set_message(format!("evaluating {batch}/{batches}"));
                }
            }
        }
    });
    if let Some(pb) = &bar {
        pb.finish_and_clear();
    }
    let report = report?;
    if let Some(err) = metrics_err {
        return Err(err.into());
    }
    if let Some(m) = metrics {
        m.finish(&report)?;
    }
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    eprintln!("{}", summary(&name, &report));
    Ok(())
}

fn summary(name: &str, r: &Report) -> String {
    let what = match r.mode {
        Mode::Train => "trained",
        Mode::Infer => "served",
    };
    let mut s = format!(
        "{what} `{name}`: {} steps on {} rank{}, global batch {}",
        r.iters,
        r.ranks,
        if r.ranks == 1 { "" } else { "s" },
        r.global_batch
    );
    if let Some(l) = r.final_loss {
        s += &format!(", final loss {l:.5}");
    }
    s += &format!(", {:.0} samples/s", r.samples_per_s);
    if let Some(a) = r.auc {
        s += &format!(", AUC {a:.4}");
    }
    if let Some(a) = r.accuracy {
        s += &format!(", accuracy {a:.4}");
    }
    s += &format!(" ({} held-out samples), {:.1} s", r.eval_samples, r.wall_s);
    s
}
