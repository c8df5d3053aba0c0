//! How `--stratify-by` deals the label-sorted order to shards.

/// How `--stratify-by` deals the label-sorted order to shards, so that every label's count in
/// every shard is within one of its ideal share (share of the dataset × shard size).
///
/// With `M` positions in `S` shards, the first `r = M mod S` shards ("big") hold `c + 1` and the
/// others `c = M div S`. Rank `j` goes to the big shards if a Bresenham line of slope
/// `|big| / M` steps at `j`, so any run of `n` ranks puts ⌊n·|big|/M⌋ or ⌈…⌉ of them there; within
/// each set of equal shards, ranks are dealt round-robin, so the run's `m` ranks in a set of `k`
/// shards give each ⌊m/k⌋ or ⌈m/k⌉. Nested floors and ceilings keep every count within
/// [⌊ideal⌋, ⌈ideal⌉]. (Round-robin over all shards alone misses by up to ~1.65 when shard sizes
/// differ.)
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deal {
    total: u64,
    shards: u64,
    big: u64,
    size: u64,
}

impl Deal {
    /// # Panics
    /// If `shards` is zero or more than `total`.
    pub(crate) fn new(total: u64, shards: u64) -> Deal {
        assert!(shards > 0 && shards <= total);
        Deal {
            total,
            shards,
            big: total % shards,
            size: total / shards,
        }
    }

    /// Positions in the big shards.
    fn big_total(&self) -> u64 {
        self.big * (self.size + 1)
    }

    /// Ranks before `j` that go to the big shards.
    fn big_before(&self, j: u64) -> u64 {
        (u128::from(j) * u128::from(self.big_total()) / u128::from(self.total)) as u64
    }

    /// (shard, slot in the shard) of rank `j`.
    pub(crate) fn place(&self, j: u64) -> (u64, u64) {
        let before = self.big_before(j);
        if self.big_before(j + 1) > before {
            (before % self.big, before / self.big)
        } else {
            let small = self.shards - self.big;
            let k = j - before;
            (self.big + k % small, k / small)
        }
    }

    /// The worst |count − ideal| over the shards for a label holding ranks `[a, a + n)`.
    pub(crate) fn deviation(&self, a: u64, n: u64) -> f64 {
        let in_big = self.big_before(a + n) - self.big_before(a);
        let mut worst: f64 = 0.0;
        for (m, k, size) in [
            (in_big, self.big, self.size + 1),
            (n - in_big, self.shards - self.big, self.size),
        ] {
            if k == 0 {
                continue;
            }
            let ideal = n as f64 * size as f64 / self.total as f64;
            worst = worst.max((ideal - (m / k) as f64).abs());
            if m % k > 0 {
                worst = worst.max((ideal - (m / k + 1) as f64).abs());
            }
        }
        worst
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::ShardPlan;

    /// The deal fills every shard to its planned size, and its counts match a brute-force count
    /// and stay within one of the ideal, for any label runs.
    #[test]
    fn deal_keeps_every_label_within_one_of_its_share() {
        for total in [12u64, 13, 40, 97, 120] {
            for shards in [1u64, 3, 4, 7, 11] {
                let deal = Deal::new(total, shards);
                let plan = ShardPlan::by_count(total, shards, 1);
                let placed: Vec<(u64, u64)> = (0..total).map(|j| deal.place(j)).collect();
                for s in 0..shards {
                    let mut slots: Vec<u64> =
                        placed.iter().filter(|p| p.0 == s).map(|p| p.1).collect();
                    slots.sort_unstable();
                    let size = plan.shard_positions(s).end - plan.shard_positions(s).start;
                    assert_eq!(slots, (0..size).collect::<Vec<_>>(), "{total} {shards} {s}");
                }
                for labels in [
                    vec![total],
                    vec![1, total - 1],
                    vec![total / 2, total / 3, total - total / 2 - total / 3],
                    vec![1; total as usize],
                ] {
                    let mut a = 0;
                    for &n in &labels {
                        let mut worst: f64 = 0.0;
                        for s in 0..shards {
                            let count = (a..a + n).filter(|&j| placed[j as usize].0 == s).count();
                            let size = plan.shard_positions(s).end - plan.shard_positions(s).start;
                            let ideal = n as f64 * size as f64 / total as f64;
                            worst = worst.max((count as f64 - ideal).abs());
                        }
                        let got = deal.deviation(a, n);
                        assert!((got - worst).abs() < 1e-9, "{total} {shards} {a} {n}");
                        assert!(got < 1.0, "{total} {shards} {a} {n}: {got}");
                        a += n;
                    }
                }
            }
        }
    }
}
