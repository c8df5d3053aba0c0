//! Extension records: what PAX extended headers (`x`) and GNU long names (`L`, `K`) say about
//! the member after them (its path, link target, stored size, sparse map).

use anyhow::{bail, Context, Result};

use crate::tar::fields::until_nul;

/// Extension records read in front of a member.
#[derive(Default)]
pub(crate) struct Pending {
    /// The first extension record's offset.
    pub(crate) start: Option<u64>,
    pub(crate) long_name: Option<Vec<u8>>,
    pub(crate) long_link: Option<Vec<u8>>,
    pub(crate) pax_path: Option<Vec<u8>>,
    pub(crate) pax_link: Option<Vec<u8>>,
    pub(crate) pax_size: Option<u64>,
    pub(crate) sparse_name: Option<Vec<u8>>,
    pub(crate) pax_sparse: bool,
}

/// A GNU long name's content, up to its NUL.
///
/// # Errors
/// The name is empty: GNU tar names such a member `.`, tarfile `""`, and bsdtar skips it.
pub(crate) fn nonempty_name(data: &[u8], at: u64) -> Result<Vec<u8>> {
    let name = until_nul(data);
    if name.is_empty() {
        bail!("byte offset {at}: an empty GNU long name (GNU tar names its member '.', tarfile \"\", and bsdtar skips the member)");
    }
    Ok(name.to_vec())
}

/// Folds the records of a PAX extended header (`LEN key=value\n` ...) into `p`.
pub(crate) fn apply_pax(data: &[u8], p: &mut Pending, at: u64) -> Result<()> {
    let mut rest = data;
    while !rest.is_empty() {
        if rest.iter().all(|&b| b == 0) {
            break; // some writers pad the header's data with NULs
        }
        let space = rest.iter().position(|&b| b == b' ').with_context(|| {
            format!("byte offset {at}: PAX header: expected 'LENGTH key=value', found no length")
        })?;
        let len: usize = std::str::from_utf8(&rest[..space])
            .ok()
            .and_then(|s| s.parse().ok())
            .filter(|&n: &usize| n > space + 1 && n <= rest.len())
            .with_context(|| {
                format!(
                    "byte offset {at}: PAX header: record length {:?} is not a length inside the header",
                    String::from_utf8_lossy(&rest[..space])
                )
            })?;
        let record = &rest[space + 1..len];
        rest = &rest[len..];
        let record = record.strip_suffix(b"\n").unwrap_or(record);
        let Some(eq) = record.iter().position(|&b| b == b'=') else {
            bail!("byte offset {at}: PAX header: a record without '='");
        };
        let (key, value) = (&record[..eq], &record[eq + 1..]);
        match key {
            b"path" if value.is_empty() => {
                bail!("byte offset {at}: PAX header: an empty path (GNU tar names its member '.', tarfile \"\", and bsdtar skips the member)")
            }
            b"path" => p.pax_path = Some(value.to_vec()),
            b"linkpath" => p.pax_link = Some(value.to_vec()),
            b"size" => {
                let size = std::str::from_utf8(value)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .with_context(|| {
                        format!(
                            "byte offset {at}: PAX header: size {:?} is not a number",
                            String::from_utf8_lossy(value)
                        )
                    })?;
                p.pax_size = Some(size);
            }
            b"GNU.sparse.name" => p.sparse_name = Some(value.to_vec()),
            b"GNU.sparse.major"
            | b"GNU.sparse.size"
            | b"GNU.sparse.realsize"
            | b"GNU.sparse.map"
            | b"GNU.sparse.numblocks" => p.pax_sparse = true,
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::tar::testing::{header, padded, pax_record, walk_all};

    #[test]
    fn a_pax_record_too_short_to_hold_a_key_is_named_by_its_length() {
        // "2 " claims two bytes, the length and its space: no room for `key=value`.
        for records in ["2 ", "1 "] {
            let bytes = [
                header("PaxHeader/k", b'x', 2, b"ustar\x0000").to_vec(),
                padded(records.as_bytes()),
                header("k.jpg", b'0', 0, b"ustar\x0000").to_vec(),
                vec![0; 1024],
            ]
            .concat();
            let e = format!("{:#}", walk_all(&bytes).unwrap_err());
            let want = format!(
                "PAX header: record length {:?} is not a length",
                &records[..1]
            );
            assert!(e.contains(&want), "{e}");
        }
    }

    #[test]
    fn a_pax_size_is_the_stored_size_over_the_header_field() {
        // Writers put sizes of 8 GiB and more in PAX only; the header's field may say anything.
        let with_size = |size: &str| {
            let records = pax_record("size", size);
            [
                header("PaxHeader/k", b'x', records.len() as u64, b"ustar\x0000").to_vec(),
                padded(records.as_bytes()),
                header("k.bin", b'0', 0, b"ustar\x0000").to_vec(),
                vec![3u8; 1024],
                header("l.bin", b'0', 0, b"ustar\x0000").to_vec(),
                vec![0; 1024],
            ]
            .concat()
        };
        let m = walk_all(&with_size("1000")).unwrap();
        assert_eq!((m[0].stored, m[0].data, m[0].end), (1000, 1536, 2560));
        assert_eq!((m[1].start, m[1].path.as_slice()), (2560, &b"l.bin"[..]));
        let e = format!("{:#}", walk_all(&with_size("12x")).unwrap_err());
        assert!(e.contains("byte offset 0: PAX header: size \"12x\""), "{e}");
    }
}
