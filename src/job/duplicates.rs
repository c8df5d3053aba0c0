//! Phase "duplicates": one key in two samples, found across all shards without any rank holding
//! every key.

use anyhow::Result;

use crate::comm::{self, Comm};
use crate::input::InputShard;
use crate::plan::placement::LocalSample;
use crate::tar::{keys_at, OnDuplicate, Warnings};

/// One key in two samples, of one input shard (its members are not adjacent) or of two. Key
/// hashes (8 bytes per sample) go to the rank `hash mod P`, which sends the hashes it saw more
/// than once back to the ranks that sent them; those send (hash, shard, start) of just these
/// samples, and the owner confirms equal hashes by reading the keys (a hash collision is not a
/// duplicate), then counts, warns or fails per `--on-duplicate`. Nothing is held per sample
/// beyond the hashes. Returns the duplicates this rank found.
pub fn find(
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
    let mut warnings = Warnings::default();
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
                policy.apply(&what, &mut warnings)?;
                found += 1;
            }
        }
    }
    Ok(found)
}
