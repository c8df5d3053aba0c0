//! The command line as clap parses it: these structs and the values only the command line
//! knows (such as [`CompressArg`]). Their doc comments are the `--help` text. Nothing here checks
//! more than clap does; [`super::resolve`] turns them into configurations.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::{Balance, IoPriority, ProgressMode};
use crate::tar::{OnDuplicate, OnIncomplete};

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
    #[command(override_usage = RUN_USAGE, mut_args = short_help)]
    Run(RunArgs),
    /// Print what `run` would do with the same flags (reads tar headers only, writes nothing).
    /// Like `run --dry-run`, but takes only the flags that shape the plan: not --output or the
    /// flags that act on a written output or on the data exchange.
    #[command(override_usage = PLAN_USAGE, mut_args = short_help)]
    Plan(PlanArgs),
    /// Write a synthetic WebDataset (deterministic from a seed) for tests, examples and benchmarks.
    Generate(GenerateArgs),
    /// Check an output against its input: exactly the input's samples (by digest), every shard a
    /// sound tar matching index.json; report the shuffle quality. Exit 0 only if all holds.
    #[command(override_usage = VERIFY_USAGE)]
    Verify(VerifyArgs),
    /// Print a man page (roff) to stdout: reshard(1), or with COMMAND that command's page with
    /// all its flags, e.g. `reshard man run > ~/.local/share/man/man1/reshard-run.1`.
    Man {
        /// The command whose page to print (reshard's own without it).
        #[arg(value_parser = MAN_PAGES)]
        command: Option<String>,
    },
    /// Print a shell completion script to stdout, e.g. `reshard completions bash >
    /// ~/.local/share/bash-completion/completions/reshard`.
    Completions {
        /// The shell to complete for: bash, zsh, fish (also elvish, powershell).
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// The subcommands with a man page of their own (`reshard man COMMAND`).
pub(crate) const MAN_PAGES: [&str; 6] = ["run", "plan", "verify", "generate", "completions", "man"];

/// `run`'s usage line: what it requires (checked together in [`super::resolve`], so that every
/// missing one is named at once). `--seed` is not needed by `--order key` or `content`.
const RUN_USAGE: &str = "reshard run --input <SPEC>... --output <DIR> \
    <--shards <N>|--shard-size <SIZE>|--gpus <G>> --seed <S> [OPTIONS]";
/// `plan`'s usage line: as `run`'s, without an output.
const PLAN_USAGE: &str = "reshard plan --input <SPEC>... \
    <--shards <N>|--shard-size <SIZE>|--gpus <G>> --seed <S> [OPTIONS]";

/// The flags `run -h` and `plan -h` show, so that the short help fits a screen; `--help` shows
/// every flag, under its heading.
const SHORT_HELP: [&str; 14] = [
    "inputs",
    "output",
    "shards",
    "shard_size",
    "gpus",
    "workers",
    "seed",
    "epoch",
    "equalize",
    "order",
    "split",
    "keep",
    "resume",
    "dry_run",
];

/// [`SHORT_HELP`]'s rule for one flag.
fn short_help(arg: clap::Arg) -> clap::Arg {
    let id = arg.get_id().as_str();
    if SHORT_HELP.contains(&id) || id == "help" {
        arg
    } else {
        arg.hide_short_help(true)
    }
}

/// `verify`'s usage line: `--input` repeats, as for `run` (clap's own line hid it).
const VERIFY_USAGE: &str = "reshard verify --input <SPEC>... --output <DIR> [OPTIONS]";

/// `run`'s flags. Headings group them in `--help`; `plan` takes those not in [`RUN_ONLY`].
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Input shards: a shard (.tar, .tar.gz, .tgz or .tar.zst), a directory (its shards, sorted
    /// by name), a brace pattern such as 'data/train-{000000..000127}.tar', or @list.txt (one
    /// path per line).
    ///
    /// Repeat to concatenate; the expanded order is the canonical sample order.
    #[arg(
        help_heading = "Input",
        long = "input",
        short = 'i',
        value_name = "SPEC"
    )]
    pub(crate) inputs: Vec<String>,

    #[command(flatten)]
    pub files: FilesArgs,

    /// Output directory. Created atomically: it appears only once every shard is complete.
    /// Required unless planning (`reshard plan`, `--dry-run`).
    #[arg(
        help_heading = "Output and loaders",
        long,
        short = 'o',
        value_name = "DIR"
    )]
    pub(crate) output: Option<PathBuf>,

    /// With an `s3://` output: the directory the output is assembled in before it is uploaded
    /// (shared by every rank, or each node's own disk: then each writer uploads its own shards).
    /// Default: $TMPDIR (else /tmp), in reshard-scratch/STORE/BUCKET/KEY (STORE: the scheme,
    /// with a hash of its endpoint or account variables where set). Input shards on object
    /// storage beyond a quarter of --mem-limit are spooled here (node-local is enough), each
    /// fetched once per run; removed when the exchange ends.
    #[arg(help_heading = "Output and loaders", long, value_name = "DIR")]
    pub(crate) scratch: Option<PathBuf>,

    /// Number of output shards. Exactly one of --shards, --shard-size and --gpus chooses it.
    #[arg(help_heading = "Sizing", long, value_name = "N", conflicts_with_all = ["shard_size", "gpus"])]
    pub(crate) shards: Option<u64>,

    /// Target mean shard size, e.g. 512MiB: the shard count whose mean size is nearest. With
    /// --gpus, the multiple of GPUs x workers nearest it (default 512MiB).
    #[arg(help_heading = "Sizing", long, value_name = "SIZE")]
    pub(crate) shard_size: Option<String>,

    /// Number of GPUs (training ranks): the shard count is a multiple of GPUs x --workers.
    #[arg(help_heading = "Sizing", long, value_name = "G")]
    pub(crate) gpus: Option<u64>,

    /// Data loader workers per GPU (with --gpus).
    #[arg(help_heading = "Sizing", long, value_name = "W", requires = "gpus")]
    pub(crate) workers: Option<u64>,

    /// Batch size per GPU (with --gpus): the manifest reports full batches per GPU.
    #[arg(help_heading = "Sizing", long, value_name = "B", requires = "gpus")]
    pub(crate) batch_size: Option<u64>,

    /// When samples do not divide evenly: none, drop or pad.
    ///
    /// none (shard counts differ by at most one), drop (the
    /// N mod S samples at the end of the permutation are left out), pad (samples from the start
    /// of the permutation are repeated). Dropped and repeated keys are listed in index.json.
    #[arg(help_heading = "Sizing", long, value_enum, default_value_t = EqualizeArg::None)]
    pub(crate) equalize: EqualizeArg,

    /// Cut shards by equal sample counts, or by near-equal bytes (counts then vary).
    #[arg(help_heading = "Sizing", long, value_enum, default_value_t = Balance::Count)]
    pub(crate) balance: Balance,

    /// Start even where the output's file system has less free space than the plan needs (by
    /// statvfs; a quota or a file system that compresses may allow more).
    #[arg(help_heading = "Output and loaders", long)]
    pub(crate) no_space_check: bool,

    /// Seed of the global shuffle (required unless --order key or content, which are not random;
    /// a plan of --shards 1 is the same for any seed and needs none).
    #[arg(help_heading = "Order", long, value_name = "S")]
    pub(crate) seed: Option<u64>,

    /// Epoch number: the same seed with another epoch gives an unrelated order.
    #[arg(help_heading = "Epochs", long, value_name = "E", default_value_t = 0)]
    pub(crate) epoch: u64,

    /// Output file name prefix: shards are named PREFIX-000000.tar, PREFIX-000001.tar, ...
    #[arg(
        help_heading = "Output and loaders",
        long,
        value_name = "NAME",
        default_value = "shard"
    )]
    pub(crate) prefix: String,

    /// Memory budget per rank for data in flight (send and receive buffers), e.g. 512MiB, 4GiB.
    #[arg(
        help_heading = "Performance",
        long,
        value_name = "SIZE",
        default_value = "1GiB"
    )]
    pub(crate) mem_limit: String,

    /// Replace an output directory that exists and is not empty: only an output reshard wrote
    /// (its index.json and .reshard/); anything else is refused before any work.
    #[arg(help_heading = "Output and loaders", long)]
    pub(crate) force: bool,

    /// After publishing, check the output against the input as `reshard verify` does (reads
    /// both once more); exit 1 if anything does not hold.
    #[arg(help_heading = "Output and loaders", long)]
    pub(crate) verify: bool,

    /// Extensions every sample must have, e.g. jpg,cls (see --on-incomplete).
    #[arg(
        help_heading = "Input",
        long,
        value_name = "EXT,...",
        value_delimiter = ','
    )]
    pub(crate) require_ext: Vec<String>,

    /// A sample lacking a --require-ext member: abort (naming file, key and what is missing),
    /// warn (keep it), or exclude (leave it out, counted in index.json).
    #[arg(help_heading = "Input", long, value_enum, default_value_t = OnIncomplete::Abort)]
    pub(crate) on_incomplete: OnIncomplete,

    /// A repeated extension within a sample, a sample whose members are not adjacent, or the
    /// same key in two samples: abort (naming where), warn, or keep. Checked while indexing
    /// tar headers (not for inputs read through a saved index: reshard's own outputs).
    #[arg(help_heading = "Input", long, value_enum, default_value_t = OnDuplicate::Abort)]
    pub(crate) on_duplicate: OnDuplicate,

    /// Read past zero blocks in an input, as GNU tar --ignore-zeros does: for concatenated
    /// archives (`cat a.tar b.tar`) and lone zero blocks. Without it, data after an input's
    /// first zero block is an error naming the file and offset (its samples would be lost).
    #[arg(help_heading = "Input", long)]
    pub(crate) ignore_zeros: bool,

    /// Compress the output shards: none (plain .tar, the default), gz (.tar.gz) or zst
    /// (.tar.zst). Each writer compresses its shards once they are complete, streaming.
    #[arg(help_heading = "Output and loaders", long, value_enum, default_value_t = CompressArg::None)]
    pub(crate) compress: CompressArg,

    /// Add each shard's MD5 (`md5sum`) to index.json; wids checks it after a download. Costs a
    /// read-back of the output.
    #[arg(help_heading = "Output and loaders", long)]
    pub(crate) checksum: bool,

    /// Write Megatron-Energon's metadata with the output (.nv-meta/ and NAME.tar.idx beside each
    /// shard), so that `energon prepare` is not needed. Energon's index.sqlite requires unique
    /// sample keys: a duplicate is then an error whatever --on-duplicate says (unless
    /// --energon-no-sqlite).
    #[arg(help_heading = "Output and loaders", long)]
    pub(crate) energon: bool,

    /// With --energon: leave out .nv-meta/index.sqlite, the index of every sample by key. Energon's
    /// training reader needs only the .tar.idx files, .info.json and split.yaml; looking samples
    /// up by key (joined datasets, auxiliary datasets of a metadataset, `energon mount`) needs
    /// the index. Saves rank 0 a pass over every sample's rows. Keys need not be unique then.
    #[arg(help_heading = "Output and loaders", long, requires = "energon")]
    pub(crate) energon_no_sqlite: bool,

    /// With --energon: the sample type .nv-meta/dataset.yaml names (a class of megatron.energon,
    /// e.g. CaptioningSample) instead of CrudeWebdataset; needs --energon-field-map.
    #[arg(help_heading = "Output and loaders", long, value_name = "CLASS")]
    pub(crate) energon_sample_type: Option<String>,

    /// With --energon-sample-type: its field map as a JSON object, e.g.
    /// '{"image": "jpg", "caption": "txt"}'.
    #[arg(help_heading = "Output and loaders", long, value_name = "JSON")]
    pub(crate) energon_field_map: Option<String>,

    /// Write DALI's webdataset index beside each shard (NAME.idx for NAME.tar, the text format
    /// of DALI's wds2idx), for fn.readers.webdataset's index_paths.
    #[arg(help_heading = "Output and loaders", long)]
    pub(crate) dali_index: bool,

    /// A directory of saved indexes (`NAME.reshard-layout` files, as reshard leaves in
    /// `OUTPUT/.reshard`) for the input shards. Without it, an input directory's own `.reshard`
    /// is used when present: the next epoch's run over an output skips indexing. Saved indexes
    /// whose shard changed (size or modification time) are ignored with a warning.
    #[arg(help_heading = "Input", long, value_name = "PATH")]
    pub(crate) index: Option<PathBuf>,

    /// After publishing, atomically point the symbolic link PATH at the new output (readers of
    /// PATH always see a complete dataset).
    #[arg(help_heading = "Epochs", long, value_name = "PATH")]
    pub(crate) link: Option<PathBuf>,

    /// After publishing, remove older epochs of this --output series, keeping the K highest epoch
    /// numbers (the new output always among them).
    ///
    /// Needs {epoch} in the last component of
    /// --output, e.g. --output 'data/epoch-{epoch}'. Removes only directories next to the
    /// output whose name is that template with another epoch number (digits, as --epoch writes
    /// them: data/epoch-3, not data/epoch-03 or data/epoch-notes) that hold reshard's own
    /// index.json and .reshard directory (with an s3:// output: such prefixes, every object
    /// under them); never the new output, never the --link target, nothing else.
    #[arg(help_heading = "Epochs", long, value_name = "K")]
    pub(crate) keep: Option<usize>,

    /// Seconds a rank may stop answering before the job ends with exit 75 (a rank froze or
    /// died, a node or its network stopped), in any phase from indexing to publishing: each rank
    /// beats from a thread of its own, so a slow rank is never taken for a stopped one. Counted
    /// on each watching rank's own running time: a job suspended as a whole (scontrol suspend, a
    /// paused VM) goes on when continued. 0 waits forever.
    #[arg(
        help_heading = "Resume",
        long,
        value_name = "SECONDS",
        default_value_t = 120
    )]
    pub(crate) stall_timeout: u64,

    /// Seconds a lock on the output must show no heartbeat before a run takes it over, when
    /// the lock's pid cannot be checked from here (another machine, boot or PID namespace;
    /// within one boot and PID namespace a dead pid frees it at once). Long enough for a job its scheduler suspends
    /// (`scontrol suspend`): a run taken over while suspended fails when it wakes, publishing
    /// nothing.
    #[arg(help_heading = "Resume", long, value_name = "SECONDS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) lock_stale_after: u64,

    /// Also write the run summary as JSON to FILE (phases with seconds, per-rank bytes and peak
    /// memory), for benchmarks and monitoring.
    #[arg(help_heading = "Diagnostics", long, value_name = "FILE")]
    pub(crate) report: Option<PathBuf>,

    /// Output order: shuffle (the seeded global permutation), key (sample keys in byte order),
    /// or content:EXT[:int|float|str] (the content of each sample's .EXT member, e.g.
    /// content:cls:int; str when the type is left out).
    ///
    /// Ties go by input order.
    #[arg(
        help_heading = "Order",
        long,
        value_name = "ORDER",
        default_value = "shuffle"
    )]
    pub(crate) order: crate::plan::order::OrderBy,

    /// Reverse --order key or content (ties still go by input order).
    #[arg(help_heading = "Order", long)]
    pub(crate) descending: bool,

    /// A sample without the member --order content or --stratify-by reads, or whose content does
    /// not parse: error (naming file and key), or last (after all others; its own stratum).
    #[arg(help_heading = "Order", long, value_enum, value_name = "WHAT", default_value_t = crate::plan::order::Missing::Error)]
    pub(crate) missing: crate::plan::order::Missing,

    /// Representative shards: every shard gets each label's samples (the content of member
    /// .EXT) in proportion to the label's share of the dataset, within ±1, still shuffled.
    #[arg(help_heading = "Order", long, value_name = "EXT")]
    pub(crate) stratify_by: Option<String>,

    /// Largest member read as a label or order value (--order content, --stratify-by); a larger
    /// one is an error, which guards against reading payloads by mistake.
    #[arg(
        help_heading = "Order",
        long,
        value_name = "SIZE",
        default_value = "4KiB"
    )]
    pub(crate) label_limit: String,

    /// Route samples into named groups of shards by key (AIStore dsort's external key map): JSON
    /// {"fish-%06d.tar": ["regex", ...]} or lines `key<TAB>template`. Each group is sized and
    /// balanced on its own with the sizing flags and ordered by --order.
    #[arg(help_heading = "Sizing", long, value_name = "FILE")]
    pub(crate) key_map: Option<PathBuf>,

    /// A sample no key-map group claims: error, skip (left out, counted), or group:TEMPLATE.
    #[arg(
        help_heading = "Sizing",
        long,
        value_name = "WHAT",
        default_value = "error"
    )]
    pub(crate) unmatched: crate::key_map::Unmatched,

    /// Train/validation/test splits, e.g. train=0.98,val=0.01,test=0.01.
    ///
    /// Ratios adding up to 1;
    /// percentages such as 1%; or sample counts, one split may be `rest`. Samples are dealt to
    /// splits by the seed alone (the same at any --epoch); each split is written to
    /// OUTPUT/NAME/ with its own index.json. The first split is sized by --shards, --shard-size
    /// or --gpus, the others by --split-shards.
    #[arg(help_heading = "Sizing", long, value_name = "NAME=SHARE,...")]
    pub(crate) split: Option<crate::plan::split::SplitSpec>,

    /// Shard count of the splits after the first: N for each, or NAME=N,... per split. A split
    /// left out gets the shard count whose mean size is nearest the first split's mean shard size
    /// (with --gpus, the multiple of the GPU count nearest it, so every GPU gets shards).
    #[arg(
        help_heading = "Sizing",
        long,
        value_name = "N|NAME=N,...",
        requires = "split"
    )]
    pub(crate) split_shards: Option<String>,
    /// Continue a run that failed (same arguments) from its last checkpoint.
    ///
    /// Samples already
    /// durably in its staging directory are neither read nor sent again, and the output is
    /// byte-identical to an uninterrupted run. Refused (exit 2), naming what differs, when the
    /// inputs or the arguments that shape the output changed. With nothing to continue, starts
    /// from the beginning.
    #[arg(help_heading = "Resume", long)]
    pub(crate) resume: bool,

    /// Seconds between the exchange's checkpoints (each writer syncs, rank 0 records which samples
    /// are durable, for --resume); 0 checkpoints after every round. A checkpoint also comes at
    /// once on SIGINT or SIGTERM, before the job ends; after SIGKILL, --resume redoes about
    /// this much of the exchange.
    #[arg(
        help_heading = "Resume",
        long,
        value_name = "SECONDS",
        default_value_t = 30
    )]
    pub(crate) checkpoint_every: u64,

    /// Progress on rank 0's stderr while indexing and exchanging: auto (a bar when rank 0's
    /// stderr is a terminal, as under `srun --pty`; lines otherwise, as under `mpirun`), bar,
    /// lines, or none.
    #[arg(help_heading = "Diagnostics", long, value_enum, value_name = "HOW", default_value_t = ProgressMode::Auto)]
    pub(crate) progress: ProgressMode,

    /// Seconds between two progress lines.
    #[arg(
        help_heading = "Diagnostics",
        long,
        value_name = "SECONDS",
        default_value_t = 5.0
    )]
    pub(crate) progress_interval: f64,

    /// Plan only: also draw the plan to FILE (.svg or .png): histograms of the output shards'
    /// bytes and samples, and which input shards each output shard draws from next to what a
    /// uniform random permutation gives.
    #[arg(help_heading = "Diagnostics", long, value_name = "FILE")]
    pub(crate) plot: Option<PathBuf>,

    /// Plan only: index, print the plan, write nothing.
    ///
    /// Its --output, --force, --link and --keep are
    /// checked as `run` would (what --keep would remove is printed), nothing is changed.
    #[arg(help_heading = "Diagnostics", long)]
    pub(crate) dry_run: bool,

    /// Print the plan as JSON (with --dry-run or `reshard plan`).
    #[arg(help_heading = "Diagnostics", long)]
    pub(crate) json: bool,

    /// Largest single MPI exchange per rank, in bytes (exchanges are split into rounds below it).
    /// Only useful for testing the round logic.
    #[arg(help_heading = "Performance", long, value_name = "SIZE", hide = true)]
    pub(crate) max_round_bytes: Option<String>,

    /// Most bytes per second the whole job reads from its input, e.g. 2GiB/s or 500MB/s: shared
    /// equally among the ranks, each pacing its own reads. `plan` says how long the run then
    /// takes at least.
    ///
    /// It limits bytes, not requests: every byte read from storage counts, the header-only
    /// index's too (a few percent of the input for samples of 100 KiB, most of it for samples of
    /// a few KiB, which it reads through), and `plan`'s time includes them.
    #[arg(
        help_heading = "Sharing the machine",
        long,
        value_name = "RATE",
        allow_hyphen_values = true
    )]
    pub(crate) max_read_rate: Option<String>,

    /// Most bytes per second the whole job writes to its output, e.g. 1GiB/s (as
    /// --max-read-rate).
    #[arg(
        help_heading = "Sharing the machine",
        long,
        value_name = "RATE",
        allow_hyphen_values = true
    )]
    pub(crate) max_write_rate: Option<String>,

    /// I/O priority of every rank: idle (the disk serves reshard only when nothing else asks),
    /// low (best effort, lowest level), normal (as started). Honoured by the BFQ scheduler.
    #[arg(help_heading = "Sharing the machine", long, value_enum, default_value_t = IoPriority::Normal)]
    pub(crate) io_priority: IoPriority,

    /// CPU nice value of every rank (0-19; lower needs privileges).
    #[arg(
        help_heading = "Sharing the machine",
        long,
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub(crate) nice: Option<i32>,
}

/// The flags `plan` refuses, by clap id, with the flag and why only `run` acts on it. They stay
/// defined for `plan`, hidden from its help, so that giving one is answered with why instead of
/// clap's "unexpected argument" (or, worse, silently accepted).
pub(crate) const RUN_ONLY: &[(&str, &str, &str)] = &[
    ("output", "--output", "it names the output"),
    ("force", "--force", "it replaces an existing output"),
    ("verify", "--verify", "it checks the written output"),
    ("compress", "--compress", "it compresses the written shards"),
    ("checksum", "--checksum", "it digests the written shards"),
    (
        "energon",
        "--energon",
        "it writes Megatron-Energon's metadata",
    ),
    (
        "energon_sample_type",
        "--energon-sample-type",
        "it goes into energon's dataset.yaml",
    ),
    (
        "energon_field_map",
        "--energon-field-map",
        "it goes into energon's dataset.yaml",
    ),
    ("dali_index", "--dali-index", "it writes DALI's index files"),
    ("link", "--link", "it points a link at the new output"),
    ("keep", "--keep", "it removes older outputs"),
    (
        "resume",
        "--resume",
        "it continues a run that wrote part of its output",
    ),
    (
        "checkpoint_every",
        "--checkpoint-every",
        "it times the exchange's checkpoints",
    ),
    (
        "stall_timeout",
        "--stall-timeout",
        "it watches the data exchange",
    ),
    (
        "mem_limit",
        "--mem-limit",
        "it sizes the data exchange's buffers",
    ),
    (
        "max_round_bytes",
        "--max-round-bytes",
        "it splits the data exchange into rounds",
    ),
    ("report", "--report", "it writes the run's summary"),
    (
        "no_space_check",
        "--no-space-check",
        "it checks the output's free space",
    ),
    (
        "lock_stale_after",
        "--lock-stale-after",
        "it takes the output's lock",
    ),
    (
        "dry_run",
        "--dry-run",
        "`reshard plan` is already a dry run",
    ),
];

/// `plan`'s flags: [`RunArgs`] less [`RUN_ONLY`].
#[derive(Debug)]
pub struct PlanArgs(pub(crate) RunArgs);

impl PlanArgs {
    fn refuse_run_only(m: &clap::ArgMatches) -> Result<(), clap::Error> {
        let given = |id: &str| m.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
        let Some((_, flag, why)) = RUN_ONLY.iter().find(|(id, ..)| given(id)) else {
            return Ok(());
        };
        // Formatted with `plan`'s command, so that the usage line under it is plan's.
        let mut cli = <Cli as clap::CommandFactory>::command();
        cli.build();
        let plan = cli
            .find_subcommand_mut("plan")
            .expect("plan is a subcommand");
        Err(clap::Error::raw(
            clap::error::ErrorKind::UnknownArgument,
            format!(
                "{flag} is for `reshard run`: {why}; `reshard plan` moves and writes nothing, so \
                 leave it out here (`reshard run --dry-run` checks a whole run command line)"
            ),
        )
        .format(plan))
    }

    fn hide_run_only(cmd: clap::Command) -> clap::Command {
        cmd.mut_args(
            |a| match RUN_ONLY.iter().any(|(id, ..)| a.get_id() == *id) {
                true => a.hide(true),
                false => a,
            },
        )
    }
}

impl clap::FromArgMatches for PlanArgs {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        Self::refuse_run_only(m)?;
        RunArgs::from_arg_matches(m).map(Self)
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        Self::refuse_run_only(m)?;
        self.0.update_from_arg_matches(m)
    }
}

impl Args for PlanArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        Self::hide_run_only(RunArgs::augment_args(cmd))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::hide_run_only(RunArgs::augment_args_for_update(cmd))
    }
}

/// `--input-files` and the flags that name its samples; `run`, `plan` and `verify` take them.
#[derive(Debug, Args, Default)]
pub struct FilesArgs {
    /// A directory of loose files to pack into samples (a local or parallel file system), or
    /// a prefix of objects (s3://bucket/prefix/; each object mode 0644, its mtime the
    /// last-modified time). Its
    /// files are grouped by key (WebDataset's rule on the path relative to ROOT: the directory
    /// and the file name up to its first dot, so a/x.jpg and a/x.json are one sample) and
    /// follow the --input shards, each ROOT in the order given. Hidden files, editors'
    /// leftovers (x~, #x#), FIFOs, sockets, devices and links to directories are skipped;
    /// links to files are followed.
    #[arg(help_heading = "Input", long = "input-files", value_name = "ROOT")]
    pub input_files: Vec<PathBuf>,

    /// With --input-files: a sample's key is the first capture group of this regular
    /// expression matched against the file's path relative to its root, e.g. '([^/]*)/[^/]*$'
    /// (the file's directory); the member's extension is still what follows the first dot of
    /// the file name. Files it does not match are skipped. Each root is then walked and read as
    /// one unit by one rank, so that a key's files are one sample wherever they lie.
    #[arg(help_heading = "Input", long = "key-regex", value_name = "RE")]
    pub key_regex: Option<String>,

    /// With --input-files: one directory per class under ROOT (ImageFolder); every sample gets
    /// the member KEY.EXT holding its class index as decimal text, classes numbered from 0 in
    /// the sorted order of the directory names. The class list is written to the output's
    /// classes.txt, one name a line.
    #[arg(help_heading = "Input", long = "label-from-dir", value_name = "EXT")]
    pub label_from_dir: Option<String>,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The input shards the output was made from, as given to `reshard run` (same specs, same
    /// order).
    #[arg(long = "input", short = 'i', value_name = "SPEC")]
    pub(crate) inputs: Vec<String>,

    /// The trees of loose files the output was made from, as given to `reshard run`.
    #[command(flatten)]
    pub files: FilesArgs,

    /// The output directory to check: its shards and index.json.
    #[arg(long, short = 'o', value_name = "DIR")]
    pub(crate) output: PathBuf,

    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,

    /// Also draw the output to FILE (.svg or .png): histograms of its shards' bytes and samples,
    /// and which input shards each output shard draws from next to what a uniform random
    /// permutation gives; and say in words whether the order looks uniformly mixed.
    #[arg(long, value_name = "FILE")]
    pub(crate) plot: Option<PathBuf>,

    /// Read past zero blocks in an input, as GNU tar --ignore-zeros does: for concatenated
    /// archives (`cat a.tar b.tar`) and lone zero blocks. Without it, data after an input's
    /// first zero block is an error naming the file and offset (its samples would be lost).
    #[arg(help_heading = "Input", long)]
    pub(crate) ignore_zeros: bool,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Directory to write the shards to (created; must not contain shards already).
    #[arg(long, short = 'o', value_name = "DIR")]
    pub(crate) output: PathBuf,

    /// Number of input shards to write.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub(crate) shards: u64,

    /// Total number of samples (alternative to --total-size).
    #[arg(long, value_name = "N", conflicts_with = "total_size")]
    pub(crate) samples: Option<u64>,

    /// Approximate total payload size, e.g. 2GiB (samples = size / mean sample size).
    #[arg(long, value_name = "SIZE")]
    pub(crate) total_size: Option<String>,

    /// Mean payload size of a sample's main member (lognormal around it).
    #[arg(long, value_name = "SIZE", default_value = "100KiB")]
    pub(crate) mean_size: String,

    /// Spread of the lognormal payload sizes (sigma of the underlying normal).
    #[arg(long, value_name = "SIGMA", default_value_t = 0.5)]
    pub(crate) sigma: f64,

    /// Skew of input shard sizes: 0 gives equal shards; larger values make the first shards
    /// much larger than the last (shard i gets a weight of exp(-skew * i / shards)).
    #[arg(long, value_name = "X", default_value_t = 0.0)]
    pub(crate) skew: f64,

    /// Seed: the same arguments and seed always give byte-identical shards.
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub(crate) seed: u64,

    /// Give every Nth sample a key longer than 100 bytes (0: never), which needs GNU long-name
    /// or PAX records.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub(crate) long_names_every: u64,

    /// Header format of the members: gnu (long names as GNU 'L' records) or pax (PAX 'x' records).
    #[arg(long, value_name = "FMT", default_value = "gnu")]
    pub(crate) format: String,

    /// Shard file name prefix.
    #[arg(long, value_name = "NAME", default_value = "train")]
    pub(crate) prefix: String,
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
