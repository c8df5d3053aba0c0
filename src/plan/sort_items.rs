//! What the distributed sort sorts for an order other than the plain shuffle: one item per
//! (local sample, copy), keyed by its group, then its label (`--stratify-by`) or what the
//! order reads (the permutation, the key, a member's content).

use anyhow::{bail, Result};

use super::groups::{LocalSamples, OrderJob};
use super::order::{Missing, OrderBy};
use super::permute::Permutation;
use super::placement::{GroupPlan, DROPPED, SKIPPED};
use super::sort_key::{label_key, of_key, value_key};
use crate::comm::sort::Item;
use crate::key_map::SKIPPED as KEY_MAP_SKIPPED;

/// The sort items of a rank, the owner of each item, and the positions already known (dropped
/// or skipped samples).
pub(crate) struct SortItems {
    pub(crate) items: Vec<Item>,
    /// Per item: (local sample, copy).
    pub(crate) owners: Vec<(u32, u8)>,
    /// Per local sample: [`SKIPPED`], `DROPPED | rank`, or to be filled in after the sort.
    pub(crate) first: Vec<u64>,
}

/// The sort items of this rank's samples. `in_split`: each split's own permutation (empty
/// without `--split`).
///
/// # Errors
/// A sample without the member the order or stratification reads, or with content that does
/// not parse (unless `--missing last`).
pub(crate) fn sort_items(
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
    let mut sorted = SortItems {
        items: Vec::new(),
        owners: Vec::new(),
        first: vec![SKIPPED; count],
    };
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
                sorted.first[i] = DROPPED | (group.rank_start + q);
            }
            for (copy, tie) in group.targets.of(q).enumerate() {
                sorted.items.push(Item {
                    key: key.clone(),
                    tie,
                });
                sorted.owners.push((i as u32, copy as u8));
            }
            continue;
        }
        order_key(job, local, i, permutation, &mut key)?;
        sorted.items.push(Item {
            key,
            tie: global(i),
        });
        sorted.owners.push((i as u32, 0));
    }
    Ok(sorted)
}

/// Appends what `--order` reads of local sample `i` to its sort key.
fn order_key(
    job: &OrderJob<'_>,
    local: &LocalSamples<'_>,
    i: usize,
    permutation: &Permutation,
    key: &mut Vec<u8>,
) -> Result<()> {
    let spec = job.spec;
    match &spec.by {
        OrderBy::Shuffle => key.extend(
            permutation
                .apply(local.first_global + i as u64)
                .to_be_bytes(),
        ),
        OrderBy::Key => key.extend(of_key(&local.keys[i], spec.descending)),
        OrderBy::Content { ext, kind } => {
            let encoded = match local.contents[i].as_deref() {
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::groups::Grouping;
    use crate::plan::order::{OrderSpec, ValueKind};
    use crate::plan::placement::LocalSample;
    use crate::plan::{Equalize, Sizing};

    fn group(samples: u64, shards: u64, equalize: Equalize) -> GroupPlan {
        GroupPlan::after(None, (samples, samples), shards, equalize)
    }

    fn items(
        spec: &OrderSpec,
        groups: Option<&Grouping<'_>>,
        plan: &[GroupPlan],
        contents: &[Option<Vec<u8>>],
    ) -> Result<SortItems> {
        let n = contents.len();
        let samples = vec![
            LocalSample {
                shard: 0,
                start: 0,
                len: 1
            };
            n
        ];
        let keys: Vec<Vec<u8>> = (0..n).map(|i| vec![b'a' + i as u8]).collect();
        let job = OrderJob {
            spec,
            groups,
            seed: 5,
            epoch: 0,
            equalize: Equalize::None,
            sizing: Sizing::Count(1),
            samples: n as u64,
        };
        let describe = |i: usize| format!("in.tar: sample {i}");
        let local = LocalSamples {
            first_global: 0,
            samples: &samples,
            keys: &keys,
            contents,
            describe: &describe,
        };
        sort_items(&job, &local, plan, &Permutation::new(5, 0, n as u64), &[])
    }

    #[test]
    fn a_missing_member_is_named_or_placed_last() {
        let mut spec = OrderSpec {
            by: OrderBy::Content {
                ext: "cls".into(),
                kind: ValueKind::Int,
            },
            ..OrderSpec::default()
        };
        let contents = vec![Some(b"3".to_vec()), None, Some(b"x".to_vec())];
        let plan = [group(3, 1, Equalize::None)];
        let e = items(&spec, None, &plan, &contents).err().unwrap();
        assert_eq!(
            e.to_string(),
            "in.tar: sample 1 has no .cls member (--order content:cls:int; --missing last places such samples last)"
        );
        spec.missing = Missing::Last;
        let sorted = items(&spec, None, &plan, &contents).unwrap();
        // Both the missing and the unparsable value sort after every number, ties by index.
        assert_eq!(sorted.items[1].key, [1]);
        assert_eq!(sorted.items[2].key, [1]);
        assert!(sorted.items[0].key < sorted.items[1].key);
        assert_eq!(sorted.owners, [(0, 0), (1, 0), (2, 0)]);
    }

    #[test]
    fn unmatched_samples_are_skipped_and_keys_lead_with_the_group() {
        let spec = OrderSpec {
            by: OrderBy::Key,
            ..OrderSpec::default()
        };
        let grouping = Grouping {
            names: vec!["a".into(), "b".into()],
            group_of: &[1, KEY_MAP_SKIPPED, 0],
            split: None,
        };
        let plan = [group(1, 1, Equalize::None), group(1, 1, Equalize::None)];
        let sorted = items(&spec, Some(&grouping), &plan, &[None, None, None]).unwrap();
        assert_eq!(sorted.first[1], SKIPPED);
        assert_eq!(sorted.owners, [(0, 0), (2, 0)]);
        assert_eq!(
            sorted.items[0].key,
            [&[0, 0, 0, 1], &of_key(b"a", false)[..]].concat()
        );
        assert_eq!(
            sorted.items[1].key,
            [&[0, 0, 0, 0], &of_key(b"c", false)[..]].concat()
        );
        assert_eq!((sorted.items[0].tie, sorted.items[1].tie), (0, 2));
    }

    #[test]
    fn stratified_items_carry_their_target_and_dropped_samples_none() {
        let spec = OrderSpec {
            stratify_by: Some("cls".into()),
            ..OrderSpec::default()
        };
        let contents: Vec<Option<Vec<u8>>> = (0..5).map(|i| Some(vec![b'0' + i % 2])).collect();
        // 5 samples, 2 shards, drop: 4 positions; the sample the permutation sends to 4 drops.
        let plan = [group(5, 2, Equalize::Drop)];
        let sorted = items(&spec, None, &plan, &contents).unwrap();
        let perm = Permutation::new(5, 0, 5);
        let dropped = (0..5u64).find(|&g| perm.apply(g) == 4).unwrap() as usize;
        assert_eq!(sorted.first[dropped], DROPPED | 4);
        assert_eq!(sorted.items.len(), 4);
        for (item, &(i, copy)) in sorted.items.iter().zip(&sorted.owners) {
            assert_eq!(copy, 0);
            assert_eq!(item.tie, perm.apply(u64::from(i)));
            assert_eq!(
                item.key,
                label_key(contents[i as usize].as_deref(), "cls", &spec, String::new).unwrap()
            );
        }
    }
}
