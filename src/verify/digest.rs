//! [`Digest128`]: the 128-bit digest that identifies a sample by its raw bytes. A leaf.

/// A 128-bit digest of a byte stream: four 64-bit lanes take 32-byte stripes (multiply-rotate
/// rounds, each a bijection of the lane state), then two independent avalanche chains fold the
/// 256-bit state and the length into two 64-bit halves. Not cryptographic: it detects corruption
/// and tells samples apart, which is all `verify` needs, at memory speed.
#[derive(Debug, Clone)]
pub(crate) struct Digest128 {
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
    pub(crate) fn new() -> Self {
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
    pub(crate) fn update(&mut self, mut data: &[u8]) {
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
    pub(crate) fn finish(mut self) -> u128 {
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
    #[cfg(test)]
    pub(crate) fn of(data: &[u8]) -> u128 {
        let mut d = Digest128::new();
        d.update(data);
        d.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
