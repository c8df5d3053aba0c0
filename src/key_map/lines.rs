//! The lines form of `--key-map` (`key<TAB>template`), read by all ranks together: each rank
//! reads one byte range of the file (1/P of it, whole lines), and every line travels to the
//! rank that owns its key (by key hash), as do the look-ups of every rank's own samples; the
//! owners answer. So the map's time, reads and memory are O(N/P) per rank, and no rank streams
//! the whole file (at 10^9 lines, ~26 GB, which every one of 1024 ranks used to read).
//!
//! Errors are those of reading the file front to back: the first in file order wins (a line
//! that is not `key<TAB>template`, or a key mapped again to another group), so the message is
//! the same at any rank count; the rank that found it sends its text to every rank.

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::Path;

use anyhow::{anyhow, Context, Result};

use crate::comm::{broadcast_result, exclusive_sum, Comm};
use crate::storage::{self, Sequential};
use crate::tar::key_hash;

/// What the map says of this rank's keys: the groups' templates (sorted, the same on every
/// rank, every template the file names), and for each key the index of its template, if any.
pub(super) struct Found {
    pub(crate) templates: Vec<String>,
    pub(crate) hits: Vec<Option<u32>>,
}

/// A line of this rank's share of the file: its number among the share's lines (from 0), its
/// key and template (an index into the share's own templates).
struct Line {
    number: u64,
    key: Vec<u8>,
    template: u32,
}

/// This rank's share of the file, parsed.
#[derive(Default)]
struct Share {
    /// Lines that start in the share's byte range, blank ones included (for line numbers).
    lines: u64,
    parsed: Vec<Line>,
    templates: Vec<String>,
    /// The share's first malformed line (its number in the share) and why; parsing stops there.
    bad: Option<(u64, String)>,
}

/// Reads the map at `path` with every rank and finds each of `keys` in it. Collective: every
/// rank calls it, whatever happens on the others.
///
/// # Errors
/// The same on every rank: the file cannot be read, or the first problem in file order (a
/// malformed line, a key mapped again to another group), named with the file and line.
pub(super) fn find(comm: &impl Comm, path: &Path, keys: &[Vec<u8>]) -> Result<Found> {
    let shown = path.display().to_string();
    let share = read_share(path, comm.rank(), comm.size());
    let (first_line, _) = exclusive_sum(comm, share.as_ref().map_or(0, |s| s.lines));
    // A share that cannot be read comes first: no line number would be the right one.
    let (mut share, unread) = match share {
        Ok(share) => (share, None),
        Err(e) => (Share::default(), Some((0, format!("{e:#}")))),
    };
    // Line numbers in the file, from 1.
    for l in &mut share.parsed {
        l.number += first_line + 1;
    }
    let templates = all_templates(comm, &share.templates);
    let global: Vec<u32> = share
        .templates
        .iter()
        .map(|t| templates.binary_search(t).expect("every share's template") as u32)
        .collect();
    let received = route_lines(comm, &share.parsed, &global);
    drop(share.parsed);
    let owned = Owned::build(&received);
    let asked = route_asks(comm, keys);
    let (answers, conflict) = owned.answer(&asked, &shown);
    let hits = answer_back(comm, answers, keys.len());
    // The first problem in file order, wherever it was found.
    let bad = share.bad.map(|(n, why)| {
        (
            n + first_line + 1,
            format!("{shown}:{}: {why}", n + first_line + 1),
        )
    });
    let problem = [unread, bad, conflict]
        .into_iter()
        .flatten()
        .min_by_key(|(n, _)| *n);
    let first = comm.all_gather(problem.as_ref().map_or(u64::MAX, |(n, _)| *n));
    let least = *first.iter().min().expect("at least one rank");
    if least != u64::MAX {
        let says = first.iter().position(|&n| n == least).expect("found");
        let mine = (comm.rank() == says).then(|| {
            let text = problem.map(|(_, t)| t).expect("this rank's problem");
            Ok::<String, anyhow::Error>(text)
        });
        let text = broadcast_result(comm, says, mine)?;
        return Err(anyhow!(text));
    }
    Ok(Found { templates, hits })
}

/// A problem found in the map: where it is in file order (a line number; 0 before any line)
/// and its message.
type Problem = (u64, String);

/// This rank's byte range of a file of `len` bytes.
fn share_of(len: u64, rank: usize, ranks: usize) -> Range<u64> {
    let at = |r: usize| (u128::from(len) * r as u128 / ranks.max(1) as u128) as u64;
    at(rank)..at(rank + 1)
}

/// Reads and parses the lines that start in this rank's byte range of the file.
fn read_share(path: &Path, rank: usize, ranks: usize) -> Result<Share> {
    let shown = path.display();
    let file = storage::open(path).with_context(|| format!("{shown}: cannot open the key map"))?;
    let len = file
        .stamp()
        .with_context(|| format!("{shown}: cannot read the key map"))?
        .size;
    let range = share_of(len, rank, ranks);
    let mut input = Sequential::new(file);
    // A line belongs to the share its first byte is in: skip the one a range starts inside.
    let mut at = range.start.saturating_sub(1);
    input
        .seek(SeekFrom::Start(at))
        .with_context(|| format!("{shown}: cannot read the key map"))?;
    let mut reader = BufReader::with_capacity(1 << 20, input);
    let mut raw = Vec::new();
    if range.start > 0 {
        at += reader
            .read_until(b'\n', &mut raw)
            .with_context(|| format!("{shown}: cannot read the key map"))? as u64;
    }
    let mut share = Share::default();
    let mut index: HashMap<String, u32> = HashMap::new();
    while at < range.end {
        raw.clear();
        let n = reader
            .by_ref()
            .read_until(b'\n', &mut raw)
            .with_context(|| format!("{shown}: cannot read the key map"))?;
        if n == 0 {
            break;
        }
        at += n as u64;
        let number = share.lines;
        share.lines += 1;
        if share.bad.is_some() {
            continue;
        }
        match parse(&raw) {
            Ok(None) => {}
            Ok(Some((key, template))) => {
                let next = share.templates.len() as u32;
                let t = *index.entry(template.to_string()).or_insert_with(|| {
                    share.templates.push(template.to_string());
                    next
                });
                share.parsed.push(Line {
                    number,
                    key: key.as_bytes().to_vec(),
                    template: t,
                });
            }
            Err(why) => share.bad = Some((number, why)),
        }
    }
    Ok(share)
}

/// One line (with its newline, if any): `None` for a blank one, else its key and template.
fn parse(raw: &[u8]) -> Result<Option<(&str, &str)>, String> {
    let line = std::str::from_utf8(raw)
        .map_err(|_| "cannot read: the line is not valid UTF-8".to_string())?;
    let line = line.strip_suffix('\n').unwrap_or(line);
    let line = line.trim_end_matches('\r');
    if line.trim().is_empty() {
        return Ok(None);
    }
    match line.split_once('\t') {
        Some(kt) => Ok(Some(kt)),
        None => Err(format!(
            "expected `key<TAB>template` (or a JSON object), got {line:?}"
        )),
    }
}

/// Every rank's templates, sorted and deduplicated: the same list on every rank.
fn all_templates(comm: &impl Comm, mine: &[String]) -> Vec<String> {
    let text = mine.join("\n");
    // The same bytes to every rank.
    let ranges = vec![0..text.len(); comm.size()];
    let mut recv = Vec::new();
    let from = comm.all_to_all(text.as_bytes(), &ranges, &mut recv);
    let mut all = BTreeSet::new();
    for r in from.into_iter().filter(|r| !r.is_empty()) {
        for t in String::from_utf8_lossy(&recv[r]).split('\n') {
            all.insert(t.to_string());
        }
    }
    all.into_iter().collect()
}

/// The rank that owns `key`'s map lines and answers for it.
fn owner(key: &[u8], ranks: usize) -> usize {
    (key_hash(key) % ranks as u64) as usize
}

/// Sends variable-width records, each framed by the caller, to the ranks `each` names; the
/// bytes received and each source rank's range of them.
fn send_framed(
    comm: &impl Comm,
    each: &mut dyn FnMut(&mut [Vec<u8>]),
) -> (Vec<u8>, Vec<Range<usize>>) {
    let mut out: Vec<Vec<u8>> = vec![Vec::new(); comm.size()];
    each(&mut out);
    let mut ranges = Vec::with_capacity(out.len());
    let mut send = Vec::with_capacity(out.iter().map(Vec::len).sum());
    for part in out {
        ranges.push(send.len()..send.len() + part.len());
        send.extend(part);
    }
    let mut recv = Vec::new();
    let from = comm.all_to_all(&send, &ranges, &mut recv);
    (recv, from)
}

fn put_key(out: &mut Vec<u8>, key: &[u8]) {
    out.extend((key.len() as u32).to_le_bytes());
    out.extend(key);
}

fn take_u64(bytes: &[u8], at: &mut usize) -> u64 {
    let v = crate::comm::wire::u64_at(bytes, *at);
    *at += 8;
    v
}

fn take_u32(bytes: &[u8], at: &mut usize) -> u32 {
    let v = crate::comm::wire::u32_at(bytes, *at);
    *at += 4;
    v
}

fn take_key<'a>(bytes: &'a [u8], at: &mut usize) -> &'a [u8] {
    let n = take_u32(bytes, at) as usize;
    let key = &bytes[*at..*at + n];
    *at += n;
    key
}

/// Every parsed line to the owner of its key: (line number, template, key).
fn route_lines(comm: &impl Comm, lines: &[Line], global: &[u32]) -> Vec<u8> {
    let ranks = comm.size();
    send_framed(comm, &mut |to| {
        for l in lines {
            let out = &mut to[owner(&l.key, ranks)];
            out.extend(l.number.to_le_bytes());
            out.extend(global[l.template as usize].to_le_bytes());
            put_key(out, &l.key);
        }
    })
    .0
}

/// Every own key to its owner: (the key's index on this rank, key).
fn route_asks(comm: &impl Comm, keys: &[Vec<u8>]) -> (Vec<u8>, Vec<Range<usize>>) {
    let ranks = comm.size();
    send_framed(comm, &mut |to| {
        for (i, key) in keys.iter().enumerate() {
            let out = &mut to[owner(key, ranks)];
            out.extend((i as u64).to_le_bytes());
            put_key(out, key);
        }
    })
}

/// What the map says of one key: the template of its first line, that line, and the first
/// later line that maps it to another template.
struct Mapped {
    template: u32,
    line: u64,
    again: Option<(u64, u32)>,
}

/// The map lines of the keys this rank owns.
struct Owned<'a> {
    keys: HashMap<&'a [u8], Mapped>,
}

impl<'a> Owned<'a> {
    fn build(received: &'a [u8]) -> Self {
        let mut lines = Vec::new();
        let mut at = 0;
        while at < received.len() {
            let number = take_u64(received, &mut at);
            let template = take_u32(received, &mut at);
            let key = take_key(received, &mut at);
            lines.push((number, template, key));
        }
        // In file order, as a single reader would meet them.
        lines.sort_unstable_by_key(|&(n, _, _)| n);
        let mut keys: HashMap<&[u8], Mapped> = HashMap::with_capacity(lines.len());
        for (line, template, key) in lines {
            let m = keys.entry(key).or_insert(Mapped {
                template,
                line,
                again: None,
            });
            if m.template != template && m.again.is_none() {
                m.again = Some((line, template));
            }
        }
        Owned { keys }
    }

    /// Answers each source rank's asks: (key index, template or `u32::MAX`), by source rank;
    /// and the first line (in file order) that maps an asked key again to another group.
    fn answer(
        &self,
        (asked, from): &(Vec<u8>, Vec<Range<usize>>),
        shown: &str,
    ) -> (Vec<Vec<(u64, u32)>>, Option<Problem>) {
        let mut answers = vec![Vec::new(); from.len()];
        let mut conflict: Option<Problem> = None;
        for (source, r) in from.iter().enumerate() {
            let bytes = &asked[r.clone()];
            let mut at = 0;
            while at < bytes.len() {
                let i = take_u64(bytes, &mut at);
                let key = take_key(bytes, &mut at);
                let m = self.keys.get(key);
                if let Some(Mapped {
                    line,
                    again: Some((again, _)),
                    ..
                }) = m
                {
                    if conflict.as_ref().is_none_or(|(n, _)| again < n) {
                        let key = String::from_utf8_lossy(key);
                        conflict = Some((
                            *again,
                            format!("{shown}:{again}: key {key:?} is mapped again (first on line {line}) to another group"),
                        ));
                    }
                }
                answers[source].push((i, m.map_or(u32::MAX, |m| m.template)));
            }
        }
        (answers, conflict)
    }
}

/// The owners' answers back to the ranks that asked: each own key's template, if any.
fn answer_back(comm: &impl Comm, answers: Vec<Vec<(u64, u32)>>, keys: usize) -> Vec<Option<u32>> {
    let (recv, _) = send_framed(comm, &mut |to| {
        for (out, list) in to.iter_mut().zip(&answers) {
            for (i, t) in list {
                out.extend(i.to_le_bytes());
                out.extend(t.to_le_bytes());
            }
        }
    });
    let mut hits = vec![None; keys];
    let mut at = 0;
    while at < recv.len() {
        let i = take_u64(&recv, &mut at) as usize;
        let t = take_u32(&recv, &mut at);
        hits[i] = (t != u32::MAX).then_some(t);
    }
    hits
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::local::LocalComm;

    /// Each rank's templates and hits, or its error's text.
    type Answer = Result<(Vec<String>, Vec<Option<u32>>), String>;

    /// The file `text`, read by `ranks` ranks, each with `keys` of its own: each rank's answer.
    fn found(text: &str, ranks: usize, keys: &[&str]) -> Vec<Answer> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("map.txt");
        std::fs::write(&path, text).unwrap();
        let keys: Vec<Vec<u8>> = keys.iter().map(|k| k.as_bytes().to_vec()).collect();
        LocalComm::run(ranks, |c| {
            find(c, &path, &keys)
                .map(|f| (f.templates, f.hits))
                .map_err(|e| format!("{e:#}"))
        })
    }

    #[test]
    fn every_rank_count_finds_the_same_groups() {
        let mut text = String::new();
        for i in 0..200 {
            text.push_str(&format!("k/{i}\tg{}-%d.tar\n", i % 7));
            if i % 13 == 0 {
                text.push('\n');
            }
        }
        let keys = ["k/0", "k/199", "k/50", "missing", "k/50"];
        let one = found(&text, 1, &keys).remove(0).unwrap();
        assert_eq!(one.0.len(), 7);
        assert_eq!(one.1[3], None);
        assert_eq!(one.1[2], one.1[4]);
        for ranks in 2..=9 {
            for got in found(&text, ranks, &keys) {
                assert_eq!(got.as_ref().unwrap(), &one, "{ranks} ranks");
            }
        }
    }

    #[test]
    fn the_first_problem_in_file_order_is_said_on_every_rank() {
        // Line 3 maps a/1 again to another group; line 6 is malformed: line 3 wins, however
        // the file is split, and a line that repeats the same group is no problem.
        let text = "a/1\tx-%d\na/1\tx-%d\na/1\ty-%d\n\n\nno tab\nb\tx-%d";
        for ranks in 1..=6 {
            for got in found(text, ranks, &["a/1"]) {
                let e = got.unwrap_err();
                assert!(
                    e.contains("map.txt:3: key \"a/1\" is mapped again (first on line 1)"),
                    "{ranks}: {e}"
                );
            }
        }
        // A key no rank asks for may be mapped twice: the malformed line is the problem.
        for ranks in 1..=6 {
            for got in found(text, ranks, &["b"]) {
                let e = got.unwrap_err();
                assert!(
                    e.contains("map.txt:6: expected `key<TAB>template`"),
                    "{ranks}: {e}"
                );
            }
        }
    }

    #[test]
    fn a_share_holds_the_lines_that_start_in_it() {
        // Every line starts in exactly one share, whatever the split.
        for len in [0u64, 1, 5, 100] {
            for ranks in 1..8 {
                let covered: u64 = (0..ranks)
                    .map(|r| share_of(len, r, ranks))
                    .map(|r| r.end - r.start)
                    .sum();
                assert_eq!(covered, len);
                assert_eq!(share_of(len, 0, ranks).start, 0);
                assert_eq!(share_of(len, ranks - 1, ranks).end, len);
            }
        }
        let text = "a\tx-%d\nbb\tx-%d\nccc\tx-%d\n";
        for ranks in 1..=text.len() {
            let per_rank = found(text, ranks, &["a", "bb", "ccc"]);
            for got in per_rank {
                assert_eq!(got.unwrap().1, [Some(0), Some(0), Some(0)], "{ranks}");
            }
        }
    }
}
