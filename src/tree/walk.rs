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
//!
//! On object storage (`--input-files s3://bucket/prefix/`) a deep unit is one flat listing of
//! its prefix (the store pages through it whatever the layout below), a shallow one a listing
//! with the delimiter `/`; the listing's size, last-modified time and ETag play the role of
//! `lstat`: every object is a regular file of mode 0644 whose mtime is its last-modified time
//! in whole seconds; a hidden name hides all below it, as a hidden directory does.

use std::collections::HashSet;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use anyhow::{bail, Context, Result};
use regex::bytes::Regex;
use serde::{Deserialize, Serialize};

use crate::storage::posix::{self, FileFacts, Posix};
use crate::storage::s3::Objects;
use crate::storage::{objects, Kind, Source};
use crate::tar::key::{extension, sample_key};
use crate::tree::view::{file_path, Bytes, Listing, Member};
use crate::tree::Unit;

/// The mode every object's member gets (on object storage): what a file downloaded under the
/// usual umask has.
pub(crate) const OBJECT_MODE: u32 = 0o644;

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
/// what was skipped. The walk phase does the same in its steps ([`names`], [`examine`] here or
/// on another rank, [`take`], [`finish`]), to deal a large directory's files over the ranks.
///
/// # Errors
/// A directory that cannot be listed, a file that cannot be examined, a name that is not
/// UTF-8, a key the loaders would read differently, a label that does not fit; each names the
/// file.
pub(crate) fn walk_unit(root: &Path, unit: &Unit, rules: &Rules) -> Result<(Listing, Skips)> {
    let Named {
        mut found,
        dirs,
        mut skips,
        ..
    } = names(root, unit, rules)?;
    for file in dirs.into_iter().flatten() {
        let facts = examine(root, &file);
        take(root, file, facts, &mut found, &mut skips)?;
    }
    finish(root, unit, rules, found, skips)
}

/// A file a unit's walk has named (its directory said it is a file or a link) and not yet
/// examined.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Unexamined {
    /// Relative to the root.
    pub(crate) rel: Vec<u8>,
    /// A symbolic link: examined by `stat`, not `lstat`.
    pub(crate) follow: bool,
}

/// A unit walked up to its files' examination.
#[derive(Debug, Default)]
pub(crate) struct Named {
    /// Files whose facts are known already (on object storage, the listing's).
    pub(crate) found: Vec<(Vec<u8>, FileFacts)>,
    /// The files still to examine, by directory (each in name order).
    pub(crate) dirs: Vec<Vec<Unexamined>>,
    pub(crate) skips: Skips,
    /// The directories listed (or prefixes listed, on object storage).
    pub(crate) listed: u64,
}

/// Whether `unit` of a root with `rules` is a key range of the rule's keys (see
/// [`walk_unit`]'s cases).
fn by_rule(unit: &Unit, rules: &Rules) -> bool {
    rules.key_regex.is_some() && unit.dir.is_empty() && unit.deep
}

/// Whether the file `rel` of a unit's directory is the unit's (not by a `--key-regex` rule):
/// its key by WebDataset's rule is in the unit's range, or it has none and the unit is the
/// directory's first. Each file of a directory cut into key ranges is one unit's.
pub(crate) fn owns(unit: &Unit, rel: &[u8]) -> bool {
    sample_key(rel).map_or(unit.keys.0.is_none(), |k| unit.holds(k))
}

/// The files of `unit` of `root`, listed and not examined (a file outside a unit's keys left
/// out, see [`local_files`]), and what the listings skipped.
///
/// # Errors
/// A directory that cannot be listed, a name that is not UTF-8.
pub(crate) fn names(root: &Path, unit: &Unit, rules: &Rules) -> Result<Named> {
    let mut named = Named::default();
    if let Some(store) = objects(root) {
        named.found = object_files(store, root, unit, &mut named.skips)?;
        named.listed = 1;
    } else {
        local_files(root, unit, !by_rule(unit, rules), &mut named)?;
    }
    if unit.keys.0.is_some() {
        // What the listing of a directory cut into key ranges skipped is counted by its
        // first unit (each unit lists the whole directory).
        named.skips = Skips::default();
    }
    Ok(named)
}

/// The facts of `file` of `root`: one `lstat` (a `stat` for a link).
///
/// # Errors
/// It cannot be examined.
pub(crate) fn examine(root: &Path, file: &Unexamined) -> std::io::Result<FileFacts> {
    posix::facts(&file_path(root, &file.rel), file.follow)
}

/// `file` examined (`facts`) into `found`, or counted in `skips` (a link to a directory or a
/// dangling one, a special file).
///
/// # Errors
/// A file (not a link) that could not be examined, naming it.
pub(crate) fn take(
    root: &Path,
    file: Unexamined,
    facts: std::io::Result<FileFacts>,
    found: &mut Vec<(Vec<u8>, FileFacts)>,
    skips: &mut Skips,
) -> Result<()> {
    let facts = match facts {
        Ok(f) => f,
        Err(_) if file.follow => {
            skips.links += 1;
            return Ok(());
        }
        Err(e) => {
            return Err(e)
                .with_context(|| format!("{}: cannot stat", file_path(root, &file.rel).display()))
        }
    };
    match facts.kind {
        Kind::File => found.push((file.rel, facts)),
        // The directory listed a file here: it became something else since (examined later
        // than listed, by this rank or another), which is a change during the run, not a skip.
        _ if !file.follow => bail!(
            "{}: it changed since it was listed: listed as a regular file, now {}",
            file_path(root, &file.rel).display(),
            match facts.kind {
                Kind::Dir => "a directory",
                Kind::Link => "a symbolic link",
                _ => "a FIFO, socket or device",
            }
        ),
        Kind::Dir | Kind::Link => skips.links += 1,
        Kind::Other => skips.special += 1,
    }
    Ok(())
}

/// The listing of `unit` of `root` from its examined files (`files`) and what its walk
/// skipped: named by the key rule, labelled, in the canonical order.
///
/// # Errors
/// A key the loaders would read differently, a label that does not fit; each names the file.
pub(crate) fn finish(
    root: &Path,
    unit: &Unit,
    rules: &Rules,
    files: Vec<(Vec<u8>, FileFacts)>,
    mut skips: Skips,
) -> Result<(Listing, Skips)> {
    let regex = rules
        .key_regex
        .as_deref()
        .map(Regex::new)
        .transpose()
        .context("--key-regex")?;
    // With `--key-regex`, a unit of the root's whole tree holds a range of the rule's keys
    // (the walk phase's regrouped units); any other unit's range is of WebDataset's keys of
    // the paths (a large directory's, cut by the names listed), and its samples are whole only
    // once regrouped: it gets no labels.
    let by_rule = by_rule(unit, rules);
    let mut found = Vec::with_capacity(files.len());
    for (rel, facts) in files {
        let held = by_rule || owns(unit, &rel);
        match keyed(root, rel, &facts, regex.as_ref())? {
            Some(k) if by_rule && !unit.holds(&k.key) => {}
            Some(k) if held => found.push(k),
            Some(_) => {}
            None if held => skips.keyless += 1,
            None => {}
        }
    }
    if by_rule && unit.keys.0.is_some() {
        // A range of a `--key-regex` root's keys: every such unit walks the whole tree, and
        // the first counts what it skipped. Any other unit counts the skips of the files it
        // owns (see [`owns`]) and, when first, those of its directory's listing.
        skips = Skips::default();
    }
    let label = rules
        .label
        .as_ref()
        .filter(|_| by_rule || rules.key_regex.is_none());
    let listing = in_order(root, found, label)?;
    Ok((listing, skips))
}

/// `found` as a listing in the canonical order (by key, then member name), with labels.
fn in_order(root: &Path, mut found: Vec<Keyed>, label: Option<&Label>) -> Result<Listing> {
    // Two files of one name under `--key-regex` (a duplicate member) in the order of their
    // paths, whatever ranks walked them.
    fn path(k: &Keyed) -> &[u8] {
        match &k.member.source {
            Bytes::File(rel) => rel,
            Bytes::Inline(_) => &[],
        }
    }
    found.sort_by(|a, b| (&a.key, &a.member.name, path(a)).cmp(&(&b.key, &b.member.name, path(b))));
    if let Some(label) = label {
        found = labelled(root, found, label)?;
    }
    let members = found.into_iter().map(|k| k.member).collect();
    Ok(Listing::new(root.to_path_buf(), members))
}

/// The listing of one key range of a `--key-regex` root: `members`, gathered from the walks of
/// the directories that hold them, in the canonical order, with their labels.
///
/// # Errors
/// A label that does not fit (see `--label-from-dir`), naming the file.
pub(crate) fn gathered(root: &Path, members: Vec<Member>, rules: &Rules) -> Result<Listing> {
    let found = members
        .into_iter()
        .map(|member| Keyed {
            key: member.key().to_vec(),
            member,
        })
        .collect();
    in_order(root, found, rules.label.as_ref())
}

/// The regular files and links of `unit` of the directory `root`, relative to the root, by
/// directory into `named` to be examined: one `readdir` per directory (the kind its entries
/// give). What is left out is counted in its skips; with `by_path`, a file whose key by
/// WebDataset's rule is outside the unit's range is left out uncounted, never examined.
///
/// # Errors
/// A directory that cannot be listed, a name that is not UTF-8.
fn local_files(root: &Path, unit: &Unit, by_path: bool, named: &mut Named) -> Result<()> {
    let skips = &mut named.skips;
    let mut dirs = vec![unit.dir.clone()];
    while let Some(dir) = dirs.pop() {
        let path = file_path(root, &dir);
        let mut entries = Posix
            .list(&path)
            .with_context(|| format!("{}: cannot list the directory", path.display()))?;
        named.listed += 1;
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        let mut files = Vec::new();
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
                    // Another unit's share of a large directory: not even examined.
                    if by_path && !owns(unit, &rel) {
                        continue;
                    }
                    let follow = entry.kind == Kind::Link;
                    files.push(Unexamined { rel, follow });
                }
            }
        }
        if !files.is_empty() {
            named.dirs.push(files);
        }
    }
    Ok(())
}

/// On object storage: the objects of `unit` of the prefix `root` in `store`, as files relative
/// to the root with their facts; hidden names and editors' leftovers counted in `skips` (a
/// hidden prefix once).
///
/// # Errors
/// The listing fails; the message names the prefix.
fn object_files(
    store: &Objects,
    root: &Path,
    unit: &Unit,
    skips: &mut Skips,
) -> Result<Vec<(Vec<u8>, FileFacts)>> {
    let prefix = file_path(root, &unit.dir);
    let (listed, prefixes) = store
        .list_objects(&prefix, unit.deep)
        .with_context(|| format!("{}/: cannot list the prefix", prefix.display()))?;
    // A shallow unit's hidden prefixes count as a directory's do in its listing.
    skips.hidden += prefixes.iter().filter(|p| hidden(p.as_bytes())).count() as u64;
    let mut hidden_dirs: HashSet<&str> = HashSet::new();
    let mut out = Vec::with_capacity(listed.len());
    for l in &listed {
        let parts: Vec<&str> = l.rel.split('/').collect();
        if let Some(i) = parts.iter().position(|p| hidden(p.as_bytes())) {
            // The hidden part and what is above it: a hidden prefix counts once.
            let end = parts[..=i].iter().map(|p| p.len()).sum::<usize>() + i;
            if i + 1 == parts.len() || hidden_dirs.insert(&l.rel[..end]) {
                skips.hidden += 1;
            }
            continue;
        }
        let facts = FileFacts {
            kind: Kind::File,
            stamp: l.stamp,
            mode: OBJECT_MODE,
            volume: 0,
        };
        out.push((join(&unit.dir, l.rel.as_bytes()), facts));
    }
    Ok(out)
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
            identity: facts.stamp.identity,
            ctime_ns: facts.stamp.ctime_ns,
            volume: facts.volume,
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
            identity: 0,
            ctime_ns: 0,
            volume: 0,
        },
    });
    group.sort_by(|a, b| a.member.name.cmp(&b.member.name));
    Ok(group)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name the directory listed as a regular file, examined later (by its rank or another)
    /// as something else: the run fails naming it (it changed during the run); a link listed
    /// as a link that leads to a directory is a skip, as the rules say.
    #[test]
    fn a_listed_file_that_became_something_else_is_a_change_not_a_skip() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::create_dir(root.join("was-a-file")).unwrap();
        std::os::unix::fs::symlink("was-a-file", root.join("link")).unwrap();
        let (mut found, mut skips) = (Vec::new(), Skips::default());
        for (name, follow) in [("was-a-file", false), ("link", true)] {
            let file = Unexamined {
                rel: name.as_bytes().to_vec(),
                follow,
            };
            let facts = examine(root, &file);
            let got = take(root, file, facts, &mut found, &mut skips);
            if follow {
                got.unwrap();
            } else {
                let e = format!("{:#}", got.unwrap_err());
                assert!(
                    e.contains("was-a-file: it changed since it was listed"),
                    "{e}"
                );
                assert!(e.contains("now a directory"), "{e}");
            }
        }
        assert!(found.is_empty());
        assert_eq!(skips.links, 1);
    }

    /// A directory cut into key ranges, each unit walked alone: every skip counted once over
    /// the units, those found when examined (dangling links) by the unit that owns the file,
    /// those of the listing (hidden, FIFOs) and the keyless by the first.
    #[test]
    fn a_directory_cut_into_key_ranges_counts_each_skip_once() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        for name in ["a.x", "b.x", "m.x", "z.x", ".hidden", "keyless"] {
            std::fs::write(root.join(name), b"1").unwrap();
        }
        std::os::unix::fs::symlink("nothing", root.join("b.lnk")).unwrap();
        std::os::unix::fs::symlink("nothing", root.join("y.lnk")).unwrap();
        let cut = |from: Option<&str>, to: Option<&str>| Unit {
            dir: Vec::new(),
            deep: false,
            keys: (from.map(|k| k.into()), to.map(|k| k.into())),
        };
        let rules = Rules::default();
        let mut total = Skips::default();
        let mut members = 0;
        for unit in [cut(None, Some("m")), cut(Some("m"), None)] {
            let (listing, skips) = walk_unit(root, &unit, &rules).unwrap();
            members += listing.members.len();
            for (t, s) in [
                (&mut total.hidden, skips.hidden),
                (&mut total.links, skips.links),
                (&mut total.special, skips.special),
                (&mut total.keyless, skips.keyless),
            ] {
                *t += s;
            }
        }
        let whole = walk_unit(root, &Unit::of(Vec::new(), false), &rules).unwrap();
        assert_eq!(members, whole.0.members.len());
        assert_eq!(total, whole.1);
        let want = Skips {
            hidden: 1,
            links: 2,
            special: 0,
            keyless: 1,
        };
        assert_eq!(total, want);
    }
}
