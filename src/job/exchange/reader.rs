//! Sequential reader over a rank's input shards.

use std::collections::BTreeSet;
use std::io::{self, Read};
use std::ops::Range;

use anyhow::{anyhow, Context, Result};

use crate::input::InputShard;
use crate::storage::{self, OpenInput, Reads};
use crate::tar::codec::{self, Codec};

/// Reads at least this large go straight into the caller's buffer instead of through the
/// window: a second copy of their bytes costs more than a system call of their own (on tmpfs,
/// np=2, 100 KiB samples: the window's copies into the send buffer were 6-8% of the run's CPU).
pub(super) const DIRECT: u64 = 64 << 10;

/// Sequential reader over the input shards: small samples are served from a large read window,
/// large ones, and every sample of an input read file by file ([`Reads::PerSample`]), are read
/// straight into the send buffer.
pub(super) struct InputReader<'a> {
    inputs: &'a [InputShard],
    /// The open input: shard, file, and how it is stored.
    file: Option<(usize, OpenInput, Codec)>,
    /// For a compressed shard: the decompressed stream and its position.
    stream: Option<(usize, u64, Box<dyn Read + Send>)>,
    window: Vec<u8>,
    /// Which shard and byte range the window holds.
    window_shard: usize,
    window_range: Range<u64>,
    /// Compressed shards still to be read to their end (see [`InputReader::finish`]).
    unread: BTreeSet<usize>,
    /// (shard, offset): a window filled in that shard ends at that offset at the latest, where
    /// the next sample read directly starts ([`InputReader::reach`]).
    reach: (usize, u64),
}

impl<'a> InputReader<'a> {
    /// A reader of `inputs` with a read window of `window` bytes; `unread`: the shards whose
    /// streams the index phase did not read (see [`InputReader::finish`]).
    pub(super) fn new(inputs: &'a [InputShard], window: usize, unread: &[usize]) -> Self {
        InputReader {
            inputs,
            file: None,
            stream: None,
            window: vec![0; window],
            window_shard: usize::MAX,
            window_range: 0..0,
            unread: unread.iter().copied().collect(),
            reach: (usize::MAX, 0),
        }
    }

    /// The read window's size.
    pub(super) fn window_len(&self) -> usize {
        self.window.len()
    }

    /// Whether a window filled at `offset` of `shard` has its end set by [`InputReader::reach`].
    pub(super) fn reaches(&self, shard: usize, offset: u64) -> bool {
        self.reach.0 == shard && offset < self.reach.1
    }

    /// Windows filled in `shard` end at `end` at the latest: the bytes after it belong to samples
    /// read directly (or not read at all), and reading them into the window would copy them
    /// twice.
    pub(super) fn reach(&mut self, shard: usize, end: u64) {
        self.reach = (shard, end);
    }

    /// Once every sample is read: reads each compressed shard in `unread` to the end of its
    /// stream (continuing the open stream where it is), so that the decoder checks its checksum
    /// at least once per run. A shard the index phase decompressed was checked there.
    ///
    /// # Errors
    /// A stream that is damaged (its checksum does not match), or a read that fails; the
    /// message names the file.
    pub(super) fn finish(&mut self) -> Result<()> {
        self.drain_open()?;
        while let Some(shard) = self.unread.pop_first() {
            let path = self.inputs[shard].path.clone();
            let (codec, file) = codec::open_file(&path)?;
            if codec != Codec::Plain {
                drain(Box::new(codec::decompress(codec, file, &path)?), &path)?;
            }
        }
        Ok(())
    }

    /// Reads the open stream to its end if its shard is still unread.
    fn drain_open(&mut self) -> Result<()> {
        let Some((shard, _, decoder)) = self.stream.take() else {
            return Ok(());
        };
        if self.unread.remove(&shard) {
            drain(decoder, &self.inputs[shard].path)?;
        }
        Ok(())
    }

    /// The open input file of `shard` and its codec (the last one opened stays open).
    pub(super) fn file(&mut self, shard: usize) -> Result<(&OpenInput, Codec)> {
        if self.file.as_ref().is_none_or(|(s, _, _)| *s != shard) {
            let path = &self.inputs[shard].path;
            let (codec, f) = codec::open_file(path)?;
            self.file = Some((shard, f, codec));
        }
        let (_, f, codec) = self.file.as_ref().unwrap();
        Ok((f, *codec))
    }

    /// Reads `out.len()` bytes at `offset` of `shard` (of its decompressed stream, when
    /// compressed).
    pub(super) fn read(&mut self, shard: usize, offset: u64, out: &mut [u8]) -> Result<()> {
        if self.file(shard)?.1 != Codec::Plain {
            return self.read_stream(shard, offset, out);
        }
        self.read_plain(shard, offset, out)
    }

    /// A compressed shard is read as one forward stream: samples come in input order, so each
    /// read starts at or after the previous one's end (a restart from the top otherwise).
    pub(super) fn read_stream(&mut self, shard: usize, offset: u64, out: &mut [u8]) -> Result<()> {
        let path = self.inputs[shard].path.clone();
        if self
            .stream
            .as_ref()
            .is_none_or(|(s, pos, _)| *s != shard || *pos > offset)
        {
            if self.stream.as_ref().is_some_and(|(s, _, _)| *s != shard) {
                self.drain_open()?;
            }
            let (file, codec) = self.file(shard)?;
            // A stream of its own from the first byte (a restart reads from the top).
            let file = file.clone();
            let decoder = Box::new(codec::decompress(codec, file, &path)?);
            self.stream = Some((shard, 0, decoder));
        }
        let (_, pos, decoder) = self.stream.as_mut().unwrap();
        let skip = offset - *pos;
        let skipped =
            std::io::copy(&mut decoder.take(skip), &mut std::io::sink()).with_context(|| {
                format!(
                    "{}: decompressing up to byte offset {offset}",
                    path.display()
                )
            })?;
        let result = if skipped < skip {
            Err(anyhow!(
                "{}: decompressed byte offset {}: expected sample data, found the end of the stream (did the shard change during the run?)",
                path.display(),
                *pos + skipped
            ))
        } else {
            decoder.read_exact(out).with_context(|| {
                format!(
                    "{}: decompressed byte offset {offset}: cannot read {} bytes of sample data",
                    path.display(),
                    out.len()
                )
            })
        };
        if result.is_err() {
            self.stream = None;
            return result;
        }
        *pos = offset + out.len() as u64;
        Ok(())
    }

    pub(super) fn read_plain(
        &mut self,
        shard: usize,
        mut offset: u64,
        mut out: &mut [u8],
    ) -> Result<()> {
        while !out.is_empty() {
            if shard == self.window_shard && self.window_range.contains(&offset) {
                let from = (offset - self.window_range.start) as usize;
                let n = out.len().min((self.window_range.end - offset) as usize);
                out[..n].copy_from_slice(&self.window[from..from + n]);
                out = &mut out[n..];
                offset += n as u64;
                continue;
            }
            let size = self.inputs[shard].size;
            let path = self.inputs[shard].path.clone();
            let short = |got: u64| {
                anyhow!(
                    "{}: byte offset {}: expected sample data, found the end of the file (the shard was {} bytes when indexed; did it change during the run?)",
                    path.display(),
                    got,
                    size
                )
            };
            let large = out.len() as u64 >= DIRECT.min(self.window.len() as u64 / 2);
            let file = self.file(shard)?.0;
            if large || file.reads() == Reads::PerSample {
                storage::read_up_to_at(file.as_ref(), out, offset)
                    .with_context(|| {
                        format!("{}: cannot read at byte offset {offset}", path.display())
                    })
                    .and_then(|got| {
                        if got < out.len() {
                            Err(short(offset + got as u64))
                        } else {
                            Ok(())
                        }
                    })?;
                return Ok(());
            }
            let mut want = (self.window.len() as u64).min(size.saturating_sub(offset));
            if self.reaches(shard, offset) {
                want = want.min(self.reach.1 - offset).max(out.len() as u64);
            }
            let want = want as usize;
            let mut window = std::mem::take(&mut self.window);
            let got =
                storage::read_up_to_at(self.file(shard)?.0.as_ref(), &mut window[..want], offset)
                    .with_context(|| {
                        format!("{}: cannot read at byte offset {offset}", path.display())
                    });
            self.window = window;
            let got = got?;
            if got == 0 {
                return Err(short(offset));
            }
            self.window_shard = shard;
            self.window_range = offset..offset + got as u64;
        }
        Ok(())
    }
}

/// Reads a decompressed stream to its end, where the decoder checks the stream's checksum.
fn drain(mut decoder: Box<dyn Read + Send>, path: &std::path::Path) -> Result<()> {
    io::copy(&mut decoder, &mut io::sink()).with_context(|| {
        format!(
            "{}: the compressed stream is damaged (read to its end to check its checksum)",
            path.display()
        )
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// A compressed shard read at an offset before the stream's position starts its stream
    /// again from the first byte (a restarted stream of a shared descriptor would continue
    /// where the last one stopped).
    #[test]
    fn a_compressed_stream_restarts_from_its_first_byte() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.tar.gz");
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&data).unwrap();
        std::fs::write(&path, gz.finish().unwrap()).unwrap();
        let inputs = [InputShard { path, size: 0 }];
        let mut reader = InputReader::new(&inputs, 1 << 16, &[]);
        let mut buf = [0u8; 100];
        reader.read(0, 150_000, &mut buf).unwrap();
        assert_eq!(buf[..], data[150_000..150_100]);
        reader.read(0, 1_000, &mut buf).unwrap();
        assert_eq!(buf[..], data[1_000..1_100]);
    }
}
