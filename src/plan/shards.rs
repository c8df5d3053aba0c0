//! Output positions cut into shards, and the writer of each shard.

use std::ops::Range;

/// How the output positions are cut into S shards (`bounds[s]..bounds[s + 1]` is shard s; every
/// shard non-empty) and which rank writes each shard (contiguous blocks of shards). Holds O(S),
/// never O(N).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPlan {
    bounds: Vec<u64>,
    ranks: u64,
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
        ShardPlan {
            bounds,
            ranks: ranks as u64,
        }
    }

    /// Groups of shards one after another, each of `(positions, shards)` cut by count like
    /// [`ShardPlan::by_count`]; groups with no shards are left out.
    ///
    /// # Panics
    /// As [`ShardPlan::by_count`], for any group with shards, or if no group has any.
    pub fn by_groups(groups: &[(u64, u64)], ranks: usize) -> Self {
        let mut bounds = vec![0];
        for &(positions, shards) in groups.iter().filter(|g| g.1 > 0) {
            let at = *bounds.last().unwrap();
            let group = ShardPlan::by_count(positions, shards, ranks);
            bounds.extend(group.bounds[1..].iter().map(|b| at + b));
        }
        ShardPlan::from_bounds(bounds, ranks)
    }

    /// Shards with the given boundaries (`bounds[0] == 0`, strictly increasing).
    ///
    /// # Panics
    /// If the boundaries are not strictly increasing from 0, or `ranks` is zero.
    pub fn from_bounds(bounds: Vec<u64>, ranks: usize) -> Self {
        assert!(ranks > 0 && bounds.len() >= 2 && bounds[0] == 0);
        assert!(
            bounds.windows(2).all(|w| w[0] < w[1]),
            "every shard needs a sample"
        );
        ShardPlan {
            bounds,
            ranks: ranks as u64,
        }
    }

    /// Number of output positions (samples written, repeats included).
    pub fn positions(&self) -> u64 {
        *self.bounds.last().unwrap()
    }

    pub fn shards(&self) -> u64 {
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

    /// The shards rank `r` writes.
    pub fn writer_shards(&self, r: usize) -> Range<u64> {
        let shards = u128::from(self.shards());
        let at = |r: u64| ((u128::from(r) * shards) / u128::from(self.ranks)) as u64;
        at(r as u64)..at(r as u64 + 1)
    }

    /// The rank that writes shard `s`.
    pub fn writer_of(&self, s: u64) -> usize {
        // The largest r with floor(r*S/P) <= s is ceil((s+1)*P/S) - 1.
        let (s, shards, ranks) = (
            u128::from(s),
            u128::from(self.shards()),
            u128::from(self.ranks),
        );
        (((s + 1) * ranks).div_ceil(shards) - 1) as usize
    }

    /// The output positions rank `r` writes (its shards' positions are contiguous).
    pub fn writer_positions(&self, r: usize) -> Range<u64> {
        let shards = self.writer_shards(r);
        self.bounds[shards.start as usize]..self.bounds[shards.end as usize]
    }
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
        let plan = ShardPlan::by_groups(&[(5, 2), (4, 0), (0, 0), (3, 1)], 2);
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

    #[test]
    fn every_shard_has_exactly_one_writer() {
        for (s, ranks) in [(10, 3), (3, 5), (100, 4), (1, 1), (7, 7), (2, 400)] {
            let plan = ShardPlan::by_count(1000, s, ranks);
            let mut next = 0;
            for r in 0..ranks {
                let mine = plan.writer_shards(r);
                assert_eq!(mine.start, next);
                for shard in mine.clone() {
                    assert_eq!(
                        plan.writer_of(shard),
                        r,
                        "s={s} ranks={ranks} shard={shard}"
                    );
                }
                let pos = plan.writer_positions(r);
                if let (Some(first), Some(last)) = (mine.clone().next(), mine.clone().last()) {
                    assert_eq!(pos.start, plan.shard_positions(first).start);
                    assert_eq!(pos.end, plan.shard_positions(last).end);
                } else {
                    assert!(pos.is_empty());
                }
                next = mine.end;
            }
            assert_eq!(next, s);
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
        assert_eq!(plan.writer_positions(1), 3..4);
    }
}
