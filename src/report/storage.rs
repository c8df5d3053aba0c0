//! [`Storage`]: what an output costs a parallel filesystem, and warnings where its shards will
//! hurt one. HPC centres (IDRIS' Jean Zay guidance among them) ask for few inodes and for shards
//! sized so that every GPU's loader workers get whole shards: many tiny files load the metadata
//! servers at every epoch, and huge ones make each worker's unit of work (and of retry) large.
//! A leaf but for the sizing flags it advises on.

use serde::Serialize;

use crate::plan::Sizing;
use crate::size::human_bytes;

/// The shard size the advice aims at.
const GOOD_SHARD: u64 = 512 << 20;

/// Below this mean shard size, with [`MANY_SHARDS`] or more shards, the shards count as tiny.
pub(crate) const TINY_SHARD: u64 = 64 << 20;
/// A few tiny shards cost nothing: the warning starts at this many.
pub(crate) const MANY_SHARDS: u64 = 16;
/// Above this, a shard counts as huge.
pub(crate) const HUGE_SHARD: u64 = 4 << 30;
/// Above this many inodes, the output weighs on a project's inode quota.
pub(crate) const MANY_INODES: u64 = 100_000;

/// The inodes an output takes, the space it needs, and what to change about its shards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Storage {
    /// Files and directories the output creates.
    pub(crate) inodes: u64,
    /// Bytes of the output's shards.
    pub(crate) output_bytes: u64,
    /// The free space of the output's file system (statvfs), where there is an output.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) free: Option<FreeSpace>,
    pub(crate) warnings: Vec<String>,
}

/// The free space of the file system an output goes to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct FreeSpace {
    /// The directory examined: the output's nearest existing ancestor.
    pub(crate) path: String,
    pub(crate) bytes: u64,
}

impl Storage {
    /// For `shards` output shards of `mean` and at most `max` bytes each, `total` in all, sized
    /// by `sizing` (the advice names the flags that would change the outcome).
    pub(crate) fn assess(
        shards: u64,
        (mean, max, total): (u64, u64, u64),
        sizing: &Sizing,
    ) -> Self {
        let mut warnings = Vec::new();
        let inodes = inodes(shards);
        if shards >= MANY_SHARDS && mean < TINY_SHARD {
            warnings.push(format!(
                "{shards} shards of {} on average: on a parallel filesystem (Lustre, GPFS) each \
                 shard costs metadata operations on every epoch; {}",
                human_bytes(mean),
                tiny_advice(total, sizing)
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
        Storage {
            inodes,
            output_bytes: total,
            free: None,
            warnings,
        }
    }

    /// Adds the free space of the output's file system, and a warning where the output does
    /// not fit (a run would refuse to start).
    pub(crate) fn with_free_space(mut self, free: Option<FreeSpace>) -> Self {
        if let Some(f) = free.as_ref().filter(|f| f.bytes < self.output_bytes) {
            self.warnings.push(format!(
                "the output needs {} but the file system of {} has {} free: `run` would refuse \
                 to start (--no-space-check starts anyway)",
                human_bytes(self.output_bytes),
                f.path,
                human_bytes(f.bytes)
            ));
        }
        self.free = free;
        self
    }

    /// An `inodes:` line, then a `warning:` line for each warning.
    pub(crate) fn render(&self) -> String {
        let mut s = format!(
            "  inodes: {} (shards, their saved indexes, index.json, 2 directories)\n",
            self.inodes
        );
        if let Some(f) = &self.free {
            s += &format!(
                "  space: the output needs {}; {} free on the file system of {}\n",
                human_bytes(self.output_bytes),
                human_bytes(f.bytes),
                f.path
            );
        }
        for w in &self.warnings {
            s += &format!("  warning: {w}\n");
        }
        s
    }
}

/// What would make tiny shards larger, given how they were sized and how much data there is.
fn tiny_advice(total: u64, sizing: &Sizing) -> String {
    let fewer = (total / GOOD_SHARD).max(1);
    let small = total < MANY_SHARDS * TINY_SHARD;
    match *sizing {
        Sizing::Gpus { gpus, workers, .. } if total / (gpus * workers) < TINY_SHARD => format!(
            "--gpus {gpus} --workers {workers} needs a multiple of {} shards and the dataset ({}) \
             gives each of them {} at most: fine for a dataset this small; fewer --workers would \
             make shards larger",
            gpus * workers,
            human_bytes(total),
            human_bytes(total / (gpus * workers))
        ),
        _ if small => format!(
            "the whole dataset is only {}: fine for a dataset this small, or --shards {fewer} for \
             fewer, larger shards",
            human_bytes(total)
        ),
        Sizing::Count(_) => format!(
            "fewer, larger shards (--shards {fewer}, or --shard-size 512MiB) read faster and use \
             fewer inodes"
        ),
        Sizing::Size(_) | Sizing::Gpus { .. } => "a larger --shard-size (e.g. 512MiB) gives \
            fewer, larger shards, which read faster and use fewer inodes"
            .to_string(),
    }
}

/// Inodes of an output of `shards` shards: the directory, the shards, `index.json`, and
/// `.reshard/` with one saved index per shard.
pub(crate) fn inodes(shards: u64) -> u64 {
    2 * shards + 3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warns_for_tiny_many_and_huge_shards_only() {
        let by = Sizing::Count(1);
        let good = Storage::assess(256, (512 << 20, 600 << 20, 128 << 30), &by);
        assert_eq!(good.inodes, 515);
        assert!(good.warnings.is_empty(), "{:?}", good.warnings);
        // A handful of small shards (a test, a toy set) is fine.
        assert!(Storage::assess(4, (1 << 20, 1 << 20, 4 << 20), &by)
            .warnings
            .is_empty());
        let tiny = Storage::assess(1000, (1 << 20, 2 << 20, 1000 << 20), &by);
        assert_eq!(tiny.warnings.len(), 1);
        assert!(
            tiny.warnings[0].contains("1000 shards of 1.00 MiB"),
            "{tiny:?}"
        );
        let huge = Storage::assess(8, (6 << 30, 7 << 30, 48 << 30), &by);
        assert!(huge.warnings[0].contains("largest shard"), "{huge:?}");
        let many = Storage::assess(60_000, (1 << 20, 1 << 20, 60_000 << 20), &by);
        assert_eq!(many.warnings.len(), 2);
        assert!(many.render().contains("inodes: 120003"));
    }

    #[test]
    fn tiny_shards_get_advice_that_would_change_them() {
        let tiny = |total: u64, sizing: Sizing| {
            let s = Storage::assess(64, (total / 64, total / 64, total), &sizing);
            s.warnings.join("\n")
        };
        // The user gave --gpus and --workers: the cause is the small dataset, not the flags.
        let gpus = Sizing::Gpus {
            gpus: 8,
            workers: 8,
            size: 512 << 20,
        };
        let w = tiny(262 << 20, gpus);
        assert!(
            w.contains("needs a multiple of 64 shards") && w.contains("fewer --workers"),
            "{w}"
        );
        assert!(!w.contains("--gpus G"), "{w}");
        let w = tiny(262 << 20, Sizing::Count(64));
        assert!(w.contains("the whole dataset is only 262.00 MiB"), "{w}");
        let w = tiny(2 << 30, Sizing::Count(64));
        assert!(w.contains("--shards 4"), "{w}");
        let w = tiny(2 << 30, Sizing::Size(32 << 20));
        assert!(w.contains("a larger --shard-size"), "{w}");
    }

    #[test]
    fn an_output_larger_than_the_free_space_is_flagged() {
        let s = Storage::assess(4, (1 << 20, 1 << 20, 4 << 20), &Sizing::Count(4));
        let free = |bytes| {
            Some(FreeSpace {
                path: "/data".into(),
                bytes,
            })
        };
        assert!(s.clone().with_free_space(free(8 << 20)).warnings.is_empty());
        let tight = s.with_free_space(free(1 << 20));
        assert!(
            tight.warnings[0].contains("`run` would refuse"),
            "{tight:?}"
        );
        assert!(tight
            .render()
            .contains("1.00 MiB free on the file system of /data"));
    }
}
