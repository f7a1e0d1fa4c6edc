//! `dlrmc data`: convert raw or preprocessed Criteo data to `.ds`, inspect a dataset,
//! generate synthetic Criteo-format data. Argument parsing and printing only; the
//! work is in `dlrm-data`.

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand, ValueEnum};
use dlrm_data::{
    ConvertOptions, Dataset, Format, GenerateOptions, IdMapping, Learnable, SplitSpec, convert,
    generate, inspect, parse_pooling, write_learnable_bags,
};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

/// `dlrmc data ...`
#[derive(Subcommand, Debug)]
pub enum DataCommand {
    /// Convert Criteo data (raw TSV, plain or .gz; the reference's .npz; MLPerf's
    /// binary records) into a `.ds` dataset, atomically and in bounded memory.
    Convert(ConvertArgs),
    /// Summarise a dataset: samples, days, splits, per-feature and per-table statistics.
    Inspect(InspectArgs),
    /// Write synthetic Criteo-format TSV (39 features, Criteo's missing rates,
    /// heavy-tailed integers, power-law ids, ~25% learnable positives); with
    /// --pooling or --tables, a learnable `.ds` dataset with multi-hot bags.
    Generate(GenerateArgs),
}

/// Input formats on the command line.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum FormatArg {
    /// Criteo's TSV: Kaggle `train.txt`, Terabyte `day_0` .. `day_23` (plain or .gz).
    CriteoTsv,
    /// The reference DLRM's processed `.npz` (`X_int`, `X_cat`, `y`, `counts`).
    ReferenceNpz,
    /// MLPerf's binary records (40 little-endian int32 per sample).
    MlperfBin,
    /// Multi-hot bags in `.npz`: `y`, `X_int`, per table `X_cat_<t>_ids` with
    /// `X_cat_<t>_lengths` or `X_cat_<t>_offsets` (docs/data.md).
    RaggedNpz,
    /// MLPerf DLRM-DCNv2's multi-hot days: `day_<d>_sparse_multi_hot.npz` (members
    /// "0".."25", [N, hotness]) with `day_<d>_dense.npy` and `day_<d>_labels.npy`
    /// beside it; name the `.npz` files.
    MlperfMultihot,
}

/// `dlrmc data convert`.
#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// The input files in order (Terabyte: one per day, day_0 first).
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// The dataset directory to write (an existing dataset is replaced only once the
    /// new one is complete).
    #[arg(short, long, value_name = "DS")]
    output: PathBuf,
    /// The input format.
    #[arg(long, value_enum, default_value = "criteo-tsv")]
    format: FormatArg,
    /// The reference's `--max-ind-range`: raw ids are taken modulo N before the
    /// vocabulary (with `--hash`, rows = N).
    #[arg(long, value_name = "N")]
    max_ind_range: Option<u32>,
    /// The frequency threshold: ids seen fewer than K times share one row (the
    /// table's last); 1 keeps every id, as the reference.
    #[arg(
        long,
        value_name = "K",
        default_value_t = 1,
        alias = "frequency-threshold"
    )]
    min_count: u32,
    /// No vocabulary: row = id % max-ind-range (one pass, no vocabulary memory).
    #[arg(long, requires = "max_ind_range")]
    hash: bool,
    /// `kaggle` (7 equal days, day 6 halved into test and val), `terabyte` (a day per
    /// file, the last halved into test and val) or fractions such as
    /// `train=0.8,val=0.1,test=0.1`. Default: kaggle for one file, terabyte for more.
    #[arg(long, value_name = "SPEC")]
    split: Option<String>,
    /// Count and skip bad lines (reported at the end and in the manifest) instead of
    /// stopping at the first.
    #[arg(long)]
    skip_bad_lines: bool,
    /// No progress display.
    #[arg(short, long)]
    quiet: bool,
}

/// `dlrmc data inspect`.
#[derive(Args, Debug)]
pub struct InspectArgs {
    /// The dataset directory.
    dataset: PathBuf,
    /// Also check every file's checksum, labels and id ranges.
    #[arg(long)]
    verify: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `dlrmc data generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// Samples.
    #[arg(long, value_name = "N")]
    rows: u64,
    /// Days the samples span (Kaggle: 7, Terabyte: 24).
    #[arg(long, value_name = "D", default_value_t = 7)]
    days: u32,
    /// The seed (the output is a function of the options).
    #[arg(long, value_name = "S", default_value_t = 0)]
    seed: u64,
    /// Factor on Criteo Kaggle's cardinalities (tables of 100 rows or less stay whole).
    #[arg(long, value_name = "F", default_value_t = 0.01)]
    cardinality_scale: f64,
    /// Write gzip.
    #[arg(long)]
    gzip: bool,
    /// One file per day, `day_0` .. in the output directory (Terabyte style).
    #[arg(long)]
    split_files: bool,
    /// The output file (or directory, with --split-files; the `.ds` directory with
    /// --pooling or --tables).
    #[arg(short, long, value_name = "PATH")]
    output: PathBuf,
    /// Bag sizes: one for every table or a comma list of one per table, each a
    /// size (`3`) or a range of uniform sizes (`1-100`). Writes a `.ds` dataset
    /// straight away (Criteo TSV holds one id per feature), multi-hot tables where
    /// a size is not 1, with learnable labels.
    #[arg(long, value_name = "SPEC", conflicts_with_all = ["gzip", "split_files"])]
    pooling: Option<String>,
    /// With a `.ds` output: the tables' rows (comma list), instead of Criteo's 26
    /// cardinalities times --cardinality-scale.
    #[arg(long, value_name = "ROWS", value_delimiter = ',', conflicts_with_all = ["gzip", "split_files"])]
    tables: Option<Vec<u64>>,
    /// With a `.ds` output: dense features per sample.
    #[arg(long, value_name = "N", default_value_t = 13)]
    dense: usize,
    /// No progress display.
    #[arg(short, long)]
    quiet: bool,
}

/// Runs a `dlrmc data` command.
pub fn run(cmd: DataCommand) -> Result<()> {
    match cmd {
        DataCommand::Convert(a) => cmd_convert(a),
        DataCommand::Inspect(a) => cmd_inspect(a),
        DataCommand::Generate(a) => cmd_generate(a),
    }
}

fn bar(quiet: bool, len: u64, template: &str) -> Option<ProgressBar> {
    (!quiet && std::io::stderr().is_terminal()).then(|| {
        let pb = ProgressBar::new(len);
        pb.set_style(
            ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        pb
    })
}

fn cmd_convert(a: ConvertArgs) -> Result<()> {
    let format = match a.format {
        FormatArg::CriteoTsv => Format::CriteoTsv,
        FormatArg::ReferenceNpz => Format::ReferenceNpz,
        FormatArg::MlperfBin => Format::MlperfBin,
        FormatArg::RaggedNpz => Format::RaggedNpz,
        FormatArg::MlperfMultihot => Format::MlperfMultiHot,
    };
    if a.min_count == 0 {
        bail!("--min-count must be at least 1");
    }
    if a.max_ind_range == Some(0) {
        bail!("--max-ind-range must be at least 1");
    }
    let mapping = match (a.hash, a.max_ind_range) {
        (true, Some(modulo)) => {
            if a.min_count > 1 {
                bail!("--hash has no vocabulary: --min-count does not apply");
            }
            IdMapping::Hash { modulo }
        }
        _ => IdMapping::Vocabulary {
            modulo: a.max_ind_range,
            min_count: a.min_count,
        },
    };
    let split = a
        .split
        .as_deref()
        .map(str::parse::<SplitSpec>)
        .transpose()?;
    let opts = ConvertOptions {
        format,
        inputs: a.inputs,
        output: a.output,
        mapping,
        split,
        skip_bad_lines: a.skip_bad_lines,
    };
    let total: u64 = opts
        .inputs
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    let pb = bar(
        a.quiet,
        total,
        "{bar:30} {bytes}/{total_bytes}  {msg}  [{elapsed}<{eta}]",
    );
    let t0 = Instant::now();
    let report = convert(&opts, &mut |p| {
        if let Some(pb) = &pb {
            pb.set_position(p.bytes);
            let secs = t0.elapsed().as_secs_f64().max(1e-9);
            if p.mapping {
                pb.set_message(format!("{} rows; applying vocabularies", p.rows));
            } else {
                pb.set_message(format!(
                    "{} rows  {:.0} rows/s",
                    p.rows,
                    p.rows as f64 / secs
                ));
            }
        }
    })
    .with_context(|| format!("converting to {}", opts.output.display()))?;
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    let secs = t0.elapsed().as_secs_f64();
    let m = &report.manifest;
    if !a.quiet {
        let splits: Vec<String> = m
            .splits
            .iter()
            .map(|s| format!("{} {}", s.name, s.end - s.start))
            .collect();
        eprintln!(
            "wrote {}: {} samples from {} lines in {:.1} s ({:.0} rows/s); splits: {}",
            opts.output.display(),
            m.samples,
            report.lines,
            secs,
            report.lines as f64 / secs.max(1e-9),
            splits.join(", ")
        );
    }
    let skipped: u64 = report.skipped.values().sum();
    if skipped > 0 {
        let by: Vec<String> = report
            .skipped
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        eprintln!("skipped {skipped} bad lines ({})", by.join(", "));
        if let Some(first) = &report.first_skipped {
            eprintln!("  first: {first}");
        }
    }
    Ok(())
}

fn cmd_inspect(a: InspectArgs) -> Result<()> {
    let ds = Dataset::open(&a.dataset)?;
    if a.verify {
        ds.verify()?;
    }
    let ins = inspect(&ds);
    let text = if a.json {
        let mut v = serde_json::to_value(&ins)?;
        v["verified"] = serde_json::Value::Bool(a.verify);
        format!("{}\n", serde_json::to_string_pretty(&v)?)
    } else if a.verify {
        format!("{ins}verified: checksums, labels and id ranges match the manifest\n")
    } else {
        ins.to_string()
    };
    // A closed stdout (e.g. `| head`) is not an error.
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

fn cmd_generate(a: GenerateArgs) -> Result<()> {
    if a.pooling.is_some() || a.tables.is_some() {
        return generate_ds(&a);
    }
    let opts = GenerateOptions {
        rows: a.rows,
        days: a.days,
        seed: a.seed,
        cardinality_scale: a.cardinality_scale,
        gzip: a.gzip,
        split_files: a.split_files,
        output: a.output,
    };
    let pb = bar(
        a.quiet,
        a.rows,
        "{bar:30} {pos}/{len} rows  [{elapsed}<{eta}]",
    );
    let t0 = Instant::now();
    let report = generate(&opts, &mut |rows| {
        if let Some(pb) = &pb {
            pb.set_position(rows);
        }
    })?;
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    if !a.quiet {
        let secs = t0.elapsed().as_secs_f64();
        eprintln!(
            "wrote {} rows to {} file(s) in {:.1} s ({:.0} rows/s); positives {:.1}%",
            report.rows,
            report.files.len(),
            secs,
            report.rows as f64 / secs.max(1e-9),
            100.0 * report.positive_rate
        );
    }
    Ok(())
}

/// `dlrmc data generate --pooling/--tables`: a learnable `.ds` dataset.
fn generate_ds(a: &GenerateArgs) -> Result<()> {
    let rows = match &a.tables {
        Some(t) => t.clone(),
        None => dlrm_data::generate::cardinalities(a.cardinality_scale).to_vec(),
    };
    let pooling = parse_pooling(a.pooling.as_deref().unwrap_or("1"), rows.len())?;
    let spec = Learnable {
        samples: a.rows,
        dense: a.dense,
        rows,
        generator: format!(
            "dlrmc data generate --pooling {}",
            a.pooling.as_deref().unwrap_or("1")
        ),
    };
    let t0 = Instant::now();
    let m = write_learnable_bags(&a.output, &spec, &pooling)
        .with_context(|| format!("writing {}", a.output.display()))?;
    if !a.quiet {
        let multi = m.tables.iter().filter(|t| !t.bags.is_one_hot()).count();
        eprintln!(
            "wrote {}: {} samples, {} tables ({multi} multi-hot) in {:.1} s",
            a.output.display(),
            m.samples,
            m.tables.len(),
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
