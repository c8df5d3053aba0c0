//! [`Mixing`]: how many samples each output shard draws from each input shard, binned so that
//! its size stays bounded however many shards there are (at most [`MAX_BINS`]² counts, summed
//! over ranks). A leaf.

/// Rows (output shards) and columns (input shards) are binned to at most this many each.
pub(crate) const MAX_BINS: usize = 64;

/// Samples per (output shard bin, input shard bin).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mixing {
    pub(crate) outputs: u64,
    pub(crate) inputs: u64,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    /// `rows * cols` counts, row by row.
    pub(crate) counts: Vec<u64>,
}

impl Mixing {
    /// Empty counts for `outputs` output shards and `inputs` input shards.
    pub(crate) fn new(outputs: u64, inputs: u64) -> Self {
        let bins = |n: u64| usize::try_from(n.clamp(1, MAX_BINS as u64)).expect("small");
        let (rows, cols) = (bins(outputs), bins(inputs));
        Mixing {
            outputs: outputs.max(1),
            inputs: inputs.max(1),
            rows,
            cols,
            counts: vec![0; rows * cols],
        }
    }

    /// The bin of shard `i` of `n` among `bins`: contiguous runs of shards, sizes within one.
    fn bin(i: u64, n: u64, bins: usize) -> usize {
        let b = u128::from(i.min(n - 1)) * bins as u128 / u128::from(n);
        usize::try_from(b).expect("below bins")
    }

    /// Counts one sample of input shard `input` placed in output shard `output`.
    pub(crate) fn add(&mut self, output: u64, input: u64) {
        let r = Self::bin(output, self.outputs, self.rows);
        let c = Self::bin(input, self.inputs, self.cols);
        self.counts[r * self.cols + c] += 1;
    }

    /// The same shape with `counts` (the sum over ranks of every rank's counts).
    pub(crate) fn with_counts(&self, counts: Vec<u64>) -> Self {
        assert_eq!(counts.len(), self.counts.len(), "same shape");
        Mixing {
            counts,
            ..self.clone()
        }
    }

    /// The shards of the output bin `r` (or input bin, with `inputs`), as a range of shard numbers.
    pub(crate) fn shards_of(bin: usize, bins: usize, n: u64) -> std::ops::Range<u64> {
        let first = |b: usize| (u128::from(n) * b as u128).div_ceil(bins as u128) as u64;
        first(bin)..first(bin + 1)
    }

    fn row_sum(&self, r: usize) -> u64 {
        self.counts[r * self.cols..(r + 1) * self.cols].iter().sum()
    }

    fn col_sum(&self, c: usize) -> u64 {
        (0..self.rows).map(|r| self.counts[r * self.cols + c]).sum()
    }

    /// Share of output bin `r`'s samples that come from input bin `c`.
    pub(crate) fn share(&self, r: usize, c: usize) -> f64 {
        self.counts[r * self.cols + c] as f64 / self.row_sum(r).max(1) as f64
    }

    /// What [`Mixing::share`] is, on average, under a uniform random permutation: input bin
    /// `c`'s share of all samples, whatever the row.
    pub(crate) fn uniform_share(&self, c: usize) -> f64 {
        let total: u64 = self.counts.iter().sum();
        self.col_sum(c) as f64 / total.max(1) as f64
    }
}

/// Cells whose expected count is below this make the chi-square figure meaningless.
const LEAST_EXPECTED: f64 = 5.0;

/// How many standard deviations from a uniform random permutation's chi-square still look like
/// one (a uniform permutation lies beyond 4 about once in 10^4 to 10^5 runs).
const UNIFORM_WITHIN: f64 = 4.0;

impl Mixing {
    /// Whether the order looks like a uniform random permutation, in words: Pearson's
    /// chi-square of the binned counts against independence of output and input shard. Under a
    /// uniform permutation it is about its degrees of freedom, (rows - 1)(cols - 1), give or
    /// take the square root of twice that; an order that keeps input shards together lies far
    /// above, a deliberate interleave far below.
    pub(crate) fn verdict(&self) -> String {
        let total: u64 = self.counts.iter().sum();
        let cells = self.rows * self.cols;
        let df = ((self.rows - 1) * (self.cols - 1)) as f64;
        if df == 0.0 || (total as f64) < LEAST_EXPECTED * cells as f64 {
            return format!(
                "mixing: too few samples to judge the order ({total} in {} x {} bins of output x input shards, at least {} needed)",
                self.rows,
                self.cols,
                (LEAST_EXPECTED * cells as f64) as u64
            );
        }
        let mut chi = 0.0;
        for r in 0..self.rows {
            for c in 0..self.cols {
                let want = self.row_sum(r) as f64 * self.col_sum(c) as f64 / total as f64;
                if want > 0.0 {
                    let off = self.counts[r * self.cols + c] as f64 - want;
                    chi += off * off / want;
                }
            }
        }
        let z = (chi - df) / (2.0 * df).sqrt();
        let how = if z > UNIFORM_WITHIN {
            "not uniformly mixed: output shards draw unevenly from the input shards (an order that keeps input shards together)"
        } else if z < -UNIFORM_WITHIN {
            "more evenly spread than a uniform random permutation (a deliberate interleave, not a random order)"
        } else {
            "looks uniformly mixed"
        };
        format!(
            "mixing: {how} (chi-square {chi:.1} on {df} degrees of freedom: {z:+.1} standard deviations from a uniform random permutation)"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_are_bounded_and_cover_every_shard() {
        let mut m = Mixing::new(1000, 3);
        assert_eq!((m.rows, m.cols, m.counts.len()), (64, 3, 192));
        for o in 0..1000 {
            m.add(o, o % 3);
        }
        assert_eq!(m.counts.iter().sum::<u64>(), 1000);
        // Every bin holds the shards `shards_of` names.
        for r in 0..m.rows {
            let shards = Mixing::shards_of(r, m.rows, 1000);
            assert!(
                (15..=16).contains(&(shards.end - shards.start)),
                "{shards:?}"
            );
            assert_eq!(m.row_sum(r), shards.end - shards.start);
        }
        assert!((m.uniform_share(0) - 334.0 / 1000.0).abs() < 1e-12);
        let small = Mixing::new(2, 2);
        assert_eq!((small.rows, small.cols), (2, 2));
        let summed = small.with_counts(vec![3, 1, 0, 4]);
        assert!((summed.share(0, 0) - 0.75).abs() < 1e-12);
        assert!((summed.uniform_share(1) - 5.0 / 8.0).abs() < 1e-12);
    }

    #[test]
    fn the_verdict_tells_a_shuffle_from_an_ordered_or_interleaved_one() {
        let (outputs, inputs, n) = (10u64, 8u64, 8000u64);
        // A seeded shuffle's placement (a multiplicative hash of the position: no structure).
        let mut shuffled = Mixing::new(outputs, inputs);
        let mut kept = Mixing::new(outputs, inputs);
        let mut dealt = Mixing::new(outputs, inputs);
        for i in 0..n {
            let h = i.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17) % n;
            shuffled.add(h * outputs / n, i * inputs / n);
            kept.add(i * outputs / n, i * inputs / n);
            dealt.add(i % outputs, i * inputs / n);
        }
        assert!(
            shuffled.verdict().contains("looks uniformly mixed"),
            "{}",
            shuffled.verdict()
        );
        assert!(
            kept.verdict().contains("not uniformly mixed"),
            "{}",
            kept.verdict()
        );
        assert!(
            dealt.verdict().contains("more evenly spread"),
            "{}",
            dealt.verdict()
        );
        let mut few = Mixing::new(outputs, inputs);
        few.add(0, 0);
        assert!(
            few.verdict().contains("too few samples"),
            "{}",
            few.verdict()
        );
    }
}
