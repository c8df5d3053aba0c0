//! Header-only indexing of a WebDataset tar shard: which byte ranges are samples.
//!
//! A sample is a run of consecutive members sharing a key (the member path up to the first `.`
//! of its last component). Because the members of a sample are consecutive records, a sample is
//! one contiguous byte range: from the end of the previous record (so that any PAX or GNU
//! long-name extension records in front of its first header are included) to the end of its last
//! member's padded data. That range moves verbatim.

use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::storage::Sequential;
use crate::tar::codec::{self, Opened};
use crate::tar::group::{Grouper, Rules, ShardIndex};
use crate::tar::headers::{Forward, Member, Seekable, Source, Walk};
use crate::tar::key::{extension, sample_key};
use crate::tar::reader::HeaderReader;

/// Indexes the shard file at `path`, reading only its headers.
///
/// # Errors
/// The file cannot be read, is not a tar, is truncated, has a header with a bad checksum, or
/// has a member without a key between two members of one sample. Every message names the file
/// and the byte offset of the offending record.
pub fn index_file(path: &Path) -> Result<ShardIndex> {
    index_file_with(path, &Rules::default())
}

/// [`index_file`] with sample hygiene rules.
///
/// # Errors
/// As [`index_file`], plus the violations the rules say to abort on.
pub(crate) fn index_file_with(path: &Path, rules: &Rules) -> Result<ShardIndex> {
    index_file_reaching(path, rules, &mut |_| {})
}

/// [`index_file_with`], telling `reached` how far into the file the walk is (the end of each
/// member, in bytes of the file) as it goes, so that a caller can show progress within a shard.
/// A compressed shard's walk is in decompressed bytes, which the file's size does not bound: it
/// tells nothing, and its caller counts it whole once done.
///
/// # Errors
/// As [`index_file_with`].
pub(crate) fn index_file_reaching(
    path: &Path,
    rules: &Rules,
    reached: &mut dyn FnMut(u64),
) -> Result<ShardIndex> {
    let shard = match codec::open(path)? {
        Opened::Plain(shard) => shard,
        Opened::Decompressed(codec, stream) => {
            // No seeking in a compressed stream: the whole shard is decompressed once, and
            // offsets are those of the decompressed stream.
            // Read to its end, so that the decoder checks the stream's checksum.
            return index_walk(Walk::new(Forward(stream), None), rules, &mut |_| {})
                .with_context(|| codec::stream_name(path, codec));
        }
    };
    let len = shard
        .stamp()
        .with_context(|| format!("{}: cannot stat", path.display()))?
        .size;
    // Headers are small reads spread over the file: readahead would pull in the data between
    // them (most of the shard for ~100 KiB samples), so ask for none.
    shard.advise_random();
    let walk = Walk::new(
        Seekable(HeaderReader::new(Sequential::new(shard))),
        Some(len),
    );
    index_walk(walk, rules, reached).with_context(|| path.display().to_string())
}

/// The key of the sample whose records start at `start` of the shard at `path` (its first
/// member's path, long names and PAX paths included); for a compressed shard, `start` is an
/// offset of the decompressed stream.
///
/// # Errors
/// The file cannot be read there, or holds no keyed member there.
pub(crate) fn key_at(path: &Path, start: u64, len: u64) -> Result<String> {
    Ok(keys_at(path, &[(start, len)])?.remove(0))
}

/// [`key_at`] for several samples `(start, len)` of one shard, in ascending order of `start`:
/// the file is opened once, and a compressed shard is decompressed once, not once per sample.
///
/// # Errors
/// As [`key_at`], for the first sample that fails; `samples` out of order.
pub(crate) fn keys_at(path: &Path, samples: &[(u64, u64)]) -> Result<Vec<String>> {
    // A plain shard seeks to each sample; a compressed one is one forward stream.
    let (mut plain, mut stream) = match codec::open(path)? {
        Opened::Plain(shard) => (Some(Sequential::new(shard)), None),
        Opened::Decompressed(_, decoder) => (None, Some(decoder)),
    };
    // Where the decompressed stream is.
    let mut pos = 0u64;
    let mut keys = Vec::with_capacity(samples.len());
    for &(start, len) in samples {
        let what = || {
            format!(
                "{}: byte offset {start}: expected a sample's first header",
                path.display()
            )
        };
        if let Some(file) = plain.as_mut() {
            file.seek(SeekFrom::Start(start)).with_context(|| {
                format!("{}: cannot seek to byte offset {start}", path.display())
            })?;
            keys.push(first_key(Read::take(file, len)).with_context(what)?);
            continue;
        }
        let stream = stream.as_mut().expect("plain or compressed");
        if start < pos {
            bail!(
                "internal error: keys_at({}): offsets out of order",
                path.display()
            );
        }
        let skip = start - pos;
        let skipped = io::copy(&mut stream.take(skip), &mut io::sink()).with_context(|| {
            format!(
                "{}: decompressing up to byte offset {start}",
                path.display()
            )
        })?;
        if skipped < skip {
            bail!(
                "{}: the decompressed stream ends at byte {}, before byte offset {start}",
                path.display(),
                pos + skipped
            );
        }
        let mut counted = Counted {
            inner: stream.take(len),
            read: 0,
        };
        keys.push(first_key(&mut counted).with_context(what)?);
        pos = start + counted.read;
    }
    Ok(keys)
}

/// The sample key of the first member of a tar stream (its real name: PAX and GNU sparse names
/// included).
fn first_key(reader: impl Read) -> Result<String> {
    let member = Walk::new(Forward(reader), None)
        .next_member()?
        .context("the archive ends here")?;
    let key = sample_key(&member.path).with_context(|| {
        format!(
            "the member {:?} ({}) has no sample key",
            member.name(),
            member.kind.describe()
        )
    })?;
    Ok(String::from_utf8_lossy(key).into_owned())
}

/// A reader that counts the bytes it returned.
struct Counted<R> {
    inner: R,
    read: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

/// Indexes a tar stream of `file_len` bytes. Errors carry the byte offset but not the name; the
/// caller adds it.
///
/// # Errors
/// See [`index_file`].
pub fn index_reader<R: Read + Seek>(reader: R, file_len: u64) -> Result<ShardIndex> {
    index_reader_with(reader, file_len, &Rules::default())
}

/// [`index_reader`] with sample hygiene rules.
///
/// # Errors
/// See [`index_file_with`].
pub(crate) fn index_reader_with<R: Read + Seek>(
    reader: R,
    file_len: u64,
    rules: &Rules,
) -> Result<ShardIndex> {
    index_walk(
        Walk::new(Seekable(reader), Some(file_len)),
        rules,
        &mut |_| {},
    )
}

/// Groups the members of a header walk into samples.
/// Data after the first zero block is an error unless [`Rules::ignore_zeros`]: the samples there
/// would be left out without a word.
/// `reached` hears the walk's offset after each member.
fn index_walk<S: Source>(
    walk: Walk<S>,
    rules: &Rules,
    reached: &mut dyn FnMut(u64),
) -> Result<ShardIndex> {
    let mut walk = walk.ignoring_zeros(rules.ignore_zeros);
    let mut grouper = Grouper::new(rules);
    while let Some(member) = walk.next_member()? {
        let content = read_member(&mut walk, &member, rules)?;
        grouper.push(&member, content)?;
        reached(walk.offset());
    }
    if let Some(trailing) = walk.trailing()? {
        bail!("{}", trailing.describe());
    }
    let mut index = grouper.finish()?;
    index.zero_runs = walk.zero_runs();
    Ok(index)
}

/// The data of `member` when it is the member [`Rules::read_member`] asks for.
fn read_member<S: Source>(
    walk: &mut Walk<S>,
    member: &Member,
    rules: &Rules,
) -> Result<Option<Vec<u8>>> {
    let Some((ext, limit)) = &rules.read_member else {
        return Ok(None);
    };
    if !member.kind.is_file() || extension(&member.path) != ext.as_bytes() {
        return Ok(None);
    }
    let (name, at, size) = (member.name(), member.header, member.stored);
    if member.sparse {
        bail!("byte offset {at}: member {name:?} is stored sparse (with holes); labels are read from plain members only");
    }
    if size > *limit {
        bail!(
            "byte offset {at}: member {name:?} is {size} bytes, more than the --label-limit of {limit} (labels are read from small members only)"
        );
    }
    walk.read_data(member).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tar::group::Sample;
    use crate::tar::testing::tar_of;
    use std::io::Cursor;

    fn index(bytes: &[u8]) -> Result<ShardIndex> {
        index_reader(HeaderReader::new(Cursor::new(bytes)), bytes.len() as u64)
    }

    #[test]
    fn groups_consecutive_members_into_contiguous_ranges() {
        let long = format!("{}/k.jpg", "d".repeat(120));
        let long_cls = format!("{}/k.cls", "d".repeat(120));
        let bytes = tar_of(&[
            ("a.jpg", b"12345"),
            ("a.cls", b"1"),
            ("b.jpg", &[7u8; 700]),
            (&long, b"x"),
            (&long_cls, b"y"),
        ]);
        let idx = index(&bytes).unwrap();
        assert_eq!(idx.samples.len(), 3);
        assert_eq!(
            idx.samples[0],
            Sample {
                start: 0,
                len: 2048
            }
        );
        assert_eq!(
            idx.samples[1],
            Sample {
                start: 2048,
                len: 512 + 1024
            }
        );
        // The long-name sample starts at its first 'L' record.
        let s = idx.samples[2];
        assert_eq!(s.start, 2048 + 1536);
        assert_eq!(
            s.start + s.len,
            bytes.len() as u64 - 1024,
            "ends before the end-of-archive blocks"
        );
        let mut a = tar::Archive::new(&bytes[s.start as usize..(s.start + s.len) as usize]);
        let names: Vec<String> = a
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names, [long, long_cls]);
    }

    #[test]
    fn skipped_entries_are_counted_and_split_samples_rejected() {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_size(0);
        b.append_data(&mut h, "dir/", &b""[..]).unwrap();
        let bytes = [
            b.into_inner().unwrap(),
            tar_of(&[("dir/a.x", b"1"), ("dir/README", b"2"), ("dir/b.x", b"3")]),
        ]
        .concat();
        // Two archives glued: the first's end blocks would hide the second's samples.
        let err = format!("{:#}", index(&bytes).unwrap_err());
        assert!(
            err.contains("byte offset 512: data after the end-of-archive marker: zero blocks")
                && err.contains("data from byte offset 1536")
                && err.contains("--ignore-zeros"),
            "{err}"
        );

        let bytes = tar_of(&[("dir/a.x", b"1"), ("dir/README", b"2"), ("dir/b.x", b"3")]);
        let idx = index(&bytes).unwrap();
        assert_eq!(idx.samples.len(), 2);
        assert_eq!(idx.skipped.keyless_files, 1);

        let bytes = tar_of(&[("a.x", b"1"), ("README", b"2"), ("a.y", b"3")]);
        let err = format!("{:#}", index(&bytes).unwrap_err());
        assert!(
            err.contains("byte offset 1024") && err.contains("README") && err.contains("\"a\""),
            "{err}"
        );
    }

    #[test]
    fn bad_input_names_the_offset() {
        let err = format!("{:#}", index(&[b'x'; 4096]).unwrap_err());
        assert!(
            err.contains("byte offset 0") && err.contains("expected a tar archive"),
            "{err}"
        );

        let mut bytes = tar_of(&[("a.x", b"1"), ("b.x", b"2")]);
        bytes[512 * 2 + 10] ^= 0x55; // corrupt the second header's name
        let err = format!("{:#}", index(&bytes).unwrap_err());
        assert!(
            err.contains("byte offset 1024") && err.contains("checksum"),
            "{err}"
        );

        let bytes = tar_of(&[("a.x", &[1u8; 3000]), ("b.x", b"2")]);
        let err = format!("{:#}", index(&bytes[..2000]).unwrap_err());
        assert!(err.contains("truncated") && err.contains("a.x"), "{err}");
        // b.x's header is at 3584: cut inside its data, then inside the header itself.
        let err = format!("{:#}", index(&bytes[..4096 + 100]).unwrap_err());
        assert!(
            err.contains("byte offset 3584") && err.contains("truncated"),
            "{err}"
        );
        let err = format!("{:#}", index(&bytes[..3584 + 100]).unwrap_err());
        assert!(
            err.contains("byte offset 3584") && err.contains("expected a tar header"),
            "{err}"
        );

        let err = format!("{:#}", index(&[0x1f, 0x8b, 8, 0, 0, 0]).unwrap_err());
        assert!(err.contains("gzip"), "{err}");
    }

    /// The tar `bytes` written in `dir` as it is and gzip-compressed.
    fn plain_and_gzip(dir: &Path, bytes: &[u8]) -> [std::path::PathBuf; 2] {
        let plain = dir.join("s.tar");
        std::fs::write(&plain, bytes).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        io::Write::write_all(&mut gz, bytes).unwrap();
        let packed = dir.join("s.tgz");
        std::fs::write(&packed, gz.finish().unwrap()).unwrap();
        [plain, packed]
    }

    #[test]
    fn key_at_reads_plain_and_compressed_shards() {
        let dir = tempfile::tempdir().unwrap();
        let long = format!("{}/long.jpg", "d".repeat(120));
        let bytes = tar_of(&[("a.jpg", b"1"), (&long, b"2")]);
        for path in &plain_and_gzip(dir.path(), &bytes) {
            let idx = index_file(path).unwrap();
            assert_eq!(
                key_at(path, idx.samples[0].start, idx.samples[0].len).unwrap(),
                "a"
            );
            let want = format!("{}/long", "d".repeat(120));
            assert_eq!(
                key_at(path, idx.samples[1].start, idx.samples[1].len).unwrap(),
                want
            );
            assert_eq!(idx.edge_keys, Some(("a".to_string(), want.clone())));
            let both: Vec<(u64, u64)> = idx.samples.iter().map(|s| (s.start, s.len)).collect();
            assert_eq!(keys_at(path, &both).unwrap(), ["a".to_string(), want]);
        }
    }

    #[test]
    fn the_walk_goes_on_after_reading_a_label() {
        // Labels of 1 and 700 bytes (one block, two): after each read the walk must be where
        // it thinks, or the next header is read at the wrong offset.
        let big = [b'7'; 700];
        let bytes = tar_of(&[
            ("a.jpg", b"12345"),
            ("a.cls", b"3"),
            ("b.cls", &big),
            ("b.jpg", b"x"),
            ("c.jpg", b"y"),
        ]);
        let rules = Rules {
            read_member: Some(("cls".into(), 1000)),
            ..Rules::default()
        };
        let dir = tempfile::tempdir().unwrap();
        for path in &plain_and_gzip(dir.path(), &bytes) {
            let idx = index_file_with(path, &rules).unwrap();
            let starts: Vec<u64> = idx.samples.iter().map(|s| s.start).collect();
            assert_eq!(starts, [0, 2048, 4608], "{}", path.display());
            assert_eq!(
                idx.contents,
                [Some(b"3".to_vec()), Some(big.to_vec()), None],
                "{}",
                path.display()
            );
        }
    }

    #[test]
    fn empty_archive_has_no_samples() {
        assert_eq!(index(&[0u8; 1024]).unwrap().samples.len(), 0);
        assert_eq!(index(&[]).unwrap().samples.len(), 0);
    }

    fn index_ignoring_zeros(bytes: &[u8]) -> Result<ShardIndex> {
        let rules = Rules {
            ignore_zeros: true,
            ..Rules::default()
        };
        index_reader_with(
            HeaderReader::new(Cursor::new(bytes)),
            bytes.len() as u64,
            &rules,
        )
    }

    #[test]
    fn data_after_zero_blocks_is_refused_or_read_with_ignore_zeros() {
        let a = tar_of(&[("a.x", b"1"), ("k.x", b"2")]);
        let b = tar_of(&[("k.y", b"3"), ("c.x", b"4")]);
        // A lone zero block: the first archive's last header block zeroed out.
        let mut lone = a[..1536].to_vec();
        lone[1024..1536].fill(0);
        lone.extend_from_slice(&b);
        let err = format!("{:#}", index(&lone).unwrap_err());
        assert!(
            err.contains("byte offset 1024: data after the end-of-archive marker: a lone zero block followed by")
                && err.contains(&format!("{} more bytes", b.len())),
            "{err}"
        );
        // `cat a.tar b.tar`, read past the zeros: every sample of both, none holding zeros; a
        // key on both sides of the zeros is two samples, not one range over them.
        let glued = [a.clone(), b.clone()].concat();
        let idx = index_ignoring_zeros(&glued).unwrap();
        assert_eq!(idx.zero_runs, 1);
        let at = a.len() as u64 - 1024;
        let want = [
            (0, 1024),
            (1024, 1024),
            (at + 1024, 1024),
            (at + 2048, 1024),
        ];
        let got: Vec<(u64, u64)> = idx.samples.iter().map(|s| (s.start, s.len)).collect();
        assert_eq!(got, want);
        // Zeros only after the marker, or nothing: no error.
        let mut padded = a.clone();
        padded.resize(10240, 0);
        assert_eq!(index(&padded).unwrap().samples.len(), 2);
        // A compressed stream: read to its end, trailing data found there too.
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        io::Write::write_all(&mut gz, &glued).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.tgz");
        std::fs::write(&path, gz.finish().unwrap()).unwrap();
        let err = format!("{:#}", index_file(&path).unwrap_err());
        assert!(
            err.contains("s.tgz") && err.contains("--ignore-zeros"),
            "{err}"
        );
    }

    #[test]
    fn a_damaged_compressed_stream_fails_after_the_end_marker() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = tar_of(&[("a.jpg", &[5u8; 4000]), ("b.jpg", b"6")]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::none());
        io::Write::write_all(&mut gz, &bytes).unwrap();
        let mut packed = gz.finish().unwrap();
        // Stored (level 0) blocks: a flipped bit in the data decodes, only the CRC tells.
        packed[600] ^= 1;
        let path = dir.path().join("s.tar.gz");
        std::fs::write(&path, &packed).unwrap();
        let err = format!("{:#}", index_file(&path).unwrap_err());
        assert!(err.contains("s.tar.gz"), "{err}");
    }
}
