//! A large directory of rank 0's cut (its own files cut into key ranges, one unit each) listed
//! as a stream: the rank that lists it reads [`BATCH`] entries at a time and sends each file's
//! name to the rank that walks the unit whose key range holds it (the directory's units dealt
//! over the ranks in contiguous runs, by count), in rounds every rank takes part in. So the
//! lister holds one batch and its own units' names, never the whole directory's: O(N/P) names
//! per rank. Each unit's names are then examined by the deal and its listing built by the rank
//! that holds them, sorted there (the canonical order is a unit's own, by key and name, so no
//! order of the stream matters): the listings are the ones a single rank's walk gives.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::ffi::OsStrExt;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::comm::Comm;
use crate::input::InputShard;
use crate::plan::assign_inputs;
use crate::storage::{self, posix, Entry, Kind};
use crate::tar::key::sample_key;
use crate::tree::view::file_path;
use crate::tree::walk::{hidden, join, not_utf8, Skips, Unexamined};
use crate::tree::{self, Root, Unit};

use super::recut::exchange;

/// Directory entries a lister reads in one round at most.
const BATCH: usize = 16_384;

/// A unit of a directory: its input index, root index and key range.
pub(super) type Part = (usize, usize, Unit);

/// A unit of a streamed directory this rank walks: its files' names (to be examined) and what
/// the listing skipped (its first unit's).
pub(super) struct Held {
    pub(super) part: Part,
    pub(super) files: Vec<Unexamined>,
    pub(super) skips: Skips,
}

/// A round's names by (task, unit), and a directory's skips with its first unit's.
type Round = BTreeMap<(usize, usize), (Vec<Unexamined>, Skips)>;

/// Names of one unit of a streamed directory, for the rank that walks the unit.
#[derive(Serialize, Deserialize)]
struct Names {
    /// The directory (an index into the streamed tasks) and the unit's place among its units.
    task: u32,
    unit: u32,
    files: Vec<Unexamined>,
    /// What the listing skipped (hidden names, special files): sent once the directory is
    /// read, to its first unit, which counts them.
    skips: [u64; 4],
}

/// Whether `task` (input indices of one walk task) is a directory rank 0 cut into key ranges,
/// to be listed as a stream: several units (only a directory's shallow units are a task
/// together), of a local root (rank 0 cuts no prefix of an object store by names).
pub(super) fn streamed(inputs: &[InputShard], task: &[usize]) -> bool {
    task.len() > 1
        && tree::parse(&inputs[task[0]].path)
            .is_some_and(|(root, _)| !storage::is_object_store(&root))
}

/// The directory being read by this rank.
struct Reading {
    task: usize,
    dir: Vec<u8>,
    root: usize,
    entries: Box<dyn Iterator<Item = std::io::Result<Entry>>>,
    skips: Skips,
}

/// Lists the streamed directories (`parts`: each one's units, in key order; `lists`: those
/// this rank lists, indices into `parts`) in rounds with every rank: the units this rank
/// walks, with their files named, and the directories it listed. Collective: every rank takes
/// part in every round, whatever fails.
///
/// # Errors
/// On the rank that lists it, a directory that cannot be listed, a name that is not UTF-8.
pub(super) fn run<C: Comm>(
    comm: &C,
    roots: &[Root],
    parts: &[Vec<Part>],
    lists: &[usize],
) -> Result<(Vec<Held>, u64)> {
    rounds(comm, roots, parts, lists, BATCH)
}

/// [`run`], with `per_round` entries a round at most.
fn rounds<C: Comm>(
    comm: &C,
    roots: &[Root],
    parts: &[Vec<Part>],
    lists: &[usize],
    per_round: usize,
) -> Result<(Vec<Held>, u64)> {
    let (rank, ranks) = (comm.rank(), comm.size());
    // Each directory's units dealt over the ranks in contiguous runs; this rank's walked here.
    let owners: Vec<Vec<usize>> = parts
        .iter()
        .map(|p| {
            let runs = assign_inputs(&vec![1; p.len()], ranks);
            (0..p.len())
                .map(|u| runs.iter().position(|r| r.contains(&u)).unwrap_or(0))
                .collect()
        })
        .collect();
    let mut walking = Vec::new();
    let mut at: HashMap<(usize, usize), usize> = HashMap::new();
    for (t, p) in parts.iter().enumerate() {
        for (u, part) in p.iter().enumerate() {
            if owners[t][u] == rank {
                at.insert((t, u), walking.len());
                walking.push(Held {
                    part: part.clone(),
                    files: Vec::new(),
                    skips: Skips::default(),
                });
            }
        }
    }
    let mut queue = lists.iter().copied();
    let (mut reading, mut listed, mut failed) = (None, 0, None);
    loop {
        let round = if failed.is_none() {
            let next = || queue.next().map(|t| open(roots, &parts[t], t));
            batch(roots, parts, (&mut reading, per_round), next, &mut listed)
        } else {
            Ok(Round::new())
        };
        let round = round.unwrap_or_else(|e| {
            failed.get_or_insert(e);
            Round::new()
        });
        let mut out: Vec<Vec<Names>> = (0..ranks).map(|_| Vec::new()).collect();
        for ((t, u), (files, skips)) in round {
            let names = Names {
                task: t as u32,
                unit: u as u32,
                files,
                skips: skips.to_array(),
            };
            out[owners[t][u]].push(names);
        }
        let own = std::mem::take(&mut out[rank]);
        let got = exchange(comm, out, "the names listed");
        let got = got.map(|mut got| {
            got.extend(own);
            got
        });
        if let Err(e) = got.and_then(|got| receive(got, &at, &mut walking)) {
            failed.get_or_insert(e);
        }
        let more = failed.is_none() && (reading.is_some() || queue.len() > 0);
        if comm.all_sum(&[u64::from(more)])[0] == 0 {
            break;
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    for w in &mut walking {
        // The deal's order (and so which failure is reported first): by name, as a listing's.
        w.files.sort_by(|a, b| a.rel.cmp(&b.rel));
    }
    Ok((walking, listed))
}

/// The directory of the task `t` (its units `parts`) opened for reading.
fn open(roots: &[Root], parts: &[Part], t: usize) -> Result<Reading> {
    let (_, root, first) = &parts[0];
    let path = file_path(&roots[*root].path, &first.dir);
    let entries = posix::entries(&path)
        .with_context(|| format!("{}: cannot list the directory", path.display()))?;
    Ok(Reading {
        task: t,
        dir: first.dir.clone(),
        root: *root,
        entries: Box::new(entries),
        skips: Skips::default(),
    })
}

/// One round's names: up to `most` entries read from `reading` (or the directories `next`
/// opens, each counted in `listed`), each file's name by (task, unit), and a directory's skips
/// to its first unit once it is read.
///
/// # Errors
/// A directory that cannot be listed, a name that is not UTF-8.
fn batch(
    roots: &[Root],
    parts: &[Vec<Part>],
    (reading, most): (&mut Option<Reading>, usize),
    mut next: impl FnMut() -> Option<Result<Reading>>,
    listed: &mut u64,
) -> Result<Round> {
    let mut round = Round::new();
    let mut taken = 0;
    while taken < most {
        let Some(r) = reading.as_mut() else {
            match next() {
                Some(opened) => {
                    *reading = Some(opened?);
                    *listed += 1;
                    continue;
                }
                None => break,
            }
        };
        let root = &roots[r.root].path;
        let Some(entry) = r.entries.next() else {
            round.entry((r.task, 0)).or_default().1 = r.skips;
            *reading = None;
            continue;
        };
        let entry = entry.with_context(|| {
            let path = file_path(root, &r.dir);
            format!("{}: cannot list the directory", path.display())
        })?;
        taken += 1;
        let name = entry.name.as_bytes();
        if hidden(name) {
            r.skips.hidden += 1;
            continue;
        }
        let rel = join(&r.dir, name);
        if std::str::from_utf8(&rel).is_err() {
            return Err(not_utf8(root, &rel));
        }
        match entry.kind {
            Kind::Dir => {}
            Kind::Other => r.skips.special += 1,
            Kind::File | Kind::Link => {
                let unit = unit_of(&parts[r.task], &rel);
                let follow = entry.kind == Kind::Link;
                round
                    .entry((r.task, unit))
                    .or_default()
                    .0
                    .push(Unexamined { rel, follow });
            }
        }
    }
    Ok(round)
}

/// The unit of `units` (a directory's units in key order) whose key range holds the file
/// `rel`'s key (WebDataset's rule); one without a key is the first unit's (which counts it).
pub(super) fn unit_of(units: &[Part], rel: &[u8]) -> usize {
    sample_key(rel).map_or(0, |k| {
        let after = units.partition_point(|(_, _, u)| u.keys.0.as_deref().is_none_or(|f| f <= k));
        after.saturating_sub(1)
    })
}

/// The names `got` added to the units they are for (`at`: a unit's place in `walking`).
///
/// # Errors
/// Names for a unit this rank does not walk (an internal error).
fn receive(
    got: Vec<Names>,
    at: &HashMap<(usize, usize), usize>,
    walking: &mut [Held],
) -> Result<()> {
    for names in got {
        let key = (names.task as usize, names.unit as usize);
        let Some(&w) = at.get(&key) else {
            anyhow::bail!("internal error: names for unit {key:?}, which this rank does not walk");
        };
        let w = &mut walking[w];
        w.files.extend(names.files);
        let had = w.skips.to_array();
        w.skips = Skips::from_array(std::array::from_fn(|k| had[k] + names.skips[k]));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStrExt;

    use super::*;
    use crate::comm::local::LocalComm;

    /// A directory cut at the key `m`, listed by rank 0 two entries a round at 1 to 3 ranks:
    /// each file's name held once, by the rank that walks its key range's unit, one without a
    /// key and the listing's skips by the first unit; one directory listed. A name that is not
    /// UTF-8 fails the rank that lists it, and the others return (no round left waiting).
    #[test]
    fn a_directory_s_names_go_to_the_units_of_their_keys_at_every_rank_count() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("d");
        std::fs::create_dir_all(d.join("sub")).unwrap();
        for name in [
            "a.jpg", "a.txt", "b.jpg", "m.jpg", "z.jpg", "noext", ".hidden",
        ] {
            std::fs::write(d.join(name), b"1").unwrap();
        }
        let root = Root {
            path: tmp.path().to_path_buf(),
            canonical: tmp.path().to_path_buf(),
            rules: Default::default(),
        };
        let cut = |from: Option<&str>, to: Option<&str>| Unit {
            dir: b"d".to_vec(),
            deep: false,
            keys: (from.map(|k| k.into()), to.map(|k| k.into())),
        };
        let parts = vec![vec![
            (7, 0, cut(None, Some("d/m"))),
            (8, 0, cut(Some("d/m"), None)),
        ]];
        let names = |h: &Held| -> Vec<String> {
            let mut n: Vec<String> = h
                .files
                .iter()
                .map(|f| String::from_utf8_lossy(&f.rel).into())
                .collect();
            n.sort();
            n
        };
        for ranks in 1..=3 {
            let got = LocalComm::run(ranks, |c| {
                let lists: &[usize] = if c.rank() == 0 { &[0] } else { &[] };
                rounds(c, std::slice::from_ref(&root), &parts, lists, 2).unwrap()
            });
            let listed: Vec<u64> = got.iter().map(|(_, l)| *l).collect();
            assert_eq!(listed.iter().sum::<u64>(), 1, "{ranks} ranks: {listed:?}");
            let held: Vec<&Held> = got.iter().flat_map(|(h, _)| h).collect();
            assert_eq!(held.len(), 2, "{ranks} ranks: each unit on one rank");
            let first = held.iter().find(|h| h.part.0 == 7).unwrap();
            let second = held.iter().find(|h| h.part.0 == 8).unwrap();
            assert_eq!(names(first), ["d/a.jpg", "d/a.txt", "d/b.jpg", "d/noext"]);
            assert_eq!(names(second), ["d/m.jpg", "d/z.jpg"]);
            assert_eq!(first.skips.hidden, 1);
            assert_eq!(second.skips, Skips::default());
        }
        std::fs::write(d.join(std::ffi::OsStr::from_bytes(b"\xffx.jpg")), b"1").unwrap();
        let got = LocalComm::run(2, |c| {
            let lists: &[usize] = if c.rank() == 0 { &[0] } else { &[] };
            rounds(c, std::slice::from_ref(&root), &parts, lists, 2).map(|_| ())
        });
        let e = format!("{:#}", got[0].as_ref().unwrap_err());
        assert!(e.contains("is not UTF-8"), "{e}");
        assert!(got[1].is_ok());
    }
}
