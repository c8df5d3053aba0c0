//! `--split`, in the place phase: the split of every local sample and its rank inside the
//! split. A pure function of the seed and the input (never of the epoch or the rank count):
//! the split rank of sample `g` is π_split(g), or with `--stratify-by` its rank in the order
//! (label, π_split(g)), found by a distributed sort; [`SplitDeal`] turns it into (split, rank).

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Result};

use crate::comm::sort::{global_ranks, Item};
use crate::comm::{agree, agree_once, everywhere, exclusive_sum, Comm};
use crate::config::SplitSettings;
use crate::input::{split_names, InputShard};
use crate::job::planning::runs::total_runs;
use crate::plan::order::OrderSpec;
use crate::plan::permute::Permutation;
use crate::plan::placement::LocalSample;
use crate::plan::runs::Runs;
use crate::plan::sort_key::label_key;
use crate::plan::split::SplitDeal;

/// Every local sample's split.
pub(crate) struct Assigned {
    /// Per local sample: its split (an index into `--split`'s list).
    pub(crate) split_of: Vec<u32>,
    /// Per local sample: its rank inside its split, in `0..counts[split]`.
    pub(crate) rank: Vec<u64>,
    /// Samples per split, over all ranks.
    pub(crate) counts: Vec<u64>,
    /// With `--stratify-by`: the labels, and the worst |count − share| of any label in any
    /// split.
    pub(crate) stratified: Option<(u64, f64)>,
}

/// What the assignment reads of this rank's samples.
pub(crate) struct Labels<'a> {
    pub(crate) spec: &'a OrderSpec,
    /// Member contents, one per local sample.
    pub(crate) contents: &'a [Option<Vec<u8>>],
    /// `FILE: sample "KEY"` for messages.
    pub(crate) describe: &'a dyn Fn(usize) -> String,
}

/// This rank's samples and where they come from.
pub(crate) struct Own<'a> {
    pub(crate) inputs: &'a [InputShard],
    /// In input order, global indices `first_global..`.
    pub(crate) samples: &'a [LocalSample],
    pub(crate) first_global: u64,
    /// Over all ranks.
    pub(crate) total: u64,
}

/// Deals this rank's samples to the splits, or, when the input is itself a split output with
/// the same splits, keeps each sample in the split it is read from.
///
/// # Errors
/// Split counts that do not fit the sample count (a split with no sample), a sample without
/// the label `--stratify-by` reads, or a split input whose splits are not `--split`'s; on every
/// rank.
pub(crate) fn assign(
    comm: &impl Comm,
    settings: &SplitSettings,
    own: &Own<'_>,
    labels: &Labels<'_>,
) -> Result<Assigned> {
    let (lead, splits, seed) = (comm.rank() == 0, &settings.splits, settings.seed);
    let names = splits.spec.names();
    if let Some(of_input) = agree_once(comm, inherited(own.inputs, &names))? {
        let kept = keep_splits(comm, &of_input, own.samples, names.len());
        if let Some(k) = kept.counts.iter().position(|&c| c == 0) {
            return Err(everywhere(
                lead,
                anyhow::anyhow!(
                    "split {:?} of the input has no samples left: nothing to write for it",
                    names[k]
                ),
            ));
        }
        return Ok(kept);
    }
    let (samples, first_global, local) = (own.total, own.first_global, own.samples.len());
    let counts = splits
        .spec
        .counts(samples)
        .map_err(|e| everywhere(lead, e))?;
    let deal = SplitDeal::new(counts.clone());
    let permutation = Permutation::split_assignment(seed, samples);
    let global = |i: usize| first_global + i as u64;
    let (split_ranks, stratified): (Vec<u64>, Option<(u64, f64)>) = match &labels.spec.stratify_by {
        None => (
            (0..local).map(|i| permutation.apply(global(i))).collect(),
            None,
        ),
        Some(ext) => {
            let items = (0..local)
                .map(|i| {
                    let label = label_key(labels.contents[i].as_deref(), ext, labels.spec, || {
                        (labels.describe)(i)
                    })?;
                    Ok(Item {
                        key: label,
                        tie: permutation.apply(global(i)),
                    })
                })
                .collect::<Result<Vec<Item>>>();
            let items = agree(comm, items)?;
            let deviation = |a: u64, n: u64| deal.deviation(a, n);
            let mut runs = Runs::default();
            let ranks = global_ranks(comm, &items, &mut |start, bucket| {
                runs = Runs::of(start, bucket, &deviation);
            })?;
            (ranks, Some(total_runs(comm, &runs, &deviation)?))
        }
    };
    let (split_of, rank): (Vec<u32>, Vec<u64>) = split_ranks
        .into_iter()
        .map(|j| {
            let (k, r) = deal.of_rank(j);
            (k as u32, r)
        })
        .unzip();
    Ok(Assigned {
        split_of,
        rank,
        counts,
        stratified,
    })
}

/// When every input shard lies in a split directory of a `--split` output (`OUTPUT/NAME/…`,
/// with `OUTPUT/index.json` naming the splits) whose splits are `names`: the split of each input
/// shard. `None` when no input comes from a split output.
///
/// # Errors
/// Some inputs from a split output and others not, or a split output with other splits.
fn inherited(inputs: &[InputShard], names: &[String]) -> Result<Option<Vec<u32>>> {
    let mut roots: HashMap<&Path, Option<Vec<String>>> = HashMap::new();
    let mut of_input = Vec::with_capacity(inputs.len());
    for input in inputs {
        let parent = input.path.parent().unwrap_or(Path::new(""));
        let root = parent.parent().unwrap_or(Path::new(""));
        let found = roots.entry(root).or_insert_with(|| split_names(root));
        let name = parent.file_name().map(|n| n.to_string_lossy().into_owned());
        let k = match (found.as_ref(), name) {
            (Some(found), Some(name)) if found.contains(&name) => {
                if found.as_slice() != names {
                    bail!(
                        "{}: a split output with the splits {}, and --split names {}: name the same splits in the same order (every sample keeps the split it is read from)",
                        root.display(),
                        found.join(", "),
                        names.join(", ")
                    );
                }
                Some(names.iter().position(|n| *n == name).unwrap() as u32)
            }
            _ => None,
        };
        of_input.push(k);
    }
    match of_input.iter().position(Option::is_none) {
        _ if of_input.iter().all(Option::is_none) => Ok(None),
        None => Ok(Some(of_input.into_iter().map(Option::unwrap).collect())),
        Some(i) => bail!(
            "input {} is not a split of a --split output, but other inputs are: give the split output alone (its samples keep their splits) or only other inputs",
            inputs[i].path.display()
        ),
    }
}

/// Every sample stays in the split of its input shard; its rank inside the split counts the
/// split's samples on earlier ranks, then on this one, in input order.
fn keep_splits(
    comm: &impl Comm,
    of_input: &[u32],
    samples: &[LocalSample],
    splits: usize,
) -> Assigned {
    let split_of: Vec<u32> = samples.iter().map(|s| of_input[s.shard as usize]).collect();
    let mut mine = vec![0u64; splits];
    for &k in &split_of {
        mine[k as usize] += 1;
    }
    let (mut next, counts): (Vec<u64>, Vec<u64>) =
        mine.iter().map(|&m| exclusive_sum(comm, m)).unzip();
    let rank = split_of
        .iter()
        .map(|&k| {
            next[k as usize] += 1;
            next[k as usize] - 1
        })
        .collect();
    Assigned {
        split_of,
        rank,
        counts,
        stratified: None,
    }
}
