//! [`TarStream`]: a shard read front to back once, as `verify` digests it. In a file of its own
//! and independent of the digest, so that it can move to `tar/stream.rs` as one file.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::tar_index::Codec;

/// Read buffer per open shard.
const READ_BUFFER: usize = 1 << 20;

/// A shard's tar stream, read front to back once: the file itself, or its decompressed stream
/// (offsets are then those of the decompressed stream, as the indexer gives them).
pub(super) struct TarStream {
    reader: BufReader<Box<dyn Read + Send>>,
    pos: u64,
    /// The file as messages name it.
    name: String,
}

impl TarStream {
    /// Opens `path`, through its decompressor when the content says it is compressed.
    ///
    /// # Errors
    /// The file cannot be opened or sniffed, or decompression cannot start.
    pub(super) fn open(path: &Path) -> Result<Self> {
        let codec = Codec::sniff(path)?;
        let file = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
        let (inner, name): (Box<dyn Read + Send>, String) = if codec == Codec::Plain {
            (Box::new(file), path.display().to_string())
        } else {
            let stream = codec
                .decoder(file)
                .with_context(|| format!("{}: cannot start decompressing", path.display()))?;
            let name = format!(
                "{} ({codec:?}-compressed; offsets in the decompressed stream)",
                path.display()
            );
            (stream, name)
        };
        Ok(TarStream {
            reader: BufReader::with_capacity(READ_BUFFER, inner),
            pos: 0,
            name,
        })
    }

    /// Passes the next `len` bytes (fewer where the stream ends) to `f`, piece by piece; returns
    /// how many there were.
    fn read(&mut self, len: u64, mut f: impl FnMut(&[u8])) -> Result<u64> {
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

    /// Skips to `offset` (samples come in stream order; the gaps are skipped entries).
    ///
    /// # Errors
    /// `offset` is behind the stream, the stream ends before it, or it cannot be read.
    pub(super) fn skip_to(&mut self, offset: u64) -> Result<()> {
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

    /// Passes the next `len` bytes, one whole sample, to `f` piece by piece.
    ///
    /// # Errors
    /// The stream cannot be read, or it ends inside the sample.
    pub(super) fn read_sample(&mut self, len: u64, f: impl FnMut(&[u8])) -> Result<()> {
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

    /// Requires the rest of the stream to be the end-of-archive marker: at least two zero
    /// blocks, nothing but zeros after them, a whole number of blocks.
    ///
    /// # Errors
    /// The stream cannot be read, or its tail is not such a marker.
    pub(super) fn check_tail(&mut self) -> Result<()> {
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
