//! Phase "place": the output position of every sample, and the groups of output shards. The
//! plain shuffle needs no communication beyond the group sizes (the permutation answers it);
//! every other order is a distributed sort ([`crate::comm::sort`]).

use anyhow::{anyhow, bail, Result};

use crate::config::RunConfig;
use crate::input::InputShard;
use crate::job::index::Index;
use crate::output::ShardNames;
use crate::report::narrate;
use crate::size::{count, human_bytes};
use crate::tar::key_at;

use crate::comm::sort::{global_ranks, Item};
use crate::comm::{agree, agree_once, everywhere, Comm};
use crate::config::Splits;
use crate::job::runs::Runs;
use crate::job::split::{self, Assigned, Labels, Own};
use crate::key_map::{KeyMap, SKIPPED as KEY_MAP_SKIPPED};
use crate::plan::deal::Deal;
use crate::plan::order::{Missing, OrderBy, OrderSpec};
use crate::plan::permute::Permutation;
use crate::plan::placement::{GroupPlan, LocalSample, Placement, StratifyReport, DROPPED, SKIPPED};
use crate::plan::sort_key::{label_key, of_key, value_key};
use crate::plan::{Equalize, ShardPlan, Sizing, Targets};

/// What the place phase leaves on every rank.
pub struct Placed {
    pub placement: Placement,
    pub groups: Vec<GroupPlan>,
    /// Samples no key-map group claimed (left out by `--unmatched skip`).
    pub unmatched: u64,
    pub stratify: Option<StratifyReport>,
    /// Over all groups: shards, samples written, samples dropped and repeated by `--equalize`.
    pub shards: u64,
    pub output_samples: u64,
    pub dropped: u64,
    pub repeated: u64,
    /// Why this many shards.
    pub sizing: String,
    pub names: ShardNames,
}

/// Gives every sample its output position, by the seeded permutation or the order the flags ask
/// for, in the groups of a key map or of `--split`. Consumes the keys and labels the index phase
/// kept.
///
/// # Errors
/// As [`positions`], a key map that fails to load or differs between ranks, or two shards that
/// would get one name.
pub fn run(
    comm: &impl Comm,
    cfg: &RunConfig,
    inputs: &[InputShard],
    index: &mut Index,
) -> Result<Placed> {
    let lead = comm.rank() == 0;
    let keys = std::mem::take(&mut index.keys);
    let contents = std::mem::take(&mut index.contents);
    let local = &index.local;
    let describe = |i: usize| {
        let s = &local[i];
        let path = &inputs[s.shard as usize].path;
        let key = match keys.get(i) {
            Some(k) => String::from_utf8_lossy(k).into_owned(),
            None => key_at(path, s.start, s.len).unwrap_or_else(|e| format!("<{e:#}>")),
        };
        format!(
            "{}: sample {key:?} (byte offset {})",
            path.display(),
            s.start
        )
    };
    let key_map = load_key_map(comm, cfg, &keys, &describe)?;
    let assigned = match &cfg.split {
        Some(splits) => Some(split::assign(
            comm,
            splits,
            cfg.seed,
            &Own {
                inputs,
                samples: local,
                first_global: index.first_global,
                total: index.samples,
            },
            &Labels {
                spec: &cfg.order,
                contents: &contents,
                describe: &describe,
            },
        )?),
        None => None,
    };
    let grouping = Grouping::of(key_map.as_ref(), cfg.split.as_ref().zip(assigned.as_ref()));
    let mut ordered = positions(
        comm,
        &OrderJob {
            spec: &cfg.order,
            groups: grouping.as_ref(),
            seed: cfg.seed,
            epoch: cfg.epoch,
            equalize: cfg.equalize,
            sizing: cfg.sizing,
            samples: index.samples,
            sample_bytes: index.sample_bytes,
        },
        &LocalSamples {
            first_global: index.first_global,
            samples: local,
            keys: &keys,
            contents: &contents,
            describe: &describe,
        },
    )?;
    drop((keys, contents));
    if let (Some(st), Some((labels, worst))) = (
        &mut ordered.stratify,
        assigned.as_ref().and_then(|a| a.stratified),
    ) {
        // The shard-level runs are (split, label) pairs; the assignment saw the labels.
        st.labels = labels;
        st.split_deviation = Some(worst);
    }
    let placed = Placed::new(cfg, ordered, key_map.as_ref().map(|(map, _)| map));
    narrate_placed(lead, cfg, index, &placed);
    placed
        .names
        .check_distinct(placed.shards)
        .map_err(|e| everywhere(lead, e))?;
    Ok(placed)
}

/// `--key-map`: the map, and the group of each local sample. Every rank reads the file itself:
/// a map that changed under the job, or differs between nodes, would make ranks disagree on the
/// groups.
fn load_key_map(
    comm: &impl Comm,
    cfg: &RunConfig,
    keys: &[Vec<u8>],
    describe: &dyn Fn(usize) -> String,
) -> Result<Option<(KeyMap, Vec<u32>)>> {
    let Some(path) = &cfg.order.key_map else {
        return Ok(None);
    };
    let loaded = KeyMap::load(path, cfg.order.unmatched.clone(), keys, describe);
    let (map, group_of) = agree_once(comm, loaded)?;
    let digests = comm.all_gather(map.digest() >> 1);
    if digests.iter().any(|&d| d != digests[0]) {
        return Err(everywhere(
            comm.rank() == 0,
            anyhow!(
                "{}: the ranks read different key maps (changed during the run, or not the same file on every node)",
                path.display()
            ),
        ));
    }
    Ok(Some((map, group_of)))
}

impl Placed {
    fn new(cfg: &RunConfig, ordered: Ordered, key_map: Option<&KeyMap>) -> Placed {
        let Ordered {
            placement,
            groups,
            unmatched,
            stratify,
        } = ordered;
        let shards: u64 = groups.iter().map(|g| g.shards).sum();
        let output_samples: u64 = groups.iter().map(|g| g.output_samples).sum();
        let dropped = groups.iter().map(|g| g.targets.dropped()).sum();
        let repeated = groups.iter().map(|g| g.targets.repeated()).sum();
        let sizing = match key_map {
            None if cfg.split.is_some() => format!(
                "{} splits, each sized on its own: {}",
                groups.len(),
                groups
                    .iter()
                    .map(|g| format!("{} ({})", g.split.as_deref().unwrap_or(""), g.sizing))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            None => groups[0].sizing.clone(),
            Some(map) => format!(
                "{} key-map groups, each sized on its own: {}",
                map.groups.len(),
                groups
                    .iter()
                    .map(|g| format!("{} ({})", g.template.as_deref().unwrap_or(""), g.sizing))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        };
        let names = match key_map {
            None if cfg.split.is_some() => ShardNames::Splits {
                prefix: cfg.prefix.clone(),
                splits: groups
                    .iter()
                    .map(|g| (g.shard_start, g.split.clone().unwrap_or_default()))
                    .collect(),
            },
            None => ShardNames::Prefix(cfg.prefix.clone()),
            Some(map) => ShardNames::Groups(
                groups
                    .iter()
                    .zip(&map.groups)
                    .filter(|(g, _)| g.shards > 0)
                    .map(|(g, t)| (g.shard_start, t.clone()))
                    .collect(),
            ),
        };
        Placed {
            placement,
            groups,
            unmatched,
            stratify,
            shards,
            output_samples,
            dropped,
            repeated,
            sizing,
            names,
        }
    }
}

/// Rank 0 says what the plan is.
fn narrate_placed(lead: bool, cfg: &RunConfig, index: &Index, placed: &Placed) {
    narrate(
        lead,
        format_args!(
            "{}, {} of sample data -> {} ({}), order: {}",
            count(index.samples, "sample"),
            human_bytes(index.sample_bytes),
            count(placed.shards, "shard"),
            placed.sizing,
            cfg.order.describe()
        ),
    );
    if placed.unmatched > 0 {
        narrate(
            lead,
            format_args!(
                "{} samples matched no key-map group and are left out",
                placed.unmatched
            ),
        );
    }
    if let Some(st) = &placed.stratify {
        narrate(
            lead,
            format_args!(
                "stratified by .{}: {} labels, worst deviation from the ideal share per shard {:.3}",
                st.ext, st.labels, st.worst_deviation
            ),
        );
    }
}

/// The order's answer for this rank.
pub struct Ordered {
    pub placement: Placement,
    pub groups: Vec<GroupPlan>,
    /// Samples no key-map group claimed (left out by `--unmatched skip`).
    pub unmatched: u64,
    pub stratify: Option<StratifyReport>,
}

/// The groups of output shards, each sized on its own: a key map's templates or `--split`'s
/// splits, and the group of every local sample.
pub struct Grouping<'a> {
    /// The key map's templates, or the split names.
    pub names: Vec<String>,
    /// Per local sample: its group, or [`KEY_MAP_SKIPPED`].
    pub group_of: &'a [u32],
    /// `Some` for `--split`.
    pub split: Option<SplitGroups<'a>>,
}

/// What `--split` adds to its groups.
pub struct SplitGroups<'a> {
    /// Per split: `--split-shards` (`None`: the sizing flags for the first split, the first
    /// split's mean shard size for the others).
    pub shards: &'a [Option<u64>],
    /// Per local sample: its rank inside its split.
    pub rank: &'a [u64],
}

impl<'a> Grouping<'a> {
    fn of(
        key_map: Option<&'a (KeyMap, Vec<u32>)>,
        split: Option<(&'a Splits, &'a Assigned)>,
    ) -> Option<Grouping<'a>> {
        if let Some((map, group_of)) = key_map {
            return Some(Grouping {
                names: map.groups.iter().map(|t| t.text.clone()).collect(),
                group_of,
                split: None,
            });
        }
        split.map(|(splits, assigned)| Grouping {
            names: splits.spec.names(),
            group_of: &assigned.split_of,
            split: Some(SplitGroups {
                shards: &splits.shards,
                rank: &assigned.rank,
            }),
        })
    }
}

/// What `place` needs to know about the job.
pub struct OrderJob<'a> {
    pub spec: &'a OrderSpec,
    /// The key map's or the splits' groups.
    pub groups: Option<&'a Grouping<'a>>,
    pub seed: u64,
    pub epoch: u64,
    pub equalize: Equalize,
    pub sizing: Sizing,
    /// Samples and sample bytes over all ranks.
    pub samples: u64,
    pub sample_bytes: u64,
}

impl OrderJob<'_> {
    fn group_of(&self) -> Option<&[u32]> {
        self.groups.map(|g| g.group_of)
    }

    fn split(&self) -> Option<&SplitGroups<'_>> {
        self.groups.and_then(|g| g.split.as_ref())
    }
}

/// What `place` needs to know about this rank's samples (in input order).
pub struct LocalSamples<'a> {
    pub first_global: u64,
    pub samples: &'a [LocalSample],
    /// Keys, when [`OrderSpec::needs_keys`].
    pub keys: &'a [Vec<u8>],
    /// Member contents, when [`OrderSpec::member`].
    pub contents: &'a [Option<Vec<u8>>],
    /// `FILE: sample "KEY"` for messages.
    pub describe: &'a dyn Fn(usize) -> String,
}

/// The output position of every local sample, and the groups of output shards.
///
/// # Errors
/// A sample without the member the order reads or with content that does not parse (unless
/// `--missing last`), a key-map failure, or sizing that does not fit a group; on every rank
/// (the cause on the rank that found it, or on rank 0 when every rank finds it).
pub fn positions(
    comm: &impl Comm,
    job: &OrderJob<'_>,
    local: &LocalSamples<'_>,
) -> Result<Ordered> {
    let (groups, unmatched) = size_groups(comm, job, local)?;
    let permutation = Permutation::new(job.seed, job.epoch, job.samples);
    if job.spec.is_shuffle() && job.groups.is_none() {
        return Ok(Ordered {
            placement: Placement::Permuted {
                permutation,
                targets: groups[0].targets,
                first_global: local.first_global,
            },
            groups,
            unmatched,
            stratify: None,
        });
    }
    // Inside each split, its own permutation of the split's ranks, for this epoch.
    let in_split: Vec<Permutation> = match job.split() {
        Some(_) => (0..groups.len())
            .map(|k| Permutation::in_split(job.seed, job.epoch, groups[k].samples, k as u16))
            .collect(),
        None => Vec::new(),
    };
    let plain_split = job.spec.by == OrderBy::Shuffle && job.spec.stratify_by.is_none();
    if let (Some(split), true) = (job.split(), plain_split) {
        return Ok(Ordered {
            placement: split_positions(job, split, &groups, &in_split),
            groups,
            unmatched,
            stratify: None,
        });
    }
    let sortable = agree(
        comm,
        sort_items(job, local, &groups, &permutation, &in_split),
    )?;
    let SortItems {
        items,
        owners,
        mut first,
    } = sortable;
    // Stratified: each group (one, or one per split) is dealt on its own.
    let deals: Option<Vec<Deal>> = job.spec.stratify_by.is_some().then(|| {
        groups
            .iter()
            .map(|g| Deal::new(g.output_samples, g.shards))
            .collect()
    });
    let deviation = |a: u64, n: u64| {
        let deals = deals.as_ref().expect("stratified");
        let k = groups.partition_point(|g| g.out_start <= a) - 1;
        deals[k].deviation(a - groups[k].out_start, n)
    };
    let mut runs = Runs::default();
    let ranks = global_ranks(comm, &items, &mut |start, bucket| {
        if deals.is_some() {
            runs = Runs::of(start, bucket, &deviation);
        }
    })?;
    drop(items);
    let mut again = match &deals {
        Some(deals) => deal_positions(job, &groups, deals, &ranks, &owners, &mut first),
        None => rank_positions(job, &groups, &ranks, &owners, &mut first),
    };
    again.sort_unstable();
    let stratify = match &job.spec.stratify_by {
        Some(ext) if deals.is_some() => {
            let (labels, worst) = runs.total(comm, &deviation)?;
            Some(StratifyReport {
                ext: ext.clone(),
                labels,
                worst_deviation: worst,
                split_deviation: None,
            })
        }
        _ => None,
    };
    Ok(Ordered {
        placement: Placement::Listed { first, again },
        groups,
        unmatched,
        stratify,
    })
}

/// `--split` with the plain shuffle: sample of rank `r` in split `k` goes to position
/// π_k(r) of the split, by its own permutation; no communication.
fn split_positions(
    job: &OrderJob<'_>,
    split: &SplitGroups<'_>,
    groups: &[GroupPlan],
    in_split: &[Permutation],
) -> Placement {
    let group_of = job.group_of().expect("split groups");
    let mut first = Vec::with_capacity(group_of.len());
    let mut again = Vec::new();
    for (i, (&k, &r)) in group_of.iter().zip(split.rank).enumerate() {
        let k = k as usize;
        let group = &groups[k];
        let q = in_split[k].apply(r);
        let mut at = group.targets.of(q);
        first.push(match at.next() {
            Some(p) => group.out_start + p,
            None => DROPPED | (group.rank_start + q),
        });
        if let Some(p) = at.next() {
            again.push((i as u64, group.out_start + p));
        }
    }
    Placement::Listed { first, again }
}

/// Every group's samples, bytes and shard count (summed over all ranks), and the samples no
/// group claimed.
fn size_groups(
    comm: &impl Comm,
    job: &OrderJob<'_>,
    local: &LocalSamples<'_>,
) -> Result<(Vec<GroupPlan>, u64)> {
    let lead = comm.rank() == 0;
    let group_of = job.group_of();
    let ngroups = job.groups.map_or(1, |g| g.names.len());
    // Per group: samples, then bytes; then the unmatched samples.
    let mut sums = vec![0u64; 2 * ngroups + 1];
    for (i, sample) in local.samples.iter().enumerate() {
        match group_of.as_ref().map(|g| g[i]) {
            Some(KEY_MAP_SKIPPED) => sums[2 * ngroups] += 1,
            g => {
                let g = g.unwrap_or(0) as usize;
                sums[g] += 1;
                sums[ngroups + g] += sample.len;
            }
        }
    }
    let sums = comm.all_sum(&sums);
    let unmatched = sums[2 * ngroups];
    let mut groups: Vec<GroupPlan> = Vec::with_capacity(ngroups);
    let (mut rank_start, mut out_start, mut shard_start) = (0, 0, 0);
    for g in 0..ngroups {
        let (n, bytes) = (sums[g], sums[ngroups + g]);
        let name = job.groups.map(|gr| gr.names[g].clone());
        let (sizing, default) = group_sizing(job, g, n, &groups);
        let split_shards = job.split().is_some() && g > 0 && matches!(sizing, Sizing::Count(_));
        let (shards, sizing) = if n == 0 {
            (0, "no samples".to_string())
        } else {
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
                let e = match (&name, job.split()) {
                    (Some(t), None) => e.context(format!("key-map group {t:?}")),
                    (Some(t), Some(_)) => e.context(format!("split {t:?}")),
                    (None, _) => e,
                };
                everywhere(lead, e)
            })?;
            (shards, format!("{default}{}", flag(why)))
        };
        let targets = Targets::new(n, shards.max(1), job.equalize);
        let (template, split) = match job.split() {
            Some(_) => (None, name),
            None => (name, None),
        };
        groups.push(GroupPlan {
            template,
            split,
            samples: n,
            sample_bytes: bytes,
            shards,
            sizing,
            output_samples: targets.positions(),
            rank_start,
            out_start,
            shard_start,
            targets,
        });
        rank_start += n;
        out_start += targets.positions();
        shard_start += shards;
    }
    if shard_start == 0 {
        return Err(everywhere(
            lead,
            anyhow!(
                "no sample matched the key map: nothing to write ({unmatched} unmatched, skipped)"
            ),
        ));
    }
    Ok((groups, unmatched))
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

/// What the distributed sort sorts: one item per (local sample, copy) with its sort key, the
/// owner of each item, and the positions already known (dropped or skipped samples).
struct SortItems {
    items: Vec<Item>,
    owners: Vec<(u32, u8)>,
    first: Vec<u64>,
}

/// The sort items of this rank's samples.
fn sort_items(
    job: &OrderJob<'_>,
    local: &LocalSamples<'_>,
    groups: &[GroupPlan],
    permutation: &Permutation,
    in_split: &[Permutation],
) -> Result<SortItems> {
    let spec = job.spec;
    let count = local.samples.len();
    let global = |i: usize| local.first_global + i as u64;
    let group_of = job.group_of();
    let mut items: Vec<Item> = Vec::new();
    let mut owners: Vec<(u32, u8)> = Vec::new();
    let mut first = vec![SKIPPED; count];
    for i in 0..count {
        let mut key = Vec::new();
        if let Some(g) = &group_of {
            if g[i] == KEY_MAP_SKIPPED {
                continue;
            }
            key.extend(g[i].to_be_bytes());
        }
        if let Some(ext) = &spec.stratify_by {
            key.extend(label_key(local.contents[i].as_deref(), ext, spec, || {
                (local.describe)(i)
            })?);
            // Within its group: its split's own permutation, or the global one.
            let (group, q) = match job.split() {
                Some(split) => {
                    let k = group_of.expect("split groups")[i] as usize;
                    (&groups[k], in_split[k].apply(split.rank[i]))
                }
                None => (&groups[0], permutation.apply(global(i))),
            };
            if q >= group.targets.positions() {
                first[i] = DROPPED | (group.rank_start + q);
            }
            for (copy, tie) in group.targets.of(q).enumerate() {
                items.push(Item {
                    key: key.clone(),
                    tie,
                });
                owners.push((i as u32, copy as u8));
            }
            continue;
        }
        match &spec.by {
            OrderBy::Shuffle => key.extend(permutation.apply(global(i)).to_be_bytes()),
            OrderBy::Key => key.extend(of_key(&local.keys[i], spec.descending)),
            OrderBy::Content { ext, kind } => {
                let value = local.contents[i].as_deref();
                let encoded = match value {
                    None => Err(format!("has no .{ext} member")),
                    Some(v) => value_key(Some(v), *kind, spec.descending)
                        .map_err(|why| format!(".{ext}: {why}")),
                };
                match (encoded, spec.missing) {
                    (Ok(k), _) => key.extend(k),
                    (Err(_), Missing::Last) => key.push(1),
                    (Err(why), Missing::Error) => bail!(
                        "{} {why} (--order {}; --missing last places such samples last)",
                        (local.describe)(i),
                        spec.describe()
                    ),
                }
            }
        }
        items.push(Item {
            key,
            tie: global(i),
        });
        owners.push((i as u32, 0));
    }
    Ok(SortItems {
        items,
        owners,
        first,
    })
}

/// Stratified: deals each group's label-sorted order to its shards, and shuffles each shard's
/// slots with a permutation of its own. Returns the second copies' positions.
fn deal_positions(
    job: &OrderJob<'_>,
    groups: &[GroupPlan],
    deals: &[Deal],
    ranks: &[u64],
    owners: &[(u32, u8)],
    first: &mut [u64],
) -> Vec<(u64, u64)> {
    let mut by_shard: Vec<(u64, u64, usize)> = ranks
        .iter()
        .enumerate()
        .map(|(k, &j)| {
            let g = groups.partition_point(|g| g.out_start <= j) - 1;
            let (s, slot) = deals[g].place(j - groups[g].out_start);
            (groups[g].shard_start + s, slot, k)
        })
        .collect();
    by_shard.sort_unstable();
    let mut again = Vec::new();
    let mut current: Option<(u64, u64, Permutation)> = None;
    for (s, slot, k) in by_shard {
        if current.as_ref().map(|c| c.0) != Some(s) {
            let g = &groups[groups.partition_point(|g| g.shard_start <= s) - 1];
            let plan = ShardPlan::by_count(g.output_samples, g.shards, 1);
            let shard = plan.shard_positions(s - g.shard_start);
            let size = shard.end - shard.start;
            let start = g.out_start + shard.start;
            current = Some((s, start, Permutation::member(job.seed, job.epoch, size, s)));
        }
        let (_, start, perm) = current.as_ref().unwrap();
        let p = start + perm.apply(slot);
        let (i, copy) = owners[k];
        if copy == 0 {
            first[i as usize] = p;
        } else {
            again.push((u64::from(i), p));
        }
    }
    again
}

/// Sorted: the sample of rank `j` in its group's order goes to the group's position `j` (or is
/// dropped, or also written again by `--equalize pad`). Returns the second copies' positions.
fn rank_positions(
    job: &OrderJob<'_>,
    groups: &[GroupPlan],
    ranks: &[u64],
    owners: &[(u32, u8)],
    first: &mut [u64],
) -> Vec<(u64, u64)> {
    let group_of = job.group_of();
    let mut again = Vec::new();
    for (k, &j) in ranks.iter().enumerate() {
        let (i, _) = owners[k];
        let group = &groups[group_of.as_ref().map_or(0, |g| g[i as usize] as usize)];
        let mut at = group.targets.of(j - group.rank_start);
        first[i as usize] = match at.next() {
            Some(p) => group.out_start + p,
            None => DROPPED | j,
        };
        if let Some(p) = at.next() {
            again.push((u64::from(i), group.out_start + p));
        }
    }
    again
}
