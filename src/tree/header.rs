//! Deterministic tar headers for loose files: a ustar header from the name, size, mode and
//! modification time the file system reports, with owner fields fixed (uid and gid 0, empty
//! user and group names), and a PAX extended header in front where ustar cannot hold the name
//! (over 100 bytes), the size (8 GiB or more) or the mtime (after 2242).

/// A tar block.
pub(crate) const BLOCK: u64 = 512;

/// The largest value an 11-digit octal field holds (the ustar size and mtime fields).
const OCTAL_11: u64 = 0o777_7777_7777;

/// What a member's header says.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeaderFields<'a> {
    pub(crate) name: &'a [u8],
    pub(crate) size: u64,
    pub(crate) mode: u32,
    /// Seconds since the epoch (before 1970: 0; after 11 octal digits, a PAX record).
    pub(crate) mtime: i64,
}

/// Whether the mtime of `fields` needs a PAX record: 11 octal digits cannot hold it.
fn huge_mtime(fields: &HeaderFields<'_>) -> bool {
    fields.mtime > OCTAL_11 as i64
}

/// Whether `fields` need PAX records (see [`pax_records`]).
fn needs_pax(fields: &HeaderFields<'_>) -> bool {
    fields.name.len() > 100 || fields.size > OCTAL_11 || huge_mtime(fields)
}

/// The PAX records `fields` need: `path` for a name over 100 bytes, `size` for a size and
/// `mtime` for a modification time that 11 octal digits cannot hold.
fn pax_records(fields: &HeaderFields<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    if !needs_pax(fields) {
        return out;
    }
    if fields.name.len() > 100 {
        pax_record(&mut out, b"path", fields.name);
    }
    if fields.size > OCTAL_11 {
        pax_record(&mut out, b"size", fields.size.to_string().as_bytes());
    }
    if huge_mtime(fields) {
        pax_record(&mut out, b"mtime", fields.mtime.to_string().as_bytes());
    }
    out
}

/// One `LEN KEY=VALUE\n` record, LEN counting its own digits.
fn pax_record(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    let rest = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut len = rest + 1;
    while len.to_string().len() + rest != len {
        len = len.to_string().len() + rest;
    }
    out.extend_from_slice(len.to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(key);
    out.push(b'=');
    out.extend_from_slice(value);
    out.push(b'\n');
}

/// Rounds `n` up to whole blocks.
pub(crate) fn padded(n: u64) -> u64 {
    n.div_ceil(BLOCK) * BLOCK
}

/// The bytes of the member's header records (PAX header and its records, if any, then the
/// ustar header): a multiple of 512.
pub(crate) fn header_len(fields: &HeaderFields<'_>) -> u64 {
    // Asked for every member a read passes: without the records' allocation when none are due.
    if !needs_pax(fields) {
        return BLOCK;
    }
    let pax = pax_records(fields).len() as u64;
    if pax == 0 {
        BLOCK
    } else {
        2 * BLOCK + padded(pax)
    }
}

/// Appends the member's header records to `out` ([`header_len`] bytes).
pub(crate) fn write_header(fields: &HeaderFields<'_>, out: &mut Vec<u8>) {
    let pax = pax_records(fields);
    if !pax.is_empty() {
        // Python's tarfile names its PAX headers so; readers ignore the name.
        let mut block = [0u8; BLOCK as usize];
        ustar(
            &mut block,
            b"././@PaxHeader",
            pax.len() as u64,
            0o644,
            0,
            b'x',
        );
        out.extend_from_slice(&block);
        let start = out.len();
        out.extend_from_slice(&pax);
        out.resize(start + padded(pax.len() as u64) as usize, 0);
    }
    let mut block = [0u8; BLOCK as usize];
    member_block(fields, &mut block);
    out.extend_from_slice(&block);
}

/// Copies the bytes of the member's header records from byte `from` on into the start of
/// `out`, as many as fit: the count copied. Without an allocation where the header is one
/// ustar block (no PAX records are due), which is every member but rare ones (a name over 100
/// bytes, a size of 8 GiB or more): a read makes one for every file it passes.
pub(crate) fn copy_header(fields: &HeaderFields<'_>, from: usize, out: &mut [u8]) -> usize {
    if needs_pax(fields) {
        let mut header = Vec::with_capacity(header_len(fields) as usize);
        write_header(fields, &mut header);
        let n = out.len().min(header.len() - from);
        out[..n].copy_from_slice(&header[from..from + n]);
        return n;
    }
    match out.get_mut(..BLOCK as usize) {
        // The whole block: made where it goes.
        Some(whole) if from == 0 => {
            let block: &mut [u8; BLOCK as usize] = whole.try_into().expect("one block");
            block.fill(0);
            member_block(fields, block);
            BLOCK as usize
        }
        _ => {
            let mut block = [0u8; BLOCK as usize];
            member_block(fields, &mut block);
            let n = out.len().min(block.len() - from);
            out[..n].copy_from_slice(&block[from..from + n]);
            n
        }
    }
}

/// Fills the zeroed `block` with the member's ustar header. Where a PAX record holds the
/// value, the ustar field holds what fits (a truncated name, size 0, mtime 0), as Python's
/// tarfile writes it.
fn member_block(fields: &HeaderFields<'_>, block: &mut [u8; BLOCK as usize]) {
    let name = &fields.name[..fields.name.len().min(100)];
    let size = if fields.size > OCTAL_11 {
        0
    } else {
        fields.size
    };
    let mtime = u64::try_from(fields.mtime)
        .ok()
        .filter(|&m| m <= OCTAL_11)
        .unwrap_or(0);
    ustar(block, name, size, fields.mode, mtime, b'0');
}

/// Fills the zeroed block `h` with one ustar header.
fn ustar(
    h: &mut [u8; BLOCK as usize],
    name: &[u8],
    size: u64,
    mode: u32,
    mtime: u64,
    typeflag: u8,
) {
    h[..name.len()].copy_from_slice(name);
    octal(&mut h[100..108], u64::from(mode & 0o7777));
    octal(&mut h[108..116], 0);
    octal(&mut h[116..124], 0);
    octal(&mut h[124..136], size);
    octal(&mut h[136..148], mtime);
    h[156] = typeflag;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    octal(&mut h[329..337], 0);
    octal(&mut h[337..345], 0);
    h[148..156].fill(b' ');
    let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
    // Six digits, NUL, space: what GNU tar writes.
    octal(&mut h[148..155], sum);
}

/// `value` in octal, zero-padded to fill the field but its last byte (a NUL). Digit by digit,
/// not through `format!`: a header is made for every file a read passes (at 200,000 files of
/// 8 KiB the formatting was 4% of a run's CPU). Every value fits its field (the callers clamp).
fn octal(field: &mut [u8], mut value: u64) {
    let digits = field.len() - 1;
    debug_assert!(
        digits >= 22 || value >> (3 * digits) == 0,
        "{value:o} fits {digits} digits"
    );
    for d in field[..digits].iter_mut().rev() {
        *d = b'0' + (value & 7) as u8;
        value >>= 3;
    }
    field[digits] = 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(name: &[u8], size: u64) -> Vec<u8> {
        let fields = HeaderFields {
            name,
            size,
            mode: 0o640,
            mtime: 1_700_000_000,
        };
        let mut out = Vec::new();
        write_header(&fields, &mut out);
        assert_eq!(out.len() as u64, header_len(&fields));
        out
    }

    /// The tar crate reads what is written: name, size, mode, mtime, fixed owners.
    #[test]
    fn a_short_name_is_one_ustar_block() {
        let h = header(b"n0144/x_1.JPEG", 1234);
        assert_eq!(h.len(), 512);
        let hd = tar::Header::from_byte_slice(&h);
        assert_eq!(hd.path_bytes().as_ref(), b"n0144/x_1.JPEG");
        assert_eq!(hd.size().unwrap(), 1234);
        assert_eq!(hd.mode().unwrap(), 0o640);
        assert_eq!(hd.mtime().unwrap(), 1_700_000_000);
        assert_eq!((hd.uid().unwrap(), hd.gid().unwrap()), (0, 0));
        assert_eq!(hd.cksum().unwrap(), {
            let mut c = h.clone();
            c[148..156].fill(b' ');
            c.iter().map(|&b| u32::from(b)).sum::<u32>()
        });
        assert!(hd.as_ustar().is_some());
    }

    /// A long name and a size over 8 GiB go into PAX records that the tar crate applies.
    #[test]
    fn long_names_and_huge_sizes_take_pax_records() {
        let name = format!("{}/x.jpg", "d".repeat(150));
        let size = 9 << 30;
        let mut bytes = header(name.as_bytes(), size);
        assert_eq!(bytes.len(), 3 * 512);
        // A whole archive for the tar crate: the data is not read, only skipped past.
        bytes.resize(bytes.len() + 1024, 0);
        let mut archive = tar::Archive::new(std::io::Cursor::new(bytes));
        let mut entries = archive.entries_with_seek().unwrap();
        let e = entries.next().unwrap().unwrap();
        assert_eq!(e.path_bytes().as_ref(), name.as_bytes());
        assert_eq!(e.size(), size);
    }

    /// An mtime past 11 octal digits (after 2242) goes into a PAX `mtime` record, the ustar
    /// field 0 (as Python's tarfile writes it); the largest that fits stays in ustar alone.
    #[test]
    fn an_mtime_past_eleven_octal_digits_takes_a_pax_record() {
        let fields = |mtime| HeaderFields {
            name: b"x.jpg",
            size: 3,
            mode: 0o644,
            mtime,
        };
        let top = fields(OCTAL_11 as i64);
        assert_eq!(header_len(&top), 512);
        let huge = fields(OCTAL_11 as i64 + 1);
        let mut bytes = Vec::new();
        write_header(&huge, &mut bytes);
        assert_eq!(bytes.len() as u64, header_len(&huge));
        assert_eq!(bytes.len(), 3 * 512);
        bytes.extend_from_slice(b"abc");
        bytes.resize(bytes.len() + 509 + 1024, 0);
        let mut archive = tar::Archive::new(std::io::Cursor::new(bytes));
        let mut entries = archive.entries().unwrap();
        let mut e = entries.next().unwrap().unwrap();
        assert_eq!(e.path_bytes().as_ref(), b"x.jpg");
        assert_eq!(e.header().mtime().unwrap(), 0);
        let pax: Vec<(String, String)> = e
            .pax_extensions()
            .unwrap()
            .unwrap()
            .map(|x| {
                let x = x.unwrap();
                (x.key().unwrap().into(), x.value().unwrap().into())
            })
            .collect();
        assert_eq!(pax, [("mtime".into(), "8589934592".into())]);
    }

    /// The octal fields are what `format!` writes, at every width a header uses, from zero to
    /// the largest value each holds.
    #[test]
    fn octal_fields_match_formatted_octal() {
        for digits in [6usize, 7, 11] {
            let top = (1u64 << (3 * digits)) - 1;
            for value in [0, 1, 7, 8, 0o644, 0o7777, 123_456, top / 3, top - 1, top] {
                let value = value.min(top);
                let mut field = vec![b'x'; digits + 1];
                octal(&mut field, value);
                let want = format!("{value:0digits$o}\0");
                assert_eq!(field, want.as_bytes(), "{value} in {digits} digits");
            }
        }
    }

    /// A header copied from any byte on into a buffer of any length is the written header's
    /// bytes there, with and without PAX records, over whatever the buffer held before.
    #[test]
    fn a_copied_header_is_the_written_one_from_any_byte() {
        let long = format!("{}/x.jpg", "d".repeat(150));
        for name in [&b"n0144/x_1.JPEG"[..], long.as_bytes()] {
            let whole = header(name, 1234);
            let fields = HeaderFields {
                name,
                size: 1234,
                mode: 0o640,
                mtime: 1_700_000_000,
            };
            for from in [0, 1, 100, 511, 512, whole.len() - 1] {
                if from >= whole.len() {
                    continue;
                }
                for room in [1, 7, 512, 513, 2000] {
                    let mut out = vec![0xa5; room];
                    let n = copy_header(&fields, from, &mut out);
                    assert_eq!(n, room.min(whole.len() - from), "{from} {room}");
                    assert_eq!(out[..n], whole[from..from + n], "{from} {room}");
                    assert!(out[n..].iter().all(|&b| b == 0xa5), "{from} {room}");
                }
            }
        }
    }

    #[test]
    fn pax_record_lengths_count_their_own_digits() {
        for n in [1, 5, 90, 94, 95, 96, 990, 995, 996] {
            let mut out = Vec::new();
            pax_record(&mut out, b"path", &vec![b'a'; n]);
            let len: usize =
                std::str::from_utf8(&out[..out.iter().position(|&b| b == b' ').unwrap()])
                    .unwrap()
                    .parse()
                    .unwrap();
            assert_eq!(len, out.len(), "{n}");
        }
    }
}
