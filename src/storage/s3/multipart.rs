//! Writing an object front to back: one PUT, or a multipart upload whose parts double in size,
//! journalled beside the object until it is completed or aborted.

use std::io;
use std::sync::Arc;

use object_store::multipart::PartId;
use object_store::path::Path as Key;
use object_store::MultipartId;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};

use super::requests::{again, block_on, creating_store, error};
use super::{count, Client, Location, PUTS};
use crate::storage::{Created, Writer};

/// The first part size of a multipart upload. S3 takes parts of 5 MiB to 5 GiB (the last one
/// smaller), at most 10,000 of them, and parts of one upload may differ in size: a stream does
/// not know its length up front, so its parts double every [`PARTS_PER_SIZE`] parts
/// ([`Upload::part_size`]); 10,000 parts then carry up to about 16 TiB.
pub(super) const PART: usize = 16 << 20;

/// How many parts of one size before the size doubles.
pub(super) const PARTS_PER_SIZE: usize = 1000;

/// The largest part: under S3's 5 GiB.
pub(super) const MAX_PART: usize = 4 << 30;

/// The folder, beside a multipart upload's object, of the journal objects that name unfinished
/// uploads: a run that died with the server (and could not abort) leaves its upload ids there
/// for the next run to abort ([`Sink::abort_unfinished`]).
pub(super) const JOURNAL: &str = ".reshard-multipart";

/// A new journal object for a multipart upload to `key`: `.reshard-multipart/NAME.SUFFIX`
/// beside it, `SUFFIX` unique to this upload ([`unique`]). Each upload has its own, so that no
/// other run (a late one that lost the lock, or its successor) writes over it or removes it.
pub(super) fn journal_of(key: &Key) -> Key {
    beside(key, JOURNAL, &format!("{}.{}", name_of(key), unique()))
}

/// The object a journal object `journal` speaks for: `NAME` of `.reshard-multipart/NAME.SUFFIX`
/// ([`journal_of`]), or of `.reshard-multipart/NAME`, the one journal per object earlier
/// versions wrote.
pub(super) fn object_of(journal: &Key) -> Option<Key> {
    let text = journal.as_ref();
    let (dir, name) = text
        .rsplit_once(&format!("/{JOURNAL}/"))
        .or_else(|| text.strip_prefix(&format!("{JOURNAL}/")).map(|n| ("", n)))?;
    let name = match name.rsplit_once('.') {
        Some((object, suffix)) if is_unique(suffix) => object,
        _ => name,
    };
    let path = if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    };
    Key::parse(path).ok()
}

/// A suffix unique to this process and moment, `PID-NANOS-N`: what tells one writer's journal
/// and side objects from every other's.
fn unique() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}-{nanos}-{n}", std::process::id())
}

/// Whether `suffix` is one [`unique`] makes: three numbers joined by `-`.
fn is_unique(suffix: &str) -> bool {
    let numbers: Vec<&str> = suffix.split('-').collect();
    numbers.len() == 3
        && numbers
            .iter()
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The last part of `key`'s name.
fn name_of(key: &Key) -> &str {
    let text = key.as_ref();
    text.rsplit_once('/').map_or(text, |(_, name)| name)
}

/// `name` in the folder `folder` beside `key`.
fn beside(key: &Key, folder: &str, name: &str) -> Key {
    let path = match key.as_ref().rsplit_once('/') {
        Some((dir, _)) => format!("{dir}/{folder}/{name}"),
        None => format!("{folder}/{name}"),
    };
    Key::from(path.as_str())
}

/// An object written front to back: one PUT when it stays under a part, else a multipart
/// upload whose parts go out as they fill, its id in a journal object until it is completed or
/// aborted. Dropped unfinished, its upload is aborted, so no parts are left behind to be billed.
pub(super) struct Upload {
    pub(super) store: Arc<dyn Client>,
    pub(super) loc: Location,
    pub(super) key: Key,
    pub(super) buf: Vec<u8>,
    /// The multipart upload's id, its parts so far, and its journal ([`journal_of`]).
    pub(super) upload: Option<(MultipartId, Vec<PartId>, Key)>,
    pub(super) written: u64,
    /// Whether the object is only created, never put over another ([`Sink::create_stream_new`]):
    /// the PUT and the completion carry the store's create-only condition.
    ///
    /// [`Sink::create_stream_new`]: crate::storage::Sink::create_stream_new
    pub(super) create_only: bool,
    /// Where a create-only multipart upload goes on a store that cannot complete one
    /// conditionally (Azure: its completion is signed without the client's extra headers): a
    /// name of this writer's own under [`SIDE`] beside the object, completed there and then
    /// copied to the object only if nothing is there (the store's conditional copy).
    pub(super) side: Option<Key>,
}

/// The folder, beside an object, of the side objects of create-only multipart uploads
/// ([`Upload::side`]); a run that holds the output's lock removes what an earlier run left there.
pub(crate) const SIDE: &str = ".reshard-creating";

/// A side name for a create-only multipart upload to `key` ([`Upload::side`]): unique to this
/// process and moment, so that no other writer's upload goes there.
pub(super) fn side_of(key: &Key) -> Key {
    beside(key, SIDE, &format!("{}.{}", name_of(key), unique()))
}

impl Upload {
    /// The size of the part after `sent` parts.
    fn part_size(sent: usize) -> usize {
        let doublings = u32::try_from(sent / PARTS_PER_SIZE).unwrap_or(u32::MAX);
        PART.checked_shl(doublings)
            .unwrap_or(MAX_PART)
            .min(MAX_PART)
    }

    /// The key the multipart upload goes to: the object's, or its side name.
    fn upload_key(&self) -> &Key {
        self.side.as_ref().unwrap_or(&self.key)
    }

    fn sent(&self) -> usize {
        self.upload.as_ref().map_or(0, |u| u.1.len())
    }

    /// Starts the multipart upload, journalled in a journal of its own: first the intent (an
    /// empty journal: an upload to this key may have been started), then the upload, then its
    /// id in the journal. The next run finds the upload of a run that died between the two by
    /// its key ([`maybe_ours`]). The upload's id and its journal.
    fn start(&self) -> object_store::Result<(MultipartId, Key)> {
        block_on(async {
            let key = self.upload_key();
            let journal = journal_of(key);
            self.store.put(&journal, PutPayload::new()).await?;
            let id = self.store.create_multipart(key).await?;
            crate::hooks::kill_in_multipart(|| {
                crate::comm::launcher::launcher_rank(|k| std::env::var(k).ok())
            });
            let named = PutPayload::from(id.clone().into_bytes());
            self.store.put(&journal, named).await?;
            Ok((id, journal))
        })
    }

    /// Sends the first `n` bytes of the buffer as the next part.
    fn send_part(&mut self, n: usize) -> io::Result<()> {
        if self.upload.is_none() {
            let (id, journal) = self.start().map_err(|e| error(&self.loc, e))?;
            self.upload = Some((id, Vec::new(), journal));
        }
        let rest = self.buf.split_off(n);
        let data = PutPayload::from(std::mem::replace(&mut self.buf, rest));
        count(&PUTS, data.content_length());
        let (id, parts, _) = self.upload.as_mut().expect("started above");
        let key = self.side.as_ref().unwrap_or(&self.key);
        let part = block_on(again(|| {
            self.store.put_part(key, id, parts.len(), data.clone())
        }));
        parts.push(part.map_err(|e| error(&self.loc, e))?);
        Ok(())
    }
}

impl io::Write for Upload {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        self.written += data.len() as u64;
        while self.buf.len() >= Upload::part_size(self.sent()) {
            self.send_part(Upload::part_size(self.sent()))?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Writer for Upload {
    fn finish(self: Box<Self>) -> io::Result<u64> {
        self.finish_created().map(|c| c.size)
    }

    fn finish_created(mut self: Box<Self>) -> io::Result<Created> {
        if self.upload.is_none() {
            let payload = PutPayload::from(std::mem::take(&mut self.buf));
            count(&PUTS, payload.content_length());
            let mode = if self.create_only {
                PutMode::Create
            } else {
                PutMode::Overwrite
            };
            let put = || {
                let opts = PutOptions::from(mode.clone());
                self.store.put_opts(&self.key, payload.clone(), opts)
            };
            // Sent again only when a broken-off create may be: its second sending finds the
            // first one's object, and says so (`AlreadyExists`) rather than replace anything.
            let done = block_on(again(put)).map_err(|e| self.failed(e))?;
            return Ok(self.created(done.e_tag));
        }
        if !self.buf.is_empty() {
            self.send_part(self.buf.len())?;
        }
        let (id, parts, journal) = self.upload.take().expect("a multipart upload");
        let completing = if self.create_only && self.side.is_none() {
            creating_store(self.loc.scheme, &self.loc.bucket)?
        } else {
            Arc::clone(&self.store)
        };
        let key = self.upload_key().clone();
        let done = block_on(async {
            let done = completing.complete_multipart(&key, &id, parts).await?;
            self.store.delete(&journal).await?;
            Ok(done)
        });
        let done = match done {
            Ok(done) => done,
            Err(e) => {
                abort(&*self.store, &key, &id, &journal);
                return Err(self.failed(e));
            }
        };
        let Some(side) = &self.side else {
            return Ok(self.created(done.e_tag));
        };
        // Completed at its side name: copied to the object only if nothing is there.
        let copied = block_on(async {
            let copied = self.store.copy_if_not_exists(side, &self.key).await;
            let _ = self.store.delete(side).await;
            copied?;
            self.store.head(&self.key).await
        });
        let meta = copied.map_err(|e| self.failed(e))?;
        Ok(self.created(meta.e_tag))
    }
}

impl Upload {
    fn created(&self, e_tag: Option<String>) -> Created {
        Created {
            size: self.written,
            e_tag,
        }
    }

    /// The error of a failed PUT or completion: for a create-only one, an object that was
    /// there already (the store's `412 Precondition Failed`) is `AlreadyExists`, and a store
    /// without the condition says what reshard needs.
    fn failed(&self, e: object_store::Error) -> io::Error {
        use object_store::Error as E;
        match e {
            E::Precondition { .. } | E::AlreadyExists { .. } if self.create_only => io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists already: another writer created it", self.loc.url()),
            ),
            E::NotImplemented { .. } if self.create_only => io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{}: the store has no conditional writes ({}); reshard writes every object of an output only if nothing is at its name (If-None-Match: *), so that a run that lost the output's lock cannot overwrite it: use a store that has them (AWS S3 and SeaweedFS do)",
                    self.loc.url(),
                    e
                ),
            ),
            e => error(&self.loc, e),
        }
    }
}

/// Aborts the multipart upload `id` of `key` and removes its `journal`; quietly, on a failure
/// path (an abort that fails leaves the journal for the next run).
pub(super) fn abort(store: &dyn Client, key: &Key, id: &MultipartId, journal: &Key) {
    let _ = block_on(async {
        store.abort_multipart(key, id).await?;
        store.delete(journal).await
    });
}

/// How much earlier than its journal's intent an upload of the journal's key may say it was
/// started and still be taken for the journal's. Both times are the store's (the journal's
/// LastModified, the upload's Initiated), but a distributed store stamps them on whichever of
/// its servers took each request, each with its own clock, and LastModified is often cut to the
/// second. S3's own requests may be 15 minutes off the server's clock, so an S3-compatible
/// store's servers a few minutes apart are within what it allows. An upload started more than
/// this before the intent was journalled is not this run's, and stays.
pub(super) const CLOCK_SKEW: std::time::Duration = std::time::Duration::from_secs(5 * 60);

/// Of the open uploads of a journal's key, those the run that journalled its intent at
/// `intent` (the journal's LastModified) may have started and died before it named: those
/// started no earlier than the intent, less [`CLOCK_SKEW`].
pub(super) fn maybe_ours(
    open: Vec<super::uploads::Open>,
    intent: chrono::DateTime<chrono::Utc>,
) -> Vec<super::uploads::Open> {
    let skew = chrono::Duration::from_std(CLOCK_SKEW).unwrap_or_default();
    open.into_iter()
        .filter(|u| u.initiated >= intent - skew)
        .collect()
}

impl Drop for Upload {
    fn drop(&mut self) {
        if let Some((id, _, journal)) = self.upload.take() {
            // Unfinished: its parts would stay (and be billed) until aborted.
            let key = self.upload_key().clone();
            abort(&*self.store, &key, &id, &journal);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each upload has a journal of its own beside its object, which names the object; so
    /// does the one journal per object of earlier versions (no suffix).
    #[test]
    fn journals_are_each_uploads_own_and_name_their_objects() {
        for key in [
            "out/x/shard-000001.tar",
            "shard.tar",
            "a/b/c/d",
            "out/x.1-2",
        ] {
            let key = Key::parse(key).unwrap();
            let journal = journal_of(&key);
            let (dir, name) = key.as_ref().rsplit_once('/').unwrap_or(("", key.as_ref()));
            let folder = if dir.is_empty() {
                format!("{JOURNAL}/{name}.")
            } else {
                format!("{dir}/{JOURNAL}/{name}.")
            };
            assert!(journal.as_ref().starts_with(&folder), "{journal}");
            assert_ne!(journal, journal_of(&key), "another upload's journal");
            assert_eq!(object_of(&journal), Some(key.clone()));
            let old = Key::from(folder.trim_end_matches('.'));
            assert_eq!(object_of(&old), Some(key), "{old}");
        }
        let parsed = |j: &str| object_of(&Key::parse(j).unwrap()).map(|k| k.to_string());
        let some = |k: &str| Some(k.to_string());
        assert_eq!(
            parsed("out/.reshard-multipart/a.tar.42-1764395400000000000-7"),
            some("out/a.tar")
        );
        assert_eq!(parsed("out/.reshard-multipart/a.tar"), some("out/a.tar"));
        assert_eq!(parsed("out/.reshard-multipart/a.1-2"), some("out/a.1-2"));
        assert_eq!(parsed("out/.reshard-multipart/a.1--2"), some("out/a.1--2"));
        assert_eq!(parsed(".reshard-multipart/a.1-2-3"), some("a"));
        assert_eq!(parsed("out/x/shard.tar"), None);
        // Side names are each writer's own too.
        let key = Key::parse("out/shard.tar").unwrap();
        assert_ne!(side_of(&key), side_of(&key));
        assert!(side_of(&key)
            .as_ref()
            .starts_with("out/.reshard-creating/shard.tar."));
    }

    #[test]
    fn an_intents_uploads_are_those_started_after_it_within_the_clock_skew() {
        use super::super::uploads::Open;
        let at = |s: &str| {
            chrono::DateTime::parse_from_rfc3339(s)
                .unwrap()
                .with_timezone(&chrono::Utc)
        };
        let open = |id: &str, t: &str| Open {
            id: id.into(),
            initiated: at(t),
        };
        let intent = at("2026-11-29T05:00:00Z");
        let all = vec![
            open("user-an-hour-before", "2026-11-29T04:00:00Z"),
            open("user-6-min-before", "2026-11-29T04:54:00Z"),
            open("skewed-4-min-before", "2026-11-29T04:56:00Z"),
            open("same-second", "2026-11-29T05:00:00Z"),
            open("after", "2026-11-29T05:00:01.250Z"),
        ];
        let ids: Vec<String> = maybe_ours(all, intent).into_iter().map(|u| u.id).collect();
        assert_eq!(ids, ["skewed-4-min-before", "same-second", "after"]);
    }

    #[test]
    fn parts_respect_the_stores_limits() {
        assert_eq!(Upload::part_size(0), PART);
        const { assert!(PART >= 5 << 20) };
        // 10,000 parts carry more than 10 TiB; no part exceeds 5 GiB.
        let total: u64 = (0..10_000).map(|i| Upload::part_size(i) as u64).sum();
        assert!(total > 10 << 40, "{total}");
        assert!((0..10_000).all(|i| Upload::part_size(i) <= 5 << 30));
    }
}
