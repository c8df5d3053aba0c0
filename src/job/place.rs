//! Phase "place": the output position of every sample, and the groups of output shards. The
//! plain shuffle needs no communication beyond the group sizes (the permutation answers it);
//! every other order is a distributed sort ([`crate::comm::sort`]).

use anyhow::{anyhow, bail, Result};

use crate::config::RunConfig;
use crate::input::InputShard;
use crate::job::index::Index;
use crate::output::ShardNames;
use crate::report::narrate;
use crate::size::human_bytes;
use crate::tar::key_at;

use crate::comm::sort::{global_ranks, Item};
use crate::comm::wire::gather_concat;
use crate::comm::{agree, agree_once, everywhere, Comm};
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
/// for, in the groups of a key map. Consumes the keys and labels the index phase kept.
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
    let ordered = positions(
        comm,
        &OrderJob {
            spec: &cfg.order,
            key_map: key_map
                .as_ref()
                .map(|(map, group_of)| (map, group_of.as_slice())),
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
            "{} samples, {} of sample data -> {} shards ({}), order: {}",
            index.samples,
            human_bytes(index.sample_bytes),
            placed.shards,
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

/// What `place` needs to know about the job.
pub struct OrderJob<'a> {
    pub spec: &'a OrderSpec,
    /// The key map, and the group of each local sample.
    pub key_map: Option<(&'a KeyMap, &'a [u32])>,
    pub seed: u64,
    pub epoch: u64,
    pub equalize: Equalize,
    pub sizing: Sizing,
    /// Samples and sample bytes over all ranks.
    pub samples: u64,
    pub sample_bytes: u64,
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
    if job.spec.is_shuffle() {
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
    let sortable = agree(comm, sort_items(job, local, &groups, &permutation))?;
    let SortItems {
        items,
        owners,
        mut first,
    } = sortable;
    // Stratified runs have one group, sized with at least one shard.
    let deal = job
        .spec
        .stratify_by
        .is_some()
        .then(|| Deal::new(groups[0].output_samples, groups[0].shards));
    let mut runs = Runs::default();
    let ranks = global_ranks(comm, &items, &mut |start, bucket| {
        if let Some(deal) = &deal {
            runs = Runs::of(start, bucket, deal);
        }
    })?;
    drop(items);
    let mut again = match &deal {
        Some(deal) => deal_positions(job, &groups[0], deal, &ranks, &owners, &mut first),
        None => rank_positions(job, &groups, &ranks, &owners, &mut first),
    };
    again.sort_unstable();
    let stratify = match (&job.spec.stratify_by, &deal) {
        (Some(ext), Some(deal)) => Some(runs.report(comm, ext.clone(), deal)?),
        _ => None,
    };
    Ok(Ordered {
        placement: Placement::Listed { first, again },
        groups,
        unmatched,
        stratify,
    })
}

/// Every group's samples, bytes and shard count (summed over all ranks), and the samples no
/// group claimed.
fn size_groups(
    comm: &impl Comm,
    job: &OrderJob<'_>,
    local: &LocalSamples<'_>,
) -> Result<(Vec<GroupPlan>, u64)> {
    let lead = comm.rank() == 0;
    let group_of = job.key_map.map(|(_, groups)| groups);
    let ngroups = job.key_map.map_or(1, |(m, _)| m.groups.len());
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
    let mut groups = Vec::with_capacity(ngroups);
    let (mut rank_start, mut out_start, mut shard_start) = (0, 0, 0);
    for g in 0..ngroups {
        let (n, bytes) = (sums[g], sums[ngroups + g]);
        let template = job.key_map.map(|(m, _)| m.groups[g].text.clone());
        let (shards, sizing) = if n == 0 {
            (0, "no samples".to_string())
        } else {
            job.sizing.shards(n, bytes).map_err(|e| {
                let e = match &template {
                    Some(t) => e.context(format!("key-map group {t:?}")),
                    None => e,
                };
                everywhere(lead, e)
            })?
        };
        let targets = Targets::new(n, shards.max(1), job.equalize);
        groups.push(GroupPlan {
            template,
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
) -> Result<SortItems> {
    let spec = job.spec;
    let count = local.samples.len();
    let global = |i: usize| local.first_global + i as u64;
    let group_of = job.key_map.map(|(_, groups)| groups);
    let mut items: Vec<Item> = Vec::new();
    let mut owners: Vec<(u32, u8)> = Vec::new();
    let mut first = vec![SKIPPED; count];
    for i in 0..count {
        if let Some(ext) = &spec.stratify_by {
            let label = label_key(local.contents[i].as_deref(), ext, spec, || {
                (local.describe)(i)
            })?;
            let q = permutation.apply(global(i));
            let targets = groups[0].targets;
            if q >= targets.positions() {
                first[i] = DROPPED | q;
            }
            for (copy, tie) in targets.of(q).enumerate() {
                items.push(Item {
                    key: label.clone(),
                    tie,
                });
                owners.push((i as u32, copy as u8));
            }
            continue;
        }
        let mut key = Vec::new();
        if let Some(g) = &group_of {
            if g[i] == KEY_MAP_SKIPPED {
                continue;
            }
            key.extend(g[i].to_be_bytes());
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

/// Stratified: deals the label-sorted order to shards, and shuffles each shard's slots with a
/// permutation of its own. Returns the second copies' positions.
fn deal_positions(
    job: &OrderJob<'_>,
    group: &GroupPlan,
    deal: &Deal,
    ranks: &[u64],
    owners: &[(u32, u8)],
    first: &mut [u64],
) -> Vec<(u64, u64)> {
    let plan = ShardPlan::by_count(group.output_samples, group.shards, 1);
    let mut by_shard: Vec<(u64, u64, usize)> = ranks
        .iter()
        .enumerate()
        .map(|(k, &j)| {
            let (s, slot) = deal.place(j);
            (s, slot, k)
        })
        .collect();
    by_shard.sort_unstable();
    let mut again = Vec::new();
    let mut current: Option<(u64, Permutation)> = None;
    for (s, slot, k) in by_shard {
        let shard = plan.shard_positions(s);
        if current.as_ref().map(|c| c.0) != Some(s) {
            let size = shard.end - shard.start;
            current = Some((s, Permutation::member(job.seed, job.epoch, size, s)));
        }
        let p = shard.start + current.as_ref().unwrap().1.apply(slot);
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
    let group_of = job.key_map.map(|(_, groups)| groups);
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

/// Runs of equal labels in one rank's bucket of the stratified order: the worst deviation and
/// the label count of the runs wholly inside it, and the runs at its edges (which may continue
/// on a neighbour) for rank 0 to join.
#[derive(Default)]
struct Runs {
    inner_worst: f64,
    inner_labels: u64,
    edges: Vec<(Vec<u8>, u64, u64)>,
}

impl Runs {
    fn of(start: u64, bucket: &[Item], deal: &Deal) -> Runs {
        let mut runs = Runs::default();
        let mut k = 0;
        while k < bucket.len() {
            let end = k + bucket[k..].partition_point(|it| it.key == bucket[k].key);
            let (a, n) = (start + k as u64, (end - k) as u64);
            if k == 0 || end == bucket.len() {
                runs.edges.push((bucket[k].key.clone(), a, n));
            } else {
                runs.inner_labels += 1;
                runs.inner_worst = runs.inner_worst.max(deal.deviation(a, n));
            }
            k = end;
        }
        runs
    }

    fn report(self, comm: &impl Comm, ext: String, deal: &Deal) -> Result<StratifyReport> {
        let mut worst = self.inner_worst;
        let mut labels = self.inner_labels;
        let edges = gather_concat::<(Vec<u8>, u64, u64)>(comm, 0, &self.edges);
        let joined = edges.map(|edges| {
            let mut joined: Vec<(Vec<u8>, u64, u64)> = Vec::new();
            for (key, a, n) in edges {
                match joined.last_mut() {
                    Some(last) if last.0 == key && last.1 + last.2 == a => last.2 += n,
                    _ => joined.push((key, a, n)),
                }
            }
            joined
        });
        // Only rank 0 decodes: agreed before the next collective.
        let joined = agree(comm, joined)?;
        labels += joined.len() as u64;
        for (_, a, n) in joined {
            worst = worst.max(deal.deviation(a, n));
        }
        // Non-negative floats order like their bits, which stay below 2^63.
        let worst = f64::from_bits(comm.all_max(&[worst.to_bits()])[0]);
        let labels = comm.all_sum(&[labels])[0];
        Ok(StratifyReport {
            ext,
            labels,
            worst_deviation: worst,
        })
    }
}
