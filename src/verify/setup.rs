//! What `verify` works from: rank 0 expands the input, reads `index.json` and finds the output
//! shards ([`prepare`]); every rank receives the result ([`share`]). Problems with the output are
//! collected for the report, never raised.

use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::comm::{broadcast_result, Comm};
use crate::config::VerifyConfig;
use crate::input::{expand_specs, InputShard};
use crate::output::manifest::ShardEntry;
use crate::plan::Equalize;
use crate::storage::{self, Kind};

/// One output shard, as the verifier expects to find it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct OutputShard {
    /// The name index.json gives it (or the file name when there is no index.json).
    pub(super) name: String,
    pub(super) path: PathBuf,
    /// Its size, `None` when it does not exist.
    pub(super) size: Option<u64>,
    /// Its index.json entry.
    pub(super) listed: Option<ShardEntry>,
}

/// What rank 0 resolves first and every rank works from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Setup {
    pub(super) inputs: Vec<InputShard>,
    /// The `--input-files` roots, whose units follow the `--input` shards in `inputs` (walked
    /// by every rank, cut again and sized by the walk phase, as in `run`).
    pub(super) trees: Vec<crate::tree::Root>,
    pub(super) outputs: Vec<OutputShard>,
    pub(super) equalize: Equalize,
    /// Whether the order is checked, and against what.
    pub(super) order: OrderCheck,
}

/// The order `verify` checks: the seeded shuffle of index.json (each input sample's output
/// position recomputed from its input position), or why it cannot be recomputed from what
/// index.json and the input say.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) enum OrderCheck {
    Seeded { seed: u64, epoch: u64, samples: u64 },
    NotChecked(String),
}

impl OrderCheck {
    /// The line of the report.
    pub(super) fn describe(&self) -> String {
        match self {
            OrderCheck::Seeded { seed, epoch, .. } => format!(
                "checked: every sample at the position the shuffle of seed {seed}, epoch {epoch} gives it"
            ),
            OrderCheck::NotChecked(why) => format!("not checked: {why}"),
        }
    }
}

/// What order [`OrderCheck`] can check for the run index.json describes.
fn order_check(index: Option<&IndexView>) -> OrderCheck {
    let not = |why: &str| OrderCheck::NotChecked(why.to_string());
    let Some(run) = index.and_then(|ix| ix.reshard.as_ref()) else {
        return not("index.json has no reshard section (seed, epoch, order)");
    };
    let is_null = |v: &Option<serde_json::Value>| v.as_ref().is_none_or(serde_json::Value::is_null);
    let hygiene_clean = run.hygiene.as_ref().is_none_or(|h| {
        h.as_object()
            .is_some_and(|o| o.values().all(|v| v.as_u64() == Some(0)))
    });
    match (run.order.as_deref(), run.seed, run.epoch, run.samples) {
        (Some("shuffle"), Some(seed), Some(epoch), Some(samples)) => {
            if run.equalize != Equalize::None {
                not("--equalize moves samples after the shuffle; verify does not recompute it")
            } else if run.splits.is_some() || run.split.is_some() {
                not("--split: verify does not recompute the assignment of samples to splits")
            } else if run.key_map.is_some() {
                not("--key-map: verify does not recompute the key map's groups")
            } else if !is_null(&run.stratify) {
                not("--stratify-by: verify does not recompute the stratified order")
            } else if !hygiene_clean || run.output_samples.is_some_and(|o| o != samples) {
                not("samples were left out (incomplete, excluded or duplicate): the input positions the shuffle numbered are not the input's")
            } else {
                OrderCheck::Seeded {
                    seed,
                    epoch,
                    samples,
                }
            }
        }
        (Some("shuffle"), ..) => not("index.json lacks the seed, epoch or sample count"),
        (Some(other), ..) => OrderCheck::NotChecked(format!(
            "--order {other} (or --sort-by): verify does not recompute a sorted order"
        )),
        (None, ..) => not("index.json does not say the order"),
    }
}

/// The parts of index.json the verifier reads. Lenient on purpose: a wids index written by
/// another tool (no `reshard` section) is still checked against its shard list.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct IndexView {
    shardlist: Vec<ShardEntry>,
    #[serde(default)]
    pub(super) reshard: Option<RunView>,
}

#[derive(Debug, Clone, Deserialize)]
pub(super) struct RunView {
    shards: Option<u64>,
    pub(super) samples: Option<u64>,
    output_samples: Option<u64>,
    #[serde(default)]
    equalize: Equalize,
    #[serde(default)]
    pub(super) dropped: Vec<String>,
    #[serde(default)]
    pub(super) repeated: Vec<String>,
    #[serde(default)]
    pub(super) key_map: Option<KeyMapView>,
    #[serde(default)]
    pub(super) splits: Option<Vec<SplitView>>,
    /// In a split's own index.json: the split's name.
    #[serde(default)]
    pub(super) split: Option<String>,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    epoch: Option<u64>,
    #[serde(default)]
    order: Option<String>,
    #[serde(default)]
    stratify: Option<serde_json::Value>,
    #[serde(default)]
    hygiene: Option<serde_json::Value>,
}

/// One split of a `--split` output: its name is its directory.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct SplitView {
    #[serde(default)]
    pub(super) split: Option<String>,
    #[serde(default)]
    pub(super) shards: u64,
    #[serde(default)]
    pub(super) output_samples: u64,
}

/// What verify needs of a `--key-map` run: how many samples no group claimed.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct KeyMapView {
    #[serde(default)]
    pub(super) unmatched: u64,
}

/// Rank 0's own knowledge: index.json and the problems found while reading it.
pub(super) struct Lead {
    pub(super) index: Option<IndexView>,
    pub(super) problems: Vec<String>,
}

/// Rank 0 prepares, every rank receives the [`Setup`]; rank 0 also keeps its [`Lead`].
///
/// # Errors
/// As [`prepare`], on every rank.
pub(super) fn share(comm: &impl Comm, cfg: &VerifyConfig) -> Result<(Setup, Option<Lead>)> {
    let mut lead = None;
    let prepared = (comm.rank() == 0).then(|| {
        prepare(cfg).map(|(setup, state)| {
            lead = Some(state);
            setup
        })
    });
    let mut setup: Setup = broadcast_result(comm, 0, prepared)?;
    // Walked, cut again and handed to their readers as `run` does: a large directory and a
    // `--key-regex` root are read by several ranks.
    crate::job::walk::run(comm, &setup.trees, &mut setup.inputs, None)?;
    Ok((setup, lead))
}

/// Rank 0's set-up: expand the input, read index.json, find the output shards. Problems with
/// the output are collected, not raised.
///
/// # Errors
/// The input cannot be expanded or a shard's size read, or the output directory is not one.
fn prepare(cfg: &VerifyConfig) -> Result<(Setup, Lead)> {
    let mut inputs = input_shards(&cfg.inputs)?;
    let (units, trees) = crate::tree::expand(&cfg.files)?;
    inputs.extend(units);
    let dir = &cfg.output;
    let stat = storage::source(dir)
        .stat(dir)
        .with_context(|| format!("--output {}", dir.display()))?;
    if stat.kind != Kind::Dir {
        bail!("--output {}: not a directory", dir.display());
    }

    let mut problems = Vec::new();
    let index_path = dir.join("index.json");
    let index = read_index(&index_path, &mut problems);
    let outputs = match &index {
        Some(ix) => {
            let outputs = listed_outputs(dir, &index_path, ix, &mut problems);
            problems.extend(run_total_problems(&index_path, ix));
            outputs
        }
        // No usable index: check what is there, in name order.
        None => found_outputs(dir)?,
    };
    problems.extend(unlisted_shard_problems(dir, &outputs)?);
    for name in split_names(index.as_ref()) {
        // The output's index.json lists every split's shards: the multiset check then shows
        // that the splits together hold the input, each sample in one split only.
        let split = dir.join(&name);
        if storage::source(&split)
            .stat(&split)
            .is_ok_and(|s| s.kind == Kind::Dir)
        {
            problems.extend(unlisted_shard_problems(&dir.join(&name), &outputs)?);
        }
        if let Some(ix) = &index {
            problems.extend(split_index_problems(dir, &name, ix));
        }
    }
    let equalize = index
        .as_ref()
        .and_then(|ix| ix.reshard.as_ref())
        .map_or(Equalize::None, |r| r.equalize);
    let order = order_check(index.as_ref());
    Ok((
        Setup {
            inputs,
            trees,
            outputs,
            equalize,
            order,
        },
        Lead { index, problems },
    ))
}

/// The input shards the specs expand to, in canonical order, with their sizes.
fn input_shards(specs: &[String]) -> Result<Vec<InputShard>> {
    let mut inputs = Vec::new();
    for path in expand_specs(specs)? {
        let size = storage::stamp(&path)
            .with_context(|| format!("input {}", path.display()))?
            .size;
        inputs.push(InputShard { path, size });
    }
    Ok(inputs)
}

/// index.json, or `None` (and a problem) when it cannot be read or is not a wids index.
fn read_index(index_path: &Path, problems: &mut Vec<String>) -> Option<IndexView> {
    match storage::source(index_path).read(index_path) {
        Ok(bytes) => match serde_json::from_slice::<IndexView>(&bytes) {
            Ok(v) => Some(v),
            Err(e) => {
                problems.push(format!(
                    "{}: not a wids shard index: {e}",
                    index_path.display()
                ));
                None
            }
        },
        Err(e) => {
            problems.push(format!("{}: cannot read: {e}", index_path.display()));
            None
        }
    }
}

/// The shards index.json lists, in its order, less those that cannot be checked (a url outside
/// the directory, a second listing), which are problems.
fn listed_outputs(
    dir: &Path,
    index_path: &Path,
    ix: &IndexView,
    problems: &mut Vec<String>,
) -> Vec<OutputShard> {
    let mut outputs = Vec::new();
    let mut seen = HashSet::new();
    for entry in &ix.shardlist {
        if !is_inside(&entry.url) {
            problems.push(format!(
                "{}: shard url {:?} is not a relative path inside the output directory",
                index_path.display(),
                entry.url
            ));
            continue;
        }
        if !seen.insert(entry.url.clone()) {
            problems.push(format!(
                "{}: shard {:?} is listed twice",
                index_path.display(),
                entry.url
            ));
            continue;
        }
        outputs.push(listed_output(dir, entry, problems));
    }
    outputs
}

/// One listed shard: its file's size, and whether the file is there and as large as listed.
fn listed_output(dir: &Path, entry: &ShardEntry, problems: &mut Vec<String>) -> OutputShard {
    let path = dir.join(&entry.url);
    let size = match storage::source(&path).stat(&path) {
        Ok(s) if s.kind == Kind::File => Some(s.stamp.size),
        Ok(_) => {
            problems.push(format!(
                "{}: listed in index.json but not a regular file",
                path.display()
            ));
            None
        }
        Err(e) => {
            problems.push(format!(
                "{}: listed in index.json but missing ({e})",
                path.display()
            ));
            None
        }
    };
    if let Some(size) = size.filter(|&s| s != entry.filesize) {
        problems.push(format!(
            "{}: index.json says filesize {}, the file has {size} bytes",
            path.display(),
            entry.filesize
        ));
    }
    OutputShard {
        name: entry.url.clone(),
        path,
        size,
        listed: Some(entry.clone()),
    }
}

/// The split names a `--split` output's index.json gives.
fn split_names(index: Option<&IndexView>) -> Vec<String> {
    index
        .and_then(|ix| ix.reshard.as_ref())
        .and_then(|r| r.splits.as_ref())
        .map(|splits| splits.iter().filter_map(|s| s.split.clone()).collect())
        .unwrap_or_default()
}

/// Where a split's own index.json (what its loaders read) disagrees with the output's list of
/// that split's shards.
fn split_index_problems(dir: &Path, name: &str, ix: &IndexView) -> Vec<String> {
    let path = dir.join(name).join("index.json");
    let mut problems = Vec::new();
    let Some(own) = read_index(&path, &mut problems) else {
        return problems;
    };
    let prefix = format!("{name}/");
    let expected: Vec<ShardEntry> = ix
        .shardlist
        .iter()
        .filter_map(|e| {
            let url = e.url.strip_prefix(&prefix)?.to_string();
            Some(ShardEntry { url, ..e.clone() })
        })
        .collect();
    if own.shardlist != expected {
        problems.push(format!(
            "{}: lists {} shards ({} samples), but {} lists {} shards ({} samples) under {prefix}",
            path.display(),
            own.shardlist.len(),
            own.shardlist.iter().map(|e| e.nsamples).sum::<u64>(),
            dir.join("index.json").display(),
            expected.len(),
            expected.iter().map(|e| e.nsamples).sum::<u64>(),
        ));
    }
    problems
}

/// Where reshard's own totals in index.json disagree with its shard list.
fn run_total_problems(index_path: &Path, ix: &IndexView) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(run) = &ix.reshard else {
        return problems;
    };
    let listed: u64 = ix.shardlist.iter().map(|e| e.nsamples).sum();
    if let Some(s) = run.shards.filter(|&s| s != ix.shardlist.len() as u64) {
        problems.push(format!(
            "{}: reshard.shards is {s} but the shardlist has {} entries",
            index_path.display(),
            ix.shardlist.len()
        ));
    }
    if let Some(o) = run.output_samples.filter(|&o| o != listed) {
        problems.push(format!(
            "{}: reshard.output_samples is {o} but the shardlist's nsamples add up to {listed}",
            index_path.display()
        ));
    }
    problems
}

/// Without a usable index.json: the shard-like files of `dir`, in name order.
fn found_outputs(dir: &Path) -> Result<Vec<OutputShard>> {
    let mut outputs = Vec::new();
    for name in shard_like_files(dir)? {
        let path = dir.join(&name);
        let size = storage::stamp(&path).ok().map(|s| s.size);
        outputs.push(OutputShard {
            name,
            path,
            size,
            listed: None,
        });
    }
    Ok(outputs)
}

/// A problem for every shard-like file of `dir` that is not among `outputs`.
fn unlisted_shard_problems(dir: &Path, outputs: &[OutputShard]) -> Result<Vec<String>> {
    let known: HashSet<&Path> = outputs.iter().map(|o| o.path.as_path()).collect();
    let mut problems = Vec::new();
    for name in shard_like_files(dir)? {
        let path = dir.join(&name);
        if !known.contains(path.as_path()) {
            problems.push(format!(
                "{}: a shard file that index.json does not list",
                path.display()
            ));
        }
    }
    Ok(problems)
}

/// A shard url that names a file inside the output directory (no absolute path, no `..`).
fn is_inside(url: &str) -> bool {
    let path = Path::new(url);
    !url.is_empty() && path.components().all(|c| matches!(c, Component::Normal(_)))
}

/// Regular files of `dir` whose names look like tar shards (`*.tar`, `*.tar.*`, but not
/// energon's `*.tar.idx` indexes), sorted by name in byte order.
fn shard_like_files(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    let entries = storage::source(dir)
        .list(dir)
        .with_context(|| format!("--output {}", dir.display()))?;
    for entry in entries {
        let name = entry.name.to_string_lossy().into_owned();
        let tar_like = (name.ends_with(".tar") || name.contains(".tar."))
            && !name.ends_with(crate::output::energon::TAR_IDX_SUFFIX);
        if tar_like && entry.kind == Kind::File {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_must_stay_inside_the_output() {
        assert!(is_inside("shard-000000.tar"));
        assert!(is_inside("sub/shard.tar"));
        assert!(!is_inside("../x.tar"));
        assert!(!is_inside("/etc/passwd"));
        assert!(!is_inside("a/../../x.tar"));
        assert!(!is_inside(""));
    }
}
