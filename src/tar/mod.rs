//! WebDataset tar shards: reading their headers, grouping members into samples, and reading
//! their streams. Pure code over files and readers: no MPI, no knowledge of the job.
//!
//! - [`codec`]: how a shard is stored, and [`codec::open`], the one way to open its tar stream.
//! - [`key`]: sample keys and extensions from member paths.
//! - [`entry_type`]: the one table of tar entry types: what each type flag is, and whether data
//!   follows its header.
//! - [`fields`]: a header block's fields: checksum, numbers, path.
//! - [`pax`]: extension records (PAX, GNU long names) and what they say of the next member.
//! - [`headers`]: the header walk, with the extent the archive stores for every member.
//! - [`reader`]: [`HeaderReader`], the reader under a plain shard's walk.
//! - [`group`]: members into samples, the hygiene rules, and the one duplicate policy.
//! - [`check`]: a sample's range checked against the tar structure before it is copied.
//! - [`index`]: a shard's [`ShardIndex`], and keys read back at sample offsets.
//! - [`stream`]: [`TarStream`], a shard's stream read front to back.

pub(crate) mod check;
pub(crate) mod codec;
pub(crate) mod entry_type;
pub(crate) mod fields;
pub(crate) mod group;
pub(crate) mod headers;
pub(crate) mod index;
pub(crate) mod key;
pub(crate) mod pax;
pub(crate) mod reader;
pub(crate) mod stream;

pub(crate) use codec::Codec;
pub(crate) use group::{Hygiene, OnIncomplete, Rules, Warnings};
pub use group::{OnDuplicate, Sample, ShardIndex, Skipped};
pub use index::{index_file, index_reader};
pub(crate) use index::{index_file_reaching, index_file_with, key_at, keys_at};
pub(crate) use key::key_hash;
pub use reader::HeaderReader;
pub(crate) use stream::TarStream;

/// Helpers shared by the unit tests of the tar modules.
#[cfg(test)]
pub(crate) mod testing {
    /// Every member the run's header walk finds in `bytes`, or its first error.
    pub(crate) fn walk_all(bytes: &[u8]) -> anyhow::Result<Vec<super::headers::Member>> {
        use super::headers::{Seekable, Walk};
        let mut w = Walk::new(
            Seekable(std::io::Cursor::new(bytes)),
            Some(bytes.len() as u64),
        );
        let mut out = Vec::new();
        while let Some(m) = w.next_member()? {
            out.push(m);
        }
        Ok(out)
    }

    /// A GNU tar of regular files `(name, data)`, with the end-of-archive blocks.
    pub(crate) fn tar_of(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in members {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            b.append_data(&mut h, name, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    /// A header block with `name`, `typeflag` and `size`, checksummed.
    pub(crate) fn header(name: &str, typeflag: u8, size: u64, magic: &[u8; 8]) -> [u8; 512] {
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[100..107].copy_from_slice(b"0000644");
        h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
        h[156] = typeflag;
        h[257..265].copy_from_slice(magic);
        set_checksum(&mut h, false);
        h
    }

    pub(crate) fn set_checksum(h: &mut [u8; 512], signed: bool) {
        h[148..156].fill(b' ');
        let sum: i64 = h
            .iter()
            .map(|&b| {
                if signed {
                    i64::from(b as i8)
                } else {
                    i64::from(b)
                }
            })
            .sum();
        h[148..155].copy_from_slice(format!("{:06o}\0", sum as u64 & 0o777777).as_bytes());
    }

    /// `data` padded with zeros to whole blocks.
    pub(crate) fn padded(data: &[u8]) -> Vec<u8> {
        let mut v = data.to_vec();
        v.resize(data.len().div_ceil(512) * 512, 0);
        v
    }

    /// One PAX record, `LEN key=value\n`, its length counting itself.
    pub(crate) fn pax_record(key: &str, value: &str) -> String {
        let body = format!(" {key}={value}\n");
        let mut len = body.len() + 1;
        while len.to_string().len() + body.len() != len {
            len += 1;
        }
        format!("{len}{body}")
    }
}
