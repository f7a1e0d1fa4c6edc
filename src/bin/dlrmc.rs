//! `dlrmc`: the DLRM compiler's command line (compile, inspect, opt, plan-shards,
//! export, data, plot).

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use dlrm_compiler::compile::{CompileOptions, Stage, compile_graphs, partition_stages};
use dlrm_compiler::model::{Overrides, load_model, table_rows_of};
use dlrm_compiler::{Inspection, compile};
use dlrm_ir::{Communicator, Graph, dot, text};
use dlrm_passes::pipeline::{self, DumpSpec, PipelineOptions, Precision};
use dlrm_passes::{LossKind, TrainConfig};
use dlrm_runtime::MpiComm;
use dlrm_runtime::checkpoint::read_plan_or_checkpoint;
use dlrm_runtime::launch::Comm;
use dlrm_runtime::launch::shard::{PlanGraphs, plan_shards_graphs};
use dlrm_runtime::plan::{read_plan, write_plan};
use dlrm_runtime::{ShardSettings, plan_shards};
use dlrmc::planner::{PlannerArgs, parse_mem_arg};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Compiles DLRM models into plans that `dlrm-run` trains or serves.
#[derive(Parser, Debug)]
#[command(name = "dlrmc", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Import a model (`.json` description or `.onnx`), optimise it, write a plan.
    Compile(Box<CompileArgs>),
    /// Summarise a plan: ops by kind, parameters by dtype, FLOPs per sample.
    Inspect(InspectArgs),
    /// Run passes on a textual IR file and print the result (the golden-test tool).
    Opt(OptArgs),
    /// Place a plan's embedding tables on N ranks (table-wise, row-wise,
    /// data-parallel) and predict each rank's step time and the scaling from 1 to N.
    PlanShards(PlanShardsArgs),
    /// Measure this machine's rates for the sharding planner (GEMM GFLOP/s,
    /// embedding-gather GB/s, all-to-all latency and bandwidth between ranks) and
    /// keep them where `plan-shards`, `compile` and `dlrm-run` read them.
    ///
    /// Between thread ranks by default; between processes with `mpirun -n N dlrmc
    /// calibrate --comm mpi` (rank 0 writes the file).
    Calibrate(CalibrateArgs),
    /// Datasets: convert Criteo data to `.ds`, inspect one, generate synthetic data.
    #[command(subcommand)]
    Data(dlrmc::data_cmd::DataCommand),
    /// Write a plan's (or a checkpoint's trained) inference model as standard ONNX.
    ///
    /// The model runs in ONNX Runtime (`dlrmc compile` reads back those without
    /// offsets bags): MLPs as Gemm + Relu/Sigmoid (blocked weights un-blocked),
    /// embedding bags as Gather + ReduceSum (bags with offsets: a ScatterND segment
    /// sum, no Loop), the dot interaction as MatMul + a Gather of the lower
    /// triangle. bf16 weights are widened to f32; the plan's bf16 roundings stay as
    /// Cast pairs. Check it with `scripts/compare-onnxruntime MODEL.onnx --plan PLAN`.
    Export(ExportArgs),
    /// Draw learning curves (training loss, validation AUC and log loss) of one or
    /// more `dlrm-run --metrics` files into an SVG.
    Plot(PlotArgs),
}

#[derive(Args, Debug)]
struct CalibrateArgs {
    /// Where to write the rates (default: `$DLRMC_CALIBRATION`, else
    /// `$XDG_CACHE_HOME/dlrmc/calibration.json` or
    /// `~/.cache/dlrmc/calibration.json`, which the planner reads by default).
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Worker threads of one rank (measure with the threads each rank of your
    /// jobs will have).
    #[arg(long, value_name = "N", default_value_t = 1)]
    threads: usize,
    /// Thread ranks exchanging data for the network rates (`--comm threads`).
    #[arg(long, value_name = "N", default_value_t = 2)]
    ranks: usize,
    /// Ranks are `threads` of this process or `mpi` processes (under `mpirun`).
    #[arg(long, value_name = "threads|mpi", default_value = "threads", value_parser = parse_comm)]
    comm: Comm,
    /// Fewer repetitions: rougher rates, sooner.
    #[arg(long)]
    quick: bool,
    /// Print the calibration as JSON on stdout.
    #[arg(long)]
    json: bool,
}

fn parse_comm(s: &str) -> std::result::Result<Comm, String> {
    Comm::parse(s).ok_or_else(|| format!("`{s}`: expected threads or mpi"))
}

#[derive(Args, Debug)]
struct ExportArgs {
    /// The plan directory (`dlrmc compile` output), or a checkpoint (`dlrm-run
    /// --checkpoint`: its trained parameters are exported).
    #[arg(value_name = "PLAN|CKPT")]
    plan: PathBuf,
    /// The `.onnx` file to write (replaced atomically; external data goes to
    /// `<file>.data` beside it).
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// The ONNX opset to write (16 to 21; `Gelu` is a single op from 20).
    #[arg(long, value_name = "N", default_value_t = dlrm_onnx::export::DEFAULT_OPSET)]
    opset: i64,
    /// The name of the symbolic batch dimension of the inputs and outputs.
    #[arg(long, value_name = "NAME", default_value = "batch")]
    batch: String,
    /// Put the weights in an external data file even when the model fits in one
    /// protobuf (it is automatic above 2 GB).
    #[arg(long)]
    external_data: bool,
    /// Export the tables as int8 rows (codes `uint8[R, D]`, a float scale and
    /// bias per row, dequantized after the gather), quantized from the plan's
    /// or checkpoint's values as `dlrmc compile --quantize-tables` does.
    #[arg(long, value_name = "FORMAT", value_parser = ["int8"])]
    quantize_tables: Option<String>,
    /// Print nothing but errors.
    #[arg(short, long)]
    quiet: bool,
}

#[derive(Args, Debug)]
struct PlotArgs {
    /// Metrics files (JSON lines); several are overlaid, labelled by file stem.
    #[arg(required = true)]
    metrics: Vec<PathBuf>,
    /// The SVG file to write.
    #[arg(short, long, value_name = "SVG")]
    output: PathBuf,
    /// The evaluation split to draw.
    #[arg(long, default_value = "val", value_name = "NAME")]
    split: String,
}

/// The sharding planner's options (shared by `compile` and `plan-shards`).
#[derive(Args, Debug, Clone)]
struct ShardArgs {
    /// Memory one rank may hold, e.g. `512MiB`, `2GB` (default 16GiB): the
    /// planner places table storage in it (larger tables are split by rows), and
    /// plan-shards refuses a plan whose rank memory account exceeds it.
    #[arg(long, value_name = "BYTES", value_parser = parse_mem_arg)]
    mem_per_rank: Option<u64>,
    #[command(flatten)]
    planner: PlannerArgs,
}

impl ShardArgs {
    fn settings(&self) -> dlrm_compiler::Result<ShardSettings> {
        let mem = self
            .mem_per_rank
            .unwrap_or(ShardSettings::default().mem_per_rank);
        self.planner.settings(mem)
    }
}

#[derive(Args, Debug)]
struct PlanShardsArgs {
    /// The plan directory, a checkpoint, or a JSON model description (planned from
    /// its graphs alone, as `dlrmc compile` would build them, without creating its
    /// parameters: for models too large for this machine).
    #[arg(value_name = "PLAN|CKPT|MODEL.json")]
    plan: PathBuf,
    /// With a JSON description: the storage precision to compile it for.
    #[arg(long, default_value = "fp32", value_name = "P")]
    precision: Precision,
    /// Rank count (at most 65536).
    #[arg(long, value_name = "N")]
    ranks: usize,
    /// Global batch (default: the plan's).
    #[arg(long, value_name = "N")]
    batch_size: Option<usize>,
    /// Print JSON (keys `prediction`, `scaling`, `options`).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    shards: ShardArgs,
}

#[derive(Args, Debug)]
struct CompileArgs {
    /// The model file: a dlrmc JSON description (see examples/) or an ONNX model.
    model: PathBuf,
    /// The plan directory to write (replaced atomically if it exists).
    #[arg(short, long, value_name = "PLAN")]
    output: PathBuf,
    /// Build only the inference graph.
    #[arg(long)]
    infer_only: bool,
    /// Store the tables as int8 rows with an f32 scale and bias per row
    /// (FBGEMM's fused 8-bit row-wise format), dequantized inside the bag
    /// kernels: about a quarter of the f32 bytes; the plan serves only
    /// (inference, as with --infer-only).
    #[arg(long, value_name = "FORMAT", value_parser = ["int8"])]
    quantize_tables: Option<String>,
    /// Print the IR to stdout after the named stages: `all`, or a comma list of
    /// `input`, pass ids (`canon`, `autodiff`, `contract-cross`, `save-activations`,
    /// `fuse`, `fuse-dgrad-mask`, `layout`, `precision`, `fuse-cross-epilogue`, `fuse-interaction-layout`, `dce`),
    /// `partition` and the
    /// per-rank pass ids (`bucket`, `schedule`).
    #[arg(long, value_name = "STAGES")]
    dump_ir: Option<String>,
    /// Rank count for the `partition`, `bucket` and `schedule` dump stages (at most
    /// 65536).
    #[arg(long, value_name = "N", default_value_t = 2)]
    ranks: usize,
    #[command(flatten)]
    shards: ShardArgs,
    /// Write Graphviz of the final graph (training graph if any) to this file.
    #[arg(long, value_name = "FILE")]
    dot: Option<PathBuf>,
    /// Optimisation level: 1 fuses MLPs into blocked batch-reduce GEMMs with fused
    /// epilogues (e-graph), 0 keeps the graphs as autodiff leaves them.
    #[arg(short = 'O', long = "opt-level", value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(0..=1))]
    opt_level: u8,
    /// Storage precision: fp32, bf16 (MLPs and tables in bf16, Split-SGD-BF16 masters)
    /// or mixed (bf16 except loss, last layer and interaction output).
    #[arg(long, default_value = "fp32", value_name = "P")]
    precision: Precision,
    /// Force one GEMM block size (default: chosen by the cost model per shape).
    #[arg(long, value_name = "N")]
    block: Option<usize>,
    /// Override the description's learning rate.
    #[arg(long)]
    lr: Option<f32>,
    /// Override the optimizer: sgd, adagrad or rowwise_adagrad (ONNX models: the
    /// training optimizer; Adagrad hyper-parameters are PyTorch's defaults).
    #[arg(long, value_name = "NAME")]
    optimizer: Option<String>,
    /// Override the description's global batch size.
    #[arg(long)]
    batch_size: Option<usize>,
    /// Override the description's seed (parameter initialisation and data).
    #[arg(long)]
    seed: Option<u64>,
    /// ONNX models: the graph input that is the label (it becomes the training
    /// graph's label input; default: a new input `label`).
    #[arg(long, value_name = "NAME")]
    label: Option<String>,
    /// Take each table's row count from this `.ds` dataset's manifest (JSON
    /// descriptions: they replace `table_rows`).
    #[arg(long, value_name = "DS")]
    data: Option<PathBuf>,
    /// Describe MLP weights and biases larger than this (e.g. `64MiB`, `0`: all) by
    /// their initializer instead of storing them in the plan, as tables always are
    /// (JSON descriptions; default 64MiB).
    #[arg(long, value_name = "BYTES", value_parser = parse_describe_above)]
    describe_above: Option<u64>,
    /// Print nothing but errors (and requested dumps).
    #[arg(short, long)]
    quiet: bool,
}

fn parse_describe_above(s: &str) -> std::result::Result<u64, String> {
    if s.trim() == "0" {
        return Ok(0);
    }
    dlrm_passes::shard::parse_bytes(s).map_err(|e| e.to_string())
}

#[derive(Args, Debug)]
struct OptArgs {
    /// A file in the IR text form (see docs/ir.md).
    input: PathBuf,
    /// Passes to run, in order (comma list of pass ids).
    #[arg(long, value_delimiter = ',', value_name = "IDS")]
    passes: Vec<String>,
    /// Loss for `autodiff`: bce or mse.
    #[arg(long, default_value = "bce")]
    loss: String,
    /// Learning rate for `autodiff`.
    #[arg(long, default_value_t = 0.1)]
    lr: f32,
    /// Storage precision for the `precision` pass.
    #[arg(long, default_value = "fp32", value_name = "P")]
    precision: Precision,
    /// Force one GEMM block size.
    #[arg(long, value_name = "N")]
    block: Option<usize>,
    /// Write the result here instead of stdout.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Print the pass log to stderr.
    #[arg(long)]
    log: bool,
}

#[derive(Args, Debug)]
struct InspectArgs {
    /// The plan directory, or a checkpoint (`DIR/step-<n>` or a checkpoint root).
    plan: PathBuf,
    /// Print JSON (keys `ops`, `params`, `param_bytes`, `flops_per_sample`, `graphs`, ...).
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    dlrmc::console::exit_quietly_on_closed_pipe();
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Compile(a) => cmd_compile(*a),
        Command::Inspect(a) => cmd_inspect(a),
        Command::Opt(a) => cmd_opt(a),
        Command::PlanShards(a) => cmd_plan_shards(a),
        Command::Export(a) => cmd_export(a),
        Command::Calibrate(a) => cmd_calibrate(a),
        Command::Data(c) => dlrmc::data_cmd::run(c),
        Command::Plot(a) => {
            dlrmc::plot::plot_files(&a.metrics, &a.split, &a.output).map_err(Into::into)
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dlrmc: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn write_dump(out: &mut impl Write, stage: &Stage, g: &Graph) {
    // A closed stdout (e.g. `| head`) must not abort the compile.
    let _ = writeln!(out, "; ---- {stage}\n{}", text::print(g));
}

fn cmd_compile(a: CompileArgs) -> Result<()> {
    let dump = a.dump_ir.as_deref().map(DumpSpec::parse).transpose()?;
    if a.ranks == 0 {
        bail!("--ranks must be at least 1");
    }
    dlrm_passes::shard::check_rank_count(a.ranks).map_err(anyhow::Error::msg)?;
    let wants = |pass: &str| dump.as_ref().is_some_and(|d| d.wants(pass));
    let say = |msg: String| {
        if !a.quiet {
            eprintln!("{msg}");
        }
    };
    let start = Instant::now();
    let overrides = Overrides {
        learning_rate: a.lr,
        optimizer: a.optimizer.clone(),
        batch_size: a.batch_size,
        seed: a.seed,
        label: a.label.clone(),
        table_rows: a.data.as_deref().map(table_rows_of).transpose()?,
        describe_above: a.describe_above,
    };
    let model = load_model(&a.model, overrides)?;
    say(format!(
        "loaded {} in {:.2} s\n{}",
        a.model.display(),
        start.elapsed().as_secs_f64(),
        model.summary.trim_end()
    ));

    if let Some(why) = &model.infer_only
        && !a.infer_only
    {
        say(format!("note: compiling for inference only: {why}"));
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let opts = CompileOptions {
        infer_only: a.infer_only || a.quantize_tables.is_some(),
        optimize: a.opt_level > 0,
        precision: a.precision,
        block: a.block,
    };
    let plan = compile(model, &opts, &mut |stage, g| {
        if wants(&stage.pass) {
            write_dump(&mut out, stage, g);
        }
    })?;
    let rank_stages =
        std::iter::once(pipeline::PARTITION).chain(pipeline::RANK_PASSES.iter().copied());
    if rank_stages.clone().any(wants) {
        partition_stages(&plan, a.ranks, &a.shards.settings()?, &mut |stage, g| {
            if wants(&stage.pass) {
                write_dump(&mut out, stage, g)
            }
        })?;
    }
    drop(out);
    let plan = match a.quantize_tables {
        Some(_) => {
            let (plan, report) = plan.quantize_tables()?;
            say(report.summary());
            plan
        }
        None => plan,
    };

    if let Some(path) = &a.dot {
        let g = plan.train.as_ref().unwrap_or(&plan.infer);
        write_atomic(path, dot::to_dot(g).as_bytes())?;
        say(format!("wrote {}", path.display()));
    }
    write_plan(&a.output, &plan)?;
    say(format!(
        "wrote plan {} ({}) in {:.2} s",
        a.output.display(),
        if plan.train.is_some() {
            "training and inference"
        } else {
            "inference only"
        },
        start.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// Writes `bytes` to `path` through a temporary file in the same directory, so a
/// failure never leaves a truncated file behind.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    tmp.write_all(bytes)
        .with_context(|| format!("writing {}", path.display()))?;
    tmp.persist(path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn cmd_inspect(a: InspectArgs) -> Result<()> {
    let info = if dlrm_runtime::checkpoint::is_checkpoint(&a.plan) {
        let (c, plan) = dlrm_runtime::checkpoint::read_checkpoint(&a.plan)?;
        Inspection::of_checkpoint(&plan, &c)
    } else {
        Inspection::of(&read_plan(&a.plan)?)
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&info)?);
    } else {
        print!("{}", dlrmc::inspect::Text(&info));
    }
    Ok(())
}

fn cmd_export(a: ExportArgs) -> Result<()> {
    let start = Instant::now();
    let mut plan = read_plan_or_checkpoint(&a.plan)?;
    if a.quantize_tables.is_some() {
        let (q, report) = plan.quantize_tables()?;
        if !a.quiet {
            eprintln!("{}", report.summary());
        }
        plan = q;
    }
    let opts = dlrm_onnx::export::ExportOptions {
        opset: a.opset,
        batch: a.batch.clone(),
        external_data: a.external_data,
    };
    let params = plan.tensors()?;
    let s = dlrm_onnx::export::export_to_file(&plan.infer, &params, &a.output, &opts)?;
    if !a.quiet {
        let ext = s.external.as_ref().map_or(String::new(), |(p, n)| {
            format!(", weights in {} ({n} bytes)", p.display())
        });
        eprintln!(
            "wrote {} ({} bytes, {} nodes, {} initializers, opset {}{ext}) in {:.2} s",
            s.path.display(),
            s.model_bytes,
            s.nodes,
            s.initializers,
            a.opset,
            start.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

fn cmd_calibrate(a: CalibrateArgs) -> Result<()> {
    use dlrm_runtime::calibrate::{self, CalibrateOptions};
    let opts = CalibrateOptions {
        threads: a.threads,
        ranks: a.ranks,
        quick: a.quick,
    };
    let path = match a.output.clone().or_else(calibrate::default_path) {
        Some(p) => p,
        None => bail!(
            "no place for the calibration: give --output (DLRMC_CALIBRATION is `none`, or HOME is unset)"
        ),
    };
    let comm = match a.comm {
        Comm::Threads => None,
        Comm::Mpi => Some(MpiComm::init()?),
    };
    let root = comm.as_ref().is_none_or(|c| c.rank() == 0);
    let dyn_comm = comm.as_ref().map(|c| c as &dyn Communicator);
    let c = calibrate::measure(opts, dyn_comm, &mut |line| {
        if root {
            eprintln!("{line}");
        }
    });
    let c = match (c, &comm) {
        (Ok(c), _) => c,
        (Err(e), Some(comm)) => {
            comm.abort(&e.to_string());
            return Err(e.into());
        }
        (Err(e), None) => return Err(e.into()),
    };
    if !root {
        return Ok(());
    }
    calibrate::write(&path, &c)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&c)?);
    }
    eprintln!(
        "{}: machine {:.2},{:.3} network {:.3},{:.3} (--machine GFLOPS,GBPS --network US,GBPS; {} with {} thread{} a rank)",
        path.display(),
        c.machine.gflops,
        c.machine.mem_gbps,
        c.network.latency_us,
        c.network.gbps,
        c.cpu,
        c.threads,
        if c.threads == 1 { "" } else { "s" }
    );
    Ok(())
}

fn cmd_plan_shards(a: PlanShardsArgs) -> Result<()> {
    let is_description = a.plan.is_file()
        && a.plan
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    let report = if is_description {
        // A JSON description: its graphs alone, no parameters materialised.
        let opts = CompileOptions {
            precision: a.precision,
            ..Default::default()
        };
        let g = compile_graphs(&a.plan, &opts)?;
        let pg = PlanGraphs {
            name: &g.name,
            infer: &g.infer,
            train: g.train.as_ref(),
            batch_size: g.batch_size,
            precision: &g.precision,
        };
        plan_shards_graphs(pg, a.ranks, a.batch_size, &a.shards.settings()?)?
    } else {
        let plan = read_plan_or_checkpoint(&a.plan)?;
        plan_shards(&plan, a.ranks, a.batch_size, &a.shards.settings()?)?
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    Ok(())
}

fn cmd_opt(a: OptArgs) -> Result<()> {
    let src = std::fs::read_to_string(&a.input)
        .with_context(|| format!("reading {}", a.input.display()))?;
    let g = text::parse(&src).with_context(|| format!("parsing {}", a.input.display()))?;
    let loss = match a.loss.as_str() {
        "bce" => LossKind::Bce,
        "mse" => LossKind::Mse,
        other => bail!("--loss must be bce or mse, got `{other}`"),
    };
    let opts = PipelineOptions {
        train: Some(TrainConfig {
            loss,
            lr: a.lr,
            optimizer: Default::default(),
        }),
        precision: a.precision,
        block: a.block,
        ..PipelineOptions::optimized(None)
    };
    let ids: Vec<&str> = a.passes.iter().map(String::as_str).collect();
    let (out, log) = pipeline::run_passes(&g, &ids, &opts)?;
    if a.log {
        eprint!("{log}");
    }
    let text = text::print(&out);
    match &a.output {
        Some(path) => write_atomic(path, text.as_bytes())?,
        None => print!("{text}"),
    }
    Ok(())
}
