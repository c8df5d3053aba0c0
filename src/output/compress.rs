//! Finishing touches on written shards: compression and digests.

use std::path::Path;

use anyhow::{Context, Result};

use crate::storage::{self, Sequential};
use crate::tar::Codec;

/// A sequential reader of the object at `path` (`what` it is for, in the message).
fn read_seq(path: &Path, what: &str) -> Result<Sequential> {
    let shard =
        storage::open(path).with_context(|| format!("{}: cannot {what}", path.display()))?;
    Ok(Sequential::new(shard))
}

/// Compresses the finished plain shard at `plain` into the file `to` with `codec`, streaming
/// (bounded memory), syncs it and removes the plain shard. Returns the compressed size.
///
/// # Errors
/// Reading, writing or syncing fails (the message names the file).
pub(crate) fn compress_shard(plain: &Path, to: &Path, codec: Codec) -> Result<u64> {
    let mut src = read_seq(plain, "reopen")?;
    let sink = storage::sink(to);
    let dst = sink
        .create_stream(to)
        .with_context(|| format!("{}: cannot create", to.display()))?;
    let out = std::io::BufWriter::with_capacity(1 << 20, dst);
    let ctx = || format!("compressing {} into {}", plain.display(), to.display());
    let out = match codec {
        Codec::Plain => unreachable!("only compressed shards are compressed"),
        Codec::Gzip => {
            let mut e = flate2::write::GzEncoder::new(out, flate2::Compression::default());
            std::io::copy(&mut src, &mut e).with_context(ctx)?;
            e.finish().with_context(ctx)?
        }
        Codec::Zstd => {
            let mut e = zstd::stream::write::Encoder::new(out, 3).with_context(ctx)?;
            std::io::copy(&mut src, &mut e).with_context(ctx)?;
            e.finish().with_context(ctx)?
        }
    };
    let file = out
        .into_inner()
        .map_err(|e| e.into_error())
        .with_context(ctx)?;
    let size = file
        .finish()
        .with_context(|| format!("{}: cannot sync", to.display()))?;
    sink.remove_file(plain)
        .with_context(|| format!("{}: cannot remove", plain.display()))?;
    Ok(size)
}

/// The MD5 digest of the file at `path`, read sequentially.
///
/// # Errors
/// The file cannot be read.
pub(crate) fn md5_file(path: &Path) -> Result<[u8; 16]> {
    use md5::Digest;
    let mut file = read_seq(path, "open")?;
    let mut hasher = md5::Md5::new();
    std::io::copy(&mut file, &mut hasher)
        .with_context(|| format!("{}: cannot read", path.display()))?;
    Ok(hasher.finalize().into())
}
