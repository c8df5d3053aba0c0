//! [`Record`]: one sample on its way to the rank that owns its digest — made by digesting a
//! shard's samples, encoded at a fixed width, routed by digest.

use anyhow::{bail, Context, Result};

use super::members::{open_scanned, scan_problems};

use super::digest::Digest128;
use crate::comm::wire::{route_owned, Sink, Wire};
use crate::comm::Comm;
use crate::input::InputShard;
use crate::tar::TarStream;
use crate::tar::{index_file_with, Rules, Sample};

/// Which side of the comparison a sample record comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Side {
    Input = 0,
    Output = 1,
}

/// One sample on its way to the rank that owns its digest.
///
/// Ordered by digest first, then side (inputs before outputs), so that sorting groups every
/// copy of a digest with the input copies leading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Record {
    pub(super) digest: u128,
    pub(super) side: Side,
    /// Global position: canonical input index, or output index in shard-list order.
    pub(super) index: u64,
    /// Input or output shard number.
    pub(super) shard: u32,
    /// Byte offset of the sample in its shard.
    pub(super) offset: u64,
}

impl Wire for Record {
    const WIDTH: usize = 40;

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
}

impl Record {
    /// The rank that compares every copy of this record's digest.
    fn owner(&self, ranks: usize) -> usize {
        (self.digest as u64 % ranks as u64) as usize
    }
}

/// Sends every record to the rank that owns its digest; returns the records this rank owns.
pub(super) fn route_records(comm: &impl Comm, sides: [Vec<Record>; 2]) -> Vec<Record> {
    let ranks = comm.size();
    // Both sides' records are let go once encoded: they, the send and the receive buffer would
    // be 96 + 80 + 80 bytes per sample at once.
    route_owned(comm, sides, &|sides, sink: Sink<'_, Record>| {
        for r in sides.iter().flatten() {
            sink(r.owner(ranks), r);
        }
    })
    .to_vec()
}

/// Indexes and digests this rank's input shards, in order; returns their records (positions
/// still to be assigned) and the sample bytes read.
///
/// # Errors
/// An input shard cannot be indexed or read (the message names the file and byte offset).
pub(super) fn digest_inputs(
    inputs: &[InputShard],
    mine: std::ops::Range<usize>,
    ignore_zeros: bool,
) -> Result<(Vec<Record>, u64)> {
    // The samples `run` reads: data after a zero block is an error, or read with --ignore-zeros.
    let rules = Rules {
        ignore_zeros,
        ..Rules::default()
    };
    let mut records = Vec::new();
    let mut bytes = 0;
    for i in mine {
        let path = &inputs[i].path;
        let idx = index_file_with(path, &rules)?;
        let shard = u32::try_from(i).context("more than 2^32 input shards")?;
        let (mut stream, scan) = open_scanned(path, ignore_zeros)?;
        bytes += digest_samples(&mut stream, &idx.samples, |s, digest| {
            records.push(Record {
                digest,
                side: Side::Input,
                index: 0,
                shard,
                offset: s.start,
            });
        })?;
        // The members verify's own walk finds must be the samples' (a member the reader passed
        // over would be missing from input and output alike, and the digests would agree).
        let problems = scan_problems(stream, &scan, &idx.samples)?;
        if !problems.is_empty() {
            bail!("{} (a reshard bug: please report it)", problems.join("; "));
        }
    }
    Ok((records, bytes))
}

/// Reads every sample (in stream order) and calls `each` with its digest; returns the sample
/// bytes read.
///
/// # Errors
/// The stream cannot be read, or ends before a sample does.
pub(super) fn digest_samples(
    stream: &mut TarStream,
    samples: &[Sample],
    mut each: impl FnMut(&Sample, u128),
) -> Result<u64> {
    let mut bytes = 0;
    for s in samples {
        stream.skip_to(s.start)?;
        let mut digest = Digest128::new();
        stream.read_sample(s.len, |piece| digest.update(piece))?;
        each(s, digest.finish());
        bytes += s.len;
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let r = Record {
            digest: u128::MAX - 5,
            side: Side::Output,
            index: 1 << 40,
            shard: 7,
            offset: 12345,
        };
        let mut b = [0u8; Record::WIDTH];
        r.encode(&mut b);
        assert_eq!(Record::decode(&b), r);
    }
}
