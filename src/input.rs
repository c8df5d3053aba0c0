//! Input spec expansion: turns `--input` specs into the canonical, ordered list of shard files.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::storage::{self, Kind};

/// One input shard: its location as the spec named it and its size when the run started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputShard {
    /// Where the shard is: a path in its [`storage::source`] (the scheme picks the backend),
    /// opened only through it.
    pub(crate) path: PathBuf,
    pub(crate) size: u64,
}

/// How `index.json` records the input shards at `paths`: as given, unless a directory on the
/// way is reached through a symbolic link (the `--link` an epoch loop reads and moves, say):
/// then the directory the link led to when the run read it, so that the record keeps naming the
/// bytes this run read after the link moves. Only the directories are resolved, one look-up per
/// distinct directory; a shard file that is a link itself is recorded by its own name.
pub(crate) fn recorded_paths<'a>(paths: impl IntoIterator<Item = &'a Path>) -> Vec<String> {
    let cwd = std::env::current_dir().ok();
    let mut dirs = std::collections::HashMap::new();
    let mut record = |path: &Path| -> Option<String> {
        let (cwd, name) = (cwd.as_deref()?, path.file_name()?);
        if !storage::is_file_system(path) {
            return None;
        }
        let dir = path.parent().unwrap_or(Path::new(""));
        let real = dirs
            .entry(dir.to_path_buf())
            .or_insert_with(|| through_a_link(cwd, dir));
        Some(real.as_ref()?.join(name).display().to_string())
    };
    paths
        .into_iter()
        .map(|path| record(path).unwrap_or_else(|| path.display().to_string()))
        .collect()
}

/// The directory `dir` (relative to `cwd`) really is, when a symbolic link on its way makes it
/// differ from `dir` read as written; `None` when it does not (or cannot be resolved).
fn through_a_link(cwd: &Path, dir: &Path) -> Option<PathBuf> {
    let written = cwd.join(dir);
    let real = storage::source(&written).canonical(&written).ok()?;
    let mut plain = PathBuf::new();
    for part in written.components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                plain.pop();
            }
            other => plain.push(other),
        }
    }
    (real != plain).then_some(real)
}

/// Expands every spec in order and concatenates the results.
///
/// A spec is `@list.txt` (one path per line; blank lines and `#` comments skipped; relative paths
/// are relative to the list file's directory), a directory (its `*.tar` files sorted by name), a
/// pattern with `{a..b}` numeric ranges or `{x,y}` alternatives, or a file path.
///
/// # Errors
/// A missing file or directory, a directory with no `.tar` files, a malformed brace pattern, or a
/// file named twice (its samples would be duplicated).
pub(crate) fn expand_specs(specs: &[String]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for spec in specs {
        out.extend(expand_spec(spec)?);
    }
    let mut seen = std::collections::HashMap::new();
    let mut files = std::collections::HashMap::new();
    for p in &out {
        let canon = storage::source(p)
            .canonical(p)
            .with_context(|| format!("input {}", p.display()))?;
        if let Some(first) = seen.insert(canon, p.clone()) {
            bail!(
                "input {} is named twice (also as {}): its samples would be duplicated",
                p.display(),
                first.display()
            );
        }
        // Two paths of one file (hard links) canonicalize apart: a file is its device and
        // inode. An object is its bucket and key, which its canonical path is.
        if storage::is_file_system(p) {
            let stamp = storage::stamp(p).with_context(|| format!("input {}", p.display()))?;
            if let Some(first) = files.insert((stamp.dev, stamp.identity), p.clone()) {
                bail!(
                    "input {} is the same file as input {} (hard links: device {}, inode {}): its samples would be duplicated",
                    p.display(),
                    first.display(),
                    stamp.dev,
                    stamp.identity
                );
            }
        }
    }
    Ok(out)
}

fn expand_spec(spec: &str) -> Result<Vec<PathBuf>> {
    if let Some(list) = spec.strip_prefix('@') {
        return read_list(Path::new(list));
    }
    let path = Path::new(spec);
    if kind(path) == Some(Kind::Dir) {
        return list_dir(path);
    }
    if spec.contains('{') {
        let paths: Vec<PathBuf> = expand_braces(spec)?
            .into_iter()
            .map(PathBuf::from)
            .collect();
        for p in &paths {
            check_file(p).with_context(|| format!("expanding {spec:?}"))?;
        }
        return Ok(paths);
    }
    check_file(path)?;
    Ok(vec![path.to_path_buf()])
}

/// What `path` is in its storage (following links), if anything.
fn kind(path: &Path) -> Option<Kind> {
    storage::source(path).stat(path).ok().map(|s| s.kind)
}

fn check_file(path: &Path) -> Result<()> {
    let stat = storage::source(path)
        .stat(path)
        .with_context(|| format!("input {}", path.display()))?;
    if stat.kind != Kind::File {
        bail!("input {}: not a regular file", path.display());
    }
    Ok(())
}

fn read_list(list: &Path) -> Result<Vec<PathBuf>> {
    let text = storage::source(list)
        .read(list)
        .and_then(|b| String::from_utf8(b).map_err(std::io::Error::other))
        .with_context(|| format!("input list {}", list.display()))?;
    let base = list.parent().unwrap_or(Path::new(""));
    let mut out = Vec::new();
    for (lineno, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let p = Path::new(line);
        // An `s3://` location is absolute too.
        let p = if p.is_absolute() || storage::is_object_store(p) {
            p.to_path_buf()
        } else {
            base.join(p)
        };
        check_file(&p).with_context(|| format!("{}:{}", list.display(), lineno + 1))?;
        out.push(p);
    }
    if out.is_empty() {
        bail!("input list {} names no files", list.display());
    }
    Ok(out)
}

fn list_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut names = Vec::new();
    let entries = storage::source(dir)
        .list(dir)
        .with_context(|| format!("input directory {}", dir.display()))?;
    for entry in entries {
        let name = entry.name;
        let lower = name.to_string_lossy().to_ascii_lowercase();
        let is_tar = [".tar", ".tar.gz", ".tgz", ".tar.zst", ".tar.zstd"]
            .iter()
            .any(|ext| lower.ends_with(ext));
        // Following a link: a link to a shard is a shard. A file as listed needs no stat (on
        // object storage that would be a request per shard).
        let file = entry.kind == Kind::File
            || (entry.kind == Kind::Link && kind(&dir.join(&name)) == Some(Kind::File));
        if is_tar && file {
            names.push(name);
        }
    }
    if names.is_empty() {
        // A `--split` output: its splits' shards, split by split.
        if let Some(splits) = split_names(dir) {
            let mut all = Vec::new();
            for name in splits {
                all.extend(list_dir(&dir.join(name))?);
            }
            return Ok(all);
        }
        bail!(
            "input directory {} holds no shards (*.tar, *.tar.gz, *.tgz, *.tar.zst)",
            dir.display()
        );
    }
    // Byte order of names, the same on every rank and every locale.
    names.sort_by(|a, b| a.as_encoded_bytes().cmp(b.as_encoded_bytes()));
    Ok(names.into_iter().map(|n| dir.join(n)).collect())
}

/// Refuses input shards read from a reshard output whose `--equalize` left samples out or wrote
/// some twice (its index.json's `reshard.dropped` and `reshard.repeated`): a run on it would
/// never see the samples left out again, or would carry the repeats as samples of their own,
/// and an epoch loop that reads each epoch's output as the next one's input would change the
/// dataset epoch by epoch. Reading the original input with each `--epoch` instead gives every
/// epoch all of its samples, with a fresh choice of those dropped or repeated. One index.json
/// per directory of shards is read.
///
/// # Errors
/// A shard's directory holds such an index.json.
pub(crate) fn refuse_equalized_output(paths: &[PathBuf]) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for dir in paths.iter().filter_map(|p| p.parent()) {
        if !seen.insert(dir) {
            continue;
        }
        let index = dir.join("index.json");
        let Ok(text) = storage::source(&index).read(&index) else {
            continue;
        };
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&text) else {
            continue;
        };
        let run = &v["reshard"];
        let len = |field: &str| run[field].as_array().map_or(0, Vec::len);
        let (dropped, repeated) = (len("dropped"), len("repeated"));
        if dropped == 0 && repeated == 0 {
            continue;
        }
        let what = if dropped > 0 {
            format!("--equalize drop left out {dropped} of its input's samples: a run on it never sees them again")
        } else {
            format!("--equalize pad wrote {repeated} samples twice: a run on it takes the copies for samples of their own")
        };
        let inputs: Vec<&str> = run["inputs"]
            .as_array()
            .map(|a| a.iter().filter_map(|s| s.as_str()).collect())
            .unwrap_or_default();
        let original = match inputs.as_slice() {
            [] => String::new(),
            [one] => format!(" ({one})"),
            [first, rest @ ..] => format!(" ({first} and {} more)", rest.len()),
        };
        bail!(
            "input {} is a reshard output whose {what}; read the original input{original} with the next --epoch instead: every epoch then has all its samples, with a fresh choice of those {}",
            dir.display(),
            if dropped > 0 { "left out" } else { "repeated" }
        );
    }
    Ok(())
}

/// The split names of `dir`, when it is the output of a `reshard run --split` (its index.json's
/// `reshard.splits`), in their order.
pub(crate) fn split_names(dir: &Path) -> Option<Vec<String>> {
    let index = dir.join("index.json");
    let text = storage::source(&index).read(&index).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
    let names: Vec<String> = v["reshard"]["splits"]
        .as_array()?
        .iter()
        .map(|s| s["split"].as_str().map(str::to_string))
        .collect::<Option<_>>()?;
    // A name is a directory inside `dir`, never a way out of it.
    let plain = |n: &String| !n.is_empty() && !n.starts_with('.') && !n.contains('/');
    (!names.is_empty() && names.iter().all(plain)).then_some(names)
}

/// Expands webdataset-style brace patterns: `{000..127}` is a numeric range whose zero padding is
/// the width of the first bound, `{a,b,c}` lists alternatives. Several braces form a product in
/// left-to-right order (the last brace varies fastest).
///
/// # Errors
/// Unbalanced or nested braces, an empty brace, or a range whose bounds are not numbers.
pub(crate) fn expand_braces(pattern: &str) -> Result<Vec<String>> {
    let Some(open) = pattern.find('{') else {
        if pattern.contains('}') {
            bail!("brace pattern {pattern:?}: '}}' without '{{'");
        }
        return Ok(vec![pattern.to_string()]);
    };
    let rest = &pattern[open + 1..];
    let close = rest
        .find('}')
        .with_context(|| format!("brace pattern {pattern:?}: '{{' without '}}'"))?;
    let body = &rest[..close];
    if body.contains('{') {
        bail!("brace pattern {pattern:?}: nested braces are not supported");
    }
    let alternatives =
        brace_alternatives(body).with_context(|| format!("brace pattern {pattern:?}"))?;
    let head = &pattern[..open];
    let tails = expand_braces(&rest[close + 1..])?;
    let mut out = Vec::with_capacity(alternatives.len() * tails.len());
    for alt in &alternatives {
        for tail in &tails {
            out.push(format!("{head}{alt}{tail}"));
        }
    }
    Ok(out)
}

fn brace_alternatives(body: &str) -> Result<Vec<String>> {
    if let Some((lo, hi)) = body.split_once("..") {
        let width = lo.len();
        let a: u64 = lo
            .parse()
            .with_context(|| format!("range start {lo:?} is not a number"))?;
        let b: u64 = hi
            .parse()
            .with_context(|| format!("range end {hi:?} is not a number"))?;
        if b < a {
            bail!("range {{{body}}} runs backwards");
        }
        return Ok((a..=b).map(|i| format!("{i:0width$}")).collect());
    }
    if body.is_empty() {
        bail!("empty braces");
    }
    Ok(body.split(',').map(str::to_string).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_recorded_where_a_linked_directory_led() {
        let tmp = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(tmp.path()).unwrap();
        std::fs::create_dir(base.join("a")).unwrap();
        std::fs::write(base.join("a/x.tar"), b"").unwrap();
        std::os::unix::fs::symlink("a", base.join("l")).unwrap();
        let given = [
            base.join("a/x.tar"),
            base.join("l/x.tar"),
            base.join("a/./../a/x.tar"),
        ];
        let show = |p: &Path| p.display().to_string();
        assert_eq!(
            recorded_paths(given.iter().map(PathBuf::as_path)),
            [
                show(&given[0]),
                show(&base.join("a/x.tar")),
                show(&given[2])
            ]
        );
    }
    use std::fs;

    #[test]
    fn numeric_range_keeps_padding() {
        let v = expand_braces("d/train-{000008..000011}.tar").unwrap();
        assert_eq!(
            v,
            [
                "d/train-000008.tar",
                "d/train-000009.tar",
                "d/train-000010.tar",
                "d/train-000011.tar"
            ]
        );
    }

    #[test]
    fn several_braces_form_a_product_last_fastest() {
        let v = expand_braces("{a,b}-{0..1}.tar").unwrap();
        assert_eq!(v, ["a-0.tar", "a-1.tar", "b-0.tar", "b-1.tar"]);
    }

    #[test]
    fn bad_braces_are_errors() {
        assert!(expand_braces("x{1..").is_err());
        assert!(expand_braces("x}1").is_err());
        assert!(expand_braces("x{}").is_err());
        assert!(expand_braces("x{5..2}").is_err());
        assert!(expand_braces("x{a..b}").is_err());
        assert!(expand_braces("x{{1,2}}").is_err());
    }

    #[test]
    fn directory_list_and_pattern_specs() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["b.tar", "a.tar", "c.txt", "a10.tar"] {
            fs::write(dir.path().join(name), b"x").unwrap();
        }
        let d = dir.path().to_str().unwrap().to_string();
        let got = expand_specs(std::slice::from_ref(&d)).unwrap();
        let names: Vec<_> = got
            .iter()
            .map(|p| p.file_name().unwrap().to_owned())
            .collect();
        assert_eq!(names, ["a.tar", "a10.tar", "b.tar"]);

        fs::write(dir.path().join("list.txt"), "# comment\nb.tar\n\na.tar\n").unwrap();
        let got = expand_specs(&[format!("@{d}/list.txt")]).unwrap();
        assert_eq!(got, [dir.path().join("b.tar"), dir.path().join("a.tar")]);

        let got = expand_specs(&[format!("{d}/{{b,a}}.tar")]).unwrap();
        assert_eq!(got.len(), 2);

        let err = expand_specs(&[format!("{d}/a.tar"), format!("{d}/{{a,b}}.tar")]).unwrap_err();
        assert!(format!("{err:#}").contains("named twice"), "{err:#}");
        let err = expand_specs(&[format!("{d}/{{a,zz}}.tar")]).unwrap_err();
        assert!(format!("{err:#}").contains("zz.tar"), "{err:#}");
    }

    /// Hard links, a symlink and `a/../a` name one file: each is refused naming both paths.
    #[test]
    fn one_file_under_two_names_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::create_dir(d.join("sub")).unwrap();
        fs::write(d.join("a.tar"), b"x").unwrap();
        fs::write(d.join("b.tar"), b"x").unwrap();
        fs::hard_link(d.join("a.tar"), d.join("sub/linked.tar")).unwrap();
        std::os::unix::fs::symlink(d.join("a.tar"), d.join("sym.tar")).unwrap();
        let spec = |p: &Path| p.to_str().unwrap().to_string();
        let ok = expand_specs(&[spec(&d.join("a.tar")), spec(&d.join("b.tar"))]).unwrap();
        assert_eq!(ok.len(), 2, "same bytes, two files: both read");
        for (other, needle) in [
            (d.join("sub/linked.tar"), "the same file as input"),
            (d.join("sym.tar"), "named twice"),
            (d.join("sub/../a.tar"), "named twice"),
        ] {
            let err = expand_specs(&[spec(&d.join("a.tar")), spec(&other)]).unwrap_err();
            let e = format!("{err:#}");
            assert!(e.contains(needle) && e.contains(&spec(&other)), "{e}");
            assert!(e.contains(&spec(&d.join("a.tar"))), "{e}");
        }
    }
}
