//! Phase "walk" (only with `--input-files`): the ranks walk the units of the roots (each rank a
//! contiguous share of them, by count; a large directory's files examined by every rank,
//! [`deal`]), cut them again where a walk found more than a unit's
//! worth or a `--key-regex` root's files must be regrouped by key ([`recut`]), learn every
//! unit's size from one sum, and hand each listing to the rank that will read that unit (the
//! index phase's byte-balanced assignment), so that no file is listed or examined twice and no
//! rank holds more than its share of the list.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};

use crate::comm::Comm;
use crate::input::InputShard;
use crate::plan::assign_inputs;
use crate::report::narrate;
use crate::report::narrate::count;
use crate::size::human_bytes;
use crate::tree::view::{Bytes, Listing};
use crate::tree::walk::Skips;
use crate::tree::{self, Root};

mod deal;
mod recut;
mod stream;

use recut::WalkedUnit;

/// Every unit's input index and listing digest ([`crate::tree::view::Listing::digest`]).
pub(crate) type UnitDigests = Vec<(usize, u128)>;

/// What the walk found, over all ranks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Walked {
    pub files: u64,
    pub file_bytes: u64,
    pub units: u64,
    pub skips: Skips,
    /// The directory units as rank 0 cut the roots, before any key range.
    pub dir_units: u64,
    /// This rank's own metadata calls (not summed).
    pub(crate) calls: crate::job::handoff::WalkCalls,
}

/// Walks the units among `inputs`, cuts them again where a walk found more than a unit's worth
/// (see [`crate::tree::recut`]: `inputs` then holds the new units in place of the old, sized),
/// and moves each listing to its reader; what was found, and every unit's (input index, listing
/// digest), the same on every rank. `staging`: where rank 0 writes the `--label-from-dir` class
/// list (none when only planning).
///
/// # Errors
/// A walk that failed on any rank (agreed: every rank returns it).
pub fn run<C: Comm>(
    comm: &C,
    roots: &[Root],
    inputs: &mut Vec<InputShard>,
    staging: Option<&std::path::Path>,
) -> Result<Option<(Walked, UnitDigests)>> {
    let units: Vec<usize> = unit_indices(inputs);
    if units.is_empty() {
        return Ok(None);
    }
    tree::register(roots);
    let (ranks, lead) = (comm.size(), comm.rank() == 0);
    let (walked, calls) = deal::walk(comm, roots, inputs, &units)?;
    let dir_units = directory_units(inputs);
    let mut totals = [0u64; 6];
    for (_, listing, skips) in &walked {
        let files = listing
            .members
            .iter()
            .filter(|m| matches!(m.source, Bytes::File(_)));
        totals[0] += files.clone().count() as u64;
        totals[1] += files.map(|m| m.size).sum::<u64>();
        for (t, s) in totals[2..].iter_mut().zip(skips.to_array()) {
            *t += s;
        }
    }
    let totals = comm.all_sum(&totals);
    let walked = recut::run(comm, roots, inputs, walked)?;
    let units = unit_indices(inputs);
    let mut sizes = vec![0; units.len()];
    // Each unit's digest in two halves: one rank's slot, the others' 0, so the sums are it.
    let mut halves = vec![0u64; 2 * units.len()];
    for (i, listing, _) in &walked {
        let j = units.binary_search(i).expect("a walked unit is an input");
        sizes[j] = listing.size();
        let d = listing.digest();
        (halves[2 * j], halves[2 * j + 1]) = ((d >> 64) as u64, d as u64);
    }
    for (j, size) in comm.all_sum(&sizes).into_iter().enumerate() {
        inputs[units[j]].size = size;
    }
    let halves = comm.all_sum(&halves);
    let digests = units
        .iter()
        .zip(halves.chunks(2))
        .map(|(&i, h)| (i, (u128::from(h[0]) << 64) | u128::from(h[1])))
        .collect();
    let owners = assign_inputs(&inputs.iter().map(|s| s.size).collect::<Vec<_>>(), ranks);
    hand_over(comm, inputs, &owners, walked)?;
    let found = Walked {
        files: totals[0],
        file_bytes: totals[1],
        units: units.len() as u64,
        skips: Skips::from_array(totals[2..].try_into().expect("four counts")),
        dir_units,
        calls,
    };
    narrate(lead, format_args!("{}", describe(&found, roots.len())));
    if let (true, Some(staging), Some(list)) = (lead, staging, tree::class_list(roots)) {
        let path = staging.join("classes.txt");
        crate::storage::sink(&path)
            .write(&path, &list)
            .with_context(|| format!("{}: cannot write the class list", path.display()))?;
    }
    Ok(Some((found, digests)))
}

/// The directory units of `inputs` as rank 0 cut the roots (a deep unit, or a directory's own
/// files, however many key ranges it was cut into): the units of the tree before any key
/// range, which neither the cut of a large directory's keys, the walk's cut, a `--key-regex`
/// root's regrouping nor the rank count changes.
fn directory_units(inputs: &[InputShard]) -> u64 {
    let first = |s: &InputShard| tree::parse(&s.path).is_some_and(|(_, u)| u.keys.0.is_none());
    inputs.iter().filter(|s| first(s)).count() as u64
}

/// The indices of the units of loose files among `inputs`, in order.
fn unit_indices(inputs: &[InputShard]) -> Vec<usize> {
    (0..inputs.len())
        .filter(|&i| tree::parse(&inputs[i].path).is_some())
        .collect()
}

/// The walk's line for rank 0's narration.
fn describe(w: &Walked, roots: usize) -> String {
    let s = w.skips;
    // The units read (a directory's key ranges each one), and the directory units they came
    // from: what `input_bytes` counts a tar per (see docs/loose-files.md).
    let mut line = format!(
        "walked {} ({}) in {} of {} ({} of rank 0's cut)",
        count(w.files, "file"),
        human_bytes(w.file_bytes),
        count(w.units, "unit"),
        count(roots as u64, "root"),
        count(w.dir_units, "directory unit")
    );
    let skipped: Vec<String> = [
        (s.hidden, "hidden or editor's leftover"),
        (s.links, "link to a directory or dangling"),
        (s.special, "FIFO, socket or device"),
        (s.keyless, "without a key"),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect();
    if !skipped.is_empty() {
        line += &format!("; skipped: {}", skipped.join(", "));
    }
    line
}

/// Sends each walked listing to the rank that reads its unit, keeps those this rank reads.
fn hand_over<C: Comm>(
    comm: &C,
    inputs: &[InputShard],
    owners: &[std::ops::Range<usize>],
    walked: Vec<WalkedUnit>,
) -> Result<()> {
    let ranks = comm.size();
    let mut parts: Vec<Vec<(u64, Listing)>> = (0..ranks).map(|_| Vec::new()).collect();
    for (i, listing, _) in walked {
        let owner = owners.iter().position(|r| r.contains(&i)).unwrap_or(0);
        if owner == comm.rank() {
            tree::keep_listing(inputs[i].path.clone(), Arc::new(listing));
        } else {
            parts[owner].push((i as u64, listing));
        }
    }
    for (i, mut listing) in recut::exchange(comm, parts, "listings")? {
        listing.lay_out();
        let path: PathBuf = inputs[i as usize].path.clone();
        tree::keep_listing(path, Arc::new(listing));
    }
    Ok(())
}
