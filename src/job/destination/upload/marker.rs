//! The marker of an upload under way, in the bucket beside the objects of the output: what the
//! next run reads to know what a run that failed left there. Its first write is the run's first
//! write toward the output, in the steps before the commit (`ToBucket`'s `begin`: the run's
//! token, what it replaces, what a failed run left that `--resume` may keep); the upload phase
//! then adds the names it uploads. Each write is made only over what the run saw there, and on
//! a store with conditional writes only over that very version: a run that took the lock over
//! changes or removes the marker before anything else, so a run that lost the lock writes
//! nothing there any more. What a failed run left is cleared here too ([`clean_up_failed_run`]).

use std::io::ErrorKind;
use std::path::Path;

use anyhow::{bail, Context, Result};

use super::fenced::{self, Fence};
use super::{records, with_layouts};
use crate::storage;

/// The object that marks an upload under way ([`Marker`]): the names it uploads, so that the
/// next run can remove what a run that failed left, and those of the output `--force` replaces
/// (written before the run's staging begins, removed after the manifest).
pub(super) const INCOMPLETE: &str = ".reshard-incomplete";

/// What the marker of an upload under way names: the objects the run uploads (`uploads`,
/// removed by the next run when no manifest was written, but for those `--resume` keeps), and
/// the objects of the reshard output `--force` replaces (`replaces`: once its manifest is
/// removed, the marker is what still says they are reshard's, for the next run to remove).
#[derive(Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct Marker {
    pub(super) uploads: Vec<String>,
    #[serde(default)]
    pub(super) replaces: Vec<String>,
    /// The token of the run whose records of its uploads are in the bucket.
    #[serde(default)]
    pub(super) records: Option<String>,
}

impl Marker {
    fn bytes(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("a marker serializes")
    }

    /// Writes the marker at `target` whatever is there (what a failed run left, rewritten by
    /// the run holding the lock as it clears it).
    #[cfg(test)]
    pub(super) fn write(&self, target: &Path) -> Result<()> {
        let marker = target.join(INCOMPLETE);
        storage::sink(&marker)
            .write(&marker, &self.bytes())
            .with_context(|| format!("{}: cannot write", marker.display()))
    }

    /// Writes the marker at `target` only over what this run saw there (`over`: its bytes, or
    /// none): created only where none is then (`If-None-Match: *`), else only while it still
    /// holds those bytes, and where the store can only over the version read (`If-Match`).
    /// The bytes written, for the next write to be made over them.
    ///
    /// # Errors
    /// Another run wrote or removed the marker since (it took the lock over), or it cannot be
    /// written.
    pub(super) fn put(&self, target: &Path, over: Option<&[u8]>) -> Result<Vec<u8>> {
        let path = target.join(INCOMPLETE);
        let bytes = self.bytes();
        let sink = storage::sink(&path);
        let written = match over {
            None => match sink.create_new(&path, &bytes) {
                Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
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
        if !written {
            bail!(
                "{}: another run wrote or removed it since this run read it: this run lost the output's lock and writes nothing more there",
                path.display()
            );
        }
        Ok(bytes)
    }

    /// The bytes of the marker at `target` now, if there is one.
    ///
    /// # Errors
    /// It cannot be read.
    pub(super) fn seen(target: &Path) -> Result<Option<Vec<u8>>> {
        let path = target.join(INCOMPLETE);
        match storage::source(&path).read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("{}: cannot read", path.display())),
        }
    }

    /// The marker at `target`, if there is one; an older plain list of names is read as the
    /// names uploaded.
    #[cfg(test)]
    pub(super) fn read(target: &Path) -> Option<Marker> {
        let bytes = storage::source(target)
            .read(&target.join(INCOMPLETE))
            .ok()?;
        Some(Self::parse(&bytes))
    }

    /// The marker `bytes` hold ([`Marker::read`]).
    pub(super) fn parse(bytes: &[u8]) -> Marker {
        let names = |v: Vec<String>| v.into_iter().filter(|n| is_own_name(n)).collect();
        match serde_json::from_slice::<Marker>(bytes) {
            Ok(m) => Marker {
                uploads: names(m.uploads),
                replaces: names(m.replaces),
                records: m.records.filter(|t| records::is_token(t)),
            },
            Err(_) => Marker {
                uploads: names(
                    String::from_utf8_lossy(bytes)
                        .lines()
                        .map(String::from)
                        .collect(),
                ),
                replaces: Vec::new(),
                records: None,
            },
        }
    }
}

/// A name that stays under the output it is relative to.
pub(super) fn is_own_name(n: &str) -> bool {
    !n.is_empty() && !n.starts_with('/') && !n.split('/').any(|p| p == "..")
}

/// What a failed run left at `target`: unfinished multipart uploads aborted, and where it left
/// a marker and no manifest (`left`), the objects the marker names removed but for the shards
/// of `kept` (and their saved indexes), which `--resume` keeps. The marker then names only what
/// is left of it (the kept objects, and the objects of an output a failed `--force` run was
/// replacing), or nothing; that marker is returned when there was one, with the bytes at the
/// marker's name afterwards. `(left, seen)`: the failed run's marker, if it is one, and the
/// bytes it was read from (the marker is rewritten only over them, [`Marker::put`]: a run that
/// lost the lock while it cleared writes nothing there; where it names nothing more it is
/// removed, the lock checked right before, and `begin` then creates this run's only where none
/// is).
pub(super) fn clean_up_failed_run(
    target: &Path,
    (left, seen): (Option<Marker>, Option<Vec<u8>>),
    kept: &[String],
    fence: Option<&Fence>,
) -> Result<(Option<Marker>, Option<Vec<u8>>)> {
    let sink = storage::sink(target);
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
    let Some(marker) = left else {
        return Ok((None, seen));
    };
    let keeps = with_layouts(kept.iter().map(String::as_str));
    let (stay, gone): (Vec<String>, Vec<String>) =
        marker.uploads.into_iter().partition(|n| keeps.contains(n));
    let mut removed = 0;
    for name in &gone {
        if fenced::remove(fence, &target.join(name))? {
            removed += 1;
        }
    }
    let rest = Marker {
        records: fence.filter(|_| !stay.is_empty()).map(|f| f.token.clone()),
        uploads: stay,
        replaces: marker.replaces,
    };
    let written = if rest.uploads.is_empty() && rest.replaces.is_empty() {
        // Nothing left to name: it goes (`begin` then creates this run's only where none is).
        // No store here removes conditionally: the lock is checked right before.
        if let Some(fence) = fence {
            fence.check()?;
        }
        let path = target.join(INCOMPLETE);
        sink.remove_file(&path)
            .with_context(|| format!("{}: cannot remove", path.display()))?;
        None
    } else {
        Some(rest.put(target, seen.as_deref())?)
    };
    if !gone.is_empty() {
        crate::errln!(
            "reshard: removed {removed} object(s) an earlier run uploaded to {} without publishing them",
            target.display()
        );
    }
    Ok((Some(rest), written))
}
