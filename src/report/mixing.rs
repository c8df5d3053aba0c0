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
}
