//! Phase "finish": the inputs are checked unchanged, each writer syncs its shards, compresses
//! them (`--compress`), saves their index, writes their loader indexes (`--energon`,
//! `--dali-index`) and digests them (`--checksum`); rank 0 gathers the sizes and digests for the
//! manifest.

use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::comm::wire::gather_concat;
use crate::comm::{agree, gather, Comm};
use crate::config::FinishSettings;
use crate::hooks;
use crate::input::InputShard;
use crate::job::destination::lock::OutputLock;
use crate::job::handoff::{Finished, Indexed, Laid, Planned, Setup};
use crate::output::{checkpoint, loaders, saved_index};
use crate::output::{compress_shard, md5_file, OutputShards, ShardNames};
use crate::storage;
use crate::tar::{Codec, Sample};

/// Finishes this rank's shards once the exchange is done, once rank 0 found that it still
/// holds the output's `lock`. Consumes `output`: its files are closed when this returns.
///
/// # Errors
/// Another run took the output over, an input changed during the run, or a shard cannot be
/// synced, compressed, indexed or read back; agreed on every rank.
pub(crate) fn run(
    comm: &impl Comm,
    settings: &FinishSettings,
    setup: &Setup,
    planned: &Planned,
    output: OutputShards,
    lock: Option<&OutputLock>,
) -> Result<Finished> {
    let (index, placed, laid) = (&planned.index, &planned.placed, &planned.laid);
    let staging = setup.staging()?;
    hooks::kill_at(comm.rank(), "finish");
    hooks::pause_before_finish(staging, comm.rank());
    // Before anything is written by path: a run taken over while it was silent stops here.
    agree(comm, lock.map_or(Ok(()), |l| l.check_owned(staging)))?;
    if comm.rank() == 0 && settings.compress != Codec::Plain {
        // Compressing replaces the plain staging shards a resumed run would continue: from
        // here on, a failed run starts over (ordered before any compression by the next agree).
        checkpoint::forget(staging);
    }
    // An input that changed while it was read may have fed stale or torn samples: refuse.
    agree(comm, check_unchanged(&setup.inputs, index))?;
    let lead_plain = comm.rank() == 0 && settings.compress == Codec::Plain;
    // Every shard complete and synced: a failure from here on resumes without moving data.
    let synced = output.sync().and_then(|()| {
        let all = (lead_plain && index.samples > 0).then_some((0, index.samples));
        let names = || {
            (0..placed.shards)
                .map(|s| placed.names.plain(s))
                .collect::<Vec<_>>()
        };
        all.map_or(Ok(()), |all| checkpoint::record_all(staging, all, &names()))
    });
    agree(comm, synced)?;
    let (sizes, sums) = agree(comm, finish_shards(settings, staging, laid, &placed.names))?;
    // Gathered in the writers' order; the manifest lists shards in shard order.
    let plan = &laid.plan;
    let file_bytes = gather_concat::<u64>(comm, 0, &sizes);
    let md5 = plan.in_shard_order(&gather(comm, 0, &sums).concat(), 16);
    drop(output);
    let file_bytes = plan.in_shard_order(&agree(comm, file_bytes)?, 1);
    Ok(Finished { file_bytes, md5 })
}

/// Compresses (`--compress`), saves the index of and digests (`--checksum`) each of this
/// writer's shards: their file sizes and digests.
fn finish_shards(
    settings: &FinishSettings,
    staging: &Path,
    laid: &Laid,
    names: &ShardNames,
) -> Result<(Vec<u64>, Vec<u8>)> {
    let (plan, layout) = (&laid.plan, &laid.layout);
    let mut sizes = Vec::new();
    let mut sums = Vec::new();
    for (k, &s) in layout.shards.iter().enumerate() {
        let plain = staging.join(names.plain(s));
        let published = staging.join(names.published(s, settings.compress));
        let size = if settings.compress == Codec::Plain {
            layout.shard_bytes[k]
        } else {
            compress_shard(&plain, &published, settings.compress)?
        };
        sizes.push(size);
        let samples: Vec<Sample> = plan
            .shard_positions(s)
            .map(|p| {
                let (start, len) = layout.place(p).expect("laid out");
                Sample { start, len }
            })
            .collect();
        // Next to the shard: `OUTPUT/.reshard`, or `OUTPUT/SPLIT/.reshard` with `--split`, so
        // that a split read as an input finds its saved index.
        let dir = published
            .parent()
            .unwrap_or(staging)
            .join(saved_index::DIR_NAME);
        if storage::source(&dir)
            .stat(&dir)
            .map_or(true, |s| s.kind != storage::Kind::Dir)
        {
            storage::sink(&dir)
                .create_dir_all(&dir)
                .with_context(|| format!("{}: cannot create", dir.display()))?;
        }
        saved_index::save(&dir, &published, samples.iter().copied())?;
        loaders::write_shard(&settings.loaders, staging, &plain, s, &samples)?;
        if settings.checksum {
            sums.extend(md5_file(&published)?);
        }
    }
    Ok((sizes, sums))
}

/// Checks that this rank's input shards are the files it indexed, unchanged: the size the run
/// planned with, and the size, modification and change times and inode this rank saw before it
/// read them (a rewrite in place of the same size moves the times; a replacement by rename
/// changes the inode).
fn check_unchanged(inputs: &[InputShard], index: &Indexed) -> Result<()> {
    for (input, then) in inputs[index.mine.clone()].iter().zip(&index.stamps) {
        let now = storage::stamp(&input.path).with_context(|| {
            format!("input {} disappeared during the run", input.path.display())
        })?;
        let mut changes = now.changes_since(then, true);
        if changes.is_empty() && now.size != input.size {
            changes = format!("size {} -> {} bytes", input.size, now.size);
        }
        if !changes.is_empty() {
            bail!(
                "input {} changed during the run ({changes}): its samples cannot be trusted; nothing is published",
                input.path.display()
            );
        }
    }
    Ok(())
}
