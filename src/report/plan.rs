//! [`PlanReport`]: what `reshard plan` prints, and its rendering. The only file of `report/` that
//! knows the manifest (its per-shard rows are the manifest's shard entries).

use serde::Serialize;

use super::storage::Storage;
use crate::config::Balance;
use crate::output::manifest::ShardEntry;
use crate::output::{GpuShare, Stats};
use crate::plan::placement::StratifyReport;
use crate::plan::Equalize;
use crate::report::narrate::count;
use crate::size::human_bytes;
use crate::throttle::Limits;

/// The plan `reshard plan` prints: everything `run` would do, before any data moves.
#[derive(Debug, Clone, Serialize)]
pub struct PlanReport {
    pub(crate) samples: u64,
    pub(crate) sample_bytes: u64,
    pub(crate) input_shards: usize,
    /// The input shards' own balance: bytes and samples per input shard.
    pub(crate) input_shard_bytes: Stats,
    pub(crate) input_shard_samples: Stats,
    pub(crate) shards: u64,
    /// Why this shard count.
    pub(crate) sizing: String,
    pub(crate) equalize: Equalize,
    pub(crate) balance: Balance,
    /// Samples written (repeats included, dropped excluded).
    pub(crate) output_samples: u64,
    pub(crate) dropped: u64,
    pub(crate) repeated: u64,
    pub(crate) shard_samples: Stats,
    pub(crate) shard_bytes: Stats,
    pub(crate) gpus: Option<GpuShare>,
    /// Inodes the output takes, and warnings for a parallel filesystem.
    pub(crate) storage: Storage,
    /// `--order`, and what stratification achieved.
    pub(crate) order: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) stratify: Option<StratifyReport>,
    pub(crate) per_shard: Vec<ShardEntry>,
    /// With `--max-read-rate` or `--max-write-rate`: how long moving the data takes at least.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) at_limits: Option<AtLimits>,
}

/// The least time the data movement takes at the given rate limits: the index's reads at the
/// read limit, then the bytes the exchange reads and writes, each divided by its limit (the
/// slower decides). Compute and waits are extra.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct AtLimits {
    pub(crate) limits: Limits,
    /// What the index read (tar headers, saved indexes), measured by the plan's own index pass,
    /// which reads what the run's will.
    pub(crate) index_bytes: u64,
    /// Everything read: the index's bytes and the samples'.
    pub(crate) read_bytes: u64,
    pub(crate) write_bytes: u64,
    pub(crate) seconds: f64,
}

impl AtLimits {
    pub(crate) fn render(&self) -> String {
        let rate = |r: Option<u64>| r.map_or("none".to_string(), |r| human_bytes(r) + "/s");
        format!(
            "  at the rate limits (read {}, write {}): the data movement takes at least {:.1} s ({} read, {} of it by the index; {} written)\n",
            rate(self.limits.read),
            rate(self.limits.write),
            self.seconds,
            human_bytes(self.read_bytes),
            human_bytes(self.index_bytes),
            human_bytes(self.write_bytes)
        )
    }
}

impl PlanReport {
    pub fn render(&self) -> String {
        let mut s = format!(
            "reshard plan: {}, {} in {}\n",
            count(self.samples, "sample"),
            human_bytes(self.sample_bytes),
            count(self.input_shards as u64, "input shard")
        );
        s += &format!(
            "  input shard bytes:   {}\n",
            self.input_shard_bytes.bytes()
        );
        s += &format!(
            "  input shard samples: {}\n",
            self.input_shard_samples.counts()
        );
        s += &format!(
            "  output: {} ({})\n",
            count(self.shards, "shard"),
            self.sizing
        );
        s += &format!("  order: {}\n", self.order);
        if let Some(st) = &self.stratify {
            s += &format!(
                "  stratified by .{}: {} labels, worst deviation from the ideal share {:.3}\n",
                st.ext, st.labels, st.worst_deviation
            );
        }
        s += &match self.equalize {
            Equalize::None => format!("  equalize none: {} samples\n", self.output_samples),
            Equalize::Drop => format!(
                "  equalize drop: {} samples left out, {} written\n",
                self.dropped, self.output_samples
            ),
            Equalize::Pad => format!(
                "  equalize pad: {} samples repeated, {} written\n",
                self.repeated, self.output_samples
            ),
        };
        s += &format!(
            "  shard samples: {} (--balance {})\n",
            self.shard_samples.counts(),
            self.balance.flag()
        );
        s += &format!("  shard bytes:   {}\n", self.shard_bytes.bytes());
        if let Some(g) = &self.gpus {
            s += &format!("  {}\n", g.render());
        }
        s += &self.storage.render();
        if let Some(a) = &self.at_limits {
            s += &a.render();
        }
        let n = self.per_shard.len();
        let shown: Vec<usize> = if n <= 12 {
            (0..n).collect()
        } else {
            (0..6).chain(n - 6..n).collect()
        };
        s += "  shard                      samples        bytes\n";
        for (k, &i) in shown.iter().enumerate() {
            if k > 0 && i != shown[k - 1] + 1 {
                s += &format!("  ... {} more\n", i - shown[k - 1] - 1);
            }
            let e = &self.per_shard[i];
            s += &format!("  {:<24} {:>9} {:>12}\n", e.url, e.nsamples, e.filesize);
        }
        s
    }
}
