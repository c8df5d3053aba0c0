//! The reader thread: packs each round's send buffer, in input order, per destination.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, SyncSender};

use anyhow::{anyhow, Context, Result};

use super::reader::InputReader;
use super::stages::{Job, Packed, Stages, CHUNK_HEADER};
use crate::comm::wire::{ChunkHeader, Wire};
use crate::input::InputShard;
use crate::plan::placement::LocalSample;
use crate::storage::{self, Input};
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
/// chunk's destination is full. Samples this rank writes itself are copied from input to output
/// at once, inside the kernel; a round stops after a buffer's worth of them too, so that rounds
/// (and progress reports) stay regular.
fn fill(
    job: &Job<'_>,
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
        if dest == me {
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
        reader.read(s.shard as usize, s.start + cursor.offset, body)?;
        if cursor.offset == 0 {
            let input = &job.inputs[s.shard as usize];
            let codec = reader.file(s.shard as usize)?.1;
            check_first_block(body, input, codec, s.start)?;
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

/// Copies the sample `s` from its input to `at` of this rank's own shard `shard`; returns its
/// length. A plain input is copied inside the kernel, after its first block is read and
/// checked (512 bytes and one system call per sample, from the page cache where readahead
/// brought it); a compressed one goes through a bounce buffer (offsets are those of the
/// decompressed stream), where its first block is checked as it passes.
fn copy_own(
    job: &Job<'_>,
    reader: &mut InputReader<'_>,
    s: &LocalSample,
    shard: u64,
    at: u64,
) -> Result<u64> {
    let n = s.len;
    let input = &job.inputs[s.shard as usize];
    let (file, codec) = reader.file(s.shard as usize)?;
    if codec == Codec::Plain {
        let mut head = [0u8; BLOCK as usize];
        let h = read_head(file.as_ref(), &input.path, s.start, n, &mut head)?;
        check_first_block(&head[..h], input, codec, s.start)?;
        job.output
            .copy_in(shard, at, file.as_ref(), &input.path, s.start, n)?;
        return Ok(n);
    }
    let mut buf = vec![0u8; n.min(4 << 20) as usize];
    let mut done = 0;
    while done < n {
        let k = (n - done).min(buf.len() as u64) as usize;
        reader.read(s.shard as usize, s.start + done, &mut buf[..k])?;
        if done == 0 {
            check_first_block(&buf[..k], input, codec, s.start)?;
        }
        job.output.write_at(shard, at + done, &buf[..k])?;
        done += k as u64;
    }
    Ok(n)
}
