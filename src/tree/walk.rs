//! One unit of a tree walked: its files listed with one `lstat` each, named by the key rule,
//! labelled, and put in the canonical order. The rules for what is not a sample's file:
//!
//! - hidden names (a leading `.`: `.git/`, `.DS_Store`, vim's `.x.swp`) and editors' leftovers
//!   (a trailing `~`, Emacs' `#x#`) are skipped, directories with all they hold;
//! - a symbolic link to a regular file is followed (the file's bytes, under the link's name);
//!   one to a directory is not (so a walk never loops), nor a dangling one: both skipped;
//! - FIFOs, sockets and devices are skipped, and never opened;
//! - a file the key rule gives no key (no `.` in its name; not matched by `--key-regex`) is
//!   skipped;
//! - a name that is not UTF-8 is an error naming it (no loader reads it back the same);
//! - empty files are members like any other, and a file that is itself a tar is a file.
//!
//! Every skip is counted and reported.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use anyhow::{bail, Context, Result};
use regex::bytes::Regex;
use serde::{Deserialize, Serialize};

use crate::storage::posix::{self, Posix};
use crate::storage::{Kind, Source};
use crate::tar::key::{extension, sample_key};
use crate::tree::view::{file_path, Bytes, Listing, Member};
use crate::tree::Unit;

/// How a root's files become samples: the key rule and the label.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Rules {
    /// `--key-regex`: the key is the first capture group of this expression matched against
    /// the path relative to the root. `None`: WebDataset's rule.
    pub(crate) key_regex: Option<String>,
    /// `--label-from-dir`: the label member's extension and the classes, in index order.
    pub(crate) label: Option<Label>,
}

/// `--label-from-dir EXT`: every sample gets the member `KEY.EXT` holding its class index.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Label {
    pub(crate) ext: String,
    /// The class directories' names, sorted: a class's index is its place here.
    pub(crate) classes: Vec<Vec<u8>>,
}

/// What a walk left out, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Skips {
    /// Hidden names and editors' leftovers (a directory counts once).
    pub(crate) hidden: u64,
    /// Symbolic links to directories, dangling links.
    pub(crate) links: u64,
    /// FIFOs, sockets, devices.
    pub(crate) special: u64,
    /// Files without a key (no `.` in the name, or not matched by `--key-regex`).
    pub(crate) keyless: u64,
}

impl Skips {
    pub(crate) fn to_array(self) -> [u64; 4] {
        [self.hidden, self.links, self.special, self.keyless]
    }

    pub(crate) fn from_array(a: [u64; 4]) -> Self {
        Skips {
            hidden: a[0],
            links: a[1],
            special: a[2],
            keyless: a[3],
        }
    }
}

/// Whether a name is hidden or an editor's leftover (see the module's rules).
pub(crate) fn hidden(name: &[u8]) -> bool {
    name.starts_with(b".")
        || name.ends_with(b"~")
        || (name.len() > 1 && name.starts_with(b"#") && name.ends_with(b"#"))
}

/// `dir/name` (or `name` at the root) as bytes.
pub(crate) fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut rel = dir.to_vec();
    if !rel.is_empty() {
        rel.push(b'/');
    }
    rel.extend_from_slice(name);
    rel
}

/// The error for a name that is not UTF-8.
pub(crate) fn not_utf8(root: &Path, rel: &[u8]) -> anyhow::Error {
    anyhow::anyhow!(
        "{}: the name is not UTF-8 ({:?}): a loader would not read it back as written; rename it",
        file_path(root, rel).display(),
        String::from_utf8_lossy(rel)
    )
}

/// A member on its way into a listing, with its key (to sort by).
struct Keyed {
    key: Vec<u8>,
    member: Member,
}

/// Walks `unit` of `root`: its listing in the canonical order (by key, then member name), and
/// what was skipped.
///
/// # Errors
/// A directory that cannot be listed, a file that cannot be examined, a name that is not
/// UTF-8, a key the loaders would read differently, a label that does not fit; each names the
/// file.
pub(crate) fn walk_unit(root: &Path, unit: &Unit, rules: &Rules) -> Result<(Listing, Skips)> {
    let regex = rules
        .key_regex
        .as_deref()
        .map(Regex::new)
        .transpose()
        .context("--key-regex")?;
    let mut skips = Skips::default();
    let mut found = Vec::new();
    let mut dirs = vec![unit.dir.clone()];
    while let Some(dir) = dirs.pop() {
        let path = file_path(root, &dir);
        let mut entries = Posix
            .list(&path)
            .with_context(|| format!("{}: cannot list the directory", path.display()))?;
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        for entry in entries {
            let name = entry.name.as_bytes();
            let rel = join(&dir, name);
            if hidden(name) {
                skips.hidden += 1;
                continue;
            }
            if std::str::from_utf8(&rel).is_err() {
                return Err(not_utf8(root, &rel));
            }
            match entry.kind {
                Kind::Dir if unit.deep => dirs.push(rel),
                Kind::Dir => {}
                Kind::Other => skips.special += 1,
                Kind::File | Kind::Link => {
                    let follow = entry.kind == Kind::Link;
                    let facts = match posix::facts(&file_path(root, &rel), follow) {
                        Ok(f) => f,
                        Err(_) if follow => {
                            skips.links += 1;
                            continue;
                        }
                        Err(e) => {
                            return Err(e).with_context(|| {
                                format!("{}: cannot stat", file_path(root, &rel).display())
                            })
                        }
                    };
                    match facts.kind {
                        Kind::File => {}
                        Kind::Dir | Kind::Link => {
                            skips.links += 1;
                            continue;
                        }
                        Kind::Other => {
                            skips.special += 1;
                            continue;
                        }
                    }
                    match keyed(root, rel, &facts, regex.as_ref())? {
                        Some(k) => found.push(k),
                        None => skips.keyless += 1,
                    }
                }
            }
        }
    }
    found.sort_by(|a, b| (&a.key, &a.member.name).cmp(&(&b.key, &b.member.name)));
    if let Some(label) = &rules.label {
        found = labelled(root, found, label)?;
    }
    let members = found.into_iter().map(|k| k.member).collect();
    Ok((Listing::new(root.to_path_buf(), members), skips))
}

/// The file `rel` as a member named by the key rule; `None` when it has no key.
fn keyed(
    root: &Path,
    rel: Vec<u8>,
    facts: &posix::FileFacts,
    regex: Option<&Regex>,
) -> Result<Option<Keyed>> {
    let ext = extension(&rel).to_vec();
    let key = match regex {
        None => match sample_key(&rel) {
            Some(k) => k.to_vec(),
            None => return Ok(None),
        },
        Some(re) => {
            let Some(key) = re.captures(&rel).and_then(|c| c.get(1)) else {
                return Ok(None);
            };
            if ext.is_empty() {
                return Ok(None);
            }
            let key = key.as_bytes().to_vec();
            let mut probe = key.clone();
            probe.extend_from_slice(b".x");
            if key.is_empty() || sample_key(&probe) != Some(&key[..]) {
                bail!(
                    "{}: --key-regex gives the key {:?}, which is empty or holds a '.' in its last part: a loader reads a key up to the first '.' of the name",
                    file_path(root, &rel).display(),
                    String::from_utf8_lossy(&key)
                );
            }
            key
        }
    };
    let mut name = key.clone();
    name.push(b'.');
    name.extend_from_slice(&ext);
    let mtime_s = facts.stamp.mtime_ns.div_euclid(1_000_000_000);
    Ok(Some(Keyed {
        key,
        member: Member {
            name,
            source: Bytes::File(rel),
            size: facts.stamp.size,
            mode: facts.mode,
            mtime: i64::try_from(mtime_s).unwrap_or(0),
            mtime_ns: facts.stamp.mtime_ns,
        },
    }))
}

/// `found` (sorted by key and name) with each sample's label member added in its place.
fn labelled(root: &Path, found: Vec<Keyed>, label: &Label) -> Result<Vec<Keyed>> {
    let mut out: Vec<Keyed> = Vec::with_capacity(found.len() + found.len() / 2);
    let mut group: Vec<Keyed> = Vec::new();
    let mut rest = found.into_iter().peekable();
    while let Some(k) = rest.next() {
        let last = rest.peek().is_none_or(|n| n.key != k.key);
        group.push(k);
        if last {
            out.extend(label_group(root, std::mem::take(&mut group), label)?);
        }
    }
    Ok(out)
}

/// One sample's members and its label member, sorted by name.
fn label_group(root: &Path, mut group: Vec<Keyed>, label: &Label) -> Result<Vec<Keyed>> {
    let class_of = |m: &Member| -> Result<Vec<u8>> {
        let Bytes::File(rel) = &m.source else {
            unreachable!("only files before labels")
        };
        match rel.iter().position(|&b| b == b'/') {
            Some(i) => Ok(rel[..i].to_vec()),
            None => bail!(
                "{}: --label-from-dir: a file directly in the root has no class directory",
                file_path(root, rel).display()
            ),
        }
    };
    let class = class_of(&group[0].member)?;
    for k in &group[1..] {
        if class_of(&k.member)? != class {
            bail!(
                "--label-from-dir: sample {:?} has files in two class directories ({:?} and {:?})",
                String::from_utf8_lossy(&k.key),
                String::from_utf8_lossy(&class),
                String::from_utf8_lossy(&class_of(&k.member)?)
            );
        }
    }
    let Ok(index) = label.classes.binary_search(&class) else {
        bail!(
            "--label-from-dir: {:?} is not among the classes",
            String::from_utf8_lossy(&class)
        );
    };
    let key = group[0].key.clone();
    let mut name = key.clone();
    name.push(b'.');
    name.extend_from_slice(label.ext.as_bytes());
    if group.iter().any(|k| k.member.name == name) {
        bail!(
            "--label-from-dir {}: the sample {:?} already has a file named {:?}",
            label.ext,
            String::from_utf8_lossy(&key),
            String::from_utf8_lossy(&name)
        );
    }
    let text = index.to_string().into_bytes();
    group.push(Keyed {
        key,
        member: Member {
            name,
            size: text.len() as u64,
            source: Bytes::Inline(text),
            mode: 0o644,
            mtime: 0,
            mtime_ns: 0,
        },
    });
    group.sort_by(|a, b| a.member.name.cmp(&b.member.name));
    Ok(group)
}
