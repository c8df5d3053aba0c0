//! What the owner of a set of digests finds: [`compare`] counts each digest's copies on both
//! sides into a [`Tally`] (mismatches, examples, the equalized samples) and the [`Sums`] for the
//! shuffle's correlation; [`distinct_inputs_per_output`] measures how much each output shard mixes.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::records::{Record, Side};
use super::report::{plural, Mismatches};
use super::setup::Setup;
use crate::comm::wire::{decode_concat, encode_values as encode};
use crate::comm::wire::{route, Sink};
use crate::comm::{gather, Comm};
use crate::plan::permute::Permutation;
use crate::plan::Equalize;
use crate::report::mixing::Mixing;
use crate::tar::key_at;

/// How many example samples each kind of mismatch lists.
pub(super) const EXAMPLES: usize = 5;

/// A kind of mismatch, for examples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) enum Kind {
    Missing,
    NotInInput,
    Duplicated,
    /// Not where the seeded order puts it (the example's first count: that position).
    Misplaced,
}

/// Exact sums over (input position, output position) pairs, for the correlation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Sums {
    pub(super) n: u128,
    x: u128,
    y: u128,
    xx: u128,
    yy: u128,
    xy: u128,
}

impl Sums {
    fn add(&mut self, x: u64, y: u64) {
        let (x, y) = (u128::from(x), u128::from(y));
        self.n += 1;
        self.x += x;
        self.y += y;
        self.xx += x * x;
        self.yy += y * y;
        self.xy += x * y;
    }

    pub(super) fn merge(self, o: Sums) -> Sums {
        Sums {
            n: self.n + o.n,
            x: self.x + o.x,
            y: self.y + o.y,
            xx: self.xx + o.xx,
            yy: self.yy + o.yy,
            xy: self.xy + o.xy,
        }
    }

    pub(super) fn encode(&self) -> Vec<u8> {
        [self.n, self.x, self.y, self.xx, self.yy, self.xy]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect()
    }

    pub(super) fn decode(b: &[u8]) -> Sums {
        let v = |i: usize| u128::from_le_bytes(b[16 * i..16 * i + 16].try_into().unwrap());
        Sums {
            n: v(0),
            x: v(1),
            y: v(2),
            xx: v(3),
            yy: v(4),
            xy: v(5),
        }
    }

    /// Pearson's correlation of the pairs; with positions as ranks, Spearman's ρ.
    pub(super) fn correlation(&self) -> Option<f64> {
        if self.n < 2 {
            return None;
        }
        let n = self.n as f64;
        let (mx, my) = (self.x as f64 / n, self.y as f64 / n);
        let vx = self.xx as f64 / n - mx * mx;
        let vy = self.yy as f64 / n - my * my;
        let cov = self.xy as f64 / n - mx * my;
        (vx > 0.0 && vy > 0.0).then(|| (cov / (vx * vy).sqrt()).clamp(-1.0, 1.0))
    }
}

/// What the owner of a set of digests found.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) mismatches: Mismatches,
    pub(super) sums: Sums,
    /// (output shard, input shard) of every pair, deduplicated.
    pub(super) shard_pairs: Vec<(u32, u32)>,
    /// A few mismatches of each kind: the record to name and the digest's (input, output) counts.
    pub(super) examples: Vec<(Kind, Record, u64, u64)>,
    /// The input samples left out (drop) or the output's second copies (pad), up to the shard
    /// count (a valid run has fewer).
    pub(super) equalized: Vec<Record>,
    /// Matched samples per (output shard, input shard), binned: for `--plot`.
    pub(super) mixing: Option<Mixing>,
}

impl Tally {
    /// Counts the output copies in `outs` not at the positions `perm` gives the input copies
    /// `ins` (as many of each; identical samples may trade places).
    fn check_order(&mut self, perm: &Permutation, ins: &[Record], outs: &[Record]) {
        let mut want: Vec<u64> = ins.iter().map(|r| perm.apply(r.index)).collect();
        want.sort_unstable();
        // Outputs are sorted by digest, side, then position already.
        for (&w, o) in want.iter().zip(outs) {
            if o.index != w {
                self.mismatches.misplaced += 1;
                self.example(Kind::Misplaced, *o, w, 0);
            }
        }
    }

    fn example(&mut self, kind: Kind, r: Record, ins: u64, outs: u64) {
        if self.examples.iter().filter(|e| e.0 == kind).count() < EXAMPLES {
            self.examples.push((kind, r, ins, outs));
        }
    }

    /// The examples, as sentences naming the key, the file and the byte offset.
    pub(super) fn describe_examples(&self, setup: &Setup) -> Vec<(Kind, String)> {
        self.examples
            .iter()
            .map(|&(kind, r, ins, outs)| {
                let (path, key) = locate(setup, &r);
                let what = match kind {
                    Kind::Missing => format!(
                        "sample {key} from {} byte offset {} is missing from the output",
                        path.display(),
                        r.offset
                    ),
                    Kind::NotInInput => format!(
                        "sample {key} in {} at byte offset {} matches no input sample (corrupted, or not from this input)",
                        path.display(),
                        r.offset
                    ),
                    Kind::Misplaced => format!(
                        "sample {key} in {} at byte offset {} is at output position {}, but the seeded order puts it at output position {ins}",
                        path.display(),
                        r.offset,
                        r.index
                    ),
                    Kind::Duplicated => format!(
                        "sample {key} is in the output {outs} times but in the input {ins} time{}, e.g. {} byte offset {}",
                        plural(ins),
                        path.display(),
                        r.offset
                    ),
                };
                (kind, what)
            })
            .collect()
    }

    /// The keys of the equalized samples.
    pub(super) fn equalized_keys(&self, setup: &Setup) -> Vec<String> {
        self.equalized
            .iter()
            .map(|r| {
                let path = sample_path(setup, r);
                key_of_sample(path, r.offset).unwrap_or_else(|e| format!("({e:#})"))
            })
            .collect()
    }
}

/// The key of the sample at `offset` of a shard (of its decompressed stream when compressed).
fn key_of_sample(path: &Path, offset: u64) -> Result<String> {
    key_at(path, offset, u64::MAX)
}

fn sample_path<'a>(setup: &'a Setup, r: &Record) -> &'a Path {
    match r.side {
        Side::Input => &setup.inputs[r.shard as usize].path,
        Side::Output => &setup.outputs[r.shard as usize].path,
    }
}

/// The file a record comes from and its key, quoted (or why it cannot be read).
fn locate<'a>(setup: &'a Setup, r: &Record) -> (&'a Path, String) {
    let path = sample_path(setup, r);
    let key = match key_of_sample(path, r.offset) {
        Ok(k) => format!("{k:?}"),
        Err(e) => format!("(key unreadable: {e:#})"),
    };
    (path, key)
}

/// Compares the copies of each digest this rank owns; counts matched pairs into `mixing`.
/// With `order` (the seeded shuffle the run made), the output copies of a digest must be at
/// the positions it gives its input copies.
pub(super) fn compare(
    mut records: Vec<Record>,
    equalize: Equalize,
    shards: usize,
    mut mixing: Mixing,
    order: Option<&Permutation>,
) -> Tally {
    records.sort_unstable();
    let mut t = Tally::default();
    for group in records.chunk_by(|a, b| a.digest == b.digest) {
        let split = group.partition_point(|r| r.side == Side::Input);
        let (ins, outs) = group.split_at(split);
        if let Some(perm) = order.filter(|_| ins.len() == outs.len()) {
            t.check_order(perm, ins, outs);
        }
        for (i, o) in ins.iter().zip(outs) {
            t.sums.add(i.index, o.index);
            t.shard_pairs.push((o.shard, i.shard));
            mixing.add(u64::from(o.shard), u64::from(i.shard));
        }
        let (i, o) = (ins.len() as u64, outs.len() as u64);
        let (i_n, o_n) = (ins.len(), outs.len());
        if i == 0 {
            t.mismatches.not_in_input += o;
            t.example(Kind::NotInInput, outs[0], i, o);
            continue;
        }
        match equalize {
            Equalize::None | Equalize::Pad if o < i => {
                t.mismatches.missing += i - o;
                t.example(Kind::Missing, ins[o_n], i, o);
            }
            Equalize::Drop if o < i => {
                t.mismatches.left_out += i - o;
                let room = shards.saturating_sub(t.equalized.len());
                t.equalized.extend(ins[o_n..].iter().take(room));
            }
            Equalize::Pad if o > i => {
                let extra = (o - i).min(i);
                t.mismatches.repeated += extra;
                let room = shards.saturating_sub(t.equalized.len());
                t.equalized
                    .extend(outs[i_n..i_n + extra as usize].iter().take(room));
                if o > 2 * i {
                    t.mismatches.duplicated += o - 2 * i;
                    t.example(Kind::Duplicated, outs[2 * i_n], i, o);
                }
            }
            _ if o > i => {
                t.mismatches.duplicated += o - i;
                t.example(Kind::Duplicated, outs[i_n], i, o);
            }
            _ => {}
        }
    }
    t.shard_pairs.sort_unstable();
    t.shard_pairs.dedup();
    t.mixing = Some(mixing);
    t
}

/// For every output shard (on rank 0, in shard order): how many distinct input shards its
/// samples come from. Pairs go to the rank `shard mod P`, which counts them.
pub(super) fn distinct_inputs_per_output(
    comm: &impl Comm,
    pairs: &[(u32, u32)],
    shards: usize,
) -> Vec<u64> {
    let ranks = comm.size();
    let owner = |s: u32| s as usize % ranks;
    let recv = route(comm, &|sink: Sink<'_, (u32, u32)>| {
        for pair in pairs {
            sink(owner(pair.0), pair);
        }
    });
    let mut got = recv.to_vec();
    got.sort_unstable();
    got.dedup();
    let mut mine: BTreeMap<u32, u64> = BTreeMap::new();
    for (s, _) in got {
        *mine.entry(s).or_default() += 1;
    }
    let mine: Vec<(u32, u64)> = mine.into_iter().collect();
    let parts = gather(comm, 0, &encode(&mine));
    if comm.rank() != 0 {
        return Vec::new();
    }
    let mut per_shard = vec![0u64; shards];
    for (s, n) in decode_concat::<(u32, u64)>(&parts).expect("values encoded by a peer") {
        per_shard[s as usize] = n;
    }
    per_shard
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(digest: u128, side: Side, index: u64, shard: u32) -> Record {
        Record {
            digest,
            side,
            index,
            shard,
            offset: index * 512,
        }
    }

    #[test]
    fn compare_counts_each_kind_of_mismatch() {
        use Side::{Input as I, Output as O};
        let records = vec![
            rec(1, I, 0, 0),
            rec(1, O, 5, 2), // matched
            rec(2, I, 1, 0), // missing
            rec(3, O, 6, 2), // not in the input
            rec(4, I, 2, 1),
            rec(4, O, 7, 3),
            rec(4, O, 8, 3), // one extra copy
        ];
        let t = compare(records.clone(), Equalize::None, 4, Mixing::new(4, 2), None);
        assert_eq!(
            t.mismatches,
            Mismatches {
                missing: 1,
                not_in_input: 1,
                duplicated: 1,
                ..Mismatches::default()
            }
        );
        assert_eq!(t.sums.n, 2);
        assert_eq!(t.shard_pairs, [(2, 0), (3, 1)]);
        let kinds: Vec<Kind> = t.examples.iter().map(|e| e.0).collect();
        assert_eq!(kinds, [Kind::Missing, Kind::NotInInput, Kind::Duplicated]);
        // The example of a duplicate is the later copy.
        assert_eq!(t.examples[2].1.index, 8);

        let t = compare(records.clone(), Equalize::Drop, 4, Mixing::new(4, 2), None);
        assert_eq!((t.mismatches.missing, t.mismatches.left_out), (0, 1));
        assert_eq!(t.equalized.len(), 1);
        let t = compare(records, Equalize::Pad, 4, Mixing::new(4, 2), None);
        assert_eq!(
            (
                t.mismatches.repeated,
                t.mismatches.duplicated,
                t.mismatches.missing
            ),
            (1, 0, 1)
        );
        assert_eq!(t.equalized[0].index, 8);
    }

    #[test]
    fn correlation_of_orders() {
        let mut same = Sums::default();
        let mut reversed = Sums::default();
        for i in 0..100 {
            same.add(i, i);
            reversed.add(i, 99 - i);
        }
        assert!((same.correlation().unwrap() - 1.0).abs() < 1e-12);
        assert!((reversed.correlation().unwrap() + 1.0).abs() < 1e-12);
        // Spearman's formula on a small permutation: d = (1, -1, 0, 1, -1), Σd² = 4, n = 5.
        let mut s = Sums::default();
        for (x, y) in [(0, 1), (1, 0), (2, 2), (3, 4), (4, 3)] {
            s.add(x, y);
        }
        let expected = 1.0 - 6.0 * 4.0 / (5.0 * 24.0);
        assert!((s.correlation().unwrap() - expected).abs() < 1e-12);
        let halves = Sums::decode(&same.encode());
        assert_eq!(halves, same);
        assert_eq!(Sums::default().correlation(), None);
    }
}
