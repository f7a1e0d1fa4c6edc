//! The sharding planner's command-line flags (`--network`, `--machine`,
//! `--calibration`, `--bucket-bytes`) and value parsers: they make the
//! [`ShardSettings`] of the runtime's planner ([`dlrm_runtime::launch::shard`]),
//! reading the `dlrmc calibrate` file ([`crate::calibrate`]) for the rates.

use crate::error::{Error, Result};
use dlrm_passes::shard::{self, Machine, Network};
use dlrm_runtime::launch::shard::{Rates, ShardSettings};

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
    /// rank: `--machine`/`--network` when given, else the calibration's rates
    /// (`--calibration`, else the default file when it exists), else the
    /// built-in guesses. An unreadable or invalid calibration file is an error.
    pub fn settings(&self, mem_per_rank: u64) -> Result<ShardSettings> {
        let d = ShardSettings::default();
        let path = match &self.calibration {
            Some(p) => Some(p.clone()),
            None => crate::calibrate::default_path().filter(|p| p.exists()),
        };
        let measured = match (self.machine.is_some() && self.network.is_some(), path) {
            (false, Some(p)) => Some(crate::calibrate::read(&p)?),
            _ => None,
        };
        let rates = match (self.machine.is_some() || self.network.is_some(), &measured) {
            (true, _) => Rates::Flags,
            (false, Some(_)) => Rates::Calibrated,
            (false, None) => Rates::Default,
        };
        let (machine, network) = match measured {
            Some(c) => (c.machine, c.network),
            None => (d.machine, d.network),
        };
        Ok(ShardSettings {
            mem_per_rank,
            network: self.network.unwrap_or(network),
            machine: self.machine.unwrap_or(machine),
            bucket_bytes: self.bucket_bytes.unwrap_or(d.bucket_bytes),
            rates,
        })
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
