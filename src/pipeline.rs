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

use crate::cli::{Balance, Keep, RunConfig};
use crate::comm::{
    self, agree, agree_once, broadcast_result, everywhere, exclusive_sum, gather, Comm,
};
use crate::exchange::{self, Buffers, ExchangeStats, Job, LocalSample};
use crate::input::{expand_specs, InputShard};
use crate::key_map::KeyMap;
use crate::manifest::{KeyMapInfo, Manifest, RunInfo, ShardEntry};
use crate::order::{self, LocalSamples, OrderJob, Ordered, Placement};
use crate::plan::{assign_inputs, bounds_from_starts, byte_shard_of, ShardLayout, ShardPlan};
use crate::progress::{peak_rss, PhaseTimes, Progress};
use crate::report::{GpuShare, PlanReport, Stats};
use crate::saved_index::{self, Lookup};
use crate::size::human_bytes;
use crate::tar_index::{
    index_file_with, key_at, keys_at, Codec, Hygiene, OnDuplicate, Rules, Sample, ShardIndex,
    Skipped,
};
use crate::writer::{compress_shard, md5_file, OutputShards, ShardNames};

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
    /// Samples written (repeats included, dropped excluded).
    pub output_samples: u64,
    /// Bytes per output shard (only on rank 0).
    pub shard_bytes: Stats,
    pub gpus: Option<GpuShare>,
    pub ranks: usize,
    pub skipped: Skipped,
    pub hygiene: Hygiene,
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
        if self.output_samples != self.samples {
            s += &format!("  samples written: {} (equalized)\n", self.output_samples);
        }
        s += &format!("  shard bytes: {}\n", self.shard_bytes.bytes());
        if let Some(g) = &self.gpus {
            s += &format!("  {}\n", g.render());
        }
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
        let h = self.hygiene;
        if h.incomplete + h.excluded + h.duplicates > 0 {
            s += &format!(
                "  sample hygiene: {} incomplete kept, {} incomplete excluded, {} duplicates kept\n",
                h.incomplete, h.excluded, h.duplicates
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

/// Where the ranks' watchdogs leave heartbeats during the exchange (inside the staging
/// directory, removed before publishing).
const HEARTBEATS: &str = ".heartbeats";

/// What rank 0 resolves before any data is read, shared with every rank.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Setup {
    inputs: Vec<InputShard>,
    /// Where the output is assembled and where it goes (none when only planning).
    staging: Option<PathBuf>,
    target: Option<PathBuf>,
}

/// What a job ends with.
#[derive(Debug)]
pub enum Outcome {
    /// The output was written and published.
    Ran(Box<Summary>),
    /// Only planned (`--dry-run`, `reshard plan`); the report is on rank 0.
    Planned(Option<Box<PlanReport>>),
}

/// Runs the whole job on this rank.
///
/// # Errors
/// Bad input, I/O failure or invalid request, on this rank (the message names file and offset)
/// or on another ([`PeerFailed`]). On error nothing is published and the staging directory is
/// removed.
pub fn run(comm: &impl Comm, cfg: &RunConfig) -> Result<Outcome> {
    let lead = comm.rank() == 0;
    let mut times = PhaseTimes::default();
    times.start("expand");
    let setup: Setup = broadcast_result(comm, 0, lead.then(|| prepare(cfg)))?;
    let result = run_prepared(comm, cfg, &setup, &mut times);
    if let (true, Err(_), Some(staging)) = (lead, &result, &setup.staging) {
        // Every rank has left the failed phase (failures are agreed collectively).
        let _ = fs::remove_dir_all(staging);
    }
    result
}

fn run_prepared(
    comm: &impl Comm,
    cfg: &RunConfig,
    setup: &Setup,
    times: &mut PhaseTimes,
) -> Result<Outcome> {
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

    times.start("index");
    let sizes: Vec<u64> = inputs.iter().map(|s| s.size).collect();
    let mine = assign_inputs(&sizes, ranks)[rank].clone();
    let mine_range = mine.clone();
    let reused = AtomicUsize::new(0);
    let indexed = index_shards(inputs, mine, cfg.index.as_deref(), &cfg.rules, &reused);
    let Indexed {
        local,
        skipped,
        hygiene,
        counts: shard_counts,
        edges,
        key_hashes,
        keys,
        contents,
    } = agree(comm, indexed)?;
    let gathered = gather(comm, 0, &serde_json::to_vec(&edges).expect("encodable"));
    broadcast_result(comm, 0, lead.then(|| split_sample_check(inputs, &gathered)))?;
    // After the split check: a split sample is also a key in two shards, and the more
    // specific message wins.
    let cross = if !cfg.rules.checks_duplicates() {
        0
    } else {
        let found = duplicate_keys(comm, inputs, &local, &key_hashes, cfg.rules.on_duplicate);
        agree(comm, found)?
    };
    drop(key_hashes);
    let mut hygiene_totals = hygiene.to_array().to_vec();
    hygiene_totals[2] += cross;
    let hygiene = Hygiene::from_array(comm.all_sum(&hygiene_totals).try_into().unwrap());
    let reused = comm.all_sum(&[reused.into_inner() as u64])[0];
    if reused > 0 {
        narrate(
            lead,
            format_args!(
                "reused the saved index of {reused} of {} input shards",
                inputs.len()
            ),
        );
    }
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

    times.start("plan");
    let describe = |i: usize| {
        let s = &local[i];
        let path = &inputs[s.shard as usize].path;
        let key = match keys.get(i) {
            Some(k) => String::from_utf8_lossy(k).into_owned(),
            None => key_at(path, s.start, s.len).unwrap_or_else(|e| format!("<{e:#}>")),
        };
        format!(
            "{}: sample {key:?} (byte offset {})",
            path.display(),
            s.start
        )
    };
    let key_map = match &cfg.order.key_map {
        Some(path) => {
            let loaded = KeyMap::load(path, cfg.order.unmatched.clone(), &keys, &describe);
            let (map, group_of) = agree_once(comm, loaded)?;
            // Every rank reads the file itself: a map that changed under the job, or differs
            // between nodes, would make ranks disagree on the groups.
            let digests = comm.all_gather(map.digest() >> 1);
            if digests.iter().any(|&d| d != digests[0]) {
                return Err(everywhere(
                    lead,
                    anyhow!(
                        "{}: the ranks read different key maps (changed during the run, or not the same file on every node)",
                        path.display()
                    ),
                ));
            }
            Some((map, group_of))
        }
        None => None,
    };
    let ordered = order::place(
        comm,
        &OrderJob {
            spec: &cfg.order,
            key_map: key_map
                .as_ref()
                .map(|(map, group_of)| (map, group_of.as_slice())),
            seed: cfg.seed,
            epoch: cfg.epoch,
            equalize: cfg.equalize,
            sizing: cfg.sizing,
            samples,
            sample_bytes,
        },
        &LocalSamples {
            first_global,
            samples: &local,
            keys: &keys,
            contents: &contents,
            describe: &describe,
        },
    )?;
    drop((keys, contents));
    let Ordered {
        placement,
        groups,
        unmatched,
        stratify,
    } = ordered;
    let shards: u64 = groups.iter().map(|g| g.shards).sum();
    let output_samples: u64 = groups.iter().map(|g| g.output_samples).sum();
    let (dropped_count, repeated_count) = groups.iter().fold((0, 0), |(d, r), g| {
        (d + g.targets.dropped(), r + g.targets.repeated())
    });
    let key_map = key_map.map(|(map, _)| map);
    let sizing = match &key_map {
        None => groups[0].sizing.clone(),
        Some(map) => format!(
            "{} key-map groups, each sized on its own: {}",
            map.groups.len(),
            groups
                .iter()
                .map(|g| format!("{} ({})", g.template.as_deref().unwrap_or(""), g.sizing))
                .collect::<Vec<_>>()
                .join("; ")
        ),
    };
    narrate(
        lead,
        format_args!(
            "{samples} samples, {} of sample data -> {shards} shards ({sizing}), order: {}",
            human_bytes(sample_bytes),
            cfg.order.describe()
        ),
    );
    if unmatched > 0 {
        narrate(
            lead,
            format_args!("{unmatched} samples matched no key-map group and are left out"),
        );
    }
    if let Some(st) = &stratify {
        narrate(
            lead,
            format_args!(
                "stratified by .{}: {} labels, worst deviation from the ideal share per shard {:.3}",
                st.ext, st.labels, st.worst_deviation
            ),
        );
    }
    let names = match &key_map {
        None => ShardNames::Prefix(cfg.prefix.clone()),
        Some(map) => ShardNames::Groups(
            groups
                .iter()
                .zip(&map.groups)
                .filter(|(g, _)| g.shards > 0)
                .map(|(g, t)| (g.shard_start, t.clone()))
                .collect(),
        ),
    };
    names
        .check_distinct(shards)
        .map_err(|e| everywhere(lead, e))?;
    let records = |f: &mut dyn FnMut(u64, u64)| {
        placement.for_each(local.len(), &mut |i, p| f(p, local[i].len));
    };
    let planned = match cfg.balance {
        Balance::Count => {
            let sizes: Vec<(u64, u64)> = groups
                .iter()
                .map(|g| (g.output_samples, g.shards))
                .collect();
            count_plan(comm, &records, ShardPlan::by_groups(&sizes, ranks))
        }
        Balance::Bytes => byte_plan(comm, &records, output_samples, shards),
    };
    let (plan, lens) = agree(comm, planned)?;
    let layout = ShardLayout::new(&plan, rank, lens);
    let keys = agree(
        comm,
        equalized_keys(
            comm,
            inputs,
            &local,
            &placement,
            dropped_count + repeated_count,
        ),
    )?;
    // Rank 0 needs every shard's size: writers own contiguous shard ranges in rank order.
    let shard_bytes = gather_u64s(comm, &layout.shard_bytes);
    let input_counts = gather_u64s(comm, &shard_counts);
    let shard_samples: Vec<u64> = (0..shards)
        .map(|s| plan.shard_positions(s).end - plan.shard_positions(s).start)
        .collect();
    let shardlist: Vec<ShardEntry> = shard_bytes
        .iter()
        .enumerate()
        .map(|(s, &filesize)| ShardEntry {
            url: names.plain(s as u64),
            nsamples: shard_samples[s],
            filesize,
            md5sum: None,
        })
        .collect();
    let gpus = cfg.gpus.map(|g| GpuShare::new(g, &shard_samples));
    if cfg.dry_run {
        times.stop();
        return Ok(Outcome::Planned(lead.then(|| {
            Box::new(PlanReport {
                samples,
                sample_bytes,
                input_shards: inputs.len(),
                input_shard_bytes: Stats::of(&sizes),
                input_shard_samples: Stats::of(&input_counts),
                shards,
                sizing: sizing.clone(),
                equalize: cfg.equalize,
                balance: cfg.balance,
                output_samples,
                dropped: dropped_count,
                repeated: repeated_count,
                shard_samples: Stats::of(&shard_samples),
                shard_bytes: Stats::of(&shard_bytes),
                gpus,
                order: cfg.order.describe(),
                stratify: stratify.clone(),
                per_shard: shardlist.clone(),
            })
        })));
    }
    let (staging, target) = (
        setup.staging.as_ref().unwrap(),
        setup.target.as_ref().unwrap(),
    );
    let output = agree(comm, OutputShards::create(staging, &names, &layout))?;

    times.start("exchange");
    let total_out = comm.all_sum(&[layout.sample_bytes()])[0];
    let mut progress = Progress::new(lead, total_out);
    let job = Job {
        inputs,
        local: &local,
        placement: &placement,
        plan: &plan,
        layout: &layout,
        output: &output,
    };
    let stats: ExchangeStats = exchange::run(
        comm,
        &job,
        Buffers::for_job(cfg.mem_limit, ranks, total_out / ranks as u64),
        cfg.stall_timeout,
        Some(staging.join(HEARTBEATS)),
        &mut |d| progress.update(d),
    )?;
    progress.finish();

    times.start("finish");
    // Test hook: a window in which a test changes an input, marked by a file in the staging
    // directory (RESHARD_TEST_PAUSE_FINISH=seconds).
    if let Some(secs) = std::env::var("RESHARD_TEST_PAUSE_FINISH")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        let _ = fs::write(staging.join(format!(".paused-{rank}")), b"");
        std::thread::sleep(std::time::Duration::from_secs(secs));
        let _ = fs::remove_file(staging.join(format!(".paused-{rank}")));
    }
    // An input that changed while it was read may have fed stale or torn samples: refuse.
    agree(comm, check_unchanged(inputs, mine_range.clone()))?;
    // Sync; compress (--compress); save each shard's index; digest (--checksum): per shard, on
    // its writer, then the sizes and digests go to rank 0 for the manifest.
    let finished = output.sync().and_then(|()| {
        let dir = staging.join(saved_index::DIR_NAME);
        let mut sizes = Vec::new();
        let mut sums = Vec::new();
        for (k, s) in layout.shards.clone().enumerate() {
            let plain = staging.join(names.plain(s));
            let published = staging.join(names.published(s, cfg.compress));
            let size = if cfg.compress == Codec::Plain {
                layout.shard_bytes[k]
            } else {
                compress_shard(&plain, &published, cfg.compress)?
            };
            sizes.push(size);
            let samples = plan.shard_positions(s).map(|p| {
                let (start, len) = layout.place(p).expect("laid out");
                Sample { start, len }
            });
            saved_index::save(&dir, &published, samples)?;
            if cfg.checksum {
                sums.extend(md5_file(&published)?);
            }
        }
        Ok((sizes, sums))
    });
    let (sizes, sums) = agree(comm, finished)?;
    let file_bytes = gather_u64s(comm, &sizes);
    let md5 = gather(comm, 0, &sums).concat();
    drop(output);
    let published = lead.then(|| {
        let _ = fs::remove_dir_all(staging.join(HEARTBEATS));
        let (dropped, repeated) = keys;
        let info = RunInfo {
            version: env!("CARGO_PKG_VERSION").to_string(),
            seed: cfg.seed,
            epoch: cfg.epoch,
            shards,
            samples,
            sample_bytes,
            output_bytes: file_bytes.iter().sum(),
            inputs: inputs
                .iter()
                .map(|s| s.path.display().to_string())
                .collect(),
            input_bytes,
            skipped,
            ranks,
            sizing: sizing.clone(),
            equalize: cfg.equalize,
            balance: cfg.balance,
            output_samples,
            dropped,
            repeated,
            shard_samples: Stats::of(&shard_samples),
            shard_bytes: Stats::of(&shard_bytes),
            gpus,
            hygiene,
            order: cfg.order.describe(),
            stratify: stratify.clone(),
            key_map: cfg.order.key_map.as_ref().map(|path| KeyMapInfo {
                file: path.display().to_string(),
                unmatched,
                groups: groups.clone(),
            }),
        };
        let mut shardlist = shardlist;
        for (s, entry) in shardlist.iter_mut().enumerate() {
            entry.url = names.published(s as u64, cfg.compress);
            entry.filesize = file_bytes[s];
        }
        for (entry, sum) in shardlist.iter_mut().zip(md5.chunks_exact(16)) {
            entry.md5sum = Some(sum.iter().map(|b| format!("{b:02x}")).collect());
        }
        Manifest::new(shardlist, info)
            .write(&staging.join("index.json"))
            .and_then(|()| publish(staging, target))
            .and_then(|()| after_publish(cfg, target))
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
    Ok(Outcome::Ran(Box::new(Summary {
        output: target.clone(),
        inputs: inputs.len(),
        input_bytes,
        samples,
        sample_bytes,
        shards,
        output_samples,
        shard_bytes: Stats::of(&shard_bytes),
        gpus,
        ranks,
        skipped,
        hygiene,
        phases: times.clone(),
        rounds: stats.rounds,
        mem_limit: cfg.mem_limit,
        per_rank,
    })))
}

/// (input shard, (first key, last key)) of the shards a rank indexed from their headers.
type EdgeKeys = Vec<(usize, (String, String))>;

/// On rank 0: a sample split across two consecutive input shards (the last key of one is the
/// first key of the next) would be moved as two samples: an error naming both files.
fn split_sample_check(inputs: &[InputShard], gathered: &[Vec<u8>]) -> Result<()> {
    let mut all: EdgeKeys = Vec::new();
    for part in gathered {
        let mut v: EdgeKeys = serde_json::from_slice(part).context("decoding shard edge keys")?;
        all.append(&mut v);
    }
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

/// Checks that this rank's input shards still have the size they had when the run started.
fn check_unchanged(inputs: &[InputShard], mine: std::ops::Range<usize>) -> Result<()> {
    for input in &inputs[mine] {
        let now = fs::metadata(&input.path)
            .with_context(|| format!("input {} disappeared during the run", input.path.display()))?
            .len();
        if now != input.size {
            bail!(
                "input {} changed size during the run ({} bytes when the run started, {now} now): its samples cannot be trusted; nothing is published",
                input.path.display(),
                input.size
            );
        }
    }
    Ok(())
}

/// Prints a progress line on rank 0.
fn narrate(lead: bool, msg: std::fmt::Arguments<'_>) {
    if lead {
        eprintln!("reshard: {msg}");
    }
}

/// Indexes this rank's input shards, in order, from saved indexes where they exist and still
/// match (`reused` counts those), else from the tar headers. Many shards are indexed at once:
/// each shard's headers form a chain of small dependent reads, so one shard keeps one read in
/// flight; storage serves many at once (a virtio disk here: 10k reads/s at one in flight,
/// 49k/s at 32).
fn index_shards(
    inputs: &[InputShard],
    mine: std::ops::Range<usize>,
    index_dir: Option<&Path>,
    rules: &Rules,
    reused: &AtomicUsize,
) -> Result<Indexed> {
    const THREADS: usize = 32;
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
                let path = &inputs[i].path;
                // A saved index holds byte ranges only, not keys or labels.
                let saved = if rules.keep_keys || rules.read_member.is_some() {
                    Lookup::Missing
                } else {
                    saved_index::load(path, index_dir)
                };
                let r = match saved {
                    Lookup::Found(idx) => {
                        reused.fetch_add(1, Ordering::Relaxed);
                        Ok(idx)
                    }
                    Lookup::Missing => index_file_with(path, rules),
                    Lookup::Stale(why) => {
                        eprintln!("reshard: warning: re-indexing: {why}");
                        index_file_with(path, rules)
                    }
                };
                let failed = r.is_err();
                results.lock().unwrap()[i - mine.start] = Some(r);
                if failed {
                    // Stop handing out shards; the first error in shard order is reported.
                    next.store(mine.end, Ordering::Relaxed);
                }
            });
        }
    });
    // Sized exactly, and each shard's index dropped once copied: the peak is the shard indexes
    // plus these, about 56 bytes per sample.
    let results = results.into_inner().unwrap();
    let total: usize = results
        .iter()
        .flatten()
        .flatten()
        .map(|i| i.samples.len())
        .sum();
    let mut out = Indexed::default();
    out.local.reserve_exact(total);
    if rules.checks_duplicates() {
        out.key_hashes.reserve_exact(total);
    }
    let mut skipped = [0u64; 4];
    let mut hygiene = [0u64; 3];
    for (i, r) in mine.clone().zip(results) {
        let Some(idx) = r.transpose()? else { continue };
        out.counts.push(idx.samples.len() as u64);
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
struct Indexed {
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
}

/// One key in two samples, of one input shard (its members are not adjacent) or of two. Key
/// hashes (8 bytes per sample) go to the rank `hash mod P`, which sends the hashes it saw more
/// than once back to the ranks that sent them; those send (hash, shard, start) of just these
/// samples, and the owner confirms equal hashes by reading the keys (a hash collision is not a
/// duplicate), then counts, warns or fails per `--on-duplicate`. Nothing is held per sample
/// beyond the hashes. Returns the duplicates this rank found.
fn duplicate_keys(
    comm: &impl Comm,
    inputs: &[InputShard],
    local: &[LocalSample],
    hashes: &[u64],
    policy: OnDuplicate,
) -> Result<u64> {
    let ranks = comm.size() as u64;
    let owner = |h: u64| (h % ranks) as usize;
    let word = |r: &[u8]| u64::from_le_bytes(r[..8].try_into().unwrap());
    let (recv, from) = comm::route_from(comm, 8, &|sink| {
        for &h in hashes.iter().filter(|&&h| h != 0) {
            sink(owner(h), &h.to_le_bytes());
        }
    });
    let mut seen: Vec<u64> = recv.chunks_exact(8).map(word).collect();
    seen.sort_unstable();
    let repeated: Vec<u64> = seen
        .chunk_by(|a, b| a == b)
        .filter(|run| run.len() > 1)
        .map(|run| run[0])
        .collect();
    drop(seen);
    let back = comm::route(comm, 8, &|sink| {
        for (source, range) in from.iter().enumerate() {
            let mut sent: Vec<u64> = recv[range.clone()]
                .chunks_exact(8)
                .map(word)
                .filter(|h| repeated.binary_search(h).is_ok())
                .collect();
            sent.sort_unstable();
            sent.dedup();
            for h in sent {
                sink(source, &h.to_le_bytes());
            }
        }
    });
    drop(recv);
    let mut wanted: Vec<u64> = back.chunks_exact(8).map(word).collect();
    wanted.sort_unstable();
    let candidates = comm::route(comm, 20, &|sink| {
        for (s, &h) in local.iter().zip(hashes) {
            // Never 0: only hashes that were sent come back.
            if wanted.binary_search(&h).is_ok() {
                let mut rec = [0u8; 20];
                rec[..8].copy_from_slice(&h.to_le_bytes());
                rec[8..12].copy_from_slice(&s.shard.to_le_bytes());
                rec[12..].copy_from_slice(&s.start.to_le_bytes());
                sink(owner(h), &rec);
            }
        }
    });
    let mut mine: Vec<(u64, u32, u64)> = candidates
        .chunks_exact(20)
        .map(|r| {
            (
                word(r),
                u32::from_le_bytes(r[8..12].try_into().unwrap()),
                u64::from_le_bytes(r[12..].try_into().unwrap()),
            )
        })
        .collect();
    mine.sort_unstable();
    // The candidates' keys, read shard by shard in one pass each (a compressed shard is
    // decompressed once, however many candidates it holds).
    let mut places: Vec<(u32, u64)> = mine
        .iter()
        .map(|&(_, shard, start)| (shard, start))
        .collect();
    places.sort_unstable();
    places.dedup();
    let mut keys: Vec<String> = Vec::with_capacity(places.len());
    for same_shard in places.chunk_by(|a, b| a.0 == b.0) {
        let starts: Vec<(u64, u64)> = same_shard.iter().map(|&(_, at)| (at, u64::MAX)).collect();
        keys.extend(keys_at(&inputs[same_shard[0].0 as usize].path, &starts)?);
    }
    let key_of =
        |place: (u32, u64)| keys[places.binary_search(&place).expect("read above")].clone();
    let mut found = 0u64;
    for run in mine.chunk_by(|a, b| a.0 == b.0) {
        let mut keyed: Vec<(String, u32, u64)> = run
            .iter()
            .map(|&(_, shard, start)| (key_of((shard, start)), shard, start))
            .collect();
        // By key, then in input order: the first sample of a key is the one others repeat.
        keyed.sort();
        for same in keyed.chunk_by(|a, b| a.0 == b.0) {
            let (key, shard, first) = &same[0];
            for (_, other_shard, other) in &same[1..] {
                let path = inputs[*shard as usize].path.display();
                let what = if other_shard == shard {
                    format!(
                        "{path}: byte offset {other}: sample {key:?} appears again (first at byte offset {first}): its members are not adjacent"
                    )
                } else {
                    format!(
                        "sample key {key:?} occurs in two samples: {path} at byte offset {first} and {} at byte offset {other}",
                        inputs[*other_shard as usize].path.display(),
                    )
                };
                match policy {
                    OnDuplicate::Abort => {
                        bail!("{what} (--on-duplicate abort; warn or keep accept it)")
                    }
                    OnDuplicate::Warn if found < 5 => eprintln!("reshard: warning: {what}"),
                    _ => {}
                }
                found += 1;
            }
        }
    }
    Ok(found)
}

/// Calls its argument once for every (output position, sample length) record a rank holds.
type Records<'a> = &'a dyn Fn(&mut dyn FnMut(u64, u64));

/// Sends every (position, length) record to the rank `dest` picks for its position; returns the
/// records received (16 bytes each).
fn route(comm: &impl Comm, records: Records<'_>, dest: &dyn Fn(u64) -> usize) -> Vec<u8> {
    comm::route(comm, 16, &|sink| {
        records(&mut |p, len| {
            let mut rec = [0u8; 16];
            rec[..8].copy_from_slice(&p.to_le_bytes());
            rec[8..].copy_from_slice(&len.to_le_bytes());
            sink(dest(p), &rec);
        })
    })
}

/// The length at every position of `positions` from received records, each exactly once.
fn lens_at(positions: std::ops::Range<u64>, recv: &[u8], rank: usize) -> Result<Vec<u64>> {
    let mut lens = vec![u64::MAX; (positions.end - positions.start) as usize];
    for rec in recv.chunks_exact(16) {
        let p = u64::from_le_bytes(rec[..8].try_into().unwrap());
        let len = u64::from_le_bytes(rec[8..].try_into().unwrap());
        let slot = p
            .checked_sub(positions.start)
            .and_then(|i| lens.get_mut(i as usize))
            .with_context(|| {
                format!("internal error: position {p} does not belong to rank {rank}")
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
    Ok(lens)
}

/// Count-balanced shards: every record goes straight to the writer of its position.
fn count_plan(
    comm: &impl Comm,
    records: Records<'_>,
    plan: ShardPlan,
) -> Result<(ShardPlan, Vec<u64>)> {
    let recv = route(comm, records, &|p| plan.writer_of(plan.shard_of(p)));
    let lens = lens_at(plan.writer_positions(comm.rank()), &recv, comm.rank())?;
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
    let mine = blocks.writer_positions(rank);
    let lens = lens_at(mine.clone(), &recv, rank)?;
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
    let lens = lens_at(plan.writer_positions(rank), &recv, rank)?;
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
    let config = bincode::config::standard();
    let bytes = bincode::serde::encode_to_vec(&mine, config).expect("encodable");
    let parts = gather(comm, 0, &bytes);
    failed?;
    let mut all: Vec<(u64, bool, String)> = Vec::new();
    for part in parts {
        let (v, _): (Vec<(u64, bool, String)>, _) =
            bincode::serde::decode_from_slice(&part, config).context("decoding keys")?;
        all.extend(v);
    }
    all.sort();
    let (dropped, repeated): (Vec<_>, Vec<_>) = all.into_iter().partition(|k| k.1);
    Ok((
        dropped.into_iter().map(|k| k.2).collect(),
        repeated.into_iter().map(|k| k.2).collect(),
    ))
}

/// Every rank's u64s on rank 0, concatenated in rank order.
fn gather_u64s(comm: &impl Comm, values: &[u64]) -> Vec<u64> {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    gather(comm, 0, &bytes)
        .concat()
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
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

    let Some(out) = &cfg.output else {
        // Only planning, without an output to check.
        return Ok(Setup {
            inputs,
            staging: None,
            target: None,
        });
    };
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
    if let Some(link) = &cfg.link {
        if fs::symlink_metadata(link).is_ok_and(|m| !m.file_type().is_symlink()) {
            bail!(
                "--link {}: exists and is not a symbolic link; not replacing it",
                link.display()
            );
        }
    }
    if cfg.dry_run {
        // Checked as `run` would, but nothing is created, removed or written.
        if let Some(keep) = &cfg.keep {
            // --link would point at the new output by then, so only the output itself is spared.
            for old in outputs_beyond(&target, keep, cfg.epoch, None)? {
                eprintln!(
                    "reshard: --keep {} would remove the older output {}",
                    keep.count,
                    old.display()
                );
            }
        }
        return Ok(Setup {
            inputs,
            staging: None,
            target: None,
        });
    }
    if staging.exists() {
        eprintln!(
            "reshard: removing {} left by an earlier run that did not finish",
            staging.display()
        );
        fs::remove_dir_all(&staging)
            .with_context(|| format!("{}: cannot remove", staging.display()))?;
    }
    fs::create_dir(&staging)
        .and_then(|()| fs::create_dir(staging.join(saved_index::DIR_NAME)))
        .and_then(|()| fs::create_dir(staging.join(HEARTBEATS)))
        .with_context(|| {
            format!(
                "cannot create the staging directory {} (is the output's parent writable?)",
                staging.display()
            )
        })?;
    Ok(Setup {
        inputs,
        staging: Some(staging),
        target: Some(target),
    })
}

/// `--link` and `--keep`, once the output is published.
fn after_publish(cfg: &RunConfig, target: &Path) -> Result<()> {
    if let Some(link) = &cfg.link {
        point_link(link, target)?;
    }
    if let Some(keep) = &cfg.keep {
        for old in outputs_beyond(target, keep, cfg.epoch, cfg.link.as_deref())? {
            eprintln!(
                "reshard: --keep {}: removing the older output {}",
                keep.count,
                old.display()
            );
            fs::remove_dir_all(&old)
                .with_context(|| format!("--keep: cannot remove {}", old.display()))?;
        }
    }
    Ok(())
}

/// Atomically points the symlink `link` at `target`: a new link under a temporary name, renamed
/// over the old one, so a reader of `link` always sees a complete dataset.
fn point_link(link: &Path, target: &Path) -> Result<()> {
    if let Ok(meta) = fs::symlink_metadata(link) {
        if !meta.file_type().is_symlink() {
            bail!(
                "--link {}: exists and is not a symbolic link; not replacing it",
                link.display()
            );
        }
    }
    let name = link
        .file_name()
        .with_context(|| format!("--link {}: not a file name", link.display()))?;
    let tmp = link.with_file_name(format!(".{}.reshard-link", name.to_string_lossy()));
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)
        .with_context(|| format!("--link: cannot create {}", tmp.display()))?;
    fs::rename(&tmp, link).with_context(|| format!("--link: cannot replace {}", link.display()))?;
    if let Some(parent) = link.parent().filter(|p| !p.as_os_str().is_empty()) {
        sync_dir(parent)?;
    }
    Ok(())
}

/// The older epochs of `target`'s series that `--keep` removes: siblings of `target` whose name
/// is the series template with another epoch number and that hold reshard's own index.json and
/// `.reshard` directory. With `target` (epoch `epoch`, whether it exists yet or not) they are
/// ranked by epoch number, highest first; those beyond the first `keep.count` are returned,
/// lowest last. Never `target`, never what `link` points at, never a symbolic link, never a
/// directory of another name.
fn outputs_beyond(
    target: &Path,
    keep: &Keep,
    epoch: u64,
    link: Option<&Path>,
) -> Result<Vec<PathBuf>> {
    let parent = target
        .parent()
        .context("the output has no parent directory")?;
    let linked = link.and_then(|l| fs::canonicalize(l).ok());
    let canonical_target = fs::canonicalize(target).ok();
    let mut series: Vec<(u64, Option<PathBuf>)> = vec![(epoch, None)];
    for entry in
        fs::read_dir(parent).with_context(|| format!("--keep: cannot list {}", parent.display()))?
    {
        let entry = entry?;
        let Some(e) = entry.file_name().to_str().and_then(|n| keep.epoch_of(n)) else {
            continue;
        };
        let path = entry.path();
        if e == epoch || path == target {
            continue;
        }
        if !fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir())
            || !path.join(saved_index::DIR_NAME).is_dir()
            || !made_by_reshard(&path.join("index.json"))
        {
            continue;
        }
        let canon = fs::canonicalize(&path).ok();
        if canon.is_none() || canon == canonical_target || canon == linked {
            continue;
        }
        series.push((e, Some(path)));
    }
    series.sort_by_key(|s| std::cmp::Reverse(s.0));
    Ok(series
        .into_iter()
        .skip(keep.count)
        .filter_map(|(_, path)| path)
        .collect())
}

/// Whether `index` is an index.json that reshard wrote (a wids index with a `reshard` object).
fn made_by_reshard(index: &Path) -> bool {
    let Ok(text) = fs::read(index) else {
        return false;
    };
    serde_json::from_slice::<serde_json::Value>(&text)
        .is_ok_and(|m| m["__kind__"] == Manifest::KIND && m["reshard"].is_object())
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
    use crate::writer::shard_file_name;

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
            order: crate::order::OrderSpec::default(),
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
