//! Loose files as a sample source (`--input-files ROOT`): a directory tree read as tar shards
//! whose bytes are synthesized (DESIGN invariant 14: where samples come from is a seam).
//!
//! A root is cut into units ([`units`]); each unit is one input shard at a `tree://` location,
//! so every phase reads it as it reads a tar shard: the index phase walks its synthesized
//! headers, the exchange reads byte ranges of it, `verify` digests its samples. Its bytes are a
//! deterministic tar ([`header`]) of its files in the canonical order ([`walk`]), produced on
//! demand ([`view`]). The source registers itself with the storage seam ([`register`]); the
//! ranks walk the units in the job's walk phase (`job/walk/`), and the listings they hold are
//! what [`Tree`] answers from.

use std::collections::HashMap;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::input::InputShard;
use crate::storage::paced::Paced;
use crate::storage::{self, Entry, Kind, OpenInput, Source, Stat};

pub(crate) mod header;
pub(crate) mod recut;
pub(crate) mod units;
pub(crate) mod view;
pub(crate) mod walk;

use view::{Listing, View};
use walk::{Rules, Skips};

/// The scheme of a unit's location.
pub(crate) const SCHEME: &str = "tree";

/// A directory of a root whose files one input shard holds: all below it (`deep`), or only
/// the files directly in it, or (a large flat directory, see [`units`]) only those of its files
/// whose keys lie in a range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Unit {
    /// Relative to the root; empty for the root itself.
    pub(crate) dir: Vec<u8>,
    pub(crate) deep: bool,
    /// A shallow unit's share of its directory's keys: from the first (inclusive; `None`:
    /// from the start, where the skips are counted) to the second (exclusive; `None`: to the
    /// end).
    #[serde(default)]
    pub(crate) keys: (Option<Vec<u8>>, Option<Vec<u8>>),
}

impl Unit {
    /// The unit of `dir`, whole.
    pub(crate) fn of(dir: Vec<u8>, deep: bool) -> Unit {
        Unit {
            dir,
            deep,
            keys: (None, None),
        }
    }

    /// Whether the key `key` is this unit's.
    pub(crate) fn holds(&self, key: &[u8]) -> bool {
        self.keys.0.as_deref().is_none_or(|from| key >= from)
            && self.keys.1.as_deref().is_none_or(|to| key < to)
    }
}

/// A root as every rank knows it: its path as given (what its units' locations, and so the
/// manifest, name: the same wherever the tree is, as `--input` paths), its canonical path (for
/// checks), and its rules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Root {
    pub(crate) path: PathBuf,
    pub(crate) canonical: PathBuf,
    pub(crate) rules: Rules,
}

/// What `--input-files` asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FilesRequest {
    pub(crate) roots: Vec<PathBuf>,
    pub(crate) key_regex: Option<String>,
    /// `--label-from-dir EXT`.
    pub(crate) label: Option<String>,
}

impl FilesRequest {
    /// The request the flags make, checked without I/O: no rule without a root, a key regex
    /// that compiles and has a capture group, and a label extension that is one name part.
    ///
    /// # Errors
    /// A usage error saying which flag and why.
    pub(crate) fn checked(
        roots: &[PathBuf],
        key_regex: Option<&str>,
        label: Option<&str>,
    ) -> Result<Self> {
        if roots.is_empty() {
            for (given, flag) in [
                (key_regex.is_some(), "--key-regex"),
                (label.is_some(), "--label-from-dir"),
            ] {
                if given {
                    bail!("{flag} names the samples of --input-files: give the tree with --input-files ROOT");
                }
            }
            return Ok(FilesRequest::default());
        }
        if let Some(re) = key_regex {
            let compiled = regex::bytes::Regex::new(re)
                .map_err(|e| anyhow::anyhow!("--key-regex {re:?}: {e}"))?;
            if compiled.captures_len() < 2 {
                bail!("--key-regex {re:?}: needs a capture group, e.g. '^(.*)/[^/]*$': the key is what the first group matches");
            }
        }
        if let Some(ext) = label {
            if ext.is_empty() || ext.contains(['.', '/']) || ext.starts_with('-') {
                bail!(
                    "--label-from-dir {ext:?}: expected an extension such as cls (no '.' or '/')"
                );
            }
        }
        Ok(FilesRequest {
            roots: roots.to_vec(),
            key_regex: key_regex.map(str::to_string),
            label: label.map(str::to_string),
        })
    }
}

/// Bytes kept as they are in a location; the rest as `%XX`.
fn keep(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"/._-".contains(&b)
}

fn encode(bytes: &[u8], out: &mut String) {
    for &b in bytes {
        if keep(b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

fn decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len());
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = [bytes.next()?, bytes.next()?];
            out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
        } else {
            out.push(b);
        }
    }
    Some(out)
}

/// The location of `unit` of `root`: `tree://ROOT//DIR`, with `?files` for a shallow unit and
/// `?deep` for a deep one holding a range of keys, the range as `&from=K1&to=K2` (`ROOT` may
/// be an object store's URL: `tree://s3%3A/%2Fbucket/prefix//DIR`).
pub(crate) fn unit_path(root: &Path, unit: &Unit) -> PathBuf {
    let mut s = format!("{SCHEME}://");
    let mut r = String::new();
    encode(root.as_os_str().as_bytes(), &mut r);
    // The root's own `//` (an `s3://` root's) encoded, as `//` ends the root.
    s.push_str(&r.replace("//", "/%2F"));
    s.push_str("//");
    encode(&unit.dir, &mut s);
    if !unit.deep {
        s.push_str("?files");
    } else if unit.keys != (None, None) {
        s.push_str("?deep");
    }
    for (bound, name) in [(&unit.keys.0, "&from="), (&unit.keys.1, "&to=")] {
        if let Some(key) = bound {
            s.push_str(name);
            encode(key, &mut s);
        }
    }
    PathBuf::from(s)
}

/// The root and unit a location names.
pub(crate) fn parse(path: &Path) -> Option<(PathBuf, Unit)> {
    let rest = path.to_str()?.strip_prefix("tree://")?;
    // `?` and `&` are encoded in the root and the directory: the first `?` starts the query.
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut parts = query.split('&');
    let deep = match parts.next() {
        Some("files") => false,
        Some("deep" | "") | None => true,
        Some(_) => return None,
    };
    let mut keys = (None, None);
    for part in parts {
        match part.split_once('=')? {
            ("from", k) => keys.0 = Some(decode(k)?),
            ("to", k) => keys.1 = Some(decode(k)?),
            _ => return None,
        }
    }
    let (root, dir) = rest.split_once("//")?;
    let root = PathBuf::from(std::ffi::OsStr::from_bytes(&decode(root)?));
    let unit = Unit {
        dir: decode(dir)?,
        deep,
        keys,
    };
    Some((root, unit))
}

/// The roots registered on this rank, and the listings it holds, by location.
static ROOTS: Mutex<Vec<Root>> = Mutex::new(Vec::new());
static LISTINGS: Mutex<Option<HashMap<PathBuf, Arc<Listing>>>> = Mutex::new(None);

/// The source of `tree://` locations.
pub(crate) struct Tree;
static PACED: Paced<Tree> = Paced(&Tree);

/// Registers the source with the storage seam and `roots` with it, on this rank.
pub(crate) fn register(roots: &[Root]) {
    storage::register_source(SCHEME, (&Tree, &PACED));
    let mut known = ROOTS.lock().unwrap_or_else(|e| e.into_inner());
    for root in roots {
        if !known.contains(root) {
            known.push(root.clone());
        }
    }
}

/// Keeps `listing` for the unit at `path` (walked here or received from the rank that walked it).
pub(crate) fn keep_listing(path: PathBuf, listing: Arc<Listing>) {
    let mut held = LISTINGS.lock().unwrap_or_else(|e| e.into_inner());
    held.get_or_insert_with(HashMap::new).insert(path, listing);
}

/// Walks the unit at `path` with its root's rules.
///
/// # Errors
/// The location names no registered root, or the walk fails (see [`walk::walk_unit`]).
pub(crate) fn walk(path: &Path) -> Result<(Listing, Skips)> {
    let (root, unit) = parse(path).with_context(|| format!("{}: not a unit", path.display()))?;
    let rules = {
        let roots = ROOTS.lock().unwrap_or_else(|e| e.into_inner());
        let found = roots.iter().find(|r| r.path == root);
        found.map(|r| r.rules.clone())
    };
    let Some(rules) = rules else {
        bail!(
            "{}: the root is not an --input-files root of this run",
            root.display()
        );
    };
    walk::walk_unit(&root, &unit, &rules)
}

/// The listing of the unit at `path`: the one this rank holds, else walked now (and kept).
fn listing(path: &Path) -> io::Result<Arc<Listing>> {
    {
        let held = LISTINGS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = held.as_ref().and_then(|m| m.get(path)) {
            return Ok(l.clone());
        }
    }
    let (listing, _) = walk(path).map_err(|e| io::Error::other(format!("{e:#}")))?;
    let listing = Arc::new(listing);
    keep_listing(path.to_path_buf(), listing.clone());
    Ok(listing)
}

impl Source for Tree {
    fn stat(&self, path: &Path) -> io::Result<Stat> {
        Ok(Stat {
            kind: Kind::File,
            stamp: listing(path)?.stamp(),
        })
    }

    fn stat_link(&self, path: &Path) -> io::Result<Stat> {
        self.stat(path)
    }

    fn list(&self, _path: &Path) -> io::Result<Vec<Entry>> {
        Err(io::ErrorKind::Unsupported.into())
    }

    fn canonical(&self, path: &Path) -> io::Result<PathBuf> {
        Ok(path.to_path_buf())
    }

    fn read(&self, _path: &Path) -> io::Result<Vec<u8>> {
        Err(io::ErrorKind::Unsupported.into())
    }

    fn open(&self, path: &Path) -> io::Result<OpenInput> {
        Ok(Arc::new(View::new(listing(path)?)))
    }
}

/// On rank 0: the roots of `request` checked and cut into units, as input shards (sized by the
/// walk phase) after `before` (the `--input` shards), and the roots every rank registers. A
/// `--key-regex` root is cut into directory units as any other: the walk phase (of `run` and
/// of `verify`) regroups its files by key once its directories are walked.
///
/// # Errors
/// A root that is not a directory, named twice or inside another, or that cannot be listed.
pub(crate) fn expand(request: &FilesRequest) -> Result<(Vec<InputShard>, Vec<Root>)> {
    let mut canon: Vec<PathBuf> = Vec::new();
    let mut cuts = Vec::new();
    let mut classes: Vec<Vec<u8>> = Vec::new();
    for given in &request.roots {
        let what = || format!("--input-files {}", given.display());
        let store = storage::source(given);
        let root = store.canonical(given).with_context(what)?;
        if store.stat(&root).with_context(what)?.kind != Kind::Dir {
            bail!("{}: not a directory", what());
        }
        if root == Path::new("/") {
            bail!("{}: the root of the file system is not a dataset", what());
        }
        if let Some(other) = canon
            .iter()
            .find(|c| root.starts_with(c) || c.starts_with(&root))
        {
            bail!(
                "{}: it overlaps the root {} (its files would be packed twice)",
                what(),
                other.display()
            );
        }
        let (units, own) = units::cut(&root).with_context(what)?;
        classes.extend(own);
        canon.push(root.clone());
        // Without repeated or trailing slashes, which would end the root early in a location
        // (an object store's URL keeps its `//`).
        let given: PathBuf = match given.to_str() {
            Some(url) if storage::is_object_store(given) => url.trim_end_matches('/').into(),
            _ => given.components().collect(),
        };
        cuts.push((given, root, units));
    }
    classes.sort();
    classes.dedup();
    let rules = Rules {
        key_regex: request.key_regex.clone(),
        label: request.label.clone().map(|ext| walk::Label {
            ext,
            classes: classes.clone(),
        }),
    };
    let mut inputs = Vec::new();
    let mut roots = Vec::new();
    for (given, root, units) in cuts {
        inputs.extend(units.iter().map(|u| InputShard {
            path: unit_path(&given, u),
            size: 0,
        }));
        roots.push(Root {
            path: given,
            canonical: root,
            rules: rules.clone(),
        });
    }
    // Rank 0 checks the inputs' locations before the walk phase registers the roots everywhere.
    register(&roots);
    Ok((inputs, roots))
}

/// The class list of `--label-from-dir`, one name a line in index order.
pub(crate) fn class_list(roots: &[Root]) -> Option<Vec<u8>> {
    let label = roots.first()?.rules.label.as_ref()?;
    let mut out = Vec::new();
    for c in &label.classes {
        out.extend_from_slice(c);
        out.push(b'\n');
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_locations_read_back() {
        let root = Path::new("/data/my set");
        let cases = [
            (&b""[..], false, true),
            (b"n01/a b", true, false),
            (b"\xff%?//x", true, false),
            (b"", true, true),
            (b"n02", true, true),
        ];
        for (dir, deep, ranged) in cases {
            let mut unit = Unit::of(dir.to_vec(), deep);
            if ranged {
                unit.keys = (Some(b"a&b=?".to_vec()), Some(b"n01/z".to_vec()));
            }
            let path = unit_path(root, &unit);
            assert!(path
                .to_str()
                .unwrap()
                .starts_with("tree:///data/my%20set//"));
            assert_eq!(parse(&path), Some((root.to_path_buf(), unit.clone())));
            let url = Path::new("s3://bucket/pre//fix");
            assert_eq!(
                parse(&unit_path(url, &unit)),
                Some((url.to_path_buf(), unit))
            );
        }
    }
}
