//! Phase "index": each rank reads the tar headers of its byte-balanced share of the input (or
//! their saved indexes), then the ranks agree on the global numbering of the samples.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use crate::comm::wire::gather_concat;
use crate::comm::{agree, broadcast_result, everywhere, exclusive_sum, Comm};
use crate::config::{IndexSettings, ProgressConfig, ProgressMode};
use crate::input::InputShard;
use crate::job::handoff::{Indexed, Shared};
use crate::job::planning::duplicates;
use crate::output::saved_index::{self, Lookup};
use crate::plan::assign_inputs;
use crate::plan::placement::LocalSample;
use crate::progress::Progress;
use crate::report::narrate;
use crate::report::narrate::count;
use crate::size::human_bytes;
use crate::storage::spool::Spool;
use crate::storage::{self, FileStamp};
use crate::tar::{index_file_reaching, Hygiene, Rules, ShardIndex, Skipped};

/// Indexes this rank's share, checks for samples split across shards and for duplicate keys,
/// and numbers the samples globally. `spool`: where this rank spools the shards of its share
/// that are on object storage, each fetched once for the whole run (none when only planning).
///
/// # Errors
/// Bad input on any rank (agreed), a sample split across two shards, a duplicate key under
/// `--on-duplicate abort`, or no samples at all.
pub(crate) fn run<C: Comm>(
    ctx: &Shared<'_, C>,
    settings: &IndexSettings,
    spool: Option<PathBuf>,
) -> Result<Indexed> {
    let (comm, inputs) = (ctx.comm, ctx.inputs);
    let (rank, ranks, lead) = (comm.rank(), comm.size(), ctx.lead());
    let sizes: Vec<u64> = inputs.iter().map(|s| s.size).collect();
    let mine = assign_inputs(&sizes, ranks)[rank].clone();
    let spool = spool.and_then(|dir| spool_for(dir, settings.spool_memory, &inputs[mine.clone()]));
    let reused = AtomicUsize::new(0);
    narrate_unused(lead, settings);
    let indexed = index_shards(
        inputs,
        mine.clone(),
        (settings, spool.as_ref()),
        &reused,
        &mut |work| report_progress(comm, settings.progress, inputs, work),
    );
    let Scanned {
        local,
        skipped,
        hygiene,
        counts,
        edges,
        key_hashes,
        keys,
        contents,
        zero_runs,
        unread,
        stamps,
    } = agree(comm, indexed)?;
    let all_edges = gather_concat(comm, 0, &edges);
    broadcast_result(
        comm,
        0,
        lead.then(|| all_edges.and_then(|e| split_sample_check(inputs, e))),
    )?;
    // After the split check: a split sample is also a key in two shards, and the more
    // specific message wins.
    let rules = &settings.rules;
    let across_shards = if rules.checks_duplicates() {
        let found = duplicates::find(comm, inputs, &local, &key_hashes, rules.on_duplicate);
        agree(comm, found)?
    } else {
        0
    };
    drop(key_hashes);
    let mine_hygiene = Hygiene {
        duplicates: hygiene.duplicates + across_shards,
        ..hygiene
    };
    let summed = comm.all_sum(&mine_hygiene.to_array());
    let hygiene = Hygiene::from_array(summed.try_into().expect("three counts"));
    let reused = comm.all_sum(&[reused.into_inner() as u64])[0];
    narrate_reused(lead, reused, inputs.len());
    narrate_spooled(comm, spool.as_ref());
    let (first_global, samples) = exclusive_sum(comm, local.len() as u64);
    // What this rank read so far is the index's: the limits were set just before it.
    let read = crate::throttle::tallies().0.bytes;
    let mut totals = vec![local.iter().map(|s| s.len).sum::<u64>(), zero_runs, read];
    totals.extend(skipped.to_array());
    let totals = comm.all_sum(&totals);
    let ([sample_bytes, zero_runs, read_bytes], skipped) = totals.split_at(3) else {
        unreachable!("bytes, zero runs and bytes read, then skipped counts")
    };
    let (sample_bytes, zero_runs, read_bytes) = (*sample_bytes, *zero_runs, *read_bytes);
    let skipped = Skipped::from_array(skipped.try_into().expect("four counts"));
    if samples == 0 {
        return Err(everywhere(
            lead,
            anyhow!(
                "the input holds no samples ({}, {} skipped): {}{}: from byte offset 0 to its end-of-archive marker, no regular file with a sample key",
                count(inputs.len() as u64, "shard"),
                count(skipped.total(), "entry").replace("entrys", "entries"),
                inputs.first().map_or(String::new(), |s| s.path.display().to_string()),
                if inputs.len() > 1 { " (as every other shard)" } else { "" }
            ),
        ));
    }
    Ok(Indexed {
        mine,
        local,
        keys,
        contents,
        counts,
        first_global,
        samples,
        sample_bytes,
        skipped,
        hygiene,
        zero_runs,
        read_bytes,
        unread,
        stamps,
        spool,
    })
}

/// A spool in `dir` for the shards of `share` on object storage, holding in memory those that
/// fit `memory` bytes; none without such shards.
fn spool_for(dir: PathBuf, memory: u64, share: &[InputShard]) -> Option<Spool> {
    let objects = share.iter().any(|s| storage::is_object_store(&s.path));
    objects.then(|| Spool::new(dir, memory))
}

/// One input shard's index, with its stamp from just before it was read.
type Stamped = (FileStamp, ShardIndex);

/// (input shard, (first key, last key)) of the shards a rank indexed from their headers.
type EdgeKeys = Vec<(usize, (String, String))>;

/// On rank 0: a sample split across two consecutive input shards (the last key of one is the
/// first key of the next) would be moved as two samples: an error naming both files.
fn split_sample_check(inputs: &[InputShard], mut all: EdgeKeys) -> Result<()> {
    all.sort_by_key(|e| e.0);
    for pair in all.windows(2) {
        let ((a, (_, last)), (b, (first, _))) = (&pair[0], &pair[1]);
        if b - a == 1 && last == first {
            bail!(
                "sample {last:?} is split across two input shards: it ends {} and starts {}; a sample must lie within one shard",
                inputs[*a].path.display(),
                inputs[*b].path.display()
            );
        }
    }
    Ok(())
}

/// How far this rank's indexing threads are: shards and bytes done, threads still running.
#[derive(Default)]
struct Work {
    shards: AtomicU64,
    bytes: AtomicU64,
    running: AtomicUsize,
}

impl Work {
    /// Waits until this rank's threads have all ended, or `tick` passed; true when they ended.
    fn wait(&self, tick: Duration) -> bool {
        let until = Instant::now() + tick;
        while self.running.load(Ordering::SeqCst) > 0 {
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }
}

/// One shard's part of [`Work`] while a thread indexes it: the bytes its header walk has passed
/// count as they are passed, so that progress moves within a large shard rather than only when
/// a shard ends, and the shard's whole size once it is done (a shard indexed from its saved
/// index or compressed tells no offsets on the way).
struct Reading<'a> {
    work: &'a Work,
    size: u64,
    counted: u64,
    paused: bool,
}

impl<'a> Reading<'a> {
    fn new(work: &'a Work, size: u64) -> Self {
        Reading {
            work,
            size,
            counted: 0,
            paused: false,
        }
    }

    /// The walk is `at` bytes into the shard.
    fn reached(&mut self, at: u64) {
        let at = at.min(self.size);
        if at > self.counted {
            self.work
                .bytes
                .fetch_add(at - self.counted, Ordering::SeqCst);
            self.counted = at;
        }
        if !self.paused && at.saturating_mul(2) >= self.size {
            self.paused = true;
            crate::hooks::pause_in_index();
        }
    }

    /// The shard is indexed (or failed): the rest of its bytes count, and the shard.
    fn done(self) {
        let rest = self.size.saturating_sub(self.counted);
        self.work.bytes.fetch_add(rest, Ordering::SeqCst);
        self.work.shards.fetch_add(1, Ordering::SeqCst);
    }
}

/// Ends an indexing thread's count in [`Work::running`], however the thread ends.
struct Running<'a>(&'a Work);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Rank 0 reports the indexing of every rank, while this rank's threads index: every rank adds
/// what it has done to a sum each tick, until every rank is done. The sums are non-blocking
/// reductions ([`Comm::all_sum_idle`]), so a rank that is done sleeps while it waits for the
/// others. Every rank takes part, or none (`--progress none`).
fn report_progress(comm: &impl Comm, cfg: ProgressConfig, inputs: &[InputShard], work: &Work) {
    if cfg.mode == ProgressMode::None {
        return;
    }
    let total = inputs.iter().map(|s| s.size).sum();
    let shards = inputs.len() as u64;
    let mut progress = Progress::new(cfg, comm.rank() == 0, "index", total, Some(shards));
    let tick = cfg
        .interval
        .clamp(Duration::from_millis(20), Duration::from_millis(250));
    loop {
        // Done first, counts second: a thread counts its shard before it ends.
        let done = work.wait(tick);
        let mine = [
            work.shards.load(Ordering::SeqCst),
            work.bytes.load(Ordering::SeqCst),
            u64::from(done),
        ];
        let sums = comm.all_sum_idle(&mine, Duration::from_millis(5));
        progress.update_items(sums[1], Some(sums[0]));
        if sums[2] == comm.size() as u64 {
            break;
        }
    }
    progress.finish();
}

/// Rank 0 says how much of the input the ranks fetched from object storage into their spools,
/// in memory and in files: the exchange reads it from there.
fn narrate_spooled(comm: &impl Comm, spool: Option<&Spool>) {
    let held = comm.all_sum(&spool.map_or([0, 0], Spool::held));
    if held.iter().sum::<u64>() == 0 {
        return;
    }
    narrate(
        comm.rank() == 0,
        format_args!(
            "fetched the object-store input once: {} held in memory, {} in spool files on scratch",
            human_bytes(held[0]),
            human_bytes(held[1])
        ),
    );
}

/// Rank 0 says that `--index` is not used where the rules need the tar headers.
fn narrate_unused(lead: bool, settings: &IndexSettings) {
    let saved = settings.saved_indexes.as_deref();
    if let Some(dir) = saved.filter(|_| !settings.reuse_saved) {
        narrate(
            lead,
            format_args!(
                "--index {}: not used, the order or loader index asked for needs the tar headers",
                dir.display()
            ),
        );
    }
}

/// Rank 0 says how many input shards' saved indexes stood in for their tar headers.
fn narrate_reused(lead: bool, reused: u64, inputs: usize) {
    if reused == 0 {
        return;
    }
    narrate(
        lead,
        format_args!(
            "reused the saved index of {reused} of {} instead of reading {} tar headers",
            count(inputs as u64, "input shard"),
            if reused == 1 { "its" } else { "their" }
        ),
    );
}

/// Indexes this rank's input shards, in order, from saved indexes where they exist and still
/// match (`reused` counts those), else from the tar headers. Many shards are indexed at once:
/// each shard's headers form a chain of small dependent reads, so one shard keeps one read in
/// flight; storage serves many at once (a virtio disk here: 10k reads/s at one in flight,
/// 49k/s at 32). The calling thread runs `watch` meanwhile, which returns once `Work` says every
/// thread ended.
fn index_shards(
    inputs: &[InputShard],
    mine: std::ops::Range<usize>,
    (settings, spool): (&IndexSettings, Option<&Spool>),
    reused: &AtomicUsize,
    watch: &mut dyn FnMut(&Work),
) -> Result<Scanned> {
    const THREADS: usize = 32;
    let next = AtomicUsize::new(mine.start);
    let results: Mutex<Vec<Option<Result<Stamped>>>> =
        Mutex::new((0..mine.len()).map(|_| None).collect());
    let threads = THREADS.min(mine.len());
    let work = Work {
        running: AtomicUsize::new(threads),
        ..Work::default()
    };
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                let _running = Running(&work);
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= mine.end {
                        break;
                    }
                    let (path, size) = (&inputs[i].path, inputs[i].size);
                    let mut reading = Reading::new(&work, size);
                    // Before the shard is read: a change while it is read moves its stamp.
                    let r = storage::stamp(path)
                        .with_context(|| format!("input {}: cannot stat", path.display()))
                        .and_then(|stamp| {
                            let spool = spool.map(|s| (s, i));
                            let reached: &mut dyn FnMut(u64) = &mut |at| reading.reached(at);
                            index_one(path, settings, reused, spool, reached)
                                .map(|idx| (stamp, idx))
                        });
                    let failed = r.is_err();
                    results.lock().unwrap()[i - mine.start] = Some(r);
                    reading.done();
                    if failed {
                        // Stop handing out shards; the first error in shard order is reported.
                        next.store(mine.end, Ordering::Relaxed);
                    }
                }
            });
        }
        watch(&work);
    });
    collect(results.into_inner().unwrap(), mine, &settings.rules)
}

/// One input shard's index: its saved index when it still matches, else its tar headers
/// (`reached` hears how far their walk is); read from the spool, after one fetch of the whole
/// shard into it, where `spool` (with the shard's number) is given and the shard is on object
/// storage.
fn index_one(
    path: &Path,
    settings: &IndexSettings,
    reused: &AtomicUsize,
    spool: Option<(&Spool, usize)>,
    reached: &mut dyn FnMut(u64),
) -> Result<ShardIndex> {
    let rules = &settings.rules;
    let saved = if settings.reuse_saved {
        saved_index::load(path, settings.saved_indexes.as_deref())
    } else {
        Lookup::Missing
    };
    match saved {
        Lookup::Found(idx) => {
            reused.fetch_add(1, Ordering::Relaxed);
            Ok(idx)
        }
        Lookup::Missing => spooled_index(path, rules, spool, reached),
        Lookup::Stale(why) => {
            crate::errln!("reshard: warning: re-indexing: {why}");
            spooled_index(path, rules, spool, reached)
        }
    }
}

/// The shard's index from its tar headers, read from the spool when it is spooled.
fn spooled_index(
    path: &Path,
    rules: &Rules,
    spool: Option<(&Spool, usize)>,
    reached: &mut dyn FnMut(u64),
) -> Result<ShardIndex> {
    if let Some((spool, i)) = spool.filter(|_| storage::is_object_store(path)) {
        // Not spooled (no room): read from the store, here and in the exchange.
        spool.fetch(path, &format!("{i:06}")).with_context(|| {
            format!(
                "input {}: cannot fetch it into the spool {}",
                path.display(),
                spool.dir().display()
            )
        })?;
    }
    index_file_reaching(path, rules, reached)
}

/// This rank's shard indexes, in shard order, as one list of samples; the first failure in
/// shard order is the error.
fn collect(
    results: Vec<Option<Result<Stamped>>>,
    mine: std::ops::Range<usize>,
    rules: &Rules,
) -> Result<Scanned> {
    // Sized exactly, and each shard's index dropped once copied: the peak is the shard indexes
    // plus these, about 56 bytes per sample.
    let total: usize = results
        .iter()
        .flatten()
        .flatten()
        .map(|(_, i)| i.samples.len())
        .sum();
    let mut out = Scanned::default();
    out.local.reserve_exact(total);
    if rules.checks_duplicates() {
        out.key_hashes.reserve_exact(total);
    }
    let mut skipped = [0u64; 4];
    let mut hygiene = [0u64; 3];
    for (i, r) in mine.clone().zip(results) {
        let Some((stamp, idx)) = r.transpose()? else {
            continue;
        };
        out.stamps.push(stamp);
        out.counts.push(idx.samples.len() as u64);
        out.zero_runs += idx.zero_runs;
        if idx.saved {
            out.unread.push(i);
        }
        if let Some(keys) = idx.edge_keys {
            out.edges.push((i, keys));
        }
        let shard = u32::try_from(i).context("more than 2^32 input shards")?;
        if rules.checks_duplicates() {
            if idx.key_hashes.len() == idx.samples.len() {
                out.key_hashes.extend(&idx.key_hashes);
            } else {
                // A saved index holds no keys: its samples are not checked.
                out.key_hashes
                    .extend(std::iter::repeat_n(0, idx.samples.len()));
            }
        }
        for (a, b) in hygiene.iter_mut().zip(idx.hygiene.to_array()) {
            *a += b;
        }
        out.keys.extend(idx.keys);
        out.contents.extend(idx.contents);
        out.local.extend(idx.samples.iter().map(|s| LocalSample {
            shard,
            start: s.start,
            len: s.len,
        }));
        for (a, b) in skipped.iter_mut().zip(idx.skipped.to_array()) {
            *a += b;
        }
    }
    out.skipped = Skipped::from_array(skipped);
    out.hygiene = Hygiene::from_array(hygiene);
    Ok(out)
}

/// What a rank's indexing found.
#[derive(Debug, Default)]
struct Scanned {
    /// This rank's samples, in input order.
    local: Vec<LocalSample>,
    skipped: Skipped,
    hygiene: Hygiene,
    /// Samples per input shard of this rank.
    counts: Vec<u64>,
    edges: EdgeKeys,
    /// Each sample's key hash when duplicate keys are looked for (0: not checked), else empty.
    key_hashes: Vec<u64>,
    /// Every sample's key, when the rules keep them.
    keys: Vec<Vec<u8>>,
    /// Every sample's label member, when the rules read one.
    contents: Vec<Option<Vec<u8>>>,
    zero_runs: u64,
    /// Shards indexed from their saved index.
    unread: Vec<usize>,
    stamps: Vec<FileStamp>,
}
