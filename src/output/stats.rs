//! [`Stats`]: the spread of a per-shard quantity. A leaf: the manifest records it, and `report/`
//! (a floor above `output/`) prints it.

use serde::{Deserialize, Serialize};

use crate::size::human_bytes;

/// Minimum, mean, maximum and (population) standard deviation of some per-shard quantity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Stats {
    pub(crate) min: u64,
    pub(crate) mean: f64,
    pub(crate) max: u64,
    pub(crate) stddev: f64,
}

impl Stats {
    pub(crate) fn of(values: &[u64]) -> Self {
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
    pub(crate) fn bytes(&self) -> String {
        format!(
            "min {} / mean {} / max {} / stddev {}",
            human_bytes(self.min),
            human_bytes(self.mean as u64),
            human_bytes(self.max),
            human_bytes(self.stddev as u64)
        )
    }

    /// `min / mean / max` as counts.
    pub(crate) fn counts(&self) -> String {
        format!(
            "min {} / mean {:.1} / max {}",
            self.min, self.mean, self.max
        )
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
}
