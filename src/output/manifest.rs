//! `index.json`: a webdataset wids shard index, plus what reshard knows about the run.

use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::{gpu::GpuShare, stats::Stats};
use crate::config::Balance;
use crate::plan::placement::{GroupPlan, StratifyReport};
use crate::plan::Equalize;
use crate::storage;
use crate::tar::{Hygiene, Skipped};

/// The manifest written as `DIR/index.json`. wids reads `__kind__`, `wids_version` and
/// `shardlist`; everything reshard adds lives under `reshard`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Manifest {
    #[serde(rename = "__kind__")]
    pub(crate) kind: String,
    pub(crate) wids_version: u32,
    pub(crate) shardlist: Vec<ShardEntry>,
    pub(crate) reshard: RunInfo,
}

/// One output shard, as wids expects it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ShardEntry {
    /// File name relative to the directory holding index.json.
    pub(crate) url: String,
    pub(crate) nsamples: u64,
    pub(crate) filesize: u64,
    /// MD5 of the shard file, hex (with `--checksum`); wids checks it after a download.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) md5sum: Option<String>,
}

/// reshard's own record of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct RunInfo {
    pub(crate) version: String,
    pub(crate) seed: u64,
    pub(crate) epoch: u64,
    pub(crate) shards: u64,
    /// Samples written (every input sample exactly once).
    pub(crate) samples: u64,
    /// Sample bytes (headers, data and padding of their members).
    pub(crate) sample_bytes: u64,
    /// Sum of the shard file sizes.
    pub(crate) output_bytes: u64,
    /// The input shards in canonical order.
    pub(crate) inputs: Vec<String>,
    pub(crate) input_bytes: u64,
    /// Entries of the input that belong to no sample and were left out.
    pub(crate) skipped: Skipped,
    /// How many MPI ranks ran the job (the output does not depend on it).
    pub(crate) ranks: usize,
    /// Why this shard count (the sizing flag and the resulting mean).
    pub(crate) sizing: String,
    pub(crate) equalize: Equalize,
    pub(crate) balance: Balance,
    /// Samples written, repeats included and dropped samples excluded.
    pub(crate) output_samples: u64,
    /// Keys of the samples left out by `--equalize drop`, in permuted order.
    pub(crate) dropped: Vec<String>,
    /// Keys of the samples written twice by `--equalize pad`, in permuted order.
    pub(crate) repeated: Vec<String>,
    pub(crate) shard_samples: Stats,
    pub(crate) shard_bytes: Stats,
    /// Samples (and batches) per GPU, with `--gpus`.
    pub(crate) gpus: Option<GpuShare>,
    /// What the sample hygiene rules found: incomplete samples kept or excluded, duplicates kept.
    #[serde(default)]
    pub(crate) hygiene: Hygiene,
    /// `--order` (and `descending`).
    #[serde(default)]
    pub(crate) order: String,
    /// `--stratify-by`: labels and the worst deviation of any label's count in any shard from
    /// its ideal share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) stratify: Option<StratifyReport>,
    /// `--key-map`: the groups, each sized on its own, and the unmatched samples left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) key_map: Option<KeyMapInfo>,
    /// `--split`, in the output's own index.json: every split (its name is its directory, which
    /// holds the split's shards and its own index.json), sized on its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) splits: Option<Vec<GroupPlan>>,
    /// `--split`, in a split's index.json: the split's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) split: Option<String>,
}

/// The key-map part of the manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct KeyMapInfo {
    pub(crate) file: String,
    pub(crate) unmatched: u64,
    pub(crate) groups: Vec<GroupPlan>,
}

impl Manifest {
    pub(crate) const KIND: &'static str = "wids-shard-index-v1";

    pub(crate) fn new(shardlist: Vec<ShardEntry>, reshard: RunInfo) -> Self {
        Manifest {
            kind: Self::KIND.to_string(),
            wids_version: 1,
            shardlist,
            reshard,
        }
    }

    /// The index.json of one split of a `--split` output (`groups[k]`), from the output's own
    /// manifest: the split's shards, with urls relative to the split's directory, and the
    /// figures of the split alone. GPU figures stay with the first split, which they describe.
    pub(crate) fn of_split(&self, groups: &[GroupPlan], k: usize) -> Manifest {
        let group = &groups[k];
        let name = group.split.clone().unwrap_or_default();
        let dir = format!("{name}/");
        let range = group.shard_start as usize..(group.shard_start + group.shards) as usize;
        let shardlist: Vec<ShardEntry> = self.shardlist[range]
            .iter()
            .map(|e| ShardEntry {
                url: e.url.strip_prefix(&dir).unwrap_or(&e.url).to_string(),
                ..e.clone()
            })
            .collect();
        // The dropped and repeated lists run split by split, in split order.
        let before =
            |f: &dyn Fn(&GroupPlan) -> u64| groups[..k].iter().map(f).sum::<u64>() as usize;
        let dropped = before(&|g| g.targets.dropped());
        let repeated = before(&|g| g.targets.repeated());
        let r = &self.reshard;
        let of = |list: &[String], at: usize, n: u64| {
            list.get(at..at + n as usize).unwrap_or_default().to_vec()
        };
        let samples: Vec<u64> = shardlist.iter().map(|e| e.nsamples).collect();
        let bytes: Vec<u64> = shardlist.iter().map(|e| e.filesize).collect();
        let info = RunInfo {
            shards: group.shards,
            samples: group.samples,
            sample_bytes: group.sample_bytes,
            output_bytes: bytes.iter().sum(),
            sizing: group.sizing.clone(),
            output_samples: group.output_samples,
            dropped: of(&r.dropped, dropped, group.targets.dropped()),
            repeated: of(&r.repeated, repeated, group.targets.repeated()),
            shard_samples: Stats::of(&samples),
            shard_bytes: Stats::of(&bytes),
            gpus: if k == 0 { r.gpus } else { None },
            splits: None,
            split: Some(name),
            ..r.clone()
        };
        Manifest::new(shardlist, info)
    }

    /// Writes the manifest to `path` and syncs it.
    ///
    /// # Errors
    /// The file cannot be written.
    pub(crate) fn write(&self, path: &Path) -> Result<()> {
        let mut text = serde_json::to_vec_pretty(self).expect("serializable");
        text.push(b'\n');
        storage::sink(path)
            .write(path, &text)
            .with_context(|| format!("{}: cannot write", path.display()))
    }
}
