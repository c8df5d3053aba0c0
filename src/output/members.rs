//! The member layout of a finished output shard, for the loader indexes (`--energon`,
//! `--dali-index`): one header-only pass over the plain shard its writer just wrote (still in
//! the page cache), seeking past the data. The writer knows each sample's offset and length from
//! the layout, but not its members' names and data offsets: those live in the headers, which
//! the exchange moves verbatim without parsing.

use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::storage::{self, Sequential};
use crate::tar::headers::{Member, Seekable, Walk};
use crate::tar::key::{extension, sample_key, LoaderNames};
use crate::tar::{HeaderReader, Sample};

/// One member of a sample, as the loaders index it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// The member's full path in the archive.
    pub path: String,
    /// What follows the first `.` of its last path component (`jpg`, `seg.png`).
    pub ext: String,
    /// Byte offset of its data in the shard.
    pub data: u64,
    /// Its data bytes.
    pub size: u64,
}

/// One sample of an output shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleParts {
    pub key: String,
    /// Byte offset of its first record (extension records included).
    pub start: u64,
    /// Its length: every record, padding included.
    pub len: u64,
    pub parts: Vec<Part>,
}

/// Reads the samples and members of the plain output shard at `path`, whose samples are
/// `layout` (start and length, in file order), checking each member's name against what the
/// loaders `names` read (the inputs' headers were checked while indexing, saved indexes are not
/// used with loader indexes: a second line of defence).
///
/// # Errors
/// The shard cannot be read, a member is not a plain regular file with a UTF-8 key or has a
/// name a loader reads otherwise, or the samples are not those of `layout`: the message names
/// the shard, the byte offset and the member.
pub(crate) fn read_samples(
    path: &Path,
    names: LoaderNames,
    layout: &[Sample],
) -> Result<Vec<SampleParts>> {
    let shard = storage::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let len = shard
        .stamp()
        .with_context(|| format!("{}: cannot stat", path.display()))?
        .size;
    let mut walk = Walk::new(
        Seekable(HeaderReader::new(Sequential::new(shard))),
        Some(len),
    );
    let shown = format!(
        "output shard {}",
        path.file_name().unwrap_or_default().to_string_lossy()
    );
    let mut samples: Vec<SampleParts> = Vec::new();
    while let Some(member) = walk.next_member().with_context(|| shown.clone())? {
        let (key, part) = part_of(&member, names)
            .with_context(|| format!("{shown}: byte offset {}", member.header))?;
        // Samples are cut where the layout put them (two adjacent samples may share a key
        // when duplicates are kept).
        match (layout.get(samples.len()), samples.last_mut()) {
            (Some(next), _) if next.start == member.start => samples.push(SampleParts {
                key,
                start: next.start,
                len: next.len,
                parts: vec![part],
            }),
            (_, Some(open)) if member.end <= open.start + open.len && open.key == key => {
                open.parts.push(part);
            }
            _ => bail!(
                "{shown}: byte offset {}: member {:?} is not where the layout put a sample (internal error)",
                member.start,
                part.path
            ),
        }
    }
    if samples.len() != layout.len() {
        bail!(
            "{shown}: {} samples read back, {} laid out (internal error)",
            samples.len(),
            layout.len()
        );
    }
    Ok(samples)
}

/// The key and the part of one member of an output shard.
fn part_of(member: &Member, names: LoaderNames) -> Result<(String, Part)> {
    let name = member.name();
    if !member.kind.is_file() {
        bail!(
            "member {name:?} is {}, not a regular file",
            member.kind.describe()
        );
    }
    if member.sparse {
        bail!("member {name:?} is stored sparse (with holes): a loader reading its bytes at an offset would not get the file; a loader index needs plain members");
    }
    let Ok(path) = String::from_utf8(member.path.clone()) else {
        bail!("member {name:?}: its path is not UTF-8, which the loader indexes require");
    };
    let key = sample_key(&member.path).context("a member without a sample key")?;
    if let Some(problem) = names.problem(&member.path, key) {
        bail!("member {path:?}: {problem}");
    }
    let key = String::from_utf8_lossy(key).into_owned();
    let ext = String::from_utf8_lossy(extension(&member.path)).into_owned();
    Ok((
        key,
        Part {
            path,
            ext,
            data: member.data,
            size: member.stored,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tar::testing::tar_of;

    #[test]
    fn members_are_grouped_by_key_with_their_data_offsets() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("s.tar");
        let bytes = tar_of(&[("a.jpg", b"xx"), ("a.txt", b"y"), ("d/b.seg.png", b"zzz")]);
        std::fs::write(&path, &bytes).unwrap();
        let laid = |v: &[(u64, u64)]| -> Vec<Sample> {
            v.iter()
                .map(|&(start, len)| Sample { start, len })
                .collect()
        };
        let layout = laid(&[(0, 2048), (2048, 1024)]);
        let samples = read_samples(&path, LoaderNames::default(), &layout).unwrap();
        assert_eq!(samples.len(), 2);
        assert_eq!((samples[0].start, samples[0].len), (0, 2048));
        assert_eq!(samples[0].parts[1].data, 1536);
        assert_eq!(samples[1].key, "d/b");
        assert_eq!(samples[1].parts[0].ext, "seg.png");
        assert_eq!(
            (samples[1].parts[0].data, samples[1].parts[0].size),
            (2560, 3)
        );
        std::fs::write(&path, tar_of(&[("a.jpg", b"xx"), ("d/b c.png", b"zzz")])).unwrap();
        let dali = LoaderNames {
            energon: false,
            dali: true,
        };
        let e = format!("{:#}", read_samples(&path, dali, &layout).unwrap_err());
        assert!(
            e.contains("output shard s.tar: byte offset 1024") && e.contains("d/b c.png"),
            "{e}"
        );
        // Two adjacent samples with one key stay two, as laid out.
        std::fs::write(&path, tar_of(&[("a.jpg", b"x"), ("a.jpg", b"y")])).unwrap();
        let two = laid(&[(0, 1024), (1024, 1024)]);
        assert_eq!(read_samples(&path, dali, &two).unwrap().len(), 2);
        let one = laid(&[(0, 2048)]);
        assert_eq!(read_samples(&path, dali, &one).unwrap()[0].parts.len(), 2);
        let wrong = laid(&[(0, 512)]);
        assert!(read_samples(&path, dali, &wrong).is_err());
    }
}
