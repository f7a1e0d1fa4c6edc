//! The sharding planner's command-line flags (`--network`, `--machine`,
//! `--calibration`, `--bucket-bytes`) and value parsers: they make the
//! [`ShardSettings`] of the runtime's planner ([`dlrm_runtime::launch::shard`]),
//! with the rates of the `dlrmc calibrate` file ([`calibrate`]).

use crate::{Error, Result};
use dlrm_passes::shard::{self, Machine, Network};
use dlrm_runtime::calibrate;
use dlrm_runtime::launch::shard::ShardSettings;

/// Parses a `--bucket-bytes` value: `0` (no buckets) or a byte count such as
/// `1MiB` (as `--mem-per-rank`).
pub fn parse_bucket_bytes(s: &str) -> Result<u64> {
    if s.trim() == "0" {
        return Ok(0);
    }
    shard::parse_bytes(s).map_err(|e| Error::Options(e.to_string()))
}

/// The sharding planner's flags that `dlrmc compile`, `dlrmc plan-shards` and
/// `dlrm-run` share (each binary declares its own `--mem-per-rank`, whose default
/// differs: the planner's 16 GiB, or `dlrm-run`'s memory budget).
#[derive(clap::Args, Clone, Debug, Default, PartialEq)]
pub struct PlannerArgs {
    /// Sharding planner: the network between ranks, `latency_us,GBps` (default:
    /// the calibration's, else 2,12.5).
    #[arg(long, value_name = "US,GBPS", value_parser = parse_network_arg)]
    pub network: Option<Network>,
    /// Sharding planner: one rank's compute rates, `GFLOPs,GBps` (default: the
    /// calibration's, else 20,4: one core of an AVX2 machine).
    #[arg(long, value_name = "GFLOPS,GBPS", value_parser = parse_machine_arg)]
    pub machine: Option<Machine>,
    /// Sharding planner: the rates measured by `dlrmc calibrate` (default: its
    /// file, `$DLRMC_CALIBRATION` or `~/.cache/dlrmc/calibration.json`, when it
    /// exists).
    #[arg(long, value_name = "FILE")]
    pub calibration: Option<std::path::PathBuf>,
    /// Fuse the dense-gradient all-reduces into buckets of this many bytes, in the
    /// order backward produces the gradients, e.g. `1MiB` (default), `25MiB`; 0:
    /// one all-reduce per gradient.
    #[arg(long, value_name = "BYTES", value_parser = parse_bucket_arg)]
    pub bucket_bytes: Option<u64>,
}

impl PlannerArgs {
    /// The settings these flags give, with `mem_per_rank` bytes of tables per
    /// rank ([`calibrate::shard_settings`]: `--machine`/`--network` when given,
    /// else the calibration's rates, else the built-in guesses).
    pub fn settings(&self, mem_per_rank: u64) -> Result<ShardSettings> {
        Ok(calibrate::shard_settings(
            mem_per_rank,
            self.machine,
            self.network,
            self.calibration.as_deref(),
            self.bucket_bytes,
        )?)
    }
}

/// The value parser of `--mem-per-rank` ([`shard::parse_bytes`]).
pub fn parse_mem_arg(s: &str) -> std::result::Result<u64, String> {
    shard::parse_bytes(s).map_err(|e| e.to_string())
}

fn parse_bucket_arg(s: &str) -> std::result::Result<u64, String> {
    parse_bucket_bytes(s).map_err(|e| e.to_string())
}

fn parse_network_arg(s: &str) -> std::result::Result<Network, String> {
    Network::parse(s).map_err(|e| e.to_string())
}

fn parse_machine_arg(s: &str) -> std::result::Result<Machine, String> {
    Machine::parse(s).map_err(|e| e.to_string())
}
