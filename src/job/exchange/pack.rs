//! The reader thread: packs each round's send buffer, in input order, per destination.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, SyncSender};

use anyhow::{anyhow, Context, Result};

use super::reader::{InputReader, DIRECT};
use super::stages::{Packed, Stages, Work, CHUNK_HEADER};
use crate::comm::wire::{ChunkHeader, Wire};
use crate::input::InputShard;
use crate::plan::placement::LocalSample;
use crate::storage::{self, Input, Reads};
use crate::tar::check::{check_sample_at, check_sample_bytes};
use crate::tar::codec::stream_name;
use crate::tar::headers::{expect_header, BLOCK};
use crate::tar::Codec;

/// The reader thread: packs rounds in input order until the samples run out or a read fails.
pub(super) fn pack_rounds(
    st: &Stages<'_, '_>,
    cap: usize,
    ranks: usize,
    read_window: usize,
    free_send: Receiver<Vec<u8>>,
    packed: SyncSender<Packed>,
) {
    let (job, me, written) = (st.job, st.me, &st.written);
    let mut reader = InputReader::new(job.inputs, read_window, job.unread);
    let mut cursor = Cursor::default();
    while cursor.sample < job.local.len() {
        let Ok(mut buf) = free_send.recv() else {
            return;
        };
        let mut used = vec![0usize; ranks];
        let busy = std::time::Instant::now();
        let filled = fill(job, me, &mut cursor, &mut reader, &mut buf, cap, &mut used);
        st.read_nanos
            .fetch_add(busy.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let (payload, error) = match filled {
            Ok(f) => {
                written.fetch_add(f.copied, Ordering::Relaxed);
                (f.packed + f.copied, None)
            }
            Err(e) => (0, Some(e)),
        };
        let stop = error.is_some();
        if packed
            .send(Packed {
                buf,
                used,
                payload,
                through: cursor.sample,
                error,
                packing: busy..std::time::Instant::now(),
            })
            .is_err()
            || stop
        {
            return;
        }
    }
    // Every sample packed: the compressed streams no phase has read to their end yet.
    if let Err(e) = reader.finish() {
        let _ = packed.send(Packed {
            buf: Vec::new(),
            used: vec![0; ranks],
            payload: 0,
            through: cursor.sample,
            error: Some(e),
            packing: std::time::Instant::now()..std::time::Instant::now(),
        });
    }
}

/// Where the sender is in its sample list: sample index, which of its output positions, and
/// bytes of that copy already sent.
#[derive(Debug, Default)]
struct Cursor {
    sample: usize,
    copy: usize,
    offset: u64,
}

impl Cursor {
    fn next_copy(&mut self) {
        self.copy += 1;
        self.offset = 0;
    }

    fn next_sample(&mut self) {
        *self = Cursor {
            sample: self.sample + 1,
            copy: 0,
            offset: 0,
        };
    }
}

/// What one `fill` did: sample bytes packed for other ranks, and copied straight into this
/// rank's own shards.
#[derive(Debug, Default, Clone, Copy)]
struct Filled {
    packed: u64,
    copied: u64,
}

/// Packs samples, in input order, into the per-destination segments of `send` until the next
/// chunk's destination is full. Large samples of plain inputs that this rank writes itself are
/// copied from input to output at once, inside the kernel; a round stops after a buffer's worth
/// of them too, so that rounds (and progress reports) stay regular. Its other own samples go
/// into its own segment, which never leaves the rank, for the writer to place with the round.
fn fill(
    job: &Work<'_>,
    me: usize,
    cursor: &mut Cursor,
    reader: &mut InputReader<'_>,
    send: &mut [u8],
    cap: usize,
    used: &mut [usize],
) -> Result<Filled> {
    let mut done = Filled::default();
    while let Some(s) = job.local.get(cursor.sample) {
        if cursor.copy == 0 && cursor.offset == 0 {
            // Placed by an earlier attempt (`--resume`): skip the whole run, unread.
            if let Some(end) = job.done.done_until(job.first_global + cursor.sample as u64) {
                let end = usize::try_from(end - job.first_global).unwrap_or(usize::MAX);
                *cursor = Cursor {
                    sample: end.min(job.local.len()),
                    copy: 0,
                    offset: 0,
                };
                continue;
            }
        }
        let Some(position) = job.placement.position(cursor.sample, cursor.copy) else {
            cursor.next_sample();
            continue;
        };
        let shard = job.plan.shard_of(position);
        let dest = job.plan.writer_of(shard);
        // Only a sample that fits in a round: a round moves about a buffer's worth, which
        // keeps it within the stall timeout under a rate limit (`Buffers::within_stall`).
        let saved = job.unread.binary_search(&(s.shard as usize)).is_ok();
        let remote_saved = saved && !storage::is_file_system(&job.inputs[s.shard as usize].path);
        if dest == me
            && s.len <= send.len() as u64
            && in_kernel(reader, s, used.len(), remote_saved)?
        {
            if done.copied >= send.len() as u64 {
                break;
            }
            let (at, _) = job.layout.place(position).with_context(|| {
                format!("internal error: position {position} is not laid out on rank {me}")
            })?;
            // A copy to this rank's own shards is whole: it never starts mid-sample.
            debug_assert_eq!(cursor.offset, 0);
            let n = copy_own(job, reader, s, shard, at)?;
            done.copied += n;
            cursor.next_copy();
            continue;
        }
        let room = cap - used[dest];
        // A sample's first chunk holds its first block, which is checked (when a segment can).
        let first = cursor.offset == 0 && cap >= CHUNK_HEADER + BLOCK as usize;
        let need = if first { BLOCK.min(s.len) as usize } else { 1 };
        if room < CHUNK_HEADER + need {
            break;
        }
        let n = (s.len - cursor.offset).min((room - CHUNK_HEADER) as u64);
        let at = dest * cap + used[dest];
        let header = ChunkHeader {
            position,
            offset: cursor.offset,
            len: n,
        };
        header.encode(&mut send[at..at + CHUNK_HEADER]);
        let body = &mut send[at + CHUNK_HEADER..at + CHUNK_HEADER + n as usize];
        let from = s.start + cursor.offset;
        if n < DIRECT && !reader.reaches(s.shard as usize, from) {
            let end = window_end(job.local, cursor.sample, reader.window_len());
            reader.reach(s.shard as usize, end);
        }
        reader.read(s.shard as usize, s.start + cursor.offset, body)?;
        let (file, codec) = reader.file(s.shard as usize)?;
        // At 200,000 loose files of 8 KiB, walking the headers a view had just made was 10% of
        // a run's user time.
        if cursor.offset == 0 && !file.checks_itself() {
            let input = &job.inputs[s.shard as usize];
            if n == s.len {
                // The whole sample in memory: its structure is checked, at no extra read.
                check_sample_bytes(body, s.start)
                    .map_err(|e| not_a_sample(e, input, codec, saved))?;
            } else {
                check_first_block(body, input, codec, s.start)?;
            }
        }
        used[dest] += CHUNK_HEADER + n as usize;
        done.packed += n;
        cursor.offset += n;
        if cursor.offset == s.len {
            cursor.next_copy();
        }
    }
    Ok(done)
}

/// Where a read window filled for the sample `local[from]` should end: after the run of
/// samples from it on, in its shard, that are read through the window (smaller than
/// [`DIRECT`]) and fit into `window` bytes together.
fn window_end(local: &[LocalSample], from: usize, window: usize) -> u64 {
    let first = &local[from];
    let mut end = first.start + first.len;
    for s in &local[from + 1..] {
        let s_end = s.start + s.len;
        if s.shard != first.shard || s.len >= DIRECT || s_end - first.start > window as u64 {
            break;
        }
        end = s_end;
    }
    end
}

/// Reads the first block of the sample at `start` of the plain shard `file` (`len` bytes long)
/// into `head`: how many bytes that is (a sample is at least one block).
fn read_head(
    file: &dyn Input,
    path: &std::path::Path,
    start: u64,
    len: u64,
    head: &mut [u8; BLOCK as usize],
) -> Result<usize> {
    let want = len.min(BLOCK) as usize;
    let got = storage::read_up_to_at(file, &mut head[..want], start)
        .with_context(|| format!("{}: cannot read at byte offset {start}", path.display()))?;
    if got < want {
        return Err(anyhow!(
            "{}: byte offset {}: expected sample data, found the end of the file (did it change during the run?)",
            path.display(),
            start + got as u64
        ));
    }
    Ok(got)
}

/// Checks that a sample's bytes, `data` read from `start` of `input`, start with a tar header,
/// as they did when the shard was indexed: a shard rewritten in place during the run must fail
/// here, naming file and offset, rather than have whatever bytes are there copied. One block
/// already in memory per sample: no extra read. Shorter `data` (a segment too small to hold a
/// block) is not checked.
fn check_first_block(data: &[u8], input: &InputShard, codec: Codec, start: u64) -> Result<()> {
    let Some(block) = data.get(..BLOCK as usize) else {
        return Ok(());
    };
    let block: &[u8; BLOCK as usize] = block.try_into().expect("one block");
    expect_header(block, start).map_err(|e| {
        anyhow!(
            "{}: {e:#}, where the index found a sample's first header: the input changed during the run, so its samples cannot be trusted; nothing is published",
            stream_name(&input.path, codec)
        )
    })
}

/// The error for a range the index gave that is not a whole sample ([`check_sample_bytes`]):
/// the saved index is wrong (`saved`), or the input changed during the run.
fn not_a_sample(e: anyhow::Error, input: &InputShard, codec: Codec, saved: bool) -> anyhow::Error {
    let name = stream_name(&input.path, codec);
    if saved {
        anyhow!(
            "{name}: {e:#}, in a sample whose place its saved index (.reshard/NAME.reshard-layout) gives: that index does not describe the shard (damaged, or the shard was rewritten keeping its size and modification time); nothing is published. Remove the saved index to have the shard's headers read"
        )
    } else {
        anyhow!(
            "{name}: {e:#}, in a sample the index found: the input changed during the run, so its samples cannot be trusted; nothing is published"
        )
    }
}

/// Own samples at least this large (of plain inputs) are copied input → output inside the
/// kernel: one system call and no user-space copy each. With several ranks, smaller ones go
/// through the read window (which reads nearly every byte anyway, for the other ranks) and the
/// own segment, and the writer places them in output order with the rest of the round: on
/// tmpfs, np=2, 524,288 samples of ~7 KiB, user + system CPU 7.1-7.2 s against 7.5-7.6 s.
const IN_KERNEL: u64 = 64 << 10;

/// Whether the own sample `s` is copied inside the kernel ([`IN_KERNEL`]). Alone, a rank copies
/// every sample of a plain input so: its window would be a second read of all its input (on
/// tmpfs, np=1, 4 KiB samples: 5.9 s of CPU against 4.9 s).
/// Never a sample of loose files (an input whose bytes are gathered, not [`Reads::Stream`]):
/// there is no one file to copy from, and the copy would go through a bounce buffer on the
/// reader thread, header and data by separate writes, while the writer thread idles. Through
/// the own segment the reader reads and the writer writes (each round sorted by output
/// offset) at the same time.
/// A sample whose place a saved index gave has its headers read before the copy ([`copy_own`]):
/// only where that is a read of the page cache, a file. From an object store it would be more
/// requests and bytes, so such a sample (`remote_saved`) goes through memory, walked there.
fn in_kernel(
    reader: &mut InputReader<'_>,
    s: &LocalSample,
    ranks: usize,
    remote_saved: bool,
) -> Result<bool> {
    let (file, codec) = reader.file(s.shard as usize)?;
    let plain = codec == Codec::Plain && file.reads() == Reads::Stream;
    Ok(plain && !remote_saved && (s.len >= IN_KERNEL || ranks == 1))
}

/// Copies the sample `s` of a plain input from its input to `at` of this rank's own shard
/// `shard`, inside the kernel, after its first block is read and checked (512 bytes and one
/// system call per sample, from the page cache where readahead brought it); returns its length.
fn copy_own(
    job: &Work<'_>,
    reader: &mut InputReader<'_>,
    s: &LocalSample,
    shard: u64,
    at: u64,
) -> Result<u64> {
    let input = &job.inputs[s.shard as usize];
    let (file, codec) = reader.file(s.shard as usize)?;
    if job.unread.binary_search(&(s.shard as usize)).is_ok() {
        // Its place comes from a saved index, which no header read confirmed: its headers are
        // read now (a positioned read per member, from the page cache the copy reads anyway).
        check_sample_at(file.as_ref(), s.start, s.len)
            .map_err(|e| not_a_sample(e, input, codec, true))?;
    } else {
        let mut head = [0u8; BLOCK as usize];
        let h = read_head(file.as_ref(), &input.path, s.start, s.len, &mut head)?;
        check_first_block(&head[..h], input, codec, s.start)?;
    }
    job.output
        .copy_in(shard, at, file.as_ref(), &input.path, s.start, s.len)?;
    Ok(s.len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(shard: u32, start: u64, len: u64) -> LocalSample {
        LocalSample { shard, start, len }
    }

    /// A window stops before the next sample read directly, at the end of its shard, and
    /// where the next sample would not fit.
    #[test]
    fn a_window_reaches_over_the_small_samples_that_follow_only() {
        let k = 1 << 10;
        let local = [
            sample(0, 0, 4 * k),
            sample(0, 4 * k, 8 * k),
            sample(0, 12 * k, DIRECT),
            sample(0, 12 * k + DIRECT, 4 * k),
            sample(1, 0, 4 * k),
        ];
        assert_eq!(window_end(&local, 0, 1 << 20), 12 * k);
        // A window too small for the second sample ends with the first.
        assert_eq!(window_end(&local, 0, 10 * k as usize), 4 * k);
        // From the last small sample of shard 0: its own end, not shard 1's bytes.
        assert_eq!(window_end(&local, 3, 1 << 20), 16 * k + DIRECT);
        // A large sample's tail chunk: the window ends after the small ones behind it.
        assert_eq!(window_end(&local, 2, 1 << 20), 16 * k + DIRECT);
    }
}
