//! Output positions cut into shards, and the writer of each shard.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ops::Range;

/// How the output positions are cut into S shards (`bounds[s]..bounds[s + 1]` is shard s; every
/// shard non-empty) and which rank writes each shard. Shards come in groups (the splits of
/// `--split`, the templates of a key map, or one group); every rank writes one block of
/// consecutive shards of each group, and the blocks are sized so that every writer's bytes come
/// out even (see [`ShardPlan::by_groups`]). Holds O(S + groups × ranks), never O(N).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPlan {
    bounds: Vec<u64>,
    ranks: u64,
    /// Per group: where each rank's block of the group's shards starts (`ranks + 1` shard
    /// numbers; `cuts[g][r]..cuts[g][r + 1]` is rank r's block).
    cuts: Vec<Vec<u64>>,
}

/// One group of shards for [`ShardPlan::by_groups`]: its positions, its shard count, and the
/// bytes its samples hold (an estimate is enough: it only balances the writers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardGroup {
    pub(crate) positions: u64,
    pub(crate) shards: u64,
    pub(crate) bytes: u64,
}

impl ShardPlan {
    /// `positions` cut into `shards` shards whose counts differ by at most one (the first
    /// `positions mod shards` hold one more).
    ///
    /// # Panics
    /// If `shards` or `ranks` is zero, or `shards > positions`.
    pub fn by_count(positions: u64, shards: u64, ranks: usize) -> Self {
        assert!(shards > 0 && ranks > 0 && shards <= positions);
        let (base, extra) = (positions / shards, positions % shards);
        let bounds = (0..=shards).map(|s| s * base + s.min(extra)).collect();
        ShardPlan::from_bounds(bounds, ranks)
    }

    /// Groups of shards one after another, each cut by count like [`ShardPlan::by_count`];
    /// groups with no shards are left out. Every rank writes a block of each group: the first
    /// group's shards are spread evenly by count (its shards are alike), each later group's go
    /// one by one to the writer with the fewest estimated bytes so far. So the few large shards
    /// of a training split and the many small ones of its validation split end up spread over
    /// all writers, rather than the first ranks writing the one and the last ranks the other.
    /// A pure function of its arguments: every rank computes the same writers.
    ///
    /// # Panics
    /// As [`ShardPlan::by_count`], for any group with shards, or if no group has any.
    pub(crate) fn by_groups(groups: &[ShardGroup], ranks: usize) -> Self {
        assert!(ranks > 0);
        let mut bounds = vec![0];
        let mut cuts = Vec::new();
        let mut loads = vec![0u128; ranks];
        for g in groups.iter().filter(|g| g.shards > 0) {
            let at = *bounds.last().unwrap();
            let group = ShardPlan::by_count(g.positions, g.shards, 1);
            let first_shard = bounds.len() as u64 - 1;
            bounds.extend(group.bounds[1..].iter().map(|b| at + b));
            let counts = block_counts(&mut loads, g.shards, u128::from(g.bytes));
            let mut cut = Vec::with_capacity(ranks + 1);
            cut.push(first_shard);
            for c in counts {
                cut.push(cut.last().unwrap() + c);
            }
            cuts.push(cut);
        }
        assert!(bounds.len() >= 2, "no group has shards");
        ShardPlan {
            bounds,
            ranks: ranks as u64,
            cuts,
        }
    }

    /// Shards with the given boundaries (`bounds[0] == 0`, strictly increasing), one group.
    ///
    /// # Panics
    /// If the boundaries are not strictly increasing from 0, or `ranks` is zero.
    pub(crate) fn from_bounds(bounds: Vec<u64>, ranks: usize) -> Self {
        assert!(ranks > 0 && bounds.len() >= 2 && bounds[0] == 0);
        assert!(
            bounds.windows(2).all(|w| w[0] < w[1]),
            "every shard needs a sample"
        );
        let shards = bounds.len() as u64 - 1;
        ShardPlan {
            bounds,
            ranks: ranks as u64,
            cuts: vec![even_cut(0, shards, ranks)],
        }
    }

    #[cfg(test)]
    /// Number of output positions (samples written, repeats included).
    pub(crate) fn positions(&self) -> u64 {
        *self.bounds.last().unwrap()
    }

    #[cfg(test)]
    pub(crate) fn shards(&self) -> u64 {
        self.bounds.len() as u64 - 1
    }

    /// The output positions of shard `s`.
    pub fn shard_positions(&self, s: u64) -> Range<u64> {
        self.bounds[s as usize]..self.bounds[s as usize + 1]
    }

    /// The shard holding output position `p`.
    pub fn shard_of(&self, p: u64) -> u64 {
        (self.bounds[1..].partition_point(|&b| b <= p)) as u64
    }

    /// The shards rank `r` writes: one block of consecutive shards per group (empty blocks left
    /// out), in shard order.
    pub fn writer_shards(&self, r: usize) -> Vec<Range<u64>> {
        self.cuts
            .iter()
            .map(|cut| cut[r]..cut[r + 1])
            .filter(|b| !b.is_empty())
            .collect()
    }

    /// The rank that writes shard `s`.
    pub fn writer_of(&self, s: u64) -> usize {
        let g = self.cuts.partition_point(|cut| cut[0] <= s) - 1;
        // The last rank whose block starts at or before s: blocks before it may be empty.
        self.cuts[g].partition_point(|&c| c <= s) - 1
    }

    /// The output positions rank `r` writes: one run per block of [`ShardPlan::writer_shards`].
    pub fn writer_positions(&self, r: usize) -> Vec<Range<u64>> {
        self.writer_shards(r)
            .into_iter()
            .map(|b| self.bounds[b.start as usize]..self.bounds[b.end as usize])
            .collect()
    }

    /// Every shard, in the order of the writers' blocks: rank 0's shards, then rank 1's, and so
    /// on. What a gather of every writer's per-shard figures, concatenated in rank order, lists.
    pub(crate) fn writing_order(&self) -> Vec<u64> {
        (0..self.ranks as usize)
            .flat_map(|r| self.writer_shards(r).into_iter().flatten())
            .collect()
    }

    /// Per-shard values gathered from every writer in rank order ([`ShardPlan::writing_order`]),
    /// put in shard order; `width` values per shard. Empty stays empty (a gather's other ranks,
    /// or figures not asked for).
    pub(crate) fn in_shard_order<T: Copy + Default>(&self, gathered: &[T], width: usize) -> Vec<T> {
        if gathered.is_empty() {
            return Vec::new();
        }
        let mut out = vec![T::default(); gathered.len()];
        for (k, s) in self.writing_order().into_iter().enumerate() {
            let s = s as usize;
            out[s * width..(s + 1) * width].copy_from_slice(&gathered[k * width..(k + 1) * width]);
        }
        out
    }
}

/// `shards` shards over `ranks` ranks in blocks that differ by at most one shard, the larger
/// ones spread out (rank r's block starts at ⌊r·S/P⌋); shard numbers from `first`.
fn even_cut(first: u64, shards: u64, ranks: usize) -> Vec<u64> {
    let at = |r: u64| ((u128::from(r) * u128::from(shards)) / ranks as u128) as u64;
    (0..=ranks as u64).map(|r| first + at(r)).collect()
}

/// How many of a group's `shards` (holding `bytes`) each rank writes, given the estimated bytes
/// each already writes (`loads`, updated). While the loads are all equal (the first group), an
/// even cut; after that, each shard to the least-loaded rank (the lowest on a tie).
fn block_counts(loads: &mut [u128], shards: u64, bytes: u128) -> Vec<u64> {
    let ranks = loads.len();
    let each = bytes / u128::from(shards);
    let counts: Vec<u64> = if loads.iter().all(|&l| l == loads[0]) {
        even_cut(0, shards, ranks)
            .windows(2)
            .map(|w| w[1] - w[0])
            .collect()
    } else {
        let mut counts = vec![0u64; ranks];
        let mut heap: BinaryHeap<Reverse<(u128, usize)>> = loads
            .iter()
            .enumerate()
            .map(|(r, &l)| Reverse((l, r)))
            .collect();
        for _ in 0..shards {
            let Reverse((load, r)) = heap.pop().expect("ranks > 0");
            counts[r] += 1;
            // At least one: shards of no bytes still count, so they spread too.
            heap.push(Reverse((load + each.max(1), r)));
        }
        counts
    };
    for (load, &c) in loads.iter_mut().zip(&counts) {
        *load += u128::from(c) * each.max(1);
    }
    counts
}

/// `--balance bytes`: the shard of a position whose sample starts `before` bytes into the
/// permuted sequence and is `len` bytes long: the shard whose equal share of `total` contains the
/// sample's midpoint. Non-decreasing in the position, so shards are contiguous runs.
pub fn byte_shard_of(before: u64, len: u64, total: u64, shards: u64) -> u64 {
    let mid = 2 * u128::from(before) + u128::from(len);
    ((mid * u128::from(shards)) / (2 * u128::from(total.max(1)))).min(u128::from(shards) - 1) as u64
}

/// Repairs shard start positions gathered from a byte cut (`starts[s]`, `u64::MAX` where no
/// position fell in shard s) into strictly increasing boundaries with every shard non-empty.
pub fn bounds_from_starts(starts: &[u64], positions: u64) -> Vec<u64> {
    let shards = starts.len() as u64;
    // An empty shard starts where the next non-empty one does (zero width), then every shard is
    // widened to at least one position.
    let mut effective = starts.to_vec();
    let mut next = positions;
    for e in effective.iter_mut().rev() {
        *e = (*e).min(next);
        next = *e;
    }
    let mut bounds = Vec::with_capacity(starts.len() + 1);
    bounds.push(0);
    for s in 1..shards {
        let prev = bounds[s as usize - 1];
        bounds.push(
            effective[s as usize]
                .max(prev + 1)
                .min(positions - (shards - s)),
        );
    }
    bounds.push(positions);
    bounds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_goes_to_the_shard_of_its_midpoint() {
        // 100 bytes in 4 shards of 25: (start, length) -> shard.
        let cases = [
            ((0, 10), 0),
            ((20, 10), 1), // midpoint 25: a share's end belongs to the next shard
            ((30, 10), 1),
            ((45, 10), 2),
            ((70, 4), 2),
            ((90, 10), 3),
            ((100, 0), 3), // the very end stays in the last shard
        ];
        for ((before, len), shard) in cases {
            assert_eq!(byte_shard_of(before, len, 100, 4), shard, "{before}+{len}");
        }
        // Nothing to share: everything in shard 0.
        assert_eq!(byte_shard_of(0, 0, 0, 3), 0);
    }

    #[test]
    fn groups_follow_each_other_and_groups_without_shards_are_left_out() {
        // A split of 4 samples given no shards, and an empty one, hold no shard.
        let group = |positions, shards| ShardGroup {
            positions,
            shards,
            bytes: positions * 10,
        };
        let groups = [group(5, 2), group(4, 0), group(0, 0), group(3, 1)];
        let plan = ShardPlan::by_groups(&groups, 2);
        assert_eq!((plan.shards(), plan.positions()), (3, 8));
        let cuts: Vec<_> = (0..3).map(|s| plan.shard_positions(s)).collect();
        assert_eq!(cuts, [0..3, 3..5, 5..8]);
    }

    #[test]
    fn shard_counts_differ_by_at_most_one_and_cover_everything() {
        for (n, s) in [(10, 3), (3, 3), (100, 7), (1, 1), (1000, 999), (64, 64)] {
            let plan = ShardPlan::by_count(n, s, 1);
            let mut next = 0;
            for shard in 0..s {
                let r = plan.shard_positions(shard);
                assert_eq!(r.start, next);
                assert!(r.end - r.start == n / s || r.end - r.start == n / s + 1);
                for p in r.clone() {
                    assert_eq!(plan.shard_of(p), shard);
                }
                next = r.end;
            }
            assert_eq!(next, n);
        }
    }

    /// Every shard has exactly one writer, and `writer_shards`, `writer_of`, `writer_positions`
    /// and `writing_order` agree.
    fn check_writers(plan: &ShardPlan, ranks: usize) {
        let mut seen = vec![usize::MAX; plan.shards() as usize];
        for r in 0..ranks {
            let blocks = plan.writer_shards(r);
            let runs = plan.writer_positions(r);
            assert_eq!(blocks.len(), runs.len());
            for (b, run) in blocks.iter().zip(&runs) {
                assert_eq!(run.start, plan.shard_positions(b.start).start);
                assert_eq!(run.end, plan.shard_positions(b.end - 1).end);
                for s in b.clone() {
                    assert_eq!(seen[s as usize], usize::MAX, "shard {s} written twice");
                    seen[s as usize] = r;
                    assert_eq!(plan.writer_of(s), r, "shard {s} ranks={ranks}");
                }
            }
        }
        assert!(
            seen.iter().all(|&r| r != usize::MAX),
            "a shard with no writer"
        );
        let order = plan.writing_order();
        assert!(order
            .windows(2)
            .all(|w| seen[w[0] as usize] <= seen[w[1] as usize]));
        let values: Vec<u64> = order.iter().map(|&s| s * 10).collect();
        let back = plan.in_shard_order(&values, 1);
        assert_eq!(back, (0..plan.shards()).map(|s| s * 10).collect::<Vec<_>>());
    }

    #[test]
    fn every_shard_has_exactly_one_writer() {
        for (s, ranks) in [(10, 3), (3, 5), (100, 4), (1, 1), (7, 7), (2, 400)] {
            let plan = ShardPlan::by_count(1000, s, ranks);
            check_writers(&plan, ranks);
            // One group: rank r writes the block from ⌊r·S/P⌋, as it always did.
            for r in 0..ranks {
                let at = |r: usize| (r as u64 * s) / ranks as u64;
                let block: Vec<u64> = plan.writer_shards(r).into_iter().flatten().collect();
                assert_eq!(block, (at(r)..at(r + 1)).collect::<Vec<_>>());
            }
        }
        let groups = |v: &[(u64, u64, u64)]| -> Vec<ShardGroup> {
            v.iter()
                .map(|&(positions, shards, bytes)| ShardGroup {
                    positions,
                    shards,
                    bytes,
                })
                .collect()
        };
        for ranks in 1..10 {
            let g = groups(&[(900, 32, 9000), (0, 0, 0), (50, 8, 500), (50, 1, 0)]);
            check_writers(&ShardPlan::by_groups(&g, ranks), ranks);
        }
    }

    /// The estimated bytes each rank writes.
    fn loads(plan: &ShardPlan, groups: &[ShardGroup], ranks: usize) -> Vec<f64> {
        let mut per_shard = Vec::new();
        for g in groups.iter().filter(|g| g.shards > 0) {
            per_shard.extend((0..g.shards).map(|_| g.bytes as f64 / g.shards as f64));
        }
        let mut loads = vec![0.0; ranks];
        for (s, b) in per_shard.iter().enumerate() {
            loads[plan.writer_of(s as u64)] += b;
        }
        loads
    }

    /// Issue 27: `--split train=0.9,val=0.05,test=0.05` wrote 235 MiB on rank 0 and 27 MiB on
    /// rank 1 at np 2, because rank 0 got the large training shards and rank 1 the many small
    /// validation and test shards. Now every split is spread over every writer.
    #[test]
    fn split_writers_write_even_bytes() {
        const MIB: u64 = 1 << 20;
        // (train shards, val and test shards each) for 262 MiB of samples: --gpus 8 --workers 4
        // with --split-shards 8 (the README's example); --shards 64 with the default (the
        // first split's mean shard size); --shards 4 --split-shards 2 (the figures: 4
        // large shards, 2 small ones per other split); --shards 16 --split-shards 4. Where whole
        // shards cannot come within 10% (16 training shards on 5 ranks: one writes 4 of 14.7 MiB,
        // against a mean of 51 MiB), the busiest writer is within one shard of the mean.
        let cases: [(u64, u64, &[usize]); 4] = [
            (32, 8, &[2, 3, 4, 5, 6, 7, 8]),
            (64, 4, &[2, 3, 4, 5, 6, 7, 8]),
            (4, 2, &[2, 4]),
            (16, 4, &[2, 3, 4, 8]),
        ];
        for (train, others, even) in cases {
            let samples = 26_200u64;
            let (n_train, n_other) = (samples * 90 / 100, samples * 5 / 100);
            let groups = [
                ShardGroup {
                    positions: n_train,
                    shards: train,
                    bytes: n_train * 10 * 1024,
                },
                ShardGroup {
                    positions: n_other,
                    shards: others,
                    bytes: n_other * 10 * 1024,
                },
                ShardGroup {
                    positions: n_other,
                    shards: others,
                    bytes: n_other * 10 * 1024,
                },
            ];
            for ranks in 2..=8 {
                let plan = ShardPlan::by_groups(&groups, ranks);
                check_writers(&plan, ranks);
                let loads = loads(&plan, &groups, ranks);
                let mean = loads.iter().sum::<f64>() / ranks as f64;
                let busiest = loads.iter().copied().fold(0.0, f64::max);
                let largest = (n_train * 10 * 1024) as f64 / train as f64;
                assert!(busiest <= mean + largest);
                assert!(
                    !even.contains(&ranks) || busiest <= 1.1 * mean,
                    "{train}+{others}+{others} shards at np {ranks}: busiest writer {:.1} MiB, mean {:.1} MiB",
                    busiest / MIB as f64,
                    mean / MIB as f64
                );
            }
        }
    }

    #[test]
    fn byte_balanced_bounds() {
        // Positions with sizes 10,10,10,70: two shards by bytes split after the third.
        let sizes = [10u64, 10, 10, 70];
        let mut before = 0;
        let mut starts = vec![u64::MAX; 2];
        for (p, &len) in sizes.iter().enumerate() {
            let s = byte_shard_of(before, len, 100, 2) as usize;
            starts[s] = starts[s].min(p as u64);
            before += len;
        }
        assert_eq!(bounds_from_starts(&starts, 4), vec![0, 3, 4]);
        // A huge sample leaves shards empty: they are repaired to one position each.
        assert_eq!(
            bounds_from_starts(&[0, u64::MAX, u64::MAX, 1], 5),
            vec![0, 1, 2, 3, 5]
        );
        assert_eq!(bounds_from_starts(&[0, 4, u64::MAX], 5), vec![0, 3, 4, 5]);
        let plan = ShardPlan::from_bounds(vec![0, 3, 4], 2);
        assert_eq!(plan.shard_of(2), 0);
        assert_eq!(plan.shard_of(3), 1);
        assert_eq!(plan.writer_positions(1), vec![3..4]);
    }
}
