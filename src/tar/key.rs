//! Sample keys, as webdataset forms them from member paths.

/// The key of a member path: everything up to the first `.` of the last path component, or
/// `None` when the last component has no `.` or starts with one (webdataset skips those).
pub fn sample_key(path: &[u8]) -> Option<&[u8]> {
    let base_start = path.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    let dot = path[base_start..].iter().position(|&b| b == b'.')?;
    if dot == 0 {
        return None;
    }
    Some(&path[..base_start + dot])
}

/// The extension of a member path: what follows the first `.` of its last component.
pub fn extension(path: &[u8]) -> &[u8] {
    let base_start = path.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    let base = &path[base_start..];
    base.iter()
        .position(|&b| b == b'.')
        .map_or(&[][..], |d| &base[d + 1..])
}

/// A 64-bit hash of a sample key (FNV-1a, then a finalizer).
pub fn key_hash(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    // Never 0: that stands for "no hash" (a shard read through its saved index).
    (h ^ (h >> 33)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_webdataset() {
        assert_eq!(sample_key(b"n0144/000123.jpg"), Some(&b"n0144/000123"[..]));
        assert_eq!(sample_key(b"a/b.c/x.seg.png"), Some(&b"a/b.c/x"[..]));
        assert_eq!(sample_key(b"x.txt.gz"), Some(&b"x"[..]));
        assert_eq!(sample_key(b"dir/README"), None);
        assert_eq!(sample_key(b"dir/.hidden"), None);
        assert_eq!(sample_key(b"dir/"), None);
    }

    #[test]
    fn extensions_follow_the_first_dot_of_the_last_component() {
        assert_eq!(extension(b"a/b.c/x.seg.png"), b"seg.png");
        assert_eq!(extension(b"dir/README"), b"");
    }
}
