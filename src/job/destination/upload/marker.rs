//! The markers of uploads under way, in the bucket beside the objects of the output: what the
//! next run reads to know what a run that failed left there. One marker per run, named by its
//! token (`.reshard-incomplete.TOKEN`): fenced by construction, as table formats on object
//! stores write only new, uniquely named objects. A run writes and removes only its own, each
//! write made only over the run's own last bytes (`If-Match` where the store can). Its first
//! step once it holds the lock is its [`claim`]: the other runs' markers listed (a run that
//! finds one superseding it lost the lock, and stops), each sealed (written again over the
//! version read, `superseded_by` this run, so its run can name nothing more in it), and the
//! run's own created, naming all they name and superseding their runs, before anything is
//! removed or can fail; its clearing ([`clean_up_failed_run`]) then writes it again naming
//! what stays, and removes the sealed markers. `begin` adds what it replaces and what
//! `--resume` may keep, the upload phase the names it uploads; the run that published removes
//! its own once what it replaced is gone. The single `.reshard-incomplete` of an older reshard
//! is read as one more failed run's marker.

use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::path::Path;

use anyhow::{bail, Context, Result};

use super::fenced::{self, Fence};
use super::{records, with_layouts};
use crate::job::destination::lock::lost_by_token;
use crate::job::destination::owned::OutputManifest;
use crate::job::destination::written::Written;
use crate::storage::{self, Kind};

/// The marker of an upload under way of an older reshard (one for every run), and the start of
/// each run's own marker's name ([`name_of`]).
pub(super) const INCOMPLETE: &str = ".reshard-incomplete";

/// The name, relative to the output, of the marker of the run `token`.
pub(super) fn name_of(token: &str) -> String {
    format!("{INCOMPLETE}.{token}")
}

/// Whether `name` (at the top of an output) is a marker of an upload under way: a run's own
/// ([`name_of`]) or an older reshard's single one.
pub(super) fn is_marker(name: &str) -> bool {
    name == INCOMPLETE
        || name
            .strip_prefix(INCOMPLETE)
            .and_then(|t| t.strip_prefix('.'))
            .is_some_and(records::is_token)
}

/// What the marker of an upload under way names: the objects the run uploads (`uploads`,
/// removed by the next run when no manifest was written, but for those `--resume` keeps), and
/// the objects of the reshard output `--force` replaces (`replaces`: once its manifest is
/// removed, the marker is what still says they are reshard's, for the next run to remove).
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct Marker {
    pub(super) uploads: Vec<String>,
    #[serde(default)]
    pub(super) replaces: Vec<String>,
    /// The token of the run whose records of its uploads are in the bucket (the run's own).
    #[serde(default)]
    pub(super) records: Option<String>,
    /// The tokens of the runs whose markers this run's supersedes (each run it cleared, the
    /// run it took the lock from, and those each of them superseded): a marker that names a
    /// run here is a successor's, which that run never removes; and of the markers found, the
    /// one no other supersedes is the last failed run's ([`Found::named`]).
    #[serde(default)]
    pub(super) carried: Vec<String>,
    /// The token of the run that took the lock over and sealed this marker ([`claim`]): it
    /// carries forward what the marker names as sealed, so the marker's own run, whose every
    /// write is made only over its own last bytes, can name nothing more in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) superseded_by: Option<String>,
}

/// A marker found at the output: its name there, the token of its run (`None`: an older
/// reshard's single marker that names none), what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Found {
    pub(super) name: String,
    pub(super) token: Option<String>,
    pub(super) marker: Marker,
}

impl Marker {
    fn bytes(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("a marker serializes")
    }

    /// Whether it names any object (an upload, or one of the output it replaces).
    pub(super) fn names_objects(&self) -> bool {
        !self.uploads.is_empty() || !self.replaces.is_empty()
    }

    /// Writes the marker at `target` as an older reshard did, at its single name, whatever is
    /// there (what an older run left, for the tests).
    #[cfg(test)]
    pub(super) fn write(&self, target: &Path) -> Result<()> {
        let marker = target.join(INCOMPLETE);
        storage::sink(&marker)
            .write(&marker, &self.bytes())
            .with_context(|| format!("{}: cannot write", marker.display()))
    }

    /// Writes the marker of the run `token` at `target` only over what this run wrote there
    /// (`over`: its bytes, or none): created only where none is (`If-None-Match: *`; its own
    /// first create sent again after its answer was lost finds its own bytes), else only while
    /// it still holds those bytes, and where the store can only over that very version
    /// (`If-Match`). No other run writes at its name; a successor removes it once it carried
    /// it forward, so a run that lost the lock cannot write it again. The bytes written, for
    /// the next write to be made over them.
    ///
    /// # Errors
    /// Another run removed the marker since (it took the lock over), or it cannot be written.
    pub(super) fn put(&self, target: &Path, token: &str, over: Option<&[u8]>) -> Result<Vec<u8>> {
        let path = target.join(name_of(token));
        let bytes = self.bytes();
        let sink = storage::sink(&path);
        let written = match over {
            None => match sink.create_new(&path, &bytes) {
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    Ok(storage::source(&path).read(&path).is_ok_and(|b| b == bytes))
                }
                r => r.map(|()| true),
            },
            Some(seen) => {
                match sink.update(&path, &mut |now| (now == seen).then(|| bytes.clone())) {
                    Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
                    r => r,
                }
            }
        }
        .with_context(|| format!("{}: cannot write", path.display()))?;
        match (written, over) {
            (true, _) => Ok(bytes),
            (false, None) => bail!(
                "{}: a marker this run did not write is at its name (another run took the output's lock over and sealed this run's): this run lost the lock and writes nothing more there",
                path.display()
            ),
            (false, Some(_)) => bail!(
                "{}: another run sealed or removed this run's marker since this run wrote it: this run lost the output's lock and writes nothing more there",
                path.display()
            ),
        }
    }

    /// The marker `bytes` hold; an older plain list of names is read as the names uploaded.
    pub(super) fn parse(bytes: &[u8]) -> Marker {
        let names = |v: Vec<String>| v.into_iter().filter(|n| is_own_name(n)).collect();
        let tokens = |v: Vec<String>| v.into_iter().filter(|t| records::is_token(t)).collect();
        match serde_json::from_slice::<Marker>(bytes) {
            Ok(m) => Marker {
                uploads: names(m.uploads),
                replaces: names(m.replaces),
                records: m.records.filter(|t| records::is_token(t)),
                carried: tokens(m.carried),
                superseded_by: m.superseded_by.filter(|t| records::is_token(t)),
            },
            Err(_) => Marker {
                uploads: names(
                    String::from_utf8_lossy(bytes)
                        .lines()
                        .map(String::from)
                        .collect(),
                ),
                ..Marker::default()
            },
        }
    }
}

impl Found {
    /// Every marker at the top of `target`, but this run's (`own`), sorted by name: one listing
    /// of the names that start with [`INCOMPLETE`] (on an object store only those are asked
    /// for, not the output's shards). One removed between the listing and its read was carried
    /// forward by the run that removed it: it is passed over.
    ///
    /// # Errors
    /// The output cannot be listed, or a marker cannot be read.
    pub(super) fn all(target: &Path, own: &str) -> Result<Vec<Found>> {
        let source = storage::source(target);
        let entries = match source.list_starting(target, INCOMPLETE) {
            Ok(entries) => entries,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("{}: cannot list", target.display())),
        };
        let mut names: Vec<String> = entries
            .into_iter()
            .filter(|e| e.kind == Kind::File)
            .filter_map(|e| e.name.to_str().map(str::to_string))
            .filter(|n| is_marker(n) && *n != name_of(own))
            .collect();
        names.sort();
        let mut out = Vec::new();
        for name in names {
            let path = target.join(&name);
            let bytes = match source.read(&path) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => {
                    return Err(e).with_context(|| format!("{}: cannot read", path.display()))
                }
            };
            let marker = Marker::parse(&bytes);
            let token = match name
                .strip_prefix(INCOMPLETE)
                .and_then(|t| t.strip_prefix('.'))
            {
                Some(t) => Some(t.to_string()),
                None => marker.records.clone(),
            };
            out.push(Found {
                name,
                token,
                marker,
            });
        }
        Ok(out)
    }

    /// The tokens the markers `found` supersede, with their own, and `from` (the run this one
    /// took the lock from): what this run's marker supersedes.
    pub(super) fn lineage(found: &[Found], from: Option<&str>) -> Vec<String> {
        let mut all: BTreeSet<String> = from.into_iter().map(str::to_string).collect();
        for f in found {
            all.extend(f.token.iter().cloned());
            all.extend(f.marker.carried.iter().cloned());
        }
        all.into_iter().collect()
    }

    /// The last failed run's token: that of the one marker of `found` that no other supersedes
    /// (none where several are left so, as a marker a run that lost the lock created late
    /// beside its successor's would be: no run is named then).
    pub(super) fn named(found: &[Found]) -> Option<String> {
        let carried: BTreeSet<&str> = found
            .iter()
            .flat_map(|f| f.marker.carried.iter().map(String::as_str))
            .collect();
        let mut heads = found
            .iter()
            .filter(|f| !f.token.as_deref().is_some_and(|t| carried.contains(t)));
        match (heads.next(), heads.next()) {
            (Some(head), None) => head.token.clone(),
            _ => None,
        }
    }
}

/// A name that stays under the output it is relative to.
pub(super) fn is_own_name(n: &str) -> bool {
    !n.is_empty() && !n.starts_with('/') && !n.split('/').any(|p| p == "..")
}

/// The run that clears what failed runs left: its token, the tokens its marker supersedes
/// ([`Found::lineage`], never its own), what lets it check that it still holds the lock, and
/// the bytes of its marker as [`claim`] created it (none: nothing was found to carry forward).
pub(super) struct Clearing<'a> {
    pub(super) token: &'a str,
    pub(super) lineage: Vec<String>,
    pub(super) fence: Option<&'a Fence>,
    pub(super) seen: Option<Vec<u8>>,
}

/// How many times a marker is sealed before the run gives up: each time after the first, its
/// run wrote it between this run's read and its write.
const SEALS: usize = 4;

/// The first step of a run that took the lock, before anything at the output is removed or
/// anything can fail: the markers of other runs listed; a run that finds one superseding it (a
/// successor's: it lost the lock while suspended) stops, as it does if its lock is gone; each
/// marker found sealed ([`seal`]), then this run's own marker created, naming every object the
/// sealed ones name and superseding their runs and `from` (the run it took the lock from), so
/// that a run that fails from here on is the one the next run names. Where nothing was found
/// and the lock was taken from none, nothing is written (a run refused next leaves nothing at
/// an output that may be a user's; `begin` creates the marker). The markers found, as sealed.
///
/// # Errors
/// A marker supersedes this run, the lock was lost, or a marker cannot be listed or written.
pub(super) fn claim<'a>(
    target: &Path,
    token: &'a str,
    from: Option<&str>,
    fence: Option<&'a Fence>,
) -> Result<(Vec<Found>, Clearing<'a>)> {
    let check = || fence.map_or(Ok(()), Fence::check_lock);
    let mut found = Found::all(target, token)?;
    if let Some(f) = found
        .iter()
        .find(|f| f.marker.carried.iter().any(|t| t == token))
    {
        bail!(
            "{}: this run lost the output's lock: run {}'s marker supersedes it; it writes nothing more there",
            target.display(),
            f.token.as_deref().unwrap_or("?")
        );
    }
    check()?;
    seal(target, &mut found, token)?;
    let mut lineage = Found::lineage(&found, from);
    lineage.retain(|t| t != token);
    let mut run = Clearing {
        token,
        lineage,
        fence,
        seen: None,
    };
    if found.is_empty() && run.lineage.is_empty() {
        return Ok((found, run));
    }
    let all = |names: &dyn Fn(&Marker) -> &Vec<String>| -> Vec<String> {
        let set: BTreeSet<&String> = found.iter().flat_map(|f| names(&f.marker)).collect();
        set.into_iter().cloned().collect()
    };
    let own = Marker {
        uploads: all(&|m| &m.uploads),
        replaces: all(&|m| &m.replaces),
        records: Some(token.to_string()),
        carried: run.lineage.clone(),
        superseded_by: None,
    };
    check()?; // right before the create: a run that lost the lock creates none late
    run.seen = Some(own.put(target, token, None)?);
    Ok((found, run))
}

/// Each marker `found` written over, as it is now, with `superseded_by` this run (over the
/// very version read, `If-Match` where the store can): its run, whose writes are made only over
/// its own last bytes ([`Marker::put`]), can name nothing more in it, and what this run carries
/// forward is what it sealed, a late write of that run included. `found` becomes what was
/// sealed; a marker removed meanwhile (by its run after its manifest) is left out.
///
/// # Errors
/// A marker cannot be written, or it changed each time.
pub(super) fn seal(target: &Path, found: &mut Vec<Found>, token: &str) -> Result<()> {
    let mut sealed = Vec::new();
    for mut f in found.drain(..) {
        let path = target.join(&f.name);
        let sink = storage::sink(&path);
        for attempt in 1..=SEALS {
            let mut now = None;
            let wrote = sink.update(&path, &mut |bytes| {
                let mut m = Marker::parse(bytes);
                m.superseded_by = Some(token.to_string());
                let b = m.bytes();
                now = Some(m);
                Some(b)
            });
            match wrote {
                Err(e) if e.kind() == ErrorKind::NotFound => break,
                Err(e) => return Err(e).with_context(|| format!("{}: cannot seal", path.display())),
                Ok(true) => {
                    f.marker = now.context("internal error: a sealed marker was read")?;
                    sealed.push(f);
                    break;
                }
                Ok(false) if attempt == SEALS => bail!(
                    "{}: changed each time this run sealed it ({SEALS} times): another run keeps writing it",
                    path.display()
                ),
                Ok(false) => {}
            }
        }
    }
    *found = sealed;
    Ok(())
}

/// What failed runs left at `target`, once [`claim`] sealed their markers (`found`) and
/// created this run's: unfinished multipart uploads aborted; where the markers are of failed
/// runs (`left`: no manifest there), the objects they name removed but for the shards of
/// `kept` (and their saved indexes), which `--resume` keeps; beside a manifest, those that
/// manifest does not name (what a run that published replaced and did not remove yet). Then
/// this run's marker written again (over what `claim` wrote) naming what stays, and only then
/// the sealed markers removed, each once the lock is checked. What this run's marker names,
/// and its bytes if it was written (its next write is made only over them, [`Marker::put`]).
///
/// # Errors
/// Something cannot be listed, removed or written, or the lock was lost.
pub(super) fn clean_up_failed_run(
    target: &Path,
    (found, left): (&[Found], bool),
    kept: &[String],
    run: &Clearing<'_>,
) -> Result<(Marker, Option<Vec<u8>>)> {
    let sink = storage::sink(target);
    check_lock(run)?; // a successor's uploads under way are never aborted by a lost run
    let aborted = sink.abort_unfinished(target).with_context(|| {
        format!(
            "{}: cannot abort the unfinished uploads of an earlier run",
            target.display()
        )
    })?;
    if aborted > 0 {
        crate::errln!("reshard: aborted {aborted} unfinished multipart upload(s) an earlier run left under {}", target.display());
    }
    fenced::remove_side_objects(target)?;
    if run.seen.is_none() {
        let own = Marker {
            records: Some(run.token.to_string()),
            ..Marker::default()
        };
        return Ok((own, None));
    }
    let (rest, written) = carry_forward(target, (found, left), kept, run)?;
    remove_superseded(target, found, run)?;
    Ok((rest, Some(written)))
}

/// [`clean_up_failed_run`] up to this run's marker: the failed runs' objects removed but for
/// those kept (beside a manifest, those it does not name), and this run's marker written again
/// over what [`claim`] wrote, naming what is left of them. What it names, and its bytes.
///
/// # Errors
/// As [`clean_up_failed_run`].
pub(super) fn carry_forward(
    target: &Path,
    (found, left): (&[Found], bool),
    kept: &[String],
    run: &Clearing<'_>,
) -> Result<(Marker, Vec<u8>)> {
    let union = |names: &dyn Fn(&Marker) -> &Vec<String>| -> BTreeSet<String> {
        found
            .iter()
            .flat_map(|f| names(&f.marker))
            .cloned()
            .collect()
    };
    let (uploads, replaces) = (union(&|m| &m.uploads), union(&|m| &m.replaces));
    let (stay, gone, replaces): (Vec<String>, Vec<String>, Vec<String>) = if left {
        let keeps = with_layouts(kept.iter().map(String::as_str));
        let (stay, gone) = uploads.into_iter().partition(|n| keeps.contains(n));
        (stay, gone, replaces.into_iter().collect())
    } else {
        // Beside a manifest: what it does not name of what a run uploaded or replaced is
        // reshard's and of no output (its run published and did not remove it yet); beside
        // one that cannot be read, nothing goes.
        let gone = match OutputManifest::parse(target) {
            Ok(manifest) => {
                let live = Written::of(Some(&manifest));
                let gone = uploads.union(&replaces).filter(|n| !live.includes(n));
                gone.cloned().collect()
            }
            Err(_) => Vec::new(),
        };
        (Vec::new(), gone, Vec::new())
    };
    let mut removed = 0;
    for name in &gone {
        let path = target.join(name);
        // Beside a manifest, the lock alone is checked (the manifest is there), and the
        // object removed only while it is the one looked at before.
        let was = match run.fence.filter(|_| !left) {
            Some(fence) => fenced::remove_after_publish(fence, &path, || ())?,
            None => fenced::remove(run.fence, &path)?,
        };
        removed += usize::from(was);
    }
    let rest = Marker {
        uploads: stay,
        replaces,
        records: Some(run.token.to_string()),
        carried: run.lineage.clone(),
        superseded_by: None,
    };
    check_lock(run)?;
    let written = rest.put(target, run.token, run.seen.as_deref())?;
    if removed > 0 {
        crate::errln!(
            "reshard: removed {removed} object(s) an earlier run uploaded to {} without publishing them",
            target.display()
        );
    }
    Ok((rest, written))
}

fn check_lock(run: &Clearing<'_>) -> Result<()> {
    run.fence.map_or(Ok(()), Fence::check_lock)
}

/// The markers `found` removed, now that this run sealed them and its own carries them
/// forward: each once the lock is checked, and never one that supersedes this run.
///
/// # Errors
/// The lock was lost, or a marker cannot be removed.
pub(super) fn remove_superseded(target: &Path, found: &[Found], run: &Clearing<'_>) -> Result<()> {
    for f in found {
        if f.marker.carried.iter().any(|t| t == run.token) {
            continue;
        }
        let lost = run.fence.map(|f| lost_by_token(&f.lock, &f.token));
        if let Some(why) = lost.transpose()?.flatten() {
            bail!(
                "{}: this run lost the output's lock ({why}) once it had cleared what failed runs left; it removes nothing more there (its own marker carries forward the markers it leaves)",
                target.display()
            );
        }
        crate::hooks::kill_at(0, "unmark-failed");
        let path = target.join(&f.name);
        super::remove_if_there(&path)
            .with_context(|| format!("{}: cannot remove", path.display()))?;
    }
    Ok(())
}

/// The marker of the run `token` at `target`, if there is one (for the tests).
#[cfg(test)]
pub(super) fn read_of(target: &Path, token: &str) -> Option<Marker> {
    let path = target.join(name_of(token));
    let bytes = storage::source(&path).read(&path).ok()?;
    Some(Marker::parse(&bytes))
}
