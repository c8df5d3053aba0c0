//! The reader thread: packs each round's send buffer, in input order, per destination.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, SyncSender};

use anyhow::{Context, Result};

use super::reader::InputReader;
use super::stages::{Job, Packed, Stages, CHUNK_HEADER};
use crate::comm::wire::{ChunkHeader, Wire};
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
    let mut reader = InputReader::new(job.inputs, read_window);
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
            })
            .is_err()
            || stop
        {
            return;
        }
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
            let n = s.len - cursor.offset;
            let input = &job.inputs[s.shard as usize];
            let (file, codec) = reader.file(s.shard as usize)?;
            if codec == Codec::Plain {
                job.output.copy_in(
                    shard,
                    at + cursor.offset,
                    file,
                    &input.path,
                    s.start + cursor.offset,
                    n,
                )?;
            } else {
                // Offsets are in the decompressed stream: through a bounce buffer.
                let mut buf = vec![0u8; n.min(4 << 20) as usize];
                let mut done_here = 0;
                while done_here < n {
                    let k = (n - done_here).min(buf.len() as u64) as usize;
                    reader.read(
                        s.shard as usize,
                        s.start + cursor.offset + done_here,
                        &mut buf[..k],
                    )?;
                    job.output
                        .write_at(shard, at + cursor.offset + done_here, &buf[..k])?;
                    done_here += k as u64;
                }
            }
            done.copied += n;
            cursor.next_copy();
            continue;
        }
        let room = cap - used[dest];
        if room <= CHUNK_HEADER {
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
        used[dest] += CHUNK_HEADER + n as usize;
        done.packed += n;
        cursor.offset += n;
        if cursor.offset == s.len {
            cursor.next_copy();
        }
    }
    Ok(done)
}
