//! Pure planning: which rank reads which input shards, which output shard each position falls
//! in, which rank writes each output shard, and where each sample lands inside its shard.

use std::ops::Range;

/// Assigns input shards to ranks in contiguous runs balanced by bytes: shard `i` goes to the rank
/// whose equal share of the total bytes contains the shard's midpoint. Keeps every rank's reads
/// sequential and needs no communication (every rank computes the same answer).
pub fn assign_inputs(sizes: &[u64], ranks: usize) -> Vec<Range<usize>> {
    let total: u128 = sizes.iter().map(|&s| u128::from(s)).sum();
    let mut owner_start = vec![sizes.len(); ranks + 1];
    let mut before: u128 = 0;
    let mut next_rank = 0;
    for (i, &s) in sizes.iter().enumerate() {
        let mid = 2 * before + u128::from(s); // twice the midpoint, to stay in integers
        let owner = if total == 0 {
            (i * ranks / sizes.len().max(1)).min(ranks - 1)
        } else {
            ((mid * ranks as u128) / (2 * total)).min(ranks as u128 - 1) as usize
        };
        while next_rank <= owner {
            owner_start[next_rank] = i;
            next_rank += 1;
        }
        before += u128::from(s);
    }
    (0..ranks)
        .map(|r| owner_start[r]..owner_start[r + 1])
        .collect()
}

/// How N output positions are cut into S shards (counts differ by at most one; the first N mod S
/// shards hold one more) and which rank writes each shard (contiguous blocks of shards).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardPlan {
    samples: u64,
    shards: u64,
    ranks: u64,
}

impl ShardPlan {
    /// # Panics
    /// If `shards` or `ranks` is zero.
    pub fn new(samples: u64, shards: u64, ranks: usize) -> Self {
        assert!(shards > 0 && ranks > 0);
        ShardPlan {
            samples,
            shards,
            ranks: ranks as u64,
        }
    }

    pub fn samples(&self) -> u64 {
        self.samples
    }

    pub fn shards(&self) -> u64 {
        self.shards
    }

    fn base(&self) -> u64 {
        self.samples / self.shards
    }

    fn extra(&self) -> u64 {
        self.samples % self.shards
    }

    /// The output positions of shard `s`.
    pub fn shard_positions(&self, s: u64) -> Range<u64> {
        let start = s * self.base() + s.min(self.extra());
        let len = self.base() + u64::from(s < self.extra());
        start..start + len
    }

    /// The shard holding output position `p`.
    pub fn shard_of(&self, p: u64) -> u64 {
        let big = self.base() + 1;
        let boundary = self.extra() * big;
        if p < boundary {
            p / big
        } else {
            self.extra() + (p - boundary) / self.base()
        }
    }

    /// The shards rank `r` writes.
    pub fn writer_shards(&self, r: usize) -> Range<u64> {
        let at =
            |r: u64| ((u128::from(r) * u128::from(self.shards)) / u128::from(self.ranks)) as u64;
        at(r as u64)..at(r as u64 + 1)
    }

    /// The rank that writes shard `s`.
    pub fn writer_of(&self, s: u64) -> usize {
        // The largest r with floor(r*S/P) <= s is ceil((s+1)*P/S) - 1.
        let (s, shards, ranks) = (
            u128::from(s),
            u128::from(self.shards),
            u128::from(self.ranks),
        );
        (((s + 1) * ranks).div_ceil(shards) - 1) as usize
    }

    /// The output positions rank `r` writes (its shards' positions are contiguous).
    pub fn writer_positions(&self, r: usize) -> Range<u64> {
        let shards = self.writer_shards(r);
        if shards.is_empty() {
            let p = if shards.start < self.shards {
                self.shard_positions(shards.start).start
            } else {
                self.samples
            };
            return p..p;
        }
        self.shard_positions(shards.start).start..self.shard_positions(shards.end - 1).end
    }
}

/// Where every sample of one writer's shards lands: the byte offset of each position inside its
/// shard, and each shard's file size (samples plus the two zero blocks that end a tar). Eight
/// bytes per position: a sample's length is the distance to the next offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardLayout {
    plan: ShardPlan,
    /// First position covered.
    pub first: u64,
    /// `offsets[p - first]`: byte offset of position p inside its shard.
    offsets: Vec<u64>,
    /// The shards covered and their file sizes, in order.
    pub shards: Range<u64>,
    pub shard_bytes: Vec<u64>,
}

/// Size of the end-of-archive marker: two zero blocks.
pub const TAR_TRAILER: u64 = 1024;

impl ShardLayout {
    /// Lays out `writer`'s shards from the length of the sample at each of its positions
    /// (`lens[p - first]`, in position order), turning the lengths into offsets in place.
    pub fn new(plan: &ShardPlan, writer: usize, mut lens: Vec<u64>) -> Self {
        let positions = plan.writer_positions(writer);
        assert_eq!(lens.len() as u64, positions.end - positions.start);
        let shards = plan.writer_shards(writer);
        let mut shard_bytes = Vec::with_capacity((shards.end - shards.start) as usize);
        for s in shards.clone() {
            let mut at = 0u64;
            for p in plan.shard_positions(s) {
                let slot = &mut lens[(p - positions.start) as usize];
                let len = *slot;
                *slot = at;
                at += len;
            }
            shard_bytes.push(at + TAR_TRAILER);
        }
        ShardLayout {
            plan: *plan,
            first: positions.start,
            offsets: lens,
            shards,
            shard_bytes,
        }
    }

    /// Byte offset of position `p` inside its shard, and the sample's length.
    pub fn place(&self, p: u64) -> Option<(u64, u64)> {
        let i = usize::try_from(p.checked_sub(self.first)?).ok()?;
        let at = *self.offsets.get(i)?;
        let shard = self.plan.shard_of(p);
        let end = if p + 1 < self.plan.shard_positions(shard).end {
            self.offsets[i + 1]
        } else {
            self.shard_bytes[(shard - self.shards.start) as usize] - TAR_TRAILER
        };
        Some((at, end - at))
    }

    /// Sample bytes in all of these shards.
    pub fn sample_bytes(&self) -> u64 {
        self.shard_bytes.iter().map(|b| b - TAR_TRAILER).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_balanced_by_bytes_and_contiguous() {
        let sizes = [100, 1, 1, 1, 50, 50, 97];
        let a = assign_inputs(&sizes, 3);
        // Shard 5 spans bytes 153..203 of 300: its midpoint 178 lies in rank 1's share.
        assert_eq!(a, vec![0..1, 1..6, 6..7]);
        for p in 1..10 {
            let a = assign_inputs(&sizes, p);
            assert_eq!(a.len(), p);
            assert_eq!(a[0].start, 0);
            assert_eq!(a[p - 1].end, sizes.len());
            for w in a.windows(2) {
                assert_eq!(w[0].end, w[1].start);
            }
        }
        assert_eq!(assign_inputs(&[0, 0], 2), vec![0..1, 1..2]);
        assert_eq!(assign_inputs(&[5], 3), vec![0..0, 0..1, 1..1]);
    }

    #[test]
    fn shard_counts_differ_by_at_most_one_and_cover_everything() {
        for (n, s) in [(10, 3), (3, 3), (100, 7), (1, 1), (1000, 999), (64, 64)] {
            let plan = ShardPlan::new(n, s, 1);
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
            let plan = ShardPlan::new(1000, s, ranks);
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
    fn layout_offsets_are_prefix_sums_per_shard() {
        let plan = ShardPlan::new(7, 3, 2); // shards of 3,2,2; rank 0 writes shard 0, rank 1 shards 1..3
        assert_eq!(plan.writer_shards(1), 1..3);
        let layout = ShardLayout::new(&plan, 1, vec![512, 1024, 2048, 512]);
        assert_eq!(layout.first, 3);
        assert_eq!(layout.place(3), Some((0, 512)));
        assert_eq!(layout.place(4), Some((512, 1024)));
        assert_eq!(layout.place(5), Some((0, 2048)));
        assert_eq!(layout.place(6), Some((2048, 512)));
        assert_eq!(layout.place(7), None);
        assert_eq!(layout.place(2), None);
        assert_eq!(layout.shard_bytes, vec![1536 + 1024, 2560 + 1024]);
        assert_eq!(layout.sample_bytes(), 1536 + 2560);
    }
}
