//! Phase "layout": every (position, length) record goes to the writer of its shard, which lays
//! out its shards before any data moves; rank 0 learns every shard's size for the manifest.

use anyhow::{bail, Context, Result};

use crate::comm::wire::{self, gather_concat, Received, Sink};
use crate::comm::{agree, exclusive_sum, Comm};
use crate::config::{Balance, LayoutSettings};
use crate::input::InputShard;
use crate::job::handoff::{Indexed, Laid, Placed, Shared};
use crate::output::manifest::ShardEntry;
use crate::plan::placement::{LocalSample, Placement};
use crate::plan::{bounds_from_starts, byte_shard_of, ShardGroup, ShardLayout, ShardPlan};
use crate::report::GpuShare;
use crate::tar::keys_at;

/// Sends every sample's (position, length) to its writer, which lays out its shards.
///
/// # Errors
/// An internal inconsistency (a position received twice or never), or a key that cannot be
/// read back for the manifest's lists of dropped and repeated samples.
pub(crate) fn run<C: Comm>(
    ctx: &Shared<'_, C>,
    settings: &LayoutSettings,
    index: &Indexed,
    placed: &Placed,
) -> Result<Laid> {
    let (comm, inputs) = (ctx.comm, ctx.inputs);
    let (rank, ranks) = (comm.rank(), comm.size());
    let local = &index.local;
    let placement = &placed.placement;
    let records = |f: &mut dyn FnMut(u64, u64)| {
        placement.for_each(local.len(), &mut |i, p| f(p, local[i].len));
    };
    let planned = match settings.balance {
        Balance::Count => {
            let sizes: Vec<ShardGroup> = placed
                .groups
                .iter()
                .map(|g| ShardGroup {
                    positions: g.output_samples,
                    shards: g.shards,
                    // The bytes written, as `--equalize` scales the count: an estimate.
                    bytes: (u128::from(g.sample_bytes) * u128::from(g.output_samples)
                        / u128::from(g.samples.max(1))) as u64,
                })
                .collect();
            count_plan(comm, &records, ShardPlan::by_groups(&sizes, ranks))
        }
        Balance::Bytes => byte_plan(comm, &records, placed.output_samples, placed.shards),
    };
    let (plan, lens) = agree(comm, planned)?;
    let layout = ShardLayout::new(&plan, rank, lens);
    let equalized = equalized_keys(
        comm,
        inputs,
        local,
        placement,
        placed.dropped + placed.repeated,
    );
    let (dropped_keys, repeated_keys) = agree(comm, equalized)?;
    // Rank 0 needs every shard's size: gathered in the writers' order, put in shard order.
    let shard_bytes = gather_concat::<u64>(comm, 0, &layout.shard_bytes);
    let input_counts = gather_concat::<u64>(comm, 0, &index.counts);
    let (shard_bytes, input_counts) =
        agree(comm, shard_bytes.and_then(|s| Ok((s, input_counts?))))?;
    let shard_bytes = plan.in_shard_order(&shard_bytes, 1);
    let shard_samples: Vec<u64> = (0..placed.shards)
        .map(|s| plan.shard_positions(s).end - plan.shard_positions(s).start)
        .collect();
    let shardlist: Vec<ShardEntry> = shard_bytes
        .iter()
        .enumerate()
        .map(|(s, &filesize)| ShardEntry {
            url: placed.names.plain(s as u64),
            nsamples: shard_samples[s],
            filesize,
            md5sum: None,
        })
        .collect();
    let gpu_shards = match settings.gpu_groups {
        Some(n) => placed.groups[..n].iter().map(|g| g.shards as usize).sum(),
        None => shard_samples.len(),
    };
    let gpus = settings
        .gpus
        .map(|g| GpuShare::new(g, &shard_samples[..gpu_shards]));
    Ok(Laid {
        plan,
        layout,
        dropped_keys,
        repeated_keys,
        shard_bytes,
        shard_samples,
        input_counts,
        shardlist,
        gpus,
    })
}

/// Calls its argument once for every (output position, sample length) record a rank holds.
type Records<'a> = &'a dyn Fn(&mut dyn FnMut(u64, u64));

/// Sends every (position, length) record to the rank `dest` picks for its position; returns the
/// records received.
fn route(
    comm: &impl Comm,
    records: Records<'_>,
    dest: &dyn Fn(u64) -> usize,
) -> Received<(u64, u64)> {
    wire::route(comm, &|sink: Sink<'_, (u64, u64)>| {
        records(&mut |p, len| sink(dest(p), &(p, len)));
    })
}

/// The length at every position of `runs` (ascending), in that order, from received records,
/// each exactly once. (Public for `examples/metadata_scale.rs`, which drives a rank's layout.)
///
/// # Errors
/// A position received twice, never, or outside `runs` (an internal inconsistency).
pub fn lens_at(
    runs: &[std::ops::Range<u64>],
    recv: &Received<(u64, u64)>,
    rank: usize,
) -> Result<Vec<u64>> {
    let mut base = Vec::with_capacity(runs.len());
    let mut total = 0usize;
    for run in runs {
        base.push(total);
        total += (run.end - run.start) as usize;
    }
    let mut lens = vec![u64::MAX; total];
    for (p, len) in recv.iter() {
        let slot = runs
            .partition_point(|r| r.start <= p)
            .checked_sub(1)
            .filter(|&k| p < runs[k].end)
            .and_then(|k| lens.get_mut(base[k] + (p - runs[k].start) as usize))
            .with_context(|| {
                format!("internal error: position {p} does not belong to rank {rank}")
            })?;
        if *slot != u64::MAX {
            bail!("internal error: position {p} received twice");
        }
        *slot = len;
    }
    if let Some(i) = lens.iter().position(|&l| l == u64::MAX) {
        let k = base.partition_point(|&b| b <= i) - 1;
        bail!(
            "internal error: no sample for position {}",
            runs[k].start + (i - base[k]) as u64
        );
    }
    Ok(lens)
}

/// Count-balanced shards: every record goes straight to the writer of its position.
fn count_plan(
    comm: &impl Comm,
    records: Records<'_>,
    plan: ShardPlan,
) -> Result<(ShardPlan, Vec<u64>)> {
    let recv = route(comm, records, &|p| plan.writer_of(plan.shard_of(p)));
    let lens = lens_at(&plan.writer_positions(comm.rank()), &recv, comm.rank())?;
    Ok((plan, lens))
}

/// Byte-balanced shards (`--balance bytes`): records first go to the rank owning a contiguous
/// block of positions; an exclusive prefix sum over the blocks gives every position its byte
/// offset in the permuted sequence, hence its shard; one reduction over S shard starts gives every
/// rank the boundaries; then the records move on to their writers. No rank sees all sizes.
fn byte_plan(
    comm: &impl Comm,
    records: Records<'_>,
    positions: u64,
    shards: u64,
) -> Result<(ShardPlan, Vec<u64>)> {
    let (rank, ranks) = (comm.rank(), comm.size());
    let blocks = ShardPlan::by_count(positions, ranks.min(positions as usize) as u64, ranks);
    let owner = |p: u64| blocks.writer_of(blocks.shard_of(p));
    let recv = route(comm, records, &owner);
    // One group: at most one run of positions per rank.
    let mine = blocks.writer_positions(rank).pop().unwrap_or(0..0);
    let lens = lens_at(std::slice::from_ref(&mine), &recv, rank)?;
    drop(recv);
    let (before, total) = exclusive_sum(comm, lens.iter().sum());
    let mut starts = vec![u64::MAX; shards as usize];
    let mut at = before;
    for (i, &len) in lens.iter().enumerate() {
        let s = byte_shard_of(at, len, total, shards) as usize;
        starts[s] = starts[s].min(mine.start + i as u64);
        at += len;
    }
    // The minimum over ranks, as a maximum of complements (0 for "no start here"). Values stay
    // far below 2^63: MPICH's MPI_MAX on rsmpi's u64 compared them as signed (seen here).
    let flipped: Vec<u64> = starts
        .iter()
        .map(|&x| if x == u64::MAX { 0 } else { positions + 1 - x })
        .collect();
    let starts: Vec<u64> = comm
        .all_max(&flipped)
        .into_iter()
        .map(|f| if f == 0 { u64::MAX } else { positions + 1 - f })
        .collect();
    let plan = ShardPlan::from_bounds(bounds_from_starts(&starts, positions), ranks);
    let own = |f: &mut dyn FnMut(u64, u64)| {
        for (i, &len) in lens.iter().enumerate() {
            f(mine.start + i as u64, len);
        }
    };
    let recv = route(comm, &own, &|p| plan.writer_of(plan.shard_of(p)));
    let lens = lens_at(&plan.writer_positions(rank), &recv, rank)?;
    Ok((plan, lens))
}

/// On rank 0: the keys of the samples `--equalize` drops and repeats, each in permuted order.
/// Fewer than S samples of each, so re-reading their first header is cheap.
fn equalized_keys(
    comm: &impl Comm,
    inputs: &[InputShard],
    local: &[LocalSample],
    placement: &Placement,
    expected: u64,
) -> Result<(Vec<String>, Vec<String>)> {
    let mut mine: Vec<(u64, bool, String)> = Vec::new();
    let mut failed = Ok(());
    if expected > 0 {
        // In input order, so each shard's keys are read in one pass (one decompression).
        let picked: Vec<(usize, (u64, bool))> = (0..local.len())
            .filter_map(|i| placement.equalized(i).map(|e| (i, e)))
            .collect();
        for same_shard in picked.chunk_by(|a, b| local[a.0].shard == local[b.0].shard) {
            let shard = local[same_shard[0].0].shard as usize;
            let samples: Vec<(u64, u64)> = same_shard
                .iter()
                .map(|&(i, _)| (local[i].start, local[i].len))
                .collect();
            match keys_at(&inputs[shard].path, &samples) {
                Ok(keys) => mine.extend(
                    same_shard
                        .iter()
                        .zip(keys)
                        .map(|(&(_, (at, dropped)), key)| (at, dropped, key)),
                ),
                Err(e) => {
                    failed = Err(e);
                    break;
                }
            }
        }
    }
    // Every rank takes part in the gather, failed or not; the caller agrees on the outcome.
    let all = gather_concat::<(u64, bool, String)>(comm, 0, &mine);
    failed?;
    let mut all = all?;
    all.sort();
    let (dropped, repeated): (Vec<_>, Vec<_>) = all.into_iter().partition(|k| k.1);
    Ok((
        dropped.into_iter().map(|k| k.2).collect(),
        repeated.into_iter().map(|k| k.2).collect(),
    ))
}
