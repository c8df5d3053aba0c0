//! What reshard may replace or remove, in one place: an output it wrote or an empty directory.
//! An output it wrote is a directory holding reshard's manifest (index.json: a wids index with a
//! `reshard` object, read here as [`OutputManifest`], the one typed reader of a manifest that
//! decides what reshard may remove) and every shard that manifest lists, with the size it
//! records, beside its `.reshard/` directory. A copied or edited index.json does not make a
//! directory reshard's. What a run may do with what is found is the output's life's rule
//! ([`crate::job::destination::life::may_replace`]), asked before any work and again right
//! before an output is replaced; `--keep` removes only outputs of its series that pass the
//! same test, on every store.

use std::path::Path;

use anyhow::{Context, Result};
use serde::Deserialize;

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
    let lacks = match OutputManifest::read(target) {
        Err(why) => why,
        Ok(_) => "no .reshard/ directory".to_string(),
    };
    Ok(AtOutput::Other(format!(
        "a directory holding {}{more} but {lacks}",
        names[..shown].join(", ")
    )))
}

/// Whether `dir` is a directory (not a symbolic link) holding reshard's own manifest, every shard
/// it lists with its recorded size ([`OutputManifest::read`]), and its `.reshard/` directory.
pub(crate) fn is_reshard_output(dir: &Path) -> bool {
    let source = storage::source(dir);
    let saved = dir.join(saved_index::DIR_NAME);
    // A store without renames commits by its manifest and keeps no empty directories (a
    // prefix is there while an object is): a `--split` output keeps its saved indexes under
    // each split, and its own `.reshard/` is not there; its manifest tells.
    let by_manifest = storage::sink(dir).capabilities().commits_by_manifest();
    source.stat_link(dir).is_ok_and(|s| s.kind == Kind::Dir)
        && (by_manifest || source.stat(&saved).is_ok_and(|s| s.kind == Kind::Dir))
        && OutputManifest::read(dir).is_ok()
}

/// What reshard's manifest says about the output it describes, as far as deciding what is
/// reshard's goes: its kind, its `reshard` object, and the shards it lists with their sizes.
/// (The rest of index.json is [`Manifest`]'s; fields this reader does not need are ignored, so
/// that outputs of older versions are still recognised.)
#[derive(Debug, Deserialize)]
pub(crate) struct OutputManifest {
    #[serde(rename = "__kind__")]
    kind: String,
    /// Its presence is what tells; of its content only the splits are read here.
    reshard: serde_json::Map<String, serde_json::Value>,
    /// The shards, each relative to the output directory.
    pub shardlist: Vec<ListedShard>,
}

/// One shard a manifest lists.
#[derive(Debug, Deserialize)]
pub(crate) struct ListedShard {
    /// Relative to the directory holding index.json.
    pub url: String,
    pub filesize: u64,
}

impl OutputManifest {
    /// Reads the manifest of the output `dir` and checks that it is reshard's and that every
    /// shard it lists is there with the size it records. One stat (HEAD) per shard.
    ///
    /// # Errors
    /// Why `dir` is not a reshard output, for a message ("no index.json written by reshard",
    /// "index.json lists shard-000003.tar, which is not there").
    pub(crate) fn read(dir: &Path) -> std::result::Result<OutputManifest, String> {
        let manifest = Self::parse(dir)?;
        let source = storage::source(dir);
        for shard in &manifest.shardlist {
            let path = dir.join(&shard.url);
            match source.stat_link(&path) {
                Ok(s) if s.kind == Kind::File && s.stamp.size == shard.filesize => {}
                Ok(s) if s.kind == Kind::File => {
                    return Err(format!(
                        "an index.json that lists {} of {} bytes, which is {} bytes there",
                        shard.url, shard.filesize, s.stamp.size
                    ))
                }
                _ => {
                    return Err(format!(
                        "an index.json that lists {}, which is not there",
                        shard.url
                    ))
                }
            }
        }
        Ok(manifest)
    }

    /// The splits a `--split` output's manifest names, an empty one (no shard, but its own
    /// index.json) included.
    pub(crate) fn split_names(&self) -> impl Iterator<Item = &str> {
        self.reshard
            .get("splits")
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
            .filter_map(|group| group.get("split")?.as_str())
    }

    /// Reads reshard's manifest of `dir` without looking for the shards it lists: for what is
    /// already in reshard's own namespace (an output moved aside to be removed), whose shards
    /// may be partly gone.
    ///
    /// # Errors
    /// Why it is not reshard's manifest, as [`OutputManifest::read`] says it.
    pub(crate) fn parse(dir: &Path) -> std::result::Result<OutputManifest, String> {
        const NOT_RESHARDS: &str = "no index.json written by reshard";
        let index = dir.join("index.json");
        let text = storage::source(&index)
            .read(&index)
            .map_err(|_| NOT_RESHARDS.to_string())?;
        let manifest: OutputManifest =
            serde_json::from_slice(&text).map_err(|_| NOT_RESHARDS.to_string())?;
        if manifest.kind != Manifest::KIND {
            return Err(NOT_RESHARDS.into());
        }
        if manifest.shardlist.is_empty() {
            return Err("an index.json of reshard's that lists no shard".into());
        }
        for shard in &manifest.shardlist {
            let inside = Path::new(&shard.url)
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
            if !inside {
                return Err(format!(
                    "an index.json that lists {}, which is not inside the directory",
                    shard.url
                ));
            }
        }
        Ok(manifest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::destination::life::may_replace;
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
        let index = |size: u64| {
            format!(
                r#"{{"__kind__": "{}", "reshard": {{}}, "shardlist": [{{"url": "s-0.tar", "filesize": {size}}}]}}"#,
                Manifest::KIND
            )
        };
        fs::write(out.join("index.json"), index(3)).unwrap();
        fs::create_dir(out.join(saved_index::DIR_NAME)).unwrap();
        // A copied index.json: the shards it lists are not there.
        let what = |out: &Path| match inspect(out).unwrap() {
            AtOutput::Other(w) => w,
            other => panic!("{other:?}"),
        };
        assert!(what(&out).contains("lists s-0.tar, which is not there"));
        fs::write(out.join("s-0.tar"), b"ab").unwrap();
        assert!(what(&out).contains("of 3 bytes, which is 2 bytes there"));
        fs::write(out.join("s-0.tar"), b"abc").unwrap();
        assert_eq!(inspect(&out).unwrap(), AtOutput::ReshardOutput);
        fs::remove_dir(out.join(saved_index::DIR_NAME)).unwrap();
        assert!(matches!(inspect(&out).unwrap(), AtOutput::Other(w) if w.contains("no .reshard/")));
        fs::create_dir(out.join(saved_index::DIR_NAME)).unwrap();
        assert_eq!(inspect(&out).unwrap(), AtOutput::ReshardOutput);
        // Not through a symbolic link.
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&out, &link).unwrap();
        assert!(may_replace(&link, &inspect(&link).unwrap(), true, "now").is_err());
        // A wids index another tool wrote has no reshard object.
        fs::write(
            out.join("index.json"),
            r#"{"__kind__": "wids-shard-index-v1"}"#,
        )
        .unwrap();
        let e = may_replace(&out, &inspect(&out).unwrap(), true, "before the run").unwrap_err();
        assert!(
            format!("{e}").contains("no index.json written by reshard"),
            "{e}"
        );
    }
}
