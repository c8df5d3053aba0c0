//! Orders beyond the shuffle: by key, by the content of a member, stratified by a label, and
//! routed into named groups by a key map. Each comes down to one question — the output
//! position of every sample — answered with the distributed sort of [`crate::comm::sort`] where
//! the permutation alone does not answer it.
//!
//! Sort keys are byte strings compared with `memcmp`: integers and floats in fixed-width,
//! order-preserving encodings, strings escaped and terminated so that no key is a prefix of
//! another, which also lets `--descending` invert the bytes. Ties are broken by the global
//! sample index, so every order is total and the same for any rank count.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};

use crate::comm::sort::{global_ranks, Item};
use crate::comm::{agree, everywhere, gather, Comm};
use crate::exchange::LocalSample;
use crate::key_map::{KeyMap, Unmatched, SKIPPED as KEY_MAP_SKIPPED};
use crate::permute::Permutation;
use crate::plan::{Equalize, ShardPlan, Sizing, Targets};

/// `--order`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum OrderBy {
    /// The seeded global permutation.
    #[default]
    Shuffle,
    /// The sample key, in byte order.
    Key,
    /// The content of the member with extension `ext`, read as `kind`.
    Content { ext: String, kind: ValueKind },
}

/// How a member's content is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    /// A decimal integer (i64), surrounding whitespace ignored.
    Int,
    /// A decimal float; NaN is refused.
    Float,
    /// The bytes, surrounding ASCII whitespace trimmed.
    Str,
}

impl std::str::FromStr for OrderBy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "shuffle" => return Ok(OrderBy::Shuffle),
            "key" => return Ok(OrderBy::Key),
            _ => {}
        }
        let usage = "expected shuffle, key or content:EXT[:int|float|str] (e.g. content:cls:int)";
        let Some(rest) = s.strip_prefix("content:") else {
            return Err(format!("{usage}, got {s:?}"));
        };
        let (ext, kind) = match rest.rsplit_once(':') {
            Some((e, "int")) => (e, ValueKind::Int),
            Some((e, "float")) => (e, ValueKind::Float),
            Some((e, "str")) => (e, ValueKind::Str),
            _ => (rest, ValueKind::Str),
        };
        let ext = ext.trim_start_matches('.');
        if ext.is_empty() || ext.contains(':') {
            return Err(format!("{usage}, got {s:?}"));
        }
        Ok(OrderBy::Content {
            ext: ext.to_string(),
            kind,
        })
    }
}

/// `--missing`: a sample without the member an order or stratification reads, or with content
/// that does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Missing {
    /// An error naming the input file and the sample key.
    #[default]
    Error,
    /// Placed after all others (ascending or descending); as a stratum of its own.
    Last,
}

/// Everything that decides the order of the output.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OrderSpec {
    pub by: OrderBy,
    pub descending: bool,
    pub missing: Missing,
    /// `--stratify-by EXT`.
    pub stratify_by: Option<String>,
    /// `--label-limit`: the largest member read for a label or an order.
    pub label_limit: u64,
    pub key_map: Option<PathBuf>,
    pub unmatched: Unmatched,
}

impl OrderSpec {
    /// The extension of the member whose content must be read while indexing.
    pub fn member(&self) -> Option<&str> {
        match &self.by {
            OrderBy::Content { ext, .. } => Some(ext),
            _ => self.stratify_by.as_deref(),
        }
    }

    /// Whether sample keys are needed (an order by key, or a key map).
    pub fn needs_keys(&self) -> bool {
        self.by == OrderBy::Key || self.key_map.is_some()
    }

    /// The plain seeded shuffle, which needs no sort.
    pub fn is_shuffle(&self) -> bool {
        self.by == OrderBy::Shuffle && self.stratify_by.is_none() && self.key_map.is_none()
    }

    /// For the manifest: `shuffle`, `key`, `content:cls:int descending`, ….
    pub fn describe(&self) -> String {
        let mut s = match &self.by {
            OrderBy::Shuffle => "shuffle".to_string(),
            OrderBy::Key => "key".to_string(),
            OrderBy::Content { ext, kind } => format!(
                "content:{ext}:{}",
                match kind {
                    ValueKind::Int => "int",
                    ValueKind::Float => "float",
                    ValueKind::Str => "str",
                }
            ),
        };
        if self.descending {
            s.push_str(" descending");
        }
        s
    }
}

/// Appends `bytes` so that the encodings of two strings compare like the strings and none is a
/// prefix of another: 0x00 becomes 0x00 0xFF, and 0x00 0x00 ends the string.
fn push_str(out: &mut Vec<u8>, bytes: &[u8]) {
    for &b in bytes {
        if b == 0 {
            out.extend([0, 0xFF]);
        } else {
            out.push(b);
        }
    }
    out.extend([0, 0]);
}

/// The sort key of one value: a presence byte (0; 1 marks a missing value, sorted last), then
/// the value's encoding, inverted when `descending`.
pub fn value_key(
    value: Option<&[u8]>,
    kind: ValueKind,
    descending: bool,
) -> Result<Vec<u8>, String> {
    let Some(raw) = value else {
        return Ok(vec![1]);
    };
    let mut out = vec![0u8];
    let text = || {
        std::str::from_utf8(raw.trim_ascii())
            .map_err(|_| format!("{:?} is not UTF-8 text", String::from_utf8_lossy(raw)))
    };
    match kind {
        ValueKind::Int => {
            let t = text()?;
            let v: i64 = t.parse().map_err(|_| format!("{t:?} is not an integer"))?;
            out.extend(((v as u64) ^ (1 << 63)).to_be_bytes());
        }
        ValueKind::Float => {
            let t = text()?;
            let v: f64 = t.parse().map_err(|_| format!("{t:?} is not a number"))?;
            if v.is_nan() {
                return Err(format!("{t:?} is not a number"));
            }
            // -0.0 and 0.0 are equal: ties go by sample index.
            let bits = if v == 0.0 { 0.0f64 } else { v }.to_bits();
            let ordered = if bits >> 63 == 1 {
                !bits
            } else {
                bits | (1 << 63)
            };
            out.extend(ordered.to_be_bytes());
        }
        ValueKind::Str => push_str(&mut out, raw.trim_ascii()),
    }
    if descending {
        for b in &mut out[1..] {
            *b = !*b;
        }
    }
    Ok(out)
}

/// A sample key as a sort key (a string, never missing).
pub fn sample_key(key: &[u8], descending: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 3);
    out.push(0);
    push_str(&mut out, key);
    if descending {
        for b in &mut out[1..] {
            *b = !*b;
        }
    }
    out
}

/// A sample that is not written: dropped by `--equalize drop` (with its rank in the order, for
/// listing), or skipped as unmatched by the key map.
const DROPPED: u64 = 1 << 63;
const SKIPPED: u64 = u64::MAX;

/// The output positions of this rank's samples (none, one, or two when repeated by
/// `--equalize pad`).
pub enum Placement {
    /// The plain shuffle: computed on demand from the permutation, O(1) memory.
    Permuted {
        permutation: Permutation,
        targets: Targets,
        first_global: u64,
    },
    /// Computed by a sort: 8 bytes per sample, plus the few repeats.
    Listed {
        first: Vec<u64>,
        /// (local sample, position of its second copy), by sample.
        again: Vec<(u64, u64)>,
    },
}

impl Placement {
    /// Position of copy `copy` of local sample `i`, if written that many times.
    pub fn position(&self, i: usize, copy: usize) -> Option<u64> {
        match self {
            Placement::Permuted {
                permutation,
                targets,
                first_global,
            } => targets
                .of(permutation.apply(first_global + i as u64))
                .nth(copy),
            Placement::Listed { first, again } => match copy {
                0 => Some(first[i]).filter(|&p| p & DROPPED == 0),
                1 => again
                    .binary_search_by_key(&(i as u64), |a| a.0)
                    .ok()
                    .map(|k| again[k].1),
                _ => None,
            },
        }
    }

    /// Calls `f(i, position)` for every position a local sample is written at.
    pub fn for_each(&self, samples: usize, f: &mut dyn FnMut(usize, u64)) {
        for i in 0..samples {
            for copy in 0..2 {
                match self.position(i, copy) {
                    Some(p) => f(i, p),
                    None => break,
                }
            }
        }
    }

    /// For the manifest's lists: `Some((rank, true))` when local sample `i` is dropped (its rank
    /// in the order), `Some((position, false))` when it is written twice (its second position).
    pub fn equalized(&self, i: usize) -> Option<(u64, bool)> {
        match self {
            Placement::Permuted {
                permutation,
                targets,
                first_global,
            } => {
                let q = permutation.apply(first_global + i as u64);
                if q >= targets.positions() {
                    Some((q, true))
                } else {
                    targets.of(q).nth(1).map(|p| (p, false))
                }
            }
            Placement::Listed { first, .. } => {
                if first[i] != SKIPPED && first[i] & DROPPED != 0 {
                    Some((first[i] & !DROPPED, true))
                } else {
                    self.position(i, 1).map(|p| (p, false))
                }
            }
        }
    }
}

/// How `--stratify-by` deals the label-sorted order to shards, so that every label's count in
/// every shard is within one of its ideal share (share of the dataset × shard size).
///
/// With `M` positions in `S` shards, the first `r = M mod S` shards ("big") hold `c + 1` and the
/// others `c = M div S`. Rank `j` goes to the big shards if a Bresenham line of slope
/// `|big| / M` steps at `j`, so any run of `n` ranks puts ⌊n·|big|/M⌋ or ⌈…⌉ of them there; within
/// each set of equal shards, ranks are dealt round-robin, so the run's `m` ranks in a set of `k`
/// shards give each ⌊m/k⌋ or ⌈m/k⌉. Nested floors and ceilings keep every count within
/// [⌊ideal⌋, ⌈ideal⌉]. (Round-robin over all shards alone misses by up to ~1.65 when shard sizes
/// differ.)
#[derive(Debug, Clone, Copy)]
pub struct Deal {
    total: u64,
    shards: u64,
    big: u64,
    size: u64,
}

impl Deal {
    /// # Panics
    /// If `shards` is zero or more than `total`.
    pub fn new(total: u64, shards: u64) -> Deal {
        assert!(shards > 0 && shards <= total);
        Deal {
            total,
            shards,
            big: total % shards,
            size: total / shards,
        }
    }

    /// Positions in the big shards.
    fn big_total(&self) -> u64 {
        self.big * (self.size + 1)
    }

    /// Ranks before `j` that go to the big shards.
    fn big_before(&self, j: u64) -> u64 {
        (u128::from(j) * u128::from(self.big_total()) / u128::from(self.total)) as u64
    }

    /// (shard, slot in the shard) of rank `j`.
    pub fn place(&self, j: u64) -> (u64, u64) {
        let before = self.big_before(j);
        if self.big_before(j + 1) > before {
            (before % self.big, before / self.big)
        } else {
            let small = self.shards - self.big;
            let k = j - before;
            (self.big + k % small, k / small)
        }
    }

    /// The worst |count − ideal| over the shards for a label holding ranks `[a, a + n)`.
    pub fn deviation(&self, a: u64, n: u64) -> f64 {
        let in_big = self.big_before(a + n) - self.big_before(a);
        let mut worst: f64 = 0.0;
        for (m, k, size) in [
            (in_big, self.big, self.size + 1),
            (n - in_big, self.shards - self.big, self.size),
        ] {
            if k == 0 {
                continue;
            }
            let ideal = n as f64 * size as f64 / self.total as f64;
            worst = worst.max((ideal - (m / k) as f64).abs());
            if m % k > 0 {
                worst = worst.max((ideal - (m / k + 1) as f64).abs());
            }
        }
        worst
    }
}

/// One group of output shards, sized and balanced on its own: the whole output, or one
/// template of a key map.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GroupPlan {
    /// The key map's template (`None` without a key map).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    pub samples: u64,
    pub sample_bytes: u64,
    pub shards: u64,
    pub sizing: String,
    /// Samples written, after `--equalize`.
    pub output_samples: u64,
    /// The group's first rank in the sorted order, first output position and first shard.
    #[serde(skip)]
    pub rank_start: u64,
    #[serde(skip)]
    pub out_start: u64,
    #[serde(skip)]
    pub shard_start: u64,
    #[serde(skip)]
    pub targets: Targets,
}

/// `--stratify-by`: what the manifest reports.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct StratifyReport {
    pub ext: String,
    pub labels: u64,
    /// The largest |count − ideal| of any label in any shard, where the ideal is the label's
    /// share of the dataset times the shard's size.
    pub worst_deviation: f64,
}

/// The order's answer for this rank.
pub struct Ordered {
    pub placement: Placement,
    pub groups: Vec<GroupPlan>,
    /// Samples no key-map group claimed (left out by `--unmatched skip`).
    pub unmatched: u64,
    pub stratify: Option<StratifyReport>,
}

/// What `place` needs to know about the job.
pub struct OrderJob<'a> {
    pub spec: &'a OrderSpec,
    /// The key map, and the group of each local sample.
    pub key_map: Option<(&'a KeyMap, &'a [u32])>,
    pub seed: u64,
    pub epoch: u64,
    pub equalize: Equalize,
    pub sizing: Sizing,
    /// Samples and sample bytes over all ranks.
    pub samples: u64,
    pub sample_bytes: u64,
}

/// What `place` needs to know about this rank's samples (in input order).
pub struct LocalSamples<'a> {
    pub first_global: u64,
    pub samples: &'a [LocalSample],
    /// Keys, when [`OrderSpec::needs_keys`].
    pub keys: &'a [Vec<u8>],
    /// Member contents, when [`OrderSpec::member`].
    pub contents: &'a [Option<Vec<u8>>],
    /// `FILE: sample "KEY"` for messages.
    pub describe: &'a dyn Fn(usize) -> String,
}

/// The output position of every local sample, and the groups of output shards.
///
/// # Errors
/// A sample without the member the order reads or with content that does not parse (unless
/// `--missing last`), a key-map failure, or sizing that does not fit a group; on every rank
/// (the cause on the rank that found it, or on rank 0 when every rank finds it).
pub fn place(comm: &impl Comm, job: &OrderJob<'_>, local: &LocalSamples<'_>) -> Result<Ordered> {
    let lead = comm.rank() == 0;
    let spec = job.spec;
    let count = local.samples.len();
    let global = |i: usize| local.first_global + i as u64;

    let group_of = job.key_map.map(|(_, groups)| groups);
    let ngroups = job.key_map.map_or(1, |(m, _)| m.groups.len());
    let mut sums = vec![0u64; 2 * ngroups + 1];
    for (i, sample) in local.samples.iter().enumerate() {
        match group_of.as_ref().map(|g| g[i]) {
            Some(KEY_MAP_SKIPPED) => sums[2 * ngroups] += 1,
            g => {
                let g = g.unwrap_or(0) as usize;
                sums[g] += 1;
                sums[ngroups + g] += sample.len;
            }
        }
    }
    let sums = comm.all_sum(&sums);
    let unmatched = sums[2 * ngroups];
    let mut groups = Vec::with_capacity(ngroups);
    let (mut rank_start, mut out_start, mut shard_start) = (0, 0, 0);
    for g in 0..ngroups {
        let (n, bytes) = (sums[g], sums[ngroups + g]);
        let template = job.key_map.map(|(m, _)| m.groups[g].text.clone());
        let (shards, sizing) = if n == 0 {
            (0, "no samples".to_string())
        } else {
            job.sizing.shards(n, bytes).map_err(|e| {
                let e = match &template {
                    Some(t) => e.context(format!("key-map group {t:?}")),
                    None => e,
                };
                everywhere(lead, e)
            })?
        };
        let targets = Targets::new(n, shards.max(1), job.equalize);
        groups.push(GroupPlan {
            template,
            samples: n,
            sample_bytes: bytes,
            shards,
            sizing,
            output_samples: targets.positions(),
            rank_start,
            out_start,
            shard_start,
            targets,
        });
        rank_start += n;
        out_start += targets.positions();
        shard_start += shards;
    }
    if shard_start == 0 {
        return Err(everywhere(
            lead,
            anyhow!(
                "no sample matched the key map: nothing to write ({unmatched} unmatched, skipped)"
            ),
        ));
    }

    let permutation = Permutation::new(job.seed, job.epoch, job.samples);
    if spec.is_shuffle() {
        return Ok(Ordered {
            placement: Placement::Permuted {
                permutation,
                targets: groups[0].targets,
                first_global: local.first_global,
            },
            groups,
            unmatched,
            stratify: None,
        });
    }

    // Sort items: (local sample, copy) with their keys; dropped samples are placed directly.
    let mut items: Vec<Item> = Vec::new();
    let mut owners: Vec<(u32, u8)> = Vec::new();
    let mut first = vec![SKIPPED; count];
    let built = (|| -> Result<()> {
        for i in 0..count {
            if let Some(ext) = &spec.stratify_by {
                let label = label_key(local.contents[i].as_deref(), ext, spec, || {
                    (local.describe)(i)
                })?;
                let q = permutation.apply(global(i));
                let targets = groups[0].targets;
                if q >= targets.positions() {
                    first[i] = DROPPED | q;
                }
                for (copy, tie) in targets.of(q).enumerate() {
                    items.push(Item {
                        key: label.clone(),
                        tie,
                    });
                    owners.push((i as u32, copy as u8));
                }
                continue;
            }
            let mut key = Vec::new();
            if let Some(g) = &group_of {
                if g[i] == KEY_MAP_SKIPPED {
                    continue;
                }
                key.extend(g[i].to_be_bytes());
            }
            match &spec.by {
                OrderBy::Shuffle => key.extend(permutation.apply(global(i)).to_be_bytes()),
                OrderBy::Key => key.extend(sample_key(&local.keys[i], spec.descending)),
                OrderBy::Content { ext, kind } => {
                    let value = local.contents[i].as_deref();
                    let encoded = match value {
                        None => Err(format!("has no .{ext} member")),
                        Some(v) => value_key(Some(v), *kind, spec.descending)
                            .map_err(|why| format!(".{ext}: {why}")),
                    };
                    match (encoded, spec.missing) {
                        (Ok(k), _) => key.extend(k),
                        (Err(_), Missing::Last) => key.push(1),
                        (Err(why), Missing::Error) => bail!(
                            "{} {why} (--order {}; --missing last places such samples last)",
                            (local.describe)(i),
                            spec.describe()
                        ),
                    }
                }
            }
            items.push(Item {
                key,
                tie: global(i),
            });
            owners.push((i as u32, 0));
        }
        Ok(())
    })();
    agree(comm, built)?;

    // Stratified runs have one group, sized with at least one shard.
    let deal = spec
        .stratify_by
        .is_some()
        .then(|| Deal::new(groups[0].output_samples, groups[0].shards));
    let mut runs = Runs::default();
    let ranks = global_ranks(comm, &items, &mut |start, bucket| {
        if let Some(deal) = &deal {
            runs = Runs::of(start, bucket, deal);
        }
    })?;
    drop(items);

    let mut again = Vec::new();
    if let Some(deal) = &deal {
        // Deal the label-sorted order to shards, and shuffle each shard's slots with a
        // permutation of its own.
        let plan = ShardPlan::by_count(groups[0].output_samples, groups[0].shards, 1);
        let mut by_shard: Vec<(u64, u64, usize)> = ranks
            .iter()
            .enumerate()
            .map(|(k, &j)| {
                let (s, slot) = deal.place(j);
                (s, slot, k)
            })
            .collect();
        by_shard.sort_unstable();
        let mut current: Option<(u64, Permutation)> = None;
        for (s, slot, k) in by_shard {
            let shard = plan.shard_positions(s);
            if current.as_ref().map(|c| c.0) != Some(s) {
                let size = shard.end - shard.start;
                current = Some((s, Permutation::member(job.seed, job.epoch, size, s)));
            }
            let p = shard.start + current.as_ref().unwrap().1.apply(slot);
            let (i, copy) = owners[k];
            if copy == 0 {
                first[i as usize] = p;
            } else {
                again.push((u64::from(i), p));
            }
        }
    } else {
        for (k, &j) in ranks.iter().enumerate() {
            let (i, _) = owners[k];
            let group = &groups[group_of.as_ref().map_or(0, |g| g[i as usize] as usize)];
            let mut at = group.targets.of(j - group.rank_start);
            first[i as usize] = match at.next() {
                Some(p) => group.out_start + p,
                None => DROPPED | j,
            };
            if let Some(p) = at.next() {
                again.push((u64::from(i), group.out_start + p));
            }
        }
    }
    again.sort_unstable();
    let stratify = match (&spec.stratify_by, &deal) {
        (Some(ext), Some(deal)) => Some(runs.report(comm, ext.clone(), deal)?),
        _ => None,
    };
    Ok(Ordered {
        placement: Placement::Listed { first, again },
        groups,
        unmatched,
        stratify,
    })
}

/// A stratification label as a sort key: the member's bytes (trimmed), or the stratum of
/// samples without the member with `--missing last`.
fn label_key(
    content: Option<&[u8]>,
    ext: &str,
    spec: &OrderSpec,
    describe: impl Fn() -> String,
) -> Result<Vec<u8>> {
    match (content, spec.missing) {
        (Some(v), _) => Ok(value_key(Some(v), ValueKind::Str, false).expect("strings encode")),
        (None, Missing::Last) => Ok(value_key(None, ValueKind::Str, false).expect("encodes")),
        (None, Missing::Error) => bail!(
            "{} has no .{ext} member to stratify by (--missing last gives such samples a stratum of their own)",
            describe()
        ),
    }
}

/// Runs of equal labels in one rank's bucket of the stratified order: the worst deviation and
/// the label count of the runs wholly inside it, and the runs at its edges (which may continue
/// on a neighbour) for rank 0 to join.
#[derive(Default)]
struct Runs {
    inner_worst: f64,
    inner_labels: u64,
    edges: Vec<(Vec<u8>, u64, u64)>,
}

impl Runs {
    fn of(start: u64, bucket: &[Item], deal: &Deal) -> Runs {
        let mut runs = Runs::default();
        let mut k = 0;
        while k < bucket.len() {
            let end = k + bucket[k..].partition_point(|it| it.key == bucket[k].key);
            let (a, n) = (start + k as u64, (end - k) as u64);
            if k == 0 || end == bucket.len() {
                runs.edges.push((bucket[k].key.clone(), a, n));
            } else {
                runs.inner_labels += 1;
                runs.inner_worst = runs.inner_worst.max(deal.deviation(a, n));
            }
            k = end;
        }
        runs
    }

    fn report(self, comm: &impl Comm, ext: String, deal: &Deal) -> Result<StratifyReport> {
        let config = bincode::config::standard();
        let bytes = bincode::serde::encode_to_vec(&self.edges, config).expect("encodable");
        let mut worst = self.inner_worst;
        let mut labels = self.inner_labels;
        let parts = gather(comm, 0, &bytes);
        let joined = (|| -> Result<Vec<(Vec<u8>, u64, u64)>> {
            let mut joined: Vec<(Vec<u8>, u64, u64)> = Vec::new();
            for part in parts {
                let (edges, _): (Vec<(Vec<u8>, u64, u64)>, _) =
                    bincode::serde::decode_from_slice(&part, config)
                        .context("internal error: decoding label runs")?;
                for (key, a, n) in edges {
                    match joined.last_mut() {
                        Some(last) if last.0 == key && last.1 + last.2 == a => last.2 += n,
                        _ => joined.push((key, a, n)),
                    }
                }
            }
            Ok(joined)
        })();
        // Only rank 0 decodes: agreed before the next collective.
        let joined = agree(comm, joined)?;
        labels += joined.len() as u64;
        for (_, a, n) in joined {
            worst = worst.max(deal.deviation(a, n));
        }
        // Non-negative floats order like their bits, which stay below 2^63.
        let worst = f64::from_bits(comm.all_max(&[worst.to_bits()])[0]);
        let labels = comm.all_sum(&[labels])[0];
        Ok(StratifyReport {
            ext,
            labels,
            worst_deviation: worst,
        })
    }
}

/// Checks that the flags that shape the order fit together.
///
/// # Errors
/// A message naming the conflicting flags.
pub fn validate(spec: &OrderSpec, bytes_balanced: bool, equalize: Equalize) -> Result<()> {
    if spec.descending && spec.by == OrderBy::Shuffle {
        bail!("--descending needs --order key or --order content:EXT");
    }
    if spec.stratify_by.is_some() {
        if spec.by != OrderBy::Shuffle {
            bail!("--stratify-by shuffles within each label: use it with --order shuffle (the default)");
        }
        if spec.key_map.is_some() {
            bail!("--stratify-by and --key-map cannot be combined");
        }
        if bytes_balanced {
            bail!("--stratify-by deals samples to shards by count: it cannot be combined with --balance bytes");
        }
        if equalize == Equalize::Pad {
            // A repeated sample could land next to its original in one shard, which readers
            // that group members by key would merge.
            bail!("--stratify-by with --equalize pad could put a sample twice in one shard: use --equalize drop (or none) for equal shards");
        }
    }
    if spec.key_map.is_some() && bytes_balanced {
        bail!("--key-map sizes each group by count: it cannot be combined with --balance bytes");
    }
    if spec.missing == Missing::Last && spec.member().is_none() {
        bail!("--missing applies to --order content:EXT and --stratify-by EXT");
    }
    if spec.unmatched != Unmatched::Error && spec.key_map.is_none() {
        bail!("--unmatched applies to --key-map");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(v: &str, kind: ValueKind, desc: bool) -> Vec<u8> {
        value_key(Some(v.as_bytes()), kind, desc).unwrap()
    }

    #[test]
    fn encodings_sort_like_their_values() {
        let ints = ["-9000000000", "-3", "0", "2", "10", "9000000000"];
        let floats = ["-inf", "-1e10", "-0.5", "0", "1e-9", "2.5", "1e300", "inf"];
        let strs = ["", "a", "a\0", "a\0b", "ab", "b"];
        for (vals, kind) in [
            (&ints[..], ValueKind::Int),
            (&floats[..], ValueKind::Float),
            (&strs[..], ValueKind::Str),
        ] {
            for w in vals.windows(2) {
                assert!(key(w[0], kind, false) < key(w[1], kind, false), "{w:?}");
                assert!(key(w[0], kind, true) > key(w[1], kind, true), "{w:?}");
            }
            // Missing sorts last either way.
            let missing = value_key(None, kind, false).unwrap();
            assert!(vals.iter().all(|v| key(v, kind, false) < missing));
            assert!(vals.iter().all(|v| key(v, kind, true) < missing));
        }
        assert_eq!(
            key(" 7\n", ValueKind::Int, false),
            key("7", ValueKind::Int, false)
        );
        assert_eq!(
            key("-0", ValueKind::Float, false),
            key("0", ValueKind::Float, false)
        );
        assert!(value_key(Some(b"x"), ValueKind::Int, false).is_err());
        assert!(value_key(Some(b"nan"), ValueKind::Float, false).is_err());
        let keys = ["a/1", "a/10", "a/2", "b"];
        for w in keys.windows(2) {
            assert!(sample_key(w[0].as_bytes(), false) < sample_key(w[1].as_bytes(), false));
            assert!(sample_key(w[0].as_bytes(), true) > sample_key(w[1].as_bytes(), true));
        }
    }

    #[test]
    fn order_flags_parse() {
        assert_eq!("key".parse::<OrderBy>(), Ok(OrderBy::Key));
        assert_eq!(
            "content:cls:int".parse::<OrderBy>(),
            Ok(OrderBy::Content {
                ext: "cls".into(),
                kind: ValueKind::Int
            })
        );
        assert_eq!(
            "content:seg.json".parse::<OrderBy>(),
            Ok(OrderBy::Content {
                ext: "seg.json".into(),
                kind: ValueKind::Str
            })
        );
        assert!("content:".parse::<OrderBy>().is_err());
        assert!("size".parse::<OrderBy>().is_err());
    }

    /// The deal fills every shard to its planned size, and its counts match a brute-force count
    /// and stay within one of the ideal, for any label runs.
    #[test]
    fn deal_keeps_every_label_within_one_of_its_share() {
        for total in [12u64, 13, 40, 97, 120] {
            for shards in [1u64, 3, 4, 7, 11] {
                let deal = Deal::new(total, shards);
                let plan = ShardPlan::by_count(total, shards, 1);
                let placed: Vec<(u64, u64)> = (0..total).map(|j| deal.place(j)).collect();
                for s in 0..shards {
                    let mut slots: Vec<u64> =
                        placed.iter().filter(|p| p.0 == s).map(|p| p.1).collect();
                    slots.sort_unstable();
                    let size = plan.shard_positions(s).end - plan.shard_positions(s).start;
                    assert_eq!(slots, (0..size).collect::<Vec<_>>(), "{total} {shards} {s}");
                }
                for labels in [
                    vec![total],
                    vec![1, total - 1],
                    vec![total / 2, total / 3, total - total / 2 - total / 3],
                    vec![1; total as usize],
                ] {
                    let mut a = 0;
                    for &n in &labels {
                        let mut worst: f64 = 0.0;
                        for s in 0..shards {
                            let count = (a..a + n).filter(|&j| placed[j as usize].0 == s).count();
                            let size = plan.shard_positions(s).end - plan.shard_positions(s).start;
                            let ideal = n as f64 * size as f64 / total as f64;
                            worst = worst.max((count as f64 - ideal).abs());
                        }
                        let got = deal.deviation(a, n);
                        assert!((got - worst).abs() < 1e-9, "{total} {shards} {a} {n}");
                        assert!(got < 1.0, "{total} {shards} {a} {n}: {got}");
                        a += n;
                    }
                }
            }
        }
    }
}
