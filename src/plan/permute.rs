//! The global permutation π(seed, epoch, N): a keyed bijection on `[0, N)` that any rank
//! evaluates for any index in O(1) time and memory.
//!
//! Construction: a balanced Feistel network over the smallest even-bit power of two ≥ N, with
//! cycle walking to stay inside `[0, N)`. Round keys come from a ChaCha20 stream seeded by
//! (seed, epoch, N), so the order depends only on those and on this code, never on the version of
//! `rand` or on how many ranks evaluate it.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

const ROUNDS: usize = 8;

/// A seeded bijection on `[0, n)`.
#[derive(Debug, Clone)]
pub struct Permutation {
    n: u64,
    half_bits: u32,
    mask: u64,
    keys: [u64; ROUNDS],
}

impl Permutation {
    /// The permutation of `n` items for this seed and epoch.
    pub fn new(seed: u64, epoch: u64, n: u64) -> Self {
        Self::with_salt(seed, epoch, n, *b"reshard1")
    }

    /// One of a family of independent permutations of `n` items for this seed and epoch, told
    /// apart by `member` (the order inside each output shard of a stratified run, say).
    pub(crate) fn member(seed: u64, epoch: u64, n: u64, member: u64) -> Self {
        // The main permutation's salt is ASCII text, never a small number.
        Self::with_salt(seed, epoch, n, member.to_le_bytes())
    }

    /// The permutation that deals samples to `--split` splits: it depends on the seed and `n`
    /// only, never on the epoch, so a sample stays in its split from one epoch to the next.
    pub(crate) fn split_assignment(seed: u64, n: u64) -> Self {
        Self::with_salt(seed, 0, n, *b"splitset")
    }

    /// The order of the `n` samples inside split `split` for this seed and epoch.
    pub(crate) fn in_split(seed: u64, epoch: u64, n: u64, split: u16) -> Self {
        let [a, b] = split.to_le_bytes();
        Self::with_salt(seed, epoch, n, [b's', b'p', b'l', b'i', b't', b'#', a, b])
    }

    fn with_salt(seed: u64, epoch: u64, n: u64, salt: [u8; 8]) -> Self {
        let mut material = [0u8; 32];
        material[..8].copy_from_slice(&seed.to_le_bytes());
        material[8..16].copy_from_slice(&epoch.to_le_bytes());
        material[16..24].copy_from_slice(&n.to_le_bytes());
        material[24..].copy_from_slice(&salt);
        let mut rng = ChaCha20Rng::from_seed(material);
        let mut keys = [0u64; ROUNDS];
        for k in &mut keys {
            *k = rng.next_u64();
        }
        // Domain 2^(2h) ≥ n with h ≥ 1; at most 4n (up to rounding), so cycle walking takes
        // fewer than four steps on average.
        let bits = 64 - n.saturating_sub(1).leading_zeros();
        let half_bits = bits.div_ceil(2).max(1);
        Permutation {
            n,
            half_bits,
            mask: (1u64 << half_bits) - 1,
            keys,
        }
    }

    #[cfg(test)]
    /// Number of items.
    pub(crate) fn len(&self) -> u64 {
        self.n
    }

    #[cfg(test)]
    /// True when the permutation is over no items.
    pub(crate) fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The output position of item `index`.
    ///
    /// # Panics
    /// If `index >= n`.
    pub fn apply(&self, index: u64) -> u64 {
        assert!(
            index < self.n,
            "index {index} outside the permutation of {}",
            self.n
        );
        let mut x = self.encrypt(index);
        while x >= self.n {
            x = self.encrypt(x);
        }
        x
    }

    fn encrypt(&self, x: u64) -> u64 {
        let mut left = x >> self.half_bits;
        let mut right = x & self.mask;
        for &k in &self.keys {
            let f = mix(right ^ k) & self.mask;
            (left, right) = (right, left ^ f);
        }
        (left << self.half_bits) | right
    }
}

/// A 64-bit finalizer (SplitMix64's): every input bit affects every output bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_a_bijection_for_many_sizes() {
        for n in (1..300).chain([1023, 1024, 1025, 4097, 65_537]) {
            let p = Permutation::new(7, 0, n);
            let mut seen = vec![false; n as usize];
            for i in 0..n {
                let j = p.apply(i) as usize;
                assert!(!seen[j], "n={n}: {j} hit twice");
                seen[j] = true;
            }
        }
    }

    #[test]
    fn is_a_pure_function_of_seed_epoch_and_n() {
        let a = Permutation::new(42, 3, 10_000);
        let b = Permutation::new(42, 3, 10_000);
        // Evaluated in another order (as another rank would), the answer is the same.
        for i in (0..10_000).rev() {
            assert_eq!(a.apply(i), b.apply(i));
        }
        let other_seed = Permutation::new(43, 3, 10_000);
        let other_epoch = Permutation::new(42, 4, 10_000);
        let same_seed = (0..10_000)
            .filter(|&i| a.apply(i) == other_seed.apply(i))
            .count();
        let same_epoch = (0..10_000)
            .filter(|&i| a.apply(i) == other_epoch.apply(i))
            .count();
        assert!(
            same_seed < 20 && same_epoch < 20,
            "{same_seed} {same_epoch}"
        );
    }

    #[test]
    fn pinned_values_guard_against_silent_changes() {
        // A change here changes every user's output order: bump the key material's version tag.
        let p = Permutation::new(1, 0, 1000);
        let first: Vec<u64> = (0..5).map(|i| p.apply(i)).collect();
        let again: Vec<u64> = (0..5)
            .map(|i| Permutation::new(1, 0, 1000).apply(i))
            .collect();
        assert_eq!(first, again);
        assert_eq!(first, PINNED);
    }

    const PINNED: [u64; 5] = [25, 165, 153, 711, 180];

    #[test]
    fn knows_its_size() {
        let p = Permutation::new(1, 0, 5);
        assert_eq!((p.len(), p.is_empty()), (5, false));
        let none = Permutation::new(1, 0, 0);
        assert_eq!((none.len(), none.is_empty()), (0, true));
    }

    #[test]
    fn looks_shuffled() {
        // Spearman-like check: mean displacement of a random permutation is about n/3.
        let n = 100_000u64;
        let p = Permutation::new(9, 0, n);
        let total: f64 = (0..n).map(|i| (p.apply(i) as f64 - i as f64).abs()).sum();
        let mean = total / n as f64;
        assert!(
            (mean / n as f64 - 1.0 / 3.0).abs() < 0.01,
            "mean displacement {mean}"
        );
        // Neighbours do not stay neighbours.
        let close = (0..n - 1)
            .filter(|&i| p.apply(i).abs_diff(p.apply(i + 1)) < 10)
            .count();
        assert!(close < 50, "{close} neighbours stayed close");
    }
}
