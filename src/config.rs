//! What each command is asked to do, after its arguments were checked: [`RunConfig`],
//! [`VerifyConfig`], [`GenerateConfig`] and the domain policies they carry. The command line
//! (`crate::cli`) produces them; the rest of the crate consumes them and never sees clap.

use std::path::PathBuf;
use std::time::Duration;

use crate::plan::order::OrderSpec;
use crate::plan::split::SplitSpec;
use crate::plan::{Equalize, Sizing};
use crate::tar::{Codec, Rules};

/// The placeholder `--output` and `--link` replace with the epoch number.
pub(crate) const EPOCH: &str = "{epoch}";

/// The smallest memory budget that still leaves room for a useful exchange round.
pub(crate) const MIN_MEM_LIMIT: u64 = 1 << 20;

/// A `run` request after validation: every field is resolved and checked, nothing touched the
/// filesystem yet.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub(crate) inputs: Vec<String>,
    /// `--input-files`, `--key-regex`, `--label-from-dir`.
    pub(crate) files: crate::tree::FilesRequest,
    /// `None` when only planning. For an `s3://` output, where it is staged on `--scratch`.
    pub(crate) output: Option<PathBuf>,
    /// An `s3://` output: where the staged output is uploaded ([`crate::job::destination::upload`]).
    pub(crate) upload: Option<PathBuf>,
    pub(crate) sizing: Sizing,
    pub(crate) equalize: Equalize,
    pub(crate) balance: Balance,
    pub(crate) gpus: Option<GpuLayout>,
    pub dry_run: bool,
    /// Refuse to start where the output's file system clearly cannot hold the output
    /// (`--no-space-check` turns it off).
    pub(crate) space_check: bool,
    pub json: bool,
    pub(crate) seed: u64,
    pub(crate) epoch: u64,
    pub(crate) prefix: String,
    pub(crate) mem_limit: u64,
    pub(crate) force: bool,
    pub report: Option<PathBuf>,
    pub(crate) rules: Rules,
    pub(crate) compress: Codec,
    pub(crate) checksum: bool,
    /// `--index DIR`: where saved indexes are looked for.
    pub(crate) saved_indexes: Option<PathBuf>,
    /// Where object-store input shards are spooled (`--scratch`, else `$TMPDIR`).
    pub(crate) spool: PathBuf,
    pub(crate) link: Option<PathBuf>,
    pub(crate) keep: Option<Keep>,
    pub(crate) stall_timeout: Duration,
    /// `--lock-stale-after`: how long a lock whose pid cannot be checked must be silent to be
    /// taken over.
    pub(crate) lock_stale_after: Duration,
    pub max_round_bytes: u64,
    pub(crate) order: OrderSpec,
    /// `--resume`: continue from what an earlier attempt left in the staging directory.
    pub(crate) resume: bool,
    /// `--checkpoint-every`: time between checkpoints of the exchange (zero: every round).
    pub(crate) checkpoint_every: Duration,
    /// `--split` and `--split-shards`.
    pub(crate) split: Option<Splits>,
    pub(crate) progress: ProgressConfig,
    /// `--plot FILE` (a plan only): the picture of the plan, SVG or PNG.
    pub(crate) plot: Option<PathBuf>,
    /// Loader indexes written with the output (`--energon`, `--dali-index`).
    pub(crate) loaders: LoaderIndexes,
    /// `--max-read-rate`, `--max-write-rate`, `--io-priority`, `--nice`.
    pub(crate) io: IoConfig,
}

pub(crate) use crate::throttle::{IoConfig, IoPriority};

/// What every phase of a job needs of a [`RunConfig`], each phase its own part, decided once
/// (`crate::cli::resolve::job_settings`, pure): `crate::job` never sees the request as typed.
#[derive(Debug, Clone)]
pub struct JobSettings {
    pub(crate) expand: ExpandSettings,
    pub(crate) plan: PlanSettings,
    pub(crate) exchange: ExchangeSettings,
    pub(crate) finish: FinishSettings,
    pub(crate) publish: PublishSettings,
    pub(crate) resume: ResumeSettings,
    pub(crate) upload: UploadSettings,
    pub(crate) report: ReportSettings,
    /// `--dry-run` or `reshard plan`: the phases stop after planning.
    pub(crate) dry_run: bool,
    /// `--plot FILE` (a plan only).
    pub(crate) plot: Option<PathBuf>,
    /// Whether the free-space check runs before data moves.
    pub(crate) space_check: bool,
    pub(crate) io: IoConfig,
}

/// What uploading an `s3://` output needs ([`crate::job::destination::upload`]): where the staged output is
/// uploaded to and from, and what may be replaced there.
#[derive(Debug, Clone, Default)]
pub(crate) struct UploadSettings {
    /// The `s3://` URL of the output; `None` for an output on a file system.
    pub(crate) target: Option<PathBuf>,
    /// The staged local output on `--scratch` that is uploaded.
    pub(crate) local: Option<PathBuf>,
    pub(crate) force: bool,
    pub(crate) dry_run: bool,
    /// `--resume`: a staged output an earlier attempt did not finish uploading is continued.
    pub(crate) resume: bool,
    /// `--lock-stale-after`: the lock object's rules are those of a file system's lock.
    pub(crate) lock_stale_after: Duration,
    /// `--keep` over a series of `s3://` outputs (the file-system publish of the staged copy
    /// then keeps none), and the new output's epoch.
    pub(crate) keep: Option<Keep>,
    pub(crate) epoch: u64,
    /// `--progress`: the upload reports as the exchange does.
    pub(crate) progress: ProgressConfig,
}

/// What the expand phase needs: the input specs, and the output with what may replace or
/// remove what is there.
#[derive(Debug, Clone)]
pub(crate) struct ExpandSettings {
    pub(crate) inputs: Vec<String>,
    /// `--input-files` and the rules its samples are made by.
    pub(crate) files: crate::tree::FilesRequest,
    /// `None` when only planning without an output.
    pub(crate) output: Option<PathBuf>,
    pub(crate) dry_run: bool,
    pub(crate) resume: bool,
    pub(crate) force: bool,
    pub(crate) link: Option<PathBuf>,
    pub(crate) keep: Option<Keep>,
    pub(crate) epoch: u64,
    pub(crate) lock_stale_after: Duration,
}

/// What the exchange phase needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ExchangeSettings {
    pub(crate) mem_limit: u64,
    pub(crate) stall_timeout: Duration,
    pub(crate) progress: ProgressConfig,
    /// The rate limits: rounds are sized to move within the stall timeout at them.
    pub(crate) limits: crate::throttle::Limits,
}

/// What the finish phase needs: what becomes of each finished shard.
#[derive(Debug, Clone)]
pub(crate) struct FinishSettings {
    pub(crate) compress: Codec,
    pub(crate) checksum: bool,
    pub(crate) loaders: LoaderIndexes,
}

/// What the publish phase needs: the manifest's account of the request, energon's metadata,
/// and what happens around the rename.
#[derive(Debug, Clone)]
pub(crate) struct PublishSettings {
    pub(crate) force: bool,
    pub(crate) compress: Codec,
    pub(crate) loaders: LoaderIndexes,
    pub(crate) link: Option<PathBuf>,
    pub(crate) keep: Option<Keep>,
    pub(crate) seed: u64,
    pub(crate) epoch: u64,
    pub(crate) equalize: Equalize,
    pub(crate) balance: Balance,
    /// The order as the manifest and the reports describe it.
    pub(crate) order: String,
    /// `--key-map FILE`.
    pub(crate) key_map: Option<PathBuf>,
    /// Whether `--split` was asked for.
    pub(crate) split: bool,
    /// The output is staged for an upload (`s3://`): its `--resume` records stay in it until
    /// the upload is done, so that a failed upload can be resumed.
    pub(crate) staged_for_upload: bool,
}

/// What `--resume` records and compares: the arguments that shape the staging shards, as
/// (flag, value) (the key map's stamp is added when recorded: that is I/O), and the checkpoints.
#[derive(Debug, Clone)]
pub(crate) struct ResumeSettings {
    pub(crate) arguments: Vec<(String, String)>,
    /// `--key-map FILE`, whose size and time a plan record holds too.
    pub(crate) key_map: Option<PathBuf>,
    pub(crate) mem_limit: u64,
    /// `--checkpoint-every` (zero: every round).
    pub(crate) checkpoint_every: Duration,
}

/// What the summary and the plan report need besides the phases' results.
#[derive(Debug, Clone)]
pub(crate) struct ReportSettings {
    pub(crate) equalize: Equalize,
    pub(crate) balance: Balance,
    /// The order as the reports describe it.
    pub(crate) order: String,
    pub(crate) sizing: Sizing,
    /// Where the output would go (the plan's free-space note).
    pub(crate) output: Option<PathBuf>,
    pub(crate) limits: crate::throttle::Limits,
    pub(crate) mem_limit: u64,
    /// An `s3://` output: the URL it is uploaded to, which the summary names.
    pub(crate) uploaded_to: Option<PathBuf>,
}

/// What the planning phases need of a [`RunConfig`], each phase its own part, with the values
/// derived from several flags decided once (`crate::cli::resolve::plan_settings`) instead of
/// in each phase.
#[derive(Debug, Clone)]
pub(crate) struct PlanSettings {
    pub(crate) index: IndexSettings,
    pub(crate) place: PlaceSettings,
    pub(crate) layout: LayoutSettings,
}

/// What the index phase needs.
#[derive(Debug, Clone)]
pub(crate) struct IndexSettings {
    pub(crate) rules: Rules,
    /// `--index DIR`: where saved indexes are looked for.
    pub(crate) saved_indexes: Option<PathBuf>,
    /// Where object-store input shards are spooled: each rank's spool directory is made in it.
    pub(crate) spool: PathBuf,
    /// The bytes of a rank's spooled shards held in memory, at most (a share of `--mem-limit`;
    /// the exchange's buffers take the rest).
    pub(crate) spool_memory: u64,
    /// Whether saved indexes may stand in for the tar headers: not when the rules need what
    /// only the headers hold (keys, labels, member names).
    pub(crate) reuse_saved: bool,
    pub(crate) progress: ProgressConfig,
}

/// What the place phase needs: the order, the groups and the sizing.
#[derive(Debug, Clone)]
pub(crate) struct PlaceSettings {
    pub(crate) order: OrderSpec,
    pub(crate) split: Option<SplitSettings>,
    pub(crate) seed: u64,
    pub(crate) epoch: u64,
    pub(crate) equalize: Equalize,
    pub(crate) sizing: Sizing,
    /// Output shard names: `PREFIX-NNNNNN.tar`.
    pub(crate) prefix: String,
}

/// What the split assignment needs (`--split`): a function of the seed and the input alone.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SplitSettings {
    pub(crate) splits: Splits,
    pub(crate) seed: u64,
}

/// What the layout phase needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LayoutSettings {
    pub(crate) balance: Balance,
    pub(crate) gpus: Option<GpuLayout>,
    /// How many of the first groups the GPUs train on: with `--split` the first split (one
    /// group), else every shard (`None`).
    pub(crate) gpu_groups: Option<usize>,
}

/// `--split`: the splits, and how the ones after the first (the training split, which the
/// sizing flags size) are sized.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Splits {
    pub(crate) spec: SplitSpec,
    /// Per split: its shard count from `--split-shards`, `None` for the first split and for those
    /// `--split-shards` leaves to the default (the training split's mean shard size).
    pub(crate) shards: Vec<Option<u64>>,
}

impl Splits {
    /// `--split` and `--split-shards` as a user types them; a split whose shard count is left
    /// to the default is not named.
    pub(crate) fn flags(&self) -> String {
        let counts: Vec<String> = self
            .spec
            .parts
            .iter()
            .zip(&self.shards)
            .filter_map(|(p, n)| n.map(|n| format!("{}={n}", p.name)))
            .collect();
        let mut s = format!("--split {}", self.spec.flag());
        if !counts.is_empty() {
            s += &format!(" --split-shards {}", counts.join(","));
        }
        s
    }
}

/// How rank 0 reports progress while indexing and exchanging (`--progress`,
/// `--progress-interval`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ProgressConfig {
    pub(crate) mode: ProgressMode,
    /// Between two progress lines.
    pub(crate) interval: Duration,
}

impl Default for ProgressConfig {
    fn default() -> Self {
        ProgressConfig {
            mode: ProgressMode::Auto,
            interval: Duration::from_secs(5),
        }
    }
}

/// `--progress` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub(crate) enum ProgressMode {
    /// A bar when rank 0's stderr is a terminal (`srun --pty`, no launcher), lines otherwise.
    #[default]
    Auto,
    /// A bar, even through a launcher's pipes (`mpirun` run from a terminal).
    Bar,
    /// A line per interval.
    Lines,
    /// Nothing (no progress reductions either).
    None,
}

/// The indexes other data loaders need, written with the output so that no preparation pass
/// over the data is needed before training.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LoaderIndexes {
    /// `--energon`: Megatron-Energon's `.nv-meta/` and a `NAME.tar.idx` per shard.
    pub(crate) energon: Option<EnergonDataset>,
    /// `--energon` without `--energon-no-sqlite`: `.nv-meta/index.sqlite`, energon's key index.
    pub(crate) energon_key_index: bool,
    /// `--dali-index`: DALI's webdataset index, `NAME.idx` per shard.
    pub(crate) dali: bool,
}

/// What `.nv-meta/dataset.yaml` says the samples are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum EnergonDataset {
    /// `CrudeWebdataset`: plain dicts for a cooker (energon's default).
    #[default]
    Crude,
    /// `--energon-sample-type CLASS --energon-field-map JSON`.
    Typed {
        sample_type: String,
        /// The field map as compact JSON (an object, keys sorted).
        field_map: String,
    },
}

/// How shards are cut (`--balance`).
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
pub(crate) enum Balance {
    /// Equal sample counts per shard (within one).
    #[default]
    Count,
    /// Near-equal bytes per shard.
    Bytes,
}

impl Balance {
    /// The flag's value, as `--balance` takes it.
    pub(crate) fn flag(self) -> &'static str {
        match self {
            Balance::Count => "count",
            Balance::Bytes => "bytes",
        }
    }
}

/// GPU layout the shards are sized for (`--gpus`), for reporting per-GPU samples and batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub(crate) struct GpuLayout {
    pub(crate) gpus: u64,
    pub(crate) workers: u64,
    pub(crate) batch_size: Option<u64>,
}

/// `--keep K`: the series of outputs one `--output` template names, and how many to keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Keep {
    /// Epochs kept, the new output included.
    pub(crate) count: usize,
    /// The output directory's name with `{epoch}` not replaced, e.g. `epoch-{epoch}`.
    pub(crate) series: String,
}

impl Keep {
    /// The epoch whose output the series template names `name`: `epoch-12` is epoch 12 of
    /// `epoch-{epoch}`. Only names `--epoch` itself produces: decimal digits without leading
    /// zeros in every place of `{epoch}`, the rest of the name exactly the template's.
    pub(crate) fn epoch_of(&self, name: &str) -> Option<u64> {
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

/// A `verify` request (also made by `run --verify`).
#[derive(Debug, Clone)]
pub struct VerifyConfig {
    /// Input specs, as given to `reshard run`.
    pub(crate) inputs: Vec<String>,
    /// `--input-files` and its rules, as given to `reshard run`.
    pub(crate) files: crate::tree::FilesRequest,
    /// The output directory of a run: its shards and `index.json`.
    pub output: PathBuf,
    /// Print the report as JSON.
    pub json: bool,
    /// `--plot FILE`: the picture of the output, SVG or PNG.
    pub(crate) plot: Option<PathBuf>,
    /// `--ignore-zeros`: read inputs past zero blocks, as `reshard run --ignore-zeros` does.
    pub(crate) ignore_zeros: bool,
}

/// A `generate` request after validation.
#[derive(Debug, Clone)]
pub struct GenerateConfig {
    pub(crate) output: PathBuf,
    pub(crate) shards: u64,
    /// At least `shards`: every shard gets a sample.
    pub(crate) samples: u64,
    /// Mean `.jpg` payload size, at least 1 byte.
    pub(crate) mean_size: u64,
    /// Finite, at least 0.
    pub(crate) sigma: f64,
    /// Finite.
    pub(crate) skew: f64,
    pub(crate) seed: u64,
    pub(crate) long_names_every: u64,
    pub(crate) format: HeaderFormat,
    pub(crate) prefix: String,
}

/// Header format of the members `generate` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeaderFormat {
    /// GNU headers; long paths get a GNU long-name (`L`) record.
    Gnu,
    /// POSIX ustar headers; long paths get a PAX extended header (`x`) with a `path` record.
    Pax,
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
}
