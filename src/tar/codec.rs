//! How a shard's bytes are stored, and the one way to open a shard for reading its tar stream:
//! sniff the codec from the first bytes, open the file, and decompress when compressed.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::sys::read_up_to;

/// How a shard's bytes are stored, told by its first bytes (never by its name).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Codec {
    /// A plain tar: samples are byte ranges of the file itself.
    #[default]
    Plain,
    /// gzip (`.tar.gz`, `.tgz`): byte ranges of the decompressed stream.
    Gzip,
    /// zstd (`.tar.zst`): byte ranges of the decompressed stream.
    Zstd,
}

impl Codec {
    /// The codec whose magic bytes start `head`.
    pub fn from_magic(head: &[u8]) -> Codec {
        match head {
            [0x1f, 0x8b, ..] => Codec::Gzip,
            [0x28, 0xb5, 0x2f, 0xfd, ..] => Codec::Zstd,
            _ => Codec::Plain,
        }
    }

    /// Reads the first bytes of the file at `path` to tell its codec.
    ///
    /// # Errors
    /// The file cannot be read.
    pub fn sniff(path: &Path) -> Result<Codec> {
        let mut f = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
        let mut head = [0u8; 4];
        let n = read_up_to(&mut f, &mut head)
            .with_context(|| format!("{}: cannot read", path.display()))?;
        Ok(Codec::from_magic(&head[..n]))
    }

    /// A reader of the decompressed stream of `file` (buffered).
    ///
    /// # Errors
    /// The decoder cannot start (zstd's context allocation).
    pub fn decoder(self, file: File) -> io::Result<Box<dyn Read + Send>> {
        let buffered = BufReader::with_capacity(1 << 20, file);
        Ok(match self {
            Codec::Plain => Box::new(buffered),
            Codec::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(buffered)),
            Codec::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(buffered)?),
        })
    }
}

/// A shard opened by [`open`] for reading its tar stream from the start.
pub enum Opened {
    /// A plain tar: the file itself, unbuffered and seekable; offsets are file offsets.
    Plain(File),
    /// A compressed tar: its decompressed stream (buffered); offsets are those of this stream.
    Decompressed(Codec, Box<dyn Read + Send>),
}

/// Tells the codec of the shard at `path` and opens it, positioned at its first byte.
///
/// # Errors
/// The file cannot be opened or read (the message names it).
pub fn open_file(path: &Path) -> Result<(Codec, File)> {
    let codec = Codec::sniff(path)?;
    let file = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    Ok((codec, file))
}

/// The decompressed stream of `file`, the shard at `path` stored with `codec` (the file itself,
/// buffered, for [`Codec::Plain`]).
///
/// # Errors
/// The decoder cannot start (the message names the file).
pub fn decompress(codec: Codec, file: File, path: &Path) -> Result<Box<dyn Read + Send>> {
    codec
        .decoder(file)
        .with_context(|| format!("{}: cannot start decompressing", path.display()))
}

/// Opens the shard at `path` for reading its tar stream: the file of a plain tar, the
/// decompressed stream of a compressed one. Every reader of shard contents starts here, so a
/// codec is told the same way everywhere.
///
/// # Errors
/// As [`open_file`] and [`decompress`].
pub fn open(path: &Path) -> Result<Opened> {
    let (codec, file) = open_file(path)?;
    if codec == Codec::Plain {
        return Ok(Opened::Plain(file));
    }
    Ok(Opened::Decompressed(codec, decompress(codec, file, path)?))
}

/// How messages name the tar stream of the shard at `path`: its path, and for a compressed shard
/// a note that byte offsets are those of the decompressed stream.
pub fn stream_name(path: &Path, codec: Codec) -> String {
    if codec == Codec::Plain {
        return path.display().to_string();
    }
    format!(
        "{} ({codec:?}-compressed; offsets in the decompressed stream)",
        path.display()
    )
}
