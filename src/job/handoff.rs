//! What one phase hands the next: defined here, imported by every phase, defined by none, so that
//! a phase never reaches into another for the type it receives. In the order they are made:
//! [`Setup`] (expand), [`Indexed`] (index), [`Placed`] and [`Laid`] (plan), together [`Planned`];
//! [`Checkpoints`] (the resume records, to the exchange); [`ExchangeStats`] (exchange);
//! [`Finished`] (finish). [`Shared`] is the context every phase runs in, next to its own
//! settings ([`crate::config::PlanSettings`]): the ranks and the inputs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::comm::Comm;
use crate::input::InputShard;
use crate::output::checkpoint::Checkpoint;
use crate::output::manifest::ShardEntry;
use crate::output::ShardNames;
use crate::plan::placement::{GroupPlan, LocalSample, Placement, StratifyReport};
use crate::plan::{ShardLayout, ShardPlan};
use crate::report::GpuShare;
use crate::storage::FileStamp;
use crate::tar::{Hygiene, Skipped};

/// The ranks of one job and its input shards, in canonical order (every rank holds the same).
pub(crate) struct Shared<'a, C> {
    pub(crate) comm: &'a C,
    pub(crate) inputs: &'a [InputShard],
}

impl<C: Comm> Shared<'_, C> {
    /// Whether this rank speaks for the job (rank 0).
    pub(crate) fn lead(&self) -> bool {
        self.comm.rank() == 0
    }
}

/// What one rank's walk phase asked of the file system: directories listed (prefixes on object
/// storage), files examined (`lstat`, or `stat` for a link).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct WalkCalls {
    pub(crate) listed: u64,
    pub(crate) examined: u64,
    /// The names of files this rank held to walk: its units' (a large directory's units' sent
    /// to it by the rank that listed it, which keeps only its own).
    pub(crate) held: u64,
}

/// What the walk phase leaves for the phases after it (set by it on every rank; not sent).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct WalkFacts {
    /// The directory units rank 0 cut the roots into, before any key range: the input's bytes
    /// count two end blocks for each ([`Setup::input_bytes`]).
    pub(crate) dir_units: u64,
    /// This rank's own calls.
    pub(crate) calls: WalkCalls,
}

/// What rank 0 resolves before any data is read, shared with every rank.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Setup {
    pub(crate) inputs: Vec<InputShard>,
    /// Where the output is assembled and where it goes (none when only planning).
    pub(crate) staging: Option<PathBuf>,
    pub(crate) target: Option<PathBuf>,
    /// `--resume` with an earlier attempt to continue: its staging shards are kept.
    pub(crate) resume: Option<Resume>,
    /// The `--input-files` roots, whose units follow the `--input` shards in `inputs`.
    pub(crate) trees: Vec<crate::tree::Root>,
    /// The loose files the walk phase found in them (set by it on every rank).
    pub(crate) files: Option<u64>,
    /// What the walk phase found (set by it on every rank; not sent).
    #[serde(skip)]
    pub(crate) walk: WalkFacts,
}

impl Setup {
    /// Where the output is assembled.
    ///
    /// # Errors
    /// Only planning: there is no staging directory.
    pub(crate) fn staging(&self) -> Result<&Path> {
        self.staging
            .as_deref()
            .context("internal error: no staging directory when only planning")
    }

    /// Where the output goes.
    ///
    /// # Errors
    /// Only planning: there is no output.
    pub(crate) fn target(&self) -> Result<&Path> {
        self.target
            .as_deref()
            .context("internal error: no output when only planning")
    }

    /// The input's bytes (`input_bytes` in `index.json` and the summary): the `--input`
    /// shards' sizes, and loose files as if each directory unit of rank 0's cut were one tar:
    /// each member's records (header, data, padding) and two end blocks per directory unit.
    /// The same however a directory's keys are cut into ranges (by rank 0, by the walk, by a
    /// `--key-regex` root's regrouping; each range's tar view ends in two end blocks of its
    /// own), at every rank count.
    pub(crate) fn input_bytes(&self) -> u64 {
        let units = self
            .inputs
            .iter()
            .filter(|s| crate::tree::parse(&s.path).is_some())
            .count() as u64;
        let end = 2 * crate::tar::headers::BLOCK;
        let sizes: u64 = self.inputs.iter().map(|s| s.size).sum();
        (sizes + end * self.walk.dir_units).saturating_sub(end * units)
    }

    /// Only planning: the inputs, no output.
    pub(crate) fn planning(inputs: Vec<InputShard>, trees: Vec<crate::tree::Root>) -> Self {
        Setup {
            inputs,
            staging: None,
            target: None,
            resume: None,
            trees,
            files: None,
            walk: WalkFacts::default(),
        }
    }
}

/// What an earlier attempt left to continue from, as rank 0 found it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Resume {
    pub(crate) checkpoint: Checkpoint,
    /// The recorded plan's digest.
    pub(crate) digest: String,
}

/// What the index phase leaves on every rank.
pub(crate) struct Indexed {
    /// The input shards this rank read (a contiguous run).
    pub(crate) mine: std::ops::Range<usize>,
    /// This rank's samples, in input order.
    pub(crate) local: Vec<LocalSample>,
    /// Every sample's key, when the rules keep them (taken by the place phase).
    pub(crate) keys: Vec<Vec<u8>>,
    /// Every sample's label member, when the rules read one (taken by the place phase).
    pub(crate) contents: Vec<Option<Vec<u8>>>,
    /// Samples per input shard of this rank.
    pub(crate) counts: Vec<u64>,
    /// The global index of this rank's first sample.
    pub(crate) first_global: u64,
    /// Over all ranks.
    pub(crate) samples: u64,
    pub(crate) sample_bytes: u64,
    pub(crate) skipped: Skipped,
    pub(crate) hygiene: Hygiene,
    /// Runs of zero blocks read past inside inputs (`--ignore-zeros`), over all ranks.
    pub(crate) zero_runs: u64,
    /// Bytes the index read from storage over all ranks (tar headers, saved indexes), as the
    /// rate limits counted them: 0 when no limit is set.
    pub(crate) read_bytes: u64,
    /// This rank's input shards as it saw them just before it read them (or their saved
    /// index), in order: the finish phase checks them unchanged.
    pub(crate) stamps: Vec<FileStamp>,
    /// This rank's input shards whose saved index was used: their streams were not read here,
    /// so the exchange reads the compressed ones to their end (checking their checksums).
    pub(crate) unread: Vec<usize>,
    /// This rank's object-store shards, each fetched once into it (removed when dropped).
    pub(crate) spool: Option<crate::storage::spool::Spool>,
}

/// What the place phase leaves on every rank.
pub(crate) struct Placed {
    pub(crate) placement: Placement,
    pub(crate) groups: Vec<GroupPlan>,
    /// Samples no key-map group claimed (left out by `--unmatched skip`).
    pub(crate) unmatched: u64,
    pub(crate) stratify: Option<StratifyReport>,
    /// Over all groups: shards, samples written, samples dropped and repeated by `--equalize`.
    pub(crate) shards: u64,
    pub(crate) output_samples: u64,
    pub(crate) dropped: u64,
    pub(crate) repeated: u64,
    /// Why this many shards.
    pub(crate) sizing: String,
    pub(crate) names: ShardNames,
}

/// What the layout phase leaves: every rank's own shards laid out, and on rank 0 what the
/// manifest and the plan report need.
pub(crate) struct Laid {
    pub(crate) plan: ShardPlan,
    /// This rank's shards.
    pub(crate) layout: ShardLayout,
    /// The keys of the samples `--equalize` dropped and repeated (rank 0).
    pub(crate) dropped_keys: Vec<String>,
    pub(crate) repeated_keys: Vec<String>,
    /// Bytes of every output shard (rank 0), and samples of every output shard.
    pub(crate) shard_bytes: Vec<u64>,
    pub(crate) shard_samples: Vec<u64>,
    /// Samples of every input shard (rank 0).
    pub(crate) input_counts: Vec<u64>,
    /// The manifest's shard list, before compression and checksums (rank 0).
    pub(crate) shardlist: Vec<ShardEntry>,
    pub(crate) gpus: Option<GpuShare>,
}

/// What the planning phases leave on every rank: the samples, their positions, the layout.
pub(crate) struct Planned {
    pub(crate) index: Indexed,
    pub(crate) placed: Placed,
    pub(crate) laid: Laid,
}

/// What the exchange moved, as seen by this rank.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ExchangeStats {
    pub(crate) rounds: u64,
    /// Sample bytes this rank read and sent.
    pub(crate) bytes_sent: u64,
    /// Sample bytes this rank received and wrote.
    pub(crate) bytes_written: u64,
    /// `--resume`: sample bytes of this rank's shards an earlier attempt had placed, and samples
    /// of this rank's input it had moved.
    pub(crate) bytes_reused: u64,
    pub(crate) samples_reused: u64,
    /// `--resume`: this rank's shards an earlier attempt had completed.
    pub(crate) shards_reused: u64,
    /// Checkpoints recorded during this exchange.
    pub(crate) checkpoints: u64,
    /// Time this rank's reader spent reading (and copying its own samples), and its writer
    /// writing, in nanoseconds: waits for buffers excluded.
    pub(crate) read_nanos: u64,
    pub(crate) write_nanos: u64,
}

/// On rank 0: every output file's size, and with `--checksum` every shard's MD5 (16 bytes each,
/// in shard order).
pub(crate) struct Finished {
    pub(crate) file_bytes: Vec<u64>,
    pub(crate) md5: Vec<u8>,
}

/// Records durably, on rank 0, the ranges of global sample indices that became durable.
pub(crate) type Record<'a> = Box<dyn FnMut(Vec<(u64, u64)>) -> Result<()> + 'a>;

/// How often, and where, checkpoints are recorded.
pub(crate) struct Checkpoints<'a> {
    /// Time between checkpoints (zero: after every round).
    pub(crate) every: Duration,
    /// Called on rank 0 with every rank's range of global sample indices that became durable
    /// (empty ranges included): records them.
    pub(crate) record: Record<'a>,
}
