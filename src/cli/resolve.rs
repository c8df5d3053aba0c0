//! Every subcommand's arguments turned into its configuration ([`crate::config`]), checked
//! without touching the filesystem. Whatever is wrong here is a usage error: [`task`] wraps it in
//! [`UsageError`], and `reshard` exits with [`crate::exit::Exit::Usage`] for it, whichever
//! subcommand it was.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Result};

use super::args::{Command, CompressArg, EqualizeArg, FilesArgs, PlanArgs, RunArgs, VerifyArgs};
use crate::config::{
    Balance, EnergonDataset, ExchangeSettings, ExpandSettings, FinishSettings, GenerateConfig,
    GpuLayout, IndexSettings, IoConfig, JobSettings, Keep, LayoutSettings, LoaderIndexes,
    PlaceSettings, PlanSettings, ProgressConfig, PublishSettings, ReportSettings, ResumeSettings,
    RunConfig, SplitSettings, Splits, UploadSettings, VerifyConfig, EPOCH, MIN_MEM_LIMIT,
};
use crate::plan::order::{OrderBy, OrderSpec};
use crate::plan::{Equalize, Sizing};
use crate::report::picture::format_of;
use crate::size::parse_size;
use crate::tar::key::LoaderNames;
use crate::tar::{Codec, OnDuplicate, Rules};
use crate::throttle::Limits;

/// What `reshard` is asked to do, every argument checked.
#[derive(Debug)]
pub enum Task {
    /// `run` (then `verify` when given: `run --verify`), or `plan` (`config.dry_run`).
    Run {
        /// Boxed: much larger than the other tasks' configurations.
        config: Box<RunConfig>,
        then_verify: Option<VerifyConfig>,
    },
    Generate(GenerateConfig),
    Verify(VerifyConfig),
    /// Needs neither MPI nor any checking.
    Completions(clap_complete::Shell),
    /// reshard's man page, or a subcommand's: neither MPI nor any checking.
    Man(Option<String>),
}

/// An invalid command line, found after clap parsed it: the message names the flag and what it
/// accepts.
#[derive(Debug)]
pub struct UsageError(anyhow::Error);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for UsageError {}

impl UsageError {
    /// A request that cannot be carried out as given, found once the job looked (`--resume` with
    /// other arguments than the run it would continue): exits 2 like any usage error.
    pub(crate) fn new(e: anyhow::Error) -> Self {
        UsageError(e)
    }
}

/// Resolves the parsed command line into the task it asks for.
///
/// # Errors
/// [`UsageError`]: an invalid value, or flags that do not go together.
pub fn task(command: Command) -> Result<Task, UsageError> {
    if names_object_store(&command) {
        crate::storage::endpoint::check_environment().map_err(|e| UsageError(anyhow!(e)))?;
    }
    Ok(match command {
        Command::Run(args) => {
            let config = Box::new(run_config(&args, false).map_err(UsageError)?);
            // An `s3://` output is checked where it was uploaded (its staged copy is gone).
            let then_verify = match (
                args.verify,
                config.upload.as_ref().or(config.output.as_ref()),
            ) {
                (true, Some(output)) => Some(VerifyConfig {
                    inputs: config.inputs.clone(),
                    files: config.files.clone(),
                    output: output.clone(),
                    json: false,
                    plot: None,
                    ignore_zeros: config.rules.ignore_zeros,
                }),
                _ => None,
            };
            Task::Run {
                config,
                then_verify,
            }
        }
        Command::Plan(PlanArgs(args)) => Task::Run {
            config: Box::new(run_config(&args, true).map_err(UsageError)?),
            then_verify: None,
        },
        Command::Generate(args) => Task::Generate(generate_config(&args).map_err(UsageError)?),
        Command::Verify(args) => Task::Verify(verify_config(&args).map_err(UsageError)?),
        Command::Completions { shell } => Task::Completions(shell),
        Command::Man { command } => Task::Man(command),
    })
}

/// Whether the command line names an `s3://` location: then the AWS endpoint variables must be
/// well formed, before any I/O (an input list's are checked when the client is made).
fn names_object_store(command: &Command) -> bool {
    let s3 = |p: &Path| p.to_str().is_some_and(|p| p.starts_with("s3://"));
    let any = |inputs: &[String], paths: &[Option<&PathBuf>]| {
        inputs.iter().any(|i| s3(Path::new(i))) || paths.iter().flatten().any(|p| s3(p))
    };
    match command {
        Command::Run(a) | Command::Plan(PlanArgs(a)) => any(
            &a.inputs,
            &[a.output.as_ref(), a.index.as_ref(), a.scratch.as_ref()],
        ),
        Command::Verify(a) => any(&a.inputs, &[Some(&a.output)]),
        Command::Generate(a) => any(&[], &[Some(&a.output)]),
        Command::Completions { .. } | Command::Man { .. } => false,
    }
}

/// `run` (or, with `plan_only`, `plan`) arguments as a [`RunConfig`]. The checks run in a fixed
/// order, so that a command line with several mistakes always names the same one first.
///
/// # Errors
/// A message naming the flag and what it accepts.
pub(crate) fn run_config(args: &RunArgs, plan_only: bool) -> Result<RunConfig> {
    let dry_run = plan_only || args.dry_run;
    missing_required(args, dry_run)?;
    let (sizing, gpus) = sizing(args)?;
    check_flags_fit_the_command(args, dry_run)?;
    let keep = keep_series(args.keep, args.output.as_deref())?;
    let output = output(args, dry_run)?;
    let (output, upload) = staged(args, output)?;
    check_prefix(&args.prefix)?;
    let mem_limit = parse_size(&args.mem_limit)
        .map_err(|e| anyhow!("--mem-limit {:?}: {e}", args.mem_limit))?;
    if mem_limit < MIN_MEM_LIMIT {
        bail!("--mem-limit {:?}: must be at least 1MiB", args.mem_limit);
    }
    let max_round_bytes = match &args.max_round_bytes {
        None => i32::MAX as u64,
        Some(s) => {
            let v = parse_size(s).map_err(|e| anyhow!("--max-round-bytes {s:?}: {e}"))?;
            v.clamp(1, i32::MAX as u64)
        }
    };
    let equalize = match args.equalize {
        EqualizeArg::None => Equalize::None,
        EqualizeArg::Drop => Equalize::Drop,
        EqualizeArg::Pad => Equalize::Pad,
    };
    let order = order(args, equalize)?;
    let seed = seed(args, &order, dry_run, sizing)?;
    let split = splits(args)?;
    let progress = progress(args)?;
    if let Some(plot) = &args.plot {
        if !dry_run {
            bail!("--plot draws a plan: use it with --dry-run or `reshard plan` (`reshard verify --plot` draws a written output)");
        }
        format_of(plot)?;
    }
    let loaders = loader_indexes(args, equalize)?;
    Ok(RunConfig {
        inputs: args.inputs.clone(),
        files: files(&args.files)?,
        output,
        upload,
        sizing,
        equalize,
        balance: args.balance,
        gpus,
        dry_run,
        space_check: !args.no_space_check,
        json: args.json,
        seed,
        epoch: args.epoch,
        prefix: args.prefix.clone(),
        mem_limit,
        force: args.force,
        report: args.report.clone(),
        rules: rules(args, &order, &loaders),
        order,
        loaders,
        compress: match args.compress {
            CompressArg::None => Codec::Plain,
            CompressArg::Gz => Codec::Gzip,
            CompressArg::Zst => Codec::Zstd,
        },
        checksum: args.checksum,
        saved_indexes: args.index.clone(),
        spool: scratch(args),
        link: args
            .link
            .as_ref()
            .map(|l| PathBuf::from(epoch_template(l, args.epoch))),
        keep,
        stall_timeout: Duration::from_secs(args.stall_timeout),
        lock_stale_after: Duration::from_secs(args.lock_stale_after),
        max_round_bytes,
        split,
        resume: args.resume,
        checkpoint_every: Duration::from_secs(args.checkpoint_every),
        progress,
        plot: args.plot.clone(),
        io: io_config(args)?,
    })
}

/// `--input-files` and the flags that only it takes, checked ([`crate::tree::FilesRequest`]).
fn files(args: &FilesArgs) -> Result<crate::tree::FilesRequest> {
    let (roots, key_regex, label) = (&args.input_files, &args.key_regex, &args.label_from_dir);
    crate::tree::FilesRequest::checked(roots, key_regex.as_deref(), label.as_deref())
}

/// What every phase of a job needs of `cfg`, each its own settings, decided here once.
pub fn job_settings(cfg: &RunConfig) -> JobSettings {
    // `--keep` prunes the series where the output is published: the file system's, or the
    // bucket's after the upload (never the staged copy's siblings on the scratch directory).
    let local_keep = cfg.keep.clone().filter(|_| cfg.upload.is_none());
    JobSettings {
        expand: ExpandSettings {
            inputs: cfg.inputs.clone(),
            files: cfg.files.clone(),
            output: cfg.output.clone(),
            dry_run: cfg.dry_run,
            resume: cfg.resume,
            force: cfg.force,
            link: cfg.link.clone(),
            keep: local_keep.clone(),
            epoch: cfg.epoch,
            lock_stale_after: cfg.lock_stale_after,
        },
        plan: plan_settings(cfg),
        exchange: ExchangeSettings {
            mem_limit: cfg.mem_limit,
            stall_timeout: cfg.stall_timeout,
            progress: cfg.progress,
            limits: cfg.io.limits,
        },
        finish: FinishSettings {
            compress: cfg.compress,
            checksum: cfg.checksum,
            loaders: cfg.loaders.clone(),
        },
        publish: PublishSettings {
            force: cfg.force,
            compress: cfg.compress,
            loaders: cfg.loaders.clone(),
            link: cfg.link.clone(),
            keep: local_keep,
            seed: cfg.seed,
            epoch: cfg.epoch,
            equalize: cfg.equalize,
            balance: cfg.balance,
            order: cfg.order.describe(),
            key_map: cfg.order.key_map.clone(),
            split: cfg.split.is_some(),
            staged_for_upload: cfg.upload.is_some(),
        },
        upload: UploadSettings {
            target: cfg.upload.clone(),
            local: cfg.output.clone(),
            force: cfg.force,
            dry_run: cfg.dry_run,
            resume: cfg.resume,
            lock_stale_after: cfg.lock_stale_after,
            keep: cfg.keep.clone().filter(|_| cfg.upload.is_some()),
            epoch: cfg.epoch,
            progress: cfg.progress,
        },
        resume: ResumeSettings {
            arguments: resume_arguments(cfg),
            key_map: cfg.order.key_map.clone(),
            mem_limit: cfg.mem_limit,
            checkpoint_every: cfg.checkpoint_every,
        },
        report: ReportSettings {
            equalize: cfg.equalize,
            balance: cfg.balance,
            order: cfg.order.describe(),
            sizing: cfg.sizing,
            output: cfg.output.clone(),
            limits: cfg.io.limits,
            mem_limit: cfg.mem_limit,
            uploaded_to: cfg.upload.clone(),
        },
        dry_run: cfg.dry_run,
        plot: cfg.plot.clone(),
        space_check: cfg.space_check,
        io: cfg.io,
    }
}

/// Every argument that shapes the staging shards, as (flag, value), for `--resume` to record
/// and compare. Not the rank count or the memory budget: a resumed run may use others. Not what
/// only the finish phase uses (`--compress`, `--checksum`): the staging shards are plain either
/// way. The key map's stamp is added by the phase that records it.
fn resume_arguments(cfg: &RunConfig) -> Vec<(String, String)> {
    let args = [
        (
            "reshard version",
            crate::output::checkpoint::recorded_version(),
        ),
        ("--shards/--shard-size/--gpus", cfg.sizing.flags()),
        ("--equalize", cfg.equalize.flag().to_string()),
        ("--balance", cfg.balance.flag().to_string()),
        ("--seed", cfg.seed.to_string()),
        ("--epoch", cfg.epoch.to_string()),
        ("--prefix", cfg.prefix.clone()),
        ("--order and its options", cfg.order.flags()),
        (
            "--split/--split-shards",
            cfg.split
                .as_ref()
                .map_or_else(|| "none".into(), Splits::flags),
        ),
        (
            "--require-ext/--on-incomplete/--on-duplicate",
            cfg.rules.flags(),
        ),
    ];
    args.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// The part of `--mem-limit` that a rank's spooled input shards may hold in memory (1/SHARE):
/// a quarter, so that the exchange, which takes the rest, keeps rounds of a useful size.
const SPOOL_SHARE: u64 = 4;

/// What each planning phase needs of `cfg`, with the values that depend on several flags
/// decided here once: whether saved indexes can stand in for the headers, which groups the
/// GPUs train on.
pub(crate) fn plan_settings(cfg: &RunConfig) -> PlanSettings {
    let rules = &cfg.rules;
    // A saved index holds byte ranges only, not keys, labels or member names: the loader
    // indexes' name and duplicate checks need the headers, and must fail while indexing,
    // before any data moves, not in the finish phase.
    let needs_headers = rules.keep_keys
        || rules.read_member.is_some()
        || rules.loader_names != LoaderNames::default();
    PlanSettings {
        index: IndexSettings {
            rules: rules.clone(),
            saved_indexes: cfg.saved_indexes.clone(),
            spool: cfg.spool.clone(),
            spool_memory: cfg.mem_limit / SPOOL_SHARE,
            reuse_saved: !needs_headers,
            progress: cfg.progress,
        },
        place: PlaceSettings {
            order: cfg.order.clone(),
            split: cfg.split.clone().map(|splits| SplitSettings {
                splits,
                seed: cfg.seed,
            }),
            seed: cfg.seed,
            epoch: cfg.epoch,
            equalize: cfg.equalize,
            sizing: cfg.sizing,
            prefix: cfg.prefix.clone(),
        },
        layout: LayoutSettings {
            balance: cfg.balance,
            gpus: cfg.gpus,
            // With `--split`, the GPUs train on the first split.
            gpu_groups: cfg.split.as_ref().map(|_| 1),
        },
    }
}

/// `--max-read-rate`, `--max-write-rate`, `--io-priority` and `--nice`.
fn io_config(args: &RunArgs) -> Result<IoConfig> {
    if let Some(n) = args.nice.filter(|n| !(-20..=19).contains(n)) {
        bail!("--nice {n}: expected a nice value from -20 to 19");
    }
    Ok(IoConfig {
        limits: Limits {
            read: rate("--max-read-rate", args.max_read_rate.as_deref())?,
            write: rate("--max-write-rate", args.max_write_rate.as_deref())?,
        },
        priority: args.io_priority,
        nice: args.nice,
    })
}

/// A rate flag's value in bytes per second: a size (see [`parse_size`]) with an optional `/s`.
fn rate(flag: &str, text: Option<&str>) -> Result<Option<u64>> {
    let Some(text) = text else { return Ok(None) };
    let size = text.trim().strip_suffix("/s").unwrap_or(text);
    match parse_size(size) {
        _ if size.trim_start().starts_with('-') => bail!("{flag} {text:?}: must be more than 0 bytes per second"),
        Ok(0) => bail!("{flag} {text:?}: must be more than 0 bytes per second (leave the flag out for no limit)"),
        Ok(v) => Ok(Some(v)),
        Err(e) => bail!("{flag} {text:?}: {e}; expected a rate such as 2GiB/s or 500MB/s"),
    }
}

/// `--progress` and `--progress-interval`.
fn progress(args: &RunArgs) -> Result<ProgressConfig> {
    let secs = args.progress_interval;
    if !(secs.is_finite() && (0.0..=86_400.0).contains(&secs)) {
        bail!("--progress-interval {secs}: expected seconds from 0 to 86400");
    }
    Ok(ProgressConfig {
        mode: args.progress,
        interval: Duration::from_secs_f64(secs),
    })
}

/// `--split` and `--split-shards`: every split named in --split-shards exists and is not the
/// first (which the sizing flags size); splits group samples by count.
fn splits(args: &RunArgs) -> Result<Option<Splits>> {
    let Some(spec) = &args.split else {
        return Ok(None);
    };
    if args.key_map.is_some() {
        bail!("--split and --key-map both choose the groups of output shards: use one of them");
    }
    if args.balance == Balance::Bytes {
        bail!("--split sizes each split by count: it cannot be combined with --balance bytes");
    }
    let names = spec.names();
    let mut shards = vec![None; names.len()];
    let Some(text) = &args.split_shards else {
        return Ok(Some(Splits {
            spec: spec.clone(),
            shards,
        }));
    };
    let count = |v: &str| -> Result<u64> {
        match v.trim().parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => bail!("--split-shards {text:?}: expected a shard count of at least 1, got {v:?}"),
        }
    };
    if !text.contains('=') {
        let n = count(text)?;
        shards[1..].iter_mut().for_each(|s| *s = Some(n));
    } else {
        for item in text.split(',') {
            let Some((name, v)) = item.split_once('=') else {
                bail!("--split-shards {text:?}: expected N, or NAME=N,... (e.g. val=2,test=2)");
            };
            let name = name.trim();
            match names.iter().position(|n| n == name) {
                Some(0) => bail!(
                    "--split-shards {name}=…: the first split, {name}, is sized by --shards, --shard-size or --gpus"
                ),
                Some(k) => shards[k] = Some(count(v)?),
                None => bail!(
                    "--split-shards: no split is named {name:?} (--split names {})",
                    names.join(", ")
                ),
            }
        }
    }
    Ok(Some(Splits {
        spec: spec.clone(),
        shards,
    }))
}

/// The shard count's rule (exactly one of --shards, --shard-size, --gpus) and the GPU layout.
fn sizing(args: &RunArgs) -> Result<(Sizing, Option<GpuLayout>)> {
    let size = |s: &String| -> Result<u64> {
        let v = parse_size(s).map_err(|e| anyhow!("--shard-size {s:?}: {e}"))?;
        if v == 0 {
            bail!("--shard-size must be more than 0 bytes");
        }
        Ok(v)
    };
    // clap's `requires` yields to `conflicts_with` (--workers 2 --shards 3 passed it).
    if args.gpus.is_none() && (args.workers.is_some() || args.batch_size.is_some()) {
        bail!("--workers and --batch-size describe the GPU layout: use them with --gpus");
    }
    let sizing = match (args.shards, &args.shard_size, args.gpus) {
        (Some(n), _, _) => Sizing::Count(at_least_one("--shards", n)?),
        (None, size_arg, Some(g)) => Sizing::Gpus {
            gpus: at_least_one("--gpus", g)?,
            workers: at_least_one("--workers", args.workers.unwrap_or(1))?,
            size: size_arg
                .as_ref()
                .map(size)
                .transpose()?
                .unwrap_or(crate::plan::sizing::DEFAULT_SHARD_SIZE),
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
            batch_size: args
                .batch_size
                .map(|b| at_least_one("--batch-size", b))
                .transpose()?,
        }),
        _ => None,
    };
    Ok((sizing, gpus))
}

fn at_least_one(flag: &str, v: u64) -> Result<u64> {
    if v == 0 {
        bail!("{flag} must be at least 1");
    }
    Ok(v)
}

/// Flags that act on a written output are refused where nothing is written (`--dry-run`; `plan`
/// does not take them at all, see [`super::args::RUN_ONLY`]), and `--json` (a plan's) where a
/// run writes.
fn check_flags_fit_the_command(args: &RunArgs, dry_run: bool) -> Result<()> {
    if args.resume && dry_run {
        bail!("--resume continues a run that wrote part of its output: not with --dry-run, which writes nothing");
    }
    if args.verify && dry_run {
        bail!("--verify checks a written output: not with --dry-run or `reshard plan`");
    }
    if args.report.is_some() && dry_run {
        bail!("--report writes the run's summary: not with --dry-run, which writes nothing");
    }
    if args.json && !dry_run {
        bail!("--json prints a plan: use it with --dry-run or `reshard plan`");
    }
    Ok(())
}

/// Every required flag that is missing, named in one message (not one per attempt); the usage
/// lines in [`super::args`] show the same.
fn missing_required(args: &RunArgs, dry_run: bool) -> Result<()> {
    let sizing = args.shards.is_some() || args.shard_size.is_some() || args.gpus.is_some();
    // A plan of one shard is the same for every seed; other orders are not random.
    let seed = args.seed.is_some()
        || args.order != OrderBy::Shuffle
        || (dry_run && args.shards == Some(1));
    let missing: Vec<&str> = [
        (
            args.inputs.is_empty() && args.files.input_files.is_empty(),
            "--input SPEC (the shards to read) or --input-files ROOT (a tree of files to pack)",
        ),
        (
            args.output.is_none() && !dry_run,
            "--output DIR (where to write; or plan only with --dry-run)",
        ),
        (
            !sizing,
            "one of --shards N, --shard-size SIZE or --gpus G (the shard count)",
        ),
        (
            !seed,
            if dry_run {
                "--seed S (the plan's bytes per shard depend on which samples the seeded shuffle \
                 puts in each shard; give the seed `run` will use)"
            } else {
                "--seed S (it fixes the shuffle, so that a rerun or another --epoch is reproducible)"
            },
        ),
    ]
    .into_iter()
    .filter_map(|(m, what)| m.then_some(what))
    .collect();
    match missing.as_slice() {
        [] => Ok(()),
        [one] => bail!("missing {one}"),
        many => bail!("missing {} flags: {}", many.len(), many.join("; ")),
    }
}

/// `--output` with `{epoch}` replaced; only a plan may go without one.
fn output(args: &RunArgs, dry_run: bool) -> Result<Option<PathBuf>> {
    Ok(match (&args.output, dry_run) {
        (Some(o), _) if o.as_os_str().is_empty() => bail!("--output must not be empty"),
        (Some(o), _) => Some(PathBuf::from(epoch_template(o, args.epoch))),
        (None, true) => None,
        (None, false) => bail!("--output DIR is required (or plan only with --dry-run)"),
    })
}

/// An output on object storage (`s3://`, `gs://`, `az://`: a sink without positioned writes or
/// renames): the local path it is staged at (`--scratch`, default `$TMPDIR`, in
/// `reshard-scratch/STORE/BUCKET/KEY`, STORE naming the store: [`crate::storage::object_place`]) and the URL it is uploaded to. `--link` acts on a file system
/// only; `--keep` on the uploaded series, not on the staged copy.
fn staged(args: &RunArgs, output: Option<PathBuf>) -> Result<(Option<PathBuf>, Option<PathBuf>)> {
    let Some((url, scheme)) = output
        .as_ref()
        .filter(|o| {
            // Assembled where it can be written at offsets and committed by its manifest
            // (job::destination::life), by the one predicate over the sink's capabilities.
            crate::storage::sink(o).capabilities().commits_by_manifest()
        })
        .and_then(|o| Some((o.clone(), crate::storage::object_scheme(o)?)))
    else {
        return Ok((output, None));
    };
    if args.link.is_some() {
        bail!("--link points a symbolic link at the output: object storage has no links (point the readers at the output's index.json instead)");
    }
    let text = url.to_string_lossy();
    let rest = text
        .strip_prefix(scheme)
        .and_then(|r| r.strip_prefix("://"))
        .unwrap_or(&text)
        .trim_end_matches('/');
    if rest
        .split('/')
        .any(|p| p.is_empty() || p == "." || p == "..")
        || !rest.contains('/')
    {
        bail!("--output {text}: expected {scheme}://BUCKET/PREFIX/NAME (a key under the bucket, no empty, '.' or '..' parts)");
    }
    let scratch = scratch(args);
    // Each store's outputs apart, so that `s3://b/x` and `gs://b/x`, or `s3://b/x` at two
    // endpoints, never share a staged copy: two runs of different outputs would remove each
    // other's (each holds only its own output's lock).
    let place = crate::storage::object_place(&url).unwrap_or_else(|| scheme.to_string());
    let local = scratch.join("reshard-scratch").join(place).join(rest);
    Ok((
        Some(local),
        Some(PathBuf::from(format!("{scheme}://{rest}"))),
    ))
}

/// `--scratch`, else `$TMPDIR`, else `/tmp`: where an object-store output is staged and
/// object-store input shards are spooled.
fn scratch(args: &RunArgs) -> PathBuf {
    args.scratch.clone().unwrap_or_else(|| {
        std::env::var_os("TMPDIR").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from)
    })
}

/// Replaces `{epoch}` in a path with the epoch number: `--output 'data/epoch-{epoch}'`.
fn epoch_template(path: &Path, epoch: u64) -> String {
    path.to_string_lossy().replace(EPOCH, &epoch.to_string())
}

/// Resolves `--keep`: only over a series of outputs, which `{epoch}` in the output directory's
/// own name makes (without it reshard cannot tell older epochs from unrelated directories).
fn keep_series(keep: Option<usize>, output: Option<&Path>) -> Result<Option<Keep>> {
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
    let parent = output.parent().unwrap_or(Path::new(""));
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

/// Output shards are named PREFIX-000000.tar inside the output directory, never hidden.
fn check_prefix(prefix: &str) -> Result<()> {
    if prefix.is_empty() || prefix.contains('/') || prefix.starts_with('.') {
        bail!(
            "--prefix {prefix:?}: expected a non-empty file name prefix without '/' that does not start with '.'"
        );
    }
    Ok(())
}

/// An extension as given (`jpg`, `.jpg`, ` jpg`) as the key map and the indexer compare it.
fn extension(text: &str) -> &str {
    text.trim().trim_start_matches('.')
}

/// --order, --descending, --missing, --stratify-by, --label-limit, --key-map and --unmatched,
/// checked together (some combinations cannot work).
fn order(args: &RunArgs, equalize: Equalize) -> Result<OrderSpec> {
    let label_limit = parse_size(&args.label_limit)
        .map_err(|e| anyhow!("--label-limit {:?}: {e}", args.label_limit))?;
    let stratify_by = args.stratify_by.as_deref().map(extension);
    if stratify_by.is_some_and(str::is_empty) {
        bail!("--stratify-by needs a member extension, e.g. --stratify-by cls");
    }
    let order = OrderSpec {
        by: args.order.clone(),
        descending: args.descending,
        missing: args.missing,
        stratify_by: stratify_by.map(str::to_string),
        label_limit,
        key_map: args.key_map.clone(),
        unmatched: args.unmatched.clone(),
    };
    crate::plan::order::validate(&order, args.balance == Balance::Bytes, equalize)?;
    Ok(order)
}

/// `--seed`, which only a random order needs, and only a plan of one shard can do without.
fn seed(args: &RunArgs, order: &OrderSpec, dry_run: bool, sizing: Sizing) -> Result<u64> {
    let random = order.by == OrderBy::Shuffle;
    // A plan of one shard is the same for every seed (all samples, all bytes, in it); with
    // more, which samples the shuffle puts in each shard sets the bytes per shard (and with
    // --balance bytes the samples per shard), so the plan needs the seed `run` will use.
    Ok(match args.seed {
        Some(s) => s,
        None if !random => 0,
        None if dry_run && sizing == Sizing::Count(1) => 0,
        None if dry_run => bail!(
            "--seed S is required: the plan's bytes per shard depend on which samples the seeded shuffle puts in each shard; give the seed `run` will use"
        ),
        None => bail!(
            "--seed S is required: it fixes the shuffle, so that a rerun (or another epoch with --epoch) is reproducible"
        ),
    })
}

/// `--energon` (with its dataset.yaml flags) and `--dali-index`.
///
/// # Errors
/// A loader index with compressed shards (both loaders read plain tars at offsets), `--energon`
/// with `--equalize pad` (a repeated sample repeats its key), shard names energon cannot read,
/// a sample type that is not a class name or a field map that is not a JSON object.
fn loader_indexes(args: &RunArgs, equalize: Equalize) -> Result<LoaderIndexes> {
    let compressed = args.compress != CompressArg::None;
    if compressed && (args.energon || args.dali_index) {
        let flag = if args.energon {
            "--energon"
        } else {
            "--dali-index"
        };
        bail!("{flag} indexes plain tar shards, which the loader reads at byte offsets: not with --compress");
    }
    if !args.energon {
        // Checked here, not by clap's `requires`, which would answer `plan
        // --energon-sample-type` with "--energon is required" instead of refusing both.
        if args.energon_sample_type.is_some() || args.energon_field_map.is_some() {
            bail!("--energon-sample-type and --energon-field-map describe energon's dataset.yaml: use them with --energon");
        }
        return Ok(LoaderIndexes {
            energon: None,
            energon_key_index: false,
            dali: args.dali_index,
        });
    }
    // Only the key index needs unique keys; the training reader reads samples by offset.
    if equalize == Equalize::Pad && !args.energon_no_sqlite {
        bail!("--energon with --equalize pad: a repeated sample repeats its key, and energon's index.sqlite requires unique keys; use --equalize drop or none, or --energon-no-sqlite");
    }
    if let Some(problem) =
        crate::output::energon::shard_name_problem(&crate::output::shard_file_name(&args.prefix, 0))
    {
        bail!("--energon with --prefix {:?}: {problem}", args.prefix);
    }
    let dataset = match (&args.energon_sample_type, &args.energon_field_map) {
        (None, _) => EnergonDataset::Crude,
        (Some(t), _) if t == "CrudeWebdataset" => EnergonDataset::Crude,
        (Some(t), _) if !is_class_name(t) => {
            bail!("--energon-sample-type {t:?}: expected a class name of megatron.energon, e.g. CaptioningSample")
        }
        (Some(t), None) => bail!("--energon-sample-type {t}: needs --energon-field-map, e.g. '{{\"image\": \"jpg\", \"caption\": \"txt\"}}'"),
        (Some(t), Some(map)) => EnergonDataset::Typed {
            sample_type: t.clone(),
            field_map: field_map(map)?,
        },
    };
    Ok(LoaderIndexes {
        energon: Some(dataset),
        energon_key_index: !args.energon_no_sqlite,
        dali: args.dali_index,
    })
}

fn is_class_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The field map as compact JSON, checked to be an object.
fn field_map(text: &str) -> Result<String> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v @ serde_json::Value::Object(_)) => Ok(v.to_string()),
        Ok(_) => bail!("--energon-field-map {text:?}: expected a JSON object of field names, e.g. '{{\"image\": \"jpg\"}}'"),
        Err(e) => bail!("--energon-field-map {text:?}: not JSON ({e})"),
    }
}

/// What the indexer checks of each sample, and what it keeps of it for the order.
fn rules(args: &RunArgs, order: &OrderSpec, loaders: &LoaderIndexes) -> Rules {
    Rules {
        require_ext: args
            .require_ext
            .iter()
            .map(|e| extension(e).to_string())
            .filter(|e| !e.is_empty())
            .collect(),
        on_incomplete: args.on_incomplete,
        // Energon's key index refuses a key twice: --energon makes every duplicate an error,
        // unless --energon-no-sqlite leaves the index out.
        on_duplicate: if loaders.energon_key_index {
            OnDuplicate::Unique
        } else {
            args.on_duplicate
        },
        keep_keys: order.needs_keys(),
        read_member: order.member().map(|e| (e.to_string(), order.label_limit)),
        loader_names: LoaderNames {
            energon: loaders.energon.is_some(),
            dali: loaders.dali,
        },
        ignore_zeros: args.ignore_zeros,
    }
}

/// `verify` arguments as a [`VerifyConfig`].
///
/// # Errors
/// `--plot` names neither an SVG nor a PNG file.
pub(crate) fn verify_config(args: &VerifyArgs) -> Result<VerifyConfig> {
    if let Some(plot) = &args.plot {
        format_of(plot)?;
    }
    if args.inputs.is_empty() && args.files.input_files.is_empty() {
        bail!(
            "verify needs the input: --input SPEC or --input-files ROOT, as given to `reshard run`"
        );
    }
    Ok(VerifyConfig {
        inputs: args.inputs.clone(),
        files: files(&args.files)?,
        output: args.output.clone(),
        json: args.json,
        plot: args.plot.clone(),
        ignore_zeros: args.ignore_zeros,
    })
}

mod generate;
#[cfg(test)]
mod tests;

pub(crate) use generate::generate_config;
