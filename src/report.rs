//! What a plan says and what a run reports: shard statistics, GPU shares, the plan report.

use serde::{Deserialize, Serialize};

use crate::cli::{Balance, GpuLayout};
use crate::manifest::ShardEntry;
use crate::plan::Equalize;
use crate::size::human_bytes;

/// Minimum, mean, maximum and (population) standard deviation of some per-shard quantity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub min: u64,
    pub mean: f64,
    pub max: u64,
    pub stddev: f64,
}

impl Stats {
    pub fn of(values: &[u64]) -> Self {
        if values.is_empty() {
            return Stats::default();
        }
        let n = values.len() as f64;
        let mean = values.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = values
            .iter()
            .map(|&v| (v as f64 - mean).powi(2))
            .sum::<f64>()
            / n;
        Stats {
            min: *values.iter().min().unwrap(),
            mean,
            max: *values.iter().max().unwrap(),
            stddev: var.sqrt(),
        }
    }

    /// `min / mean / max / stddev` with sizes in binary units.
    pub fn bytes(&self) -> String {
        format!(
            "min {} / mean {} / max {} / stddev {}",
            human_bytes(self.min),
            human_bytes(self.mean as u64),
            human_bytes(self.max),
            human_bytes(self.stddev as u64)
        )
    }

    /// `min / mean / max` as counts.
    pub fn counts(&self) -> String {
        format!(
            "min {} / mean {:.1} / max {}",
            self.min, self.mean, self.max
        )
    }
}

/// How the shards divide among GPUs: GPU i reads shards i, i+G, i+2G, ... (webdataset's
/// split by node), each through W workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuShare {
    pub gpus: u64,
    pub workers: u64,
    pub shards_per_gpu: u64,
    pub samples_per_gpu_min: u64,
    pub samples_per_gpu_max: u64,
    /// True when every GPU gets exactly the same number of samples.
    pub equal: bool,
    pub batch_size: Option<u64>,
    /// Full batches per GPU (the smallest over GPUs: what DDP can run without hanging).
    pub batches_per_gpu: Option<u64>,
}

impl GpuShare {
    pub fn new(layout: GpuLayout, shard_samples: &[u64]) -> Self {
        let g = layout.gpus as usize;
        let per_gpu: Vec<u64> = (0..g)
            .map(|i| shard_samples.iter().skip(i).step_by(g).sum())
            .collect();
        let (min, max) = (
            *per_gpu.iter().min().unwrap_or(&0),
            *per_gpu.iter().max().unwrap_or(&0),
        );
        GpuShare {
            gpus: layout.gpus,
            workers: layout.workers,
            shards_per_gpu: shard_samples.len() as u64 / layout.gpus,
            samples_per_gpu_min: min,
            samples_per_gpu_max: max,
            equal: min == max,
            batch_size: layout.batch_size,
            batches_per_gpu: layout.batch_size.map(|b| min / b),
        }
    }

    pub fn render(&self) -> String {
        let samples = if self.equal {
            format!("{} samples on every GPU", self.samples_per_gpu_min)
        } else {
            format!(
                "{}..{} samples per GPU (unequal: use --equalize drop or pad)",
                self.samples_per_gpu_min, self.samples_per_gpu_max
            )
        };
        let batches = match (self.batch_size, self.batches_per_gpu) {
            (Some(b), Some(n)) => format!(", {n} full batches of {b} per GPU"),
            _ => String::new(),
        };
        format!(
            "{} GPUs x {} workers: {} shards per GPU, {samples}{batches}",
            self.gpus, self.workers, self.shards_per_gpu
        )
    }
}

/// The plan `reshard plan` prints: everything `run` would do, before any data moves.
#[derive(Debug, Clone, Serialize)]
pub struct PlanReport {
    pub samples: u64,
    pub sample_bytes: u64,
    pub input_shards: usize,
    /// The input shards' own balance: bytes and samples per input shard.
    pub input_shard_bytes: Stats,
    pub input_shard_samples: Stats,
    pub shards: u64,
    /// Why this shard count.
    pub sizing: String,
    pub equalize: Equalize,
    pub balance: Balance,
    /// Samples written (repeats included, dropped excluded).
    pub output_samples: u64,
    pub dropped: u64,
    pub repeated: u64,
    pub shard_samples: Stats,
    pub shard_bytes: Stats,
    pub gpus: Option<GpuShare>,
    /// `--order`, and what stratification achieved.
    pub order: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stratify: Option<crate::order::StratifyReport>,
    pub per_shard: Vec<ShardEntry>,
}

impl PlanReport {
    pub fn render(&self) -> String {
        let mut s = format!(
            "reshard plan: {} samples, {} in {} input shards\n",
            self.samples,
            human_bytes(self.sample_bytes),
            self.input_shards
        );
        s += &format!(
            "  input shard bytes:   {}\n",
            self.input_shard_bytes.bytes()
        );
        s += &format!(
            "  input shard samples: {}\n",
            self.input_shard_samples.counts()
        );
        s += &format!("  output: {} shards ({})\n", self.shards, self.sizing);
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
            "  shard samples: {} (balance by {:?})\n",
            self.shard_samples.counts(),
            self.balance
        );
        s += &format!("  shard bytes:   {}\n", self.shard_bytes.bytes());
        if let Some(g) = &self.gpus {
            s += &format!("  {}\n", g.render());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats() {
        let s = Stats::of(&[2, 4, 4, 4, 5, 5, 7, 9]);
        assert_eq!((s.min, s.max), (2, 9));
        assert!((s.mean - 5.0).abs() < 1e-9 && (s.stddev - 2.0).abs() < 1e-9);
    }

    #[test]
    fn gpu_shares_follow_split_by_node() {
        let layout = GpuLayout {
            gpus: 2,
            workers: 2,
            batch_size: Some(4),
        };
        let g = GpuShare::new(layout, &[10, 10, 9, 9]);
        assert_eq!(
            (g.samples_per_gpu_min, g.samples_per_gpu_max, g.equal),
            (19, 19, true)
        );
        assert_eq!(g.batches_per_gpu, Some(4));
        let g = GpuShare::new(layout, &[10, 9, 9, 9]);
        assert!(!g.equal && g.samples_per_gpu_max == 19 && g.batches_per_gpu == Some(4));
        assert!(g.render().contains("unequal"));
    }
}
