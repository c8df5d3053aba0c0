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

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read};
use std::path::{Component, Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::cli::VerifyArgs;
use crate::comm::{agree, broadcast_result, exclusive_sum, gather, route, Comm};
use crate::input::{expand_specs, InputShard};
use crate::manifest::ShardEntry;
use crate::plan::{assign_inputs, Equalize};
use crate::report::Stats;
use crate::size::human_bytes;
use crate::tar_index::{index_file, key_at, Codec, Sample, ShardIndex};

/// How many example samples each kind of mismatch lists.
const EXAMPLES: usize = 5;

/// Read buffer per open shard.
const READ_BUFFER: usize = 1 << 20;

/// A `verify` request.
#[derive(Debug, Clone)]
pub struct VerifyConfig {
    /// Input specs, as given to `reshard run`.
    pub inputs: Vec<String>,
    /// The output directory of a run: its shards and `index.json`.
    pub output: PathBuf,
    /// Print the report as JSON.
    pub json: bool,
}

impl From<&VerifyArgs> for VerifyConfig {
    fn from(args: &VerifyArgs) -> Self {
        VerifyConfig {
            inputs: args.inputs.clone(),
            output: args.output.clone(),
            json: args.json,
        }
    }
}

/// Counts of samples whose digests do not balance between input and output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Mismatches {
    /// Input samples with no copy in the output (beyond what `--equalize drop` explains).
    pub missing: u64,
    /// Output samples whose bytes occur nowhere in the input: corrupted, or foreign.
    pub not_in_input: u64,
    /// Extra copies of input samples in the output (beyond what `--equalize pad` explains).
    pub duplicated: u64,
    /// Input samples not in the output, with `--equalize drop`.
    pub left_out: u64,
    /// Second copies of input samples, with `--equalize pad`.
    pub repeated: u64,
}

impl Mismatches {
    fn to_array(self) -> [u64; 5] {
        [
            self.missing,
            self.not_in_input,
            self.duplicated,
            self.left_out,
            self.repeated,
        ]
    }

    fn from_array(a: &[u64]) -> Self {
        Mismatches {
            missing: a[0],
            not_in_input: a[1],
            duplicated: a[2],
            left_out: a[3],
            repeated: a[4],
        }
    }
}

/// How well the output order is shuffled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Shuffle {
    /// Samples found on both sides (each output copy paired with one input copy).
    pub pairs: u64,
    /// Spearman's rank correlation between input and output positions of the pairs (Pearson's
    /// correlation of the positions, which are ranks; exact when every sample is paired once).
    /// `None` with fewer than two pairs.
    pub spearman: Option<f64>,
    /// `3 / sqrt(pairs - 1)`: a random order gives |ρ| below this with probability ≈ 99.7%.
    pub random_bound: Option<f64>,
    /// Distinct input shards each output shard draws samples from.
    pub input_shards_per_output_shard: Stats,
}

/// The outcome of `verify`, as rank 0 reports it.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    /// Every check held.
    pub ok: bool,
    pub output: PathBuf,
    pub ranks: usize,
    pub input_shards: usize,
    pub input_samples: u64,
    pub output_shards: usize,
    /// Samples found in the output shards.
    pub output_samples: u64,
    /// The `--equalize` mode index.json names (`none` without one).
    pub equalize: Equalize,
    pub mismatches: Mismatches,
    pub shuffle: Shuffle,
    /// Bytes read and digested, input and output together.
    pub bytes_read: u64,
    pub seconds: f64,
    /// Everything that does not hold, each naming the file (and byte offset where there is one).
    pub problems: Vec<String>,
}

impl VerifyReport {
    /// The human-readable report.
    pub fn render(&self) -> String {
        let mut s = if self.ok {
            format!(
                "reshard verify: OK: {} holds exactly the input's samples\n",
                self.output.display()
            )
        } else {
            format!(
                "reshard verify: FAILED: {} problem{} in {}\n",
                self.problems.len(),
                plural(self.problems.len() as u64),
                self.output.display()
            )
        };
        s += &format!(
            "  input:    {} shards, {} samples\n",
            self.input_shards, self.input_samples
        );
        s += &format!(
            "  output:   {} shards, {} samples (equalize {})\n",
            self.output_shards,
            self.output_samples,
            equalize_name(self.equalize)
        );
        let m = self.mismatches;
        s += &format!(
            "  samples:  {} missing, {} not in the input, {} duplicated",
            m.missing, m.not_in_input, m.duplicated
        );
        if m.left_out > 0 {
            s += &format!(", {} left out (drop)", m.left_out);
        }
        if m.repeated > 0 {
            s += &format!(", {} repeated (pad)", m.repeated);
        }
        s += "\n";
        let sh = &self.shuffle;
        match (sh.spearman, sh.random_bound) {
            (Some(rho), Some(bound)) => {
                s += &format!(
                    "  shuffle:  Spearman rho(input position, output position) = {rho:.4} over {} samples (a random order: |rho| < {bound:.4})\n",
                    sh.pairs
                );
            }
            _ => s += &format!("  shuffle:  too few samples ({}) to correlate\n", sh.pairs),
        }
        s += &format!(
            "  input shards per output shard: {} (of {})\n",
            sh.input_shards_per_output_shard.counts(),
            self.input_shards
        );
        s += &format!(
            "  read {} in {:.2} s on {} rank{}\n",
            human_bytes(self.bytes_read),
            self.seconds,
            self.ranks,
            plural(self.ranks as u64)
        );
        for p in &self.problems {
            s += &format!("  problem: {p}\n");
        }
        s
    }
}

/// What every rank gets from `verify`: the verdict, and the report on rank 0.
#[derive(Debug)]
pub struct Verdict {
    pub ok: bool,
    pub report: Option<VerifyReport>,
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn equalize_name(e: Equalize) -> &'static str {
    match e {
        Equalize::None => "none",
        Equalize::Drop => "drop",
        Equalize::Pad => "pad",
    }
}

/// One output shard, as the verifier expects to find it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct OutputShard {
    /// The name index.json gives it (or the file name when there is no index.json).
    name: String,
    path: PathBuf,
    /// Its size, `None` when it does not exist.
    size: Option<u64>,
    /// Its index.json entry.
    listed: Option<ShardEntry>,
}

/// What rank 0 resolves first and every rank works from.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Setup {
    inputs: Vec<InputShard>,
    outputs: Vec<OutputShard>,
    equalize: Equalize,
}

/// The parts of index.json the verifier reads. Lenient on purpose: a wids index written by
/// another tool (no `reshard` section) is still checked against its shard list.
#[derive(Debug, Clone, Deserialize)]
struct IndexView {
    shardlist: Vec<ShardEntry>,
    #[serde(default)]
    reshard: Option<RunView>,
}

#[derive(Debug, Clone, Deserialize)]
struct RunView {
    shards: Option<u64>,
    samples: Option<u64>,
    output_samples: Option<u64>,
    #[serde(default)]
    equalize: Equalize,
    #[serde(default)]
    dropped: Vec<String>,
    #[serde(default)]
    repeated: Vec<String>,
    #[serde(default)]
    key_map: Option<KeyMapView>,
}

/// What verify needs of a `--key-map` run: how many samples no group claimed.
#[derive(Debug, Clone, Deserialize)]
struct KeyMapView {
    #[serde(default)]
    unmatched: u64,
}

/// Rank 0's own knowledge: index.json and the problems found while reading it.
struct Lead {
    index: Option<IndexView>,
    problems: Vec<String>,
}

/// Which side of the comparison a sample record comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Side {
    Input = 0,
    Output = 1,
}

/// One sample on its way to the rank that owns its digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Record {
    digest: u128,
    side: Side,
    /// Global position: canonical input index, or output index in shard-list order.
    index: u64,
    /// Input or output shard number.
    shard: u32,
    /// Byte offset of the sample in its shard.
    offset: u64,
}

const RECORD_BYTES: usize = 40;

impl Record {
    fn encode(&self, out: &mut [u8]) {
        out[..16].copy_from_slice(&self.digest.to_le_bytes());
        out[16..24].copy_from_slice(&self.index.to_le_bytes());
        out[24..32].copy_from_slice(&self.offset.to_le_bytes());
        out[32..36].copy_from_slice(&self.shard.to_le_bytes());
        out[36..40].copy_from_slice(&(self.side as u32).to_le_bytes());
    }

    fn decode(b: &[u8]) -> Self {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        Record {
            digest: u128::from_le_bytes(b[..16].try_into().unwrap()),
            index: u64_at(16),
            offset: u64_at(24),
            shard: u32::from_le_bytes(b[32..36].try_into().unwrap()),
            side: if b[36] == 0 {
                Side::Input
            } else {
                Side::Output
            },
        }
    }

    fn owner(&self, ranks: usize) -> usize {
        (self.digest as u64 % ranks as u64) as usize
    }
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
    let (rank, ranks, lead) = (comm.rank(), comm.size(), comm.rank() == 0);
    let mut lead_state = None;
    let prepared = lead.then(|| {
        prepare(cfg).map(|(setup, state)| {
            lead_state = Some(state);
            setup
        })
    });
    let setup: Setup = broadcast_result(comm, 0, prepared)?;
    narrate(
        lead,
        format_args!(
            "verify: digesting {} input shards and {} output shards on {ranks} rank{}",
            setup.inputs.len(),
            setup.outputs.len(),
            plural(ranks as u64)
        ),
    );

    // Input: a failure here is the input's, and ends the job as `run` would.
    let in_sizes: Vec<u64> = setup.inputs.iter().map(|s| s.size).collect();
    let mine = assign_inputs(&in_sizes, ranks)[rank].clone();
    let (mut records, in_bytes) = agree(comm, digest_inputs(&setup.inputs, mine))?;
    let (first_in, input_samples) = exclusive_sum(comm, records.len() as u64);
    for (i, r) in records.iter_mut().enumerate() {
        r.index = first_in + i as u64;
    }

    // Output: every failure is a finding. Output shards go to ranks in contiguous runs, so an
    // exclusive sum of the counts gives output positions in shard-list order.
    let out_sizes: Vec<u64> = setup.outputs.iter().map(|s| s.size.unwrap_or(0)).collect();
    let mine = assign_inputs(&out_sizes, ranks)[rank].clone();
    let checked = check_outputs(&setup.outputs, mine);
    let (first_out, output_samples) = exclusive_sum(comm, checked.records.len() as u64);
    records.extend(checked.records.iter().enumerate().map(|(i, r)| Record {
        index: first_out + i as u64,
        ..*r
    }));
    drop(checked.records);

    let received = route_records(comm, &records);
    drop(records);
    let tally = compare(received, setup.equalize, setup.outputs.len());
    let mut counts = tally.mismatches.to_array().to_vec();
    counts.push(tally.sums.n as u64);
    let counts = comm.all_sum(&counts);
    let mismatches = Mismatches::from_array(&counts[..5]);

    let per_shard = distinct_inputs_per_output(comm, &tally.shard_pairs, setup.outputs.len());
    let sums = gather(comm, 0, &tally.sums.encode());
    let examples = gather(comm, 0, &encode(&tally.describe_examples(&setup)));
    // A valid run drops or repeats fewer samples than it has shards: only then are their keys
    // looked up (one header read each) and compared with index.json's lists.
    let equalized = match setup.equalize {
        Equalize::None => None,
        Equalize::Drop => Some(mismatches.left_out),
        Equalize::Pad => Some(mismatches.repeated),
    };
    let equalized_keys = match equalized {
        Some(n) if n < setup.outputs.len().max(1) as u64 => {
            Some(gather(comm, 0, &encode(&tally.equalized_keys(&setup))))
        }
        _ => None,
    };
    let shard_problems = gather(comm, 0, &encode(&checked.problems));
    let bytes_read = comm.all_sum(&[in_bytes + checked.bytes])[0];

    let report = lead.then(|| {
        let state = lead_state.take().expect("rank 0 prepared");
        let mut problems = state.problems;
        // Ranks hold contiguous runs of output shards in rank order: shard order.
        problems.extend(decode_concat::<String>(&shard_problems));
        let found = Found {
            input_samples,
            output_samples,
            mismatches,
            examples: decode_concat(&examples),
            equalized_keys: equalized_keys.as_deref().map(decode_concat),
        };
        problems.extend(data_problems(&setup, state.index.as_ref(), &found));
        let sums = sums
            .iter()
            .map(|b| Sums::decode(b))
            .fold(Sums::default(), Sums::merge);
        VerifyReport {
            ok: problems.is_empty(),
            output: cfg.output.clone(),
            ranks,
            input_shards: setup.inputs.len(),
            input_samples,
            output_shards: setup.outputs.len(),
            output_samples,
            equalize: setup.equalize,
            mismatches,
            shuffle: Shuffle {
                pairs: sums.n as u64,
                spearman: sums.correlation(),
                random_bound: (sums.n >= 2).then(|| 3.0 / ((sums.n - 1) as f64).sqrt()),
                input_shards_per_output_shard: Stats::of(&per_shard),
            },
            bytes_read,
            seconds: started.elapsed().as_secs_f64(),
            problems,
        }
    });
    let ok = report.as_ref().is_none_or(|r| r.ok);
    let ok = comm.broadcast(0, vec![u8::from(ok)]) == [1];
    Ok(Verdict { ok, report })
}

/// Prints a progress line on rank 0.
fn narrate(lead: bool, msg: std::fmt::Arguments<'_>) {
    if lead {
        eprintln!("reshard: {msg}");
    }
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(value, bincode::config::standard()).expect("encodable")
}

/// Concatenates the vectors that every rank encoded (our own data: decoding cannot fail).
fn decode_concat<T: serde::de::DeserializeOwned>(parts: &[Vec<u8>]) -> Vec<T> {
    let mut out = Vec::new();
    for part in parts {
        let (v, _): (Vec<T>, _) =
            bincode::serde::decode_from_slice(part, bincode::config::standard())
                .expect("a vector encoded by a peer");
        out.extend(v);
    }
    out
}

/// Rank 0's set-up: expand the input, read index.json, find the output shards. Problems with
/// the output are collected, not raised.
fn prepare(cfg: &VerifyConfig) -> Result<(Setup, Lead)> {
    let mut inputs = Vec::new();
    for path in expand_specs(&cfg.inputs)? {
        let size = fs::metadata(&path)
            .with_context(|| format!("input {}", path.display()))?
            .len();
        inputs.push(InputShard { path, size });
    }
    let dir = &cfg.output;
    let meta = fs::metadata(dir).with_context(|| format!("--output {}", dir.display()))?;
    if !meta.is_dir() {
        bail!("--output {}: not a directory", dir.display());
    }

    let mut problems = Vec::new();
    let index_path = dir.join("index.json");
    let index = match fs::read(&index_path) {
        Ok(bytes) => match serde_json::from_slice::<IndexView>(&bytes) {
            Ok(v) => Some(v),
            Err(e) => {
                problems.push(format!(
                    "{}: not a wids shard index: {e}",
                    index_path.display()
                ));
                None
            }
        },
        Err(e) => {
            problems.push(format!("{}: cannot read: {e}", index_path.display()));
            None
        }
    };

    let mut outputs = Vec::new();
    match &index {
        Some(ix) => {
            let mut seen = std::collections::HashSet::new();
            for entry in &ix.shardlist {
                if !is_inside(&entry.url) {
                    problems.push(format!(
                        "{}: shard url {:?} is not a relative path inside the output directory",
                        index_path.display(),
                        entry.url
                    ));
                    continue;
                }
                if !seen.insert(entry.url.clone()) {
                    problems.push(format!(
                        "{}: shard {:?} is listed twice",
                        index_path.display(),
                        entry.url
                    ));
                    continue;
                }
                let path = dir.join(&entry.url);
                let size = match fs::metadata(&path) {
                    Ok(m) if m.is_file() => Some(m.len()),
                    Ok(_) => {
                        problems.push(format!(
                            "{}: listed in index.json but not a regular file",
                            path.display()
                        ));
                        None
                    }
                    Err(e) => {
                        problems.push(format!(
                            "{}: listed in index.json but missing ({e})",
                            path.display()
                        ));
                        None
                    }
                };
                if let Some(size) = size.filter(|&s| s != entry.filesize) {
                    problems.push(format!(
                        "{}: index.json says filesize {}, the file has {size} bytes",
                        path.display(),
                        entry.filesize
                    ));
                }
                outputs.push(OutputShard {
                    name: entry.url.clone(),
                    path,
                    size,
                    listed: Some(entry.clone()),
                });
            }
            if let Some(run) = &ix.reshard {
                let listed: u64 = ix.shardlist.iter().map(|e| e.nsamples).sum();
                if let Some(s) = run.shards.filter(|&s| s != ix.shardlist.len() as u64) {
                    problems.push(format!(
                        "{}: reshard.shards is {s} but the shardlist has {} entries",
                        index_path.display(),
                        ix.shardlist.len()
                    ));
                }
                if let Some(o) = run.output_samples.filter(|&o| o != listed) {
                    problems.push(format!(
                        "{}: reshard.output_samples is {o} but the shardlist's nsamples add up to {listed}",
                        index_path.display()
                    ));
                }
            }
        }
        None => {
            // No usable index: check what is there, in name order.
            for name in shard_like_files(dir)? {
                let path = dir.join(&name);
                let size = fs::metadata(&path).ok().map(|m| m.len());
                outputs.push(OutputShard {
                    name,
                    path,
                    size,
                    listed: None,
                });
            }
        }
    }
    let known: std::collections::HashSet<&Path> =
        outputs.iter().map(|o| o.path.as_path()).collect();
    for name in shard_like_files(dir)? {
        let path = dir.join(&name);
        if !known.contains(path.as_path()) {
            problems.push(format!(
                "{}: a shard file that index.json does not list",
                path.display()
            ));
        }
    }
    let equalize = index
        .as_ref()
        .and_then(|ix| ix.reshard.as_ref())
        .map_or(Equalize::None, |r| r.equalize);
    Ok((
        Setup {
            inputs,
            outputs,
            equalize,
        },
        Lead { index, problems },
    ))
}

/// A shard url that names a file inside the output directory (no absolute path, no `..`).
fn is_inside(url: &str) -> bool {
    let path = Path::new(url);
    !url.is_empty() && path.components().all(|c| matches!(c, Component::Normal(_)))
}

/// Regular files of `dir` whose names look like tar shards (`*.tar`, `*.tar.*`), sorted by name
/// in byte order.
fn shard_like_files(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("--output {}", dir.display()))? {
        let entry = entry.with_context(|| format!("--output {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let tar_like = name.ends_with(".tar") || name.contains(".tar.");
        if tar_like && entry.file_type().is_ok_and(|t| t.is_file()) {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// Indexes and digests this rank's input shards, in order.
fn digest_inputs(
    inputs: &[InputShard],
    mine: std::ops::Range<usize>,
) -> Result<(Vec<Record>, u64)> {
    let mut records = Vec::new();
    let mut bytes = 0;
    for i in mine {
        let path = &inputs[i].path;
        let idx = index_file(path)?;
        let shard = u32::try_from(i).context("more than 2^32 input shards")?;
        let mut stream = TarStream::open(path)?;
        bytes += digest_samples(&mut stream, &idx.samples, |s, digest| {
            records.push(Record {
                digest,
                side: Side::Input,
                index: 0,
                shard,
                offset: s.start,
            });
        })?;
    }
    Ok((records, bytes))
}

/// What checking a rank's output shards found.
#[derive(Default)]
struct Checked {
    records: Vec<Record>,
    problems: Vec<String>,
    bytes: u64,
}

/// Checks this rank's output shards (a sound tar, only samples, the sample count index.json
/// gives, ending with the end-of-archive blocks) and digests their samples.
fn check_outputs(outputs: &[OutputShard], mine: std::ops::Range<usize>) -> Checked {
    let mut out = Checked::default();
    for i in mine {
        let shard = &outputs[i];
        if shard.size.is_none() {
            continue; // rank 0 reported it
        }
        let path = &shard.path;
        let idx = match index_file(path) {
            Ok(idx) => idx,
            Err(e) => {
                out.problems.push(format!("{e:#}"));
                continue;
            }
        };
        out.problems.extend(shard_problems(shard, &idx));
        let number = u32::try_from(i).expect("fewer than 2^32 output shards");
        let records = &mut out.records;
        let checked = TarStream::open(path).and_then(|mut stream| {
            let n = digest_samples(&mut stream, &idx.samples, |s, digest| {
                records.push(Record {
                    digest,
                    side: Side::Output,
                    index: 0,
                    shard: number,
                    offset: s.start,
                });
            })?;
            // With entries outside samples (reported above) the samples' end is not the
            // records' end.
            if idx.skipped.total() == 0 {
                stream.check_tail()?;
            }
            Ok(n)
        });
        match checked {
            Ok(n) => out.bytes += n,
            Err(e) => out.problems.push(format!("{e:#}")),
        }
    }
    out
}

/// What is wrong with an output shard that indexed: the sample count index.json gives, entries
/// outside samples.
fn shard_problems(shard: &OutputShard, idx: &ShardIndex) -> Vec<String> {
    let path = shard.path.display();
    let mut problems = Vec::new();
    if let Some(entry) = &shard.listed {
        if entry.nsamples != idx.samples.len() as u64 {
            problems.push(format!(
                "{path}: index.json says nsamples {}, the shard holds {} samples",
                entry.nsamples,
                idx.samples.len()
            ));
        }
    }
    let k = idx.skipped;
    if k.total() > 0 {
        problems.push(format!(
            "{path}: holds entries that belong to no sample ({} directories, {} files without a key, {} links/special files, {} PAX global headers)",
            k.directories, k.keyless_files, k.other_entries, k.global_headers
        ));
    }
    problems
}

/// A shard's tar stream, read front to back once: the file itself, or its decompressed stream
/// (offsets are then those of the decompressed stream, as the indexer gives them).
struct TarStream {
    reader: BufReader<Box<dyn Read + Send>>,
    pos: u64,
    /// The file as messages name it.
    name: String,
}

impl TarStream {
    fn open(path: &Path) -> Result<Self> {
        let codec = Codec::sniff(path)?;
        let file = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
        let (inner, name): (Box<dyn Read + Send>, String) = if codec == Codec::Plain {
            (Box::new(file), path.display().to_string())
        } else {
            let stream = codec
                .decoder(file)
                .with_context(|| format!("{}: cannot start decompressing", path.display()))?;
            let name = format!(
                "{} ({codec:?}-compressed; offsets in the decompressed stream)",
                path.display()
            );
            (stream, name)
        };
        Ok(TarStream {
            reader: BufReader::with_capacity(READ_BUFFER, inner),
            pos: 0,
            name,
        })
    }

    /// Passes the next `len` bytes (fewer where the stream ends) to `f`, piece by piece; returns
    /// how many there were.
    fn read(&mut self, len: u64, mut f: impl FnMut(&[u8])) -> Result<u64> {
        let mut left = len;
        while left > 0 {
            let buf = self
                .reader
                .fill_buf()
                .with_context(|| format!("{}: byte offset {}: cannot read", self.name, self.pos))?;
            if buf.is_empty() {
                break;
            }
            let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            f(&buf[..n]);
            self.reader.consume(n);
            self.pos += n as u64;
            left -= n as u64;
        }
        Ok(len - left)
    }

    /// Skips to `offset` (samples come in stream order; the gaps are skipped entries).
    fn skip_to(&mut self, offset: u64) -> Result<()> {
        let Some(gap) = offset.checked_sub(self.pos) else {
            bail!(
                "{}: byte offset {offset}: samples out of order (at {})",
                self.name,
                self.pos
            );
        };
        if self.read(gap, |_| {})? < gap {
            bail!(
                "{}: byte offset {}: the stream ends before byte offset {offset}",
                self.name,
                self.pos
            );
        }
        Ok(())
    }

    /// The digest of the next `len` bytes.
    fn digest(&mut self, len: u64) -> Result<u128> {
        let start = self.pos;
        let mut h = Digest128::new();
        if self.read(len, |piece| h.update(piece))? < len {
            bail!(
                "{}: byte offset {}: the stream ends inside the sample at byte offset {start} (did it change while being verified?)",
                self.name,
                self.pos
            );
        }
        Ok(h.finish())
    }

    /// Requires the rest of the stream to be the end-of-archive marker: at least two zero
    /// blocks, nothing but zeros after them, a whole number of blocks.
    fn check_tail(&mut self) -> Result<()> {
        let end = self.pos;
        let mut nonzero = None;
        let mut at = end;
        self.read(u64::MAX, |piece| {
            if nonzero.is_none() {
                nonzero = piece.iter().position(|&b| b != 0).map(|i| at + i as u64);
            }
            at += piece.len() as u64;
        })?;
        let tail = self.pos - end;
        if let Some(off) = nonzero {
            bail!(
                "{}: byte offset {off}: data after the end-of-archive marker",
                self.name
            );
        }
        if tail < 1024 {
            bail!(
                "{}: byte offset {end}: no end-of-archive marker after the last sample (expected two zero blocks, the stream ends {tail} bytes later)",
                self.name
            );
        }
        if self.pos % 512 != 0 {
            bail!(
                "{}: the stream's length ({} bytes) is not a whole number of 512-byte blocks",
                self.name,
                self.pos
            );
        }
        Ok(())
    }
}

/// Reads every sample (in stream order) and calls `each` with its digest; returns the sample
/// bytes read.
fn digest_samples(
    stream: &mut TarStream,
    samples: &[Sample],
    mut each: impl FnMut(&Sample, u128),
) -> Result<u64> {
    let mut bytes = 0;
    for s in samples {
        stream.skip_to(s.start)?;
        each(s, stream.digest(s.len)?);
        bytes += s.len;
    }
    Ok(bytes)
}

/// The key of the sample at `offset` of a shard (of its decompressed stream when compressed).
fn key_of_sample(path: &Path, offset: u64) -> Result<String> {
    key_at(path, offset, u64::MAX)
}

/// Sends every record to the rank that owns its digest; returns the records this rank owns.
fn route_records(comm: &impl Comm, records: &[Record]) -> Vec<Record> {
    let ranks = comm.size();
    let recv = route(comm, RECORD_BYTES, &|sink| {
        for r in records {
            let mut bytes = [0u8; RECORD_BYTES];
            r.encode(&mut bytes);
            sink(r.owner(ranks), &bytes);
        }
    });
    recv.chunks_exact(RECORD_BYTES)
        .map(Record::decode)
        .collect()
}

/// A kind of mismatch, for examples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Kind {
    Missing,
    NotInInput,
    Duplicated,
}

/// Exact sums over (input position, output position) pairs, for the correlation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Sums {
    n: u128,
    x: u128,
    y: u128,
    xx: u128,
    yy: u128,
    xy: u128,
}

impl Sums {
    fn add(&mut self, x: u64, y: u64) {
        let (x, y) = (u128::from(x), u128::from(y));
        self.n += 1;
        self.x += x;
        self.y += y;
        self.xx += x * x;
        self.yy += y * y;
        self.xy += x * y;
    }

    fn merge(self, o: Sums) -> Sums {
        Sums {
            n: self.n + o.n,
            x: self.x + o.x,
            y: self.y + o.y,
            xx: self.xx + o.xx,
            yy: self.yy + o.yy,
            xy: self.xy + o.xy,
        }
    }

    fn encode(&self) -> Vec<u8> {
        [self.n, self.x, self.y, self.xx, self.yy, self.xy]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect()
    }

    fn decode(b: &[u8]) -> Sums {
        let v = |i: usize| u128::from_le_bytes(b[16 * i..16 * i + 16].try_into().unwrap());
        Sums {
            n: v(0),
            x: v(1),
            y: v(2),
            xx: v(3),
            yy: v(4),
            xy: v(5),
        }
    }

    /// Pearson's correlation of the pairs; with positions as ranks, Spearman's ρ.
    fn correlation(&self) -> Option<f64> {
        if self.n < 2 {
            return None;
        }
        let n = self.n as f64;
        let (mx, my) = (self.x as f64 / n, self.y as f64 / n);
        let vx = self.xx as f64 / n - mx * mx;
        let vy = self.yy as f64 / n - my * my;
        let cov = self.xy as f64 / n - mx * my;
        (vx > 0.0 && vy > 0.0).then(|| (cov / (vx * vy).sqrt()).clamp(-1.0, 1.0))
    }
}

/// What the owner of a set of digests found.
#[derive(Default)]
struct Tally {
    mismatches: Mismatches,
    sums: Sums,
    /// (output shard, input shard) of every pair, deduplicated.
    shard_pairs: Vec<(u32, u32)>,
    /// A few mismatches of each kind: the record to name and the digest's (input, output) counts.
    examples: Vec<(Kind, Record, u64, u64)>,
    /// The input samples left out (drop) or the output's second copies (pad), up to the shard
    /// count (a valid run has fewer).
    equalized: Vec<Record>,
}

impl Tally {
    fn example(&mut self, kind: Kind, r: Record, ins: u64, outs: u64) {
        if self.examples.iter().filter(|e| e.0 == kind).count() < EXAMPLES {
            self.examples.push((kind, r, ins, outs));
        }
    }

    /// The examples, as sentences naming the key, the file and the byte offset.
    fn describe_examples(&self, setup: &Setup) -> Vec<(Kind, String)> {
        self.examples
            .iter()
            .map(|&(kind, r, ins, outs)| {
                let (path, key) = locate(setup, &r);
                let what = match kind {
                    Kind::Missing => format!(
                        "sample {key} from {} byte offset {} is missing from the output",
                        path.display(),
                        r.offset
                    ),
                    Kind::NotInInput => format!(
                        "sample {key} in {} at byte offset {} matches no input sample (corrupted, or not from this input)",
                        path.display(),
                        r.offset
                    ),
                    Kind::Duplicated => format!(
                        "sample {key} is in the output {outs} times but in the input {ins} time{}, e.g. {} byte offset {}",
                        plural(ins),
                        path.display(),
                        r.offset
                    ),
                };
                (kind, what)
            })
            .collect()
    }

    /// The keys of the equalized samples.
    fn equalized_keys(&self, setup: &Setup) -> Vec<String> {
        self.equalized
            .iter()
            .map(|r| {
                let path = sample_path(setup, r);
                key_of_sample(path, r.offset).unwrap_or_else(|e| format!("({e:#})"))
            })
            .collect()
    }
}

fn sample_path<'a>(setup: &'a Setup, r: &Record) -> &'a Path {
    match r.side {
        Side::Input => &setup.inputs[r.shard as usize].path,
        Side::Output => &setup.outputs[r.shard as usize].path,
    }
}

/// The file a record comes from and its key, quoted (or why it cannot be read).
fn locate<'a>(setup: &'a Setup, r: &Record) -> (&'a Path, String) {
    let path = sample_path(setup, r);
    let key = match key_of_sample(path, r.offset) {
        Ok(k) => format!("{k:?}"),
        Err(e) => format!("(key unreadable: {e:#})"),
    };
    (path, key)
}

/// Compares the copies of each digest this rank owns.
fn compare(mut records: Vec<Record>, equalize: Equalize, shards: usize) -> Tally {
    records.sort_unstable();
    let mut t = Tally::default();
    for group in records.chunk_by(|a, b| a.digest == b.digest) {
        let split = group.partition_point(|r| r.side == Side::Input);
        let (ins, outs) = group.split_at(split);
        for (i, o) in ins.iter().zip(outs) {
            t.sums.add(i.index, o.index);
            t.shard_pairs.push((o.shard, i.shard));
        }
        let (i, o) = (ins.len() as u64, outs.len() as u64);
        let (i_n, o_n) = (ins.len(), outs.len());
        if i == 0 {
            t.mismatches.not_in_input += o;
            t.example(Kind::NotInInput, outs[0], i, o);
            continue;
        }
        match equalize {
            Equalize::None | Equalize::Pad if o < i => {
                t.mismatches.missing += i - o;
                t.example(Kind::Missing, ins[o_n], i, o);
            }
            Equalize::Drop if o < i => {
                t.mismatches.left_out += i - o;
                let room = shards.saturating_sub(t.equalized.len());
                t.equalized.extend(ins[o_n..].iter().take(room));
            }
            Equalize::Pad if o > i => {
                let extra = (o - i).min(i);
                t.mismatches.repeated += extra;
                let room = shards.saturating_sub(t.equalized.len());
                t.equalized
                    .extend(outs[i_n..i_n + extra as usize].iter().take(room));
                if o > 2 * i {
                    t.mismatches.duplicated += o - 2 * i;
                    t.example(Kind::Duplicated, outs[2 * i_n], i, o);
                }
            }
            _ if o > i => {
                t.mismatches.duplicated += o - i;
                t.example(Kind::Duplicated, outs[i_n], i, o);
            }
            _ => {}
        }
    }
    t.shard_pairs.sort_unstable();
    t.shard_pairs.dedup();
    t
}

/// For every output shard (on rank 0, in shard order): how many distinct input shards its
/// samples come from. Pairs go to the rank `shard mod P`, which counts them.
fn distinct_inputs_per_output(comm: &impl Comm, pairs: &[(u32, u32)], shards: usize) -> Vec<u64> {
    let ranks = comm.size();
    let owner = |s: u32| s as usize % ranks;
    let recv = route(comm, 8, &|sink| {
        for &(s, i) in pairs {
            let mut bytes = [0u8; 8];
            bytes[..4].copy_from_slice(&s.to_le_bytes());
            bytes[4..].copy_from_slice(&i.to_le_bytes());
            sink(owner(s), &bytes);
        }
    });
    let mut got: Vec<(u32, u32)> = recv
        .chunks_exact(8)
        .map(|c| {
            (
                u32::from_le_bytes(c[..4].try_into().unwrap()),
                u32::from_le_bytes(c[4..].try_into().unwrap()),
            )
        })
        .collect();
    got.sort_unstable();
    got.dedup();
    let mut mine: BTreeMap<u32, u64> = BTreeMap::new();
    for (s, _) in got {
        *mine.entry(s).or_default() += 1;
    }
    let mine: Vec<(u32, u64)> = mine.into_iter().collect();
    let parts = gather(comm, 0, &encode(&mine));
    if comm.rank() != 0 {
        return Vec::new();
    }
    let mut per_shard = vec![0u64; shards];
    for (s, n) in decode_concat::<(u32, u64)>(&parts) {
        per_shard[s as usize] = n;
    }
    per_shard
}

/// What the ranks found together, on rank 0.
struct Found {
    input_samples: u64,
    output_samples: u64,
    mismatches: Mismatches,
    examples: Vec<(Kind, String)>,
    /// Keys of the equalized samples, when their count was plausible.
    equalized_keys: Option<Vec<String>>,
}

/// The problems with the samples: mismatches, and index.json's claims about them.
fn data_problems(setup: &Setup, index: Option<&IndexView>, f: &Found) -> Vec<String> {
    let mut problems = Vec::new();
    let mut m = f.mismatches;
    // Samples no key-map group claimed (`--unmatched skip`) are missing by design: index.json
    // counts them, and the count must match exactly.
    let unmatched = index
        .and_then(|ix| ix.reshard.as_ref())
        .and_then(|r| r.key_map.as_ref())
        .map_or(0, |k| k.unmatched);
    let absent = if setup.equalize == Equalize::Drop {
        &mut m.left_out
    } else {
        &mut m.missing
    };
    if unmatched > 0 {
        if *absent < unmatched {
            problems.push(format!(
                "index.json says {unmatched} samples matched no key-map group and were left out, but only {absent} input samples are absent from the output",
                absent = *absent
            ));
        }
        *absent = absent.saturating_sub(unmatched);
    }
    let with_examples = |head: String, kind: Kind| {
        let mut s = head;
        for (_, e) in f.examples.iter().filter(|e| e.0 == kind).take(EXAMPLES) {
            s += &format!("\n    - {e}");
        }
        s
    };
    if m.missing > 0 {
        problems.push(with_examples(
            format!(
                "{} input sample{} missing from the output",
                m.missing,
                if m.missing == 1 { " is" } else { "s are" }
            ),
            Kind::Missing,
        ));
    }
    if m.not_in_input > 0 {
        problems.push(with_examples(
            format!(
                "{} output sample{} not in the input",
                m.not_in_input,
                if m.not_in_input == 1 { " is" } else { "s are" }
            ),
            Kind::NotInInput,
        ));
    }
    if m.duplicated > 0 {
        problems.push(with_examples(
            format!(
                "{} duplicated sample{} in the output (extra copies of input samples)",
                m.duplicated,
                plural(m.duplicated)
            ),
            Kind::Duplicated,
        ));
    }

    let Some(run) = index.and_then(|ix| ix.reshard.as_ref()) else {
        return problems;
    };
    if let Some(n) = run.samples.filter(|&n| n != f.input_samples) {
        problems.push(format!(
            "index.json says the input held {n} samples, but the input given holds {} (another input, or it changed since)",
            f.input_samples
        ));
    }
    let (name, found, listed) = match setup.equalize {
        Equalize::None => {
            if !run.dropped.is_empty() || !run.repeated.is_empty() {
                problems.push(
                    "index.json lists dropped or repeated samples but says equalize none".into(),
                );
            }
            return problems;
        }
        Equalize::Drop => ("dropped", m.left_out, &run.dropped),
        Equalize::Pad => ("repeated", m.repeated, &run.repeated),
    };
    let expected = match setup.equalize {
        Equalize::Drop => f
            .input_samples
            .checked_sub(f.output_samples)
            .and_then(|d| d.checked_sub(unmatched)),
        _ => f.output_samples.checked_sub(f.input_samples),
    };
    if found != listed.len() as u64 || expected != Some(found) {
        problems.push(format!(
            "--equalize {}: {found} samples are {name}, index.json lists {}, and input and output counts ({} and {}) imply {}",
            equalize_name(setup.equalize),
            listed.len(),
            f.input_samples,
            f.output_samples,
            expected.map_or_else(|| "an impossible count".to_string(), |e| e.to_string())
        ));
    } else if let Some(keys) = f.equalized_keys.as_ref().filter(|_| unmatched == 0) {
        let (mut got, mut want) = (keys.clone(), listed.clone());
        got.sort();
        want.sort();
        if got != want {
            let stray: Vec<&String> = got
                .iter()
                .filter(|k| !want.contains(k))
                .take(EXAMPLES)
                .collect();
            problems.push(format!(
                "--equalize {}: the {name} samples are not the ones index.json lists (e.g. {stray:?})",
                equalize_name(setup.equalize)
            ));
        }
    }
    problems
}

/// A 128-bit digest of a byte stream: four 64-bit lanes take 32-byte stripes (multiply-rotate
/// rounds, each a bijection of the lane state), then two independent avalanche chains fold the
/// 256-bit state and the length into two 64-bit halves. Not cryptographic: it detects corruption
/// and tells samples apart, which is all `verify` needs, at memory speed.
#[derive(Debug, Clone)]
pub struct Digest128 {
    lanes: [u64; 4],
    pending: [u8; 32],
    pending_len: usize,
    len: u64,
}

const LANE_SEEDS: [u64; 4] = [
    0x243F_6A88_85A3_08D3,
    0x1319_8A2E_0370_7344,
    0xA409_3822_299F_31D0,
    0x082E_FA98_EC4E_6C89,
];
const MUL_IN: u64 = 0x9E37_79B9_7F4A_7C15;
const MUL_OUT: u64 = 0xD6E8_FEB8_6659_FD93;

/// SplitMix64's finalizer: every input bit flips each output bit with probability ≈ 1/2.
fn avalanche(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Default for Digest128 {
    fn default() -> Self {
        Self::new()
    }
}

impl Digest128 {
    pub fn new() -> Self {
        Digest128 {
            lanes: LANE_SEEDS,
            pending: [0; 32],
            pending_len: 0,
            len: 0,
        }
    }

    fn stripe(lanes: &mut [u64; 4], block: &[u8]) {
        for (i, lane) in lanes.iter_mut().enumerate() {
            let word = u64::from_le_bytes(block[8 * i..8 * i + 8].try_into().unwrap());
            *lane = lane
                .wrapping_add(word.wrapping_mul(MUL_IN))
                .rotate_left(31)
                .wrapping_mul(MUL_OUT);
        }
    }

    /// Feeds more bytes; any split of a stream gives the same digest.
    pub fn update(&mut self, mut data: &[u8]) {
        self.len += data.len() as u64;
        if self.pending_len > 0 {
            let take = (32 - self.pending_len).min(data.len());
            self.pending[self.pending_len..self.pending_len + take].copy_from_slice(&data[..take]);
            self.pending_len += take;
            data = &data[take..];
            if self.pending_len < 32 {
                return;
            }
            let block = self.pending;
            Self::stripe(&mut self.lanes, &block);
            self.pending_len = 0;
        }
        let mut stripes = data.chunks_exact(32);
        for block in &mut stripes {
            Self::stripe(&mut self.lanes, block);
        }
        let rest = stripes.remainder();
        self.pending[..rest.len()].copy_from_slice(rest);
        self.pending_len = rest.len();
    }

    /// The digest of everything fed.
    pub fn finish(mut self) -> u128 {
        if self.pending_len > 0 {
            // Zero-padded: the length, folded in below, tells the padding from data.
            self.pending[self.pending_len..].fill(0);
            let block = self.pending;
            Self::stripe(&mut self.lanes, &block);
        }
        let mut hi = avalanche(self.len ^ 0x5851_F42D_4C95_7F2D);
        let mut lo = avalanche(self.len.wrapping_add(0x1405_7B7E_F767_814F));
        for (i, &lane) in self.lanes.iter().enumerate() {
            hi = avalanche(hi ^ lane).wrapping_add(LANE_SEEDS[i]);
            lo =
                avalanche(lo.wrapping_add(lane.rotate_left(17 + 8 * i as u32)) ^ LANE_SEEDS[3 - i]);
        }
        (u128::from(avalanche(hi)) << 64) | u128::from(avalanche(lo))
    }

    /// The digest of `data`.
    pub fn of(data: &[u8]) -> u128 {
        let mut d = Digest128::new();
        d.update(data);
        d.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use crate::comm::local::LocalComm;
    use clap::Parser;

    #[test]
    fn digest_ignores_how_the_stream_is_split_and_sees_every_bit() {
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 7 % 251) as u8).collect();
        let whole = Digest128::of(&data);
        for split in [1, 5, 31, 32, 33, 64, 1000] {
            let mut d = Digest128::new();
            for chunk in data.chunks(split) {
                d.update(chunk);
            }
            assert_eq!(d.finish(), whole, "chunks of {split}");
        }
        let mut seen = std::collections::HashSet::new();
        seen.insert(whole);
        for i in 0..200 {
            for bit in [0, 7] {
                let mut changed = data.clone();
                changed[i * 13] ^= 1 << bit;
                assert!(
                    seen.insert(Digest128::of(&changed)),
                    "byte {} bit {bit}",
                    i * 13
                );
            }
        }
        // Trailing zeros change the length, hence the digest.
        assert!(seen.insert(Digest128::of(&[data.as_slice(), &[0]].concat())));
        assert!(seen.insert(Digest128::of(&[])));
        assert!(seen.insert(Digest128::of(&[0])));
        assert!(seen.insert(Digest128::of(&[0; 32])));
    }

    #[test]
    fn digest_halves_are_balanced() {
        // Each output bit flips for about half of single-bit input changes.
        let base = [0x5Au8; 512];
        let d0 = Digest128::of(&base);
        let mut flips = [0u32; 128];
        let trials = 512 * 8;
        for i in 0..512 {
            for bit in 0..8 {
                let mut b = base;
                b[i] ^= 1 << bit;
                let diff = Digest128::of(&b) ^ d0;
                for (k, f) in flips.iter_mut().enumerate() {
                    *f += ((diff >> k) & 1) as u32;
                }
            }
        }
        for (k, &f) in flips.iter().enumerate() {
            let share = f64::from(f) / f64::from(trials);
            assert!((0.45..0.55).contains(&share), "bit {k} flips {share}");
        }
    }

    fn rec(digest: u128, side: Side, index: u64, shard: u32) -> Record {
        Record {
            digest,
            side,
            index,
            shard,
            offset: index * 512,
        }
    }

    #[test]
    fn records_round_trip() {
        let r = Record {
            digest: u128::MAX - 5,
            side: Side::Output,
            index: 1 << 40,
            shard: 7,
            offset: 12345,
        };
        let mut b = [0u8; RECORD_BYTES];
        r.encode(&mut b);
        assert_eq!(Record::decode(&b), r);
    }

    #[test]
    fn compare_counts_each_kind_of_mismatch() {
        use Side::{Input as I, Output as O};
        let records = vec![
            rec(1, I, 0, 0),
            rec(1, O, 5, 2), // matched
            rec(2, I, 1, 0), // missing
            rec(3, O, 6, 2), // not in the input
            rec(4, I, 2, 1),
            rec(4, O, 7, 3),
            rec(4, O, 8, 3), // one extra copy
        ];
        let t = compare(records.clone(), Equalize::None, 4);
        assert_eq!(
            t.mismatches,
            Mismatches {
                missing: 1,
                not_in_input: 1,
                duplicated: 1,
                ..Mismatches::default()
            }
        );
        assert_eq!(t.sums.n, 2);
        assert_eq!(t.shard_pairs, [(2, 0), (3, 1)]);
        let kinds: Vec<Kind> = t.examples.iter().map(|e| e.0).collect();
        assert_eq!(kinds, [Kind::Missing, Kind::NotInInput, Kind::Duplicated]);
        // The example of a duplicate is the later copy.
        assert_eq!(t.examples[2].1.index, 8);

        let t = compare(records.clone(), Equalize::Drop, 4);
        assert_eq!((t.mismatches.missing, t.mismatches.left_out), (0, 1));
        assert_eq!(t.equalized.len(), 1);
        let t = compare(records, Equalize::Pad, 4);
        assert_eq!(
            (
                t.mismatches.repeated,
                t.mismatches.duplicated,
                t.mismatches.missing
            ),
            (1, 0, 1)
        );
        assert_eq!(t.equalized[0].index, 8);
    }

    #[test]
    fn correlation_of_orders() {
        let mut same = Sums::default();
        let mut reversed = Sums::default();
        for i in 0..100 {
            same.add(i, i);
            reversed.add(i, 99 - i);
        }
        assert!((same.correlation().unwrap() - 1.0).abs() < 1e-12);
        assert!((reversed.correlation().unwrap() + 1.0).abs() < 1e-12);
        // Spearman's formula on a small permutation: d = (1, -1, 0, 1, -1), Σd² = 4, n = 5.
        let mut s = Sums::default();
        for (x, y) in [(0, 1), (1, 0), (2, 2), (3, 4), (4, 3)] {
            s.add(x, y);
        }
        let expected = 1.0 - 6.0 * 4.0 / (5.0 * 24.0);
        assert!((s.correlation().unwrap() - expected).abs() < 1e-12);
        let halves = Sums::decode(&same.encode());
        assert_eq!(halves, same);
        assert_eq!(Sums::default().correlation(), None);
    }

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
        let cfg = args.resolve(false).unwrap();
        for r in LocalComm::run(2, |c| crate::pipeline::run(c, &cfg).map(|_| ())) {
            r.unwrap();
        }
    }

    fn verdicts(inputs: &[String], out: &Path, ranks: usize) -> Vec<Verdict> {
        let cfg = VerifyConfig {
            inputs: inputs.to_vec(),
            output: out.to_path_buf(),
            json: false,
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
            inputs,
            output: out,
            json: false,
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

    #[test]
    fn urls_must_stay_inside_the_output() {
        assert!(is_inside("shard-000000.tar"));
        assert!(is_inside("sub/shard.tar"));
        assert!(!is_inside("../x.tar"));
        assert!(!is_inside("/etc/passwd"));
        assert!(!is_inside("a/../../x.tar"));
        assert!(!is_inside(""));
    }
}
