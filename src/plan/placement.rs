//! The output position of every sample a rank reads: its answer to "where does this go?".

use super::permute::Permutation;
use super::sizing::{Equalize, Targets};

/// A sample this rank reads: which input shard, and its byte range there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalSample {
    pub shard: u32,
    pub start: u64,
    pub len: u64,
}

/// A sample that is not written: dropped by `--equalize drop` (with its rank in the order, for
/// listing), or skipped as unmatched by the key map.
pub(crate) const DROPPED: u64 = 1 << 63;
pub(crate) const SKIPPED: u64 = u64::MAX;

/// The output positions of this rank's samples (none, one, or two when repeated by
/// `--equalize pad`).
pub enum Placement {
    /// The plain shuffle: computed on demand from the permutation, O(1) memory.
    Permuted {
        permutation: Permutation,
        targets: Targets,
        first_global: u64,
    },
    /// Computed by a sort: 8 bytes per sample, plus the few repeats.
    Listed {
        first: Vec<u64>,
        /// (local sample, position of its second copy), by sample.
        again: Vec<(u64, u64)>,
    },
}

impl Placement {
    /// Position of copy `copy` of local sample `i`, if written that many times.
    pub fn position(&self, i: usize, copy: usize) -> Option<u64> {
        match self {
            Placement::Permuted {
                permutation,
                targets,
                first_global,
            } => targets
                .of(permutation.apply(first_global + i as u64))
                .nth(copy),
            Placement::Listed { first, again } => match copy {
                0 => Some(first[i]).filter(|&p| p & DROPPED == 0),
                1 => again
                    .binary_search_by_key(&(i as u64), |a| a.0)
                    .ok()
                    .map(|k| again[k].1),
                _ => None,
            },
        }
    }

    /// Calls `f(i, position)` for every position a local sample is written at.
    pub(crate) fn for_each(&self, samples: usize, f: &mut dyn FnMut(usize, u64)) {
        for i in 0..samples {
            for copy in 0..2 {
                match self.position(i, copy) {
                    Some(p) => f(i, p),
                    None => break,
                }
            }
        }
    }

    /// For the manifest's lists: `Some((rank, true))` when local sample `i` is dropped (its rank
    /// in the order), `Some((position, false))` when it is written twice (its second position).
    pub(crate) fn equalized(&self, i: usize) -> Option<(u64, bool)> {
        match self {
            Placement::Permuted {
                permutation,
                targets,
                first_global,
            } => {
                let q = permutation.apply(first_global + i as u64);
                if q >= targets.positions() {
                    Some((q, true))
                } else {
                    targets.of(q).nth(1).map(|p| (p, false))
                }
            }
            Placement::Listed { first, .. } => {
                if first[i] != SKIPPED && first[i] & DROPPED != 0 {
                    Some((first[i] & !DROPPED, true))
                } else {
                    self.position(i, 1).map(|p| (p, false))
                }
            }
        }
    }
}

/// One group of output shards, sized and balanced on its own: the whole output, one template
/// of a key map, or one split of `--split`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct GroupPlan {
    /// The key map's template (`None` without a key map).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) template: Option<String>,
    /// The split's name (`--split`; `None` otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) split: Option<String>,
    pub(crate) samples: u64,
    pub(crate) sample_bytes: u64,
    pub(crate) shards: u64,
    pub(crate) sizing: String,
    /// Samples written, after `--equalize`.
    pub(crate) output_samples: u64,
    /// The group's first rank in the sorted order, first output position and first shard.
    #[serde(skip)]
    pub(crate) rank_start: u64,
    #[serde(skip)]
    pub(crate) out_start: u64,
    #[serde(skip)]
    pub(crate) shard_start: u64,
    #[serde(skip)]
    pub(crate) targets: Targets,
}

impl GroupPlan {
    /// A group of `samples` samples of `bytes` bytes in `shards` shards, placed after `prev`:
    /// its ranks, positions and shards start where those of `prev` end. No template, split or
    /// sizing text yet.
    pub(crate) fn after(
        prev: Option<&GroupPlan>,
        (samples, bytes): (u64, u64),
        shards: u64,
        equalize: Equalize,
    ) -> GroupPlan {
        let targets = Targets::new(samples, shards.max(1), equalize);
        let (rank_start, out_start, shard_start) = prev.map_or((0, 0, 0), |p| {
            (
                p.rank_start + p.samples,
                p.out_start + p.output_samples,
                p.shard_start + p.shards,
            )
        });
        GroupPlan {
            template: None,
            split: None,
            samples,
            sample_bytes: bytes,
            shards,
            sizing: String::new(),
            output_samples: targets.positions(),
            rank_start,
            out_start,
            shard_start,
            targets,
        }
    }

    /// Groups of (samples, shards), one after the other (bytes: one per sample).
    #[cfg(test)]
    pub(crate) fn chain(sizes: &[(u64, u64)], equalize: Equalize) -> Vec<GroupPlan> {
        let mut groups: Vec<GroupPlan> = Vec::new();
        for &(samples, shards) in sizes {
            groups.push(GroupPlan::after(
                groups.last(),
                (samples, samples),
                shards,
                equalize,
            ));
        }
        groups
    }
}

/// `--stratify-by`: what the manifest reports.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub(crate) struct StratifyReport {
    pub(crate) ext: String,
    pub(crate) labels: u64,
    /// The largest |count − ideal| of any label in any shard, where the ideal is the label's
    /// share of the dataset times the shard's size.
    pub(crate) worst_deviation: f64,
    /// With `--split`: the largest |count − ideal| of any label in any split, where the ideal is
    /// the label's count times the split's share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) split_deviation: Option<f64>,
}
