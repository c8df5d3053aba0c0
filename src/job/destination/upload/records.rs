//! The `--resume` records of an `s3://` output, kept in the bucket so that a resumed run on other
//! nodes, with another rank count, or without the staged copy (node-local `--scratch`) keeps the
//! shards an earlier run uploaded completely.
//!
//! Once a writer created a shard (and its saved index), it puts one record under its run's own
//! hidden prefix beside the output, `.NAME.reshard-records.TOKEN/SHARD` (TOKEN: the output lock's
//! token): the size and ETag the store answered to the create, and the MD5 of the bytes it sent.
//! The marker of the upload names that token. Fencing by construction: no other run writes under
//! that prefix, so a run that lost the lock can only write records under its own token, which a
//! successor does not read (it reads the records of the run its lock came from, or, with the
//! lock free, of the run the marker names), and a record is never trusted: believed only when it
//! is sealed, of its prefix's token, the object at its name still has the recorded size and ETag
//! (a HEAD), and the resumed run's own staged file has the recorded size and MD5: so a kept object
//! holds exactly the bytes the resumed run would upload.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::deal::Deal;
use super::is_shard;
use crate::comm::{agree, broadcast_result, gather, Comm};
use crate::hex::hex;
pub(crate) use crate::job::destination::lock::is_token;
use crate::job::destination::lock::OutputLock;
use crate::output::saved_index::Verified;
use crate::output::{md5_file, seal};
use crate::storage::{self, Created, Kind};

/// What a record says of one shard's upload.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Record {
    /// The run's token: a record found under another run's prefix is not believed.
    pub(crate) token: String,
    /// The object's size, as created.
    pub(crate) size: u64,
    /// The ETag the store answered to the create (content-derived: another object at the name
    /// has another).
    pub(crate) e_tag: String,
    /// The MD5 of the bytes sent, hex.
    pub(crate) md5: String,
}

/// The prefix of the records of the run `token` writing `target`: beside it, hidden.
pub(crate) fn prefix(target: &Path, token: &str) -> PathBuf {
    let name = target.file_name().unwrap_or_default().to_string_lossy();
    target.with_file_name(format!(".{name}.reshard-records.{token}"))
}

/// Puts `record` of `shard` under the records prefix of the run `token`.
///
/// # Errors
/// It cannot be written.
pub(crate) fn write(target: &Path, token: &str, shard: &str, record: &Record) -> Result<()> {
    let path = prefix(target, token).join(shard);
    let json = serde_json::to_vec(record).expect("a record serializes");
    // A split's shard is recorded under its split's name (an object store makes no directory).
    let sink = storage::sink(&path);
    path.parent()
        .map_or(Ok(()), |dir| sink.create_dir_all(dir))
        .and_then(|()| sink.write(&path, &seal::seal(json)))
        .with_context(|| format!("{}: cannot write", path.display()))
}

/// The files under `dir`, by path relative to it (a split's shard's record or note is under its
/// split's name), in no particular order.
///
/// # Errors
/// `dir` or a directory under it cannot be listed (`NotFound` where `dir` is not there).
pub(crate) fn names_under(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        let here = dir.join(&rel);
        for e in storage::source(&here).list(&here)? {
            let name = rel.join(&e.name);
            match e.kind {
                Kind::Dir => todo.push(name),
                Kind::File => out.push(name.to_string_lossy().into_owned()),
                _ => {}
            }
        }
    }
    Ok(out)
}

/// After this run created `shard` of `target` with the answer `created`, having sent bytes of
/// the MD5 `md5`: its record, under this run's prefix (its lock's `token`). A store that
/// answered no ETag gets no record (its object could not be told from another): a resumed run
/// uploads that shard again.
///
/// # Errors
/// The record cannot be written.
pub(crate) fn note(
    target: &Path,
    token: &str,
    shard: &str,
    created: &Created,
    md5: [u8; 16],
) -> Result<()> {
    let Some(e_tag) = &created.e_tag else {
        return Ok(());
    };
    let record = Record {
        token: token.to_string(),
        size: created.size,
        e_tag: e_tag.clone(),
        md5: hex(&md5),
    };
    write(target, token, shard, &record)
}

/// Whether the object at `path` is still the one this run created there: the same size and,
/// where the store gave one, the same ETag.
///
/// # Errors
/// It cannot be looked at (a missing object is no error: it is not this run's).
pub(crate) fn still_created(path: &Path, created: &Created) -> Result<bool> {
    let now = match storage::stamp(path) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e).with_context(|| format!("{}: cannot stat", path.display())),
    };
    let tag_matches = created
        .e_tag
        .as_deref()
        .is_none_or(|tag| storage::e_tag_identity(tag) == now.identity);
    Ok(now.size == created.size && tag_matches)
}

/// The records of the run `token` at `target` that hold still, by shard name, sorted: sealed, of
/// that token, for a shard, and the object at the shard's name still of the recorded size and
/// ETag. Any other is passed over (said, when it is damaged): its shard is uploaded again.
///
/// # Errors
/// The prefix cannot be listed or an object cannot be looked at.
pub(crate) fn verified(target: &Path, token: &str) -> Result<Vec<(String, Record)>> {
    let dir = prefix(target, token);
    let names = match names_under(&dir) {
        Ok(names) => names,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("{}: cannot list", dir.display())),
    };
    let mut out = Vec::new();
    for shard in names {
        let Some(record) = read(&dir.join(&shard)).filter(|r| r.token == token) else {
            continue;
        };
        let made = Created {
            size: record.size,
            e_tag: Some(record.e_tag.clone()),
        };
        if is_shard(&shard) && still_created(&target.join(&shard), &made)? {
            out.push((shard, record));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// The record at `path`, if it is readable and sealed (a damaged one is said, naming it).
fn read(path: &Path) -> Option<Record> {
    let bytes = storage::source(path).read(path).ok()?;
    match seal::open(&bytes) {
        Ok(body) => serde_json::from_slice(body).ok(),
        Err(e) => {
            crate::errln!(
                "reshard: warning: {}: {e}; its shard is uploaded again",
                path.display()
            );
            None
        }
    }
}

/// Of `candidates` (records that hold still, [`verified`]), the shards whose staged file under
/// `copy` has the recorded size and MD5: the object at its name holds exactly the bytes this run
/// would upload. The others are said: they are uploaded again.
///
/// # Errors
/// A staged file cannot be read.
pub(crate) fn same_bytes(copy: &Path, candidates: &[(String, Record)]) -> Result<Vec<String>> {
    let mut same = Vec::new();
    for (shard, record) in candidates {
        let file = copy.join(shard);
        let size = storage::stamp(&file)
            .with_context(|| format!("{}: cannot stat", file.display()))?
            .size;
        if size == record.size && hex(&md5_file(&file)?) == record.md5 {
            same.push(shard.clone());
        } else {
            crate::errln!(
                "reshard: --resume: {shard} in the bucket is not the bytes this run stages for it (another request's?): uploaded again"
            );
        }
    }
    Ok(same)
}

/// What rank 0 knows of the shards a resumed run may keep ([`kept`]).
pub(crate) struct Candidates {
    /// Kept by the staged copy's own notes (it was continued and the objects are as noted),
    /// with what the note says of each object.
    pub(crate) kept: Vec<Kept>,
    /// The bucket's records, carried over, of shards the clean-up left in place.
    pub(crate) records: Vec<(String, Record)>,
}

/// A shard kept, with what was verified of its object.
pub(crate) type Kept = (String, Verified);

/// What a record says of its shard's object, as a saved index of it is stamped.
fn verified_by(record: &Record) -> Verified {
    Verified {
        size: record.size,
        identity: Some(storage::e_tag_identity(&record.e_tag)),
    }
}

/// The shards a resumed run keeps, the same sorted list on every rank, each with what was
/// verified of its object (its record's size and ETag, or the staged copy's note): `lead`
/// (rank 0's) holds those it keeps by the staged copy's own notes, and the bucket's records of
/// shards the new output names, carried over and preserved; of those records, each shard's
/// uploader ([`Deal::mine`]) keeps the ones whose staged file in its node's `copy` has the
/// recorded bytes ([`same_bytes`]).
///
/// # Errors
/// A staged file cannot be read (on any rank).
pub(crate) fn kept(
    comm: &impl Comm,
    copy: &Path,
    dealt: &Deal,
    lead: Option<Candidates>,
) -> Result<Vec<Kept>> {
    let lead = lead.map(|Candidates { kept, records }| {
        let named: HashSet<&str> = dealt.files.iter().map(|f| f.0.as_str()).collect();
        let candidates: Vec<(String, Record)> = records
            .into_iter()
            .filter(|r| named.contains(r.0.as_str()) && !kept.iter().any(|k| k.0 == r.0))
            .collect();
        Ok((kept, candidates))
    });
    let (mut kept, candidates): (Vec<Kept>, Vec<(String, Record)>) =
        broadcast_result(comm, 0, lead)?;
    let mine: HashSet<String> = dealt
        .mine(comm.rank())
        .into_iter()
        .map(|f| f.0.clone())
        .collect();
    let own: Vec<(String, Record)> = candidates
        .iter()
        .filter(|c| mine.contains(&c.0))
        .cloned()
        .collect();
    let same = agree(comm, same_bytes(copy, &own))?;
    let same = serde_json::to_vec(&same).expect("a list of names serializes");
    let gathered = gather(comm, 0, &same);
    let all = (comm.rank() == 0).then(|| {
        for bytes in gathered {
            let theirs: Vec<String> =
                serde_json::from_slice(&bytes).context("decoding a rank's kept shards")?;
            let records = candidates.iter().filter(|c| theirs.contains(&c.0));
            kept.extend(records.map(|(shard, r)| (shard.clone(), verified_by(r))));
        }
        kept.sort_by(|a, b| a.0.cmp(&b.0));
        kept.dedup_by(|a, b| a.0 == b.0);
        Ok(kept)
    });
    broadcast_result(comm, 0, all)
}

/// Rank 0, holding the lock, before it clears what a failed attempt left: that attempt's records
/// which hold still ([`verified`]), when `--resume` asks for them, written again under this
/// run's own prefix (a resumed run that fails in turn leaves them to the next); then that
/// attempt's prefix removed. `earlier`: the token the attempt's marker names. Believed only when
/// it is the run this one took the lock over from, or the lock was free (that run released
/// it): a marker put late by a run that lost the lock names that run, whose records a
/// successor does not read.
///
/// # Errors
/// The records cannot be listed, read, written or removed, or an object cannot be looked at.
pub(crate) fn carry_over(
    target: &Path,
    earlier: Option<&str>,
    lock: &OutputLock,
    resume: bool,
) -> Result<Vec<(String, Record)>> {
    let own = lock.token();
    let Some(earlier) = earlier.filter(|t| is_token(t) && *t != own) else {
        return Ok(Vec::new());
    };
    let from = lock.dead_predecessor().or_else(|| lock.taken_from_silent());
    let mut carried = Vec::new();
    if resume && from.is_none_or(|f| f == earlier) {
        for (shard, mut record) in verified(target, earlier)? {
            own.clone_into(&mut record.token);
            write(target, own, &shard, &record)?;
            carried.push((shard, record));
        }
    }
    // Written only by that run, read by no other: nothing to keep once carried over.
    remove(target, earlier)?;
    Ok(carried)
}

/// Removes the records of the run `token` at `target` (after its output is published, or once a
/// successor carried over what it keeps), one DELETE each (sent again when its answer is cut
/// short, as every single-object request).
///
/// # Errors
/// They cannot be listed or removed.
pub(crate) fn remove(target: &Path, token: &str) -> Result<()> {
    let dir = prefix(target, token);
    let names = match names_under(&dir) {
        Ok(names) => names,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("{}: cannot list", dir.display())),
    };
    for name in names {
        let path = dir.join(&name);
        match storage::sink(&path).remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("{}: cannot remove", path.display()))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Once the output at `target` is published: every run's records beside it removed, this
/// run's and any a run that lost the lock wrote late under its own token (read by no run: only
/// a marker names the records a resumed run reads, and a published output has none). Best
/// effort: hidden, no part of the output; one left is said and removed by the next run that
/// publishes there. Only the names that start with `.NAME.reshard-records.` are listed, not the
/// whole parent (which may hold many outputs).
pub(crate) fn remove_all(target: &Path) {
    let (Some(parent), Some(name)) = (target.parent(), target.file_name()) else {
        return;
    };
    let base = format!(".{}.reshard-records.", name.to_string_lossy());
    let removed = storage::source(parent)
        .list_starting(parent, &base)
        .with_context(|| format!("{}: cannot list", parent.display()))
        .and_then(|entries| {
            let dirs = entries.into_iter().filter(|e| e.kind == Kind::Dir);
            for e in dirs {
                let name = e.name.to_string_lossy();
                // A name of no token is no run's (a user's prefix): it stays.
                if let Some(token) = name.strip_prefix(&base).filter(|t| is_token(t)) {
                    remove(target, token)?;
                }
            }
            Ok(())
        });
    if let Err(e) = removed {
        crate::errln!(
            "reshard: warning: {} is published; its upload records were not all removed: {e:#}",
            target.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_live_beside_the_output_under_the_runs_token() {
        let target = Path::new("s3://b/p/out");
        assert_eq!(
            prefix(target, "0123456789abcdef"),
            Path::new("s3://b/p/.out.reshard-records.0123456789abcdef")
        );
        assert!(is_token("0123456789abcdef"));
        for bad in ["", "../x", "0123456789abcdeg", "0123456789abcdef/x"] {
            assert!(!is_token(bad), "{bad}");
        }
        assert_eq!(hex(&[0, 0xab, 0x10]), "00ab10");
    }

    fn record(token: &str, size: u64, md5: &str) -> Record {
        Record {
            token: token.into(),
            size,
            e_tag: "\"etag\"".into(),
            md5: md5.into(),
        }
    }

    #[test]
    fn a_shard_is_kept_only_where_the_staged_file_has_the_recorded_bytes() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("a.tar"), b"abc").unwrap();
        std::fs::write(tmp.path().join("b.tar"), b"abd").unwrap();
        std::fs::write(tmp.path().join("c.tar"), b"abcd").unwrap();
        // MD5("abc"), as published with RFC 1321.
        let abc = "900150983cd24fb0d6963f7d28e17f72";
        let t = "0123456789abcdef";
        let candidates = [
            ("a.tar".to_string(), record(t, 3, abc)),
            ("b.tar".to_string(), record(t, 3, abc)),
            ("c.tar".to_string(), record(t, 3, abc)),
        ];
        assert_eq!(same_bytes(tmp.path(), &candidates).unwrap(), ["a.tar"]);
        assert!(same_bytes(tmp.path(), &[("gone.tar".into(), record(t, 3, abc))]).is_err());
    }

    #[test]
    fn a_record_that_is_damaged_of_another_token_or_of_no_object_is_not_believed() {
        let target = Path::new("mem://upload-records/out");
        let (t, other) = ("0123456789abcdef", "fedcba9876543210");
        storage::sink(target).create_dir_all(target).unwrap();
        assert!(verified(target, t).unwrap().is_empty(), "no prefix");
        let put = |token: &str, shard: &str, bytes: &[u8]| {
            let path = prefix(target, token).join(shard);
            storage::sink(&path)
                .create_dir_all(path.parent().unwrap())
                .unwrap();
            storage::sink(&path).write(&path, bytes).unwrap();
        };
        let sealed = |r: &Record| seal::seal(serde_json::to_vec(r).unwrap());
        for shard in ["a.tar", "b.tar", "c.tar"] {
            let path = target.join(shard);
            storage::sink(&path).write(&path, b"abc").unwrap();
        }
        // Unsealed; another run's token under this prefix; no object at its name.
        put(t, "a.tar", &serde_json::to_vec(&record(t, 3, "x")).unwrap());
        put(t, "b.tar", &sealed(&record(other, 3, "x")));
        put(t, "d.tar", &sealed(&record(t, 3, "x")));
        // Sealed and of this token, but the object is not the recorded one (its ETag differs).
        put(t, "c.tar", &sealed(&record(t, 3, "x")));
        assert!(verified(target, t).unwrap().is_empty());
        // Once published, every run's records go, and nothing else.
        put(other, "a.tar", &sealed(&record(other, 3, "x")));
        remove_all(target);
        for token in [t, other] {
            let dir = prefix(target, token);
            let files = storage::source(&dir).list(&dir).unwrap_or_default();
            assert!(files.is_empty(), "{token}: {files:?}");
        }
        for shard in ["a.tar", "b.tar", "c.tar"] {
            assert!(storage::stamp(&target.join(shard)).is_ok(), "{shard} stays");
        }
    }

    /// A user's prefix named like records but of no token is no run's: it stays.
    #[test]
    fn a_prefix_named_like_records_but_of_no_token_stays() {
        let target = Path::new("mem://upload-records-user/out");
        let mine = target.with_file_name(".out.reshard-records.mine");
        let kept = mine.join("notes.txt");
        storage::sink(&mine).create_dir_all(&mine).unwrap();
        storage::sink(&kept).write(&kept, b"mine").unwrap();
        remove_all(target);
        assert!(
            storage::stamp(&kept).is_ok(),
            "the user's object is removed"
        );
    }
}
