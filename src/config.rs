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
pub const EPOCH: &str = "{epoch}";

/// The smallest memory budget that still leaves room for a useful exchange round.
pub const MIN_MEM_LIMIT: u64 = 1 << 20;

/// A `run` request after validation: every field is resolved and checked, nothing touched the
/// filesystem yet.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub inputs: Vec<String>,
    /// `None` when only planning. For an `s3://` output, where it is staged on `--scratch`.
    pub output: Option<PathBuf>,
    /// An `s3://` output: where the staged output is uploaded ([`crate::job::destination::upload`]).
    pub upload: Option<PathBuf>,
    pub sizing: Sizing,
    pub equalize: Equalize,
    pub balance: Balance,
    pub gpus: Option<GpuLayout>,
    pub dry_run: bool,
    /// Refuse to start where the output's file system clearly cannot hold the output
    /// (`--no-space-check` turns it off).
    pub space_check: bool,
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
    /// `--index DIR`: where saved indexes are looked for.
    pub saved_indexes: Option<PathBuf>,
    pub link: Option<PathBuf>,
    pub keep: Option<Keep>,
    pub stall_timeout: Duration,
    /// `--lock-stale-after`: how long a lock whose pid cannot be checked must be silent to be
    /// taken over.
    pub lock_stale_after: Duration,
    pub max_round_bytes: u64,
    pub order: OrderSpec,
    /// `--resume`: continue from what an earlier attempt left in the staging directory.
    pub resume: bool,
    /// `--checkpoint-every`: time between checkpoints of the exchange (zero: every round).
    pub checkpoint_every: Duration,
    /// `--split` and `--split-shards`.
    pub split: Option<Splits>,
    pub progress: ProgressConfig,
    /// `--plot FILE` (a plan only): the picture of the plan, SVG or PNG.
    pub plot: Option<PathBuf>,
    /// Loader indexes written with the output (`--energon`, `--dali-index`).
    pub loaders: LoaderIndexes,
    /// `--max-read-rate`, `--max-write-rate`, `--io-priority`, `--nice`.
    pub io: IoConfig,
}

pub use crate::throttle::{IoConfig, IoPriority};

/// What every phase of a job needs of a [`RunConfig`], each phase its own part, decided once
/// (`crate::cli::resolve::job_settings`, pure): `crate::job` never sees the request as typed.
#[derive(Debug, Clone)]
pub struct JobSettings {
    pub expand: ExpandSettings,
    pub plan: PlanSettings,
    pub exchange: ExchangeSettings,
    pub finish: FinishSettings,
    pub publish: PublishSettings,
    pub resume: ResumeSettings,
    pub upload: UploadSettings,
    pub report: ReportSettings,
    /// `--dry-run` or `reshard plan`: the phases stop after planning.
    pub dry_run: bool,
    /// `--plot FILE` (a plan only).
    pub plot: Option<PathBuf>,
    /// Whether the free-space check runs before data moves.
    pub space_check: bool,
    pub io: IoConfig,
}

/// What uploading an `s3://` output needs ([`crate::job::destination::upload`]): where the staged output is
/// uploaded to and from, and what may be replaced there.
#[derive(Debug, Clone, Default)]
pub struct UploadSettings {
    /// The `s3://` URL of the output; `None` for an output on a file system.
    pub target: Option<PathBuf>,
    /// The staged local output on `--scratch` that is uploaded.
    pub local: Option<PathBuf>,
    pub force: bool,
    pub dry_run: bool,
    /// `--resume`: a staged output an earlier attempt did not finish uploading is continued.
    pub resume: bool,
    /// `--lock-stale-after`: the lock object's rules are those of a file system's lock.
    pub lock_stale_after: Duration,
    /// `--keep` over a series of `s3://` outputs (the file-system publish of the staged copy
    /// then keeps none), and the new output's epoch.
    pub keep: Option<Keep>,
    pub epoch: u64,
}

/// What the expand phase needs: the input specs, and the output with what may replace or
/// remove what is there.
#[derive(Debug, Clone)]
pub struct ExpandSettings {
    pub inputs: Vec<String>,
    /// `None` when only planning without an output.
    pub output: Option<PathBuf>,
    pub dry_run: bool,
    pub resume: bool,
    pub force: bool,
    pub link: Option<PathBuf>,
    pub keep: Option<Keep>,
    pub epoch: u64,
    pub lock_stale_after: Duration,
}

/// What the exchange phase needs.
#[derive(Debug, Clone, Copy)]
pub struct ExchangeSettings {
    pub mem_limit: u64,
    pub stall_timeout: Duration,
    pub progress: ProgressConfig,
    /// The rate limits: rounds are sized to move within the stall timeout at them.
    pub limits: crate::throttle::Limits,
}

/// What the finish phase needs: what becomes of each finished shard.
#[derive(Debug, Clone)]
pub struct FinishSettings {
    pub compress: Codec,
    pub checksum: bool,
    pub loaders: LoaderIndexes,
}

/// What the publish phase needs: the manifest's account of the request, energon's metadata,
/// and what happens around the rename.
#[derive(Debug, Clone)]
pub struct PublishSettings {
    pub force: bool,
    pub compress: Codec,
    pub loaders: LoaderIndexes,
    pub link: Option<PathBuf>,
    pub keep: Option<Keep>,
    pub seed: u64,
    pub epoch: u64,
    pub equalize: Equalize,
    pub balance: Balance,
    /// The order as the manifest and the reports describe it.
    pub order: String,
    /// `--key-map FILE`.
    pub key_map: Option<PathBuf>,
    /// Whether `--split` was asked for.
    pub split: bool,
    /// The output is staged for an upload (`s3://`): its `--resume` records stay in it until
    /// the upload is done, so that a failed upload can be resumed.
    pub staged_for_upload: bool,
}

/// What `--resume` records and compares: the arguments that shape the staging shards, as
/// (flag, value) (the key map's stamp is added when recorded: that is I/O), and the checkpoints.
#[derive(Debug, Clone)]
pub struct ResumeSettings {
    pub arguments: Vec<(String, String)>,
    /// `--key-map FILE`, whose size and time a plan record holds too.
    pub key_map: Option<PathBuf>,
    pub mem_limit: u64,
    /// `--checkpoint-every` (zero: every round).
    pub checkpoint_every: Duration,
}

/// What the summary and the plan report need besides the phases' results.
#[derive(Debug, Clone)]
pub struct ReportSettings {
    pub equalize: Equalize,
    pub balance: Balance,
    /// The order as the reports describe it.
    pub order: String,
    pub sizing: Sizing,
    /// Where the output would go (the plan's free-space note).
    pub output: Option<PathBuf>,
    pub limits: crate::throttle::Limits,
    pub mem_limit: u64,
    /// An `s3://` output: the URL it is uploaded to, which the summary names.
    pub uploaded_to: Option<PathBuf>,
}

/// What the planning phases need of a [`RunConfig`], each phase its own part, with the values
/// derived from several flags decided once (`crate::cli::resolve::plan_settings`) instead of
/// in each phase.
#[derive(Debug, Clone)]
pub struct PlanSettings {
    pub index: IndexSettings,
    pub place: PlaceSettings,
    pub layout: LayoutSettings,
}

/// What the index phase needs.
#[derive(Debug, Clone)]
pub struct IndexSettings {
    pub rules: Rules,
    /// `--index DIR`: where saved indexes are looked for.
    pub saved_indexes: Option<PathBuf>,
    /// Whether saved indexes may stand in for the tar headers: not when the rules need what
    /// only the headers hold (keys, labels, member names).
    pub reuse_saved: bool,
    pub progress: ProgressConfig,
}

/// What the place phase needs: the order, the groups and the sizing.
#[derive(Debug, Clone)]
pub struct PlaceSettings {
    pub order: OrderSpec,
    pub split: Option<SplitSettings>,
    pub seed: u64,
    pub epoch: u64,
    pub equalize: Equalize,
    pub sizing: Sizing,
    /// Output shard names: `PREFIX-NNNNNN.tar`.
    pub prefix: String,
}

/// What the split assignment needs (`--split`): a function of the seed and the input alone.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitSettings {
    pub splits: Splits,
    pub seed: u64,
}

/// What the layout phase needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayoutSettings {
    pub balance: Balance,
    pub gpus: Option<GpuLayout>,
    /// How many of the first groups the GPUs train on: with `--split` the first split (one
    /// group), else every shard (`None`).
    pub gpu_groups: Option<usize>,
}

/// `--split`: the splits, and how the ones after the first (the training split, which the
/// sizing flags size) are sized.
#[derive(Debug, Clone, PartialEq)]
pub struct Splits {
    pub spec: SplitSpec,
    /// Per split: its shard count from `--split-shards`, `None` for the first split and for those
    /// `--split-shards` leaves to the default (the training split's mean shard size).
    pub shards: Vec<Option<u64>>,
}

impl Splits {
    /// `--split` and `--split-shards` as a user types them; a split whose shard count is left
    /// to the default is not named.
    pub fn flags(&self) -> String {
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
pub struct ProgressConfig {
    pub mode: ProgressMode,
    /// Between two progress lines.
    pub interval: Duration,
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
pub enum ProgressMode {
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
pub struct LoaderIndexes {
    /// `--energon`: Megatron-Energon's `.nv-meta/` and a `NAME.tar.idx` per shard.
    pub energon: Option<EnergonDataset>,
    /// `--energon` without `--energon-no-sqlite`: `.nv-meta/index.sqlite`, energon's key index.
    pub energon_key_index: bool,
    /// `--dali-index`: DALI's webdataset index, `NAME.idx` per shard.
    pub dali: bool,
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
pub enum Balance {
    /// Equal sample counts per shard (within one).
    #[default]
    Count,
    /// Near-equal bytes per shard.
    Bytes,
}

impl Balance {
    /// The flag's value, as `--balance` takes it.
    pub fn flag(self) -> &'static str {
        match self {
            Balance::Count => "count",
            Balance::Bytes => "bytes",
        }
    }
}

/// GPU layout the shards are sized for (`--gpus`), for reporting per-GPU samples and batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct GpuLayout {
    pub gpus: u64,
    pub workers: u64,
    pub batch_size: Option<u64>,
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

/// A `verify` request (also made by `run --verify`).
#[derive(Debug, Clone)]
pub struct VerifyConfig {
    /// Input specs, as given to `reshard run`.
    pub inputs: Vec<String>,
    /// The output directory of a run: its shards and `index.json`.
    pub output: PathBuf,
    /// Print the report as JSON.
    pub json: bool,
    /// `--plot FILE`: the picture of the output, SVG or PNG.
    pub plot: Option<PathBuf>,
    /// `--ignore-zeros`: read inputs past zero blocks, as `reshard run --ignore-zeros` does.
    pub ignore_zeros: bool,
}

/// A `generate` request after validation.
#[derive(Debug, Clone)]
pub struct GenerateConfig {
    pub output: PathBuf,
    pub shards: u64,
    /// At least `shards`: every shard gets a sample.
    pub samples: u64,
    /// Mean `.jpg` payload size, at least 1 byte.
    pub mean_size: u64,
    /// Finite, at least 0.
    pub sigma: f64,
    /// Finite.
    pub skew: f64,
    pub seed: u64,
    pub long_names_every: u64,
    pub format: HeaderFormat,
    pub prefix: String,
}

/// Header format of the members `generate` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderFormat {
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
