//! [`HeaderReader`]: the reader under a plain shard's header walk, sized for reads that skip
//! over member data.

use std::io::{self, Read, Seek, SeekFrom};

/// Read size where the walk jumps far: one page holds a sample's small members and the next
/// header.
const PAGE: usize = 4096;
/// Read size where headers are close together: one request reads through many small members.
const THROUGH: usize = 128 << 10;
/// A jump longer than this is cheaper as a request of its own than read through (on this
/// project's disk a request costs ~20 µs at 32 in flight, the time to read ~30 KiB).
const FAR: u64 = 32 << 10;
/// The walk counts as jumping far until this many short jumps follow a long one: a sample's
/// small members sit between the long jumps over its large ones.
const RECENT: u8 = 8;

/// A reader for walking tar headers with the kernel's readahead off (see
/// [`crate::tar::index_file_with`]). It decides the read sizes itself: one page where the walk
/// jumps far (large members' data skipped), 128 KiB where headers follow each other closely
/// (small members, read through). Seeks inside the buffer cost no system call, so the storage
/// sees about one request per large member, or per 128 KiB of small ones.
pub struct HeaderReader<R> {
    inner: R,
    buf: Vec<u8>,
    /// File offset of `buf[0]`, and how many bytes of `buf` hold data.
    start: u64,
    filled: usize,
    /// The logical position, and where `inner`'s cursor is.
    pos: u64,
    inner_pos: u64,
    /// Short jumps left before the walk no longer counts as jumping far.
    far: u8,
}

impl<R: Read + Seek> HeaderReader<R> {
    /// Reads `inner` from offset 0, where it must be positioned.
    pub fn new(inner: R) -> Self {
        HeaderReader {
            inner,
            buf: vec![0; THROUGH],
            start: 0,
            filled: 0,
            pos: 0,
            inner_pos: 0,
            far: RECENT,
        }
    }

    fn buffered(&self) -> std::ops::Range<u64> {
        self.start..self.start + self.filled as u64
    }
}

impl<R: Read + Seek> Read for HeaderReader<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if !self.buffered().contains(&self.pos) {
            if self.inner_pos != self.pos {
                self.inner.seek(SeekFrom::Start(self.pos))?;
                self.inner_pos = self.pos;
            }
            let want = if self.far > 0 { PAGE } else { THROUGH };
            if out.len() >= want {
                let n = self.inner.read(out)?;
                self.inner_pos += n as u64;
                self.pos += n as u64;
                return Ok(n);
            }
            // Invalid until the read succeeds: a failed read may have written into it.
            self.filled = 0;
            let n = self.inner.read(&mut self.buf[..want])?;
            self.inner_pos += n as u64;
            (self.start, self.filled) = (self.pos, n);
            if n == 0 {
                return Ok(0);
            }
        }
        let from = (self.pos - self.start) as usize;
        let n = out.len().min(self.filled - from);
        out[..n].copy_from_slice(&self.buf[from..from + n]);
        self.pos += n as u64;
        Ok(n)
    }
}

impl<R: Read + Seek> Seek for HeaderReader<R> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let target = match to {
            SeekFrom::Start(p) => p,
            SeekFrom::Current(d) => self.pos.checked_add_signed(d).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "seek before the start of the file",
                )
            })?,
            SeekFrom::End(_) => {
                self.pos = self.inner.seek(to)?;
                self.inner_pos = self.pos;
                self.far = RECENT;
                return Ok(self.pos);
            }
        };
        if target < self.pos || target - self.pos >= FAR {
            self.far = RECENT;
        } else {
            self.far = self.far.saturating_sub(1);
        }
        self.pos = target;
        Ok(target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tar::index::index_reader;
    use crate::tar::testing::tar_of;
    use std::io::Cursor;

    /// Counts the reads that reach the underlying reader, and the bytes they return.
    struct Counting<R> {
        inner: R,
        reads: usize,
        bytes: usize,
    }

    impl<R: Read> Read for Counting<R> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.inner.read(buf)?;
            self.reads += 1;
            self.bytes += n;
            Ok(n)
        }
    }

    impl<R: Seek> Seek for Counting<R> {
        fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
            self.inner.seek(to)
        }
    }

    /// Indexes `members` through a counting reader: (samples, reads, bytes read, archive size).
    fn reads_to_index(members: &[(String, Vec<u8>)]) -> (usize, usize, usize, usize) {
        let refs: Vec<(&str, &[u8])> = members
            .iter()
            .map(|(n, d)| (n.as_str(), d.as_slice()))
            .collect();
        let bytes = tar_of(&refs);
        let mut counting = Counting {
            inner: Cursor::new(&bytes),
            reads: 0,
            bytes: 0,
        };
        let idx = index_reader(HeaderReader::new(&mut counting), bytes.len() as u64).unwrap();
        (
            idx.samples.len(),
            counting.reads,
            counting.bytes,
            bytes.len(),
        )
    }

    #[test]
    fn header_reader_reads_a_page_per_large_member_and_through_small_ones() {
        // Large members: one page-sized read each, not the data.
        let members: Vec<(String, Vec<u8>)> = (0..200)
            .flat_map(|i| {
                [
                    (format!("s{i:04}.jpg"), vec![7u8; 100 << 10]),
                    (format!("s{i:04}.cls"), b"3".to_vec()),
                ]
            })
            .collect();
        let (samples, reads, bytes, size) = reads_to_index(&members);
        assert_eq!(samples, 200);
        assert!(
            reads <= 202 && bytes <= 202 * PAGE,
            "{reads} reads, {bytes} of {size} B"
        );
        // Small members: read through in large requests, not one per member or per page.
        let members: Vec<(String, Vec<u8>)> = (0..5000)
            .flat_map(|i| {
                [
                    (format!("s{i:05}.txt"), vec![1u8; 100]),
                    (format!("s{i:05}.cls"), b"3".to_vec()),
                ]
            })
            .collect();
        let (samples, reads, bytes, size) = reads_to_index(&members);
        assert_eq!(samples, 5000);
        // +4: one more than before for what follows the end-of-archive marker (data there is
        // an error unless --ignore-zeros).
        assert!(
            reads <= size / THROUGH + 4 && bytes <= size,
            "{reads} reads, {bytes} of {size} B"
        );
    }

    #[test]
    fn header_reader_returns_the_bytes_at_every_position() {
        let data: Vec<u8> = (0..600_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut r = HeaderReader::new(Cursor::new(&data));
        let mut state = 12345u64;
        let mut next = |m: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % m
        };
        let mut pos = 0u64;
        for _ in 0..2000 {
            match next(4) {
                0 => pos = r.seek(SeekFrom::Start(next(data.len() as u64))).unwrap(),
                1 => {
                    let d = next(300_000) as i64 - 100_000;
                    if let Some(to) = pos.checked_add_signed(d) {
                        pos = r.seek(SeekFrom::Current(d)).unwrap();
                        assert_eq!(pos, to);
                    }
                }
                _ => {
                    let mut out = vec![0u8; next(200_000) as usize + 1];
                    let n = r.read(&mut out).unwrap();
                    let at = (pos as usize).min(data.len());
                    assert_eq!(&out[..n], &data[at..at + n], "at {pos}");
                    assert!(n > 0 || pos as usize >= data.len());
                    pos += n as u64;
                }
            }
        }
    }
}
