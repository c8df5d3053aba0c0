//! [`GpuShare`]: how the output shards divide among GPUs. A leaf: the manifest records it, and
//! `report/` (a floor above `output/`) prints it.

use serde::{Deserialize, Serialize};

use crate::config::GpuLayout;

/// How the shards divide among GPUs: GPU i reads shards i, i+G, i+2G, ... (webdataset's
/// split by node), each through W workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct GpuShare {
    pub(crate) gpus: u64,
    pub(crate) workers: u64,
    pub(crate) shards_per_gpu: u64,
    pub(crate) samples_per_gpu_min: u64,
    pub(crate) samples_per_gpu_max: u64,
    /// True when every GPU gets exactly the same number of samples.
    pub(crate) equal: bool,
    pub(crate) batch_size: Option<u64>,
    /// Full batches per GPU (the smallest over GPUs: what DDP can run without hanging).
    pub(crate) batches_per_gpu: Option<u64>,
}

impl GpuShare {
    pub(crate) fn new(layout: GpuLayout, shard_samples: &[u64]) -> Self {
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

    pub(crate) fn render(&self) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
