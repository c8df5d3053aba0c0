//! The header walk: every record of a tar archive, read from its headers alone, with the extent
//! the archive *stores* for it.
//!
//! A member's extent is its extension records (PAX `x`, GNU long names `L`/`K`), its header, any
//! GNU sparse extension blocks, and its stored data blocks. The stored size is what the header's
//! size field (or a PAX `size` record) says; for a sparse member that is the size of its data
//! regions (and, in GNU sparse 1.0, its map), not the file size with its holes, which a tar
//! library reports as the member's size. A member's path is its real name: `GNU.sparse.name`,
//! then PAX `path`, then a GNU long name, then the ustar prefix and name.
//!
//! The walk reads what every POSIX reader reads: ustar, old GNU, GNU and PAX headers, checksums
//! over unsigned or signed bytes, octal or base-256 numbers. It stops at the first zero block (the
//! end-of-archive marker) or at the end of the input; [`Walk::trailing`] then tells whether data
//! follows the marker (concatenated archives, a lone zero block). With [`Walk::ignoring_zeros`]
//! it reads past zero blocks to the end of the input, as GNU tar's `--ignore-zeros` does.

use std::io::{self, Read, Seek, SeekFrom};

use anyhow::{bail, Context, Result};

use crate::sys::read_up_to;
pub(crate) use crate::tar::entry_type::EntryKind;
use crate::tar::entry_type::{self, Extension, Record};
use crate::tar::fields::{check_header, header_path, numeric, until_nul};
pub(crate) use crate::tar::fields::{describe_start, expect_header};
use crate::tar::pax::{apply_pax, nonempty_name, Pending};

/// A tar record's size.
pub(crate) const BLOCK: u64 = 512;
/// Largest PAX extended header or GNU long name accepted: a garbled size field must not make the
/// walk allocate gigabytes.
const MAX_EXTENSION: u64 = 16 << 20;

/// One member of the archive as the walk found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    /// Where its first record starts: the end of the previous member, so that its extension
    /// records are included.
    pub(crate) start: u64,
    /// Where its own header is.
    pub(crate) header: u64,
    /// Where its stored data starts.
    pub(crate) data: u64,
    /// Stored data bytes (without the padding to a whole block).
    pub(crate) stored: u64,
    /// The end of its last record, padding included: where the next member starts.
    pub(crate) end: u64,
    pub(crate) kind: EntryKind,
    /// Its real path (see the module docs).
    pub(crate) path: Vec<u8>,
    /// A link's target (PAX `linkpath`, a GNU long link name, or the header's link name).
    pub(crate) link: Vec<u8>,
    /// Whether its data is stored sparse (old GNU `S`, or a GNU sparse PAX member): the stored
    /// bytes are not the file's bytes.
    pub(crate) sparse: bool,
}

impl Member {
    /// The path for messages.
    pub(crate) fn name(&self) -> String {
        String::from_utf8_lossy(&self.path).into_owned()
    }
}

/// Where the walk reads from: a file it can seek in, or a forward-only stream.
pub(crate) trait Source: Read {
    /// Moves `n` bytes forward, returning how many bytes there were to pass (fewer at the end of
    /// a stream; a seekable source may not know and return `n`).
    ///
    /// # Errors
    /// The underlying read or seek fails.
    fn skip(&mut self, n: u64) -> io::Result<u64>;
}

/// A [`Source`] over a seekable reader: skips are seeks.
pub(crate) struct Seekable<R>(pub(crate) R);

impl<R: Read> Read for Seekable<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl<R: Read + Seek> Source for Seekable<R> {
    fn skip(&mut self, n: u64) -> io::Result<u64> {
        let d = i64::try_from(n).map_err(|_| io::Error::other("skip too far"))?;
        self.0.seek(SeekFrom::Current(d))?;
        Ok(n)
    }
}

/// A [`Source`] over a forward-only stream (a decompressor): skips read and discard.
pub(crate) struct Forward<R>(pub(crate) R);

impl<R: Read> Read for Forward<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl<R: Read> Source for Forward<R> {
    fn skip(&mut self, n: u64) -> io::Result<u64> {
        io::copy(&mut (&mut self.0).take(n), &mut io::sink())
    }
}

/// Walks an archive's headers, one [`Member`] at a time.
pub(crate) struct Walk<S> {
    src: S,
    /// The length of the input, where it is known (a plain file): data past it is truncation.
    len: Option<u64>,
    /// Where the source is.
    pos: u64,
    /// Where the next member starts.
    next: u64,
    done: bool,
    /// Read past zero blocks instead of stopping at the first.
    ignore_zeros: bool,
    /// Runs of zero blocks read past with a member after them.
    zero_runs: u64,
    /// Where the first zero block was, when the walk stopped at it.
    marker: Option<u64>,
}

/// Data after the end-of-archive marker, as [`Walk::trailing`] finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Trailing {
    /// The first zero block's offset.
    pub(crate) marker: u64,
    /// The first byte that is not zero after it.
    pub(crate) data_at: u64,
    /// How many bytes follow the first zero block (to the end of the input).
    pub(crate) after: u64,
}

impl Trailing {
    /// The message: where, what follows, and what to do. The caller adds the file.
    pub(crate) fn describe(&self) -> String {
        let Trailing {
            marker,
            data_at,
            after,
        } = *self;
        let what = if data_at == marker + BLOCK {
            "a lone zero block"
        } else {
            "zero blocks"
        };
        format!(
            "byte offset {marker}: data after the end-of-archive marker: {what} followed by {after} more bytes, with data from byte offset {data_at} (concatenated archives, as `cat a.tar b.tar` makes, or a damaged shard); tar readers stop at the marker, so the samples there would be lost. For an input, rerun with --ignore-zeros to read past zero blocks (as GNU tar --ignore-zeros does), or repair the shard"
        )
    }
}

impl<S: Source> Walk<S> {
    /// A walk over `src`, positioned at the archive's first byte; `len` is the input's length
    /// when known.
    pub(crate) fn new(src: S, len: Option<u64>) -> Self {
        Walk {
            src,
            len,
            pos: 0,
            next: 0,
            done: false,
            ignore_zeros: false,
            zero_runs: 0,
            marker: None,
        }
    }

    /// A walk over the bytes `start..end` of an archive, `src` positioned at `start`: offsets
    /// (and messages) are the archive's, and data past `end` is truncation.
    pub(crate) fn within(src: S, start: u64, end: u64) -> Self {
        Walk {
            pos: start,
            next: start,
            ..Walk::new(src, Some(end))
        }
    }

    /// Makes the walk read past zero blocks (GNU tar's `--ignore-zeros`) when `yes`: members
    /// after them are returned, each starting at its own header, never at the zeros.
    #[must_use]
    pub(crate) fn ignoring_zeros(mut self, yes: bool) -> Self {
        self.ignore_zeros = yes;
        self
    }

    /// How many runs of zero blocks the walk read past with a member after them.
    pub(crate) fn zero_runs(&self) -> u64 {
        self.zero_runs
    }

    /// Once [`Walk::next_member`] returned `None`: reads the rest of the input after the
    /// end-of-archive marker, and returns what follows it if that is not all zeros. A
    /// forward-only source (a decompressor) is read to its end, so that its checksum is checked;
    /// a seekable one up to the first byte that is not zero.
    ///
    /// # Errors
    /// A read fails (a compressed stream whose checksum does not match fails here).
    pub(crate) fn trailing(&mut self) -> Result<Option<Trailing>> {
        let Some(marker) = self.marker else {
            // No marker (the input ended) or zeros read past: the input was read to its end.
            return Ok(None);
        };
        if self.len.is_some_and(|len| self.pos >= len) {
            // The marker ends the file: no read needed to know it.
            return Ok(None);
        }
        let mut buf = vec![0u8; 64 << 10];
        let mut data_at = None;
        loop {
            let got = self
                .src
                .read(&mut buf)
                .with_context(|| format!("byte offset {}: cannot read", self.pos))?;
            if got == 0 {
                break;
            }
            if data_at.is_none() {
                data_at = buf[..got]
                    .iter()
                    .position(|&b| b != 0)
                    .map(|i| self.pos + i as u64);
            }
            self.pos += got as u64;
            if data_at.is_some() && self.len.is_some() {
                break;
            }
        }
        let end = self.len.unwrap_or(self.pos);
        Ok(data_at.map(|data_at| Trailing {
            marker,
            data_at,
            after: end.saturating_sub(marker + BLOCK),
        }))
    }

    /// Where the walk is: the end of the last member returned (where the next record starts).
    pub(crate) fn offset(&self) -> u64 {
        self.next
    }

    /// The next member, or `None` at the end of the archive.
    ///
    /// # Errors
    /// A header that is not one (bad checksum, a field that is not a number), an archive that
    /// ends inside a header or a member's data, an extension record with no member after it.
    /// Messages start with the byte offset of the record at fault.
    pub(crate) fn next_member(&mut self) -> Result<Option<Member>> {
        if self.done {
            return Ok(None);
        }
        self.seek_to(self.next)?;
        let mut pending = Pending::default();
        let mut zeros = false;
        loop {
            let at = self.pos;
            let Some(block) = self.read_block()? else {
                if pending.start.is_some() {
                    bail!("byte offset {at}: the archive ends after an extension header, before its member's header (truncated tar)");
                }
                self.done = true;
                return Ok(None);
            };
            if block.iter().all(|&b| b == 0) {
                if let Some(s) = pending.start {
                    bail!("byte offset {at}: expected the header of the member whose extension records start at byte {s}, found the end-of-archive marker");
                }
                if self.ignore_zeros {
                    zeros = true;
                    continue;
                }
                self.done = true;
                self.marker = Some(at);
                return Ok(None);
            }
            check_header(&block, at)?;
            if std::mem::take(&mut zeros) {
                self.zero_runs += 1;
            }
            let typeflag = block[156];
            let size = numeric(&block[124..136])
                .with_context(|| format!("byte offset {at}: header field 'size'"))?;
            match entry_type::record(typeflag) {
                Record::Extension(ext) => {
                    pending.start.get_or_insert(at);
                    let data = self.read_extension(at, size)?;
                    match ext {
                        Extension::Pax => apply_pax(&data, &mut pending, at)?,
                        Extension::LongName => {
                            pending.long_name = Some(nonempty_name(&data, at)?);
                        }
                        Extension::LongLink => pending.long_link = Some(until_nul(&data).to_vec()),
                    }
                    continue;
                }
                Record::Refused(why) => bail!(
                    "byte offset {at}: member {:?} (type '{}') is {why}",
                    String::from_utf8_lossy(until_nul(&block[..100])),
                    char::from(typeflag).escape_default()
                ),
                Record::Entry(EntryKind::GlobalHeader) => self.check_global(at, size)?,
                Record::Entry(_) => {}
            }
            return self.member(&block, at, size, pending).map(Some);
        }
    }

    /// Reads the stored data of `member`, the member [`Walk::next_member`] just returned.
    ///
    /// # Errors
    /// The input ends before the data does.
    pub(crate) fn read_data(&mut self, member: &Member) -> Result<Vec<u8>> {
        self.seek_to(member.data)?;
        let len = usize::try_from(member.stored).context("member too large")?;
        let mut buf = vec![0; len];
        let got = read_up_to(&mut self.src, &mut buf)
            .with_context(|| format!("byte offset {}: cannot read", member.data))?;
        self.pos += got as u64;
        if got < len {
            bail!(
                "byte offset {}: truncated tar: member {:?} needs {} bytes of data but the input ends at byte {}",
                member.header,
                member.name(),
                member.stored,
                self.pos
            );
        }
        Ok(buf)
    }

    /// The member whose header `block` is at `at`, after the extension records in `pending`.
    fn member(&mut self, block: &[u8; 512], at: u64, size: u64, p: Pending) -> Result<Member> {
        let kind = EntryKind::of(block[156]);
        let path = p
            .sparse_name
            .or(p.pax_path)
            .or(p.long_name)
            .unwrap_or_else(|| header_path(block));
        let stored = entry_type::stored_size(block[156], &path, p.pax_size.unwrap_or(size))
            .map_err(|why| {
                anyhow::anyhow!(
                    "byte offset {at}: member {:?} is {why}",
                    String::from_utf8_lossy(&path)
                )
            })?;
        let mut data = at + BLOCK;
        if kind == EntryKind::Sparse {
            // Old GNU sparse: the header holds four regions, and a flag at byte 482 says that a
            // 512-byte extension block of 21 more follows, each with its own flag at byte 504.
            let mut extended = block[482] != 0;
            while extended {
                let ext_at = self.pos;
                let Some(ext) = self.read_block()? else {
                    bail!("byte offset {ext_at}: truncated tar: the archive ends before the sparse extension block of the member at byte {at}");
                };
                extended = ext[504] != 0;
                data += BLOCK;
            }
        }
        let end = stored
            .checked_add(BLOCK - 1)
            .and_then(|s| data.checked_add(s / BLOCK * BLOCK))
            .with_context(|| format!("byte offset {at}: member size {stored} overflows"))?;
        // Only links have a target worth a copy (the walk runs once per member).
        let link = match kind {
            EntryKind::HardLink | EntryKind::Symlink => p
                .pax_link
                .or(p.long_link)
                .unwrap_or_else(|| until_nul(&block[157..257]).to_vec()),
            _ => Vec::new(),
        };
        let member = Member {
            start: p.start.unwrap_or(at),
            header: at,
            data,
            stored,
            end,
            kind,
            path,
            link,
            sparse: kind == EntryKind::Sparse || p.pax_sparse,
        };
        if let Some(len) = self.len.filter(|&l| end > l) {
            bail!(
                "byte offset {at}: truncated tar: member {:?} needs {stored} bytes of data but the file ends at byte {len}",
                member.name()
            );
        }
        self.next = end;
        Ok(member)
    }

    /// Reads the records of the PAX global header at `at`: readers that apply them (tarfile)
    /// would rename or resize every member after it, and GNU tar refuses malformed ones that
    /// bsdtar and tarfile ignore, so either is an error.
    fn check_global(&mut self, at: u64, size: u64) -> Result<()> {
        let data = self.read_extension(at, size)?;
        let mut p = Pending::default();
        apply_pax(&data, &mut p, at)
            .context("a PAX global header (GNU tar refuses it, bsdtar and tarfile ignore it)")?;
        if p.pax_path.is_some()
            || p.pax_link.is_some()
            || p.pax_size.is_some()
            || p.sparse_name.is_some()
            || p.pax_sparse
        {
            bail!("byte offset {at}: a PAX global header that sets a member's path, link target, size or sparse map: readers that apply it (tarfile) would read every member after it differently from those that do not");
        }
        Ok(())
    }

    /// The data of an extension record whose header is at `at`.
    fn read_extension(&mut self, at: u64, size: u64) -> Result<Vec<u8>> {
        if size > MAX_EXTENSION {
            bail!("byte offset {at}: an extension header of {size} bytes (more than {MAX_EXTENSION}); expected a PAX header or GNU long name");
        }
        let padded = size.div_ceil(BLOCK) * BLOCK;
        let mut buf = vec![0; padded as usize];
        let got = read_up_to(&mut self.src, &mut buf)
            .with_context(|| format!("byte offset {at}: cannot read"))?;
        self.pos += got as u64;
        if (got as u64) < padded {
            bail!("byte offset {at}: truncated tar: an extension header needs {size} bytes but the input ends at byte {}", self.pos);
        }
        if let Some(i) = buf[size as usize..].iter().position(|&b| b != 0) {
            bail!(
                "byte offset {at}: an extension header of {size} bytes with data in its padding (byte offset {}): tarfile and GNU tar read a name or records past its size, to the first NUL, where others stop at its size; expected zeros after {size} bytes",
                at + BLOCK + size + i as u64
            );
        }
        buf.truncate(size as usize);
        Ok(buf)
    }

    /// One 512-byte block, or `None` at the end of the input.
    fn read_block(&mut self) -> Result<Option<[u8; 512]>> {
        let at = self.pos;
        let mut block = [0u8; 512];
        let got = read_up_to(&mut self.src, &mut block)
            .with_context(|| format!("byte offset {at}: cannot read"))?;
        self.pos += got as u64;
        match got {
            0 => Ok(None),
            512 => Ok(Some(block)),
            n if at == 0 => bail!(
                "byte offset 0: not a tar archive (expected a tar archive's first header): the input is only {n} bytes, and {}",
                describe_start(&block[..n])
            ),
            n => bail!("byte offset {at}: expected a tar header, but the input ends {n} bytes into it (truncated tar)"),
        }
    }

    fn seek_to(&mut self, to: u64) -> Result<()> {
        if to == self.pos {
            return Ok(());
        }
        let want = to - self.pos;
        let got = self
            .src
            .skip(want)
            .with_context(|| format!("cannot move to byte offset {to}"))?;
        self.pos += got;
        if got < want {
            bail!(
                "truncated tar: the input ends at byte {}, inside the member that ends at byte {to}",
                self.pos
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
