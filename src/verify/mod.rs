//! `reshard verify`: proves that an output directory holds exactly the input's samples, that
//! every shard is a sound tar matching `index.json`, and measures how well the order is shuffled.
//!
//! Every sample is one contiguous byte range that moves verbatim, so a sample is identified by a
//! 128-bit digest of its raw bytes (headers, data and padding). Each rank indexes and digests a
//! share of the input shards and a share of the output shards (contiguous runs balanced by bytes,
//! like `run`), then sends each sample's record — digest, position, file and offset — to the rank
//! `digest mod P`. That rank sees every copy of a digest, from both sides, and compares the counts:
//! no rank ever holds more than its share of the records, and none gathers all digests.
//!
//! What "exactly the input's samples" means depends on `--equalize` (read from index.json):
//! * `none`: every digest occurs as often in the output as in the input.
//! * `drop`: no digest occurs more often in the output than in the input; the input samples left
//!   out number `samples - output_samples` and their keys are the `dropped` list of index.json.
//! * `pad`: every digest occurs at least as often, and at most twice as often, in the output as in
//!   the input; the extra copies number `output_samples - samples` and their keys are the
//!   `repeated` list.
//!
//! Shuffle quality is reported, never judged: Spearman's ρ between the input position (global
//! canonical index) and the output position (global index in shard-list order) of each sample,
//! and how many distinct input shards each output shard draws from.
//!
//! The files follow the run of `verify`: `setup` (index.json and the inputs, on rank 0), `stream`
//! and `records` (each shard read once, each sample digested with `digest` into a record routed to
//! its owner), `tally` (the owners compare), `problems` (what does not hold) and `report`.

mod digest;
mod members;
mod problems;
mod records;
mod report;
mod setup;
mod tally;

use std::time::Instant;

use anyhow::Result;

pub(crate) use crate::config::VerifyConfig;
pub use report::VerifyReport;
pub(crate) use report::{Mismatches, Shuffle};

use crate::comm::wire::{decode_concat, encode_values as encode};
use crate::progress::PhaseTimes;
use crate::report::narrate::count;
use problems::{check_outputs, data_problems, Found};
use records::{digest_inputs, route_records, Record};
use report::SplitFigures;
use setup::{IndexView, Lead, OrderCheck, Setup};
use tally::{compare, distinct_inputs_per_output, Sums, Tally};

use crate::comm::{agree, exclusive_sum, gather, Comm};
use crate::plan::permute::Permutation;
use crate::plan::{assign_inputs, Equalize};
use crate::report::mixing::Mixing;
use crate::report::picture::{self, Picture};
use crate::report::{narrate, Stats};

/// What every rank gets from `verify`: the verdict, and the report on rank 0.
#[derive(Debug)]
pub struct Verdict {
    pub ok: bool,
    pub report: Option<VerifyReport>,
}

/// Verifies `cfg.output` against `cfg.inputs` on this rank; every rank must call it.
///
/// Bad output is not an error: it is a problem in the report, and the verdict is not ok.
///
/// # Errors
/// The input cannot be expanded or read (the message names the file and byte offset), the output
/// directory does not exist, or another rank failed ([`crate::comm::PeerFailed`]).
pub fn verify(comm: &impl Comm, cfg: &VerifyConfig) -> Result<Verdict> {
    let started = Instant::now();
    // Only for `RESHARD_TRACE_PHASES`: the report carries the total time alone.
    let mut times = PhaseTimes::for_rank(comm.rank());
    times.start("verify setup");
    let (setup, lead) = setup::share(comm, cfg)?;
    narrate(
        comm.rank() == 0,
        format_args!(
            "verify: digesting {} and {} on {}",
            count(setup.inputs.len() as u64, "input shard"),
            count(setup.outputs.len() as u64, "output shard"),
            count(comm.size() as u64, "rank")
        ),
    );
    times.start("verify inputs");
    let inputs = input_side(comm, &setup, cfg.ignore_zeros)?;
    times.start("verify outputs");
    let outputs = output_side(comm, &setup);
    times.start("verify compare");
    let tally = owners_compare(comm, &setup, inputs.records, outputs.records);
    times.start("verify report");
    let bytes = (inputs.bytes, outputs.bytes);
    let findings = gather_findings(comm, &setup, &tally, &outputs.problems, bytes);
    let report = lead.map(|lead| {
        let counts = (inputs.samples, outputs.samples);
        lead_report(cfg, &setup, lead, counts, findings, started)
    });
    times.stop();
    if let Some(path) = &cfg.plot {
        plot(comm, path, &setup, &tally, report.as_ref())?;
    }
    let ok = report.as_ref().is_none_or(|r| r.ok);
    let ok = comm.broadcast(0, vec![u8::from(ok)]) == [1];
    Ok(Verdict { ok, report })
}

/// `--plot`: the mixing counts summed over ranks, the picture drawn by rank 0.
///
/// # Errors
/// Rank 0 cannot write the picture (on every rank).
fn plot(
    comm: &impl Comm,
    path: &std::path::Path,
    setup: &Setup,
    tally: &Tally,
    report: Option<&VerifyReport>,
) -> Result<()> {
    let mixing = tally.mixing.as_ref().expect("compare counts the mixing");
    let mixing = mixing.with_counts(comm.all_sum(&mixing.counts));
    let drawn = report.map_or(Ok(()), |r| {
        let bytes: Vec<u64> = setup.outputs.iter().map(|o| o.size.unwrap_or(0)).collect();
        let samples: Vec<u64> = setup
            .outputs
            .iter()
            .map(|o| o.listed.as_ref().map_or(0, |e| e.nsamples))
            .collect();
        let picture = Picture {
            title: format!(
                "reshard verify {}: {} samples, {} input shards -> {} output shards",
                r.output.display(),
                r.output_samples,
                r.input_shards,
                r.output_shards
            ),
            shard_bytes: &bytes,
            shard_samples: &samples,
            mixing: &mixing,
        };
        if let Some(w) = picture::draw(path, &picture)? {
            crate::errln!("reshard: warning: {w}");
        }
        narrate(
            true,
            format_args!("verify: drew the output to {}", path.display()),
        );
        narrate(true, format_args!("verify: {}", mixing.verdict()));
        Ok(())
    });
    agree(comm, drawn)
}

/// One side's records on this rank, with global positions assigned.
struct Digested {
    records: Vec<Record>,
    /// Samples on this side, over all ranks.
    samples: u64,
    /// Sample bytes this rank read.
    bytes: u64,
    /// Problems this rank found (output side only).
    problems: Vec<String>,
}

/// Digests this rank's share of the input. A failure here is the input's, and ends the job on
/// every rank as `run` would (`ignore_zeros`: `--ignore-zeros`, read as `run` reads).
fn input_side(comm: &impl Comm, setup: &Setup, ignore_zeros: bool) -> Result<Digested> {
    let sizes: Vec<u64> = setup.inputs.iter().map(|s| s.size).collect();
    let mine = assign_inputs(&sizes, comm.size())[comm.rank()].clone();
    let (mut records, bytes) = agree(comm, digest_inputs(&setup.inputs, mine, ignore_zeros))?;
    let (first, samples) = exclusive_sum(comm, records.len() as u64);
    for (i, r) in records.iter_mut().enumerate() {
        r.index = first + i as u64;
    }
    Ok(Digested {
        records,
        samples,
        bytes,
        problems: Vec::new(),
    })
}

/// Checks and digests this rank's share of the output; every failure is a finding. Output
/// shards go to ranks in contiguous runs, so an exclusive sum of the counts gives output
/// positions in shard-list order.
fn output_side(comm: &impl Comm, setup: &Setup) -> Digested {
    let sizes: Vec<u64> = setup.outputs.iter().map(|s| s.size.unwrap_or(0)).collect();
    let mine = assign_inputs(&sizes, comm.size())[comm.rank()].clone();
    let mut checked = check_outputs(&setup.outputs, mine);
    let (first, samples) = exclusive_sum(comm, checked.records.len() as u64);
    for (i, r) in checked.records.iter_mut().enumerate() {
        r.index = first + i as u64;
    }
    Digested {
        records: checked.records,
        samples,
        bytes: checked.bytes,
        problems: checked.problems,
    }
}

/// Routes every record to the rank owning its digest, which compares the copies it gets.
fn owners_compare(
    comm: &impl Comm,
    setup: &Setup,
    inputs: Vec<Record>,
    outputs: Vec<Record>,
) -> Tally {
    // The seeded order is a question only of an input that still holds the manifest's samples;
    // one that grew or shrank fails on its missing or extra samples instead.
    let input_samples = comm.all_sum(&[inputs.len() as u64])[0];
    let received = route_records(comm, [inputs, outputs]);
    let mixing = Mixing::new(setup.outputs.len() as u64, setup.inputs.len() as u64);
    let order = match setup.order {
        OrderCheck::Seeded {
            seed,
            epoch,
            samples,
        } if samples == input_samples => Some(Permutation::new(seed, epoch, samples)),
        _ => None,
    };
    compare(
        received,
        setup.equalize,
        setup.outputs.len(),
        mixing,
        order.as_ref(),
    )
}

/// What the ranks found: totals summed on every rank, the rest gathered (encoded) on rank 0.
struct Findings {
    mismatches: Mismatches,
    /// Distinct input shards per output shard (rank 0).
    per_shard: Vec<u64>,
    sums: Vec<Vec<u8>>,
    examples: Vec<Vec<u8>>,
    equalized_keys: Option<Vec<Vec<u8>>>,
    shard_problems: Vec<Vec<u8>>,
    bytes_read: u64,
    /// The input sample bytes each rank read.
    input_bytes_per_rank: Vec<u64>,
    ranks: usize,
}

/// Sums and gathers every rank's findings (collectives: every rank calls them in this order).
fn gather_findings(
    comm: &impl Comm,
    setup: &Setup,
    tally: &Tally,
    shard_problems: &[String],
    (input_bytes, output_bytes): (u64, u64),
) -> Findings {
    let mut counts = tally.mismatches.to_array().to_vec();
    counts.push(tally.sums.n as u64);
    let counts = comm.all_sum(&counts);
    let mismatches = Mismatches::from_array(&counts[..6]);

    let per_shard = distinct_inputs_per_output(comm, &tally.shard_pairs, setup.outputs.len());
    let sums = gather(comm, 0, &tally.sums.encode());
    let examples = gather(comm, 0, &encode(&tally.describe_examples(setup)));
    // A valid run drops or repeats fewer samples than it has shards: only then are their keys
    // looked up (one header read each) and compared with index.json's lists.
    let equalized = match setup.equalize {
        Equalize::None => None,
        Equalize::Drop => Some(mismatches.left_out),
        Equalize::Pad => Some(mismatches.repeated),
    };
    let equalized_keys = match equalized {
        Some(n) if n < setup.outputs.len().max(1) as u64 => {
            Some(gather(comm, 0, &encode(&tally.equalized_keys(setup))))
        }
        _ => None,
    };
    let shard_problems = gather(comm, 0, &encode(&shard_problems));
    let mut per_rank = vec![0; comm.size() + 1];
    (per_rank[0], per_rank[comm.rank() + 1]) = (input_bytes + output_bytes, input_bytes);
    let per_rank = comm.all_sum(&per_rank);
    let (bytes_read, input_bytes_per_rank) = (per_rank[0], per_rank[1..].to_vec());
    Findings {
        mismatches,
        per_shard,
        sums,
        examples,
        equalized_keys,
        shard_problems,
        bytes_read,
        input_bytes_per_rank,
        ranks: comm.size(),
    }
}

/// Values gathered from peers decode: they run the same code.
const PEERS: &str = "values encoded by a peer";

/// Rank 0's report: its own problems, every rank's, and the measures of the shuffle.
fn lead_report(
    cfg: &VerifyConfig,
    setup: &Setup,
    lead: Lead,
    (input_samples, output_samples): (u64, u64),
    findings: Findings,
    started: Instant,
) -> VerifyReport {
    let mut problems = lead.problems;
    // Ranks hold contiguous runs of output shards in rank order: shard order.
    problems.extend(decode_concat::<String>(&findings.shard_problems).expect(PEERS));
    let found = Found {
        input_samples,
        output_samples,
        mismatches: findings.mismatches,
        examples: decode_concat(&findings.examples).expect(PEERS),
        equalized_keys: findings
            .equalized_keys
            .as_deref()
            .map(|k| decode_concat(k).expect(PEERS)),
    };
    problems.extend(data_problems(setup, lead.index.as_ref(), &found));
    let sums = findings
        .sums
        .iter()
        .map(|b| Sums::decode(b))
        .fold(Sums::default(), Sums::merge);
    VerifyReport {
        ok: problems.is_empty(),
        output: cfg.output.clone(),
        ranks: findings.ranks,
        input_shards: setup.inputs.len(),
        input_samples,
        output_shards: setup.outputs.len(),
        output_samples,
        equalize: setup.equalize,
        mismatches: findings.mismatches,
        splits: split_figures(lead.index.as_ref()),
        order: setup.order.describe(),
        shuffle: Shuffle {
            pairs: sums.n as u64,
            spearman: sums.correlation(),
            random_bound: (sums.n >= 2).then(|| 3.0 / ((sums.n - 1) as f64).sqrt()),
            input_shards_per_output_shard: Stats::of(&findings.per_shard),
        },
        bytes_read: findings.bytes_read,
        input_bytes_per_rank: findings.input_bytes_per_rank,
        seconds: started.elapsed().as_secs_f64(),
        problems,
    }
}

/// The splits of a `--split` output, as its index.json lists them.
fn split_figures(index: Option<&IndexView>) -> Vec<SplitFigures> {
    let splits = index
        .and_then(|ix| ix.reshard.as_ref())
        .and_then(|r| r.splits.as_ref());
    splits
        .into_iter()
        .flatten()
        .map(|s| SplitFigures {
            name: s.split.clone().unwrap_or_default(),
            shards: s.shards,
            samples: s.output_samples,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::fs::{self, File};
    use std::path::Path;

    use super::*;
    use crate::cli::resolve::run_config;
    use crate::cli::{Cli, Command};
    use crate::comm::local::LocalComm;
    use clap::Parser;

    fn write_inputs(dir: &Path) -> Vec<String> {
        let mut specs = Vec::new();
        let mut n = 0u32;
        for s in 0..3 {
            let path = dir.join(format!("in-{s}.tar"));
            let mut b = tar::Builder::new(File::create(&path).unwrap());
            for _ in 0..(4 + 5 * s) {
                for ext in ["jpg", "cls"] {
                    let data = vec![(n % 251) as u8; (n as usize * 53) % 2000 + 1];
                    let mut h = tar::Header::new_gnu();
                    h.set_size(data.len() as u64);
                    h.set_mode(0o644);
                    b.append_data(&mut h, format!("k{n:04}.{ext}"), &data[..])
                        .unwrap();
                }
                n += 1;
            }
            b.finish().unwrap();
            specs.push(path.display().to_string());
        }
        specs
    }

    fn reshard(inputs: &[String], out: &Path) {
        let mut argv = vec!["reshard".to_string(), "run".into()];
        for i in inputs {
            argv.extend(["--input".into(), i.clone()]);
        }
        argv.extend(["--output".into(), out.display().to_string()]);
        argv.extend(["--shards", "4", "--seed", "9"].map(String::from));
        let Command::Run(args) = Cli::try_parse_from(argv).unwrap().command else {
            unreachable!()
        };
        let cfg = run_config(&args, false).unwrap();
        for r in LocalComm::run(2, |c| {
            crate::job::run(c, &crate::cli::resolve::job_settings(&cfg)).map(|_| ())
        }) {
            r.unwrap();
        }
    }

    fn verdicts(inputs: &[String], out: &Path, ranks: usize) -> Vec<Verdict> {
        let cfg = VerifyConfig {
            inputs: inputs.to_vec(),
            files: Default::default(),
            output: out.to_path_buf(),
            json: false,
            plot: None,
            ignore_zeros: false,
        };
        LocalComm::run(ranks, |c| verify(c, &cfg).unwrap())
    }

    #[test]
    fn in_process_verify_over_any_rank_count() {
        let tmp = tempfile::tempdir().unwrap();
        let inputs = write_inputs(tmp.path());
        let out = tmp.path().join("out");
        reshard(&inputs, &out);
        for ranks in 1..=4 {
            let v = verdicts(&inputs, &out, ranks);
            assert!(v.iter().all(|v| v.ok));
            let report = v[0].report.as_ref().unwrap();
            assert!(report.problems.is_empty(), "{:?}", report.problems);
            assert_eq!((report.input_samples, report.output_samples), (27, 27));
            assert_eq!(report.shuffle.pairs, 27);
            assert!(v[1..].iter().all(|v| v.report.is_none()));
        }

        // One flipped data byte: every rank fails, rank 0 names both sides.
        let shard = out.join("shard-000001.tar");
        let mut bytes = fs::read(&shard).unwrap();
        bytes[512 + 1] ^= 0xFF;
        fs::write(&shard, bytes).unwrap();
        let v = verdicts(&inputs, &out, 3);
        assert!(v.iter().all(|v| !v.ok));
        let report = v[0].report.as_ref().unwrap();
        assert_eq!(report.mismatches.missing, 1);
        assert_eq!(report.mismatches.not_in_input, 1);
        let text = report.render();
        assert!(
            text.contains("shard-000001.tar at byte offset 0") && text.contains("\"k00"),
            "{text}"
        );
    }

    #[test]
    fn a_bad_input_is_an_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let mut inputs = write_inputs(tmp.path());
        let out = tmp.path().join("out");
        reshard(&inputs, &out);
        let bad = tmp.path().join("bad.tar");
        fs::write(&bad, vec![b'x'; 2048]).unwrap();
        inputs.push(bad.display().to_string());
        let cfg = VerifyConfig {
            files: Default::default(),
            inputs,
            output: out,
            json: false,
            plot: None,
            ignore_zeros: false,
        };
        let errors = LocalComm::run(2, |c| {
            verify(c, &cfg).map(|_| ()).map_err(|e| format!("{e:#}"))
        });
        let real: Vec<&String> = errors
            .iter()
            .filter_map(|r| r.as_ref().err())
            .filter(|e| !e.contains("stopped because"))
            .collect();
        assert_eq!(real.len(), 1, "{errors:?}");
        assert!(real[0].contains("bad.tar") && real[0].contains("byte offset 0"));
        assert!(errors.iter().all(Result::is_err));
    }
}
