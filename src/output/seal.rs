//! The checksum every metadata file reshard writes and later believes carries: saved indexes,
//! the `--resume` plan and checkpoint records, the upload notes. One mechanism for all: a
//! fixed-size text trailer after the record's body, with a format version, the body's length
//! and a CRC-32 of it,
//!
//! ```text
//! <body>\nreshard-seal v1 len=00000000000001c4 crc32=9f0c11e2\n
//! ```
//!
//! A trailer rather than a header keeps a JSON record readable by eye (`head` shows it as it
//! was) and lets a writer seal a body it already holds. CRC-32 (of `crc32fast`, already built
//! for `flate2`'s gzip) catches every burst of up to 32 bits and all but 2^-32 of other
//! damage: what these records meet is disk and copy damage and hand edits, not an adversary who
//! would recompute it. The length tells a record cut short (or with bytes appended) from one
//! damaged in place.

use std::fmt;

/// The version of the trailer this build writes and reads.
const VERSION: u32 = 1;
const MAGIC: &[u8] = b"\nreshard-seal v";

/// Why a record's bytes are not the body its writer sealed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Broken {
    /// No trailer: written by a reshard before records carried a checksum, cut short inside its
    /// trailer, or not reshard's.
    Unsealed,
    /// A trailer of a version this build does not know.
    Version(String),
    /// The body's length differs from the trailer's: cut short or extended.
    Length { found: u64, sealed: u64 },
    /// The body's checksum differs from the trailer's: damaged.
    Checksum { found: u32, sealed: u32 },
}

impl fmt::Display for Broken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Broken::Unsealed => write!(
                f,
                "no checksum trailer (damaged, cut short, or written by a reshard before records carried one)"
            ),
            Broken::Version(v) => {
                write!(f, "checksum trailer of unknown version {v:?} (expected {VERSION})")
            }
            Broken::Length { found, sealed } => write!(
                f,
                "{found} bytes where its checksum trailer says {sealed}: cut short or extended"
            ),
            Broken::Checksum { found, sealed } => write!(
                f,
                "checksum mismatch: its trailer says crc32 {sealed:08x}, its bytes give {found:08x}: damaged"
            ),
        }
    }
}

impl std::error::Error for Broken {}

fn trailer(body: &[u8]) -> String {
    format!(
        "{}{VERSION} len={:016x} crc32={:08x}\n",
        String::from_utf8_lossy(MAGIC),
        body.len(),
        crc32fast::hash(body)
    )
}

/// The length of this version's trailer.
fn trailer_len() -> usize {
    trailer(b"").len()
}

/// `body` followed by its trailer: the bytes to write.
pub fn seal(mut body: Vec<u8>) -> Vec<u8> {
    let t = trailer(&body);
    body.extend_from_slice(t.as_bytes());
    body
}

/// The body of the sealed record `bytes`, once its trailer is found and matches it.
///
/// # Errors
/// No trailer, an unknown version, a length or checksum that does not match ([`Broken`]).
pub fn open(bytes: &[u8]) -> Result<&[u8], Broken> {
    let n = trailer_len();
    let Some(at) = bytes.len().checked_sub(n) else {
        return Err(Broken::Unsealed);
    };
    let (body, t) = bytes.split_at(at);
    let Some(rest) = t.strip_prefix(MAGIC) else {
        return Err(Broken::Unsealed);
    };
    let text = std::str::from_utf8(rest).map_err(|_| Broken::Unsealed)?;
    let fields = |text: &str| -> Option<(String, u64, u32)> {
        let text = text.strip_suffix('\n')?;
        let mut parts = text.split(' ');
        let version = parts.next()?.to_string();
        let len = u64::from_str_radix(parts.next()?.strip_prefix("len=")?, 16).ok()?;
        let crc = u32::from_str_radix(parts.next()?.strip_prefix("crc32=")?, 16).ok()?;
        parts.next().is_none().then_some((version, len, crc))
    };
    let Some((version, sealed_len, sealed)) = fields(text) else {
        return Err(Broken::Unsealed);
    };
    if version != VERSION.to_string() {
        return Err(Broken::Version(version));
    }
    if sealed_len != body.len() as u64 {
        return Err(Broken::Length {
            found: body.len() as u64,
            sealed: sealed_len,
        });
    }
    let found = crc32fast::hash(body);
    if found != sealed {
        return Err(Broken::Checksum { found, sealed });
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_body_opens_as_itself() {
        for body in [&b""[..], b"{\"a\":1}", &[0u8, 255, 10, 13][..]] {
            assert_eq!(open(&seal(body.to_vec())), Ok(body));
        }
    }

    /// Every single-byte edit of a sealed record, anywhere in it (body or trailer), and every
    /// truncation, is caught.
    #[test]
    fn every_single_byte_edit_and_truncation_is_caught() {
        let sealed = seal(br#"{"done":[[0,12]],"samples":12}"#.to_vec());
        for i in 0..sealed.len() {
            for delta in [1u8, 0x80, 0xff] {
                let mut bad = sealed.clone();
                bad[i] = bad[i].wrapping_add(delta);
                assert!(open(&bad).is_err(), "byte {i} + {delta} accepted");
            }
            assert!(open(&sealed[..i]).is_err(), "cut to {i} accepted");
        }
        let mut longer = sealed.clone();
        longer.push(b'\n');
        assert!(open(&longer).is_err());
    }

    #[test]
    fn what_is_wrong_is_said() {
        assert_eq!(open(b"{\"plain\":\"json\"}"), Err(Broken::Unsealed));
        let mut bad = seal(b"abcd".to_vec());
        bad[0] = b'x';
        assert!(matches!(open(&bad), Err(Broken::Checksum { .. })));
        let mut shifted = b"abc".to_vec();
        shifted.extend_from_slice(&seal(b"abcd".to_vec())[4..]);
        assert!(matches!(
            open(&shifted),
            Err(Broken::Length {
                found: 3,
                sealed: 4
            })
        ));
        let v2 = String::from_utf8(seal(b"ab".to_vec()))
            .unwrap()
            .replace("seal v1 ", "seal v2 ");
        assert_eq!(open(v2.as_bytes()), Err(Broken::Version("2".into())));
        assert!(Broken::Checksum {
            found: 1,
            sealed: 2
        }
        .to_string()
        .contains("damaged"));
    }
}
