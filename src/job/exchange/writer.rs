//! The writer thread: places every chunk that arrives at its precomputed offset.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender};

use anyhow::{Context, Result};

use super::stages::{Delivery, Job, Stages, CHUNK_HEADER};
use crate::comm::wire::{ChunkHeader, Wire};

/// The writer thread: places every delivery's chunks, then recycles its buffers. After a failure
/// it keeps recycling (so no stage blocks) but writes nothing more.
pub(super) fn write_rounds(
    st: &Stages<'_, '_>,
    deliveries: Receiver<Delivery>,
    free_send: Sender<Vec<u8>>,
    free_recv: Sender<Vec<u8>>,
) {
    let (job, failure, written) = (st.job, &st.write_failure, &st.written);
    for d in deliveries {
        st.dog.touch();
        let busy = std::time::Instant::now();
        if failure.lock().unwrap().is_none() {
            let segments = d
                .from
                .iter()
                .map(|r| &d.recv[r.clone()])
                .chain([&d.send[d.own.clone()]]);
            for segment in segments {
                match place(job, segment) {
                    Ok(n) => {
                        written.fetch_add(n, Ordering::Relaxed);
                    }
                    Err(e) => {
                        failure.lock().unwrap().get_or_insert(e);
                        break;
                    }
                }
            }
        }
        // Once per round: what this round wrote (here, or copied by the reader) starts on its way
        // to the disk.
        job.output.start_writeback();
        if d.sync && failure.lock().unwrap().is_none() {
            // A checkpoint: everything placed so far, by this thread or the reader's copies
            // (which happened before their round was handed over), reaches the disk.
            match job.output.sync_data() {
                Ok(()) => st.synced.store(d.round, Ordering::Release),
                Err(e) => {
                    failure.lock().unwrap().get_or_insert(e);
                }
            }
        }
        st.write_nanos
            .fetch_add(busy.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if let Some(t) = &d.timeline {
            t.print(st.me, d.round, busy..std::time::Instant::now());
        }
        // The other ends may be gone after a failure; the buffers are then simply dropped.
        let _ = free_send.send(d.send);
        let _ = free_recv.send(d.recv);
    }
}

/// Writes every chunk of one sender's segment at its place. Returns the sample bytes written.
fn place(job: &Job<'_>, mut segment: &[u8]) -> Result<u64> {
    let mut written = 0;
    while !segment.is_empty() {
        let ChunkHeader {
            position,
            offset,
            len: n,
        } = ChunkHeader::decode(&segment[..CHUNK_HEADER]);
        let (at, len) = job
            .layout
            .place(position)
            .filter(|&(_, len)| offset + n <= len)
            .with_context(|| format!("internal error: chunk for position {position} (+{offset}, {n} bytes) does not belong here"))?;
        debug_assert!(offset + n <= len);
        let shard = job.plan.shard_of(position);
        let body = &segment[CHUNK_HEADER..CHUNK_HEADER + n as usize];
        job.output.write_at(shard, at + offset, body)?;
        written += n;
        segment = &segment[CHUNK_HEADER + n as usize..];
    }
    Ok(written)
}
