//! [`Axis`]: a plotters coordinate whose ticks we choose. plotters' own put ticks where its
//! range starts, so a flipped axis (shard 0 at the top) read 4, 14, 24, and a histogram's ticks
//! fell on bin edges (shards of 41 samples showed between 41 and 42). A leaf.

use std::ops::Range;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};

/// A linear axis over `range` with ticks at `ticks`; `flipped` puts `range.start` at the top
/// (or right) instead.
#[derive(Debug, Clone)]
pub(crate) struct Axis {
    pub(crate) range: Range<f64>,
    pub(crate) ticks: Vec<f64>,
    pub(crate) flipped: bool,
}

impl Axis {
    /// `range` with at most `max` ticks at round values (1, 2 or 5 times a power of ten apart;
    /// whole numbers when `whole`).
    pub(crate) fn round(range: Range<f64>, max: usize, whole: bool) -> Axis {
        let ticks = round_ticks(range.start, range.end, max, whole);
        Axis {
            range,
            ticks,
            flipped: false,
        }
    }

    /// Shards `0..n`, shard `j` drawn over `j..j + 1`, ticked at the middle of round shard
    /// numbers (at most `max`): the label names the shard under it.
    pub(crate) fn shards(n: u64, max: usize, flipped: bool) -> Axis {
        let last = n.saturating_sub(1) as f64;
        let ticks = round_ticks(0.0, last, max, true)
            .into_iter()
            .map(|t| t + 0.5)
            .collect();
        Axis {
            range: 0.0..n.max(1) as f64,
            ticks,
            flipped,
        }
    }

    /// The distance between two ticks (1 with fewer than two).
    pub(crate) fn tick_step(&self) -> f64 {
        match self.ticks.as_slice() {
            [a, b, ..] => b - a,
            _ => 1.0,
        }
    }
}

/// Round values in `lo..=hi`, at most `max` (at least one step of 1, 2, 5 x 10^k).
fn round_ticks(lo: f64, hi: f64, max: usize, whole: bool) -> Vec<f64> {
    let span = (hi - lo).max(f64::EPSILON);
    let raw = span / max.max(1) as f64;
    let power = 10f64.powf(raw.log10().floor());
    let mut step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * power)
        .find(|&s| s >= raw && span / s <= max.max(1) as f64)
        .unwrap_or(10.0 * power);
    if whole {
        step = step.max(1.0).round();
    }
    let first = (lo / step).ceil() as i64;
    let last = (hi / step + 1e-9).floor() as i64;
    (first..=last).map(|k| k as f64 * step).collect()
}

impl Ranged for Axis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let mut t = (value - self.range.start) / (self.range.end - self.range.start);
        if self.flipped {
            t = 1.0 - t;
        }
        limit.0 + (f64::from(limit.1 - limit.0) * t).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        // Only the labelled ticks: no light grid lines between them.
        if hint.weight().allow_light_points() {
            return Vec::new();
        }
        self.ticks.clone()
    }

    fn range(&self) -> Range<f64> {
        self.range.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        assert_eq!(
            round_ticks(0.0, 27.0, 6, true),
            vec![0.0, 5.0, 10.0, 15.0, 20.0, 25.0]
        );
        assert_eq!(
            round_ticks(39.5, 43.5, 6, true),
            vec![40.0, 41.0, 42.0, 43.0]
        );
        let fine = round_ticks(0.0, 0.35, 4, false);
        assert_eq!(fine.len(), 4);
        assert!((fine[3] - 0.3).abs() < 1e-12, "{fine:?}");
        // Shard 0 at the top, ticks at round shard numbers whatever the count.
        let a = Axis::shards(100, 8, true);
        assert_eq!(a.ticks, vec![0.5, 20.5, 40.5, 60.5, 80.5]);
        assert_eq!(a.map(&0.0, (0, 100)), 100);
        assert_eq!(Axis::shards(1, 8, false).ticks, vec![0.5]);
    }
}
