//! The walked units cut again, with all ranks (the cuts themselves are `tree::recut`'s): a
//! unit whose walk found more than a unit's worth of keys is split into key ranges (each rank
//! its own walks, the cuts shared), and a `--key-regex` root's directory units are regrouped by
//! key into key ranges of the root (the ranges agreed from the keys the walks propose, every
//! member sent to the rank that builds its range's listing). Nothing here depends on the rank
//! count but who does the work.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use serde::{de::DeserializeOwned, Serialize};

use crate::comm::{agree, Comm};
use crate::input::InputShard;
use crate::plan::assign_inputs;
use crate::tree::recut::{
    count_files, cut_at, pieces, proposals, range_of, ranges, refinements, split_keys, thinned,
};
use crate::tree::units::KEYS_PER_UNIT;
use crate::tree::view::{Listing, Member};
use crate::tree::walk::{gathered, Skips};
use crate::tree::{self, Root};

/// A walked unit: its input index, listing and skips.
pub(super) type WalkedUnit = (usize, Listing, Skips);

/// Cuts the units of `inputs` again from what this rank walked (`walked`, by input index):
/// `inputs` gets every rank's new units in place of the old (unsized), and the listings this
/// rank holds come back under their new input indices.
///
/// # Errors
/// A regrouped range's listing cannot be built (a label that does not fit), on any rank.
pub(super) fn run<C: Comm>(
    comm: &C,
    roots: &[Root],
    inputs: &mut Vec<InputShard>,
    walked: Vec<WalkedUnit>,
) -> Result<Vec<WalkedUnit>> {
    let root_of: Vec<Option<usize>> = inputs
        .iter()
        .map(|s| {
            let (root, _) = tree::parse(&s.path)?;
            roots.iter().position(|r| r.path == root)
        })
        .collect();
    let regrouped = |r: &Option<usize>| r.is_some_and(|r| roots[r].rules.key_regex.is_some());
    let (by_key, split): (Vec<WalkedUnit>, Vec<WalkedUnit>) = walked
        .into_iter()
        .partition(|(i, _, _)| regrouped(&root_of[*i]));
    // Where each rank's walks are split, for every rank to know every unit.
    let mine: Vec<(usize, Vec<Vec<u8>>)> = split
        .iter()
        .map(|(i, listing, _)| (*i, split_keys(listing)))
        .filter(|(_, starts)| !starts.is_empty())
        .collect();
    let starts: BTreeMap<usize, Vec<Vec<u8>>> = share_all(comm, &mine)?.into_iter().collect();
    // The regrouped roots that have units (a root with no file has none).
    let mut live = vec![false; roots.len()];
    for r in root_of.iter().filter(|r| regrouped(r)).flatten() {
        live[*r] = true;
    }
    let keyed: Vec<(usize, &[Member])> = by_key
        .iter()
        .filter_map(|(i, l, _)| Some((root_of[*i]?, &l.members[..])))
        .collect();
    let (bounds, _) = key_bounds(comm, &live, &keyed)?;
    // The new inputs: the old, a split unit's pieces in its place, a regrouped root's ranges in
    // place of its first unit (and its other units gone).
    let mut new = Vec::with_capacity(inputs.len());
    let mut first = Vec::with_capacity(inputs.len());
    let mut root_first: Vec<Option<usize>> = vec![None; roots.len()];
    for (i, input) in inputs.iter().enumerate() {
        let Some((root, unit)) = tree::parse(&input.path) else {
            first.push(new.len());
            new.push(input.clone());
            continue;
        };
        let units = match root_of[i] {
            Some(r) if regrouped(&root_of[i]) => {
                if let Some(at) = root_first[r] {
                    first.push(at);
                    continue;
                }
                root_first[r] = Some(new.len());
                ranges(&bounds[r])
            }
            _ => cut_at(&unit, starts.get(&i).map_or(&[][..], |s| &s[..])),
        };
        first.push(new.len());
        new.extend(units.iter().map(|u| InputShard {
            path: tree::unit_path(&root, u),
            size: 0,
        }));
    }
    *inputs = new;
    let mut out = Vec::new();
    for (i, listing, skips) in split {
        let cut = pieces(listing, starts.get(&i).map_or(&[][..], |s| &s[..]));
        for (k, piece) in cut.into_iter().enumerate() {
            let skips = if k == 0 { skips } else { Skips::default() };
            out.push((first[i] + k, piece, skips));
        }
    }
    let built = regroup(comm, roots, &root_first, &root_of, by_key, &bounds, &live);
    out.extend(agree(comm, built)?);
    out.sort_by_key(|(i, _, _)| *i);
    Ok(out)
}

/// Every rank's `mine`, concatenated in rank order, on every rank.
fn share_all<C: Comm, T: Serialize + DeserializeOwned>(comm: &C, mine: &[T]) -> Result<Vec<T>> {
    let config = bincode::config::standard();
    let send = bincode::serde::encode_to_vec(mine, config).context("a re-cut")?;
    let mut recv = Vec::new();
    let got = comm.all_to_all(&send, &vec![0..send.len(); comm.size()], &mut recv);
    let mut all = Vec::new();
    for range in got {
        let (part, _): (Vec<T>, _) =
            bincode::serde::decode_from_slice(&recv[range], config).context("a re-cut")?;
        all.extend(part);
    }
    Ok(all)
}

/// The sorted, distinct keys of `found` by root, less those at or below each root's least key
/// (`least`: so that no range is empty).
fn merged(found: Vec<(usize, Vec<u8>)>, into: &mut [Vec<Vec<u8>>], least: &[Option<Vec<u8>>]) {
    for (r, key) in found {
        if least[r].as_ref().is_some_and(|l| key > *l) {
            into[r].push(key);
        }
    }
    for b in into.iter_mut() {
        b.sort();
        b.dedup();
    }
}

/// Refinements of a `--key-regex` root's ranges at most: each cuts the ranges still heavy
/// (a sample's spread may leave one), with draws of its own.
const REFINE_ROUNDS: u32 = 4;

/// Each `--key-regex` root's key ranges, as the sorted keys that start every range but the
/// first: the keys the walked units of `keyed` (root, members in key order) propose, and where
/// a range gathers too many files, more of them (see [`refinements`], [`thinned`]); and how
/// many candidates the refinements gathered on every rank.
fn key_bounds<C: Comm>(
    comm: &C,
    live: &[bool],
    keyed: &[(usize, &[Member])],
) -> Result<(Vec<Vec<Vec<u8>>>, usize)> {
    let roots = live.len();
    let mut bounds = vec![Vec::new(); roots];
    let mine: Vec<(usize, Vec<u8>)> = keyed
        .iter()
        .flat_map(|(r, members)| proposals(members).into_iter().map(|k| (*r, k)))
        .collect();
    let all = share_all(comm, &mine)?;
    let mut least: Vec<Option<Vec<u8>>> = vec![None; roots];
    for (r, key) in &all {
        if least[*r].as_ref().is_none_or(|l| key < l) {
            least[*r] = Some(key.clone());
        }
    }
    merged(all, &mut bounds, &least);
    let mut gathered = 0;
    for round in 0..REFINE_ROUNDS {
        let counts = files_per_range(comm, &bounds, live, keyed);
        if !counts
            .iter()
            .flatten()
            .any(|c| *c > 2 * KEYS_PER_UNIT as u64)
        {
            break;
        }
        let drawn: Vec<(usize, Vec<u8>)> = keyed
            .iter()
            .flat_map(|(r, members)| {
                refinements(&bounds[*r], &counts[*r], members, round)
                    .into_iter()
                    .map(|k| (*r, k))
            })
            .collect();
        let drawn = share_all(comm, &drawn)?;
        gathered += drawn.len();
        let mut by_root = vec![Vec::new(); roots];
        for (r, key) in drawn {
            by_root[r].push(key);
        }
        let mut kept = Vec::new();
        for (r, mut keys) in by_root.into_iter().enumerate() {
            keys.sort();
            keys.dedup();
            kept.extend(thinned(&bounds[r], &keys).into_iter().map(|k| (r, k)));
        }
        merged(kept, &mut bounds, &least);
    }
    Ok((bounds, gathered))
}

/// Files per range of every root's `bounds`, over all ranks (no range for a root not `live`).
fn files_per_range<C: Comm>(
    comm: &C,
    bounds: &[Vec<Vec<u8>>],
    live: &[bool],
    keyed: &[(usize, &[Member])],
) -> Vec<Vec<u64>> {
    let mut counts: Vec<Vec<u64>> = bounds
        .iter()
        .zip(live)
        .map(|(b, &live)| vec![0; if live { b.len() + 1 } else { 0 }])
        .collect();
    for (r, members) in keyed {
        count_files(&bounds[*r], members, &mut counts[*r]);
    }
    let flat = comm.all_sum(&counts.concat());
    let mut rest = &flat[..];
    counts
        .iter()
        .map(|c| {
            let (this, after) = rest.split_at(c.len());
            rest = after;
            this.to_vec()
        })
        .collect()
}

/// Sends every member of the regrouped walks (`by_key`) to the rank that builds its range
/// (ranges to ranks in contiguous runs balanced by files), and builds this rank's ranges'
/// listings, under their input indices (a root's ranges start at `root_first`).
///
/// # Errors
/// A listing cannot be built (a label that does not fit), naming the file.
fn regroup<C: Comm>(
    comm: &C,
    roots: &[Root],
    root_first: &[Option<usize>],
    root_of: &[Option<usize>],
    by_key: Vec<WalkedUnit>,
    bounds: &[Vec<Vec<u8>>],
    live: &[bool],
) -> Result<Vec<WalkedUnit>> {
    let keyed: Vec<(usize, &[Member])> = by_key
        .iter()
        .filter_map(|(i, l, _)| Some((root_of[*i]?, &l.members[..])))
        .collect();
    let counts = files_per_range(comm, bounds, live, &keyed);
    drop(keyed);
    // Ranges numbered across roots, in input order.
    let offsets: Vec<usize> = counts
        .iter()
        .scan(0, |at, c| {
            let here = *at;
            *at += c.len();
            Some(here)
        })
        .collect();
    let builders = assign_inputs(&counts.concat(), comm.size());
    let builder = |range: usize| builders.iter().position(|b| b.contains(&range));
    let mut parts: Vec<Vec<(u64, Member)>> = (0..comm.size()).map(|_| Vec::new()).collect();
    for (i, listing, _) in by_key {
        let r = root_of[i].expect("a regrouped unit has a root");
        for m in listing.members {
            let range = offsets[r] + range_of(&bounds[r], m.key());
            parts[builder(range).unwrap_or(0)].push((range as u64, m));
        }
    }
    let mut got: BTreeMap<usize, Vec<Member>> = BTreeMap::new();
    for (range, m) in exchange(comm, parts, "members")? {
        got.entry(range as usize).or_default().push(m);
    }
    let mut out = Vec::new();
    for range in builders[comm.rank()].clone() {
        // The root whose ranges hold `range` (a root without ranges takes no numbers).
        let r = (0..roots.len())
            .rfind(|&r| live[r] && offsets[r] <= range)
            .expect("a range of a root");
        let root = &roots[r];
        let members = got.remove(&range).unwrap_or_default();
        let listing = gathered(&root.path, members, &root.rules)?;
        let first = root_first[r].expect("a regrouped root has units");
        out.push((first + range - offsets[r], listing, Skips::default()));
    }
    Ok(out)
}

/// Sends `parts[r]` to rank `r` (one all-to-all, each part bincode-encoded; an empty part
/// sends nothing) and returns what every rank sent this one, in rank order. `what` names the
/// items in an error.
///
/// # Errors
/// A part cannot be encoded or decoded.
pub(super) fn exchange<C: Comm, T: Serialize + DeserializeOwned>(
    comm: &C,
    parts: Vec<Vec<T>>,
    what: &'static str,
) -> Result<Vec<T>> {
    let config = bincode::config::standard();
    let mut send = Vec::new();
    let mut ranges = Vec::with_capacity(parts.len());
    for part in &parts {
        let start = send.len();
        if !part.is_empty() {
            send.extend(bincode::serde::encode_to_vec(part, config).context(what)?);
        }
        ranges.push(start..send.len());
    }
    drop(parts);
    let mut recv = Vec::new();
    let got = comm.all_to_all(&send, &ranges, &mut recv);
    drop(send);
    let mut out = Vec::new();
    for range in got.into_iter().filter(|r| !r.is_empty()) {
        let (part, _): (Vec<T>, _) =
            bincode::serde::decode_from_slice(&recv[range], config).context(what)?;
        out.extend(part);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::comm::local::LocalComm;
    use crate::tree::view::Bytes;
    use crate::tree::walk::Rules;
    use crate::tree::{unit_path, Unit};

    fn member(rel: String, name: String) -> Member {
        Member {
            size: rel.len() as u64,
            source: Bytes::File(rel.into_bytes()),
            name: name.into_bytes(),
            mode: 0o644,
            mtime: 0,
            mtime_ns: 0,
            identity: 0,
            ctime_ns: 0,
            volume: 0,
        }
    }

    fn root(path: &str, regex: bool) -> Root {
        Root {
            path: PathBuf::from(path),
            canonical: PathBuf::from(path),
            rules: Rules {
                key_regex: regex.then(|| "^[^/]*/([^/.]*)".to_string()),
                label: None,
            },
        }
    }

    /// A `--key-regex` root with no unit, a root whose one unit holds 9,000 keys, and a
    /// `--key-regex` root of three directories of the same 3,000 keys (one range of 9,000
    /// files, cut again), after an `--input` shard: the roots, inputs and walked listings.
    fn walked() -> (Vec<Root>, Vec<InputShard>, Vec<Listing>) {
        let roots = vec![
            root("/empty", true),
            root("/flat", false),
            root("/rx", true),
        ];
        let mut inputs = vec![InputShard {
            path: "a.tar".into(),
            size: 1,
        }];
        let mut listings = Vec::new();
        let big = Unit::of(b"big".to_vec(), false);
        inputs.push(InputShard {
            path: unit_path(&roots[1].path, &big),
            size: 0,
        });
        let names = (0..9000).map(|k| format!("big/s{k:05}.bin"));
        let members = names.map(|n| member(n.clone(), n)).collect();
        listings.push(Listing::new(roots[1].path.clone(), members));
        for dir in ["img", "seg", "txt"] {
            let unit = Unit::of(dir.as_bytes().to_vec(), false);
            inputs.push(InputShard {
                path: unit_path(&roots[2].path, &unit),
                size: 0,
            });
            let members = (0..3000)
                .map(|k| member(format!("{dir}/k{k:04}.{dir}"), format!("k{k:04}.{dir}")))
                .collect();
            listings.push(Listing::new(roots[2].path.clone(), members));
        }
        (roots, inputs, listings)
    }

    /// Every rank count cuts the units alike and gathers the same members in each.
    #[test]
    fn units_are_cut_again_alike_at_every_rank_count() {
        let mut seen = Vec::new();
        for ranks in 1..=4 {
            let results = LocalComm::run(ranks, |c| {
                let (roots, mut inputs, listings) = walked();
                let units: Vec<usize> = (1..inputs.len()).collect();
                let share = assign_inputs(&vec![1; units.len()], c.size())[c.rank()].clone();
                let mine = units[share]
                    .iter()
                    .map(|&i| (i, listings[i - 1].clone(), Skips::default()))
                    .collect();
                let held = run(c, &roots, &mut inputs, mine).unwrap();
                let paths: Vec<PathBuf> = inputs.into_iter().map(|s| s.path).collect();
                (paths, held)
            });
            let paths = results[0].0.clone();
            let mut units: BTreeMap<usize, Vec<Member>> = BTreeMap::new();
            for (p, held) in results {
                assert_eq!(p, paths, "np {ranks}: every rank knows every unit");
                for (i, listing, _) in held {
                    assert!(units.insert(i, listing.members).is_none(), "unit {i} twice");
                }
            }
            seen.push((paths, units));
        }
        let (paths, units) = &seen[0];
        assert!(
            seen.iter().all(|s| s == &seen[0]),
            "cut otherwise by rank count"
        );
        // The shard, big/ in three units of at most 4,096 keys, the key ranges of /rx.
        assert_eq!(paths[0], PathBuf::from("a.tar"));
        assert!(paths[3]
            .to_str()
            .unwrap()
            .ends_with("?files&from=big/s08192"));
        let rx = &paths[4..];
        assert!(rx.len() >= 3, "{rx:?}");
        assert!(rx[0].to_str().unwrap().starts_with("tree:///rx//?deep&to="));
        let mut files = 0;
        for i in 4..paths.len() {
            let members = &units[&i];
            files += members.len();
            assert!(members.len() <= 2 * KEYS_PER_UNIT, "{}", members.len());
            // A key's three files are in one range, adjacent.
            for trio in members.chunks(3) {
                assert!(trio.iter().all(|m| m.key() == trio[0].key()));
            }
        }
        assert_eq!(files, 9000);
        assert_eq!(units.len(), paths.len() - 1);
    }

    /// `count` keys of a hash-like spread (a stable mix of `seed` and the index), sorted.
    fn spread(seed: u64, count: u64) -> Vec<String> {
        let mut keys: Vec<String> = (0..count)
            .map(|k| {
                let mut x = (seed << 20 | k).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                x ^= x >> 29;
                format!("{:016x}", x.wrapping_mul(0xbf58_476d_1ce4_e5b9))
            })
            .collect();
        keys.sort();
        keys
    }

    /// A `--key-regex` root of 400 directories of 250 files, each a key of its own, hashed (the
    /// directories' keys interleave, none shares one): each directory's first key is at the
    /// start of the key space, so the first cut leaves one range of nearly all files. The
    /// refinement gathers about 8 candidates per 4,096 files of it, whatever the number of
    /// directories, and cuts it into ranges of about 4,096 files, alike at every rank count.
    #[test]
    fn many_interleaved_units_are_refined_into_few_ranges() {
        const DIRS: u64 = 400;
        const FILES: u64 = 250;
        let listings: Vec<Listing> = (0..DIRS)
            .map(|d| {
                let members = spread(d, FILES)
                    .into_iter()
                    .map(|k| member(format!("d{d:03}/{k}.bin"), format!("{k}.bin")))
                    .collect();
                Listing::new(PathBuf::from("/rx"), members)
            })
            .collect();
        let roots = vec![root("/rx", true)];
        let inputs: Vec<InputShard> = (0..DIRS)
            .map(|d| InputShard {
                path: unit_path(
                    &roots[0].path,
                    &Unit::of(format!("d{d:03}").into_bytes(), false),
                ),
                size: 0,
            })
            .collect();
        let files = DIRS * FILES;
        let target = files / KEYS_PER_UNIT as u64;
        let mut seen = Vec::new();
        for ranks in 1..=4 {
            let results = LocalComm::run(ranks, |c| {
                let share = assign_inputs(&vec![1; inputs.len()], c.size())[c.rank()].clone();
                let mine: Vec<(usize, &[Member])> = share
                    .clone()
                    .map(|i| (0, &listings[i].members[..]))
                    .collect();
                let (bounds, gathered) = key_bounds(c, &[true], &mine).unwrap();
                let walked = share
                    .map(|i| (i, listings[i].clone(), Skips::default()))
                    .collect();
                let mut inputs = inputs.clone();
                let held = run(c, &roots, &mut inputs, walked).unwrap();
                let sizes: Vec<(usize, usize)> =
                    held.iter().map(|(i, l, _)| (*i, l.members.len())).collect();
                (bounds, gathered, inputs.len(), sizes)
            });
            let (bounds, gathered, units, _) = &results[0];
            assert!(results.iter().all(|r| &r.0 == bounds && r.2 == *units));
            let mut sizes: Vec<(usize, usize)> = results.iter().flat_map(|r| r.3.clone()).collect();
            sizes.sort();
            assert_eq!(sizes.len(), *units);
            assert_eq!(sizes.iter().map(|s| s.1 as u64).sum::<u64>(), files);
            assert!(*gathered as u64 <= 16 * target, "{gathered} gathered");
            // The first cut's ranges (one per directory at most) and about `target` more.
            assert!(*units as u64 <= DIRS + 2 * target, "{units} ranges");
            let big = sizes.iter().filter(|s| s.1 > 1000).count() as u64;
            assert!(big >= target / 2, "{big} ranges of more than 1,000 files");
            assert!(sizes.iter().all(|s| s.1 <= 2 * KEYS_PER_UNIT), "{sizes:?}");
            seen.push((bounds.clone(), sizes));
        }
        assert!(
            seen.iter().all(|s| s == &seen[0]),
            "cut otherwise by rank count"
        );
    }
}
