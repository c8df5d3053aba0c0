//! One rank's per-sample metadata at any sample count, without tar data: rank R of P in a job of
//! N one-member samples and S output shards, driven through the functions a run's phases call
//! (plan/, output/, and the layout's and duplicate check's routing over a one-rank MPI world,
//! which holds the same send and receive buffers as a rank of P). Issue 27, part 5: the figures
//! behind docs/performance.md's model for 10^9 samples.
//!
//! ```text
//! cargo build --release --example metadata_scale
//! target/release/examples/metadata_scale N P R S DIR
//! target/release/examples/metadata_scale 100000000 4 0 1000 /dev/shm/meta
//! ```
//!
//! Prints one line per phase, as `RESHARD_TRACE_PHASES` does for a real run (wall and CPU
//! seconds, the phase's own peak RSS, the RSS after it), then the peak per sample. DIR receives
//! the rank's saved indexes (over empty sparse shard files), and is removed at the end.
//!
//! What is simulated: the rank's samples are the global indexes of its writer positions (so
//! that it receives as many layout records as it sends, as in a balanced run), and the records
//! it receives come in the order of a second permutation over its own positions. The layout's
//! records cost one permutation each, as in a run; the rank's input is 512-byte samples in S
//! input shards.

use std::hint::black_box;
use std::path::Path;

use anyhow::{bail, Context, Result};
use reshard::comm::mpi::MpiRuntime;
use reshard::comm::wire::{route, Sink};
use reshard::job::planning::duplicates;
use reshard::job::planning::layout::lens_at;
use reshard::output::saved_index;
use reshard::plan::permute::Permutation;
use reshard::plan::placement::{LocalSample, Placement};
use reshard::plan::{Equalize, ShardLayout, ShardPlan, Targets};
use reshard::progress::PhaseTrace;
use reshard::tar::{OnDuplicate, Sample};

const SAMPLE: u64 = 512;

/// A key hash per global index (splitmix64's finalizer): distinct, never 0.
fn key_hash(g: u64) -> u64 {
    let mut x = g.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (x ^ (x >> 31)) | 1
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [n, p, r, s, dir] = args.as_slice() else {
        bail!("usage: metadata_scale SAMPLES RANKS RANK SHARDS DIR");
    };
    let (n, ranks, rank, shards): (u64, usize, usize, u64) =
        (n.parse()?, p.parse()?, r.parse()?, s.parse()?);
    let dir = Path::new(dir);
    // One rank, started without a launcher: its all-to-all moves this rank's records to itself.
    let mpi = MpiRuntime::init(i32::MAX as u64)?;
    let comm = &mpi.comm;
    std::fs::create_dir_all(dir.join(saved_index::DIR_NAME))
        .with_context(|| format!("{}: cannot create", dir.display()))?;
    let plan = ShardPlan::by_count(n, shards, ranks);
    let runs = plan.writer_positions(rank);
    let [mine] = runs.as_slice() else {
        bail!("one group of shards: one run of positions per writer");
    };
    let (first, count) = (mine.start, mine.end - mine.start);
    let per_input = n.div_ceil(shards);
    println!("rank {rank} of {ranks}: {count} of {n} samples, {shards} shards");
    let mut trace = PhaseTrace::new(rank);

    // index: what the index phase leaves (the read list, and key hashes for the duplicate check).
    trace.start("index");
    let local: Vec<LocalSample> = (first..mine.end)
        .map(|g| LocalSample {
            shard: u32::try_from(g / per_input).expect("few shards"),
            start: (g % per_input) * SAMPLE,
            len: SAMPLE,
        })
        .collect();
    let hashes: Vec<u64> = (first..mine.end).map(key_hash).collect();

    trace.start("duplicates");
    if duplicates::find(comm, &[], &local, &hashes, OnDuplicate::Abort)? != 0 {
        bail!("synthetic keys are distinct");
    }
    drop(hashes);

    // place: the plain shuffle holds nothing per sample.
    trace.start("place");
    let placement = Placement::Permuted {
        permutation: Permutation::new(1, 0, n),
        targets: Targets::new(n, shards, Equalize::None),
        first_global: first,
    };

    // layout: (position, length) to the writer; here every record comes back to this rank, at
    // a position of its own, in permuted order.
    trace.start("layout");
    let onto_mine = Permutation::new(1, 1, count);
    let received = route(comm, &|sink: Sink<'_, (u64, u64)>| {
        for (i, sample) in local.iter().enumerate() {
            sink(0, &(first + onto_mine.apply(i as u64), sample.len));
        }
    });
    let lens = lens_at(&runs, &received, rank)?;
    drop(received);
    let layout = ShardLayout::new(&plan, rank, lens);

    // exchange: the per-sample look-ups of a run's exchange (its buffers are --mem-limit's).
    trace.start("exchange metadata");
    let mut sum = 0u64;
    for i in 0..local.len() {
        let p = placement.position(i, 0).expect("placed");
        sum = sum.wrapping_add(plan.writer_of(plan.shard_of(p)) as u64);
    }
    for q in mine.clone() {
        sum = sum.wrapping_add(layout.place(q).expect("laid out").0);
    }
    black_box(sum);

    // finish: every own shard's saved index, over an empty file of the shard's size.
    trace.start("finish (saved indexes)");
    for (k, &s) in layout.shards.iter().enumerate() {
        let path = dir.join(format!("shard-{s:06}.tar"));
        std::fs::File::create(&path)
            .and_then(|f| f.set_len(layout.shard_bytes[k]))
            .with_context(|| format!("{}: cannot create", path.display()))?;
        let samples = plan.shard_positions(s).map(|p| {
            let (start, len) = layout.place(p).expect("laid out");
            Sample { start, len }
        });
        saved_index::save(&dir.join(saved_index::DIR_NAME), &path, samples)?;
    }
    trace.stop();
    let peak = reshard::sys::peak_rss().unwrap_or(0);
    println!(
        "peak {} KiB: {:.1} bytes per sample",
        peak / 1024,
        peak as f64 / count as f64
    );
    drop((local, layout));
    std::fs::remove_dir_all(dir).with_context(|| format!("{}: cannot remove", dir.display()))
}
