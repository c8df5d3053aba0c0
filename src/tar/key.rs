//! Sample keys, as webdataset forms them from member paths.

use std::sync::LazyLock;

use regex::Regex;

/// The key of a member path: everything up to the first `.` of the last path component, or
/// `None` when the last component has no `.` or starts with one (webdataset skips those).
pub(crate) fn sample_key(path: &[u8]) -> Option<&[u8]> {
    let base_start = path.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    let dot = path[base_start..].iter().position(|&b| b == b'.')?;
    if dot == 0 {
        return None;
    }
    Some(&path[..base_start + dot])
}

/// The extension of a member path: what follows the first `.` of its last component.
pub(crate) fn extension(path: &[u8]) -> &[u8] {
    let base_start = path.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    let base = &path[base_start..];
    base.iter()
        .position(|&b| b == b'.')
        .map_or(&[][..], |d| &base[d + 1..])
}

/// Which data loaders must read the member names as reshard does (`--energon`,
/// `--dali-index`): their indexes are written from reshard's keys and extensions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LoaderNames {
    pub(crate) energon: bool,
    pub(crate) dali: bool,
}

impl LoaderNames {
    /// What makes the member `path` (whose key is `key`) unusable for these loaders, if
    /// anything.
    pub(crate) fn problem(self, path: &[u8], key: &[u8]) -> Option<String> {
        if !self.energon && !self.dali {
            return None;
        }
        let Ok(path) = std::str::from_utf8(path) else {
            return Some("its path is not UTF-8, which the loader indexes require".into());
        };
        let key = String::from_utf8_lossy(key);
        let energon = self
            .energon
            .then(|| energon_name_problem(path, &key))
            .flatten();
        energon.or_else(|| self.dali.then(|| dali_name_problem(path)).flatten())
    }
}

/// What makes a member path unusable for Megatron-Energon, if anything: energon splits a path
/// into key and part with its own pattern (`split_name_re`) and skips `__name__` entries
/// (`skip_meta_re`), and its sample would then differ from reshard's.
pub(crate) fn energon_name_problem(path: &str, key: &str) -> Option<String> {
    if path.contains('\n') {
        return Some(
            "energon cannot split a member path with a line break into key and part".into(),
        );
    }
    // Compiled once: this runs for every member of the input.
    static META: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"^__[^/]*__($|/)").expect("valid pattern"));
    static SPLIT: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"^((?:.*/|)[^.]+)[.]([^/]*)$").expect("valid pattern"));
    if META.is_match(path) {
        return Some("energon skips members named like __name__, so its samples would differ from the output's".into());
    }
    match SPLIT.captures(path) {
        Some(c) if &c[1] == key => None,
        _ => Some(format!(
            "energon would not read the sample key {key:?} from it"
        )),
    }
}

/// What makes a member path unusable in DALI's index, whose fields are separated by spaces.
pub(crate) fn dali_name_problem(path: &str) -> Option<String> {
    path.contains(char::is_whitespace).then(|| {
        "DALI's index separates fields by spaces: a member path with white space cannot be written in it (--dali-index)".to_string()
    })
}

/// A 64-bit hash of a sample key (FNV-1a, then a finalizer).
pub(crate) fn key_hash(key: &[u8]) -> u64 {
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
    fn names_a_loader_reads_otherwise_are_found() {
        assert!(energon_name_problem("d/a.jpg", "d/a").is_none());
        assert!(energon_name_problem("a.b/c.seg.png", "a.b/c").is_none());
        assert!(energon_name_problem("__meta__/x.json", "__meta__/x").is_some());
        assert!(energon_name_problem("x\n/a.jpg", "x\n/a").is_some());
        assert!(dali_name_problem("a b.jpg").is_some() && dali_name_problem("ab.jpg").is_none());
        let both = LoaderNames {
            energon: true,
            dali: true,
        };
        assert!(both.problem(b"a\xff.jpg", b"a\xff").is_some());
        assert!(LoaderNames::default().problem(b"a b.jpg", b"a b").is_none());
    }

    #[test]
    fn extensions_follow_the_first_dot_of_the_last_component() {
        assert_eq!(extension(b"a/b.c/x.seg.png"), b"seg.png");
        assert_eq!(extension(b"dir/README"), b"");
    }
}
