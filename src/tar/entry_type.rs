//! The one table of tar entry types: for every type flag, what the record is and whether data
//! records follow its header. The header walk ([`crate::tar::headers`]) reads it and nothing
//! else decides it.
//!
//! Each row is what POSIX (ustar and pax) says and what the three readers a shard meets
//! actually do: GNU tar 1.34, bsdtar (libarchive 3.6) and Python's tarfile (webdataset's
//! reader). They were run over an archive holding each type flag with a size of 0 and of 1024
//! in front of two members (`tests/entry_types.rs` runs them again for every row):
//!
//! | type flag | what | data records after the header |
//! |---|---|---|
//! | `0`, NUL, `7` | regular file | `size` bytes (all three) |
//! | `S` | old GNU sparse file | `size` bytes, the stored regions (all three) |
//! | `1` | hard link | none, whatever `size` says (POSIX; all three) |
//! | `5` | directory | none, whatever `size` says (POSIX; all three) |
//! | `2`, `3`, `4`, `6` | symlink, devices, FIFO | none per POSIX, bsdtar, tarfile; GNU tar skips `size` bytes: refused unless `size` is 0 |
//! | `V` | GNU volume label | GNU tar and tarfile skip `size` bytes, bsdtar none: refused unless `size` is 0 |
//! | `A` | Solaris ACL | bsdtar applies it to the next member and fails: refused |
//! | `x`, `X` | PAX extended header (`X`: Solaris's name for it) | records for the next member |
//! | `g` | PAX global header | `size` bytes of records (all three) |
//! | `L`, `K` | GNU long name, long link name | the name, for the next member |
//! | `D` | GNU dump directory | `size` bytes (all three), a directory to GNU tar and bsdtar |
//! | `M` | GNU multi-volume continuation | refused: the rest of a file from another archive |
//! | `N`, any other | old GNU long names, unknown | POSIX, GNU tar, bsdtar: a regular file; tarfile: no file (webdataset drops it): refused |
//!
//! And one rule on the name: a regular type (`0`, NUL, `7`, `S`) whose name ends in `/` is a
//! directory to bsdtar, which reads no data after it, while GNU tar and tarfile read `size`
//! bytes: refused unless `size` is 0.
//!
//! An entry of a refused kind is an error naming the file, the byte offset and the disagreement:
//! picking one reader's reading would silently lose or invent members for the others.

/// What a member is, by its type flag, after its extension records are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EntryKind {
    /// A regular file (`0`, NUL, `7`), GNU sparse 1.0 and 0.x members included (their type flag
    /// is `0`).
    Regular,
    /// An old GNU sparse member (`S`): stored data regions, holes not stored.
    Sparse,
    /// A hard link (`1`).
    HardLink,
    /// A symbolic link (`2`).
    Symlink,
    /// A directory (`5`).
    Directory,
    /// A PAX global extended header (`g`).
    GlobalHeader,
    /// A GNU volume label (`V`).
    Label,
    /// Anything else: devices, FIFOs, GNU multi-volume continuations and dump directories,
    /// unknown type flags.
    Other(u8),
}

impl EntryKind {
    /// The kind of a member whose header has `typeflag`.
    pub(crate) fn of(typeflag: u8) -> EntryKind {
        match typeflag {
            b'0' | 0 | b'7' => EntryKind::Regular,
            b'S' => EntryKind::Sparse,
            b'1' => EntryKind::HardLink,
            b'2' => EntryKind::Symlink,
            b'5' => EntryKind::Directory,
            b'g' => EntryKind::GlobalHeader,
            b'V' => EntryKind::Label,
            t => EntryKind::Other(t),
        }
    }

    /// Whether the member holds file data that belongs in a sample.
    pub(crate) fn is_file(self) -> bool {
        matches!(self, EntryKind::Regular | EntryKind::Sparse)
    }

    /// How a message names this kind of entry.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            EntryKind::Regular => "a regular file",
            EntryKind::Sparse => "a sparse file",
            EntryKind::HardLink => "a hard link",
            EntryKind::Symlink => "a symbolic link",
            EntryKind::Directory => "a directory",
            EntryKind::GlobalHeader => "a PAX global header",
            EntryKind::Label => "a volume label",
            EntryKind::Other(b'3') => "a character device",
            EntryKind::Other(b'4') => "a block device",
            EntryKind::Other(b'6') => "a FIFO",
            EntryKind::Other(b'M') => "a GNU multi-volume continuation",
            EntryKind::Other(b'N') => "an old GNU long-name entry",
            EntryKind::Other(b'D') => "a GNU dump directory",
            EntryKind::Other(_) => "an entry of a type tar readers do not know",
        }
    }
}

/// A record that carries names or attributes for the member after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Extension {
    /// A PAX extended header (`x`, or Solaris's `X`).
    Pax,
    /// A GNU long name (`L`).
    LongName,
    /// A GNU long link name (`K`).
    LongLink,
}

/// What a header's type flag makes of the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Record {
    /// An extension record for the next member; its `size` bytes of data are its content.
    Extension(Extension),
    /// An entry of the archive (a member, a directory, a global header...).
    Entry(EntryKind),
    /// A type the readers read differently whatever its size: the reason.
    Refused(&'static str),
}

/// What a type flag makes of a record.
pub(crate) fn record(typeflag: u8) -> Record {
    match typeflag {
        b'x' | b'X' => Record::Extension(Extension::Pax),
        b'L' => Record::Extension(Extension::LongName),
        b'K' => Record::Extension(Extension::LongLink),
        b'A' => Record::Refused(
            "a Solaris ACL header: bsdtar applies it to the next member (and fails on it), GNU tar and tarfile list it as an entry of its own",
        ),
        b'M' => Record::Refused(
            "a GNU multi-volume continuation: the rest of a file begun in another archive, which no reader here can join to it",
        ),
        b'0'..=b'7' | 0 | b'S' | b'g' | b'V' | b'D' => Record::Entry(EntryKind::of(typeflag)),
        // POSIX: an unknown type is read as a regular file, as GNU tar and bsdtar extract it;
        // tarfile (and so webdataset) reads no file from it. `N` (old GNU long names) is one.
        _ => Record::Refused(
            "an entry of a type flag POSIX, GNU tar and bsdtar read as a regular file and tarfile (webdataset's reader) does not, so a sample would hold different members for them",
        ),
    }
}

/// How many data bytes the archive stores after the header of an entry with `typeflag`, final
/// `path` and `size` (the header's field, or a PAX `size`).
///
/// # Errors
/// The readers disagree on it (see the module's table): the reason, for a message that adds the
/// file and the byte offset.
pub(crate) fn stored_size(typeflag: u8, path: &[u8], size: u64) -> Result<u64, String> {
    let regular = matches!(typeflag, b'0' | 0 | b'7' | b'S');
    match typeflag {
        // POSIX: no data records for links and directories; all three readers agree.
        b'1' | b'5' => Ok(0),
        b'2' | b'3' | b'4' | b'6' | b'V' if size > 0 => Err(format!(
            "{} (type '{}') with a size field of {size}: GNU tar {} and bsdtar {} the {size} bytes after its header as data, so they list different members; expected a size of 0",
            EntryKind::of(typeflag).describe(),
            char::from(typeflag),
            if typeflag == b'V' { "and tarfile skip" } else { "skips" },
            if typeflag == b'V' { "reads" } else { "and tarfile (and POSIX) read" },
        )),
        b'2' | b'3' | b'4' | b'6' | b'V' => Ok(0),
        _ if regular && size > 0 && path.ends_with(b"/") => Err(format!(
            "a regular file (type '{}') named like a directory (its name ends in '/') with a size field of {size}: bsdtar reads it as a directory with no data, GNU tar and tarfile skip {size} bytes of data, so they list different members; expected a size of 0",
            char::from(typeflag).escape_default()
        )),
        _ => Ok(size),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_and_directories_have_no_data_whatever_their_size() {
        for t in [b'1', b'5'] {
            assert_eq!(stored_size(t, b"a.x", 1024), Ok(0));
        }
    }

    #[test]
    fn types_the_readers_disagree_on_are_refused_only_with_a_size() {
        for t in [b'2', b'3', b'4', b'6', b'V'] {
            assert_eq!(stored_size(t, b"a.x", 0), Ok(0));
            let e = stored_size(t, b"a.x", 1024).unwrap_err();
            assert!(
                e.contains("size field of 1024") && e.contains("GNU tar"),
                "{e}"
            );
        }
        for t in [b'0', 0, b'7', b'S'] {
            assert_eq!(stored_size(t, b"d/", 0), Ok(0));
            assert_eq!(stored_size(t, b"d", 1024), Ok(1024));
            let e = stored_size(t, b"d/", 1024).unwrap_err();
            assert!(e.contains("ends in '/'") && e.contains("bsdtar"), "{e}");
        }
        assert!(matches!(record(b'A'), Record::Refused(_)));
    }

    #[test]
    fn every_other_type_stores_its_size() {
        for t in [b'0', 0, b'7', b'S', b'g', b'D'] {
            assert_eq!(stored_size(t, b"a.x", 1536), Ok(1536), "{t}");
            assert!(matches!(record(t), Record::Entry(_)), "{t}");
        }
        for t in [b'A', b'M', b'N', b'E', b'I', b'Z', b'9', b'8', 0xff] {
            assert!(matches!(record(t), Record::Refused(_)), "{t}");
        }
        for (t, ext) in [
            (b'x', Extension::Pax),
            (b'X', Extension::Pax),
            (b'L', Extension::LongName),
            (b'K', Extension::LongLink),
        ] {
            assert_eq!(record(t), Record::Extension(ext));
        }
    }

    #[test]
    fn only_regular_and_sparse_members_hold_file_data() {
        // Labels are read, and loader indexes written, from these only.
        let files = [EntryKind::Regular, EntryKind::Sparse];
        assert!(files.iter().all(|k| k.is_file()));
        let others = [
            EntryKind::HardLink,
            EntryKind::Symlink,
            EntryKind::Directory,
            EntryKind::GlobalHeader,
            EntryKind::Label,
            EntryKind::Other(b'6'),
        ];
        assert!(others.iter().all(|k| !k.is_file()));
    }
}
