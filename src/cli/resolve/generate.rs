//! `generate` arguments turned into a [`GenerateConfig`]: the test-data writer's settings,
//! checked as every other subcommand's are (see the parent module).

use anyhow::{anyhow, bail, Result};

use super::check_prefix;
use crate::cli::args::GenerateArgs;
use crate::config::{GenerateConfig, HeaderFormat};
use crate::generate::DEFAULT_SAMPLES;
use crate::size::parse_size;

/// `generate` arguments as a [`GenerateConfig`].
///
/// # Errors
/// A message naming the flag and what it accepts.
pub(crate) fn generate_config(args: &GenerateArgs) -> Result<GenerateConfig> {
    if args.shards == 0 {
        bail!("--shards must be at least 1");
    }
    check_prefix(&args.prefix)?;
    if args.output.as_os_str().is_empty() {
        bail!("--output must not be empty");
    }
    if !crate::storage::sink(&args.output)
        .capabilities()
        .positioned_writes
    {
        bail!(
            "--output {}: reshard generate writes to a file system only",
            args.output.display()
        );
    }
    let mean_size = parse_size(&args.mean_size)
        .map_err(|e| anyhow!("--mean-size {:?}: {e}", args.mean_size))?;
    if mean_size == 0 {
        bail!("--mean-size {:?}: must be at least 1 byte", args.mean_size);
    }
    if !(args.sigma.is_finite() && args.sigma >= 0.0) {
        bail!("--sigma {}: expected a finite number >= 0", args.sigma);
    }
    if !args.skew.is_finite() {
        bail!("--skew {}: expected a finite number", args.skew);
    }
    let format = header_format(&args.format)?;
    let samples = match (&args.samples, &args.total_size) {
        (Some(_), Some(_)) => bail!("--samples and --total-size are mutually exclusive"),
        (Some(n), None) => *n,
        (None, Some(total)) => {
            let total = parse_size(total).map_err(|e| anyhow!("--total-size {total:?}: {e}"))?;
            // Round to the nearest count, in u128 so that huge sizes cannot overflow.
            let n = (u128::from(total) + u128::from(mean_size / 2)) / u128::from(mean_size);
            u64::try_from(n).unwrap_or(u64::MAX).max(1)
        }
        (None, None) => DEFAULT_SAMPLES,
    };
    if samples < args.shards {
        bail!(
            "{samples} samples for {} shards: each shard needs at least one sample",
            args.shards
        );
    }
    Ok(GenerateConfig {
        output: args.output.clone(),
        shards: args.shards,
        samples,
        mean_size,
        sigma: args.sigma,
        skew: args.skew,
        seed: args.seed,
        long_names_every: args.long_names_every,
        format,
        prefix: args.prefix.clone(),
    })
}

fn header_format(text: &str) -> Result<HeaderFormat> {
    match text.to_ascii_lowercase().as_str() {
        "gnu" => Ok(HeaderFormat::Gnu),
        "pax" | "posix" => Ok(HeaderFormat::Pax),
        _ => bail!("--format {text:?}: expected gnu or pax"),
    }
}
