//! Where every sample lands inside its output shard.

use std::ops::Range;

use super::shards::ShardPlan;

/// Where every sample of one writer's shards lands: the byte offset of each position inside its
/// shard, and each shard's file size (samples plus the two zero blocks that end a tar). Eight
/// bytes per position: a sample's length is the distance to the next offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardLayout {
    /// The boundaries of the shards covered, as positions.
    bounds: Vec<u64>,
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
        let mut bounds = Vec::with_capacity(shard_bytes.capacity() + 1);
        for s in shards.clone() {
            let mut at = 0u64;
            bounds.push(plan.shard_positions(s).start);
            for p in plan.shard_positions(s) {
                let slot = &mut lens[(p - positions.start) as usize];
                let len = *slot;
                *slot = at;
                at += len;
            }
            shard_bytes.push(at + TAR_TRAILER);
        }
        bounds.push(positions.end);
        ShardLayout {
            bounds,
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
        let k = self.bounds[1..].partition_point(|&b| b <= p);
        let end = if p + 1 < self.bounds[k + 1] {
            self.offsets[i + 1]
        } else {
            self.shard_bytes[k] - TAR_TRAILER
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
    fn layout_offsets_are_prefix_sums_per_shard() {
        let plan = ShardPlan::by_count(7, 3, 2); // shards of 3,2,2; rank 0 writes shard 0, rank 1 shards 1..3
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
