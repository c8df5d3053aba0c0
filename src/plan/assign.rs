//! Which rank reads which input shards.

use std::ops::Range;

/// Assigns input shards to ranks in contiguous runs balanced by bytes: shard `i` goes to the rank
/// whose equal share of the total bytes contains the shard's midpoint. Keeps every rank's reads
/// sequential and needs no communication (every rank computes the same answer).
pub(crate) fn assign_inputs(sizes: &[u64], ranks: usize) -> Vec<Range<usize>> {
    let total: u128 = sizes.iter().map(|&s| u128::from(s)).sum();
    let mut owner_start = vec![sizes.len(); ranks + 1];
    let mut before: u128 = 0;
    let mut next_rank = 0;
    for (i, &s) in sizes.iter().enumerate() {
        let mid = 2 * before + u128::from(s); // twice the midpoint, to stay in integers
        let owner = if total == 0 {
            (i * ranks / sizes.len().max(1)).min(ranks - 1)
        } else {
            ((mid * ranks as u128) / (2 * total)).min(ranks as u128 - 1) as usize
        };
        while next_rank <= owner {
            owner_start[next_rank] = i;
            next_rank += 1;
        }
        before += u128::from(s);
    }
    (0..ranks)
        .map(|r| owner_start[r]..owner_start[r + 1])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_balanced_by_bytes_and_contiguous() {
        let sizes = [100, 1, 1, 1, 50, 50, 97];
        let a = assign_inputs(&sizes, 3);
        // Shard 5 spans bytes 153..203 of 300: its midpoint 178 lies in rank 1's share.
        assert_eq!(a, vec![0..1, 1..6, 6..7]);
        for p in 1..10 {
            let a = assign_inputs(&sizes, p);
            assert_eq!(a.len(), p);
            assert_eq!(a[0].start, 0);
            assert_eq!(a[p - 1].end, sizes.len());
            for w in a.windows(2) {
                assert_eq!(w[0].end, w[1].start);
            }
        }
        assert_eq!(assign_inputs(&[0, 0], 2), vec![0..1, 1..2]);
        assert_eq!(assign_inputs(&[5], 3), vec![0..0, 0..1, 1..1]);
    }
}
