//! Output shards: one writer rank per shard, files sized up front, samples placed with
//! positioned writes in whatever order they arrive.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::plan::ShardLayout;

/// The file name of output shard `index`.
pub fn shard_file_name(prefix: &str, index: u64) -> String {
    format!("{prefix}-{index:06}.tar")
}

/// The shards one rank writes, open for positioned writes.
pub struct OutputShards {
    first: u64,
    files: Vec<(PathBuf, File)>,
}

impl OutputShards {
    /// Creates this rank's shard files in `dir`, each already at its final size: the bytes the
    /// layout does not cover are the zero blocks that end the archive.
    ///
    /// # Errors
    /// A file cannot be created or sized (the message names it).
    pub fn create(dir: &Path, prefix: &str, layout: &ShardLayout) -> Result<Self> {
        let mut files = Vec::with_capacity(layout.shard_bytes.len());
        for (shard, &bytes) in layout.shards.clone().zip(&layout.shard_bytes) {
            let path = dir.join(shard_file_name(prefix, shard));
            let file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .with_context(|| format!("{}: cannot create output shard", path.display()))?;
            file.set_len(bytes).with_context(|| {
                format!(
                    "{}: cannot size output shard to {bytes} bytes",
                    path.display()
                )
            })?;
            files.push((path, file));
        }
        Ok(OutputShards {
            first: layout.shards.start,
            files,
        })
    }

    /// Writes `data` at `offset` of shard `shard`.
    ///
    /// # Errors
    /// The write fails (disk full, I/O error); the message names the file and offset.
    pub fn write_at(&self, shard: u64, offset: u64, data: &[u8]) -> Result<()> {
        let (path, file) = &self.files[(shard - self.first) as usize];
        file.write_all_at(data, offset).with_context(|| {
            format!(
                "{}: cannot write {} bytes at byte offset {offset}",
                path.display(),
                data.len()
            )
        })
    }

    /// Flushes every shard to stable storage.
    ///
    /// # Errors
    /// An fsync fails.
    pub fn sync(&self) -> Result<()> {
        for (path, file) in &self.files {
            file.sync_all()
                .with_context(|| format!("{}: cannot sync", path.display()))?;
        }
        Ok(())
    }
}
