//! `reshard run`: one job as a list of named phases, over any [`Comm`].
//!
//! For each phase, rank 0 narrates, one call runs it on every rank, and the ranks agree on its
//! outcome before the next starts, so that one rank's failure stops every rank at the same point
//! (rank 0 then removes the staging directory). Nothing is visible at the output path until the
//! publish phase renames it there.
//!
//! | phase      | module        | what it does                                                   |
//! |------------|---------------|----------------------------------------------------------------|
//! | expand     | [`expand`]    | input spec -> ordered shard list; output checked; staging made |
//! | index      | [`index`]     | tar headers of each rank's share -> samples, global numbering  |
//! |            | [`duplicates`]| one key in two samples, across all shards                      |
//! | plan       | [`place`]     | every sample's output position: permutation, order, key map    |
//! |            | [`layout`]    | every shard laid out by its writer before any data moves       |
//! | exchange   | [`exchange`]  | bounded all-to-all rounds; writers place samples as they come  |
//! | finish     | [`finish`]    | inputs unchanged; shards synced, compressed, indexed, digested |
//! |            | [`publish`]   | manifest; one rename; `--link`, `--keep`                        |
//! |            | [`summary`]   | per-rank figures gathered for the summary and `--report`      |

pub mod duplicates;
pub mod exchange;
pub mod expand;
pub mod finish;
pub mod index;
pub mod layout;
pub mod link;
pub mod place;
pub mod publish;
pub mod series;
pub mod summary;

use std::fs;

use anyhow::Result;

use crate::comm::{agree, broadcast_result, Comm};
use crate::config::RunConfig;
use crate::output::OutputShards;
use crate::progress::{PhaseTimes, Progress};
use crate::report::{narrate, PlanReport};
use crate::size::human_bytes;
use exchange::{Buffers, ExchangeStats};
use expand::{Setup, HEARTBEATS};
use index::Index;
use layout::Laid;
use place::Placed;
use summary::Summary;

/// What a job ends with.
#[derive(Debug)]
pub enum Outcome {
    /// The output was written and published.
    Ran(Box<Summary>),
    /// Only planned (`--dry-run`, `reshard plan`); the report is on rank 0.
    Planned(Option<Box<PlanReport>>),
}

/// What the planning phases leave on every rank: the samples, their positions, the layout.
pub struct Planned {
    pub index: Index,
    pub placed: Placed,
    pub laid: Laid,
}

/// Runs the whole job on this rank.
///
/// # Errors
/// Bad input, I/O failure or invalid request, on this rank (the message names file and offset)
/// or on another ([`crate::comm::PeerFailed`]). On error nothing is published and the staging
/// directory is removed.
pub fn run(comm: &impl Comm, cfg: &RunConfig) -> Result<Outcome> {
    let lead = comm.rank() == 0;
    let mut times = PhaseTimes::default();
    times.start("expand");
    let setup: Setup = broadcast_result(comm, 0, lead.then(|| expand::prepare(cfg)))?;
    let result = run_phases(comm, cfg, &setup, &mut times);
    if let (true, Err(_), Some(staging)) = (lead, &result, &setup.staging) {
        // Every rank has left the failed phase (failures are agreed collectively).
        let _ = fs::remove_dir_all(staging);
    }
    result
}

/// The phases after expand.
fn run_phases(
    comm: &impl Comm,
    cfg: &RunConfig,
    setup: &Setup,
    times: &mut PhaseTimes,
) -> Result<Outcome> {
    let lead = comm.rank() == 0;
    narrate_start(comm, setup);
    times.start("index");
    let mut index = index::run(comm, cfg, &setup.inputs)?;
    times.start("plan");
    let placed = place::run(comm, cfg, &setup.inputs, &mut index)?;
    let laid = layout::run(comm, cfg, &setup.inputs, &index, &placed)?;
    let planned = Planned {
        index,
        placed,
        laid,
    };
    if cfg.dry_run {
        times.stop();
        let report = lead.then(|| Box::new(summary::plan_report(cfg, setup, &planned)));
        return Ok(Outcome::Planned(report));
    }
    let output = agree(
        comm,
        OutputShards::create(
            setup.staging()?,
            &planned.placed.names,
            &planned.laid.layout,
        ),
    )?;
    times.start("exchange");
    let stats = exchange_phase(comm, cfg, setup, &planned, &output)?;
    times.start("finish");
    let finished = finish::run(comm, cfg, setup, &planned, output)?;
    publish::run(comm, cfg, setup, &planned, &finished)?;
    times.stop();
    let summary = summary::gather(comm, cfg, setup, &planned, &stats, times)?;
    Ok(Outcome::Ran(Box::new(summary)))
}

/// Rank 0 says what the job reads and where it writes.
fn narrate_start(comm: &impl Comm, setup: &Setup) {
    let (ranks, lead) = (comm.size(), comm.rank() == 0);
    let input_bytes: u64 = setup.inputs.iter().map(|s| s.size).sum();
    narrate(
        lead,
        format_args!(
            "indexing {} input shards ({}) on {ranks} rank{}",
            setup.inputs.len(),
            human_bytes(input_bytes),
            if ranks == 1 { "" } else { "s" }
        ),
    );
    if let Some(staging) = &setup.staging {
        // Named up front: if the job is killed, no rank may live to say where it was writing.
        narrate(
            lead,
            format_args!(
                "assembling the output in {} (renamed at the end)",
                staging.display()
            ),
        );
    }
}

/// The exchange, with a progress display on rank 0.
fn exchange_phase(
    comm: &impl Comm,
    cfg: &RunConfig,
    setup: &Setup,
    planned: &Planned,
    output: &OutputShards,
) -> Result<ExchangeStats> {
    let ranks = comm.size();
    let layout = &planned.laid.layout;
    let total_out = comm.all_sum(&[layout.sample_bytes()])[0];
    let mut progress = Progress::new(comm.rank() == 0, total_out);
    let job = exchange::Job {
        inputs: &setup.inputs,
        local: &planned.index.local,
        placement: &planned.placed.placement,
        plan: &planned.laid.plan,
        layout,
        output,
    };
    let stats = exchange::run(
        comm,
        &job,
        Buffers::for_job(cfg.mem_limit, ranks, total_out / ranks as u64),
        cfg.stall_timeout,
        Some(setup.staging()?.join(HEARTBEATS)),
        &mut |d| progress.update(d),
    )?;
    progress.finish();
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::comm::local::LocalComm;
    use crate::config::Balance;
    use crate::output::manifest::Manifest;
    use crate::output::shard_file_name;
    use crate::tar::{Codec, Rules};

    /// Writes `shards` small tar files with uneven sample counts and sizes.
    fn write_inputs(dir: &Path, shards: usize) -> Vec<String> {
        let mut specs = Vec::new();
        let mut n = 0u32;
        for s in 0..shards {
            let path = dir.join(format!("in-{s:02}.tar"));
            let mut b = tar::Builder::new(fs::File::create(&path).unwrap());
            for _ in 0..(3 + 7 * s) {
                for ext in ["jpg", "cls"] {
                    let data = vec![(n % 251) as u8; (n as usize * 37) % 3000 + 1];
                    let mut h = tar::Header::new_gnu();
                    h.set_size(data.len() as u64);
                    h.set_mode(0o644);
                    b.append_data(&mut h, format!("k{n:05}.{ext}"), &data[..])
                        .unwrap();
                }
                n += 1;
            }
            b.finish().unwrap();
            specs.push(path.display().to_string());
        }
        specs
    }

    fn config(inputs: Vec<String>, output: PathBuf, mem_limit: u64) -> RunConfig {
        RunConfig {
            inputs,
            output: Some(output),
            sizing: crate::plan::Sizing::Count(5),
            equalize: crate::plan::Equalize::None,
            balance: Balance::Count,
            gpus: None,
            dry_run: false,
            json: false,
            seed: 3,
            epoch: 0,
            prefix: "shard".into(),
            mem_limit,
            force: false,
            report: None,
            rules: Rules::default(),
            checksum: false,
            compress: Codec::Plain,
            index: None,
            link: None,
            keep: None,
            stall_timeout: std::time::Duration::from_secs(120),
            max_round_bytes: i32::MAX as u64,
            order: crate::plan::order::OrderSpec::default(),
            loaders: crate::config::LoaderIndexes::default(),
        }
    }

    fn shard_bytes(dir: &Path) -> Vec<Vec<u8>> {
        (0..5)
            .map(|s| fs::read(dir.join(shard_file_name("shard", s))).unwrap())
            .collect()
    }

    #[test]
    fn in_process_runs_are_identical_for_any_rank_count() {
        let tmp = tempfile::tempdir().unwrap();
        let inputs = write_inputs(tmp.path(), 4);
        let mut outputs = Vec::new();
        for ranks in 1..=4 {
            let out = tmp.path().join(format!("out-{ranks}"));
            // A 1 MiB budget forces many rounds and chunked samples on the larger rank counts.
            let cfg = config(inputs.clone(), out.clone(), 1 << 20);
            let results = LocalComm::run(ranks, |c| match run(c, &cfg) {
                Ok(Outcome::Ran(s)) => Ok((s.samples, s.shards)),
                Ok(Outcome::Planned(_)) => panic!("not a dry run"),
                Err(e) => Err(e),
            });
            for r in results {
                assert_eq!(r.unwrap(), (3 + 10 + 17 + 24, 5));
            }
            outputs.push(shard_bytes(&out));
            let manifest: Manifest =
                serde_json::from_slice(&fs::read(out.join("index.json")).unwrap()).unwrap();
            let counts: Vec<u64> = manifest.shardlist.iter().map(|e| e.nsamples).collect();
            assert_eq!(counts, [11, 11, 11, 11, 10]);
            assert!(!tmp
                .path()
                .join(format!(".out-{ranks}.reshard-tmp"))
                .exists());
        }
        for o in &outputs[1..] {
            assert_eq!(o, &outputs[0]);
        }
    }

    #[test]
    fn a_failure_on_one_rank_stops_all_and_publishes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let mut inputs = write_inputs(tmp.path(), 3);
        let bad = tmp.path().join("bad.tar");
        fs::write(&bad, vec![b'x'; 4096]).unwrap();
        inputs.push(bad.display().to_string());
        let out = tmp.path().join("out");
        let cfg = config(inputs, out.clone(), 1 << 20);
        let results = LocalComm::run(3, |c| {
            run(c, &cfg).map(|_| ()).map_err(|e| format!("{e:#}"))
        });
        let real: Vec<&String> = results
            .iter()
            .filter_map(|r| r.as_ref().err())
            .filter(|e| !e.contains("stopped because"))
            .collect();
        assert_eq!(real.len(), 1, "{results:?}");
        assert!(
            real[0].contains("bad.tar") && real[0].contains("byte offset 0"),
            "{}",
            real[0]
        );
        assert!(results.iter().all(Result::is_err));
        assert!(!out.exists());
        assert!(!tmp.path().join(".out.reshard-tmp").exists());
    }
}
