//! Command-line interface: arguments are parsed and validated here, with no I/O, then turned
//! into a resolved configuration that the rest of the crate consumes.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, Parser, Subcommand};

use crate::size::parse_size;

/// Reorganize WebDataset tar shards over MPI: a global, seeded reshuffle into a new, balanced
/// set of shards with a wids index.
///
/// Run it as one process, under `mpirun -np N`, or under `srun` across many nodes.
#[derive(Debug, Parser)]
#[command(name = "reshard", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Reshuffle the input shards into a new set of balanced shards.
    Run(RunArgs),
    /// Write a synthetic WebDataset (deterministic from a seed) for tests, examples and benchmarks.
    Generate(GenerateArgs),
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Input shards: a .tar file, a directory (its *.tar files, sorted by name), a brace pattern
    /// such as 'data/train-{000000..000127}.tar', or @list.txt (one path per line). Repeat to
    /// concatenate; the expanded order is the canonical sample order.
    #[arg(long = "input", short = 'i', value_name = "SPEC", required = true)]
    pub inputs: Vec<String>,

    /// Output directory. Created atomically: it appears only once every shard is complete.
    #[arg(long, short = 'o', value_name = "DIR")]
    pub output: PathBuf,

    /// Number of output shards.
    #[arg(long, value_name = "N")]
    pub shards: u64,

    /// Seed of the global shuffle.
    #[arg(long, value_name = "S")]
    pub seed: u64,

    /// Epoch number: the same seed with another epoch gives an unrelated order.
    #[arg(long, value_name = "E", default_value_t = 0)]
    pub epoch: u64,

    /// Output file name prefix: shards are named PREFIX-000000.tar, PREFIX-000001.tar, ...
    #[arg(long, value_name = "NAME", default_value = "shard")]
    pub prefix: String,

    /// Memory budget per rank for data in flight (send and receive buffers), e.g. 512MiB, 4GiB.
    #[arg(long, value_name = "SIZE", default_value = "1GiB")]
    pub mem_limit: String,

    /// Replace an output directory that exists and is not empty.
    #[arg(long)]
    pub force: bool,

    /// Also write the run summary as JSON to FILE (phases with seconds, per-rank bytes and peak
    /// memory), for benchmarks and monitoring.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,

    /// Largest single MPI exchange per rank, in bytes (exchanges are split into rounds below it).
    /// Only useful for testing the round logic.
    #[arg(long, value_name = "SIZE", hide = true)]
    pub max_round_bytes: Option<String>,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Directory to write the shards to (created; must not contain shards already).
    #[arg(long, short = 'o', value_name = "DIR")]
    pub output: PathBuf,

    /// Number of input shards to write.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub shards: u64,

    /// Total number of samples (alternative to --total-size).
    #[arg(long, value_name = "N", conflicts_with = "total_size")]
    pub samples: Option<u64>,

    /// Approximate total payload size, e.g. 2GiB (samples = size / mean sample size).
    #[arg(long, value_name = "SIZE")]
    pub total_size: Option<String>,

    /// Mean payload size of a sample's main member (lognormal around it).
    #[arg(long, value_name = "SIZE", default_value = "100KiB")]
    pub mean_size: String,

    /// Spread of the lognormal payload sizes (sigma of the underlying normal).
    #[arg(long, value_name = "SIGMA", default_value_t = 0.5)]
    pub sigma: f64,

    /// Skew of input shard sizes: 0 gives equal shards; larger values make the first shards
    /// much larger than the last (shard i gets a weight of exp(-skew * i / shards)).
    #[arg(long, value_name = "X", default_value_t = 0.0)]
    pub skew: f64,

    /// Seed: the same arguments and seed always give byte-identical shards.
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,

    /// Give every Nth sample a key longer than 100 bytes (0: never), which needs GNU long-name
    /// or PAX records.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub long_names_every: u64,

    /// Header format of the members: gnu (long names as GNU 'L' records) or pax (PAX 'x' records).
    #[arg(long, value_name = "FMT", default_value = "gnu")]
    pub format: String,

    /// Shard file name prefix.
    #[arg(long, value_name = "NAME", default_value = "train")]
    pub prefix: String,
}

/// A `run` request after validation: every field is resolved and checked, nothing touched the
/// filesystem yet.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub inputs: Vec<String>,
    pub output: PathBuf,
    pub shards: u64,
    pub seed: u64,
    pub epoch: u64,
    pub prefix: String,
    pub mem_limit: u64,
    pub force: bool,
    pub report: Option<PathBuf>,
    pub max_round_bytes: u64,
}

/// The smallest memory budget that still leaves room for a useful exchange round.
pub const MIN_MEM_LIMIT: u64 = 1 << 20;

impl RunArgs {
    /// Resolves and validates the arguments.
    ///
    /// # Errors
    /// A message naming the flag and what it accepts.
    pub fn resolve(&self) -> Result<RunConfig> {
        if self.shards == 0 {
            bail!("--shards must be at least 1");
        }
        if self.prefix.is_empty() || self.prefix.contains('/') || self.prefix.starts_with('.') {
            bail!(
                "--prefix {:?}: expected a non-empty file name prefix without '/' that does not start with '.'",
                self.prefix
            );
        }
        let mem_limit = parse_size(&self.mem_limit)
            .map_err(|e| anyhow::anyhow!("--mem-limit {:?}: {e}", self.mem_limit))?;
        if mem_limit < MIN_MEM_LIMIT {
            bail!("--mem-limit {:?}: must be at least 1MiB", self.mem_limit);
        }
        let max_round_bytes = match &self.max_round_bytes {
            None => i32::MAX as u64,
            Some(s) => {
                let v =
                    parse_size(s).map_err(|e| anyhow::anyhow!("--max-round-bytes {s:?}: {e}"))?;
                v.clamp(1, i32::MAX as u64)
            }
        };
        if self.output.as_os_str().is_empty() {
            bail!("--output must not be empty");
        }
        Ok(RunConfig {
            inputs: self.inputs.clone(),
            output: self.output.clone(),
            shards: self.shards,
            seed: self.seed,
            epoch: self.epoch,
            prefix: self.prefix.clone(),
            mem_limit,
            force: self.force,
            report: self.report.clone(),
            max_round_bytes,
        })
    }
}
