//! What `verify` reports: [`VerifyReport`] with its [`Mismatches`] and [`Shuffle`], and its
//! rendering.

use std::path::PathBuf;

use serde::Serialize;

use crate::plan::Equalize;
use crate::report::narrate::count;
use crate::report::Stats;
use crate::size::human_bytes;

/// Counts of samples whose digests do not balance between input and output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Mismatches {
    /// Input samples with no copy in the output (beyond what `--equalize drop` explains).
    pub(crate) missing: u64,
    /// Output samples whose bytes occur nowhere in the input: corrupted, or foreign.
    pub(crate) not_in_input: u64,
    /// Extra copies of input samples in the output (beyond what `--equalize pad` explains).
    pub(crate) duplicated: u64,
    /// Input samples not in the output, with `--equalize drop`.
    pub(crate) left_out: u64,
    /// Second copies of input samples, with `--equalize pad`.
    pub(crate) repeated: u64,
    /// Output samples not at the position the seeded order gives them.
    pub(crate) misplaced: u64,
}

impl Mismatches {
    pub(super) fn to_array(self) -> [u64; 6] {
        [
            self.missing,
            self.not_in_input,
            self.duplicated,
            self.left_out,
            self.repeated,
            self.misplaced,
        ]
    }

    pub(super) fn from_array(a: &[u64]) -> Self {
        Mismatches {
            missing: a[0],
            not_in_input: a[1],
            duplicated: a[2],
            left_out: a[3],
            repeated: a[4],
            misplaced: a[5],
        }
    }
}

/// How well the output order is shuffled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub(crate) struct Shuffle {
    /// Samples found on both sides (each output copy paired with one input copy).
    pub(crate) pairs: u64,
    /// Spearman's rank correlation between input and output positions of the pairs (Pearson's
    /// correlation of the positions, which are ranks; exact when every sample is paired once).
    /// `None` with fewer than two pairs.
    pub(crate) spearman: Option<f64>,
    /// `3 / sqrt(pairs - 1)`: a random order gives |ρ| below this with probability ≈ 99.7%.
    pub(crate) random_bound: Option<f64>,
    /// Distinct input shards each output shard draws samples from.
    pub(crate) input_shards_per_output_shard: Stats,
}

/// The outcome of `verify`, as rank 0 reports it.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    /// Every check held.
    pub ok: bool,
    pub(crate) output: PathBuf,
    pub(crate) ranks: usize,
    pub(crate) input_shards: usize,
    pub(crate) input_samples: u64,
    pub(crate) output_shards: usize,
    /// Samples found in the output shards.
    pub(crate) output_samples: u64,
    /// The `--equalize` mode index.json names (`none` without one).
    pub(crate) equalize: Equalize,
    pub(crate) mismatches: Mismatches,
    /// `--split` output: each split as its index.json lists it (the checks above cover them
    /// all: every sample in exactly one split, each split's index.json its shards).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) splits: Vec<SplitFigures>,
    pub(crate) shuffle: Shuffle,
    /// Whether the order was checked against the seeded one (and what it is), or why not.
    pub(crate) order: String,
    /// Bytes read and digested, input and output together.
    pub(crate) bytes_read: u64,
    /// The input sample bytes each rank read and digested, by rank.
    pub(crate) input_bytes_per_rank: Vec<u64>,
    pub(crate) seconds: f64,
    /// Everything that does not hold, each naming the file (and byte offset where there is one).
    pub problems: Vec<String>,
}

/// One split of a `--split` output in the verify report.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SplitFigures {
    pub(crate) name: String,
    pub(crate) shards: u64,
    pub(crate) samples: u64,
}

impl VerifyReport {
    /// The human-readable report.
    pub fn render(&self) -> String {
        let mut s = if self.ok {
            format!(
                "reshard verify: OK: {} holds exactly the input's samples\n",
                self.output.display()
            )
        } else {
            format!(
                "reshard verify: FAILED: {} problem{} in {}\n",
                self.problems.len(),
                plural(self.problems.len() as u64),
                self.output.display()
            )
        };
        s += &format!(
            "  input:    {}, {}\n",
            count(self.input_shards as u64, "shard"),
            count(self.input_samples, "sample")
        );
        s += &format!(
            "  output:   {}, {} (equalize {})\n",
            count(self.output_shards as u64, "shard"),
            count(self.output_samples, "sample"),
            equalize_name(self.equalize)
        );
        let m = self.mismatches;
        s += &format!(
            "  samples:  {} missing, {} not in the input, {} duplicated",
            m.missing, m.not_in_input, m.duplicated
        );
        if m.left_out > 0 {
            s += &format!(", {} left out (drop)", m.left_out);
        }
        if m.repeated > 0 {
            s += &format!(", {} repeated (pad)", m.repeated);
        }
        s += "\n";
        for split in &self.splits {
            s += &format!(
                "  split {}: {}, {}\n",
                split.name,
                count(split.shards, "shard"),
                count(split.samples, "sample")
            );
        }
        s += &format!("  order:    {}\n", self.order);
        let sh = &self.shuffle;
        match (sh.spearman, sh.random_bound) {
            (Some(rho), Some(bound)) => {
                s += &format!(
                    "  shuffle:  Spearman rho(input position, output position) = {rho:.4} over {} samples (a random order: |rho| < {bound:.4})\n",
                    sh.pairs
                );
            }
            _ => s += &format!("  shuffle:  too few samples ({}) to correlate\n", sh.pairs),
        }
        s += &format!(
            "  input shards per output shard: {} (of {})\n",
            sh.input_shards_per_output_shard.counts(),
            self.input_shards
        );
        s += &format!(
            "  read {} in {:.2} s on {} rank{}\n",
            human_bytes(self.bytes_read),
            self.seconds,
            self.ranks,
            plural(self.ranks as u64)
        );
        for p in &self.problems {
            s += &format!("  problem: {p}\n");
        }
        s
    }
}

pub(super) fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

pub(super) fn equalize_name(e: Equalize) -> &'static str {
    match e {
        Equalize::None => "none",
        Equalize::Drop => "drop",
        Equalize::Pad => "pad",
    }
}
