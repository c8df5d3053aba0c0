//! How many shards, and how many output positions once `--equalize` has dropped or padded.

/// `--equalize`: what to do when the samples do not divide evenly into the shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Equalize {
    /// Shard counts differ by at most one.
    #[default]
    None,
    /// The `N mod S` samples at the end of the permutation are left out.
    Drop,
    /// Samples from the start of the permutation are repeated to fill every shard.
    Pad,
}

impl Equalize {
    /// The flag's value, as `--equalize` takes it.
    pub(crate) fn flag(self) -> &'static str {
        match self {
            Equalize::None => "none",
            Equalize::Drop => "drop",
            Equalize::Pad => "pad",
        }
    }
}

/// Where each permuted sample goes: sample with permuted index `q` (`q = π(g)`) is written at
/// position `q`, unless it is dropped, and a padded run also writes the first samples of the
/// permutation a second time at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Targets {
    samples: u64,
    positions: u64,
}

impl Targets {
    /// # Errors
    /// Never for valid input; `shards` must be in `1..=samples`.
    pub fn new(samples: u64, shards: u64, equalize: Equalize) -> Self {
        let positions = match equalize {
            Equalize::None => samples,
            Equalize::Drop => samples / shards * shards,
            Equalize::Pad => samples.div_ceil(shards) * shards,
        };
        Targets { samples, positions }
    }

    /// Output positions in all: N, N − (N mod S) or S·⌈N/S⌉.
    pub(crate) fn positions(&self) -> u64 {
        self.positions
    }

    /// Samples left out (at the end of the permutation).
    pub(crate) fn dropped(&self) -> u64 {
        self.samples.saturating_sub(self.positions)
    }

    /// Samples written twice (from the start of the permutation).
    pub(crate) fn repeated(&self) -> u64 {
        self.positions.saturating_sub(self.samples)
    }

    /// The output positions of the sample with permuted index `q`: none, one or two.
    pub(crate) fn of(&self, q: u64) -> impl Iterator<Item = u64> {
        let first = (q < self.positions).then_some(q);
        let again = (q < self.repeated()).then_some(self.samples + q);
        first.into_iter().chain(again)
    }
}

/// How the shard count is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sizing {
    /// `--shards N`.
    Count(u64),
    /// `--shard-size SIZE`: the count whose mean shard size is nearest SIZE.
    Size(u64),
    /// `--gpus G --workers W [--shard-size SIZE]`: a multiple of G×W, the one whose mean shard size
    /// is nearest SIZE.
    Gpus { gpus: u64, workers: u64, size: u64 },
}

impl Sizing {
    /// The flags that ask for this sizing, as a user types them (`--shards 64`,
    /// `--gpus 8 --workers 2 --shard-size 536870912`): for messages and for what `--resume`
    /// records, so that neither depends on how the type is spelled in the code.
    pub(crate) fn flags(&self) -> String {
        match *self {
            Sizing::Count(n) => format!("--shards {n}"),
            Sizing::Size(size) => format!("--shard-size {size}"),
            Sizing::Gpus {
                gpus,
                workers,
                size,
            } => format!("--gpus {gpus} --workers {workers} --shard-size {size}"),
        }
    }

    /// The shard count for `samples` samples of `bytes` bytes, and why.
    ///
    /// # Errors
    /// More shards than samples, or G×W larger than the sample count.
    pub(crate) fn shards(&self, samples: u64, bytes: u64) -> anyhow::Result<(u64, String)> {
        use crate::size::human_bytes;
        match *self {
            Sizing::Count(n) => {
                if n > samples {
                    anyhow::bail!(
                        "--shards {n} is more than the {samples} samples in the input: every shard needs at least one sample"
                    );
                }
                Ok((n, format!("--shards {n}")))
            }
            Sizing::Size(size) => {
                let n = nearest_multiple(bytes, size, 1);
                if n > samples {
                    return Ok((samples, format!(
                        "--shard-size {}: {n} shards would be nearest, but there are only {samples} samples: one sample per shard",
                        human_bytes(size)
                    )));
                }
                Ok((
                    n,
                    format!(
                        "--shard-size {}: {n} shards of {} on average",
                        human_bytes(size),
                        human_bytes(bytes / n)
                    ),
                ))
            }
            Sizing::Gpus {
                gpus,
                workers,
                size,
            } => {
                let unit = gpus * workers;
                if unit > samples {
                    anyhow::bail!(
                        "--gpus {gpus} x --workers {workers} = {unit} shards at least, more than the {samples} samples in the input"
                    );
                }
                let nearest = nearest_multiple(bytes, size, unit);
                let n = nearest.min(samples / unit * unit);
                let why = if n < nearest {
                    " (fewer: limited by the sample count)"
                } else {
                    ""
                };
                let target = if size == DEFAULT_SHARD_SIZE {
                    "the default --shard-size"
                } else {
                    "--shard-size"
                };
                Ok((n, format!(
                    "--gpus {gpus} --workers {workers}: {} x {unit} shards, mean {} nearest {target} {}{why}",
                    n / unit,
                    human_bytes(bytes / n),
                    human_bytes(size)
                )))
            }
        }
    }
}

/// The shard size `--gpus` aims at when no `--shard-size` is given.
pub(crate) const DEFAULT_SHARD_SIZE: u64 = 512 << 20;

/// The positive multiple of `unit` whose mean share of `total` is nearest `target`.
fn nearest_multiple(total: u64, target: u64, unit: u64) -> u64 {
    let ideal = total as f64 / (target.max(1) as f64 * unit as f64);
    let lo = (ideal.floor() as u64).max(1);
    let hi = lo + 1;
    let miss = |k: u64| (total as f64 / (k * unit) as f64 - target as f64).abs();
    (if miss(hi) < miss(lo) { hi } else { lo }) * unit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn as_many_shards_as_samples_but_no_more() {
        assert_eq!(Sizing::Count(5).shards(5, 100).unwrap().0, 5);
        assert!(Sizing::Count(6).shards(5, 100).is_err());
        // 700 bytes at 100 a shard: exactly one sample per shard, not a capped count.
        let (n, why) = Sizing::Size(100).shards(7, 700).unwrap();
        assert_eq!(n, 7);
        assert!(why.contains("on average"), "{why}");
        let gpus = |g, w, size| Sizing::Gpus {
            gpus: g,
            workers: w,
            size,
        };
        let (n, why) = gpus(4, 1, 1 << 20).shards(4, 1 << 30).unwrap();
        assert_eq!(n, 4);
        assert!(why.contains("limited by the sample count"), "{why}");
        let (_, why) = gpus(4, 1, 256 << 20).shards(4, 1 << 30).unwrap();
        assert!(!why.contains("limited"), "{why}");
        assert!(why.contains("nearest --shard-size 256.00 MiB"), "{why}");
        // No --shard-size given: the default is said to be one.
        let (_, why) = gpus(4, 1, DEFAULT_SHARD_SIZE).shards(4, 1 << 30).unwrap();
        assert!(
            why.contains("nearest the default --shard-size 512.00 MiB"),
            "{why}"
        );
    }

    /// The count above the ideal wins when it is nearer: 2.9 rounds to 3, and 1.8 units of 16
    /// to 32 shards.
    #[test]
    fn the_nearest_count_may_be_the_larger() {
        assert_eq!(Sizing::Size(100).shards(1000, 290).unwrap().0, 3);
        // A tie (12 bytes at 5: 2 shards of 6 or 3 of 4) keeps the fewer, larger shards, so
        // that the count (and every output) never flips on a rounding change.
        assert_eq!(Sizing::Size(5).shards(1000, 12).unwrap().0, 2);
        let gpus = Sizing::Gpus {
            gpus: 8,
            workers: 2,
            size: 356 << 20,
        };
        assert_eq!(gpus.shards(100_000, 10 << 30).unwrap().0, 32);
    }

    #[test]
    fn equalize_targets() {
        let t = Targets::new(10, 4, Equalize::None);
        assert_eq!((t.positions(), t.dropped(), t.repeated()), (10, 0, 0));
        assert_eq!(t.of(9).collect::<Vec<_>>(), [9]);
        let t = Targets::new(10, 4, Equalize::Drop);
        assert_eq!((t.positions(), t.dropped(), t.repeated()), (8, 2, 0));
        assert_eq!(t.of(7).collect::<Vec<_>>(), [7]);
        assert_eq!(t.of(8).count(), 0);
        let t = Targets::new(10, 4, Equalize::Pad);
        assert_eq!((t.positions(), t.dropped(), t.repeated()), (12, 0, 2));
        assert_eq!(t.of(0).collect::<Vec<_>>(), [0, 10]);
        assert_eq!(t.of(1).collect::<Vec<_>>(), [1, 11]);
        assert_eq!(t.of(2).collect::<Vec<_>>(), [2]);
        // Every position is written exactly once.
        let mut seen = [0; 12];
        for q in 0..10 {
            for p in t.of(q) {
                seen[p as usize] += 1;
            }
        }
        assert!(seen.iter().all(|&c| c == 1));
        let t = Targets::new(12, 4, Equalize::Pad);
        assert_eq!(t.repeated(), 0);
    }

    #[test]
    fn sizing_modes() {
        let mib = 1u64 << 20;
        assert_eq!(Sizing::Count(5).shards(10, 0).unwrap().0, 5);
        assert!(Sizing::Count(11)
            .shards(10, 0)
            .unwrap_err()
            .to_string()
            .contains("more than the 10 samples"));
        // 1000 MiB at 300 MiB: 3 shards (333) beat 4 (250).
        assert_eq!(
            Sizing::Size(300 * mib).shards(1000, 1000 * mib).unwrap().0,
            3
        );
        assert_eq!(
            Sizing::Size(10 * mib).shards(1000, 1000 * mib).unwrap().0,
            100
        );
        assert_eq!(
            Sizing::Size(1).shards(7, 1000).unwrap().0,
            7,
            "capped at one sample per shard"
        );
        assert_eq!(Sizing::Size(u64::MAX / 4).shards(7, 1000).unwrap().0, 1);
        let gpus = |g, w, size| Sizing::Gpus {
            gpus: g,
            workers: w,
            size,
        };
        // 8x2 = 16 per unit; 10 GiB at 512 MiB is 20 shards: 16 is nearer than 32.
        assert_eq!(
            gpus(8, 2, 512 * mib).shards(100_000, 10 << 30).unwrap().0,
            16
        );
        assert_eq!(
            gpus(8, 2, 64 * mib).shards(100_000, 10 << 30).unwrap().0,
            160
        );
        assert_eq!(
            gpus(4, 1, mib).shards(10, 1 << 30).unwrap().0,
            8,
            "multiple limited by samples"
        );
        assert!(gpus(8, 2, mib)
            .shards(15, 1 << 30)
            .unwrap_err()
            .to_string()
            .contains("16"));
    }
}
