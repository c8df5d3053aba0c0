//! Phase "summary": what a finished run reports, gathered from every rank; and the plan that
//! `reshard plan` and `--dry-run` print instead.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::comm::Comm;
use crate::config::ReportSettings;
use crate::job::handoff::{ExchangeStats, Planned, Setup};
use crate::progress::PhaseTimes;
use crate::report::narrate::count;
use crate::report::plan::AtLimits;
use crate::report::ranks::{seconds, Spread};
use crate::report::storage::FreeSpace;
use crate::report::{GpuShare, PlanReport, Stats, Storage};
use crate::size::human_bytes;
use crate::storage::{self, Kind};
use crate::sys::peak_rss;
use crate::tar::{Hygiene, Skipped};
use crate::throttle::{self, Limits, RateReport};

/// One rank's share of the work.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct RankStats {
    /// Sample bytes read from the input and sent.
    pub(crate) bytes_read: u64,
    /// Sample bytes received and written to this rank's shards.
    pub(crate) bytes_written: u64,
    /// Peak resident memory (VmHWM) in bytes; 0 where unknown.
    pub(crate) peak_rss: u64,
    /// Seconds this rank's reader spent reading (and copying its own samples), and its writer
    /// writing: waits for buffers and peers excluded.
    pub(crate) read_seconds: f64,
    pub(crate) write_seconds: f64,
    /// `--input-files`: the directories this rank listed in the walk phase, and the files it
    /// examined (`lstat`, or `stat` for a link): every file once over the ranks.
    pub(crate) dirs_listed: u64,
    pub(crate) files_examined: u64,
    /// `--input-files`: the names of files this rank held to walk (its units' files; a large
    /// directory's spread over the ranks by key range as it is listed): every file once.
    pub(crate) names_held: u64,
}

/// Each per-rank figure over the ranks: the summary prints these, `--report` the full table.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct RankSpreads {
    pub(crate) bytes_read: Spread,
    /// In nanoseconds: the rank at the maximum is the slowest reader.
    pub(crate) read_nanos: Spread,
    pub(crate) bytes_written: Spread,
    /// In nanoseconds: the rank at the maximum is the slowest writer.
    pub(crate) write_nanos: Spread,
    pub(crate) peak_rss: Spread,
}

impl RankSpreads {
    /// Six lines: a header, then min / median / max of each figure and the rank at the maximum.
    pub(crate) fn render(&self) -> String {
        let bytes = |v: u64| human_bytes(v);
        let at_max = |s: &Spread, what: &str| format!("{what}: rank {}", s.max_rank);
        let rows = [
            (
                "read",
                self.bytes_read.render(bytes),
                at_max(&self.bytes_read, "most"),
            ),
            (
                "read time",
                self.read_nanos.render(seconds),
                at_max(&self.read_nanos, "slowest reader"),
            ),
            (
                "written",
                self.bytes_written.render(bytes),
                at_max(&self.bytes_written, "most"),
            ),
            (
                "write time",
                self.write_nanos.render(seconds),
                at_max(&self.write_nanos, "slowest writer"),
            ),
            (
                "peak RSS",
                self.peak_rss.render(bytes),
                at_max(&self.peak_rss, "largest"),
            ),
        ];
        let mut s = format!(
            "  per rank   {:>10} {:>10} {:>10}   (every rank: --report)\n",
            "min", "median", "max"
        );
        for (name, values, who) in rows {
            s += &format!("  {name:<10} {values}   {who}\n");
        }
        s
    }
}

/// What a finished run reports.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub(crate) output: PathBuf,
    pub(crate) inputs: usize,
    /// `--input-files`: the loose files packed (every one a member of the output).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) files: Option<u64>,
    pub(crate) input_bytes: u64,
    pub(crate) samples: u64,
    pub(crate) sample_bytes: u64,
    pub(crate) shards: u64,
    /// Samples written (repeats included, dropped excluded).
    pub(crate) output_samples: u64,
    /// Bytes per output shard (only on rank 0).
    pub(crate) shard_bytes: Stats,
    pub(crate) gpus: Option<GpuShare>,
    pub(crate) ranks: usize,
    pub(crate) skipped: Skipped,
    /// Runs of zero blocks read past inside inputs (`--ignore-zeros`).
    pub(crate) zero_runs: u64,
    pub(crate) hygiene: Hygiene,
    pub(crate) phases: PhaseTimes,
    pub(crate) rounds: u64,
    /// Checkpoints recorded during the exchange (for `--resume`).
    pub(crate) checkpoints: u64,
    /// `--resume`: samples and sample bytes an earlier attempt had durably placed, reused.
    pub(crate) reused_samples: u64,
    pub(crate) reused_bytes: u64,
    /// Shards the earlier attempt had completed (with a shuffle, rarely any before its end).
    pub(crate) reused_shards: u64,
    /// The memory budget per rank (`--mem-limit`).
    pub(crate) mem_limit: u64,
    /// Each per-rank figure's min / median / max and the ranks at the extremes.
    pub(crate) rank_spread: RankSpreads,
    /// Per rank, by rank.
    pub(crate) per_rank: Vec<RankStats>,
    /// `--max-read-rate`, `--max-write-rate`: how the run kept to each limit given.
    pub(crate) rate_limits: Vec<RateReport>,
    /// Requests to object storage, over all ranks (none without an `s3://` input or output).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) s3: Option<S3Traffic>,
}

/// Requests to object storage and the bytes they moved, summed over the ranks.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct S3Traffic {
    pub(crate) gets: u64,
    pub(crate) get_bytes: u64,
    /// PUTs of whole objects and parts of multipart uploads.
    pub(crate) puts: u64,
    pub(crate) put_bytes: u64,
}

impl S3Traffic {
    /// Every rank's requests so far, summed; `None` when no rank made any.
    fn gather(comm: &impl Comm) -> Option<S3Traffic> {
        let [gets, get_bytes, puts, put_bytes]: [u64; 4] = comm
            .all_sum(&storage::s3::traffic())
            .try_into()
            .expect("four sums");
        (gets + puts > 0).then_some(S3Traffic {
            gets,
            get_bytes,
            puts,
            put_bytes,
        })
    }

    /// One line: the requests, and per GiB they moved.
    fn render(&self) -> String {
        let per_gib = |requests: u64, bytes: u64| {
            if bytes == 0 {
                String::new()
            } else {
                format!(", {:.0} per GiB", requests as f64 / (bytes as f64 / GIB))
            }
        };
        format!(
            "  s3 requests: {} GET ({}{}), {} PUT ({}{})\n",
            self.gets,
            human_bytes(self.get_bytes),
            per_gib(self.gets, self.get_bytes),
            self.puts,
            human_bytes(self.put_bytes),
            per_gib(self.puts, self.put_bytes)
        )
    }
}

const GIB: f64 = (1u64 << 30) as f64;

impl Summary {
    /// Writes the summary as JSON to `path`.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn write_report(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).expect("serializable");
        storage::sink(path)
            .create_stream(path)
            .and_then(|mut f| f.write_all((text + "\n").as_bytes()))
            .with_context(|| format!("--report {}: cannot write", path.display()))
    }

    /// The human-readable summary rank 0 prints at the end.
    pub fn render(&self) -> String {
        let total = self.phases.total();
        // What was written: with --equalize, not the input's count.
        let written = (self.shard_bytes.mean * self.shards as f64).round() as u64;
        let mut s = format!(
            "reshard: wrote {} shard{} ({} samples, {}) to {} in {:.2} s ({}/s) with {} rank{}\n",
            self.shards,
            if self.shards == 1 { "" } else { "s" },
            self.output_samples,
            human_bytes(written),
            self.output.display(),
            total,
            human_bytes((self.sample_bytes as f64 / total.max(1e-9)) as u64),
            self.ranks,
            if self.ranks == 1 { "" } else { "s" }
        );
        s += &format!(
            "  input: {} shard{}, {}, {} samples\n",
            self.inputs,
            if self.inputs == 1 { "" } else { "s" },
            human_bytes(self.input_bytes),
            self.samples
        );
        if let Some(files) = self.files {
            // What a tree of loose files costs the file system, before and after.
            s += &format!(
                "  loose files: {files} files became {} shard{}\n",
                self.shards,
                if self.shards == 1 { "" } else { "s" }
            );
        }
        if self.output_samples < self.samples {
            s += &format!(
                "  --equalize drop: {} input samples left out\n",
                self.samples - self.output_samples
            );
        } else if self.output_samples > self.samples {
            s += &format!(
                "  --equalize pad: {} samples written twice\n",
                self.output_samples - self.samples
            );
        }
        s += &format!("  shard bytes: {}\n", self.shard_bytes.bytes());
        if let Some(g) = &self.gpus {
            s += &format!("  {}\n", g.render());
        }
        for (name, secs) in &self.phases.phases {
            s += &format!("  {name:<9} {secs:>9.3} s\n");
        }
        s += &format!("  exchange rounds: {}\n", self.rounds);
        if self.checkpoints > 0 {
            s += &format!("  checkpoints (for --resume): {}\n", self.checkpoints);
        }
        if self.reused_samples > 0 {
            s += &format!(
                "  resumed: reused {} ({}) an earlier attempt had placed; {} of {} complete\n",
                count(self.reused_samples, "sample"),
                human_bytes(self.reused_bytes),
                self.reused_shards,
                count(self.shards, "shard")
            );
        }
        let k = self.skipped;
        if k.total() > 0 {
            s += &format!(
                "  skipped entries (not part of any sample): {} directories, {} files without a key, {} links/special files, {} PAX global headers\n",
                k.directories, k.keyless_files, k.other_entries, k.global_headers
            );
        }
        if self.zero_runs > 0 {
            s += &format!(
                "  --ignore-zeros: read past {} end-of-archive markers or lone zero blocks inside inputs\n",
                self.zero_runs
            );
        }
        let h = self.hygiene;
        if h.incomplete + h.excluded + h.duplicates > 0 {
            s += &format!(
                "  sample hygiene: {} incomplete kept, {} incomplete excluded, {} duplicates kept\n",
                h.incomplete, h.excluded, h.duplicates
            );
        }
        for r in &self.rate_limits {
            s += &r.render();
        }
        if let Some(t) = &self.s3 {
            s += &t.render();
        }
        s += &self.rank_spread.render();
        s
    }
}

/// Gathers every rank's figures into the summary (complete on rank 0).
pub(crate) fn gather(
    comm: &impl Comm,
    settings: &ReportSettings,
    setup: &Setup,
    planned: &Planned,
    stats: &ExchangeStats,
    times: &PhaseTimes,
) -> Result<Summary> {
    let (index, placed, laid) = (&planned.index, &planned.placed, &planned.laid);
    let ranks = comm.size();
    let bytes_read = comm.all_gather(stats.bytes_sent);
    let bytes_written = comm.all_gather(stats.bytes_written);
    let peak_rss = comm.all_gather(peak_rss().unwrap_or(0));
    let [reused_samples, reused_bytes, reused_shards]: [u64; 3] = comm
        .all_sum(&[
            stats.samples_reused,
            stats.bytes_reused,
            stats.shards_reused,
        ])
        .try_into()
        .expect("three sums");
    let read_nanos = comm.all_gather(stats.read_nanos);
    let write_nanos = comm.all_gather(stats.write_nanos);
    let listed = comm.all_gather(setup.walk.calls.listed);
    let examined = comm.all_gather(setup.walk.calls.examined);
    let held = comm.all_gather(setup.walk.calls.held);
    let per_rank = (0..ranks)
        .map(|r| RankStats {
            bytes_read: bytes_read[r],
            bytes_written: bytes_written[r],
            peak_rss: peak_rss[r],
            read_seconds: read_nanos[r] as f64 / 1e9,
            write_seconds: write_nanos[r] as f64 / 1e9,
            dirs_listed: listed[r],
            files_examined: examined[r],
            names_held: held[r],
        })
        .collect();
    let rank_spread = RankSpreads {
        bytes_read: Spread::of(&bytes_read),
        read_nanos: Spread::of(&read_nanos),
        bytes_written: Spread::of(&bytes_written),
        write_nanos: Spread::of(&write_nanos),
        peak_rss: Spread::of(&peak_rss),
    };
    Ok(Summary {
        // An `s3://` output is where it was uploaded, not where it was staged.
        output: match &settings.uploaded_to {
            Some(url) => url.clone(),
            None => setup.target()?.to_path_buf(),
        },
        inputs: setup.inputs.len(),
        files: setup.files,
        input_bytes: setup.input_bytes(),
        samples: index.samples,
        sample_bytes: index.sample_bytes,
        shards: placed.shards,
        output_samples: placed.output_samples,
        shard_bytes: Stats::of(&laid.shard_bytes),
        gpus: laid.gpus,
        ranks,
        skipped: index.skipped,
        zero_runs: index.zero_runs,
        hygiene: index.hygiene,
        phases: times.clone(),
        rounds: stats.rounds,
        checkpoints: stats.checkpoints,
        reused_samples,
        reused_bytes,
        reused_shards,
        mem_limit: settings.mem_limit,
        rank_spread,
        per_rank,
        rate_limits: rate_limits(comm, settings, times.total()),
        s3: S3Traffic::gather(comm),
    })
}

/// Each limit given, with what all ranks moved through it and the longest wait on it.
fn rate_limits(comm: &impl Comm, settings: &ReportSettings, seconds: f64) -> Vec<RateReport> {
    let (read, write) = throttle::tallies();
    let bytes = comm.all_sum(&[read.bytes, write.bytes]);
    let waits = [read.waited, write.waited].map(|w| comm.all_gather(w.as_nanos() as u64));
    let limits = [
        ("read", settings.limits.read),
        ("write", settings.limits.write),
    ];
    (0..2)
        .filter_map(|i| {
            limits[i].1.map(|limit| RateReport {
                what: limits[i].0,
                limit,
                bytes: bytes[i],
                seconds,
                most_waited: waits[i].iter().max().copied().unwrap_or(0) as f64 / 1e9,
            })
        })
        .collect()
}

/// The free space where `output` would go: on the file system of its nearest existing ancestor.
fn free_space(output: &std::path::Path) -> Option<FreeSpace> {
    let dir = output
        .ancestors()
        .skip(1)
        .map(|a| {
            if a.as_os_str().is_empty() {
                std::path::Path::new(".")
            } else {
                a
            }
        })
        .find(|a| {
            storage::source(a)
                .stat(a)
                .is_ok_and(|s| s.kind == Kind::Dir)
        })?;
    let bytes = storage::sink(dir).free_space(dir).ok()??;
    Some(FreeSpace {
        path: dir.display().to_string(),
        bytes,
    })
}

/// How long the index's `index_bytes` read, then the exchange's reading `read_bytes` and
/// writing `write_bytes`, take at least at `limits`: the index ends before the exchange starts,
/// so its time adds to the exchange's.
fn at_limits(
    limits: Limits,
    index_bytes: u64,
    read_bytes: u64,
    write_bytes: u64,
) -> Option<AtLimits> {
    let exchange = limits.least_seconds(read_bytes, write_bytes)?;
    let index = limits.least_seconds(index_bytes, 0).unwrap_or(0.0);
    Some(AtLimits {
        limits,
        index_bytes,
        read_bytes: index_bytes + read_bytes,
        write_bytes,
        seconds: index + exchange,
    })
}

/// What `reshard plan` and `--dry-run` print (on rank 0).
pub(crate) fn plan_report(
    settings: &ReportSettings,
    setup: &Setup,
    planned: &Planned,
) -> PlanReport {
    let (index, placed, laid) = (&planned.index, &planned.placed, &planned.laid);
    let sizes: Vec<u64> = setup.inputs.iter().map(|s| s.size).collect();
    let shard_bytes = Stats::of(&laid.shard_bytes);
    PlanReport {
        samples: index.samples,
        sample_bytes: index.sample_bytes,
        input_shards: setup.inputs.len(),
        input_shard_bytes: Stats::of(&sizes),
        input_shard_samples: Stats::of(&laid.input_counts),
        shards: placed.shards,
        sizing: placed.sizing.clone(),
        equalize: settings.equalize,
        balance: settings.balance,
        output_samples: placed.output_samples,
        dropped: placed.dropped,
        repeated: placed.repeated,
        shard_samples: Stats::of(&laid.shard_samples),
        shard_bytes,
        gpus: laid.gpus,
        storage: Storage::assess(
            placed.shards,
            (
                shard_bytes.mean as u64,
                shard_bytes.max,
                laid.shard_bytes.iter().sum(),
            ),
            &settings.sizing,
        )
        .with_free_space(settings.output.as_deref().and_then(free_space)),
        order: settings.order.clone(),
        stratify: placed.stratify.clone(),
        per_shard: laid.shardlist.clone(),
        at_limits: at_limits(
            settings.limits,
            index.read_bytes,
            index.sample_bytes,
            laid.shard_bytes.iter().sum(),
        ),
    }
}
