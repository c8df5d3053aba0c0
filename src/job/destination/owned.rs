//! What reshard may replace or remove, in one place: an output it wrote (its index.json, a wids
//! index with a `reshard` object, beside its `.reshard/` directory) or an empty directory. The
//! expand phase checks `--force`'s target before any work, the publish phase again right before
//! it replaces it, and `--keep` removes only outputs of its series that pass the same test.

use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::output::manifest::Manifest;
use crate::output::saved_index;
use crate::storage::{self, Kind};

/// What is at an output path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AtOutput {
    /// Nothing: publishing creates it.
    Nothing,
    /// An empty directory.
    Empty,
    /// A directory reshard wrote: `--force` may replace it.
    ReshardOutput,
    /// Anything else, described for a message (what it holds and what it lacks).
    Other(String),
}

/// Looks at `target` without following a symbolic link.
///
/// # Errors
/// It cannot be examined or listed.
pub(crate) fn inspect(target: &Path) -> Result<AtOutput> {
    let source = storage::source(target);
    let stat = match source.stat_link(target) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(AtOutput::Nothing),
        Err(e) => return Err(e).with_context(|| format!("{}: cannot examine", target.display())),
    };
    if stat.kind == Kind::Link {
        return Ok(AtOutput::Other("a symbolic link".into()));
    }
    if stat.kind != Kind::Dir {
        return Ok(AtOutput::Other("a file, not a directory".into()));
    }
    let mut names: Vec<String> = source
        .list(target)
        .with_context(|| format!("{}: cannot list it", target.display()))?
        .into_iter()
        .map(|e| {
            let dir = e.kind == Kind::Dir;
            format!("{}{}", e.name.to_string_lossy(), if dir { "/" } else { "" })
        })
        .collect();
    if names.is_empty() {
        return Ok(AtOutput::Empty);
    }
    if is_reshard_output(target) {
        return Ok(AtOutput::ReshardOutput);
    }
    names.sort();
    let shown = names.len().min(3);
    let more = match names.len() - shown {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    let lacks = if !made_by_reshard(&target.join("index.json")) {
        "no index.json written by reshard"
    } else {
        "no .reshard/ directory"
    };
    Ok(AtOutput::Other(format!(
        "a directory holding {}{more} but {lacks}",
        names[..shown].join(", ")
    )))
}

/// Refuses to replace `target` with `--force` unless it is nothing, an empty directory or a
/// reshard output: `when` says at which moment (before the run, at publishing).
///
/// # Errors
/// Anything else is at `target`, or it cannot be examined.
pub(crate) fn check_replaceable(target: &Path, when: &str) -> Result<AtOutput> {
    let found = inspect(target)?;
    if let AtOutput::Other(what) = &found {
        bail!(
            "--output {}: {when} it is {what}; --force replaces only an empty directory or an output reshard wrote (its index.json and .reshard/), so it is left as it is: move it away or choose another --output",
            target.display()
        );
    }
    Ok(found)
}

/// Whether `dir` is a directory (not a symbolic link) holding reshard's own index.json and its
/// `.reshard/` directory.
pub(crate) fn is_reshard_output(dir: &Path) -> bool {
    let source = storage::source(dir);
    let saved = dir.join(saved_index::DIR_NAME);
    // In an object store a prefix has no empty directories: a `--split` output keeps its saved
    // indexes under each split, and its own `.reshard/` is not there; its manifest tells.
    source.stat_link(dir).is_ok_and(|s| s.kind == Kind::Dir)
        && (source.stat(&saved).is_ok_and(|s| s.kind == Kind::Dir) || storage::is_object_store(dir))
        && made_by_reshard(&dir.join("index.json"))
}

/// Whether `index` is an index.json that reshard wrote (a wids index with a `reshard` object).
fn made_by_reshard(index: &Path) -> bool {
    let Ok(text) = storage::source(index).read(index) else {
        return false;
    };
    serde_json::from_slice::<serde_json::Value>(&text)
        .is_ok_and(|m| m["__kind__"] == Manifest::KIND && m["reshard"].is_object())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn tells_reshard_outputs_from_anything_else() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        assert_eq!(inspect(&out).unwrap(), AtOutput::Nothing);
        fs::create_dir(&out).unwrap();
        assert_eq!(inspect(&out).unwrap(), AtOutput::Empty);
        fs::write(out.join("notes.txt"), b"mine").unwrap();
        fs::create_dir(out.join("docs")).unwrap();
        let AtOutput::Other(what) = inspect(&out).unwrap() else {
            panic!("a user's directory")
        };
        assert_eq!(
            what,
            "a directory holding docs/, notes.txt but no index.json written by reshard"
        );
        let index = format!(r#"{{"__kind__": "{}", "reshard": {{}}}}"#, Manifest::KIND);
        fs::write(out.join("index.json"), index).unwrap();
        assert!(matches!(inspect(&out).unwrap(), AtOutput::Other(w) if w.contains("no .reshard/")));
        fs::create_dir(out.join(saved_index::DIR_NAME)).unwrap();
        assert_eq!(inspect(&out).unwrap(), AtOutput::ReshardOutput);
        // Not through a symbolic link.
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&out, &link).unwrap();
        assert!(check_replaceable(&link, "now").is_err());
        // A wids index another tool wrote has no reshard object.
        fs::write(
            out.join("index.json"),
            r#"{"__kind__": "wids-shard-index-v1"}"#,
        )
        .unwrap();
        let e = check_replaceable(&out, "before the run").unwrap_err();
        assert!(
            format!("{e}").contains("no index.json written by reshard"),
            "{e}"
        );
    }
}
