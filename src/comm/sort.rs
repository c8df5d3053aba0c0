//! A distributed sample sort (splitter-based, as LLNL's DTCMP `Sortz`): every rank holds
//! (key, tie) items for its own samples; the result is each item's global rank in (key, tie)
//! order. Keys compare as bytes; ties are unique per item (a global sample index), so the order
//! is total and does not depend on how many ranks sort.
//!
//! Memory per rank is O(N/P): items go to the rank whose key range (between two splitters) holds
//! them, are sorted there, and only (index, rank) pairs travel back. Splitters come from a
//! weighted regular sample of every rank's sorted items, so every bucket holds about N/P items
//! whatever each rank started with.

use std::cmp::Ordering;

use anyhow::{bail, Context, Result};

use super::wire::{gather_concat, route, Sink};
use super::{agree, broadcast_result, exclusive_sum, Comm};

/// One item to sort: compared by `key` bytes, then by `tie`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Item {
    pub(crate) key: Vec<u8>,
    pub(crate) tie: u64,
}

fn cmp(a: (&[u8], u64), b: (&[u8], u64)) -> Ordering {
    a.0.cmp(b.0).then(a.1.cmp(&b.1))
}

/// Samples towards the splitters, per rank of the job, over all ranks (each rank contributes in
/// proportion to its items): enough that buckets stay within a few percent of N/P, and O(P) in
/// all, so that rank 0 holds them at once whatever P.
const OVERSAMPLE: u64 = 8;

/// The global rank of every item of `items` in (key, tie) order over all ranks.
///
/// `sorted` is called once on every rank with that rank's bucket, in order, and the global rank
/// of its first item: callers that need to look at neighbours in the global order (runs of equal
/// labels, say) do it there, without another pass.
///
/// # Errors
/// Two items with the same (key, tie) anywhere (the caller's ties are not unique), or a decoding
/// failure; both are internal errors.
pub(crate) fn global_ranks(
    comm: &impl Comm,
    items: &[Item],
    sorted: &mut dyn FnMut(u64, &[Item]),
) -> Result<Vec<u64>> {
    let ranks = comm.size();
    let mut order: Vec<u32> = (0..items.len() as u32).collect();
    order.sort_unstable_by(|&a, &b| {
        let (a, b) = (&items[a as usize], &items[b as usize]);
        cmp((&a.key, a.tie), (&b.key, b.tie))
    });
    let splitters = splitters(comm, items, &order)?;

    // Each item goes to the rank of the first splitter above it, with its index here.
    let dest = |i: u32| {
        let it = &items[i as usize];
        splitters.partition_point(|s| cmp((&s.key, s.tie), (&it.key, it.tie)) != Ordering::Greater)
    };
    let mut counts = vec![0usize; ranks];
    for &i in &order {
        counts[dest(i)] += record_len(&items[i as usize]);
    }
    let mut ranges = Vec::with_capacity(ranks);
    let mut at = 0;
    for c in counts {
        ranges.push(at..at + c);
        at += c;
    }
    let mut send = Vec::with_capacity(at);
    for &i in &order {
        let it = &items[i as usize];
        send.extend_from_slice(&(it.key.len() as u32).to_le_bytes());
        send.extend_from_slice(&it.key);
        send.extend_from_slice(&it.tie.to_le_bytes());
        send.extend_from_slice(&u64::from(i).to_le_bytes());
    }
    drop(order);
    let mut recv = Vec::new();
    let from = comm.all_to_all(&send, &ranges, &mut recv);
    drop(send);

    // (item, source rank, index there), sorted; each source's part is already in order.
    let bucket = (|| -> Result<Vec<(Item, u32, u64)>> {
        let mut bucket = Vec::new();
        for (src, range) in from.into_iter().enumerate() {
            let mut rest = &recv[range];
            while !rest.is_empty() {
                let (item, index, tail) = decode(rest).context("internal error: sort record")?;
                bucket.push((item, src as u32, index));
                rest = tail;
            }
        }
        bucket.sort_unstable_by(|a, b| cmp((&a.0.key, a.0.tie), (&b.0.key, b.0.tie)));
        if let Some(w) = bucket.windows(2).find(|w| w[0].0 == w[1].0) {
            bail!("internal error: two sort items with tie {}", w[0].0.tie);
        }
        Ok(bucket)
    })();
    drop(recv);
    // Agreed: a rank that failed here must not leave the others waiting in the next collective.
    let bucket = agree(comm, bucket)?;
    let (first, _) = exclusive_sum(comm, bucket.len() as u64);
    let (items_sorted, back): (Vec<Item>, Vec<(u32, u64)>) =
        bucket.into_iter().map(|(it, s, i)| (it, (s, i))).unzip();
    sorted(first, &items_sorted);
    drop(items_sorted);

    // (index at the source, global rank) back to each item's rank.
    let recv = route(comm, &|sink: Sink<'_, (u64, u64)>| {
        for (k, &(src, index)) in back.iter().enumerate() {
            sink(src as usize, &(index, first + k as u64));
        }
    });
    let result = (|| -> Result<Vec<u64>> {
        let mut result = vec![u64::MAX; items.len()];
        for (index, rank) in recv.iter() {
            let index = index as usize;
            *result
                .get_mut(index)
                .context("internal error: sort result for an unknown item")? = rank;
        }
        if result.contains(&u64::MAX) {
            bail!("internal error: an item came back from the sort without a rank");
        }
        Ok(result)
    })();
    agree(comm, result)
}

fn record_len(item: &Item) -> usize {
    4 + item.key.len() + 16
}

/// (item, index, rest) from a record `u32 key length, key, u64 tie, u64 index`.
fn decode(buf: &[u8]) -> Option<(Item, u64, &[u8])> {
    let len = u32::from_le_bytes(buf.get(..4)?.try_into().ok()?) as usize;
    let key = buf.get(4..4 + len)?.to_vec();
    let tail = buf.get(4 + len..)?;
    let tie = u64::from_le_bytes(tail.get(..8)?.try_into().ok()?);
    let index = u64::from_le_bytes(tail.get(8..16)?.try_into().ok()?);
    Some((Item { key, tie }, index, &tail[16..]))
}

/// P − 1 splitters, the same on every rank: rank 0 takes a regular sample of every rank's sorted
/// items, each sample weighted by how many items it stands for, and cuts the weighted sample
/// into P equal parts.
fn splitters(comm: &impl Comm, items: &[Item], order: &[u32]) -> Result<Vec<Item>> {
    let ranks = comm.size();
    if ranks == 1 {
        return Ok(Vec::new());
    }
    let n = order.len();
    let (_, total) = exclusive_sum(comm, n as u64);
    // ⌈8P·n/N⌉: about 8P samples in all, at least one from every rank that has items.
    let want =
        (u128::from(OVERSAMPLE * ranks as u64) * n as u128).div_ceil(u128::from(total.max(1)));
    let k = n.min(want as usize);
    // Sample j stands for the items from its index up to the next sample's.
    let mut picks: Vec<(Item, u64)> = Vec::with_capacity(k);
    for j in 0..k {
        let (lo, hi) = (j * n / k, (j + 1) * n / k);
        picks.push((items[order[lo] as usize].clone(), (hi - lo) as u64));
    }
    let sent: Vec<(&Vec<u8>, u64, u64)> =
        picks.iter().map(|(it, w)| (&it.key, it.tie, *w)).collect();
    let gathered = gather_concat::<(Vec<u8>, u64, u64)>(comm, 0, &sent);
    let chosen = (comm.rank() == 0).then(|| -> Result<Vec<(Vec<u8>, u64)>> {
        let mut all = gathered?;
        all.sort_unstable_by(|a, b| cmp((&a.0, a.1), (&b.0, b.1)));
        let total: u64 = all.iter().map(|s| s.2).sum();
        let mut out = Vec::with_capacity(ranks - 1);
        let mut below = 0u64;
        let mut next = 1;
        for (key, tie, w) in all {
            // Splitter r is the first sample at or past r/P of the weight.
            while next < ranks && below * ranks as u64 >= next as u64 * total {
                out.push((key.clone(), tie));
                next += 1;
            }
            below += w;
        }
        Ok(out)
    });
    let chosen: Vec<(Vec<u8>, u64)> = broadcast_result(comm, 0, chosen)?;
    // Fewer splitters than P − 1 (few items): the last buckets stay empty.
    Ok(chosen
        .into_iter()
        .map(|(key, tie)| Item { key, tie })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::super::local::LocalComm;
    use super::*;

    /// Items of rank r out of `n` in all, spread unevenly (rank r holds a share ∝ r + 1), with
    /// keys from a small alphabet so that ties on the key are common.
    fn items_of(rank: usize, ranks: usize, n: u64) -> Vec<Item> {
        let weight: u64 = (1..=ranks as u64).sum();
        let before: u64 = (1..=rank as u64).sum::<u64>() * n / weight;
        let end = (1..=rank as u64 + 1).sum::<u64>() * n / weight;
        (before..end)
            .map(|g| Item {
                key: format!("k{}", (g * 7919) % 13).into_bytes(),
                tie: g,
            })
            .collect()
    }

    fn expected(n: u64) -> Vec<u64> {
        let mut all = items_of(0, 1, n);
        all.sort();
        let mut rank_of = vec![0; n as usize];
        for (j, it) in all.iter().enumerate() {
            rank_of[it.tie as usize] = j as u64;
        }
        rank_of
    }

    #[test]
    fn ranks_are_the_same_for_any_rank_count() {
        for n in [0u64, 1, 5, 100, 2000] {
            let want = expected(n);
            for p in 1..=5 {
                let got: Vec<(u64, u64)> = LocalComm::run(p, |c| {
                    let items = items_of(c.rank(), p, n);
                    let ranks = global_ranks(c, &items, &mut |_, _| {}).unwrap();
                    items.iter().map(|it| it.tie).zip(ranks).collect::<Vec<_>>()
                })
                .concat();
                assert_eq!(got.len() as u64, n);
                for (g, j) in got {
                    assert_eq!(j, want[g as usize], "n={n} p={p} item {g}");
                }
            }
        }
    }

    #[test]
    fn buckets_are_balanced_and_in_order() {
        let n = 20_000;
        let p = 4;
        let seen = LocalComm::run(p, |c| {
            let items = items_of(c.rank(), p, n);
            let mut got = (0, 0, true);
            global_ranks(c, &items, &mut |first, bucket| {
                got = (first, bucket.len(), bucket.windows(2).all(|w| w[0] < w[1]));
            })
            .unwrap();
            got
        });
        let mut next = 0;
        for (first, len, ordered) in seen {
            assert_eq!(first, next);
            assert!(ordered);
            // Within 25% of N/P although rank 3 started with four times rank 0's items.
            assert!(len as u64 * p as u64 <= n * 5 / 4, "bucket of {len}");
            next += len as u64;
        }
        assert_eq!(next, n);
    }

    #[test]
    fn duplicate_ties_are_refused() {
        let out = LocalComm::run(2, |c| {
            let items = vec![Item {
                key: b"a".to_vec(),
                tie: 7,
            }];
            global_ranks(c, &items, &mut |_, _| {})
                .map_err(|e| e.to_string())
                .err()
        });
        // Every rank fails (one with the cause); none is left waiting.
        assert!(out.iter().all(Option::is_some));
        assert!(out
            .iter()
            .any(|e| e.as_deref().is_some_and(|e| e.contains("two sort items"))));
    }
}
