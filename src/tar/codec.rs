//! How a shard's bytes are stored, and the one way to open a shard for reading its tar stream:
//! sniff the codec from the first bytes, open the shard in its storage, and decompress when
//! compressed.

use std::io::{self, BufReader, Read};
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::storage::{self, OpenInput, Sequential};

/// How a shard's bytes are stored, told by its first bytes (never by its name).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Codec {
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
    pub(crate) fn from_magic(head: &[u8]) -> Codec {
        match head {
            [0x1f, 0x8b, ..] => Codec::Gzip,
            [0x28, 0xb5, 0x2f, 0xfd, ..] => Codec::Zstd,
            _ => Codec::Plain,
        }
    }

    /// Reads the first bytes of the open shard `shard` (at `path`) to tell its codec.
    ///
    /// # Errors
    /// The shard cannot be read.
    pub(crate) fn sniff(shard: &OpenInput, path: &Path) -> Result<Codec> {
        let mut head = [0u8; 4];
        let n = storage::read_up_to_at(shard.as_ref(), &mut head, 0)
            .with_context(|| format!("{}: cannot read", path.display()))?;
        Ok(Codec::from_magic(&head[..n]))
    }

    /// A reader of the decompressed stream of `shard` from its first byte (buffered).
    ///
    /// # Errors
    /// The decoder cannot start (zstd's context allocation).
    pub(crate) fn decoder(self, shard: OpenInput) -> io::Result<Box<dyn Read + Send>> {
        let buffered = BufReader::with_capacity(1 << 20, Sequential::new(shard));
        Ok(match self {
            Codec::Plain => Box::new(buffered),
            Codec::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(buffered)),
            Codec::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(buffered)?),
        })
    }
}

/// A shard opened by [`open`] for reading its tar stream from the start.
pub(crate) enum Opened {
    /// A plain tar: the shard itself, for positioned reads; offsets are file offsets.
    Plain(OpenInput),
    /// A compressed tar: its decompressed stream (buffered); offsets are those of this stream.
    Decompressed(Codec, Box<dyn Read + Send>),
}

/// Opens the shard at `path` in its storage ([`storage::source`]) and tells its codec.
///
/// # Errors
/// The shard cannot be opened or read (the message names it).
pub(crate) fn open_file(path: &Path) -> Result<(Codec, OpenInput)> {
    let shard = storage::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let codec = Codec::sniff(&shard, path)?;
    Ok((codec, shard))
}

/// The decompressed stream of `shard`, the shard at `path` stored with `codec` (the shard itself,
/// buffered, for [`Codec::Plain`]), from its first byte.
///
/// # Errors
/// The decoder cannot start (the message names the file).
pub(crate) fn decompress(
    codec: Codec,
    shard: OpenInput,
    path: &Path,
) -> Result<Box<dyn Read + Send>> {
    codec
        .decoder(shard)
        .with_context(|| format!("{}: cannot start decompressing", path.display()))
}

/// Opens the shard at `path` for reading its tar stream: the file of a plain tar, the
/// decompressed stream of a compressed one. Every reader of shard contents starts here, so a
/// codec is told the same way everywhere.
///
/// # Errors
/// As [`open_file`] and [`decompress`].
pub(crate) fn open(path: &Path) -> Result<Opened> {
    let (codec, file) = open_file(path)?;
    if codec == Codec::Plain {
        return Ok(Opened::Plain(file));
    }
    Ok(Opened::Decompressed(codec, decompress(codec, file, path)?))
}

/// How messages name the tar stream of the shard at `path`: its path, and for a compressed shard
/// a note that byte offsets are those of the decompressed stream.
pub(crate) fn stream_name(path: &Path, codec: Codec) -> String {
    if codec == Codec::Plain {
        return path.display().to_string();
    }
    format!(
        "{} ({codec:?}-compressed; offsets in the decompressed stream)",
        path.display()
    )
}
