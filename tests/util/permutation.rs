//! The global permutation, written again from its specification (DESIGN.md invariant 2 and the
//! documentation of `src/plan/permute.rs`), so that a run's order is checked against something
//! other than the code that made it or golden digests that code produced.
//!
//! The specification: output position `π(g)` of the sample with global index `g` is a keyed
//! Feistel network over the domain `[0, 4^h)`, `h` the least half width (at least 1) with
//! `4^h ≥ n`, cycle-walked (applied again while the result is `≥ n`). Eight rounds; the round keys
//! are the first eight 64-bit outputs of ChaCha20 seeded with the 32 bytes `seed`, `epoch`, `n`
//! (each little-endian u64) and the salt `reshard1`. A round maps the halves `(hi, lo)` to
//! `(lo, hi XOR (F(lo XOR key) mod 2^h))`, `F` the SplitMix64 finalizer.

use rand_chacha::rand_core::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

/// The permutation of `n` samples for `seed` and `epoch`, as a function.
pub struct Reference {
    n: u64,
    h: u32,
    round_keys: Vec<u64>,
}

impl Reference {
    pub fn new(seed: u64, epoch: u64, n: u64) -> Reference {
        let seed_bytes: Vec<u8> = [seed, epoch, n]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .chain(*b"reshard1")
            .collect();
        let mut chacha = ChaCha20Rng::from_seed(seed_bytes.try_into().unwrap());
        let round_keys = (0..8).map(|_| chacha.next_u64()).collect();
        // The least h ≥ 1 with 2^(2h) ≥ n.
        let mut h = 1;
        while (1u128 << (2 * h)) < u128::from(n) {
            h += 1;
        }
        Reference { n, h, round_keys }
    }

    /// The output position of global index `g`.
    pub fn position(&self, g: u64) -> u64 {
        assert!(g < self.n);
        let mut x = self.feistel(g);
        while x >= self.n {
            x = self.feistel(x);
        }
        x
    }

    fn feistel(&self, x: u64) -> u64 {
        let low_bits = (1u64 << self.h) - 1;
        let (mut hi, mut lo) = (x >> self.h, x & low_bits);
        for key in &self.round_keys {
            let next_lo = hi ^ (splitmix_finalizer(lo ^ key) & low_bits);
            hi = lo;
            lo = next_lo;
        }
        (hi << self.h) | lo
    }
}

/// SplitMix64's output function (Steele, Lea, Flood 2014): shifts 30, 27, 31 and its two odd
/// multipliers.
fn splitmix_finalizer(v: u64) -> u64 {
    let a = (v ^ (v >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
    let b = (a ^ (a >> 27)).wrapping_mul(0x94D049BB133111EB);
    b ^ (b >> 31)
}

/// Requires `order` (sample keys in output order, shard 0 first) to be `input_order` (keys in
/// canonical input order) permuted by the reference: the sample with global index `g` at
/// position `π(g)`.
pub fn assert_order(order: &[String], input_order: &[String], seed: u64, epoch: u64) {
    assert_eq!(order.len(), input_order.len(), "samples in and out");
    let pi = Reference::new(seed, epoch, order.len() as u64);
    for (g, key) in input_order.iter().enumerate() {
        let p = pi.position(g as u64) as usize;
        assert_eq!(
            &order[p], key,
            "seed {seed}, epoch {epoch}: position {p} holds {:?}, the permutation puts input sample {g} ({key:?}) there",
            order[p]
        );
    }
}
