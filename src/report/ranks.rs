//! [`Spread`]: a per-rank figure as minimum, median and maximum with the ranks at the extremes,
//! so that a summary stays a few lines long at 1000 ranks. A leaf.

use serde::Serialize;

/// Minimum, median and maximum of one figure over the ranks, and which ranks hold the extremes
/// (the lowest rank on a tie).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Spread {
    pub(crate) min: u64,
    pub(crate) median: u64,
    pub(crate) max: u64,
    pub(crate) min_rank: usize,
    pub(crate) max_rank: usize,
}

impl Spread {
    /// The spread of `values`, indexed by rank. The median of an even count is the lower of the
    /// two middle values: a value some rank really has.
    pub(crate) fn of(values: &[u64]) -> Self {
        if values.is_empty() {
            return Spread::default();
        }
        let mut sorted = values.to_vec();
        sorted.sort_unstable();
        let (min_rank, &min) = values
            .iter()
            .enumerate()
            .min_by_key(|&(r, v)| (*v, r))
            .expect("not empty");
        let (max_rank, &max) = values
            .iter()
            .enumerate()
            .max_by_key(|&(r, v)| (*v, std::cmp::Reverse(r)))
            .expect("not empty");
        Spread {
            min,
            median: sorted[(sorted.len() - 1) / 2],
            max,
            min_rank,
            max_rank,
        }
    }

    /// `min / median / max` with each value shown by `show`, padded to a column.
    pub(crate) fn render(&self, show: impl Fn(u64) -> String) -> String {
        format!(
            "{:>10} {:>10} {:>10}",
            show(self.min),
            show(self.median),
            show(self.max)
        )
    }
}

/// Seconds from nanoseconds, as a summary shows them.
pub(crate) fn seconds(nanos: u64) -> String {
    format!("{:.2} s", nanos as f64 / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_names_the_ranks_at_the_extremes() {
        let s = Spread::of(&[5, 9, 1, 9, 3, 1]);
        assert_eq!((s.min, s.median, s.max), (1, 3, 9));
        // Ties go to the lowest rank.
        assert_eq!((s.min_rank, s.max_rank), (2, 1));
        let one = Spread::of(&[7]);
        assert_eq!((one.min, one.median, one.max, one.max_rank), (7, 7, 7, 0));
        assert_eq!(Spread::of(&[]), Spread::default());
        assert_eq!(seconds(1_500_000_000), "1.50 s");
    }
}
