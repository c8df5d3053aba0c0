//! Sort keys for the orders beyond the shuffle.
//!
//! Sort keys are byte strings compared with `memcmp`: integers and floats in fixed-width,
//! order-preserving encodings, strings escaped and terminated so that no key is a prefix of
//! another, which also lets `--descending` invert the bytes. Ties are broken by the global
//! sample index, so every order is total and the same for any rank count.

use anyhow::{bail, Result};

use super::order::{Missing, OrderSpec, ValueKind};

/// Appends `bytes` so that the encodings of two strings compare like the strings and none is a
/// prefix of another: 0x00 becomes 0x00 0xFF, and 0x00 0x00 ends the string.
fn push_str(out: &mut Vec<u8>, bytes: &[u8]) {
    for &b in bytes {
        if b == 0 {
            out.extend([0, 0xFF]);
        } else {
            out.push(b);
        }
    }
    out.extend([0, 0]);
}

/// The sort key of one value: a presence byte (0; 1 marks a missing value, sorted last), then
/// the value's encoding, inverted when `descending`.
pub(crate) fn value_key(
    value: Option<&[u8]>,
    kind: ValueKind,
    descending: bool,
) -> Result<Vec<u8>, String> {
    let Some(raw) = value else {
        return Ok(vec![1]);
    };
    let mut out = vec![0u8];
    let text = || {
        std::str::from_utf8(raw.trim_ascii())
            .map_err(|_| format!("{:?} is not UTF-8 text", String::from_utf8_lossy(raw)))
    };
    match kind {
        ValueKind::Int => {
            let t = text()?;
            let v: i64 = t.parse().map_err(|_| format!("{t:?} is not an integer"))?;
            out.extend(((v as u64) ^ (1 << 63)).to_be_bytes());
        }
        ValueKind::Float => {
            let t = text()?;
            let v: f64 = t.parse().map_err(|_| format!("{t:?} is not a number"))?;
            if v.is_nan() {
                return Err(format!("{t:?} is not a number"));
            }
            // -0.0 and 0.0 are equal: ties go by sample index.
            let bits = if v == 0.0 { 0.0f64 } else { v }.to_bits();
            let ordered = if bits >> 63 == 1 {
                !bits
            } else {
                bits | (1 << 63)
            };
            out.extend(ordered.to_be_bytes());
        }
        ValueKind::Str => push_str(&mut out, raw.trim_ascii()),
    }
    if descending {
        for b in &mut out[1..] {
            *b = !*b;
        }
    }
    Ok(out)
}

/// A sample key as a sort key (a string, never missing).
pub(crate) fn of_key(key: &[u8], descending: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 3);
    out.push(0);
    push_str(&mut out, key);
    if descending {
        for b in &mut out[1..] {
            *b = !*b;
        }
    }
    out
}

/// A stratification label as a sort key: the member's bytes (trimmed), or the stratum of
/// samples without the member with `--missing last`.
pub(crate) fn label_key(
    content: Option<&[u8]>,
    ext: &str,
    spec: &OrderSpec,
    describe: impl Fn() -> String,
) -> Result<Vec<u8>> {
    match (content, spec.missing) {
        (Some(v), _) => Ok(value_key(Some(v), ValueKind::Str, false).expect("strings encode")),
        (None, Missing::Last) => Ok(value_key(None, ValueKind::Str, false).expect("encodes")),
        (None, Missing::Error) => bail!(
            "{} has no .{ext} member to stratify by (--missing last gives such samples a stratum of their own)",
            describe()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(v: &str, kind: ValueKind, desc: bool) -> Vec<u8> {
        value_key(Some(v.as_bytes()), kind, desc).unwrap()
    }

    #[test]
    fn encodings_sort_like_their_values() {
        let ints = ["-9000000000", "-3", "0", "2", "10", "9000000000"];
        let floats = ["-inf", "-1e10", "-0.5", "0", "1e-9", "2.5", "1e300", "inf"];
        let strs = ["", "a", "a\0", "a\0b", "ab", "b"];
        for (vals, kind) in [
            (&ints[..], ValueKind::Int),
            (&floats[..], ValueKind::Float),
            (&strs[..], ValueKind::Str),
        ] {
            for w in vals.windows(2) {
                assert!(key(w[0], kind, false) < key(w[1], kind, false), "{w:?}");
                assert!(key(w[0], kind, true) > key(w[1], kind, true), "{w:?}");
            }
            // Missing sorts last either way.
            let missing = value_key(None, kind, false).unwrap();
            assert!(vals.iter().all(|v| key(v, kind, false) < missing));
            assert!(vals.iter().all(|v| key(v, kind, true) < missing));
        }
        assert_eq!(
            key(" 7\n", ValueKind::Int, false),
            key("7", ValueKind::Int, false)
        );
        assert_eq!(
            key("-0", ValueKind::Float, false),
            key("0", ValueKind::Float, false)
        );
        assert!(value_key(Some(b"x"), ValueKind::Int, false).is_err());
        assert!(value_key(Some(b"nan"), ValueKind::Float, false).is_err());
        let keys = ["a/1", "a/10", "a/2", "b"];
        for w in keys.windows(2) {
            assert!(of_key(w[0].as_bytes(), false) < of_key(w[1].as_bytes(), false));
            assert!(of_key(w[0].as_bytes(), true) > of_key(w[1].as_bytes(), true));
        }
    }
}
