//! Phase "duplicates": one key in two samples, of one input shard (its members are not
//! adjacent) or of two, found without any rank holding every key.
//!
//! Key hashes (8 bytes per sample) go to the rank `hash mod P`, which sends the hashes it saw
//! more than once back to the ranks that sent them; those send (hash, shard, start) of just these
//! samples, and the owner confirms equal hashes by reading the keys (a hash collision is not a
//! duplicate), then counts, warns or fails per `--on-duplicate`. Nothing is held per sample
//! beyond the hashes.

use anyhow::Result;

use crate::comm::wire::{route, u32_at, u64_at, Sink, Wire};
use crate::comm::Comm;
use crate::input::InputShard;
use crate::plan::placement::LocalSample;
use crate::tar::{keys_at, OnDuplicate, Warnings};

/// A sample whose key hash another sample shares: where to read its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Candidate {
    hash: u64,
    shard: u32,
    start: u64,
}

impl Wire for Candidate {
    const WIDTH: usize = 20;
    fn encode(&self, out: &mut [u8]) {
        out[..8].copy_from_slice(&self.hash.to_le_bytes());
        out[8..12].copy_from_slice(&self.shard.to_le_bytes());
        out[12..].copy_from_slice(&self.start.to_le_bytes());
    }
    fn decode(b: &[u8]) -> Self {
        Candidate {
            hash: u64_at(b, 0),
            shard: u32_at(b, 8),
            start: u64_at(b, 12),
        }
    }
}

/// Finds, and counts, warns about or refuses per `policy`, every key in two samples. `hashes`
/// holds each local sample's key hash (0: not checked). Returns the duplicates this rank found.
///
/// # Errors
/// A duplicate under `--on-duplicate abort`, or a key that cannot be read back.
pub fn find(
    comm: &impl Comm,
    inputs: &[InputShard],
    local: &[LocalSample],
    hashes: &[u64],
    policy: OnDuplicate,
) -> Result<u64> {
    let ranks = comm.size() as u64;
    let owner = |h: u64| (h % ranks) as usize;
    let mut wanted = repeated_hashes(comm, hashes, &owner);
    wanted.sort_unstable();
    let candidates = route(comm, &|sink: Sink<'_, Candidate>| {
        for (s, &hash) in local.iter().zip(hashes) {
            // Never 0: only hashes that were sent come back.
            if wanted.binary_search(&hash).is_ok() {
                let c = Candidate {
                    hash,
                    shard: s.shard,
                    start: s.start,
                };
                sink(owner(hash), &c);
            }
        }
    });
    let mut mine = candidates.to_vec();
    mine.sort_unstable();
    confirm(inputs, &mine, policy)
}

/// The hashes among `hashes` that some other sample shares: each goes to its owner, which
/// answers every sender with the hashes it saw more than once.
fn repeated_hashes(comm: &impl Comm, hashes: &[u64], owner: &dyn Fn(u64) -> usize) -> Vec<u64> {
    let seen_by_source = route(comm, &|sink: Sink<'_, u64>| {
        for h in hashes.iter().filter(|&&h| h != 0) {
            sink(owner(*h), h);
        }
    });
    let mut seen = seen_by_source.to_vec();
    seen.sort_unstable();
    let repeated: Vec<u64> = seen
        .chunk_by(|a, b| a == b)
        .filter(|run| run.len() > 1)
        .map(|run| run[0])
        .collect();
    drop(seen);
    let back = route(comm, &|sink: Sink<'_, u64>| {
        for (source, sent) in seen_by_source.by_source() {
            let mut sent: Vec<u64> = sent.filter(|h| repeated.binary_search(h).is_ok()).collect();
            sent.sort_unstable();
            sent.dedup();
            for h in &sent {
                sink(source, h);
            }
        }
    });
    drop(seen_by_source);
    back.to_vec()
}

/// Reads the keys of this rank's candidates (sorted by hash) and reports every key that occurs
/// in more than one sample.
fn confirm(inputs: &[InputShard], mine: &[Candidate], policy: OnDuplicate) -> Result<u64> {
    // The candidates' keys, read shard by shard in one pass each (a compressed shard is
    // decompressed once, however many candidates it holds).
    let mut places: Vec<(u32, u64)> = mine.iter().map(|c| (c.shard, c.start)).collect();
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
    let mut warnings = Warnings::default();
    for run in mine.chunk_by(|a, b| a.hash == b.hash) {
        let mut keyed: Vec<(String, u32, u64)> = run
            .iter()
            .map(|c| (key_of((c.shard, c.start)), c.shard, c.start))
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
                policy.apply(&what, &mut warnings)?;
                found += 1;
            }
        }
    }
    Ok(found)
}
