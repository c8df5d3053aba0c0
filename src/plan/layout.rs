//! Where every sample lands inside its output shard.

use super::shards::ShardPlan;

/// Where every sample of one writer's shards lands: the byte offset of each position inside its
/// shard, and each shard's file size (samples plus the two zero blocks that end a tar). Eight
/// bytes per position: a sample's length is the distance to the next offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardLayout {
    /// The shards covered, ascending, and their file sizes.
    pub shards: Vec<u64>,
    pub shard_bytes: Vec<u64>,
    /// Per shard covered: its first position, and where its offsets start in `offsets`
    /// (one more entry: the end).
    starts: Vec<u64>,
    base: Vec<usize>,
    /// Byte offset of each position inside its shard, shard after shard.
    offsets: Vec<u64>,
}

/// Size of the end-of-archive marker: two zero blocks.
pub const TAR_TRAILER: u64 = 1024;

impl ShardLayout {
    /// Lays out `writer`'s shards from the length of the sample at each of its positions (in
    /// position order over [`ShardPlan::writer_positions`]), turning the lengths into offsets
    /// in place.
    pub fn new(plan: &ShardPlan, writer: usize, mut lens: Vec<u64>) -> Self {
        let shards: Vec<u64> = plan.writer_shards(writer).into_iter().flatten().collect();
        let mut shard_bytes = Vec::with_capacity(shards.len());
        let mut starts = Vec::with_capacity(shards.len());
        let mut base = Vec::with_capacity(shards.len() + 1);
        let mut i = 0;
        for &s in &shards {
            let positions = plan.shard_positions(s);
            starts.push(positions.start);
            base.push(i);
            let mut at = 0u64;
            for _ in positions {
                let len = lens[i];
                lens[i] = at;
                at += len;
                i += 1;
            }
            shard_bytes.push(at + TAR_TRAILER);
        }
        assert_eq!(i, lens.len(), "one length per position");
        base.push(i);
        ShardLayout {
            shards,
            shard_bytes,
            starts,
            base,
            offsets: lens,
        }
    }

    /// Byte offset of position `p` inside its shard, and the sample's length.
    pub fn place(&self, p: u64) -> Option<(u64, u64)> {
        let k = self.starts.partition_point(|&s| s <= p).checked_sub(1)?;
        let (first, end) = (self.base[k], self.base[k + 1]);
        let i = first + usize::try_from(p - self.starts[k]).ok()?;
        if i >= end {
            return None;
        }
        let at = self.offsets[i];
        let next = if i + 1 < end {
            self.offsets[i + 1]
        } else {
            self.shard_bytes[k] - TAR_TRAILER
        };
        Some((at, next - at))
    }

    /// Sample bytes in all of these shards.
    pub(crate) fn sample_bytes(&self) -> u64 {
        self.shard_bytes.iter().map(|b| b - TAR_TRAILER).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_offsets_are_prefix_sums_per_shard() {
        let plan = ShardPlan::by_count(7, 3, 2); // shards of 3,2,2; rank 0 writes shard 0, rank 1 shards 1..3
        assert_eq!(plan.writer_shards(1), vec![1..3]);
        let layout = ShardLayout::new(&plan, 1, vec![512, 1024, 2048, 512]);
        assert_eq!(layout.shards, vec![1, 2]);
        assert_eq!(layout.place(3), Some((0, 512)));
        assert_eq!(layout.place(4), Some((512, 1024)));
        assert_eq!(layout.place(5), Some((0, 2048)));
        assert_eq!(layout.place(6), Some((2048, 512)));
        assert_eq!(layout.place(7), None);
        assert_eq!(layout.place(2), None);
        assert_eq!(layout.shard_bytes, vec![1536 + 1024, 2560 + 1024]);
        assert_eq!(layout.sample_bytes(), 1536 + 2560);
    }

    #[test]
    fn a_writer_of_shards_from_two_groups_lays_out_both() {
        use crate::plan::ShardGroup;
        let g = |positions, shards, bytes| ShardGroup {
            positions,
            shards,
            bytes,
        };
        // Shards 0, 1 (3 positions each), then 2, 3 (one each): rank 1 writes shards 1 and 3.
        let plan = ShardPlan::by_groups(&[g(6, 2, 600), g(2, 2, 20)], 2);
        assert_eq!(plan.writer_shards(1), vec![1..2, 3..4]);
        let layout = ShardLayout::new(&plan, 1, vec![512, 1024, 512, 2048]);
        assert_eq!(layout.shards, vec![1, 3]);
        assert_eq!(layout.place(3), Some((0, 512)));
        assert_eq!(layout.place(5), Some((1536, 512)));
        assert_eq!(layout.place(6), None);
        assert_eq!(layout.place(7), Some((0, 2048)));
        assert_eq!(layout.place(8), None);
        assert_eq!(layout.place(2), None);
        assert_eq!(layout.shard_bytes, vec![2048 + 1024, 2048 + 1024]);
    }
}
