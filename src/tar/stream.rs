//! [`TarStream`]: a shard's tar stream read front to back once, for readers that visit every
//! sample in order (verify digests them).

use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::storage::Sequential;
use crate::tar::codec::{self, Opened};

/// Read buffer per open stream.
const READ_BUFFER: usize = 1 << 20;

/// A shard's tar stream, read front to back once: the file itself, or its decompressed stream
/// (offsets are then those of the decompressed stream, as the indexer gives them). Every message
/// names the shard and the byte offset.
pub(crate) struct TarStream {
    reader: BufReader<Box<dyn Read + Send>>,
    pos: u64,
    /// The file as messages name it.
    name: String,
}

impl TarStream {
    /// Opens the shard at `path` at its first byte.
    ///
    /// # Errors
    /// As [`codec::open`].
    #[cfg(test)]
    pub(crate) fn open(path: &Path) -> Result<Self> {
        Self::open_with(path, |r| r)
    }

    /// Opens the shard at `path` at its first byte, reading its stream through `wrap` (which
    /// sees every byte of the stream, in order, as it is read).
    ///
    /// # Errors
    /// As [`codec::open`].
    pub(crate) fn open_with(
        path: &Path,
        wrap: impl FnOnce(Box<dyn Read + Send>) -> Box<dyn Read + Send>,
    ) -> Result<Self> {
        let (inner, name): (Box<dyn Read + Send>, String) = match codec::open(path)? {
            Opened::Plain(shard) => (
                Box::new(Sequential::new(shard)),
                codec::stream_name(path, codec::Codec::Plain),
            ),
            Opened::Decompressed(codec, stream) => (stream, codec::stream_name(path, codec)),
        };
        Ok(TarStream {
            reader: BufReader::with_capacity(READ_BUFFER, wrap(inner)),
            pos: 0,
            name,
        })
    }

    #[cfg(test)]
    /// Where the stream is: the offset of the next byte.
    pub(crate) fn pos(&self) -> u64 {
        self.pos
    }

    /// The shard as messages name it (with a note on offsets when compressed).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Passes the next `len` bytes (fewer where the stream ends) to `f`, piece by piece; returns
    /// how many there were.
    ///
    /// # Errors
    /// A read fails.
    pub(crate) fn read(&mut self, len: u64, mut f: impl FnMut(&[u8])) -> Result<u64> {
        let mut left = len;
        while left > 0 {
            let buf = self
                .reader
                .fill_buf()
                .with_context(|| format!("{}: byte offset {}: cannot read", self.name, self.pos))?;
            if buf.is_empty() {
                break;
            }
            let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            f(&buf[..n]);
            self.reader.consume(n);
            self.pos += n as u64;
            left -= n as u64;
        }
        Ok(len - left)
    }

    /// Passes the next `len` bytes, one whole sample, to `f` piece by piece.
    ///
    /// # Errors
    /// The stream cannot be read, or it ends inside the sample.
    pub(crate) fn read_sample(&mut self, len: u64, f: impl FnMut(&[u8])) -> Result<()> {
        let start = self.pos;
        if self.read(len, f)? < len {
            bail!(
                "{}: byte offset {}: the stream ends inside the sample at byte offset {start} (did it change while being verified?)",
                self.name,
                self.pos
            );
        }
        Ok(())
    }

    /// Skips to `offset` (samples come in stream order; the gaps are skipped entries).
    ///
    /// # Errors
    /// `offset` is behind the stream, the stream ends before it, or a read fails.
    pub(crate) fn skip_to(&mut self, offset: u64) -> Result<()> {
        let Some(gap) = offset.checked_sub(self.pos) else {
            bail!(
                "{}: byte offset {offset}: samples out of order (at {})",
                self.name,
                self.pos
            );
        };
        if self.read(gap, |_| {})? < gap {
            bail!(
                "{}: byte offset {}: the stream ends before byte offset {offset}",
                self.name,
                self.pos
            );
        }
        Ok(())
    }

    /// Requires the rest of the stream to be the end-of-archive marker: at least two zero
    /// blocks, nothing but zeros after them, a whole number of blocks.
    ///
    /// # Errors
    /// Data after the marker, no marker, a stream length that is not whole blocks, a failed
    /// read.
    pub(crate) fn check_tail(&mut self) -> Result<()> {
        let end = self.pos;
        let mut nonzero = None;
        let mut at = end;
        self.read(u64::MAX, |piece| {
            if nonzero.is_none() {
                nonzero = piece.iter().position(|&b| b != 0).map(|i| at + i as u64);
            }
            at += piece.len() as u64;
        })?;
        let tail = self.pos - end;
        if let Some(off) = nonzero {
            bail!(
                "{}: byte offset {off}: data after the end-of-archive marker",
                self.name
            );
        }
        if tail < 1024 {
            bail!(
                "{}: byte offset {end}: no end-of-archive marker after the last sample (expected two zero blocks, the stream ends {tail} bytes later)",
                self.name
            );
        }
        if self.pos % 512 != 0 {
            bail!(
                "{}: the stream's length ({} bytes) is not a whole number of 512-byte blocks",
                self.name,
                self.pos
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tar::testing::tar_of;

    #[test]
    fn reads_plain_and_compressed_shards_in_stream_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = tar_of(&[("a.jpg", b"12345"), ("b.jpg", b"6")]);
        let plain = dir.path().join("s.tar");
        std::fs::write(&plain, &bytes).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &bytes).unwrap();
        let packed = dir.path().join("s.tgz");
        std::fs::write(&packed, gz.finish().unwrap()).unwrap();
        for path in [&plain, &packed] {
            let mut s = TarStream::open(path).unwrap();
            s.skip_to(1024).unwrap();
            let mut got = Vec::new();
            assert_eq!(s.read(1024, |p| got.extend_from_slice(p)).unwrap(), 1024);
            assert_eq!(got, bytes[1024..2048]);
            s.check_tail().unwrap();
            let e = format!("{:#}", s.skip_to(0).unwrap_err());
            assert!(e.contains("out of order"), "{e}");
        }
        let s = TarStream::open(&packed).unwrap();
        assert!(s.name().contains("Gzip-compressed"), "{}", s.name());
    }
}
