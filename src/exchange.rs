//! The bounded data exchange: ranks stream their samples sequentially, pack them per writer, move
//! them in all-to-all rounds whose buffers respect the memory budget, and writers place them.
//!
//! A sample larger than a round's share moves as several chunks: every chunk carries the sample's
//! output position and its offset inside the sample, so writers never reassemble anything.

use std::fs::File;
use std::io::Read;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

use crate::comm::{agree, Comm, PeerFailed};
use crate::input::InputShard;
use crate::order::Placement;
use crate::plan::{ShardLayout, ShardPlan};
use crate::tar_index::Codec;
use crate::watchdog::Watchdog;
use crate::writer::OutputShards;

/// A sample this rank reads: which input shard, and its byte range there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalSample {
    pub shard: u32,
    pub start: u64,
    pub len: u64,
}

/// Chunk header: output position, offset inside the sample, payload length (little-endian u64s).
const CHUNK_HEADER: usize = 24;

/// How a memory budget is split among the exchange's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buffers {
    /// Bytes each destination may receive from this rank per round. A rank receives at most
    /// `per_destination * ranks` bytes per round, like it sends.
    pub per_destination: usize,
    /// Size of the sequential read window over the input.
    pub read_window: usize,
}

impl Buffers {
    /// Splits `budget` bytes: a read window of at most 8 MiB, then equal shares for the send and
    /// receive buffers in flight (each holds `per_destination` bytes for every rank).
    pub fn for_budget(budget: u64, ranks: usize) -> Self {
        let budget = usize::try_from(budget).unwrap_or(usize::MAX);
        let read_window = (budget / 16).clamp(64 << 10, 8 << 20);
        let buffer = budget.saturating_sub(read_window) / (SEND_BUFFERS + RECV_BUFFERS);
        let per_destination = (buffer / ranks).max(CHUNK_HEADER + 512);
        Buffers {
            per_destination,
            read_window,
        }
    }
}

/// Rounds a rank's data is split into at least (budget permitting): the reader, the exchange and
/// the writer overlap except while the first round is read and the last one written, so with
/// few rounds those two ends dominate. On the 2 GiB bench set at np=2 (warm), 6 rounds of
/// 106 MB took 2.5-2.75 s to exchange, 22 rounds 2.2-2.4 s: buffers are also reused instead of
/// touched once (page faults, zeroing).
const MIN_ROUNDS: u64 = 16;

/// Rounds never shrink below this many bytes per destination for want of data.
const MIN_SEGMENT: u64 = 1 << 20;

impl Buffers {
    /// [`Buffers::for_budget`], with segments no larger than at least [`MIN_ROUNDS`] rounds
    /// need when each rank moves about `bytes_per_rank`.
    pub fn for_job(budget: u64, ranks: usize, bytes_per_rank: u64) -> Self {
        let mut b = Self::for_budget(budget, ranks);
        let share = bytes_per_rank
            .div_ceil(MIN_ROUNDS * ranks as u64)
            .max(MIN_SEGMENT);
        b.per_destination = b
            .per_destination
            .min(usize::try_from(share).unwrap_or(usize::MAX));
        b
    }
}

/// What the exchange moved, as seen by this rank.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExchangeStats {
    pub rounds: u64,
    /// Sample bytes this rank read and sent.
    pub bytes_sent: u64,
    /// Sample bytes this rank received and wrote.
    pub bytes_written: u64,
}

/// Everything the exchange needs to know about the job.
pub struct Job<'a> {
    pub inputs: &'a [InputShard],
    /// This rank's samples, in input order, with the global index of the first.
    pub local: &'a [LocalSample],
    /// Where each sample goes (nowhere when dropped, twice when repeated).
    pub placement: &'a Placement,
    pub plan: &'a ShardPlan,
    /// This rank's own shards.
    pub layout: &'a ShardLayout,
    pub output: &'a OutputShards,
}

/// Buffers in flight: the reader fills one send buffer while the main thread exchanges another
/// and the writer places this rank's own share of a third; the main thread receives into one
/// receive buffer while the writer places the other. Reading, exchanging and writing overlap.
const SEND_BUFFERS: usize = 3;
const RECV_BUFFERS: usize = 2;

/// One round's packed send buffer, as the reader hands it over.
struct Packed {
    buf: Vec<u8>,
    /// Bytes used in each destination's segment.
    used: Vec<usize>,
    /// Sample bytes packed.
    payload: u64,
    error: Option<anyhow::Error>,
}

/// What the writer places: the chunks received from other ranks, and this rank's own segment of
/// its send buffer (which never goes through MPI).
struct Delivery {
    recv: Vec<u8>,
    from: Vec<Range<usize>>,
    send: Vec<u8>,
    own: Range<usize>,
}

/// What the three stages share: the job, the writer's first failure, the bytes placed, and the
/// stall watchdog every stage reports progress to.
struct Stages<'a, 'j> {
    job: &'a Job<'j>,
    me: usize,
    write_failure: Mutex<Option<anyhow::Error>>,
    written: AtomicU64,
    dog: Watchdog,
}

/// Runs the exchange to completion on every rank. `progress` is called after each round with the
/// sample bytes moved so far by all ranks together.
///
/// Three stages overlap: a reader thread packs rounds, the calling thread (the only one that
/// calls MPI) exchanges them, and a writer thread places what arrives.
///
/// # Errors
/// A read or write fails on this rank (the message names file and offset), or another rank
/// failed ([`PeerFailed`]); either way every rank leaves at the same round.
pub fn run(
    comm: &impl Comm,
    job: &Job<'_>,
    buffers: Buffers,
    stall_timeout: Duration,
    heartbeats: Option<PathBuf>,
    progress: &mut dyn FnMut(u64),
) -> Result<ExchangeStats> {
    let ranks = comm.size();
    let cap = buffers.per_destination;
    let (packed_tx, packed_rx) = sync_channel::<Packed>(1);
    let (free_send_tx, free_send_rx) = channel::<Vec<u8>>();
    let (deliver_tx, deliver_rx) = sync_channel::<Delivery>(1);
    let (free_recv_tx, free_recv_rx) = channel::<Vec<u8>>();
    for _ in 0..SEND_BUFFERS {
        free_send_tx
            .send(vec![0u8; cap * ranks])
            .expect("receiver alive");
    }
    for _ in 0..RECV_BUFFERS {
        free_recv_tx.send(Vec::new()).expect("receiver alive");
    }
    let stages = Stages {
        job,
        me: comm.rank(),
        write_failure: Mutex::new(None),
        written: AtomicU64::new(0),
        dog: Watchdog::start(
            stall_timeout,
            (comm.rank(), comm.size()),
            heartbeats,
            comm.aborter(),
        ),
    };
    fault_injection(stages.me);
    let (outcome, mut stats) = std::thread::scope(|scope| {
        let st = &stages;
        scope.spawn(move || {
            pack_rounds(st, cap, ranks, buffers.read_window, free_send_rx, packed_tx)
        });
        scope.spawn(move || write_rounds(st, deliver_rx, free_send_tx, free_recv_tx));
        exchange_rounds(comm, st, cap, packed_rx, deliver_tx, free_recv_rx, progress)
    });
    drop(stages.dog);
    outcome?;
    // The writer may have failed on the last round, after the last status exchange.
    let write_failure = stages
        .write_failure
        .into_inner()
        .unwrap_or_else(|p| p.into_inner());
    agree(comm, write_failure.map_or(Ok(()), Err))?;
    stats.bytes_written = stages.written.into_inner();
    let expected = job.layout.sample_bytes();
    if stats.bytes_written != expected {
        bail!(
            "internal error: rank {} wrote {} sample bytes but its shards hold {expected}",
            comm.rank(),
            stats.bytes_written
        );
    }
    Ok(stats)
}

/// Test hooks, read from the environment as the exchange starts (the stall watchdog already
/// running): RESHARD_TEST_PANIC_RANK=r makes rank r panic (a panic must abort every rank),
/// RESHARD_TEST_STALL_RANK=r stops rank r (the others' watchdogs must end the job).
fn fault_injection(rank: usize) {
    let chosen = |var: &str| {
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            == Some(rank)
    };
    if chosen("RESHARD_TEST_PANIC_RANK") {
        panic!("RESHARD_TEST_PANIC_RANK={rank}: injected panic");
    }
    if chosen("RESHARD_TEST_STALL_RANK") {
        eprintln!("reshard: RESHARD_TEST_STALL_RANK={rank}: this rank now stops (SIGSTOP)");
        // The whole process stops, its watchdog included, like a node that froze.
        // SAFETY: raise(2) on this process.
        unsafe {
            libc::raise(libc::SIGSTOP);
        }
    }
}

/// The calling thread's part: one status reduction and one all-to-all per round.
fn exchange_rounds(
    comm: &impl Comm,
    st: &Stages<'_, '_>,
    cap: usize,
    packed: Receiver<Packed>,
    deliver: SyncSender<Delivery>,
    free_recv: Receiver<Vec<u8>>,
    progress: &mut dyn FnMut(u64),
) -> (Result<()>, ExchangeStats) {
    let write_failure = &st.write_failure;
    let (ranks, me) = (comm.size(), comm.rank());
    let mut stats = ExchangeStats::default();
    let mut moved = 0u64;
    let trace = std::env::var_os("RESHARD_TRACE_ROUNDS").is_some();
    loop {
        let t0 = std::time::Instant::now();
        // None once the reader has packed everything.
        let mut round = packed.recv().ok();
        let t_read = t0.elapsed();
        let mut failure = round.as_mut().and_then(|r| r.error.take());
        if failure.is_none() {
            // A copy: the writer keeps its failure and stops writing.
            failure = write_failure
                .lock()
                .unwrap()
                .as_ref()
                .map(|e| anyhow!("{e:#}"));
        }
        let payload = round.as_ref().map_or(0, |r| r.payload);
        // One small collective per round: did anyone fail, and is anything left to move?
        let n = stats.rounds + 1;
        st.dog.beat(n, || {
            format!("waiting for every rank's status before exchange round {n}")
        });
        let status = comm.all_sum(&[u64::from(failure.is_some()), payload]);
        let t_status = t0.elapsed();
        if status[0] > 0 {
            let e = failure.unwrap_or_else(|| anyhow!(PeerFailed { ranks: Vec::new() }));
            return (Err(e), stats);
        }
        if status[1] == 0 {
            return (Ok(()), stats);
        }
        stats.rounds += 1;
        stats.bytes_sent += payload;
        let (send, used) = round.map_or((Vec::new(), vec![0; ranks]), |r| (r.buf, r.used));
        // Empty segments as 0..0: a rank whose reader has finished sends from an empty buffer.
        let segment = |d: usize| {
            if used[d] == 0 {
                0..0
            } else {
                d * cap..d * cap + used[d]
            }
        };
        let ranges: Vec<Range<usize>> = (0..ranks)
            .map(|d| if d == me { 0..0 } else { segment(d) })
            .collect();
        let mut recv = free_recv
            .recv()
            .expect("the writer returns receive buffers");
        st.dog
            .beat(n, || format!("in the all-to-all of exchange round {n}"));
        let t_buffer = t0.elapsed();
        let from = comm.all_to_all(&send, &ranges, &mut recv);
        if trace {
            let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
            eprintln!(
                "reshard: rank {me} round {n}: reader {:.0} ms, status {:.0} ms, writer {:.0} ms, all-to-all {:.0} ms ({} B out, {} B in)",
                ms(t_read),
                ms(t_status - t_read),
                ms(t_buffer - t_status),
                ms(t0.elapsed() - t_buffer),
                ranges.iter().map(Range::len).sum::<usize>(),
                recv.len()
            );
        }
        st.dog
            .beat(n, || format!("handing exchange round {n} to the writer"));
        let delivery = Delivery {
            recv,
            from,
            own: segment(me),
            send,
        };
        deliver
            .send(delivery)
            .expect("the writer runs until the deliveries end");
        moved += status[1];
        progress(moved);
    }
}

/// The reader thread: packs rounds in input order until the samples run out or a read fails.
fn pack_rounds(
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
        let (payload, error) =
            match fill(job, me, &mut cursor, &mut reader, &mut buf, cap, &mut used) {
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
                error,
            })
            .is_err()
            || stop
        {
            return;
        }
    }
}

/// The writer thread: places every delivery's chunks, then recycles its buffers. After a failure
/// it keeps recycling (so no stage blocks) but writes nothing more.
fn write_rounds(
    st: &Stages<'_, '_>,
    deliveries: Receiver<Delivery>,
    free_send: Sender<Vec<u8>>,
    free_recv: Sender<Vec<u8>>,
) {
    let (job, failure, written) = (st.job, &st.write_failure, &st.written);
    for d in deliveries {
        st.dog.touch();
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
        // The other ends may be gone after a failure; the buffers are then simply dropped.
        let _ = free_send.send(d.send);
        let _ = free_recv.send(d.recv);
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
        let header = &mut send[at..at + CHUNK_HEADER];
        header[..8].copy_from_slice(&position.to_le_bytes());
        header[8..16].copy_from_slice(&cursor.offset.to_le_bytes());
        header[16..].copy_from_slice(&n.to_le_bytes());
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

/// Writes every chunk of one sender's segment at its place. Returns the sample bytes written.
fn place(job: &Job<'_>, mut segment: &[u8]) -> Result<u64> {
    let mut written = 0;
    while !segment.is_empty() {
        let word = |i: usize| u64::from_le_bytes(segment[i * 8..i * 8 + 8].try_into().unwrap());
        let (position, offset, n) = (word(0), word(1), word(2));
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

/// Sequential reader over the input shards: small samples are served from a large read window,
/// large ones are read straight into the send buffer.
struct InputReader<'a> {
    inputs: &'a [InputShard],
    /// The open input: shard, file, and how it is stored.
    file: Option<(usize, File, Codec)>,
    /// For a compressed shard: the decompressed stream and its position.
    stream: Option<(usize, u64, Box<dyn Read + Send>)>,
    window: Vec<u8>,
    /// Which shard and byte range the window holds.
    window_shard: usize,
    window_range: Range<u64>,
}

impl<'a> InputReader<'a> {
    fn new(inputs: &'a [InputShard], window: usize) -> Self {
        InputReader {
            inputs,
            file: None,
            stream: None,
            window: vec![0; window],
            window_shard: usize::MAX,
            window_range: 0..0,
        }
    }

    /// The open input file of `shard` and its codec (the last one opened stays open).
    fn file(&mut self, shard: usize) -> Result<(&File, Codec)> {
        if self.file.as_ref().is_none_or(|(s, _, _)| *s != shard) {
            let path = &self.inputs[shard].path;
            let codec = Codec::sniff(path)?;
            let f = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
            self.file = Some((shard, f, codec));
        }
        let (_, f, codec) = self.file.as_ref().unwrap();
        Ok((f, *codec))
    }

    /// Reads `out.len()` bytes at `offset` of `shard` (of its decompressed stream, when
    /// compressed).
    fn read(&mut self, shard: usize, offset: u64, out: &mut [u8]) -> Result<()> {
        if self.file(shard)?.1 != Codec::Plain {
            return self.read_stream(shard, offset, out);
        }
        self.read_plain(shard, offset, out)
    }

    /// A compressed shard is read as one forward stream: samples come in input order, so each
    /// read starts at or after the previous one's end (a restart from the top otherwise).
    fn read_stream(&mut self, shard: usize, offset: u64, out: &mut [u8]) -> Result<()> {
        let path = self.inputs[shard].path.clone();
        if self
            .stream
            .as_ref()
            .is_none_or(|(s, pos, _)| *s != shard || *pos > offset)
        {
            let (file, codec) = self.file(shard)?;
            let file = file
                .try_clone()
                .with_context(|| format!("{}: cannot reopen", path.display()))?;
            let decoder = codec
                .decoder(file)
                .with_context(|| format!("{}: cannot start decompressing", path.display()))?;
            self.stream = Some((shard, 0, decoder));
        }
        let (_, pos, decoder) = self.stream.as_mut().unwrap();
        let skip = offset - *pos;
        let skipped =
            std::io::copy(&mut decoder.take(skip), &mut std::io::sink()).with_context(|| {
                format!(
                    "{}: decompressing up to byte offset {offset}",
                    path.display()
                )
            })?;
        let result = if skipped < skip {
            Err(anyhow!(
                "{}: decompressed byte offset {}: expected sample data, found the end of the stream (did the shard change during the run?)",
                path.display(),
                *pos + skipped
            ))
        } else {
            decoder.read_exact(out).with_context(|| {
                format!(
                    "{}: decompressed byte offset {offset}: cannot read {} bytes of sample data",
                    path.display(),
                    out.len()
                )
            })
        };
        if result.is_err() {
            self.stream = None;
            return result;
        }
        *pos = offset + out.len() as u64;
        Ok(())
    }

    fn read_plain(&mut self, shard: usize, mut offset: u64, mut out: &mut [u8]) -> Result<()> {
        while !out.is_empty() {
            if shard == self.window_shard && self.window_range.contains(&offset) {
                let from = (offset - self.window_range.start) as usize;
                let n = out.len().min((self.window_range.end - offset) as usize);
                out[..n].copy_from_slice(&self.window[from..from + n]);
                out = &mut out[n..];
                offset += n as u64;
                continue;
            }
            let size = self.inputs[shard].size;
            let path = self.inputs[shard].path.clone();
            let short = |got: u64| {
                anyhow!(
                    "{}: byte offset {}: expected sample data, found the end of the file (the shard was {} bytes when indexed; did it change during the run?)",
                    path.display(),
                    got,
                    size
                )
            };
            if out.len() >= self.window.len() / 2 {
                let file = self.file(shard)?.0;
                read_full_at(file, out, offset)
                    .with_context(|| {
                        format!("{}: cannot read at byte offset {offset}", path.display())
                    })
                    .and_then(|got| {
                        if got < out.len() {
                            Err(short(offset + got as u64))
                        } else {
                            Ok(())
                        }
                    })?;
                return Ok(());
            }
            let want = (self.window.len() as u64).min(size.saturating_sub(offset)) as usize;
            let mut window = std::mem::take(&mut self.window);
            let got =
                read_full_at(self.file(shard)?.0, &mut window[..want], offset).with_context(|| {
                    format!("{}: cannot read at byte offset {offset}", path.display())
                });
            self.window = window;
            let got = got?;
            if got == 0 {
                return Err(short(offset));
            }
            self.window_shard = shard;
            self.window_range = offset..offset + got as u64;
        }
        Ok(())
    }
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_respect_the_budget() {
        for (budget, ranks) in [
            (1u64 << 30, 4usize),
            (64 << 20, 2),
            (1 << 20, 3),
            (1 << 30, 1000),
        ] {
            let b = Buffers::for_budget(budget, ranks);
            let total = b.read_window + (SEND_BUFFERS + RECV_BUFFERS) * b.per_destination * ranks;
            assert!(total as u64 <= budget, "{budget} {ranks}: {b:?}");
        }
    }

    #[test]
    fn rounds_are_many_enough_to_overlap_and_within_the_budget() {
        let gib = 1u64 << 30;
        // Plenty of budget: the data sets the round size (MIN_ROUNDS of them).
        let b = Buffers::for_job(gib, 2, gib);
        assert_eq!(b.per_destination as u64, gib / (MIN_ROUNDS * 2));
        assert_eq!(b.read_window, Buffers::for_budget(gib, 2).read_window);
        // Little budget: the budget sets it, as before.
        let small = Buffers::for_budget(64 << 20, 4);
        assert_eq!(Buffers::for_job(64 << 20, 4, 1 << 40), small);
        // Little data: rounds do not shrink below MIN_SEGMENT.
        assert_eq!(
            Buffers::for_job(gib, 4, 1 << 20).per_destination as u64,
            MIN_SEGMENT
        );
    }
}
