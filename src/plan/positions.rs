//! Output positions from the order: each split's own permutation (`--split` with the plain
//! shuffle, no communication), a sample's rank in its group's sorted order, or with
//! `--stratify-by` the deal of each group's label-sorted order to its shards.

use super::deal::Deal;
use super::groups::{OrderJob, SplitGroups};
use super::permute::Permutation;
use super::placement::{GroupPlan, Placement, DROPPED};
use super::ShardPlan;

/// Inside each split, its own permutation of the split's ranks, for this epoch (empty without
/// `--split`).
pub(crate) fn split_permutations(job: &OrderJob<'_>, groups: &[GroupPlan]) -> Vec<Permutation> {
    match job.split() {
        Some(_) => (0..groups.len())
            .map(|k| Permutation::in_split(job.seed, job.epoch, groups[k].samples, k as u16))
            .collect(),
        None => Vec::new(),
    }
}

/// `--split` with the plain shuffle: sample of rank `r` in split `k` goes to position
/// π_k(r) of the split, by its own permutation.
pub(crate) fn split_positions(
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

/// Stratified: each group (one, or one per split) dealt to its shards on its own.
pub(crate) struct Deals<'a> {
    groups: &'a [GroupPlan],
    deals: Vec<Deal>,
}

impl<'a> Deals<'a> {
    pub(crate) fn new(groups: &'a [GroupPlan]) -> Deals<'a> {
        let deals = groups
            .iter()
            .map(|g| Deal::new(g.output_samples, g.shards))
            .collect();
        Deals { groups, deals }
    }

    /// How far a label holding the ranks `a..a + n` of the sorted order (all in one group)
    /// strays from its ideal share per shard.
    pub(crate) fn deviation(&self, a: u64, n: u64) -> f64 {
        let k = self.groups.partition_point(|g| g.out_start <= a) - 1;
        self.deals[k].deviation(a - self.groups[k].out_start, n)
    }

    /// Deals the ranks `ranks` (of the items `owners` names) to their shards, and shuffles each
    /// shard's slots with a permutation of its own. Fills in `first`; returns the second
    /// copies' positions.
    pub(crate) fn positions(
        &self,
        job: &OrderJob<'_>,
        ranks: &[u64],
        owners: &[(u32, u8)],
        first: &mut [u64],
    ) -> Vec<(u64, u64)> {
        let groups = self.groups;
        let mut by_shard: Vec<(u64, u64, usize)> = ranks
            .iter()
            .enumerate()
            .map(|(k, &j)| {
                let g = groups.partition_point(|g| g.out_start <= j) - 1;
                let (s, slot) = self.deals[g].place(j - groups[g].out_start);
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
            let (_, start, perm) = current.as_ref().expect("set above");
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
}

/// Sorted: the sample of rank `j` in its group's order goes to the group's position `j` (or is
/// dropped, or also written again by `--equalize pad`). Fills in `first`; returns the second
/// copies' positions.
pub(crate) fn rank_positions(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::order::OrderSpec;
    use crate::plan::{Equalize, Sizing};

    fn job<'a>(spec: &'a OrderSpec, grouping: Option<&'a Grouping<'a>>) -> OrderJob<'a> {
        OrderJob {
            spec,
            groups: grouping,
            seed: 9,
            epoch: 1,
            equalize: Equalize::None,
            sizing: Sizing::Count(1),
            samples: 0,
        }
    }

    use crate::plan::groups::Grouping;

    #[test]
    fn ranks_become_positions_in_their_group_dropped_or_twice() {
        let spec = OrderSpec::default();
        let group_of = [1, 0, 1, 0, 0];
        let grouping = Grouping {
            names: vec!["a".into(), "b".into()],
            group_of: &group_of,
            split: None,
        };
        let ranks = [4, 0, 3, 2, 1];
        let owners: Vec<(u32, u8)> = (0..5).map(|i| (i, 0)).collect();
        let place = |equalize| {
            // Group 0: 3 samples in 2 shards; group 1: 2 samples in 1 shard.
            let plan = GroupPlan::chain(&[(3, 2), (2, 1)], equalize);
            let mut first = vec![u64::MAX; 5];
            let job = job(&spec, Some(&grouping));
            let again = rank_positions(&job, &plan, &ranks, &owners, &mut first);
            (first, again)
        };
        // Padded to 4: rank 0 is written again.
        let (first, again) = place(Equalize::Pad);
        assert_eq!(first, [5, 0, 4, 2, 1]);
        assert_eq!(again, [(1, 3)]);
        // Dropped: the rank stays, marked.
        let (first, again) = place(Equalize::Drop);
        assert!(again.is_empty());
        assert_eq!(first, [3, 0, 2, DROPPED | 2, 1]);
    }

    #[test]
    fn each_split_is_its_own_permutation_of_its_positions() {
        let spec = OrderSpec::default();
        let group_of = [0, 1, 0, 0, 1, 0, 0];
        let rank = [0, 0, 1, 2, 1, 3, 4];
        let shards = [None, None];
        let grouping = Grouping {
            names: vec!["train".into(), "val".into()],
            group_of: &group_of,
            split: Some(SplitGroups {
                shards: &shards,
                rank: &rank,
            }),
        };
        let j = job(&spec, Some(&grouping));
        let plan = GroupPlan::chain(&[(5, 2), (2, 1)], Equalize::None);
        let perms = split_permutations(&j, &plan);
        assert_eq!(perms.len(), 2);
        let Placement::Listed { first, again } =
            split_positions(&j, j.split().unwrap(), &plan, &perms)
        else {
            panic!("listed")
        };
        assert!(again.is_empty());
        let mut train: Vec<u64> = [0, 2, 3, 5, 6].iter().map(|&i| first[i]).collect();
        train.sort_unstable();
        assert_eq!(train, [0, 1, 2, 3, 4]);
        let mut val = vec![first[1], first[4]];
        val.sort_unstable();
        assert_eq!(val, [5, 6]);
        for (i, &p) in first.iter().enumerate() {
            let k = group_of[i] as usize;
            assert_eq!(p, plan[k].out_start + perms[k].apply(rank[i]));
        }
        assert!(split_permutations(&job(&spec, None), &plan).is_empty());
    }

    #[test]
    fn a_deal_fills_every_shard_with_its_own_positions_once() {
        let spec = OrderSpec::default();
        let plan = GroupPlan::chain(&[(10, 3), (4, 2)], Equalize::None);
        let deals = Deals::new(&plan);
        let ranks: Vec<u64> = (0..14).rev().collect();
        let owners: Vec<(u32, u8)> = (0..14).map(|i| (i, 0)).collect();
        let mut first = vec![u64::MAX; 14];
        let again = deals.positions(&job(&spec, None), &ranks, &owners, &mut first);
        assert!(again.is_empty());
        let mut all = first.clone();
        all.sort_unstable();
        assert_eq!(all, (0..14).collect::<Vec<u64>>());
        // Ranks of a group stay in that group's positions; a label of one rank strays by at most
        // its share.
        for (i, &p) in first.iter().enumerate() {
            assert_eq!(ranks[i] < 10, p < 10, "sample {i} at {p}");
        }
        assert!(deals.deviation(0, 1) <= 1.0);
        assert!(
            deals.deviation(10, 4) < 1e-9,
            "4 of 4 ranks in 2 shards: the ideal"
        );
    }
}
