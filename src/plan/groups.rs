//! The groups of output shards, each sized on its own: one group for a plain run, a key map's
//! templates, or `--split`'s splits. What the place phase knows about the job and about a
//! rank's samples, and how the sums over all ranks become each group's plan.

use anyhow::{anyhow, Result};

use super::order::OrderSpec;
use super::placement::{GroupPlan, LocalSample};
use super::{Equalize, Sizing};
use crate::key_map::SKIPPED as KEY_MAP_SKIPPED;

/// The groups of output shards, each sized on its own: a key map's templates or `--split`'s
/// splits, and the group of every local sample.
pub(crate) struct Grouping<'a> {
    /// The key map's templates, or the split names.
    pub(crate) names: Vec<String>,
    /// Per local sample: its group, or [`KEY_MAP_SKIPPED`].
    pub(crate) group_of: &'a [u32],
    /// `Some` for `--split`.
    pub(crate) split: Option<SplitGroups<'a>>,
}

/// What `--split` adds to its groups.
pub(crate) struct SplitGroups<'a> {
    /// Per split: `--split-shards` (`None`: the sizing flags for the first split, the first
    /// split's mean shard size for the others).
    pub(crate) shards: &'a [Option<u64>],
    /// Per local sample: its rank inside its split.
    pub(crate) rank: &'a [u64],
}

/// What placing needs to know about the job.
pub(crate) struct OrderJob<'a> {
    pub(crate) spec: &'a OrderSpec,
    /// The key map's or the splits' groups.
    pub(crate) groups: Option<&'a Grouping<'a>>,
    pub(crate) seed: u64,
    pub(crate) epoch: u64,
    pub(crate) equalize: Equalize,
    pub(crate) sizing: Sizing,
    /// Samples over all ranks.
    pub(crate) samples: u64,
}

impl OrderJob<'_> {
    /// Per local sample: its group, when there are groups.
    pub(crate) fn group_of(&self) -> Option<&[u32]> {
        self.groups.map(|g| g.group_of)
    }

    /// What `--split` adds, when the groups are splits.
    pub(crate) fn split(&self) -> Option<&SplitGroups<'_>> {
        self.groups.and_then(|g| g.split.as_ref())
    }
}

/// What placing needs to know about this rank's samples (in input order).
pub(crate) struct LocalSamples<'a> {
    pub(crate) first_global: u64,
    pub(crate) samples: &'a [LocalSample],
    /// Keys, when [`OrderSpec::needs_keys`].
    pub(crate) keys: &'a [Vec<u8>],
    /// Member contents, when [`OrderSpec::member`].
    pub(crate) contents: &'a [Option<Vec<u8>>],
    /// `FILE: sample "KEY"` for messages.
    pub(crate) describe: &'a dyn Fn(usize) -> String,
}

/// This rank's share of what sizes the groups: per group its samples, then per group its
/// bytes, then the samples no group claimed. [`size_groups`] reads the sum over all ranks.
pub(crate) fn local_sums(job: &OrderJob<'_>, samples: &[LocalSample]) -> Vec<u64> {
    let group_of = job.group_of();
    let ngroups = job.groups.map_or(1, |g| g.names.len());
    let mut sums = vec![0u64; 2 * ngroups + 1];
    for (i, sample) in samples.iter().enumerate() {
        match group_of.as_ref().map(|g| g[i]) {
            Some(KEY_MAP_SKIPPED) => sums[2 * ngroups] += 1,
            g => {
                let g = g.unwrap_or(0) as usize;
                sums[g] += 1;
                sums[ngroups + g] += sample.len;
            }
        }
    }
    sums
}

/// Every group's samples, bytes and shard count from the [`local_sums`] summed over all ranks,
/// and the samples no group claimed.
///
/// # Errors
/// Sizing that does not fit a group (named), or no sample in any group; alike on every rank.
pub(crate) fn size_groups(job: &OrderJob<'_>, sums: &[u64]) -> Result<(Vec<GroupPlan>, u64)> {
    let ngroups = job.groups.map_or(1, |g| g.names.len());
    let unmatched = sums[2 * ngroups];
    let mut groups: Vec<GroupPlan> = Vec::with_capacity(ngroups);
    for g in 0..ngroups {
        let (n, bytes) = (sums[g], sums[ngroups + g]);
        let name = job.groups.map(|gr| gr.names[g].clone());
        let (shards, sizing) = group_shards(job, g, (n, bytes), &groups)?;
        let mut group = GroupPlan::after(groups.last(), (n, bytes), shards, job.equalize);
        match job.split() {
            Some(_) => group.split = name,
            None => group.template = name,
        }
        group.sizing = sizing;
        groups.push(group);
    }
    if groups.iter().all(|g| g.shards == 0) {
        return Err(anyhow!(
            "no sample matched the key map: nothing to write ({unmatched} unmatched, skipped)"
        ));
    }
    Ok((groups, unmatched))
}

/// The shard count of group `g` (of `n` samples of `bytes` bytes), and why.
fn group_shards(
    job: &OrderJob<'_>,
    g: usize,
    (n, bytes): (u64, u64),
    sized: &[GroupPlan],
) -> Result<(u64, String)> {
    if n == 0 {
        return Ok((0, "no samples".to_string()));
    }
    let name = job.groups.map(|gr| &gr.names[g]);
    let (sizing, default) = group_sizing(job, g, n, sized);
    let split_shards = job.split().is_some() && g > 0 && matches!(sizing, Sizing::Count(_));
    // `--split-shards N` is sized as `--shards N` is, and named as given.
    let flag = |text: String| {
        if split_shards {
            text.replacen("--shards", "--split-shards", 1)
        } else {
            text
        }
    };
    let (shards, why) = sizing.shards(n, bytes).map_err(|e| {
        let e = anyhow!(flag(format!("{e:#}")));
        match (name, job.split()) {
            (Some(t), None) => e.context(format!("key-map group {t:?}")),
            (Some(t), Some(_)) => e.context(format!("split {t:?}")),
            (None, _) => e,
        }
    })?;
    Ok((shards, format!("{default}{}", flag(why))))
}

/// How group `g` (of `n` samples) is sized, and what to say about a default: the sizing flags,
/// except for the splits after the first, which `--split-shards` sizes, or else the first
/// split's mean shard size; with `--gpus`, a multiple of the GPU count near that size (one
/// loader worker each), so that every GPU gets evaluation shards.
fn group_sizing(job: &OrderJob<'_>, g: usize, n: u64, sized: &[GroupPlan]) -> (Sizing, String) {
    let Some(split) = job.split().filter(|_| g > 0) else {
        return (job.sizing, String::new());
    };
    if let Some(count) = split.shards[g] {
        return (Sizing::Count(count), String::new());
    }
    let first = &sized[0];
    let size = (first.sample_bytes / first.shards.max(1)).max(1);
    let name = first.split.as_deref().unwrap_or("the first split");
    match job.sizing {
        Sizing::Gpus { gpus, .. } if gpus <= n => (
            Sizing::Gpus {
                gpus,
                workers: 1,
                size,
            },
            format!("no --split-shards, so a multiple of the GPUs near {name}'s mean shard size: "),
        ),
        _ => (
            Sizing::Size(size),
            format!("no --split-shards, so {name}'s mean shard size: "),
        ),
    }
}

/// Why this many shards, over all groups: `key_map_groups` is the key map's group count, `split`
/// whether the groups are `--split`'s.
pub(crate) fn describe_sizing(
    groups: &[GroupPlan],
    key_map_groups: Option<usize>,
    split: bool,
) -> String {
    let each = |label: &dyn Fn(&GroupPlan) -> &str| {
        groups
            .iter()
            .map(|g| format!("{} ({})", label(g), g.sizing))
            .collect::<Vec<_>>()
            .join("; ")
    };
    match key_map_groups {
        None if split => format!(
            "{} splits, each sized on its own: {}",
            groups.len(),
            each(&|g| g.split.as_deref().unwrap_or(""))
        ),
        None => groups[0].sizing.clone(),
        Some(n) => format!(
            "{n} key-map groups, each sized on its own: {}",
            each(&|g| g.template.as_deref().unwrap_or(""))
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(lens: &[u64]) -> Vec<LocalSample> {
        lens.iter()
            .map(|&len| LocalSample {
                shard: 0,
                start: 0,
                len,
            })
            .collect()
    }

    fn job<'a>(
        spec: &'a OrderSpec,
        groups: Option<&'a Grouping<'a>>,
        sizing: Sizing,
    ) -> OrderJob<'a> {
        OrderJob {
            spec,
            groups,
            seed: 1,
            epoch: 0,
            equalize: Equalize::None,
            sizing,
            samples: 0,
        }
    }

    #[test]
    fn local_sums_count_samples_and_bytes_per_group_and_the_unmatched() {
        let spec = OrderSpec::default();
        let grouping = Grouping {
            names: vec!["a".into(), "b".into()],
            group_of: &[1, KEY_MAP_SKIPPED, 0, 1],
            split: None,
        };
        let sums = local_sums(
            &job(&spec, Some(&grouping), Sizing::Count(1)),
            &samples(&[10, 20, 30, 40]),
        );
        assert_eq!(sums, [1, 2, 30, 50, 1]);
        let plain = local_sums(&job(&spec, None, Sizing::Count(1)), &samples(&[10, 20]));
        assert_eq!(plain, [2, 30, 0]);
    }

    #[test]
    fn groups_follow_each_other_in_ranks_positions_and_shards() {
        let spec = OrderSpec::default();
        let grouping = Grouping {
            names: vec!["a/{}".into(), "b/{}".into(), "c/{}".into()],
            group_of: &[],
            split: None,
        };
        let mut j = job(&spec, Some(&grouping), Sizing::Count(2));
        j.equalize = Equalize::Pad;
        // 5, 0 and 4 samples.
        let (groups, unmatched) = size_groups(&j, &[5, 0, 4, 500, 0, 400, 3]).unwrap();
        assert_eq!(unmatched, 3);
        let got: Vec<_> = groups
            .iter()
            .map(|g| {
                (
                    g.shards,
                    g.output_samples,
                    g.rank_start,
                    g.out_start,
                    g.shard_start,
                )
            })
            .collect();
        assert_eq!(got, [(2, 6, 0, 0, 0), (0, 0, 5, 6, 2), (2, 4, 5, 6, 2)]);
        assert_eq!(groups[1].sizing, "no samples");
        assert_eq!(groups[2].template.as_deref(), Some("c/{}"));
        let text = describe_sizing(&groups, Some(3), false);
        assert_eq!(
            text,
            "3 key-map groups, each sized on its own: a/{} (--shards 2); b/{} (no samples); c/{} (--shards 2)"
        );
    }

    #[test]
    fn no_sample_in_any_group_is_an_error() {
        let spec = OrderSpec::default();
        let grouping = Grouping {
            names: vec!["a/{}".into()],
            group_of: &[],
            split: None,
        };
        let e =
            size_groups(&job(&spec, Some(&grouping), Sizing::Count(2)), &[0, 0, 7]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no sample matched the key map: nothing to write (7 unmatched, skipped)"
        );
    }

    #[test]
    fn later_splits_are_sized_by_split_shards_or_the_first_splits_mean_shard() {
        let spec = OrderSpec::default();
        let shards = [None, Some(9), None];
        let grouping = Grouping {
            names: vec!["train".into(), "val".into(), "test".into()],
            group_of: &[],
            split: Some(SplitGroups {
                shards: &shards,
                rank: &[],
            }),
        };
        // train: 40 samples of 4000 bytes in 4 shards (1000 bytes each); val asks for 9 of 5.
        let sums = [40, 5, 3, 4000, 500, 300, 0];
        let e = size_groups(&job(&spec, Some(&grouping), Sizing::Count(4)), &sums).unwrap_err();
        assert_eq!(
            format!("{e:#}"),
            "split \"val\": --split-shards 9 is more than the 5 samples in the input: every shard needs at least one sample"
        );
        let mut sums = sums;
        sums[1] = 20;
        sums[4] = 2000;
        let (groups, _) =
            size_groups(&job(&spec, Some(&grouping), Sizing::Count(4)), &sums).unwrap();
        let counts: Vec<u64> = groups.iter().map(|g| g.shards).collect();
        assert_eq!(counts, [4, 9, 1]);
        assert_eq!(groups[1].sizing, "--split-shards 9");
        assert!(
            groups[2]
                .sizing
                .starts_with("no --split-shards, so train's mean shard size: --shard-size 1000 B"),
            "{}",
            groups[2].sizing
        );
        assert!(describe_sizing(&groups, None, true).starts_with("3 splits, each sized on its own: train (--shards 4); val (--split-shards 9); test (no --split-shards"));
        // With --gpus, a multiple of the GPUs, unless the split has fewer samples than GPUs.
        let gpus = Sizing::Gpus {
            gpus: 4,
            workers: 1,
            size: 1000,
        };
        let (groups, _) = size_groups(&job(&spec, Some(&grouping), gpus), &sums).unwrap();
        assert_eq!(groups[0].shards % 4, 0);
        assert_eq!(
            groups[2].shards, 1,
            "3 samples, 4 GPUs: sized by the mean shard size"
        );
        assert!(groups[2].sizing.contains("so train's mean shard size"));
    }
}
