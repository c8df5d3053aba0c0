//! [`Storage`]: what an output costs a parallel filesystem, and warnings where its shards will
//! hurt one. HPC centres (IDRIS' Jean Zay guidance among them) ask for few inodes and for shards
//! sized so that every GPU's loader workers get whole shards: many tiny files load the metadata
//! servers at every epoch, and huge ones make each worker's unit of work (and of retry) large.
//! A leaf.

use serde::Serialize;

use crate::size::human_bytes;

/// Below this mean shard size, with [`MANY_SHARDS`] or more shards, the shards count as tiny.
pub const TINY_SHARD: u64 = 64 << 20;
/// A few tiny shards cost nothing: the warning starts at this many.
pub const MANY_SHARDS: u64 = 16;
/// Above this, a shard counts as huge.
pub const HUGE_SHARD: u64 = 4 << 30;
/// Above this many inodes, the output weighs on a project's inode quota.
pub const MANY_INODES: u64 = 100_000;

/// The inodes an output takes, and what to change about its shards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Storage {
    /// Files and directories the output creates.
    pub inodes: u64,
    pub warnings: Vec<String>,
}

impl Storage {
    /// For `shards` output shards of `mean` and at most `max` bytes each.
    pub fn assess(shards: u64, mean: u64, max: u64) -> Self {
        let mut warnings = Vec::new();
        let inodes = inodes(shards);
        if shards >= MANY_SHARDS && mean < TINY_SHARD {
            warnings.push(format!(
                "{shards} shards of {} on average: on a parallel filesystem (Lustre, GPFS) each \
                 shard costs metadata operations on every epoch; shards of a few hundred MiB \
                 (--shard-size 512MiB, or --gpus G --workers W) read faster and use fewer inodes",
                human_bytes(mean)
            ));
        }
        if max > HUGE_SHARD {
            warnings.push(format!(
                "the largest shard holds {}: over {}, each data loader worker's unit of work and \
                 of retry is large and the shards divide unevenly among GPUs x workers; use a \
                 smaller --shard-size (e.g. 1GiB) or more --shards",
                human_bytes(max),
                human_bytes(HUGE_SHARD)
            ));
        }
        if inodes > MANY_INODES {
            warnings.push(format!(
                "the output takes {inodes} inodes: HPC filesystems often limit a project to a \
                 few hundred thousand; fewer, larger shards need fewer"
            ));
        }
        Storage { inodes, warnings }
    }

    /// An `inodes:` line, then a `warning:` line for each warning.
    pub fn render(&self) -> String {
        let mut s = format!(
            "  inodes: {} (shards, their saved indexes, index.json, 2 directories)\n",
            self.inodes
        );
        for w in &self.warnings {
            s += &format!("  warning: {w}\n");
        }
        s
    }
}

/// Inodes of an output of `shards` shards: the directory, the shards, `index.json`, and
/// `.reshard/` with one saved index per shard.
pub fn inodes(shards: u64) -> u64 {
    2 * shards + 3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warns_for_tiny_many_and_huge_shards_only() {
        let good = Storage::assess(256, 512 << 20, 600 << 20);
        assert_eq!(good.inodes, 515);
        assert!(good.warnings.is_empty(), "{:?}", good.warnings);
        // A handful of small shards (a test, a toy set) is fine.
        assert!(Storage::assess(4, 1 << 20, 1 << 20).warnings.is_empty());
        let tiny = Storage::assess(1000, 1 << 20, 2 << 20);
        assert_eq!(tiny.warnings.len(), 1);
        assert!(
            tiny.warnings[0].contains("1000 shards of 1.00 MiB"),
            "{tiny:?}"
        );
        let huge = Storage::assess(8, 6 << 30, 7 << 30);
        assert!(huge.warnings[0].contains("largest shard"), "{huge:?}");
        let many = Storage::assess(60_000, 1 << 20, 1 << 20);
        assert_eq!(many.warnings.len(), 2);
        assert!(many.render().contains("inodes: 120003"));
    }
}
