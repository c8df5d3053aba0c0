//! Phase "place": the output position of every sample, and the groups of output shards. The
//! plain shuffle needs no communication beyond the group sizes (the permutation answers it);
//! every other order is a distributed sort ([`crate::comm::sort`]).

use anyhow::{anyhow, Result};

use crate::comm::sort::global_ranks;
use crate::comm::{agree, agree_once, everywhere, Comm};
use crate::config::{PlaceSettings, Splits};
use crate::job::handoff::{Indexed, Placed, Shared};
use crate::job::planning::runs::total_runs;
use crate::job::planning::split::{self, Assigned, Labels, Own};
use crate::key_map::KeyMap;
use crate::output::ShardNames;
use crate::plan::groups::{
    describe_sizing, local_sums, size_groups, Grouping, LocalSamples, OrderJob, SplitGroups,
};
use crate::plan::order::{OrderBy, OrderSpec};
use crate::plan::permute::Permutation;
use crate::plan::placement::{GroupPlan, Placement, StratifyReport};
use crate::plan::positions::{rank_positions, split_permutations, split_positions, Deals};
use crate::plan::runs::Runs;
use crate::plan::sort_items::{sort_items, SortItems};
use crate::report::narrate;
use crate::report::narrate::count;
use crate::size::human_bytes;
use crate::tar::key_at;

/// Gives every sample its output position, by the seeded permutation or the order the flags ask
/// for, in the groups of a key map or of `--split`. Consumes the keys and labels the index phase
/// kept.
///
/// # Errors
/// As [`positions`], a key map that fails to load or differs between ranks, or two shards that
/// would get one name.
pub(crate) fn run<C: Comm>(
    ctx: &Shared<'_, C>,
    settings: &PlaceSettings,
    index: &mut Indexed,
) -> Result<Placed> {
    let (comm, inputs, lead) = (ctx.comm, ctx.inputs, ctx.lead());
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
    let key_map = load_key_map(comm, &settings.order, &keys, &describe)?;
    let assigned = match &settings.split {
        Some(split) => Some(split::assign(
            comm,
            split,
            &Own {
                inputs,
                samples: local,
                first_global: index.first_global,
                total: index.samples,
            },
            &Labels {
                spec: &settings.order,
                contents: &contents,
                describe: &describe,
            },
        )?),
        None => None,
    };
    let splits = settings.split.as_ref().map(|s| &s.splits);
    let grouping = grouping(key_map.as_ref(), splits.zip(assigned.as_ref()));
    let mut ordered = positions(
        comm,
        &OrderJob {
            spec: &settings.order,
            groups: grouping.as_ref(),
            seed: settings.seed,
            epoch: settings.epoch,
            equalize: settings.equalize,
            sizing: settings.sizing,
            samples: index.samples,
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
    let placed = Placed::new(settings, ordered, key_map.as_ref().map(|(map, _)| map));
    narrate_placed(lead, &settings.order, index, &placed);
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
    order: &OrderSpec,
    keys: &[Vec<u8>],
    describe: &dyn Fn(usize) -> String,
) -> Result<Option<(KeyMap, Vec<u32>)>> {
    let Some(path) = &order.key_map else {
        return Ok(None);
    };
    let loaded = KeyMap::load(comm, path, order.unmatched.clone(), keys, describe);
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
    fn new(settings: &PlaceSettings, ordered: Ordered, key_map: Option<&KeyMap>) -> Placed {
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
        let sizing = describe_sizing(
            &groups,
            key_map.map(|map| map.groups.len()),
            settings.split.is_some(),
        );
        let names = match key_map {
            None if settings.split.is_some() => ShardNames::Splits {
                prefix: settings.prefix.clone(),
                splits: groups
                    .iter()
                    .map(|g| (g.shard_start, g.split.clone().unwrap_or_default()))
                    .collect(),
            },
            None => ShardNames::Prefix(settings.prefix.clone()),
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
fn narrate_placed(lead: bool, order: &OrderSpec, index: &Indexed, placed: &Placed) {
    narrate(
        lead,
        format_args!(
            "{}, {} of sample data -> {} ({}), order: {}",
            count(index.samples, "sample"),
            human_bytes(index.sample_bytes),
            count(placed.shards, "shard"),
            placed.sizing,
            order.describe()
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
pub(crate) struct Ordered {
    pub(crate) placement: Placement,
    pub(crate) groups: Vec<GroupPlan>,
    /// Samples no key-map group claimed (left out by `--unmatched skip`).
    pub(crate) unmatched: u64,
    pub(crate) stratify: Option<StratifyReport>,
}

/// The key map's groups, or else `--split`'s.
fn grouping<'a>(
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

/// The output position of every local sample, and the groups of output shards.
///
/// # Errors
/// A sample without the member the order reads or with content that does not parse (unless
/// `--missing last`), a key-map failure, or sizing that does not fit a group; on every rank
/// (the cause on the rank that found it, or on rank 0 when every rank finds it).
pub(crate) fn positions(
    comm: &impl Comm,
    job: &OrderJob<'_>,
    local: &LocalSamples<'_>,
) -> Result<Ordered> {
    let lead = comm.rank() == 0;
    let sums = comm.all_sum(&local_sums(job, local.samples));
    let (groups, unmatched) = size_groups(job, &sums).map_err(|e| everywhere(lead, e))?;
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
    let in_split = split_permutations(job, &groups);
    let plain_split = job.spec.by == OrderBy::Shuffle && job.spec.stratify_by.is_none();
    if let (Some(split), true) = (job.split(), plain_split) {
        return Ok(Ordered {
            placement: split_positions(job, split, &groups, &in_split),
            groups,
            unmatched,
            stratify: None,
        });
    }
    let SortItems {
        items,
        owners,
        mut first,
    } = agree(
        comm,
        sort_items(job, local, &groups, &permutation, &in_split),
    )?;
    // Stratified: each group (one, or one per split) is dealt on its own.
    let deals = job.spec.stratify_by.is_some().then(|| Deals::new(&groups));
    let deviation = |a: u64, n: u64| deals.as_ref().expect("stratified").deviation(a, n);
    let mut runs = Runs::default();
    let ranks = global_ranks(comm, &items, &mut |start, bucket| {
        if deals.is_some() {
            runs = Runs::of(start, bucket, &deviation);
        }
    })?;
    drop(items);
    let mut again = match &deals {
        Some(deals) => deals.positions(job, &ranks, &owners, &mut first),
        None => rank_positions(job, &groups, &ranks, &owners, &mut first),
    };
    again.sort_unstable();
    let stratify = match &job.spec.stratify_by {
        Some(ext) if deals.is_some() => {
            let (labels, worst) = total_runs(comm, &runs, &deviation)?;
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

#[cfg(test)]
mod tests {
    //! The output position of every sample of a small input under each order, stratification,
    //! key map, split and `--equalize`, on 1 and 3 in-process ranks. The expected values were
    //! recorded from the place phase before its planning moved to `plan/`.

    use super::*;
    use crate::comm::local::LocalComm;
    use crate::key_map::SKIPPED as KEY_MAP_SKIPPED;
    use crate::plan::order::{Missing, OrderSpec, ValueKind};
    use crate::plan::placement::LocalSample;
    use crate::plan::{Equalize, Sizing};
    use Equalize::{Drop, None as Keep, Pad};

    const N: u64 = 23;

    /// One case: the order, the groups (`group_of` over all samples, split ranks, split shard
    /// counts), the sizing and `--equalize`.
    struct Case {
        spec: OrderSpec,
        names: Vec<String>,
        group_of: Option<Vec<u32>>,
        split: Option<Vec<Option<u64>>>,
        sizing: Sizing,
        equalize: Equalize,
    }

    fn case(spec: OrderSpec, sizing: Sizing, equalize: Equalize) -> Case {
        Case {
            spec,
            names: Vec::new(),
            group_of: None,
            split: None,
            sizing,
            equalize,
        }
    }

    fn spec(by: OrderBy, descending: bool, stratify: bool) -> OrderSpec {
        OrderSpec {
            by,
            descending,
            missing: Missing::Last,
            stratify_by: stratify.then(|| "cls".to_string()),
            ..OrderSpec::default()
        }
    }

    fn content(g: u64) -> Option<Vec<u8>> {
        (g != 5).then(|| format!("{}", (g * 5) % 11 % 3).into_bytes())
    }

    /// Every group of 7 samples loses one to `--unmatched skip`; the rest go round three groups.
    fn key_map_case(by: OrderBy, sizing: Sizing, equalize: Equalize) -> Case {
        let mut c = case(spec(by, false, false), sizing, equalize);
        c.spec.key_map = Some("map.json".into());
        c.names = vec!["a/{}".into(), "b/{}".into(), "c/{}".into()];
        c.group_of = Some(
            (0..N)
                .map(|g| {
                    if g % 7 == 0 {
                        KEY_MAP_SKIPPED
                    } else {
                        (g % 3) as u32
                    }
                })
                .collect(),
        );
        c
    }

    /// Splits train (3 of 5), val, test; val sized by `--split-shards 2`.
    fn split_case(by: OrderBy, stratify: bool, sizing: Sizing, val: Option<u64>) -> Case {
        let mut c = case(spec(by, false, stratify), sizing, Equalize::None);
        c.names = vec!["train".into(), "val".into(), "test".into()];
        c.group_of = Some((0..N).map(|g| [0, 0, 0, 1, 2][(g % 5) as usize]).collect());
        c.split = Some(vec![None, val, None]);
        c
    }

    /// The samples of ranks 1..=`ranks` as contiguous runs; the answer of every sample, in
    /// global order: `p`, `p/q` (written twice), `-` (not written); then the groups.
    fn place(c: &Case, ranks: usize) -> Result<String, String> {
        let samples: Vec<LocalSample> = (0..N)
            .map(|g| LocalSample {
                shard: 0,
                start: g * 1024,
                len: 100 + (g * 37) % 50,
            })
            .collect();
        let keys: Vec<Vec<u8>> = (0..N)
            .map(|g| format!("k{:02}", (g * 7) % N).into_bytes())
            .collect();
        let contents: Vec<Option<Vec<u8>>> = (0..N).map(content).collect();
        // Inside each split, ranks in input order.
        let split_rank: Vec<u64> = match &c.group_of {
            Some(of) => (0..N as usize)
                .map(|g| of[..g].iter().filter(|&&k| k == of[g]).count() as u64)
                .collect(),
            None => Vec::new(),
        };
        let results = LocalComm::run(ranks, |comm| {
            let per = N.div_ceil(ranks as u64);
            let a = (per * comm.rank() as u64).min(N) as usize;
            let b = (per * (comm.rank() as u64 + 1)).min(N) as usize;
            let grouping = c.group_of.as_ref().map(|of| Grouping {
                names: c.names.clone(),
                group_of: &of[a..b],
                split: c.split.as_ref().map(|shards| SplitGroups {
                    shards,
                    rank: &split_rank[a..b],
                }),
            });
            let job = OrderJob {
                spec: &c.spec,
                groups: grouping.as_ref(),
                seed: 11,
                epoch: 2,
                equalize: c.equalize,
                sizing: c.sizing,
                samples: N,
            };
            let describe = |i: usize| format!("sample {}", a + i);
            let local = LocalSamples {
                first_global: a as u64,
                samples: &samples[a..b],
                keys: &keys[a..b],
                contents: &contents[a..b],
                describe: &describe,
            };
            let ordered = positions(comm, &job, &local).map_err(|e| format!("{e:#}"))?;
            let answers: Vec<String> = (0..b - a)
                .map(|i| {
                    match (
                        ordered.placement.position(i, 0),
                        ordered.placement.position(i, 1),
                    ) {
                        (Some(p), Some(q)) => format!("{p}/{q}"),
                        (Some(p), None) => format!("{p}"),
                        // Not written: dropped (its rank in the order, for the manifest's
                        // list) or unmatched.
                        _ => match ordered.placement.equalized(i) {
                            Some((rank, true)) => format!("x{rank}"),
                            _ => "-".to_string(),
                        },
                    }
                })
                .collect();
            let groups: Vec<String> = ordered
                .groups
                .iter()
                .map(|g| format!("{}x{}:{}", g.shards, g.output_samples, g.sizing))
                .collect();
            let stratify = ordered
                .stratify
                .map(|s| format!(" labels {} worst {:.4}", s.labels, s.worst_deviation))
                .unwrap_or_default();
            Ok::<_, String>((answers, groups, ordered.unmatched, stratify))
        });
        let mut answers = Vec::new();
        let mut rest = String::new();
        for r in results {
            let (a, groups, unmatched, stratify) = r?;
            answers.extend(a);
            rest = format!("| {} | unmatched {unmatched}{stratify}", groups.join("; "));
        }
        Ok(format!("{} {rest}", answers.join(" ")))
    }

    fn check(c: &Case, expected: &str) {
        for ranks in [1, 3] {
            let got = place(c, ranks).unwrap_or_else(|e| format!("error: {e}"));
            if std::env::var_os("RESHARD_CAPTURE").is_some() {
                println!("CAPTURE {ranks} {got}");
                continue;
            }
            assert_eq!(got, expected, "{ranks} ranks");
        }
    }

    fn int() -> OrderBy {
        OrderBy::Content {
            ext: "cls".into(),
            kind: ValueKind::Int,
        }
    }

    /// The plain shuffle: the permutation alone, with `--equalize drop` and `pad`.
    #[test]
    fn every_position_in_the_shuffle() {
        check(
            &case(spec(OrderBy::Shuffle, false, false), Sizing::Count(4), Keep),
            "8 12 18 22 7 16 9 10 21 19 11 0 15 4 2 17 6 20 14 1 3 5 13 | 4x23:--shards 4 | \
            unmatched 0",
        );
        check(
            &case(spec(OrderBy::Shuffle, false, false), Sizing::Count(5), Drop),
            "8 12 18 x22 7 16 9 10 x21 19 11 0 15 4 2 17 6 x20 14 1 3 5 13 | 5x20:--shards 5 \
            | unmatched 0",
        );
        check(
            &case(spec(OrderBy::Shuffle, false, false), Sizing::Count(5), Pad),
            "8 12 18 22 7 16 9 10 21 19 11 0/23 15 4 2 17 6 20 14 1/24 3 5 13 | 5x25:--shards \
            5 | unmatched 0",
        );
    }

    /// `--order key` and `--order content:cls:int`, ascending and descending (sample 5 has no
    /// label: `--missing last`).
    #[test]
    fn every_position_in_sorted() {
        check(
            &case(spec(OrderBy::Key, false, false), Sizing::Count(4), Pad),
            "0/23 7 14 21 5 12 19 3 10 17 1 8 15 22 6 13 20 4 11 18 2 9 16 | 4x24:--shards 4 \
            | unmatched 0",
        );
        check(
            &case(spec(OrderBy::Key, true, false), Sizing::Count(3), Drop),
            "x22 15 8 1 17 10 3 19 12 5 x21 14 7 0 16 9 2 18 11 4 20 13 6 | 3x21:--shards 3 | \
            unmatched 0",
        );
        check(
            &case(spec(int(), false, false), Sizing::Count(4), Keep),
            "0 16 8 9 1 22 17 18 10 11 2 3 19 12 13 4 5 20 21 14 15 6 7 | 4x23:--shards 4 | \
            unmatched 0",
        );
        check(
            &case(spec(int(), true, false), Sizing::Size(700), Keep),
            "14 0 6 7 15 22 1 2 8 9 16 17 3 10 11 18 19 4 5 12 13 20 21 | 4x23:--shard-size \
            700 B: 4 shards of 715 B on average | unmatched 0",
        );
    }

    /// `--stratify-by cls`: labels dealt to shards, each shard shuffled on its own.
    #[test]
    fn every_position_in_stratified() {
        check(
            &case(spec(OrderBy::Shuffle, false, true), Sizing::Count(4), Keep),
            "18 21 2 14 12 13 1 6 11 19 3 20 5 17 22 16 7 8 15 0 10 4 9 | 4x23:--shards 4 | \
            unmatched 0 labels 4 worst 0.7391",
        );
        check(
            &case(spec(OrderBy::Shuffle, false, true), Sizing::Count(5), Drop),
            "16 4 10 x22 14 18 19 0 x21 15 1 3 13 5 17 11 8 x20 9 12 2 7 6 | 5x20:--shards 5 \
            | unmatched 0 labels 4 worst 0.8000",
        );
    }

    /// A key map's groups, each sized on its own, some samples unmatched.
    #[test]
    fn every_position_with_key_map() {
        check(
            &key_map_case(OrderBy::Shuffle, Sizing::Count(2), Keep),
            "- 11 16 5 9 15 0 - 18 4 10 13 2 7 - 3 8 17 1 6 14 - 12 | 2x6:--shards 2; \
            2x7:--shards 2; 2x6:--shards 2 | unmatched 4",
        );
        check(
            &key_map_case(OrderBy::Key, Sizing::Count(3), Drop),
            "- 8 17 5 7 16 4 - 15 3 6 14 2 x12 - 1 11 13 0 10 12 - 9 | 3x6:--shards 3; \
            3x6:--shards 3; 3x6:--shards 3 | unmatched 4",
        );
    }

    /// `--split`: each split shuffled, stratified or sorted on its own, sized by `--split-shards`
    /// or the first split's mean shard size (a multiple of the GPUs with `--gpus`).
    #[test]
    fn every_position_with_split() {
        let gpus = Sizing::Gpus {
            gpus: 2,
            workers: 1,
            size: 600,
        };
        check(
            &split_case(OrderBy::Shuffle, false, Sizing::Size(600), Some(2)),
            "7 1 10 16 22 2 3 9 15 19 13 14 4 17 20 12 6 11 18 21 5 0 8 | 3x15:--shard-size \
            600 B: 3 shards of 618 B on average; 2x4:--split-shards 2; 1x4:no \
            --split-shards, so train's mean shard size: --shard-size 618 B: 1 shards of 502 \
            B on average | unmatched 0",
        );
        check(
            &split_case(OrderBy::Shuffle, true, Sizing::Count(3), None),
            "14 0 12 15 19 11 7 3 17 20 10 2 13 18 22 6 8 5 16 21 9 1 4 | 3x15:--shards 3; \
            1x4:no --split-shards, so train's mean shard size: --shard-size 618 B: 1 shards \
            of 504 B on average; 1x4:no --split-shards, so train's mean shard size: \
            --shard-size 618 B: 1 shards of 502 B on average | unmatched 0 labels 8 worst \
            0.6667",
        );
        check(
            &split_case(OrderBy::Key, false, Sizing::Count(2), Some(1)),
            "0 5 10 17 19 8 13 3 15 21 1 6 11 18 20 9 14 4 16 22 2 7 12 | 2x15:--shards 2; \
            1x4:--split-shards 1; 1x4:no --split-shards, so train's mean shard size: \
            --shard-size 927 B: 1 shards of 502 B on average | unmatched 0",
        );
        check(
            &split_case(OrderBy::Shuffle, false, gpus, None),
            "7 1 10 16 22 2 3 9 15 19 13 14 4 17 20 12 6 11 18 21 5 0 8 | 4x15:--gpus 2 \
            --workers 1: 2 x 2 shards, mean 463 B nearest --shard-size 600 B; 2x4:no \
            --split-shards, so a multiple of the GPUs near train's mean shard size: --gpus 2 \
            --workers 1: 1 x 2 shards, mean 252 B nearest --shard-size 463 B; 2x4:no \
            --split-shards, so a multiple of the GPUs near train's mean shard size: --gpus 2 \
            --workers 1: 1 x 2 shards, mean 251 B nearest --shard-size 463 B | unmatched 0",
        );
        check(
            &split_case(OrderBy::Shuffle, false, Sizing::Count(2), Some(100)),
            "error: split \"val\": --split-shards 100 is more than the 4 samples in the input: \
            every shard needs at least one sample",
        );
    }

    /// `--split` with `--equalize drop` and `pad`: each split's shards equal on their own (the
    /// dropped samples keep their rank in the split's order, for the manifest's list).
    #[test]
    fn every_position_with_split_and_equalize() {
        let mut c = split_case(OrderBy::Shuffle, false, Sizing::Count(2), Some(3));
        c.equalize = Drop;
        check(
            &c,
            "7 1 10 15 20 2 3 9 14 17 13 x14 4 16 18 12 6 11 x18 19 5 0 8 | 2x14:--shards 2; \
            3x3:--split-shards 3; 1x4:no --split-shards, so train's mean shard size: \
            --shard-size 927 B: 1 shards of 502 B on average | unmatched 0",
        );
        c.equalize = Pad;
        check(
            &c,
            "7 1 10 17/21 25 2 3 9 16/20 22 13 14 4 18 23 12 6 11 19 24 5 0/15 8 | \
            2x16:--shards 2; 3x6:--split-shards 3; 1x4:no --split-shards, so train's mean \
            shard size: --shard-size 927 B: 1 shards of 502 B on average | unmatched 0",
        );
        let mut c = split_case(OrderBy::Key, false, Sizing::Count(4), None);
        c.equalize = Drop;
        check(
            &c,
            "0 5 10 14 16 8 x13 3 12 18 1 6 11 15 17 9 x14 4 13 19 2 7 x12 | 4x12:--shards 4; \
            1x4:no --split-shards, so train's mean shard size: --shard-size 463 B: 1 shards \
            of 504 B on average; 1x4:no --split-shards, so train's mean shard size: \
            --shard-size 463 B: 1 shards of 502 B on average | unmatched 0",
        );
    }
}
