//! Command-line interface: arguments are parsed and validated here, with no I/O, then turned
//! into a resolved configuration that the rest of the crate consumes.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, Parser, Subcommand};

use crate::order::OrderSpec;
use crate::plan::{Equalize, Sizing};
use crate::size::parse_size;
use crate::tar_index::{Codec, OnDuplicate, OnIncomplete, Rules};

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
    /// Print what `run` would do with the same flags (reads tar headers only, writes nothing).
    /// Like `run --dry-run`, but takes only the flags that shape the plan (not --force, --link,
    /// --keep, --verify, --report).
    Plan(RunArgs),
    /// Write a synthetic WebDataset (deterministic from a seed) for tests, examples and benchmarks.
    Generate(GenerateArgs),
    /// Check an output against its input: exactly the input's samples (by digest), every shard a
    /// sound tar matching index.json; report the shuffle quality. Exit 0 only if all holds.
    Verify(VerifyArgs),
    /// Print a shell completion script to stdout, e.g. `reshard completions bash >
    /// ~/.local/share/bash-completion/completions/reshard`.
    Completions {
        /// The shell to complete for: bash, zsh, fish (also elvish, powershell).
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Input shards: a .tar file, a directory (its *.tar files, sorted by name), a brace pattern
    /// such as 'data/train-{000000..000127}.tar', or @list.txt (one path per line). Repeat to
    /// concatenate; the expanded order is the canonical sample order.
    #[arg(long = "input", short = 'i', value_name = "SPEC", required = true)]
    pub inputs: Vec<String>,

    /// Output directory. Created atomically: it appears only once every shard is complete.
    /// Required unless planning (`reshard plan`, `--dry-run`).
    #[arg(long, short = 'o', value_name = "DIR")]
    pub output: Option<PathBuf>,

    /// Number of output shards. Exactly one of --shards, --shard-size and --gpus chooses it.
    #[arg(long, value_name = "N", conflicts_with_all = ["shard_size", "gpus"])]
    pub shards: Option<u64>,

    /// Target mean shard size, e.g. 512MiB: the shard count whose mean size is nearest. With
    /// --gpus, the multiple of GPUs x workers nearest it (default 512MiB).
    #[arg(long, value_name = "SIZE")]
    pub shard_size: Option<String>,

    /// Number of GPUs (training ranks): the shard count is a multiple of GPUs x --workers.
    #[arg(long, value_name = "G")]
    pub gpus: Option<u64>,

    /// Data loader workers per GPU (with --gpus).
    #[arg(long, value_name = "W", requires = "gpus")]
    pub workers: Option<u64>,

    /// Batch size per GPU (with --gpus): the manifest reports full batches per GPU.
    #[arg(long, value_name = "B", requires = "gpus")]
    pub batch_size: Option<u64>,

    /// When samples do not divide evenly: none (shard counts differ by at most one), drop (the
    /// N mod S samples at the end of the permutation are left out), pad (samples from the start
    /// of the permutation are repeated). Dropped and repeated keys are listed in index.json.
    #[arg(long, value_enum, default_value_t = EqualizeArg::None)]
    pub equalize: EqualizeArg,

    /// Cut shards by equal sample counts, or by near-equal bytes (counts then vary).
    #[arg(long, value_enum, default_value_t = Balance::Count)]
    pub balance: Balance,

    /// Plan only: index, print the plan, write nothing; --output, --force, --link and --keep are
    /// checked as `run` would (what --keep would remove is printed), nothing is changed.
    #[arg(long)]
    pub dry_run: bool,

    /// Print the plan as JSON (with --dry-run or `reshard plan`).
    #[arg(long)]
    pub json: bool,

    /// Seed of the global shuffle (required unless --order key or content, which are not random;
    /// a plan of --shards 1 is the same for any seed and needs none).
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,

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

    /// After publishing, check the output against the input as `reshard verify` does (reads
    /// both once more); exit 1 if anything does not hold.
    #[arg(long)]
    pub verify: bool,

    /// Extensions every sample must have, e.g. jpg,cls (see --on-incomplete).
    #[arg(long, value_name = "EXT,...", value_delimiter = ',')]
    pub require_ext: Vec<String>,

    /// A sample lacking a --require-ext member: abort (naming file, key and what is missing),
    /// warn (keep it), or exclude (leave it out, counted in index.json).
    #[arg(long, value_enum, default_value_t = OnIncomplete::Abort)]
    pub on_incomplete: OnIncomplete,

    /// A repeated extension within a sample, a sample whose members are not adjacent, or the
    /// same key in two samples: abort (naming where), warn, or keep. Checked while indexing
    /// tar headers (not for inputs read through a saved index: reshard's own outputs).
    #[arg(long, value_enum, default_value_t = OnDuplicate::Abort)]
    pub on_duplicate: OnDuplicate,

    /// Compress the output shards: none (plain .tar, the default), gz (.tar.gz) or zst
    /// (.tar.zst). Each writer compresses its shards once they are complete, streaming.
    #[arg(long, value_enum, default_value_t = CompressArg::None)]
    pub compress: CompressArg,

    /// Add each shard's MD5 (`md5sum`) to index.json; wids checks it after a download. Costs a
    /// read-back of the output.
    #[arg(long)]
    pub checksum: bool,

    /// A directory of saved indexes (`.idx` files, as reshard leaves in `OUTPUT/.reshard`) for
    /// the input shards. Without it, an input directory's own `.reshard` is used when present:
    /// the next epoch's run over an output skips indexing. Saved indexes whose shard changed
    /// (size or modification time) are ignored with a warning.
    #[arg(long, value_name = "PATH")]
    pub index: Option<PathBuf>,

    /// After publishing, atomically point the symbolic link PATH at the new output (readers of
    /// PATH always see a complete dataset).
    #[arg(long, value_name = "PATH")]
    pub link: Option<PathBuf>,

    /// After publishing, remove older epochs of this --output series, keeping the K highest epoch
    /// numbers (the new output always among them). Needs {epoch} in the last component of
    /// --output, e.g. --output 'data/epoch-{epoch}'. Removes only directories next to the
    /// output whose name is that template with another epoch number (digits, as --epoch writes
    /// them: data/epoch-3, not data/epoch-03 or data/epoch-notes) that hold reshard's own
    /// index.json and .reshard directory; never the new output, never the --link target,
    /// nothing else.
    #[arg(long, value_name = "K")]
    pub keep: Option<usize>,

    /// Seconds without progress in the data exchange after which a rank ends the whole job (a
    /// rank died or a node stopped answering); 0 waits forever.
    #[arg(long, value_name = "SECONDS", default_value_t = 120)]
    pub stall_timeout: u64,

    /// Also write the run summary as JSON to FILE (phases with seconds, per-rank bytes and peak
    /// memory), for benchmarks and monitoring.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,

    /// Output order: shuffle (the seeded global permutation), key (sample keys in byte order),
    /// or content:EXT[:int|float|str] (the content of each sample's .EXT member, e.g.
    /// content:cls:int; str when the type is left out). Ties go by input order.
    #[arg(long, value_name = "ORDER", default_value = "shuffle")]
    pub order: crate::order::OrderBy,

    /// Reverse --order key or content (ties still go by input order).
    #[arg(long)]
    pub descending: bool,

    /// A sample without the member --order content or --stratify-by reads, or whose content does
    /// not parse: error (naming file and key), or last (after all others; its own stratum).
    #[arg(long, value_enum, value_name = "WHAT", default_value_t = crate::order::Missing::Error)]
    pub missing: crate::order::Missing,

    /// Representative shards: every shard gets each label's samples (the content of member
    /// .EXT) in proportion to the label's share of the dataset, within ±1, still shuffled.
    #[arg(long, value_name = "EXT")]
    pub stratify_by: Option<String>,

    /// Largest member read as a label or order value (--order content, --stratify-by); a larger
    /// one is an error, which guards against reading payloads by mistake.
    #[arg(long, value_name = "SIZE", default_value = "4KiB")]
    pub label_limit: String,

    /// Route samples into named groups of shards by key (AIStore dsort's external key map): JSON
    /// {"fish-%06d.tar": ["regex", ...]} or lines `key<TAB>template`. Each group is sized and
    /// balanced on its own with the sizing flags and ordered by --order.
    #[arg(long, value_name = "FILE")]
    pub key_map: Option<PathBuf>,

    /// A sample no key-map group claims: error, skip (left out, counted), or group:TEMPLATE.
    #[arg(long, value_name = "WHAT", default_value = "error")]
    pub unmatched: crate::key_map::Unmatched,

    /// Largest single MPI exchange per rank, in bytes (exchanges are split into rounds below it).
    /// Only useful for testing the round logic.
    #[arg(long, value_name = "SIZE", hide = true)]
    pub max_round_bytes: Option<String>,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The input shards the output was made from, as given to `reshard run` (same specs, same
    /// order).
    #[arg(long = "input", short = 'i', value_name = "SPEC", required = true)]
    pub inputs: Vec<String>,

    /// The output directory to check: its shards and index.json.
    #[arg(long, short = 'o', value_name = "DIR")]
    pub output: PathBuf,

    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
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

/// The placeholder `--output` and `--link` replace with the epoch number.
const EPOCH: &str = "{epoch}";

/// Replaces `{epoch}` in a path with the epoch number: `--output 'data/epoch-{epoch}'`.
fn epoch_template(path: &std::path::Path, epoch: u64) -> String {
    path.to_string_lossy().replace(EPOCH, &epoch.to_string())
}

/// `--keep K`: the series of outputs one `--output` template names, and how many to keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keep {
    /// Epochs kept, the new output included.
    pub count: usize,
    /// The output directory's name with `{epoch}` not replaced, e.g. `epoch-{epoch}`.
    pub series: String,
}

impl Keep {
    /// The epoch whose output the series template names `name`: `epoch-12` is epoch 12 of
    /// `epoch-{epoch}`. Only names `--epoch` itself produces: decimal digits without leading
    /// zeros in every place of `{epoch}`, the rest of the name exactly the template's.
    pub fn epoch_of(&self, name: &str) -> Option<u64> {
        let (head, _) = self.series.split_once(EPOCH)?;
        let rest = name.strip_prefix(head)?;
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        // The template may go on with digits after `{epoch}`: try every split of the run.
        (1..=digits.min(20)).find_map(|len| {
            let e: u64 = rest[..len].parse().ok()?;
            (self.series.replace(EPOCH, &e.to_string()) == name).then_some(e)
        })
    }
}

/// Resolves `--keep`: only over a series of outputs, which `{epoch}` in the output directory's
/// own name makes (without it reshard cannot tell older epochs from unrelated directories).
fn resolve_keep(keep: Option<usize>, output: Option<&std::path::Path>) -> Result<Option<Keep>> {
    let Some(count) = keep else { return Ok(None) };
    if count == 0 {
        bail!("--keep must be at least 1 (the new output)");
    }
    let Some(output) = output else {
        bail!("--keep removes older epochs next to the output: it needs --output");
    };
    let name = output
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let parent = output.parent().unwrap_or(std::path::Path::new(""));
    if parent.to_string_lossy().contains(EPOCH) {
        bail!(
            "--keep: --output {} has {EPOCH} in a parent directory; --keep only removes older \
             epochs that are siblings of the output, so put {EPOCH} in its last component only, \
             e.g. --output 'data/epoch-{EPOCH}'",
            output.display()
        );
    }
    if !name.contains(EPOCH) {
        bail!(
            "--keep removes older epochs of a series of outputs, and --output {} names no series: \
             put {EPOCH} in the output directory's name, e.g. --output 'data/epoch-{EPOCH}' \
             --epoch N; without it reshard cannot tell older epochs from unrelated datasets next \
             to the output, so it removes nothing",
            output.display()
        );
    }
    Ok(Some(Keep {
        count,
        series: name,
    }))
}

/// `--compress` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CompressArg {
    None,
    Gz,
    Zst,
}

/// `--equalize` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EqualizeArg {
    None,
    Drop,
    Pad,
}

/// `--balance` values.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Balance {
    /// Equal sample counts per shard (within one).
    #[default]
    Count,
    /// Near-equal bytes per shard.
    Bytes,
}

/// GPU layout the shards are sized for (`--gpus`), for reporting per-GPU samples and batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct GpuLayout {
    pub gpus: u64,
    pub workers: u64,
    pub batch_size: Option<u64>,
}

/// A `run` request after validation: every field is resolved and checked, nothing touched the
/// filesystem yet.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub inputs: Vec<String>,
    /// `None` when only planning.
    pub output: Option<PathBuf>,
    pub sizing: Sizing,
    pub equalize: Equalize,
    pub balance: Balance,
    pub gpus: Option<GpuLayout>,
    pub dry_run: bool,
    pub json: bool,
    pub seed: u64,
    pub epoch: u64,
    pub prefix: String,
    pub mem_limit: u64,
    pub force: bool,
    pub report: Option<PathBuf>,
    pub rules: Rules,
    pub compress: Codec,
    pub checksum: bool,
    pub index: Option<PathBuf>,
    pub link: Option<PathBuf>,
    pub keep: Option<Keep>,
    pub stall_timeout: std::time::Duration,
    pub max_round_bytes: u64,
    pub order: OrderSpec,
}

/// The smallest memory budget that still leaves room for a useful exchange round.
pub const MIN_MEM_LIMIT: u64 = 1 << 20;

impl RunArgs {
    /// Resolves and validates the arguments.
    ///
    /// # Errors
    /// A message naming the flag and what it accepts.
    pub fn resolve(&self, plan_only: bool) -> Result<RunConfig> {
        let dry_run = plan_only || self.dry_run;
        let size = |s: &String| -> Result<u64> {
            let v = parse_size(s).map_err(|e| anyhow::anyhow!("--shard-size {s:?}: {e}"))?;
            if v == 0 {
                bail!("--shard-size must be more than 0 bytes");
            }
            Ok(v)
        };
        let nonzero = |flag: &str, v: u64| -> Result<u64> {
            if v == 0 {
                bail!("{flag} must be at least 1");
            }
            Ok(v)
        };
        // clap's `requires` yields to `conflicts_with` (--workers 2 --shards 3 passed it).
        if self.gpus.is_none() && (self.workers.is_some() || self.batch_size.is_some()) {
            bail!("--workers and --batch-size describe the GPU layout: use them with --gpus");
        }
        let sizing = match (self.shards, &self.shard_size, self.gpus) {
            (Some(n), _, _) => Sizing::Count(nonzero("--shards", n)?),
            (None, size_arg, Some(g)) => Sizing::Gpus {
                gpus: nonzero("--gpus", g)?,
                workers: nonzero("--workers", self.workers.unwrap_or(1))?,
                size: size_arg
                    .as_ref()
                    .map(size)
                    .transpose()?
                    .unwrap_or(512 << 20),
            },
            (None, Some(s), None) => Sizing::Size(size(s)?),
            (None, None, None) => {
                bail!("choose the shard count: --shards N, --shard-size SIZE or --gpus G")
            }
        };
        let gpus = match sizing {
            Sizing::Gpus { gpus, workers, .. } => Some(GpuLayout {
                gpus,
                workers,
                batch_size: self
                    .batch_size
                    .map(|b| nonzero("--batch-size", b))
                    .transpose()?,
            }),
            _ => None,
        };
        if plan_only {
            // `plan` takes the flags that shape the plan; these act on a written output.
            let run_only = [
                (self.force, "--force", "it replaces an existing output"),
                (
                    self.link.is_some(),
                    "--link",
                    "it points a link at the new output",
                ),
                (self.keep.is_some(), "--keep", "it removes older outputs"),
                (self.verify, "--verify", "it checks the written output"),
                (
                    self.report.is_some(),
                    "--report",
                    "it writes the run's summary",
                ),
            ];
            if let Some((_, flag, what)) = run_only.iter().find(|f| f.0) {
                bail!(
                    "{flag} is for `reshard run`: {what}, and `reshard plan` writes nothing; \
                     leave it out here (`reshard run --dry-run` checks the whole run command line)"
                );
            }
        }
        if self.verify && dry_run {
            bail!("--verify checks a written output: not with --dry-run or `reshard plan`");
        }
        if self.report.is_some() && dry_run {
            bail!("--report writes the run's summary: not with --dry-run, which writes nothing");
        }
        if self.json && !dry_run {
            bail!("--json prints a plan: use it with --dry-run or `reshard plan`");
        }
        let keep = resolve_keep(self.keep, self.output.as_deref())?;
        let output = match (&self.output, dry_run) {
            (Some(o), _) if o.as_os_str().is_empty() => bail!("--output must not be empty"),
            (Some(o), _) => Some(PathBuf::from(epoch_template(o, self.epoch))),
            (None, true) => None,
            (None, false) => bail!("--output DIR is required (or plan only with --dry-run)"),
        };
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
        let equalize = match self.equalize {
            EqualizeArg::None => Equalize::None,
            EqualizeArg::Drop => Equalize::Drop,
            EqualizeArg::Pad => Equalize::Pad,
        };
        let label_limit = parse_size(&self.label_limit)
            .map_err(|e| anyhow::anyhow!("--label-limit {:?}: {e}", self.label_limit))?;
        let order = OrderSpec {
            by: self.order.clone(),
            descending: self.descending,
            missing: self.missing,
            stratify_by: self
                .stratify_by
                .as_ref()
                .map(|e| e.trim().trim_start_matches('.').to_string())
                .filter(|e| !e.is_empty()),
            label_limit,
            key_map: self.key_map.clone(),
            unmatched: self.unmatched.clone(),
        };
        if self
            .stratify_by
            .as_ref()
            .is_some_and(|e| e.trim().trim_start_matches('.').is_empty())
        {
            bail!("--stratify-by needs a member extension, e.g. --stratify-by cls");
        }
        crate::order::validate(&order, self.balance == Balance::Bytes, equalize)?;
        let random = order.by == crate::order::OrderBy::Shuffle;
        // A plan of one shard is the same for every seed (all samples, all bytes, in it); with
        // more, which samples the shuffle puts in each shard sets the bytes per shard (and with
        // --balance bytes the samples per shard), so the plan needs the seed `run` will use.
        let seed = match self.seed {
            Some(s) => s,
            None if !random => 0,
            None if dry_run && sizing == Sizing::Count(1) => 0,
            None if dry_run => bail!(
                "--seed S is required: the plan's bytes per shard depend on which samples the seeded shuffle puts in each shard; give the seed `run` will use"
            ),
            None => bail!(
                "--seed S is required: it fixes the shuffle, so that a rerun (or another epoch with --epoch) is reproducible"
            ),
        };
        Ok(RunConfig {
            inputs: self.inputs.clone(),
            output,
            sizing,
            equalize,
            balance: self.balance,
            gpus,
            dry_run,
            json: self.json,
            seed,
            epoch: self.epoch,
            prefix: self.prefix.clone(),
            mem_limit,
            force: self.force,
            report: self.report.clone(),
            rules: Rules {
                require_ext: self
                    .require_ext
                    .iter()
                    .map(|e| e.trim().trim_start_matches('.').to_string())
                    .filter(|e| !e.is_empty())
                    .collect(),
                on_incomplete: self.on_incomplete,
                on_duplicate: self.on_duplicate,
                keep_keys: order.needs_keys(),
                read_member: order.member().map(|e| (e.to_string(), label_limit)),
            },
            order,
            compress: match self.compress {
                CompressArg::None => Codec::Plain,
                CompressArg::Gz => Codec::Gzip,
                CompressArg::Zst => Codec::Zstd,
            },
            checksum: self.checksum,
            index: self.index.clone(),
            link: self
                .link
                .as_ref()
                .map(|l| PathBuf::from(epoch_template(l, self.epoch))),
            keep,
            stall_timeout: std::time::Duration::from_secs(self.stall_timeout),
            max_round_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_series_holds_only_the_names_its_template_makes() {
        let keep = |series: &str| Keep {
            count: 2,
            series: series.into(),
        };
        let k = keep("epoch-{epoch}");
        assert_eq!(k.epoch_of("epoch-0"), Some(0));
        assert_eq!(k.epoch_of("epoch-12"), Some(12));
        for other in [
            "epoch-",
            "epoch-03",
            "epoch-notes",
            "epoch-1.bak",
            "other-epoch-1",
        ] {
            assert_eq!(k.epoch_of(other), None, "{other}");
        }
        assert_eq!(k.epoch_of("epoch-99999999999999999999"), None, "beyond u64");
        // Digits after the placeholder, and the placeholder twice.
        assert_eq!(keep("e{epoch}0").epoch_of("e120"), Some(12));
        assert_eq!(keep("{epoch}-of-{epoch}").epoch_of("7-of-7"), Some(7));
        assert_eq!(keep("{epoch}-of-{epoch}").epoch_of("7-of-8"), None);
    }

    #[test]
    fn keep_needs_epoch_in_the_output_name() {
        let p = |s: &str| Some(std::path::PathBuf::from(s));
        let ok = resolve_keep(Some(2), p("data/epoch-{epoch}").as_deref()).unwrap();
        assert_eq!(ok.unwrap().series, "epoch-{epoch}");
        assert!(resolve_keep(None, p("data/x").as_deref())
            .unwrap()
            .is_none());
        for bad in ["data/x", "{epoch}/x", "data-{epoch}/e-{epoch}"] {
            assert!(resolve_keep(Some(2), p(bad).as_deref()).is_err(), "{bad}");
        }
        assert!(resolve_keep(Some(0), p("e-{epoch}").as_deref()).is_err());
        assert!(resolve_keep(Some(1), None).is_err());
    }
}
