//! `--split train=0.98,val=0.01,test=0.01`: which split each sample belongs to.
//!
//! The assignment is a pure function of the seed and N, never of the epoch or the rank count:
//! a permutation of its own, π_split(seed, N), gives every sample a *split rank* (or, with
//! `--stratify-by`, a sort by (label, π_split(g)) does), and the split rank is dealt to the
//! splits along nested Bresenham lines: the first split takes ⌊(j+1)·n₀/N⌋ − ⌊j·n₀/N⌋ of rank
//! `j`, the next takes its share of the rest the same way, and so on. Any run of consecutive
//! ranks (a label's samples, say) is dealt in proportion (each split's count within K − 1 of its
//! share with K splits: nesting adds at most one per level), and every split gets exactly its
//! count.
//! Another epoch reorders the samples inside each split but never moves one between splits.

use std::str::FromStr;

use anyhow::{bail, Result};

/// One split as `--split` names it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SplitPart {
    /// The directory name of the split inside the output (`train`, `val`, …).
    pub(crate) name: String,
    pub(crate) share: Share,
}

/// How large a split is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Share {
    /// A fraction of the samples (`0.01`, or `1%`).
    Ratio(f64),
    /// An exact sample count (`5000`).
    Count(u64),
    /// What the other splits leave (`rest`).
    Rest,
}

/// `--split`: the splits in the order given. The first is the training split, which the sizing
/// flags (`--shards`, `--shard-size`, `--gpus`) size; the others are sized by `--split-shards`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SplitSpec {
    pub(crate) parts: Vec<SplitPart>,
}

/// Names a split may not take: they are reshard's own files in the output directory.
const RESERVED: [&str; 2] = [".reshard", "index.json"];

impl FromStr for SplitSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let usage = "expected NAME=SHARE,... with SHARE a ratio (0.01), a percentage (1%), a \
                     sample count (5000) or rest, e.g. train=0.98,val=0.01,test=0.01";
        let mut parts: Vec<SplitPart> = Vec::new();
        for item in text.split(',') {
            let Some((name, share)) = item.split_once('=') else {
                return Err(format!("{usage}; got {item:?}"));
            };
            let (name, share) = (name.trim(), share.trim());
            if name.is_empty()
                || RESERVED.contains(&name)
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return Err(format!(
                    "split name {name:?}: expected letters, digits, '_' or '-' (it names the split's directory in the output)"
                ));
            }
            if parts.iter().any(|p| p.name == name) {
                return Err(format!("split {name:?} is named twice"));
            }
            let share = parse_share(share).map_err(|why| format!("split {name}={share}: {why}"))?;
            parts.push(SplitPart {
                name: name.to_string(),
                share,
            });
        }
        let spec = SplitSpec { parts };
        spec.check().map_err(|e| format!("{e:#}"))?;
        Ok(spec)
    }
}

fn parse_share(text: &str) -> Result<Share, String> {
    if text == "rest" {
        return Ok(Share::Rest);
    }
    let ratio = |v: f64| {
        if v.is_finite() && v > 0.0 && v <= 1.0 {
            Ok(Share::Ratio(v))
        } else {
            Err("a ratio must be more than 0 and at most 1".to_string())
        }
    };
    if let Some(percent) = text.strip_suffix('%') {
        let v: f64 = percent
            .trim()
            .parse()
            .map_err(|_| "expected a percentage such as 1%".to_string())?;
        return ratio(v / 100.0);
    }
    if text.bytes().all(|b| b.is_ascii_digit()) && !text.is_empty() {
        let n: u64 = text.parse().map_err(|_| "count too large".to_string())?;
        if n == 0 {
            return Err("a split needs at least one sample".into());
        }
        return Ok(Share::Count(n));
    }
    match text.parse::<f64>() {
        Ok(v) => ratio(v),
        Err(_) => Err("expected a ratio (0.01), a percentage (1%), a count (5000) or rest".into()),
    }
}

impl SplitSpec {
    /// The `--split` value that asks for these splits (`train=0.98,val=rest`).
    pub(crate) fn flag(&self) -> String {
        let parts: Vec<String> = self
            .parts
            .iter()
            .map(|p| match p.share {
                Share::Ratio(r) => format!("{}={r}", p.name),
                Share::Count(n) => format!("{}={n}", p.name),
                Share::Rest => format!("{}=rest", p.name),
            })
            .collect();
        parts.join(",")
    }

    /// The split names, in order.
    pub(crate) fn names(&self) -> Vec<String> {
        self.parts.iter().map(|p| p.name.clone()).collect()
    }

    /// Checks what can be checked without the sample count: at least two splits, ratios and
    /// counts not mixed, at most one `rest`, ratios that add up to 1 (below 1 with `rest`).
    fn check(&self) -> Result<()> {
        if self.parts.len() < 2 {
            bail!("--split needs at least two splits, e.g. train=0.99,val=0.01");
        }
        let rests = self.parts.iter().filter(|p| p.share == Share::Rest).count();
        if rests > 1 {
            bail!("--split: only one split can take the rest");
        }
        let ratios: Vec<f64> = self
            .parts
            .iter()
            .filter_map(|p| match p.share {
                Share::Ratio(r) => Some(r),
                _ => None,
            })
            .collect();
        let counts = self
            .parts
            .iter()
            .filter(|p| matches!(p.share, Share::Count(_)))
            .count();
        if !ratios.is_empty() && counts > 0 {
            bail!("--split: give every split a ratio, or every split a sample count (one may be rest), not both");
        }
        let sum: f64 = ratios.iter().sum();
        if !ratios.is_empty() {
            if rests == 0 && (sum - 1.0).abs() > 1e-9 {
                bail!(
                    "--split: the ratios add up to {sum}, not 1 (give exact shares, or let one split take the rest: val=0.01,test=0.01,train=rest)"
                );
            }
            if rests == 1 && sum >= 1.0 - 1e-9 {
                bail!("--split: the ratios add up to {sum}, which leaves nothing for the rest");
            }
        }
        Ok(())
    }

    /// The sample count of each split for `n` samples. Ratios are rounded by largest
    /// remainder (ties to the earlier split), so the counts add up to `n` exactly.
    ///
    /// # Errors
    /// Counts that do not add up to `n` (or leave nothing for `rest`), or a split that would get
    /// no sample.
    pub(crate) fn counts(&self, n: u64) -> Result<Vec<u64>> {
        let given: u64 = self
            .parts
            .iter()
            .map(|p| match p.share {
                Share::Count(c) => c,
                _ => 0,
            })
            .sum();
        let is_counts = self
            .parts
            .iter()
            .any(|p| matches!(p.share, Share::Count(_)));
        let counts = if is_counts {
            let rest = self.parts.iter().any(|p| p.share == Share::Rest);
            if !rest && given != n {
                bail!("--split: the sample counts add up to {given}, but the input has {n} samples (let one split take the rest: val=1000,test=1000,train=rest)");
            }
            if rest && given >= n {
                bail!("--split: the sample counts add up to {given}, which leaves nothing for the rest of the input's {n} samples");
            }
            self.parts
                .iter()
                .map(|p| match p.share {
                    Share::Count(c) => c,
                    _ => n - given,
                })
                .collect()
        } else {
            self.rounded(n)
        };
        if let Some((part, _)) = self.parts.iter().zip(&counts).find(|(_, c)| **c == 0) {
            bail!(
                "--split: split {:?} gets none of the input's {n} samples: give it a larger share, or leave it out",
                part.name
            );
        }
        Ok(counts)
    }

    /// Ratios as counts adding up to `n`, by largest remainder.
    fn rounded(&self, n: u64) -> Vec<u64> {
        let named: f64 = self
            .parts
            .iter()
            .map(|p| match p.share {
                Share::Ratio(r) => r,
                _ => 0.0,
            })
            .sum();
        let ideal: Vec<f64> = self
            .parts
            .iter()
            .map(|p| match p.share {
                Share::Ratio(r) => r * n as f64,
                _ => (1.0 - named).max(0.0) * n as f64,
            })
            .collect();
        let mut counts: Vec<u64> = ideal.iter().map(|x| (x.floor() as u64).min(n)).collect();
        let mut order: Vec<usize> = (0..ideal.len()).collect();
        // Largest remainder first; the sort is stable, so ties go to the earlier split. Rounded
        // to 1e-9, so that `rest` (1 − the others, inexact in floating point) ties as it should.
        order.sort_by_key(|&k| {
            std::cmp::Reverse(((ideal[k] - ideal[k].floor()) * 1e9).round() as u64)
        });
        let mut k = 0;
        while counts.iter().sum::<u64>() < n {
            counts[order[k % order.len()]] += 1;
            k += 1;
        }
        while counts.iter().sum::<u64>() > n {
            // Only from rounding error in the ratios: take from the largest split.
            let big = (0..counts.len()).max_by_key(|&i| counts[i]).unwrap();
            counts[big] -= 1;
        }
        counts
    }
}

/// The splits' sample counts, and the deal of split ranks to them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SplitDeal {
    counts: Vec<u64>,
    total: u64,
}

fn mul_div(a: u64, b: u64, c: u64) -> u64 {
    (u128::from(a) * u128::from(b) / u128::from(c)) as u64
}

impl SplitDeal {
    /// # Panics
    /// If a count is zero.
    pub(crate) fn new(counts: Vec<u64>) -> SplitDeal {
        assert!(counts.iter().all(|&c| c > 0));
        let total = counts.iter().sum();
        SplitDeal { counts, total }
    }

    /// The split of split rank `j` (in `0..N`), and its rank inside that split.
    pub(crate) fn of_rank(&self, mut j: u64) -> (usize, u64) {
        let mut left = self.total;
        let last = self.counts.len() - 1;
        for (k, &n) in self.counts[..last].iter().enumerate() {
            let before = mul_div(j, n, left);
            if mul_div(j + 1, n, left) > before {
                return (k, before);
            }
            j -= before;
            left -= n;
        }
        (last, j)
    }

    /// How many of the split ranks `a..a + n` each split gets.
    pub(crate) fn counts_in(&self, mut a: u64, mut n: u64) -> Vec<u64> {
        let mut left = self.total;
        let last = self.counts.len() - 1;
        let mut out = Vec::with_capacity(self.counts.len());
        for &c in &self.counts[..last] {
            let (before, through) = (mul_div(a, c, left), mul_div(a + n, c, left));
            out.push(through - before);
            a -= before;
            n -= through - before;
            left -= c;
        }
        out.push(n);
        out
    }

    /// The worst |count − ideal| over the splits for a run of ranks `a..a + n` (a label's
    /// samples), where the ideal is `n` times the split's share.
    pub(crate) fn deviation(&self, a: u64, n: u64) -> f64 {
        self.counts_in(a, n)
            .iter()
            .zip(&self.counts)
            .map(|(&got, &c)| (got as f64 - n as f64 * c as f64 / self.total as f64).abs())
            .fold(0.0, f64::max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> Result<SplitSpec, String> {
        text.parse()
    }

    #[test]
    fn splits_parse_and_refuse_what_cannot_work() {
        let s = spec("train=0.98,val=0.01,test=0.01").unwrap();
        assert_eq!(s.names(), ["train", "val", "test"]);
        assert_eq!(s.counts(1000).unwrap(), [980, 10, 10]);
        assert_eq!(
            spec("train=98%,val=2%").unwrap().counts(50).unwrap(),
            [49, 1]
        );
        let c = spec("val=3,test=2,train=rest").unwrap();
        assert_eq!(c.counts(10).unwrap(), [3, 2, 5]);
        assert_eq!(spec("a=0.5,b=rest").unwrap().counts(3).unwrap(), [2, 1]);
        // Equal remainders (0.4 each, one of them computed as 1 − 0.9): the earlier split.
        let tie = spec("a=0.8,b=rest,c=0.1").unwrap();
        assert_eq!(tie.counts(54).unwrap(), [43, 6, 5]);
        for bad in [
            "train=0.9,val=0.05",
            "train=1",
            "train=0.5,train=0.5",
            "train=0.5,val=10",
            "a=rest,b=rest",
            "a=0.6,b=0.6,c=rest",
            "tr/ain=0.5,val=0.5",
            ".reshard=0.5,val=0.5",
            "a=0,b=1",
            "a=x,b=0.5",
            "a=0.5;b=0.5",
        ] {
            assert!(spec(bad).is_err(), "{bad}");
        }
        // Known only with the sample count.
        assert!(spec("train=0.98,val=0.01,test=0.01")
            .unwrap()
            .counts(50)
            .is_err());
        assert!(spec("a=3,b=4").unwrap().counts(8).is_err());
        assert!(spec("a=3,b=rest").unwrap().counts(3).is_err());
    }

    #[test]
    fn ratios_round_to_counts_that_add_up() {
        let s = spec("a=0.333333333333,b=0.333333333333,c=0.333333333334").unwrap();
        for n in [3, 10, 11, 1001, 1 << 40] {
            assert_eq!(s.counts(n).unwrap().iter().sum::<u64>(), n);
        }
    }

    #[test]
    fn the_deal_gives_every_split_its_count_and_every_run_its_share() {
        for counts in [
            vec![7, 2, 1],
            vec![1, 1],
            vec![3, 5, 4, 1],
            vec![980, 10, 10],
        ] {
            let deal = SplitDeal::new(counts.clone());
            let n: u64 = counts.iter().sum();
            let of: Vec<usize> = (0..n).map(|j| deal.of_rank(j).0).collect();
            let mut seen = vec![Vec::new(); counts.len()];
            for j in 0..n {
                let (k, r) = deal.of_rank(j);
                seen[k].push(r);
            }
            for (k, ranks) in seen.iter().enumerate() {
                // Every split's ranks are 0.. its count, in order.
                assert_eq!(ranks, &(0..counts[k]).collect::<Vec<_>>(), "{counts:?}");
            }
            // Every run of ranks (a sample of them when there are many).
            let step = (n / 40).max(1) as usize;
            for a in (0..n).step_by(step) {
                for len in (0..=(n - a)).step_by(step) {
                    let direct: Vec<u64> = (0..counts.len())
                        .map(|k| {
                            of[a as usize..(a + len) as usize]
                                .iter()
                                .filter(|&&x| x == k)
                                .count() as u64
                        })
                        .collect();
                    assert_eq!(deal.counts_in(a, len), direct);
                    let bound = (counts.len() - 1).max(1) as f64;
                    assert!(deal.deviation(a, len) < bound, "{counts:?} {a} {len}");
                }
            }
        }
    }
}
