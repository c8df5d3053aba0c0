//! `--dali-index`: NVIDIA DALI's webdataset index, one text file per shard, in the format its
//! `wds2idx` tool writes (index version `v1.2`):
//!
//! ```text
//! v1.2 SAMPLES
//! EXT OFFSET SIZE PATH EXT OFFSET SIZE PATH ...      (one line per sample)
//! ```
//!
//! one `EXT OFFSET SIZE PATH` group per member of the sample, in archive order: the extension
//! (what follows the first `.` of the last path component), the byte offset of the member's
//! data, its size and its full path, separated by single spaces. The file is `NAME.idx` beside
//! `NAME.tar`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::output::members::SampleParts;

/// Where the index of the shard at `shard` goes: `NAME.idx` for `NAME.tar`.
pub(crate) fn index_path(shard: &Path) -> PathBuf {
    let name = shard.file_name().unwrap_or_default().to_string_lossy();
    let stem = name.strip_suffix(".tar").unwrap_or(&name);
    shard.with_file_name(format!("{stem}.idx"))
}

/// The index text of a shard with these samples.
pub(crate) fn index_text(samples: &[SampleParts]) -> String {
    let mut text = format!("v1.2 {}\n", samples.len());
    for sample in samples {
        for (i, part) in sample.parts.iter().enumerate() {
            let sep = if i == 0 { "" } else { " " };
            let _ = write!(
                text,
                "{sep}{} {} {} {}",
                part.ext, part.data, part.size, part.path
            );
        }
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::members::Part;

    #[test]
    fn one_line_per_sample_after_the_version_line() {
        let part = |path: &str, ext: &str, data, size| Part {
            path: path.into(),
            ext: ext.into(),
            data,
            size,
        };
        let samples = vec![
            SampleParts {
                key: "a".into(),
                start: 0,
                len: 2048,
                parts: vec![part("a.jpg", "jpg", 512, 2), part("a.txt", "txt", 1536, 1)],
            },
            SampleParts {
                key: "d/b".into(),
                start: 2048,
                len: 1024,
                parts: vec![part("d/b.seg.png", "seg.png", 2560, 3)],
            },
        ];
        assert_eq!(
            index_text(&samples),
            "v1.2 2\njpg 512 2 a.jpg txt 1536 1 a.txt\nseg.png 2560 3 d/b.seg.png\n"
        );
        assert_eq!(
            index_path(Path::new("/o/my.data-000001.tar")),
            Path::new("/o/my.data-000001.idx")
        );
    }
}
