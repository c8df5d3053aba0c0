//! Loose objects under a prefix, for `--input-files s3://bucket/prefix/` ([`crate::tree`]): a
//! prefix listed once with each object's stamp (what `lstat` is on a file system), and many
//! small ranged GETs in flight at once, each answer checked against the listing (size and
//! ETag), so that an object replaced or removed since it was listed fails by name instead of
//! giving other bytes.

use std::io;
use std::path::Path;

use futures_util::{StreamExt, TryStreamExt};
use object_store::{GetOptions, GetRange, ObjectMeta};

use super::requests::{again, block_on, error};
use super::{count, stamp_of, Objects, GETS};
use crate::storage::FileStamp;

/// GETs of one batch in flight at once: small objects are latency-bound, so one rank keeps
/// this many requests under way (the exchange reads one window at a time per rank, so this
/// is also the bound per rank).
pub(crate) const IN_FLIGHT: usize = 32;

/// An object of a listing: its key relative to the listed prefix, and its stamp (size, last
/// modification, a hash of its ETag as identity).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listed {
    pub(crate) rel: String,
    pub(crate) stamp: FileStamp,
}

/// One GET of a batch: the object at `path`, its bytes `range`, and the stamp it was listed with.
pub(crate) struct Wanted<'a> {
    pub(crate) path: &'a Path,
    pub(crate) range: std::ops::Range<u64>,
    pub(crate) listed: FileStamp,
}

impl Objects {
    /// The objects under the prefix `path/`: all of them (`deep`, one flat listing, whatever the
    /// layout below), or only those directly in it (and then the names of the prefixes in it too).
    /// A folder marker some stores keep (an object named like a prefix, or whose key ends in `/`)
    /// is not an object of the tree.
    ///
    /// # Errors
    /// The listing fails (the bucket is missing, access is denied).
    pub(crate) fn list_objects(
        &self,
        path: &Path,
        deep: bool,
    ) -> io::Result<(Vec<Listed>, Vec<String>)> {
        let loc = self.parse(path)?;
        let store = loc.store()?;
        let prefix = loc.object()?;
        let (objects, prefixes): (Vec<ObjectMeta>, _) = if deep {
            let all = again(|| store.list(Some(&prefix)).try_collect());
            (block_on(all).map_err(|e| error(&loc, e))?, Vec::new())
        } else {
            let listed = block_on(again(|| store.list_with_delimiter(Some(&prefix))))
                .map_err(|e| error(&loc, e))?;
            (listed.objects, listed.common_prefixes)
        };
        let prefixes = prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_string))
            .collect();
        let base = if loc.key.is_empty() {
            String::new()
        } else {
            format!("{}/", loc.key)
        };
        let mut out: Vec<Listed> = objects
            .iter()
            .filter_map(|o| {
                let rel = o.location.as_ref().strip_prefix(base.as_str())?;
                (!rel.is_empty()).then(|| Listed {
                    rel: rel.to_string(),
                    stamp: stamp_of(o),
                })
            })
            .collect();
        out.sort_by(|a, b| a.rel.cmp(&b.rel));
        // A folder marker: an object whose name is another object's directory.
        let dirs: std::collections::HashSet<&str> = out
            .iter()
            .flat_map(|l| l.rel.match_indices('/').map(|(i, _)| &l.rel[..i]))
            .collect();
        let markers: Vec<bool> = out
            .iter()
            .map(|l| l.rel.ends_with('/') || dirs.contains(l.rel.as_str()))
            .collect();
        let mut keep = markers.iter().map(|m| !m);
        out.retain(|_| keep.next().unwrap_or(true));
        Ok((out, prefixes))
    }

    /// The bytes each of `wanted` asks for, in order, at most [`IN_FLIGHT`] GETs under way at once.
    /// Each answer is checked against the listing (the object's size and ETag, which every GET
    /// returns, ranged or not): an object changed, replaced or removed since it was listed is an
    /// error naming it.
    ///
    /// # Errors
    /// A GET that fails, or an object that is not the one listed.
    pub(crate) fn get_many(&self, wanted: &[Wanted<'_>]) -> io::Result<Vec<Vec<u8>>> {
        let requests = wanted.iter().map(|w| async move {
        let named = |what: String| io::Error::other(format!("{}: {what}", w.path.display()));
        let loc = self.parse(w.path)?;
        let store = loc.store()?;
        let key = loc.object()?;
        let options = GetOptions {
            range: Some(GetRange::Bounded(w.range.clone())),
            ..GetOptions::default()
        };
        let got = again(|| async {
            let got = store.get_opts(&key, options.clone()).await?;
            let meta = got.meta.clone();
            got.bytes().await.map(|b| (meta, b))
        })
        .await;
        let (meta, bytes) = match got {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(named(format!(
                    "it vanished since it was listed (an object of {} bytes): it changed during the run",
                    w.listed.size
                )))
            }
            Err(e) => return Err(named(error(&loc, e).to_string())),
        };
        count(&GETS, bytes.len());
        let now = stamp_of(&meta);
        if now.size != w.listed.size {
            return Err(named(format!(
                "it changed since it was listed: size {} -> {} bytes",
                w.listed.size, now.size
            )));
        }
        if now.identity != w.listed.identity {
            return Err(named(
                "it changed since it was listed: its ETag differs (replaced during the run)"
                    .into(),
            ));
        }
        if bytes.len() as u64 != w.range.end - w.range.start {
            return Err(named(format!(
                "read at byte {}: {} bytes came of {} asked: it changed during the run",
                w.range.start,
                bytes.len(),
                w.range.end - w.range.start
            )));
        }
        Ok::<_, io::Error>(bytes.to_vec())
    });
        block_on(
            futures_util::stream::iter(requests)
                .buffered(IN_FLIGHT)
                .try_collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(e_tag: &str) -> ObjectMeta {
        ObjectMeta {
            location: object_store::path::Path::from("p/a.jpg"),
            last_modified: Default::default(),
            size: 7,
            e_tag: Some(e_tag.to_string()),
            version: None,
        }
    }

    /// A listing's bare ETag and a GET's quoted one are the same object; another ETag is not.
    #[test]
    fn an_etag_listed_bare_and_read_quoted_is_one_object() {
        let listed = stamp_of(&meta("0x8DC0FFEE"));
        assert_eq!(listed, stamp_of(&meta("\"0x8DC0FFEE\"")));
        assert_ne!(listed.identity, stamp_of(&meta("\"0x8DBADBAD\"")).identity);
        assert_eq!((listed.size, listed.mtime_ns), (7, 0));
    }
}
