//! Verify's own walk of a tar's members, for the question "which members does this shard hold".
//!
//! It shares no code with the run's reader (`tar::headers`, `tar::group`): written plainly from
//! POSIX, it is fed the stream's bytes as verify reads them anyway (a tap on the reader, no second
//! pass) and lists every member with its extent. Verify then requires every regular file with a
//! sample key to lie inside one sample the run's reader found, and every sample to start and end
//! at a member's boundary: a member the run's reader passed over (as it once passed over the
//! member behind a directory header with a size) is found here, not confirmed.

use std::io::{self, Read};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Result;

use crate::tar::key::sample_key;
use crate::tar::{Sample, TarStream};

/// A member as this walk found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Scanned {
    /// Its first record (extension records included) and the end of its last.
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) name: Vec<u8>,
    /// A regular file (type `0`, NUL, `7` or `S`, not named like a directory).
    pub(super) regular: bool,
}

/// Where the walk is in the stream.
enum State {
    /// Collecting a header block.
    Header,
    /// Passing `left` bytes of data; `keep` collects an extension record's content.
    Data { left: u64, keep: Option<Vec<u8>> },
    /// Old GNU sparse extension blocks follow while the last one's flag said so.
    SparseExt,
    /// The end-of-archive marker, or a header this walk cannot read.
    Done,
}

/// The walk, fed the stream's bytes in order.
pub(super) struct MemberScan {
    state: State,
    block: Vec<u8>,
    /// Stream offset of the next byte fed.
    pos: u64,
    ignore_zeros: bool,
    /// The member being read: its first record's offset, the extension's typeflag kept.
    start: Option<u64>,
    ext_type: u8,
    long_name: Option<Vec<u8>>,
    pax_path: Option<Vec<u8>>,
    pax_size: Option<u64>,
    /// The member whose data is being passed.
    open: Option<Scanned>,
    pub(super) members: Vec<Scanned>,
    /// Why the walk stopped early, if it did.
    pub(super) stopped: Option<String>,
}

impl MemberScan {
    pub(super) fn new(ignore_zeros: bool) -> Self {
        MemberScan {
            state: State::Header,
            block: Vec::with_capacity(512),
            pos: 0,
            ignore_zeros,
            start: None,
            ext_type: 0,
            long_name: None,
            pax_path: None,
            pax_size: None,
            open: None,
            members: Vec::new(),
            stopped: None,
        }
    }

    /// Feeds the next bytes of the stream.
    pub(super) fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match &mut self.state {
                State::Done => return,
                State::Data { left, keep } => {
                    let n = bytes
                        .len()
                        .min(usize::try_from(*left).unwrap_or(usize::MAX));
                    if let Some(k) = keep {
                        k.extend_from_slice(&bytes[..n]);
                    }
                    *left -= n as u64;
                    self.pos += n as u64;
                    bytes = &bytes[n..];
                    if *left == 0 {
                        let State::Data { keep, .. } =
                            std::mem::replace(&mut self.state, State::Header)
                        else {
                            unreachable!()
                        };
                        self.data_done(keep);
                    }
                }
                State::Header | State::SparseExt => {
                    let n = bytes.len().min(512 - self.block.len());
                    self.block.extend_from_slice(&bytes[..n]);
                    self.pos += n as u64;
                    bytes = &bytes[n..];
                    if self.block.len() == 512 {
                        let block = std::mem::take(&mut self.block);
                        if matches!(self.state, State::SparseExt) {
                            self.sparse_block(&block);
                        } else {
                            self.header(&block, self.pos - 512);
                        }
                    }
                }
            }
        }
    }

    /// The stream ended: the member whose data was being passed is cut short.
    pub(super) fn finish(mut self) -> Self {
        if matches!(self.state, State::Data { .. } | State::SparseExt) {
            self.stopped = Some(format!(
                "byte offset {}: the stream ends inside a member",
                self.pos
            ));
        }
        self
    }

    fn header(&mut self, h: &[u8], at: u64) {
        if h.iter().all(|&b| b == 0) {
            if !self.ignore_zeros {
                self.state = State::Done;
            }
            return;
        }
        let Some(size) = number(&h[124..136]) else {
            self.stopped = Some(format!(
                "byte offset {at}: a size field that is not a number"
            ));
            self.state = State::Done;
            return;
        };
        let typeflag = h[156];
        self.start.get_or_insert(at);
        if matches!(typeflag, b'x' | b'X' | b'L' | b'K' | b'g') {
            self.ext_type = typeflag;
            let keep = matches!(typeflag, b'x' | b'X' | b'L').then(Vec::new);
            self.pass(size, keep);
            if typeflag == b'g' {
                self.start = None; // an entry of its own, no part of the next member
            }
            return;
        }
        let name = self.name(h);
        let regular = matches!(typeflag, b'0' | 0 | b'7' | b'S') && !name.ends_with(b"/");
        let stored = match typeflag {
            // POSIX: no data records follow links, devices, directories and FIFOs.
            b'1'..=b'6' => 0,
            _ => self.pax_size.take().unwrap_or(size),
        };
        self.open = Some(Scanned {
            start: self.start.take().unwrap_or(at),
            end: 0,
            name,
            regular,
        });
        self.ext_type = 0;
        if typeflag == b'S' && h[482] != 0 {
            self.state = State::SparseExt;
            self.pax_size = Some(stored); // kept for after the extension blocks
            return;
        }
        self.pass(stored, None);
    }

    fn sparse_block(&mut self, b: &[u8]) {
        if b[504] == 0 {
            let stored = self.pax_size.take().unwrap_or(0);
            self.state = State::Header;
            self.pass(stored, None);
        }
    }

    /// Passes `size` bytes of data and their padding (keeping them when `keep`).
    fn pass(&mut self, size: u64, keep: Option<Vec<u8>>) {
        let left = size.div_ceil(512).saturating_mul(512);
        if left == 0 {
            self.data_done(keep);
        } else {
            self.state = State::Data { left, keep };
        }
    }

    fn data_done(&mut self, keep: Option<Vec<u8>>) {
        if let Some(data) = keep {
            match self.ext_type {
                b'L' => {
                    let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
                    self.long_name = Some(data[..end].to_vec());
                }
                _ => self.pax_records(&data),
            }
            return;
        }
        if let Some(mut m) = self.open.take() {
            m.end = self.pos;
            self.members.push(m);
        }
    }

    /// The records `LEN key=value\n` of a PAX header: the path and sizes of the next member.
    fn pax_records(&mut self, mut data: &[u8]) {
        while let Some(space) = data.iter().position(|&b| b == b' ') {
            let len = std::str::from_utf8(&data[..space])
                .ok()
                .and_then(|s| s.parse::<usize>().ok());
            let Some(len) = len.filter(|&l| l > space && l <= data.len()) else {
                return;
            };
            let record = &data[space + 1..len];
            let record = record.strip_suffix(b"\n").unwrap_or(record);
            data = &data[len..];
            let Some(eq) = record.iter().position(|&b| b == b'=') else {
                continue;
            };
            let value = &record[eq + 1..];
            match &record[..eq] {
                b"path" | b"GNU.sparse.name" => self.pax_path = Some(value.to_vec()),
                b"size" => {
                    self.pax_size = std::str::from_utf8(value).ok().and_then(|s| s.parse().ok());
                }
                _ => {}
            }
        }
    }

    /// The member's name: a PAX path (or sparse name), a GNU long name, or the header's.
    fn name(&mut self, h: &[u8]) -> Vec<u8> {
        if let Some(p) = self.pax_path.take() {
            self.long_name = None;
            return p;
        }
        if let Some(p) = self.long_name.take() {
            return p;
        }
        let field = |f: &[u8]| f[..f.iter().position(|&b| b == 0).unwrap_or(f.len())].to_vec();
        let name = field(&h[..100]);
        let prefix = field(&h[345..500]);
        if &h[257..263] == b"ustar\0" && !prefix.is_empty() {
            [prefix, b"/".to_vec(), name].concat()
        } else {
            name
        }
    }
}

/// A numeric header field: octal digits (spaces and NULs around them), or base-256.
fn number(f: &[u8]) -> Option<u64> {
    if f[0] & 0x80 != 0 {
        return f[1..].iter().try_fold(u64::from(f[0] & 0x7f), |n, &b| {
            n.checked_mul(256)?.checked_add(u64::from(b))
        });
    }
    let digits: Vec<u8> = f
        .iter()
        .copied()
        .take_while(|&b| b != 0)
        .filter(|&b| b != b' ')
        .collect();
    digits.iter().try_fold(0u64, |n, &d| {
        (b'0'..=b'7').contains(&d).then_some(())?;
        n.checked_mul(8)?.checked_add(u64::from(d - b'0'))
    })
}

/// A reader that feeds every byte it returns to a [`MemberScan`].
pub(super) struct Tapped<R> {
    pub(super) inner: R,
    pub(super) scan: Arc<Mutex<MemberScan>>,
}

impl<R: Read> Read for Tapped<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.scan
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .feed(&buf[..n]);
        Ok(n)
    }
}

/// Opens the shard at `path` for reading front to back, with this walk fed every byte read.
///
/// # Errors
/// As [`TarStream::open`].
pub(super) fn open_scanned(
    path: &Path,
    ignore_zeros: bool,
) -> Result<(TarStream, Arc<Mutex<MemberScan>>)> {
    let scan = Arc::new(Mutex::new(MemberScan::new(ignore_zeros)));
    let tap = Arc::clone(&scan);
    let stream = TarStream::open_with(path, move |inner| Box::new(Tapped { inner, scan: tap }))?;
    Ok((stream, scan))
}

/// Reads the rest of `stream` into its walk, and returns where the walk's members and
/// `samples` disagree, each message naming the shard and the byte offset.
///
/// # Errors
/// A read fails.
pub(super) fn scan_problems(
    mut stream: TarStream,
    scan: &Mutex<MemberScan>,
    samples: &[Sample],
) -> Result<Vec<String>> {
    stream.read(u64::MAX, |_| {})?;
    let name = stream.name().to_string();
    drop(stream);
    let mut scan = scan.lock().unwrap_or_else(PoisonError::into_inner);
    let done = std::mem::replace(&mut *scan, MemberScan::new(false)).finish();
    Ok(disagreements(&done, samples, |n| sample_key(n).is_some())
        .into_iter()
        .map(|p| format!("{name}: {p}"))
        .collect())
}

/// Where this walk's members and the run reader's samples disagree: a regular file with a
/// sample key outside every sample, or a sample that does not start or end at a member's
/// boundary. `key_of` gives a member name's sample key.
pub(super) fn disagreements(
    scan: &MemberScan,
    samples: &[Sample],
    key_of: impl Fn(&[u8]) -> bool,
) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(why) = &scan.stopped {
        out.push(format!("{why} (verify's own walk of the tar)"));
    }
    let starts: std::collections::BTreeSet<u64> = scan.members.iter().map(|m| m.start).collect();
    let ends: std::collections::BTreeSet<u64> = scan.members.iter().map(|m| m.end).collect();
    for s in samples {
        if !starts.contains(&s.start) || !ends.contains(&(s.start + s.len)) {
            out.push(format!(
                "byte offset {}: the sample of {} bytes there does not start and end where members do (verify's own walk of the tar disagrees with the reader that indexed it)",
                s.start, s.len
            ));
        }
    }
    let mut i = 0;
    for m in scan.members.iter().filter(|m| m.regular && key_of(&m.name)) {
        while i < samples.len() && samples[i].start + samples[i].len <= m.start {
            i += 1;
        }
        let inside = samples
            .get(i)
            .is_some_and(|s| s.start <= m.start && m.end <= s.start + s.len);
        if !inside {
            out.push(format!(
                "byte offset {}: member {:?}, a regular file with a sample key, is in no sample (verify's own walk of the tar found it; the reader that indexed the shard did not)",
                m.start,
                String::from_utf8_lossy(&m.name)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tar::testing::{header, padded, tar_of};

    fn scan(bytes: &[u8], piece: usize) -> MemberScan {
        let mut s = MemberScan::new(false);
        for p in bytes.chunks(piece) {
            s.feed(p);
        }
        s.finish()
    }

    #[test]
    fn members_are_found_whatever_the_piece_sizes() {
        let bytes = tar_of(&[
            ("a.jpg", &[1; 700]),
            ("a.cls", b"1"),
            (&"d/".repeat(60), b""),
        ]);
        for piece in [1, 7, 512, 4096] {
            let s = scan(&bytes, piece);
            let got: Vec<(u64, u64)> = s.members.iter().map(|m| (m.start, m.end)).collect();
            assert_eq!(got, [(0, 1536), (1536, 2560), (2560, 4096)], "{piece}");
            assert_eq!(s.members[2].name, "d/".repeat(60).into_bytes());
        }
    }

    #[test]
    fn a_member_behind_a_directory_with_a_size_is_found_outside_the_samples() {
        let bytes = [
            header("d", b'5', 1024, b"ustar\x0000").to_vec(),
            header("b.txt", b'0', 1, b"ustar\x0000").to_vec(),
            padded(b"B"),
            header("c.txt", b'0', 1, b"ustar\x0000").to_vec(),
            padded(b"C"),
            vec![0; 1024],
        ]
        .concat();
        let s = scan(&bytes, 100);
        // What a reader that skipped the directory's "data" indexed: c alone.
        let samples = [Sample {
            start: 1536,
            len: 1024,
        }];
        let found = disagreements(&s, &samples, |n| n.contains(&b'.'));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("byte offset 512: member \"b.txt\""),
            "{found:?}"
        );
        let samples = [
            Sample {
                start: 512,
                len: 1024,
            },
            Sample {
                start: 1536,
                len: 1024,
            },
        ];
        assert!(disagreements(&s, &samples, |n| n.contains(&b'.')).is_empty());
        let bad = [Sample {
            start: 512,
            len: 1536,
        }];
        assert!(!disagreements(&s, &bad, |n| n.contains(&b'.')).is_empty());
    }
}
