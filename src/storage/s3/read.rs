//! Ranged reads of an object: the window each GET fetches, and the windows requested ahead of
//! the reader within a budget per process.

use std::any::Any;
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use object_store::path::Path as Key;
use object_store::{GetOptions, GetRange, ObjectMeta};

use super::requests::{again, block_on, error, runtime};
use super::{count, stamp_of, Client, Location, GETS};
use crate::storage::{FileStamp, Input};

/// How much one ranged GET fetches at least: the tar header walk reads 512 bytes per member,
/// and a request per member would cost a round trip per sample. With this window, indexing a
/// shard of small samples streams it once in 8 MiB requests; a sample larger than the window
/// costs one request of its own.
pub(super) const READ_AHEAD: usize = 8 << 20;

/// The window of an object's first read: small, as that read may be the only one.
pub(super) const FIRST_WINDOW: usize = 64 << 10;

/// How many windows an open object requests ahead of the one being read, at most: a stream of
/// one GET at a time waits a round trip and a server's first byte per window; a few in flight
/// keep the connection busy.
pub(super) const AHEAD_WINDOWS: usize = 4;

/// The bytes of windows requested ahead in one process (one rank), over every open object:
/// the index phase streams up to 32 shards at once, and their read-ahead together stays within
/// this. Not part of `--mem-limit`, as the one window per open object is not.
pub(super) const AHEAD_BUDGET: usize = 64 << 20;

/// The bytes of the last read-ahead: `data` from `start`.
#[derive(Default)]
pub(super) struct Window {
    start: u64,
    data: Vec<u8>,
}

impl Window {
    fn holds(&self, offset: u64) -> bool {
        offset >= self.start && offset < self.start + self.data.len() as u64
    }
}

/// The windows of one open object: the one being read, and the next ones, requested ahead.
#[derive(Default)]
pub(super) struct Ahead {
    window: Window,
    /// Whether a second window was needed: until then nothing is requested ahead.
    streaming: bool,
    /// Each starting where the one before it ends, the first where `window` ends.
    queue: VecDeque<Pending>,
}

/// A window requested ahead: its range, the request under way, and its share of the
/// process's read-ahead budget, given back when it becomes the window being read or is dropped.
pub(super) struct Pending {
    range: std::ops::Range<u64>,
    task: tokio::task::JoinHandle<object_store::Result<Vec<u8>>>,
    _reserved: Reserved,
}

impl Drop for Pending {
    fn drop(&mut self) {
        // Not read (a jump elsewhere, or the object closed): the request is of no use.
        self.task.abort();
    }
}

/// Bytes of the read-ahead budget ([`AHEAD_BUDGET`]) held.
pub(super) struct Reserved(usize);

/// Bytes of every open object's windows requested ahead, in this process.
pub(super) static AHEAD_HELD: AtomicUsize = AtomicUsize::new(0);

impl Reserved {
    /// `n` bytes of the budget, if that many are free.
    fn take(n: usize) -> Option<Reserved> {
        AHEAD_HELD
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held + n <= AHEAD_BUDGET).then_some(held + n)
            })
            .ok()
            .map(|_| Reserved(n))
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        AHEAD_HELD.fetch_sub(self.0, Ordering::AcqRel);
    }
}

/// An object open for ranged reads: the version seen when it was opened (every GET carries
/// `If-Match` with its ETag, so a replaced object fails the read instead of mixing versions).
pub(super) struct ObjectInput {
    pub(super) store: Arc<dyn Client>,
    pub(super) loc: Location,
    pub(super) key: Key,
    pub(super) meta: ObjectMeta,
    pub(super) ahead: Mutex<Ahead>,
}

impl ObjectInput {
    /// The request for the bytes `range` of the object, one GET, not yet under way.
    fn request(
        &self,
        range: std::ops::Range<u64>,
    ) -> impl Future<Output = object_store::Result<Vec<u8>>> + Send + 'static {
        let options = GetOptions {
            if_match: self.meta.e_tag.clone(),
            range: Some(GetRange::Bounded(range)),
            ..GetOptions::default()
        };
        let (store, key) = (self.store.clone(), self.key.clone());
        async move {
            let got =
                again(|| async { store.get_opts(&key, options.clone()).await?.bytes().await })
                    .await?;
            count(&GETS, got.len());
            Ok(got.to_vec())
        }
    }

    /// The bytes `from..to` of the object: one GET per [`READ_AHEAD`] bytes, all in flight at
    /// once.
    fn fetch(&self, from: u64, to: u64) -> io::Result<Vec<u8>> {
        let step = READ_AHEAD as u64;
        let parts: Vec<_> = (from..to)
            .step_by(READ_AHEAD)
            .map(|at| self.request(at..(at + step).min(to)))
            .collect();
        let got = block_on(futures_util::future::try_join_all(parts));
        got.map(|parts| parts.concat())
            .map_err(|e| error(&self.loc, e))
    }

    /// The window that holds `offset`: the current one, the next one requested ahead (the
    /// stream goes on), or else (a jump) one fetched now, with what was requested ahead dropped.
    fn seek(&self, ahead: &mut Ahead, offset: u64) -> io::Result<()> {
        if ahead.window.holds(offset) {
            return Ok(());
        }
        while let Some(next) = ahead.queue.pop_front() {
            if !next.range.contains(&offset) {
                continue;
            }
            let start = next.range.start;
            let mut next = next;
            let got = block_on(&mut next.task)
                .map_err(|e| io::Error::other(format!("{}: {e}", self.loc.url())))?;
            ahead.window = Window {
                start,
                data: got.map_err(|e| error(&self.loc, e))?,
            };
            return Ok(());
        }
        // The first read of an object may be its only one (telling a shard's codec from its
        // first bytes, before or after the data is read elsewhere): a small window, and a
        // stream, with windows requested ahead, from the second on.
        let first = ahead.window.data.is_empty() && !ahead.streaming;
        ahead.streaming = !first;
        let len = if first { FIRST_WINDOW } else { READ_AHEAD };
        let to = (offset + len as u64).min(self.meta.size);
        ahead.window = Window {
            start: offset,
            data: self.fetch(offset, to)?,
        };
        Ok(())
    }

    /// Requests the windows after the ones held, up to [`AHEAD_WINDOWS`] of them, while the
    /// process's read-ahead budget has room: a stream then waits for one request's latency
    /// only at its start, not at every window.
    fn top_up(&self, ahead: &mut Ahead) {
        if !ahead.streaming {
            return;
        }
        let window_end = ahead.window.start + ahead.window.data.len() as u64;
        let mut next = ahead.queue.back().map_or(window_end, |p| p.range.end);
        while ahead.queue.len() < AHEAD_WINDOWS && next < self.meta.size {
            let end = (next + READ_AHEAD as u64).min(self.meta.size);
            let Some(reserved) = Reserved::take((end - next) as usize) else {
                return;
            };
            ahead.queue.push_back(Pending {
                range: next..end,
                task: runtime().spawn(self.request(next..end)),
                _reserved: reserved,
            });
            next = end;
        }
    }
}

impl Input for ObjectInput {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let size = self.meta.size;
        if offset >= size || buf.is_empty() {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(size - offset).unwrap_or(usize::MAX));
        let mut ahead = self.ahead.lock().unwrap_or_else(|e| e.into_inner());
        let streaming = ahead.window.holds(offset)
            || ahead
                .queue
                .front()
                .is_some_and(|p| p.range.contains(&offset));
        if want >= READ_AHEAD && !streaming {
            // A large read elsewhere (a large sample, a chunk) goes straight into the caller's
            // buffer, its GETs in flight at once.
            drop(ahead);
            let data = self.fetch(offset, offset + want as u64)?;
            buf[..data.len()].copy_from_slice(&data);
            return Ok(data.len());
        }
        self.seek(&mut ahead, offset)?;
        self.top_up(&mut ahead);
        let window = &ahead.window;
        let from = usize::try_from(offset - window.start).unwrap_or(usize::MAX);
        // Up to the window's end: the caller reads on ([`super::read_up_to_at`]) from the next.
        let n = want.min(window.data.len().saturating_sub(from));
        buf[..n].copy_from_slice(&window.data[from..from + n]);
        Ok(n)
    }

    fn stamp(&self) -> io::Result<FileStamp> {
        Ok(stamp_of(&self.meta))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
