//! `reshard run`: the phases of one job, over any [`Comm`].
//!
//! expand → index → plan → exchange → finish. Every phase ends with all ranks agreeing on its
//! outcome, so one rank's failure stops every rank at the same point, and rank 0 then removes the
//! temporary output. Nothing is visible at the output path until the final rename.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::cli::RunConfig;
use crate::comm::{agree, broadcast_result, exclusive_sum, Comm, PeerFailed};
use crate::exchange::{self, Buffers, ExchangeStats, Job, LocalSample};
use crate::input::{expand_specs, InputShard};
use crate::manifest::{Manifest, RunInfo, ShardEntry};
use crate::permute::Permutation;
use crate::plan::{assign_inputs, ShardLayout, ShardPlan};
use crate::progress::{peak_rss, PhaseTimes, Progress};
use crate::size::human_bytes;
use crate::tar_index::{index_file, ShardIndex, Skipped};
use crate::writer::{shard_file_name, OutputShards};

/// One rank's share of the work.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct RankStats {
    /// Sample bytes read from the input and sent.
    pub bytes_read: u64,
    /// Sample bytes received and written to this rank's shards.
    pub bytes_written: u64,
    /// Peak resident memory (VmHWM) in bytes; 0 where unknown.
    pub peak_rss: u64,
}

/// What a finished run reports.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub output: PathBuf,
    pub inputs: usize,
    pub input_bytes: u64,
    pub samples: u64,
    pub sample_bytes: u64,
    pub shards: u64,
    pub ranks: usize,
    pub skipped: Skipped,
    pub phases: PhaseTimes,
    pub rounds: u64,
    /// The memory budget per rank (`--mem-limit`).
    pub mem_limit: u64,
    /// Per rank, by rank.
    pub per_rank: Vec<RankStats>,
}

impl Summary {
    /// Writes the summary as JSON to `path`.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn write_report(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).expect("serializable");
        fs::write(path, text + "\n")
            .with_context(|| format!("--report {}: cannot write", path.display()))
    }

    /// The human-readable summary rank 0 prints at the end.
    pub fn render(&self) -> String {
        let total = self.phases.total();
        let mut s = format!(
            "reshard: wrote {} shards ({} samples, {}) to {} in {:.2} s ({}/s) with {} rank{}\n",
            self.shards,
            self.samples,
            human_bytes(self.sample_bytes),
            self.output.display(),
            total,
            human_bytes((self.sample_bytes as f64 / total.max(1e-9)) as u64),
            self.ranks,
            if self.ranks == 1 { "" } else { "s" }
        );
        s += &format!(
            "  input: {} shards, {}\n",
            self.inputs,
            human_bytes(self.input_bytes)
        );
        for (name, secs) in &self.phases.phases {
            s += &format!("  {name:<9} {secs:>9.3} s\n");
        }
        s += &format!("  exchange rounds: {}\n", self.rounds);
        let k = self.skipped;
        if k.total() > 0 {
            s += &format!(
                "  skipped entries (not part of any sample): {} directories, {} files without a key, {} links/special files, {} PAX global headers\n",
                k.directories, k.keyless_files, k.other_entries, k.global_headers
            );
        }
        let rss: Vec<String> = self
            .per_rank
            .iter()
            .map(|r| human_bytes(r.peak_rss))
            .collect();
        s += &format!("  peak RSS per rank: {}\n", rss.join(", "));
        s
    }
}

/// What rank 0 resolves before any data is read, shared with every rank.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Setup {
    inputs: Vec<InputShard>,
    /// Where the output is assembled; renamed to `target` at the end.
    staging: PathBuf,
    target: PathBuf,
}

/// Runs the whole job on this rank.
///
/// # Errors
/// Bad input, I/O failure or invalid request, on this rank (the message names file and offset)
/// or on another ([`PeerFailed`]). On error nothing is published and the staging directory is
/// removed.
pub fn run(comm: &impl Comm, cfg: &RunConfig) -> Result<Summary> {
    let lead = comm.rank() == 0;
    let mut times = PhaseTimes::default();
    times.start("expand");
    let setup: Setup = broadcast_result(comm, 0, lead.then(|| prepare(cfg)))?;
    let result = run_prepared(comm, cfg, &setup, &mut times);
    if result.is_err() && lead {
        // Every rank has left the failed phase (failures are agreed collectively).
        let _ = fs::remove_dir_all(&setup.staging);
    }
    result
}

fn run_prepared(
    comm: &impl Comm,
    cfg: &RunConfig,
    setup: &Setup,
    times: &mut PhaseTimes,
) -> Result<Summary> {
    let (rank, ranks, lead) = (comm.rank(), comm.size(), comm.rank() == 0);
    let inputs = &setup.inputs;
    let input_bytes: u64 = inputs.iter().map(|s| s.size).sum();
    narrate(
        lead,
        format_args!(
            "indexing {} input shards ({}) on {ranks} rank{}",
            inputs.len(),
            human_bytes(input_bytes),
            if ranks == 1 { "" } else { "s" }
        ),
    );

    times.start("index");
    let sizes: Vec<u64> = inputs.iter().map(|s| s.size).collect();
    let mine = assign_inputs(&sizes, ranks)[rank].clone();
    let (local, skipped) = agree(comm, index_shards(inputs, mine))?;
    let (first_global, samples) = exclusive_sum(comm, local.len() as u64);
    let mut totals = vec![local.iter().map(|s| s.len).sum::<u64>()];
    totals.extend(skipped.to_array());
    let totals = comm.all_sum(&totals);
    let sample_bytes = totals[0];
    let skipped = Skipped::from_array(totals[1..5].try_into().unwrap());
    if samples == 0 {
        return Err(everywhere(
            lead,
            anyhow!(
                "the input holds no samples ({} shards, {} entries skipped)",
                inputs.len(),
                skipped.total()
            ),
        ));
    }
    if cfg.shards > samples {
        return Err(everywhere(lead, anyhow!(
            "--shards {} is more than the {samples} samples in the input: every shard needs at least one sample",
            cfg.shards
        )));
    }
    narrate(
        lead,
        format_args!(
            "{samples} samples, {} of sample data",
            human_bytes(sample_bytes)
        ),
    );

    times.start("plan");
    let permutation = Permutation::new(cfg.seed, cfg.epoch, samples);
    let plan = ShardPlan::new(samples, cfg.shards, ranks);
    let layout = agree(
        comm,
        plan_layout(comm, &local, first_global, &permutation, &plan),
    )?;
    let output = agree(
        comm,
        OutputShards::create(&setup.staging, &cfg.prefix, &layout),
    )?;

    times.start("exchange");
    // Test hook: proves that a panic on one rank aborts every rank instead of leaving them
    // blocked in a collective.
    if std::env::var("RESHARD_TEST_PANIC_RANK")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        == Some(rank)
    {
        panic!("RESHARD_TEST_PANIC_RANK={rank}: injected panic");
    }
    let mut progress = Progress::new(lead, sample_bytes);
    let job = Job {
        inputs,
        local: &local,
        first_global,
        permutation: &permutation,
        plan: &plan,
        layout: &layout,
        output: &output,
    };
    let stats: ExchangeStats = exchange::run(
        comm,
        &job,
        Buffers::for_budget(cfg.mem_limit, ranks),
        &mut |d| progress.update(d),
    )?;
    progress.finish();

    times.start("finish");
    agree(comm, output.sync())?;
    drop(output);
    // Rank 0 needs every shard's size for the manifest: writers own contiguous shard ranges in
    // rank order, so concatenating by source rank gives shard order.
    let mut to_lead = Vec::new();
    for b in &layout.shard_bytes {
        to_lead.extend_from_slice(&b.to_le_bytes());
    }
    let mut ranges = vec![0..0; ranks];
    ranges[0] = 0..to_lead.len();
    let mut gathered = Vec::new();
    comm.all_to_all(&to_lead, &ranges, &mut gathered);
    let published = lead.then(|| {
        let shard_bytes: Vec<u64> = gathered
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let shardlist = (0..cfg.shards)
            .map(|s| ShardEntry {
                url: shard_file_name(&cfg.prefix, s),
                nsamples: plan.shard_positions(s).end - plan.shard_positions(s).start,
                filesize: shard_bytes[s as usize],
            })
            .collect::<Vec<_>>();
        let info = RunInfo {
            version: env!("CARGO_PKG_VERSION").to_string(),
            seed: cfg.seed,
            epoch: cfg.epoch,
            shards: cfg.shards,
            samples,
            sample_bytes,
            output_bytes: shard_bytes.iter().sum(),
            inputs: inputs
                .iter()
                .map(|s| s.path.display().to_string())
                .collect(),
            input_bytes,
            skipped,
            ranks,
        };
        Manifest::new(shardlist, info)
            .write(&setup.staging.join("index.json"))
            .and_then(|()| publish(&setup.staging, &setup.target))
    });
    broadcast_result(comm, 0, published)?;
    times.stop();
    let bytes_read = comm.all_gather(stats.bytes_sent);
    let bytes_written = comm.all_gather(stats.bytes_written);
    let peak_rss = comm.all_gather(peak_rss().unwrap_or(0));
    let per_rank = (0..ranks)
        .map(|r| RankStats {
            bytes_read: bytes_read[r],
            bytes_written: bytes_written[r],
            peak_rss: peak_rss[r],
        })
        .collect();
    Ok(Summary {
        output: setup.target.clone(),
        inputs: inputs.len(),
        input_bytes,
        samples,
        sample_bytes,
        shards: cfg.shards,
        ranks,
        skipped,
        phases: times.clone(),
        rounds: stats.rounds,
        mem_limit: cfg.mem_limit,
        per_rank,
    })
}

/// Prints a progress line on rank 0.
fn narrate(lead: bool, msg: std::fmt::Arguments<'_>) {
    if lead {
        eprintln!("reshard: {msg}");
    }
}

/// A failure every rank detects identically: reported by rank 0 only, quiet elsewhere.
fn everywhere(lead: bool, e: anyhow::Error) -> anyhow::Error {
    if lead {
        e
    } else {
        anyhow!(PeerFailed { ranks: vec![0] })
    }
}

/// Indexes this rank's input shards, in order. Several shards are indexed at once: header reads
/// are small random reads, and keeping several in flight hides the storage's latency.
fn index_shards(
    inputs: &[InputShard],
    mine: std::ops::Range<usize>,
) -> Result<(Vec<LocalSample>, Skipped)> {
    const THREADS: usize = 8;
    let next = AtomicUsize::new(mine.start);
    let results: Mutex<Vec<Option<Result<ShardIndex>>>> =
        Mutex::new((0..mine.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..THREADS.min(mine.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= mine.end {
                    break;
                }
                let r = index_file(&inputs[i].path);
                let failed = r.is_err();
                results.lock().unwrap()[i - mine.start] = Some(r);
                if failed {
                    // Stop handing out shards; the first error in shard order is reported.
                    next.store(mine.end, Ordering::Relaxed);
                }
            });
        }
    });
    let mut local = Vec::new();
    let mut skipped = [0u64; 4];
    for (i, r) in mine.clone().zip(results.into_inner().unwrap()) {
        let Some(idx) = r.transpose()? else { continue };
        let shard = u32::try_from(i).context("more than 2^32 input shards")?;
        local.extend(idx.samples.iter().map(|s| LocalSample {
            shard,
            start: s.start,
            len: s.len,
        }));
        for (a, b) in skipped.iter_mut().zip(idx.skipped.to_array()) {
            *a += b;
        }
    }
    Ok((local, Skipped::from_array(skipped)))
}

/// Sends every local sample's (output position, length) to the rank that writes it, and lays
/// out this rank's own shards from what it receives.
fn plan_layout(
    comm: &impl Comm,
    local: &[LocalSample],
    first_global: u64,
    permutation: &Permutation,
    plan: &ShardPlan,
) -> Result<ShardLayout> {
    // Two passes (count, then fill) build the send buffer in place: 16 bytes per sample.
    let ranks = comm.size();
    let dest_of = |i: usize| {
        let p = permutation.apply(first_global + i as u64);
        (p, plan.writer_of(plan.shard_of(p)))
    };
    let mut counts = vec![0usize; ranks];
    for i in 0..local.len() {
        counts[dest_of(i).1] += 16;
    }
    let mut ranges = Vec::with_capacity(ranks);
    let mut fill_at = Vec::with_capacity(ranks);
    let mut at = 0;
    for c in counts {
        ranges.push(at..at + c);
        fill_at.push(at);
        at += c;
    }
    let mut send = vec![0u8; at];
    for (i, s) in local.iter().enumerate() {
        let (p, d) = dest_of(i);
        send[fill_at[d]..fill_at[d] + 8].copy_from_slice(&p.to_le_bytes());
        send[fill_at[d] + 8..fill_at[d] + 16].copy_from_slice(&s.len.to_le_bytes());
        fill_at[d] += 16;
    }
    let mut recv = Vec::new();
    comm.all_to_all(&send, &ranges, &mut recv);
    drop(send);

    let positions = plan.writer_positions(comm.rank());
    let mut lens = vec![u64::MAX; (positions.end - positions.start) as usize];
    for rec in recv.chunks_exact(16) {
        let p = u64::from_le_bytes(rec[..8].try_into().unwrap());
        let len = u64::from_le_bytes(rec[8..].try_into().unwrap());
        let slot = p
            .checked_sub(positions.start)
            .and_then(|i| lens.get_mut(i as usize))
            .with_context(|| {
                format!(
                    "internal error: position {p} is not written by rank {}",
                    comm.rank()
                )
            })?;
        if *slot != u64::MAX {
            bail!("internal error: position {p} received twice");
        }
        *slot = len;
    }
    if let Some(i) = lens.iter().position(|&l| l == u64::MAX) {
        bail!(
            "internal error: no sample for position {}",
            positions.start + i as u64
        );
    }
    Ok(ShardLayout::new(plan, comm.rank(), lens))
}

/// Rank 0's checks and set-up before any data is read: expand the input, refuse unsafe outputs,
/// create the staging directory next to the output.
fn prepare(cfg: &RunConfig) -> Result<Setup> {
    let paths = expand_specs(&cfg.inputs)?;
    let mut inputs = Vec::with_capacity(paths.len());
    for path in paths {
        let size = fs::metadata(&path)
            .with_context(|| format!("input {}", path.display()))?
            .len();
        inputs.push(InputShard { path, size });
    }

    let out = &cfg.output;
    let name = out.file_name().with_context(|| {
        format!(
            "--output {}: expected a directory name (not '.', '..' or '/')",
            out.display()
        )
    })?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let parent = fs::canonicalize(parent).with_context(|| {
        format!(
            "--output {}: the parent directory {} does not exist",
            out.display(),
            parent.display()
        )
    })?;
    let target = parent.join(name);
    let staging = parent.join(format!(".{}.reshard-tmp", name.to_string_lossy()));

    for input in &inputs {
        let canon = fs::canonicalize(&input.path)
            .with_context(|| format!("input {}", input.path.display()))?;
        if canon.starts_with(&target) || canon.starts_with(&staging) {
            bail!(
                "--output {} would replace the input {}: choose an output directory that holds no input",
                out.display(),
                input.path.display()
            );
        }
    }
    match fs::metadata(&target) {
        Ok(m) if !m.is_dir() => bail!("--output {}: exists and is not a directory", out.display()),
        Ok(_) => {
            let non_empty = fs::read_dir(&target)
                .with_context(|| format!("--output {}: cannot list it", out.display()))?
                .next()
                .is_some();
            if non_empty && !cfg.force {
                bail!(
                    "--output {}: exists and is not empty (use --force to replace it)",
                    out.display()
                );
            }
        }
        Err(_) => {}
    }
    if staging.exists() {
        eprintln!(
            "reshard: removing {} left by an earlier run that did not finish",
            staging.display()
        );
        fs::remove_dir_all(&staging)
            .with_context(|| format!("{}: cannot remove", staging.display()))?;
    }
    fs::create_dir(&staging).with_context(|| {
        format!(
            "cannot create the staging directory {} (is the output's parent writable?)",
            staging.display()
        )
    })?;
    Ok(Setup {
        inputs,
        staging,
        target,
    })
}

/// Makes the finished staging directory the output, in one rename where the output does not
/// exist or is empty, or by an atomic exchange with the old output (`--force`).
fn publish(staging: &Path, target: &Path) -> Result<()> {
    sync_dir(staging)?;
    let replaced = match fs::rename(staging, target) {
        Ok(()) => false,
        Err(_) if target.is_dir() => {
            exchange_dirs(staging, target).with_context(|| {
                format!(
                    "cannot replace {} with {}",
                    target.display(),
                    staging.display()
                )
            })?;
            true
        }
        Err(e) => {
            return Err(e).with_context(|| {
                format!(
                    "cannot rename {} to {}",
                    staging.display(),
                    target.display()
                )
            });
        }
    };
    if let Some(parent) = target.parent() {
        sync_dir(parent)?;
    }
    if replaced {
        // The staging name now holds the previous output.
        fs::remove_dir_all(staging)
            .with_context(|| format!("{}: cannot remove the replaced output", staging.display()))?;
    }
    Ok(())
}

/// Atomically swaps two directories (Linux `renameat2(RENAME_EXCHANGE)`).
fn exchange_dirs(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let ca = CString::new(a.as_os_str().as_bytes())?;
    let cb = CString::new(b.as_os_str().as_bytes())?;
    // SAFETY: both are valid NUL-terminated paths; AT_FDCWD is ignored for absolute paths.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn sync_dir(dir: &Path) -> Result<()> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("{}: cannot sync directory", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::local::LocalComm;

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
            output,
            shards: 5,
            seed: 3,
            epoch: 0,
            prefix: "shard".into(),
            mem_limit,
            force: false,
            report: None,
            max_round_bytes: i32::MAX as u64,
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
            let results = LocalComm::run(ranks, |c| run(c, &cfg).map(|s| (s.samples, s.shards)));
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
