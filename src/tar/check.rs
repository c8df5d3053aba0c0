//! A sample's range checked against the tar structure it must be, before any byte of it is
//! copied to an output: the saved index of a reshard output used as input (or a shard changed
//! during the run) may place a range anywhere, and a copied range that is not whole members
//! makes an output shard no tar reader accepts.

use std::io::{self, Read};

use anyhow::{bail, Context, Result};

use super::headers::{Source, Walk};
use super::key::sample_key;
use crate::storage::{self, Input};

/// What a sample's range must be: members whose headers check out, the first at its start,
/// each after the previous one's records and padding, the last ending exactly at its end (no
/// end-of-archive marker inside), every member with a key having the first one's key.
///
/// `src` reads the archive from `start`; `len` is the range's length. Only headers (and
/// extension records) are read: data is passed over.
///
/// # Errors
/// What is not so, with the byte offset in the archive where it was found.
pub(crate) fn check_sample<S: Source>(src: S, start: u64, len: u64) -> Result<()> {
    let end = start + len;
    let mut walk = Walk::within(src, start, end);
    let mut key: Option<(Vec<u8>, String)> = None;
    let mut members = 0u64;
    while let Some(m) = walk.next_member()? {
        members += 1;
        let Some(k) = sample_key(&m.path) else {
            continue;
        };
        match &key {
            None => key = Some((k.to_vec(), m.name())),
            Some((first, name)) if first.as_slice() != k => bail!(
                "byte offset {}: member {:?} has the key {:?}, but the sample begins with {name:?}: the range holds more than one sample",
                m.header,
                m.name(),
                String::from_utf8_lossy(k)
            ),
            Some(_) => {}
        }
    }
    if members == 0 {
        bail!("byte offset {start}: expected a sample's first header, found the end-of-archive marker");
    }
    let at = walk.offset();
    if at != end {
        bail!("byte offset {at}: the sample's members end here, not at byte {end} where its range ends (expected a member header)");
    }
    Ok(())
}

/// [`check_sample`] over bytes in memory: `bytes`, the whole range, read from `start`.
///
/// # Errors
/// As [`check_sample`].
pub(crate) fn check_sample_bytes(bytes: &[u8], start: u64) -> Result<()> {
    check_sample(InMemory(bytes), start, bytes.len() as u64)
}

/// [`check_sample`] over an open input, reading its headers at their offsets.
///
/// # Errors
/// As [`check_sample`], or a read fails.
pub(crate) fn check_sample_at(input: &dyn Input, start: u64, len: u64) -> Result<()> {
    let end = start + len;
    check_sample(
        At {
            input,
            pos: start,
            end,
        },
        start,
        len,
    )
}

/// The bytes of a range in memory, as a [`Source`].
struct InMemory<'a>(&'a [u8]);

impl Read for InMemory<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl Source for InMemory<'_> {
    fn skip(&mut self, n: u64) -> io::Result<u64> {
        let k = usize::try_from(n).unwrap_or(usize::MAX).min(self.0.len());
        self.0 = &self.0[k..];
        Ok(n)
    }
}

/// An open input read with positioned reads from `pos` up to `end` (the range's end: the
/// next sample's header is not this one's), as a [`Source`].
struct At<'a> {
    input: &'a dyn Input,
    pos: u64,
    end: u64,
}

impl Read for At<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let room = usize::try_from(self.end.saturating_sub(self.pos)).unwrap_or(usize::MAX);
        let want = buf.len().min(room);
        let n = storage::read_up_to_at(self.input, &mut buf[..want], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Source for At<'_> {
    fn skip(&mut self, n: u64) -> io::Result<u64> {
        self.pos = self
            .pos
            .checked_add(n)
            .context("skip too far")
            .map_err(io::Error::other)?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tar::testing::tar_of;

    #[test]
    fn whole_samples_pass_and_other_ranges_are_refused() {
        let tar = tar_of(&[
            ("a.txt", b"hello"),
            ("a.json", &[7u8; 700]),
            ("b.txt", b"x"),
        ]);
        // a: header+1 block, header+2 blocks; b: header+1 block.
        let (a, b) = (0..512 * 5, 512 * 5..512 * 7);
        check_sample_bytes(&tar[a.clone()], 0).unwrap();
        check_sample_bytes(&tar[b.clone()], b.start as u64).unwrap();
        let refused = |range: std::ops::Range<usize>, needle: &str| {
            let got = check_sample_bytes(&tar[range.clone()], range.start as u64);
            let e = format!("{:#}", got.expect_err(&format!("{range:?} passed")));
            assert!(e.contains(needle), "{range:?}: {e}");
        };
        refused(0..512 * 7, "more than one sample");
        refused(0..512 * 4, "truncated");
        refused(512..512 * 5, "byte offset 512: expected a tar header");
        refused(
            512 * 5..512 * 8,
            "byte offset 3584: the sample's members end here",
        );
        refused(512 * 7..512 * 8, "end-of-archive marker");
        refused(512 * 3..512 * 5, "byte offset 1536");
        // One member of a sample is a range of whole members too: its key is not recorded.
        check_sample_bytes(&tar[512 * 2..512 * 5], 1024).unwrap();
        // The same through positioned reads of a file.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.tar");
        std::fs::write(&path, &tar).unwrap();
        let input = storage::source(&path).open(&path).unwrap();
        check_sample_at(input.as_ref(), 0, a.len() as u64).unwrap();
        for (len, needle) in [(512 * 6, "byte offset 2560"), (512 * 4, "truncated")] {
            let e = format!("{:#}", check_sample_at(input.as_ref(), 0, len).unwrap_err());
            assert!(e.contains(needle), "{len}: {e}");
        }
    }
}
