//! This rank's share of the walk, with a large directory's files examined by every rank.
//!
//! The units are walked in tasks: a deep unit alone, or a directory's shallow units together
//! (rank 0 cuts a large directory's own files into key ranges, one unit each: the directory is
//! listed once for all of them, not once a unit). Each rank lists the directories of a
//! contiguous share of the tasks (by count; several at once), with the kind each entry gives
//! and no `lstat`; a directory rank 0 cut into key ranges is listed as a stream
//! ([`super::stream`]), each name sent as it is read to the rank that walks its unit, so its
//! lister never holds its names. A directory of at most [`DEAL_OVER`] files has them examined
//! (one `lstat` each, a `stat` for a link) at once by the rank that listed it; the files of
//! larger ones, from every rank, are dealt: taken in order (rank, then unit, then name), cut
//! into one contiguous share per rank, sent to it, examined there, and the facts sent back.
//! So the metadata calls of a directory of a million files are spread over the ranks, one per
//! file in all, and its listing (built by the rank that holds its names, the facts back) is
//! the one a single rank's walk gives: nothing here depends on the rank count but who does
//! the work.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::comm::{agree, Comm};
use crate::input::InputShard;
use crate::job::handoff::WalkCalls as Calls;
use crate::plan::assign_inputs;
use crate::storage::posix::FileFacts;
use crate::tree::units::KEYS_PER_UNIT;
use crate::tree::walk::{examine, finish, names, take, Named, Skips, Unexamined};
use crate::tree::{self, Root, Unit};

use super::recut::{exchange, WalkedUnit};
use super::stream::{self, unit_of, Part};

/// A directory with more files than this has them examined by every rank.
pub(super) const DEAL_OVER: usize = KEYS_PER_UNIT;

/// Metadata calls at once per rank (each a wait on storage, which serves many at once).
const THREADS: usize = 16;

/// A unit of this rank's tasks on its way to a listing.
struct Walking {
    input: usize,
    root: usize,
    unit: Unit,
    found: Vec<(Vec<u8>, FileFacts)>,
    skips: Skips,
    /// Files of a large directory, examined by the ranks their deal gives them to.
    dealt: Vec<Unexamined>,
}

/// A file dealt to a rank: its root (an index into the roots) and itself (borrowed where
/// sent: the rank that listed a large directory holds its names once, not twice).
#[derive(Serialize, Deserialize)]
struct Asked<'a> {
    root: u32,
    file: Cow<'a, Unexamined>,
}

/// What examining a dealt file gave: its facts, or the error's text (naming the rank and host
/// that examined it: a node's own mount problem is that node's).
type Answer = std::result::Result<FileFacts, String>;

/// Walks this rank's share of the units among `inputs` (`units`: their indices, in order):
/// their listings and skips by input index, and this rank's calls. Collective.
///
/// # Errors
/// A walk that failed on any rank (agreed: every rank returns it).
pub(super) fn walk<C: Comm>(
    comm: &C,
    roots: &[Root],
    inputs: &[InputShard],
    units: &[usize],
) -> Result<(Vec<WalkedUnit>, Calls)> {
    let tasks = tasks(inputs, units);
    let share = assign_inputs(&vec![1; tasks.len()], comm.size())[comm.rank()].clone();
    // The directories rank 0 cut into key ranges are listed as streams (every rank walks some
    // of their units); this rank's other tasks are read here, whole.
    let (mut big, mut lists, mut mine) = (Vec::new(), Vec::new(), Vec::new());
    for (t, task) in tasks.into_iter().enumerate() {
        if stream::streamed(inputs, &units[task.clone()]) {
            if share.contains(&t) {
                lists.push(big.len());
            }
            big.push(task);
        } else if share.contains(&t) {
            mine.push(task);
        }
    }
    let mut calls = Calls::default();
    let read = several(mine, |task| read(roots, inputs, &units[task]));
    let mut walking: Vec<Walking> = Vec::new();
    for (w, c) in agree(comm, read)? {
        walking.extend(w);
        calls.listed += c.listed;
        calls.examined += c.examined;
    }
    let parts = big
        .iter()
        .map(|t| parsed(roots, inputs, &units[t.clone()]))
        .collect::<Result<Vec<_>>>()?;
    let (held, listed) = agree(comm, stream::run(comm, roots, &parts, &lists))?;
    walking.extend(held.into_iter().map(|h| Walking {
        input: h.part.0,
        root: h.part.1,
        unit: h.part.2,
        found: Vec::new(),
        skips: h.skips,
        dealt: h.files,
    }));
    calls.listed += listed;
    calls.held = walking
        .iter()
        .map(|w| (w.found.len() + w.dealt.len()) as u64)
        .sum();
    let pending: Vec<(usize, Unexamined)> = walking
        .iter_mut()
        .enumerate()
        .flat_map(|(k, w)| {
            std::mem::take(&mut w.dealt)
                .into_iter()
                .map(move |f| (k, f))
        })
        .collect();
    let (answers, examined) = deal(comm, roots, &walking, &pending);
    calls.examined += examined;
    let finished = answers.and_then(|answers| {
        for ((k, file), answer) in pending.into_iter().zip(answers) {
            let w = &mut walking[k];
            let facts = answer.map_err(std::io::Error::other);
            take(&roots[w.root].path, file, facts, &mut w.found, &mut w.skips)?;
        }
        several(walking, |w| {
            let root = &roots[w.root];
            let (listing, skips) = finish(&root.path, &w.unit, &root.rules, w.found, w.skips)?;
            Ok((w.input, listing, skips))
        })
    });
    Ok((agree(comm, finished)?, calls))
}

/// The tasks of `units` (indices into `inputs`), as ranges of `units`: a run of one
/// directory's shallow units together, any other unit alone.
fn tasks(inputs: &[InputShard], units: &[usize]) -> Vec<Range<usize>> {
    let shallow_dir = |k: usize| {
        tree::parse(&inputs[units[k]].path).and_then(|(root, u)| (!u.deep).then_some((root, u.dir)))
    };
    let mut out: Vec<Range<usize>> = Vec::new();
    for k in 0..units.len() {
        match out.last_mut() {
            Some(last) if shallow_dir(k).is_some() && shallow_dir(k) == shallow_dir(k - 1) => {
                last.end = k + 1;
            }
            _ => out.push(k..k + 1),
        }
    }
    out
}

/// One task's units (`task`: their input indices) listed, the files of small directories
/// examined, those of large ones left to the deal; and the calls made.
///
/// # Errors
/// A unit of no root of this run, a directory that cannot be listed, a name that is not
/// UTF-8, a file of a small directory that cannot be examined.
fn read(roots: &[Root], inputs: &[InputShard], task: &[usize]) -> Result<(Vec<Walking>, Calls)> {
    let units = parsed(roots, inputs, task)?;
    let (_, r, first) = &units[0];
    let root = &roots[*r];
    let mut calls = Calls::default();
    // A directory's shallow units: the directory listed once, whole, its files shared out by
    // the units' key ranges.
    let whole = (!first.deep).then(|| Unit::of(first.dir.clone(), false));
    let named = names(&root.path, whole.as_ref().unwrap_or(first), &root.rules)?;
    calls.listed = named.listed;
    let large = named.dirs.iter().any(|d| d.len() > DEAL_OVER);
    let mut out = Vec::with_capacity(units.len());
    for ((input, root_index, unit), named) in units.iter().zip(shared_out(named, &units)) {
        let mut w = Walking {
            input: *input,
            root: *root_index,
            unit: unit.clone(),
            found: named.found,
            skips: named.skips,
            dealt: Vec::new(),
        };
        for files in named.dirs {
            // A shallow unit's files are of one directory: dealt when it is large.
            if files.len() > DEAL_OVER || (large && !unit.deep) {
                w.dealt.extend(files);
                continue;
            }
            for file in files {
                calls.examined += 1;
                let facts = examine(&root.path, &file);
                take(&root.path, file, facts, &mut w.found, &mut w.skips)?;
            }
        }
        out.push(w);
    }
    Ok((out, calls))
}

/// The units `task` (input indices) as (input index, root index, unit).
///
/// # Errors
/// A unit of no root of this run.
fn parsed(roots: &[Root], inputs: &[InputShard], task: &[usize]) -> Result<Vec<Part>> {
    let mut units = Vec::with_capacity(task.len());
    for &i in task {
        let path = &inputs[i].path;
        let (root, unit) =
            tree::parse(path).with_context(|| format!("{}: not a unit", path.display()))?;
        let Some(r) = roots.iter().position(|r| r.path == root) else {
            anyhow::bail!(
                "{}: the root is not an --input-files root of this run",
                root.display()
            );
        };
        units.push((i, r, unit));
    }
    Ok(units)
}

/// `named`, the listing of the directory of `units` (one deep unit, or a directory's shallow
/// units in key order), shared out by key: each file to the unit whose range holds its key
/// (WebDataset's rule), one without a key and what was skipped to the first unit (which
/// counts the directory's skips); as each unit's own listing would have named them.
fn shared_out(named: Named, units: &[Part]) -> Vec<Named> {
    if units.len() == 1 {
        return vec![named];
    }
    let mut out: Vec<Named> = units.iter().map(|_| Named::default()).collect();
    for (rel, facts) in named.found {
        out[unit_of(units, &rel)].found.push((rel, facts));
    }
    for dir in named.dirs {
        let mut by_unit: Vec<Vec<Unexamined>> = units.iter().map(|_| Vec::new()).collect();
        for file in dir {
            by_unit[unit_of(units, &file.rel)].push(file);
        }
        for (o, files) in out.iter_mut().zip(by_unit) {
            if !files.is_empty() {
                o.dirs.push(files);
            }
        }
    }
    out[0].skips = named.skips;
    out
}

/// Deals the files `pending` (this rank's, each with its index into `walking`) over the ranks
/// and examines this rank's share: the answers to `pending`, in its order, and how many files
/// this rank examined. Collective: every rank takes part in both exchanges, whatever fails.
fn deal<C: Comm>(
    comm: &C,
    roots: &[Root],
    walking: &[Walking],
    pending: &[(usize, Unexamined)],
) -> (Result<Vec<Answer>>, u64) {
    let (rank, ranks) = (comm.rank(), comm.size());
    let counts = comm.all_gather(pending.len() as u64);
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return (Ok(Vec::new()), 0);
    }
    if ranks == 1 {
        // All are this rank's: examined here, not sent to itself.
        let files: Vec<(u32, &Unexamined)> = pending
            .iter()
            .map(|(k, file)| (walking[*k].root as u32, file))
            .collect();
        return (Ok(examine_all(roots, &files, rank)), total);
    }
    // Every rank's files in one order; rank `q` examines the `q`th contiguous share of it.
    let share = |q: usize| {
        let at = |q: usize| (u128::from(total) * q as u128 / ranks as u128) as u64;
        at(q)..at(q + 1)
    };
    let start = |r: usize| counts[..r].iter().sum::<u64>();
    // The part of `a` inside `b` (empty at a place inside `a` when none is).
    let overlap = |a: &Range<u64>, b: &Range<u64>| {
        let from = a.start.max(b.start).min(a.end);
        from..a.end.min(b.end).max(from)
    };
    let mine = start(rank)..start(rank) + counts[rank];
    let parts: Vec<Vec<Asked>> = (0..ranks)
        .map(|q| {
            let o = overlap(&mine, &share(q));
            pending[(o.start - mine.start) as usize..(o.end - mine.start) as usize]
                .iter()
                .map(|(k, file)| Asked {
                    root: walking[*k].root as u32,
                    file: Cow::Borrowed(file),
                })
                .collect()
        })
        .collect();
    let asked = exchange(comm, parts, "the files dealt");
    let examined = asked.as_ref().map_or(0, |a| a.len() as u64);
    let answers: Vec<Answer> = match &asked {
        Ok(asked) => {
            let files: Vec<(u32, &Unexamined)> = asked.iter().map(|a| (a.root, &*a.file)).collect();
            examine_all(roots, &files, rank)
        }
        Err(_) => Vec::new(),
    };
    // The answers back, to each rank the part of its files this rank's share held.
    let mut back: Vec<Vec<Answer>> = Vec::with_capacity(ranks);
    let mut rest = answers.into_iter();
    let share_of_mine = share(rank);
    for (r, count) in counts.iter().enumerate() {
        let theirs = start(r)..start(r) + count;
        let n = overlap(&share_of_mine, &theirs);
        back.push(rest.by_ref().take((n.end - n.start) as usize).collect());
    }
    let got = exchange(comm, back, "the facts of the files dealt");
    let result = asked.and(got).and_then(|got| {
        anyhow::ensure!(
            got.len() == pending.len(),
            "internal error: {} facts back for {} files dealt",
            got.len(),
            pending.len()
        );
        Ok(got)
    });
    (result, examined)
}

/// The answers for `files` (each with its root's index), examined by `rank` of this host, in
/// order, [`THREADS`] at a time.
fn examine_all(roots: &[Root], files: &[(u32, &Unexamined)], rank: usize) -> Vec<Answer> {
    let host = crate::sys::hostname();
    let chunks: Vec<&[(u32, &Unexamined)]> = files.chunks(256).collect();
    let done = several(chunks, |chunk| {
        Ok(chunk
            .iter()
            .map(|(root, file)| {
                examine(&roots[*root as usize].path, file)
                    .map_err(|e| format!("{e} (examined by rank {rank} on {host})"))
            })
            .collect::<Vec<Answer>>())
    });
    done.map(|d| d.into_iter().flatten().collect())
        .unwrap_or_default()
}

/// `f` of every item, [`THREADS`] at a time, in order; the first failure in order is the
/// error, and no item starts after a failure.
fn several<T: Send, R: Send>(items: Vec<T>, f: impl Fn(T) -> Result<R> + Sync) -> Result<Vec<R>> {
    let n = items.len();
    let items: Vec<Mutex<Option<T>>> = items.into_iter().map(|t| Mutex::new(Some(t))).collect();
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<R>>>> = Mutex::new((0..n).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..THREADS.min(n) {
            scope.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= n {
                    break;
                }
                let item = items[k].lock().unwrap().take().expect("each item once");
                let r = f(item);
                let failed = r.is_err();
                results.lock().unwrap()[k] = Some(r);
                if failed {
                    next.store(n, Ordering::Relaxed);
                }
            });
        }
    });
    let mut out = Vec::with_capacity(n);
    for r in results.into_inner().unwrap() {
        let Some(r) = r else { continue };
        out.push(r?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dealt file that cannot be examined: the answer's text names the rank that examined
    /// it and its host, so the error the listing rank reports names the node that hit it.
    #[test]
    fn an_examination_error_names_the_examining_rank_and_host() {
        let tmp = tempfile::tempdir().unwrap();
        let root = Root {
            path: tmp.path().to_path_buf(),
            canonical: tmp.path().to_path_buf(),
            rules: Default::default(),
        };
        let gone = Unexamined {
            rel: b"gone.jpg".to_vec(),
            follow: false,
        };
        let answers = examine_all(&[root], &[(0, &gone)], 3);
        let e = answers[0].as_ref().unwrap_err();
        let host = crate::sys::hostname();
        assert!(e.contains(&format!("examined by rank 3 on {host}")), "{e}");
    }
}
