//! Units cut again once walked (the pure half; the walk phase, `job/walk/`, runs the
//! collectives). Rank 0 cuts a root from the few directories at its top ([`super::units`]);
//! what lies below is known only to the rank that walked it. So after the walk:
//!
//! - a walked unit of more than [`KEYS_PER_UNIT`] keys (a flat directory at any depth, a flat
//!   prefix of an object store, listed once) becomes [`pieces`] of that many keys each, key
//!   ranges of its listing, so that several ranks read it;
//! - with `--key-regex`, where one sample's files may lie in any directories, the directory
//!   units' members are regrouped by key: the key space is cut into ranges at keys the walked
//!   listings propose ([`proposals`], [`refinements`]), every member goes to the rank that
//!   builds its range's listing, and each range is one unit of the root (`?deep&from=&to=`).
//!
//! Every cut is a function of the walked listings and of sums over all of them, never of the
//! rank count; and the units of a cut, in order, hold the members in the order one unit of
//! the same files would, so the output is the same bytes however the files were cut.

use crate::tree::units::KEYS_PER_UNIT;
use crate::tree::view::{Listing, Member};
use crate::tree::Unit;

/// The distinct keys of `members` (in key order), each with its count of members.
fn keys(members: &[Member]) -> Vec<(&[u8], usize)> {
    let mut out: Vec<(&[u8], usize)> = Vec::new();
    for m in members {
        match out.last_mut() {
            Some((k, n)) if *k == m.key() => *n += 1,
            _ => out.push((m.key(), 1)),
        }
    }
    out
}

/// The key ranges `listing` (of `unit`, in key order) is cut at: every [`KEYS_PER_UNIT`]th
/// key after the first; none when it holds no more keys than that.
pub(crate) fn split_keys(listing: &Listing) -> Vec<Vec<u8>> {
    keys(&listing.members)
        .iter()
        .step_by(KEYS_PER_UNIT)
        .skip(1)
        .map(|(k, _)| k.to_vec())
        .collect()
}

/// The units `unit` becomes when cut at `starts` (sorted keys inside its range): one per
/// range, the first from the unit's own start, the last to its own end.
pub(crate) fn cut_at(unit: &Unit, starts: &[Vec<u8>]) -> Vec<Unit> {
    let mut from = unit.keys.0.clone();
    let mut out = Vec::with_capacity(starts.len() + 1);
    for start in starts {
        let mut piece = unit.clone();
        piece.keys = (from, Some(start.clone()));
        out.push(piece);
        from = Some(start.clone());
    }
    let mut last = unit.clone();
    last.keys = (from, unit.keys.1.clone());
    out.push(last);
    out
}

/// `listing` cut at `starts` (see [`cut_at`]): each piece's members, in order.
pub(crate) fn pieces(listing: Listing, starts: &[Vec<u8>]) -> Vec<Listing> {
    let root = listing.root.clone();
    let mut out = Vec::with_capacity(starts.len() + 1);
    let mut rest = listing.members;
    for start in starts.iter().rev() {
        let at = rest.partition_point(|m| m.key() < start.as_slice());
        let tail = rest.split_off(at);
        out.push(Listing::new(root.clone(), tail));
    }
    out.push(Listing::new(root, rest));
    out.reverse();
    out
}

/// A `--key-regex` root's first cut: a walked directory unit proposes its first key and every
/// [`KEYS_PER_UNIT`]th after it. A range between two proposals then holds fewer than that many
/// keys of each unit; [`refinements`] cut a range that gathers too many units' keys.
pub(crate) fn proposals(members: &[Member]) -> Vec<Vec<u8>> {
    keys(members)
        .iter()
        .step_by(KEYS_PER_UNIT)
        .map(|(k, _)| k.to_vec())
        .collect()
}

/// The range (index into the ranges `bounds` cut: before the first bound is range 0) that
/// holds `key`. `bounds`: sorted, distinct.
pub(crate) fn range_of(bounds: &[Vec<u8>], key: &[u8]) -> usize {
    bounds.partition_point(|b| b.as_slice() <= key)
}

/// Files per range of `bounds` among `members` (in key order), added to `counts`.
pub(crate) fn count_files(bounds: &[Vec<u8>], members: &[Member], counts: &mut [u64]) {
    for m in members {
        counts[range_of(bounds, m.key())] += 1;
    }
}

/// Candidates a refinement draws per [`KEYS_PER_UNIT`] files of a heavy range; [`thinned`]
/// keeps every `SAMPLE`th, so that a range between two kept ones holds about that many files.
pub(crate) const SAMPLE: usize = 8;

/// A stable draw in `0..2^32` for `member` in refinement `round` (its name and file hashed).
fn draw(member: &Member, round: u32) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&round.to_le_bytes());
    h.update(&member.name);
    if let crate::tree::view::Bytes::File(path) = &member.source {
        h.update(path);
    }
    // CRC is linear: mixed (murmur3's finalizer) so that its low bits are as good as any.
    let mut x = h.finalize();
    x ^= x >> 16;
    x = x.wrapping_mul(0x85eb_ca6b);
    x ^= x >> 13;
    x = x.wrapping_mul(0xc2b2_ae35);
    x ^ (x >> 16)
}

/// Candidate keys to cut at inside the ranges of `bounds` that hold more than twice
/// [`KEYS_PER_UNIT`] files over all units (`counts`, summed over every rank): a key of
/// `members` with `m` files here is one with chance `m * SAMPLE / KEYS_PER_UNIT`, drawn from
/// its first member and `round`. A heavy range of `F` files thus gets about
/// `SAMPLE * F / KEYS_PER_UNIT` candidates over all units, however many units share it (a
/// unit's own share of a range is no measure of where to cut it: hashed names put every
/// directory's keys everywhere), spread as its files are.
pub(crate) fn refinements(
    bounds: &[Vec<u8>],
    counts: &[u64],
    members: &[Member],
    round: u32,
) -> Vec<Vec<u8>> {
    let heavy = |r: usize| counts[r] > 2 * KEYS_PER_UNIT as u64;
    let mut out = Vec::new();
    for key in members.chunk_by(|a, b| a.key() == b.key()) {
        let k = key[0].key();
        let chance = (key.len() * SAMPLE) as u64;
        let drawn = u64::from(draw(&key[0], round)) % KEYS_PER_UNIT as u64;
        if drawn < chance && heavy(range_of(bounds, k)) {
            out.push(k.to_vec());
        }
    }
    out
}

/// Every [`SAMPLE`]th of the candidates `drawn` (sorted, distinct, all units') in each range of
/// `bounds`: the keys that cut a heavy range into ranges of about [`KEYS_PER_UNIT`] files.
pub(crate) fn thinned(bounds: &[Vec<u8>], drawn: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = (usize::MAX, 0);
    for k in drawn {
        let r = range_of(bounds, k);
        at = if at.0 == r { (r, at.1 + 1) } else { (r, 1) };
        if at.1 % SAMPLE == 0 {
            out.push(k.clone());
        }
    }
    out
}

/// The units of a `--key-regex` root cut at `bounds`: the root's whole tree, one key range each.
pub(crate) fn ranges(bounds: &[Vec<u8>]) -> Vec<Unit> {
    cut_at(&Unit::of(Vec::new(), true), bounds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::view::Bytes;
    use std::path::PathBuf;

    fn member(name: &str) -> Member {
        Member {
            name: name.as_bytes().to_vec(),
            source: Bytes::File(name.as_bytes().to_vec()),
            size: name.len() as u64,
            mode: 0o644,
            mtime: 0,
            mtime_ns: 0,
            identity: 0,
            ctime_ns: 0,
            volume: 0,
        }
    }

    fn listing(n: usize) -> Listing {
        let mut members = Vec::new();
        for i in 0..n {
            members.push(member(&format!("d/k{i:06}.jpg")));
            if i % 3 == 0 {
                members.push(member(&format!("d/k{i:06}.txt")));
            }
        }
        Listing::new(PathBuf::from("/r"), members)
    }

    /// Pieces hold whole samples, at most KEYS_PER_UNIT keys each, and together the listing.
    #[test]
    fn a_large_listing_is_cut_into_whole_samples_in_order() {
        let whole = listing(2 * KEYS_PER_UNIT + 5);
        let starts = split_keys(&whole);
        assert_eq!(starts.len(), 2);
        let unit = Unit::of(b"d".to_vec(), true);
        let units = cut_at(&unit, &starts);
        let parts = pieces(whole.clone(), &starts);
        assert_eq!(units.len(), 3);
        assert_eq!(units[0].keys.0, None);
        assert_eq!(units[2].keys.1, None);
        let mut joined = Vec::new();
        for (u, p) in units.iter().zip(&parts) {
            assert!(keys(&p.members).len() <= KEYS_PER_UNIT);
            assert!(p.members.iter().all(|m| u.holds(m.key())));
            joined.extend(p.members.clone());
        }
        assert_eq!(joined, whole.members);
        assert!(split_keys(&listing(KEYS_PER_UNIT)).is_empty());
    }

    /// Units whose keys interleave (each key in every unit): the first cut makes one range;
    /// the refinement cuts it into ranges of about KEYS_PER_UNIT files.
    #[test]
    fn interleaved_units_are_cut_into_ranges_of_bounded_size() {
        // Every unit holds the keys k0000..k0499, one member each.
        let units: Vec<Vec<Member>> = (0..40)
            .map(|u| (0..500).map(|k| member(&format!("k{k:04}.x{u}"))).collect())
            .collect();
        let mut bounds: Vec<Vec<u8>> = units.iter().flat_map(|m| proposals(m)).collect();
        bounds.sort();
        bounds.dedup();
        let bounds: Vec<Vec<u8>> = bounds.into_iter().skip(1).collect();
        assert!(bounds.is_empty());
        let mut counts = vec![0; bounds.len() + 1];
        for m in &units {
            count_files(&bounds, m, &mut counts);
        }
        assert_eq!(counts, [20_000]);
        let mut more: Vec<Vec<u8>> = units
            .iter()
            .flat_map(|m| refinements(&bounds, &counts, m, 0))
            .collect();
        more.sort();
        more.dedup();
        // About SAMPLE candidates per KEYS_PER_UNIT files, not 40 units' worth.
        assert!(
            more.len() <= 3 * SAMPLE * 20_000 / KEYS_PER_UNIT,
            "{}",
            more.len()
        );
        let mut more = thinned(&bounds, &more);
        more.extend(bounds);
        more.sort();
        more.dedup();
        let mut counts = vec![0; more.len() + 1];
        for m in &units {
            count_files(&more, m, &mut counts);
        }
        assert_eq!(counts.iter().sum::<u64>(), 20_000);
        assert!(counts.len() >= 4, "{counts:?}");
        assert!(
            counts.iter().all(|&c| c <= 2 * KEYS_PER_UNIT as u64),
            "{counts:?}"
        );
    }
}
