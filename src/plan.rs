//! Pure planning: which rank reads which input shards, which output shard each position falls
//! in, which rank writes each output shard, and where each sample lands inside its shard.

use std::ops::Range;

/// Assigns input shards to ranks in contiguous runs balanced by bytes: shard `i` goes to the rank
/// whose equal share of the total bytes contains the shard's midpoint. Keeps every rank's reads
/// sequential and needs no communication (every rank computes the same answer).
pub fn assign_inputs(sizes: &[u64], ranks: usize) -> Vec<Range<usize>> {
    let total: u128 = sizes.iter().map(|&s| u128::from(s)).sum();
    let mut owner_start = vec![sizes.len(); ranks + 1];
    let mut before: u128 = 0;
    let mut next_rank = 0;
    for (i, &s) in sizes.iter().enumerate() {
        let mid = 2 * before + u128::from(s); // twice the midpoint, to stay in integers
        let owner = if total == 0 {
            (i * ranks / sizes.len().max(1)).min(ranks - 1)
        } else {
            ((mid * ranks as u128) / (2 * total)).min(ranks as u128 - 1) as usize
        };
        while next_rank <= owner {
            owner_start[next_rank] = i;
            next_rank += 1;
        }
        before += u128::from(s);
    }
    (0..ranks)
        .map(|r| owner_start[r]..owner_start[r + 1])
        .collect()
}

/// How the output positions are cut into S shards (`bounds[s]..bounds[s + 1]` is shard s; every
/// shard non-empty) and which rank writes each shard (contiguous blocks of shards). Holds O(S),
/// never O(N).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPlan {
    bounds: Vec<u64>,
    ranks: u64,
}

impl ShardPlan {
    /// `positions` cut into `shards` shards whose counts differ by at most one (the first
    /// `positions mod shards` hold one more).
    ///
    /// # Panics
    /// If `shards` or `ranks` is zero, or `shards > positions`.
    pub fn by_count(positions: u64, shards: u64, ranks: usize) -> Self {
        assert!(shards > 0 && ranks > 0 && shards <= positions);
        let (base, extra) = (positions / shards, positions % shards);
        let bounds = (0..=shards).map(|s| s * base + s.min(extra)).collect();
        ShardPlan {
            bounds,
            ranks: ranks as u64,
        }
    }

    /// Groups of shards one after another, each of `(positions, shards)` cut by count like
    /// [`ShardPlan::by_count`]; groups with no shards are left out.
    ///
    /// # Panics
    /// As [`ShardPlan::by_count`], for any group with shards, or if no group has any.
    pub fn by_groups(groups: &[(u64, u64)], ranks: usize) -> Self {
        let mut bounds = vec![0];
        for &(positions, shards) in groups.iter().filter(|g| g.1 > 0) {
            let at = *bounds.last().unwrap();
            let group = ShardPlan::by_count(positions, shards, ranks);
            bounds.extend(group.bounds[1..].iter().map(|b| at + b));
        }
        ShardPlan::from_bounds(bounds, ranks)
    }

    /// Shards with the given boundaries (`bounds[0] == 0`, strictly increasing).
    ///
    /// # Panics
    /// If the boundaries are not strictly increasing from 0, or `ranks` is zero.
    pub fn from_bounds(bounds: Vec<u64>, ranks: usize) -> Self {
        assert!(ranks > 0 && bounds.len() >= 2 && bounds[0] == 0);
        assert!(
            bounds.windows(2).all(|w| w[0] < w[1]),
            "every shard needs a sample"
        );
        ShardPlan {
            bounds,
            ranks: ranks as u64,
        }
    }

    /// Number of output positions (samples written, repeats included).
    pub fn positions(&self) -> u64 {
        *self.bounds.last().unwrap()
    }

    pub fn shards(&self) -> u64 {
        self.bounds.len() as u64 - 1
    }

    /// The output positions of shard `s`.
    pub fn shard_positions(&self, s: u64) -> Range<u64> {
        self.bounds[s as usize]..self.bounds[s as usize + 1]
    }

    /// The shard holding output position `p`.
    pub fn shard_of(&self, p: u64) -> u64 {
        (self.bounds[1..].partition_point(|&b| b <= p)) as u64
    }

    /// The shards rank `r` writes.
    pub fn writer_shards(&self, r: usize) -> Range<u64> {
        let shards = u128::from(self.shards());
        let at = |r: u64| ((u128::from(r) * shards) / u128::from(self.ranks)) as u64;
        at(r as u64)..at(r as u64 + 1)
    }

    /// The rank that writes shard `s`.
    pub fn writer_of(&self, s: u64) -> usize {
        // The largest r with floor(r*S/P) <= s is ceil((s+1)*P/S) - 1.
        let (s, shards, ranks) = (
            u128::from(s),
            u128::from(self.shards()),
            u128::from(self.ranks),
        );
        (((s + 1) * ranks).div_ceil(shards) - 1) as usize
    }

    /// The output positions rank `r` writes (its shards' positions are contiguous).
    pub fn writer_positions(&self, r: usize) -> Range<u64> {
        let shards = self.writer_shards(r);
        self.bounds[shards.start as usize]..self.bounds[shards.end as usize]
    }
}

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
    pub fn positions(&self) -> u64 {
        self.positions
    }

    /// Samples left out (at the end of the permutation).
    pub fn dropped(&self) -> u64 {
        self.samples.saturating_sub(self.positions)
    }

    /// Samples written twice (from the start of the permutation).
    pub fn repeated(&self) -> u64 {
        self.positions.saturating_sub(self.samples)
    }

    /// The output positions of the sample with permuted index `q`: none, one or two.
    pub fn of(&self, q: u64) -> impl Iterator<Item = u64> {
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
    /// The shard count for `samples` samples of `bytes` bytes, and why.
    ///
    /// # Errors
    /// More shards than samples, or G×W larger than the sample count.
    pub fn shards(&self, samples: u64, bytes: u64) -> anyhow::Result<(u64, String)> {
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
                Ok((n, format!(
                    "--gpus {gpus} --workers {workers}: {} x {unit} shards, mean {} nearest --shard-size {}{why}",
                    n / unit,
                    human_bytes(bytes / n),
                    human_bytes(size)
                )))
            }
        }
    }
}

/// The positive multiple of `unit` whose mean share of `total` is nearest `target`.
fn nearest_multiple(total: u64, target: u64, unit: u64) -> u64 {
    let ideal = total as f64 / (target.max(1) as f64 * unit as f64);
    let lo = (ideal.floor() as u64).max(1);
    let hi = lo + 1;
    let miss = |k: u64| (total as f64 / (k * unit) as f64 - target as f64).abs();
    (if miss(hi) < miss(lo) { hi } else { lo }) * unit
}

/// `--balance bytes`: the shard of a position whose sample starts `before` bytes into the
/// permuted sequence and is `len` bytes long: the shard whose equal share of `total` contains the
/// sample's midpoint. Non-decreasing in the position, so shards are contiguous runs.
pub fn byte_shard_of(before: u64, len: u64, total: u64, shards: u64) -> u64 {
    let mid = 2 * u128::from(before) + u128::from(len);
    ((mid * u128::from(shards)) / (2 * u128::from(total.max(1)))).min(u128::from(shards) - 1) as u64
}

/// Repairs shard start positions gathered from a byte cut (`starts[s]`, `u64::MAX` where no
/// position fell in shard s) into strictly increasing boundaries with every shard non-empty.
pub fn bounds_from_starts(starts: &[u64], positions: u64) -> Vec<u64> {
    let shards = starts.len() as u64;
    // An empty shard starts where the next non-empty one does (zero width), then every shard is
    // widened to at least one position.
    let mut effective = starts.to_vec();
    let mut next = positions;
    for e in effective.iter_mut().rev() {
        *e = (*e).min(next);
        next = *e;
    }
    let mut bounds = Vec::with_capacity(starts.len() + 1);
    bounds.push(0);
    for s in 1..shards {
        let prev = bounds[s as usize - 1];
        bounds.push(
            effective[s as usize]
                .max(prev + 1)
                .min(positions - (shards - s)),
        );
    }
    bounds.push(positions);
    bounds
}

/// Where every sample of one writer's shards lands: the byte offset of each position inside its
/// shard, and each shard's file size (samples plus the two zero blocks that end a tar). Eight
/// bytes per position: a sample's length is the distance to the next offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardLayout {
    /// The boundaries of the shards covered, as positions.
    bounds: Vec<u64>,
    /// First position covered.
    pub first: u64,
    /// `offsets[p - first]`: byte offset of position p inside its shard.
    offsets: Vec<u64>,
    /// The shards covered and their file sizes, in order.
    pub shards: Range<u64>,
    pub shard_bytes: Vec<u64>,
}

/// Size of the end-of-archive marker: two zero blocks.
pub const TAR_TRAILER: u64 = 1024;

impl ShardLayout {
    /// Lays out `writer`'s shards from the length of the sample at each of its positions
    /// (`lens[p - first]`, in position order), turning the lengths into offsets in place.
    pub fn new(plan: &ShardPlan, writer: usize, mut lens: Vec<u64>) -> Self {
        let positions = plan.writer_positions(writer);
        assert_eq!(lens.len() as u64, positions.end - positions.start);
        let shards = plan.writer_shards(writer);
        let mut shard_bytes = Vec::with_capacity((shards.end - shards.start) as usize);
        let mut bounds = Vec::with_capacity(shard_bytes.capacity() + 1);
        for s in shards.clone() {
            let mut at = 0u64;
            bounds.push(plan.shard_positions(s).start);
            for p in plan.shard_positions(s) {
                let slot = &mut lens[(p - positions.start) as usize];
                let len = *slot;
                *slot = at;
                at += len;
            }
            shard_bytes.push(at + TAR_TRAILER);
        }
        bounds.push(positions.end);
        ShardLayout {
            bounds,
            first: positions.start,
            offsets: lens,
            shards,
            shard_bytes,
        }
    }

    /// Byte offset of position `p` inside its shard, and the sample's length.
    pub fn place(&self, p: u64) -> Option<(u64, u64)> {
        let i = usize::try_from(p.checked_sub(self.first)?).ok()?;
        let at = *self.offsets.get(i)?;
        let k = self.bounds[1..].partition_point(|&b| b <= p);
        let end = if p + 1 < self.bounds[k + 1] {
            self.offsets[i + 1]
        } else {
            self.shard_bytes[k] - TAR_TRAILER
        };
        Some((at, end - at))
    }

    /// Sample bytes in all of these shards.
    pub fn sample_bytes(&self) -> u64 {
        self.shard_bytes.iter().map(|b| b - TAR_TRAILER).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_balanced_by_bytes_and_contiguous() {
        let sizes = [100, 1, 1, 1, 50, 50, 97];
        let a = assign_inputs(&sizes, 3);
        // Shard 5 spans bytes 153..203 of 300: its midpoint 178 lies in rank 1's share.
        assert_eq!(a, vec![0..1, 1..6, 6..7]);
        for p in 1..10 {
            let a = assign_inputs(&sizes, p);
            assert_eq!(a.len(), p);
            assert_eq!(a[0].start, 0);
            assert_eq!(a[p - 1].end, sizes.len());
            for w in a.windows(2) {
                assert_eq!(w[0].end, w[1].start);
            }
        }
        assert_eq!(assign_inputs(&[0, 0], 2), vec![0..1, 1..2]);
        assert_eq!(assign_inputs(&[5], 3), vec![0..0, 0..1, 1..1]);
    }

    #[test]
    fn shard_counts_differ_by_at_most_one_and_cover_everything() {
        for (n, s) in [(10, 3), (3, 3), (100, 7), (1, 1), (1000, 999), (64, 64)] {
            let plan = ShardPlan::by_count(n, s, 1);
            let mut next = 0;
            for shard in 0..s {
                let r = plan.shard_positions(shard);
                assert_eq!(r.start, next);
                assert!(r.end - r.start == n / s || r.end - r.start == n / s + 1);
                for p in r.clone() {
                    assert_eq!(plan.shard_of(p), shard);
                }
                next = r.end;
            }
            assert_eq!(next, n);
        }
    }

    #[test]
    fn every_shard_has_exactly_one_writer() {
        for (s, ranks) in [(10, 3), (3, 5), (100, 4), (1, 1), (7, 7), (2, 400)] {
            let plan = ShardPlan::by_count(1000, s, ranks);
            let mut next = 0;
            for r in 0..ranks {
                let mine = plan.writer_shards(r);
                assert_eq!(mine.start, next);
                for shard in mine.clone() {
                    assert_eq!(
                        plan.writer_of(shard),
                        r,
                        "s={s} ranks={ranks} shard={shard}"
                    );
                }
                let pos = plan.writer_positions(r);
                if let (Some(first), Some(last)) = (mine.clone().next(), mine.clone().last()) {
                    assert_eq!(pos.start, plan.shard_positions(first).start);
                    assert_eq!(pos.end, plan.shard_positions(last).end);
                } else {
                    assert!(pos.is_empty());
                }
                next = mine.end;
            }
            assert_eq!(next, s);
        }
    }

    #[test]
    fn layout_offsets_are_prefix_sums_per_shard() {
        let plan = ShardPlan::by_count(7, 3, 2); // shards of 3,2,2; rank 0 writes shard 0, rank 1 shards 1..3
        assert_eq!(plan.writer_shards(1), 1..3);
        let layout = ShardLayout::new(&plan, 1, vec![512, 1024, 2048, 512]);
        assert_eq!(layout.first, 3);
        assert_eq!(layout.place(3), Some((0, 512)));
        assert_eq!(layout.place(4), Some((512, 1024)));
        assert_eq!(layout.place(5), Some((0, 2048)));
        assert_eq!(layout.place(6), Some((2048, 512)));
        assert_eq!(layout.place(7), None);
        assert_eq!(layout.place(2), None);
        assert_eq!(layout.shard_bytes, vec![1536 + 1024, 2560 + 1024]);
        assert_eq!(layout.sample_bytes(), 1536 + 2560);
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

    #[test]
    fn byte_balanced_bounds() {
        // Positions with sizes 10,10,10,70: two shards by bytes split after the third.
        let sizes = [10u64, 10, 10, 70];
        let mut before = 0;
        let mut starts = vec![u64::MAX; 2];
        for (p, &len) in sizes.iter().enumerate() {
            let s = byte_shard_of(before, len, 100, 2) as usize;
            starts[s] = starts[s].min(p as u64);
            before += len;
        }
        assert_eq!(bounds_from_starts(&starts, 4), vec![0, 3, 4]);
        // A huge sample leaves shards empty: they are repaired to one position each.
        assert_eq!(
            bounds_from_starts(&[0, u64::MAX, u64::MAX, 1], 5),
            vec![0, 1, 2, 3, 5]
        );
        assert_eq!(bounds_from_starts(&[0, 4, u64::MAX], 5), vec![0, 3, 4, 5]);
        let plan = ShardPlan::from_bounds(vec![0, 3, 4], 2);
        assert_eq!(plan.shard_of(2), 0);
        assert_eq!(plan.shard_of(3), 1);
        assert_eq!(plan.writer_positions(1), 3..4);
    }
}
