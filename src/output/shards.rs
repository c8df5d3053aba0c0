//! Output shards: one writer rank per shard, files sized up front, samples placed with
//! positioned writes in whatever order they arrive.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use anyhow::{anyhow, Context, Result};

use crate::key_map::Template;
use crate::plan::ShardLayout;
use crate::storage::{self, Input, Output};
use crate::sys;
use crate::tar::Codec;

/// The file name of output shard `index` (while it is written: always a plain tar). `reshard
/// generate` names its shards the same way.
pub(crate) fn shard_file_name(prefix: &str, index: u64) -> String {
    format!("{prefix}-{index:06}.tar")
}

/// How output shards are named: `PREFIX-NNNNNN.tar`, or (`--key-map`) by the template of
/// each group, numbered within the group.
#[derive(Debug, Clone)]
pub(crate) enum ShardNames {
    Prefix(String),
    /// (first shard of the group, its template), by first shard.
    Groups(Vec<(u64, Template)>),
    /// `--split`: `NAME/PREFIX-NNNNNN.tar`, numbered within each split; (first shard of the
    /// split, its name), by first shard.
    Splits {
        prefix: String,
        splits: Vec<(u64, String)>,
    },
}

/// One split of a `--split` output: its name (also its directory) and its shards' published
/// paths relative to the output root, in shard order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SplitPart {
    pub(crate) name: String,
    pub(crate) shards: Vec<String>,
}

impl ShardNames {
    /// The file name of output shard `s` while it is written (always a plain tar).
    pub(crate) fn plain(&self, s: u64) -> String {
        match self {
            ShardNames::Prefix(prefix) => shard_file_name(prefix, s),
            ShardNames::Groups(groups) => {
                let k = groups.partition_point(|g| g.0 <= s) - 1;
                groups[k].1.name(s - groups[k].0)
            }
            ShardNames::Splits { prefix, splits } => {
                let k = splits.partition_point(|g| g.0 <= s) - 1;
                format!(
                    "{}/{}",
                    splits[k].1,
                    shard_file_name(prefix, s - splits[k].0)
                )
            }
        }
    }

    /// With `--split`, every split of an output of `shards` shards: its name and its shards'
    /// published paths relative to the output root (`train/shard-000000.tar`, …); `None`
    /// without `--split`. What a loader index naming the splits (energon's split.yaml) lists.
    pub(crate) fn split_parts(&self, shards: u64, codec: Codec) -> Option<Vec<SplitPart>> {
        let ShardNames::Splits { splits, .. } = self else {
            return None;
        };
        let ends = splits.iter().skip(1).map(|g| g.0).chain([shards]);
        Some(
            splits
                .iter()
                .zip(ends)
                .map(|((start, name), end)| SplitPart {
                    name: name.clone(),
                    shards: (*start..end).map(|s| self.published(s, codec)).collect(),
                })
                .collect(),
        )
    }

    /// Checks that the names of shards `0..shards` are distinct (two key-map templates can name
    /// the same files: `a-%d.tar` and `a-1%d.tar` both give `a-10.tar`).
    ///
    /// # Errors
    /// The first name given twice, with the shards that share it.
    pub(crate) fn check_distinct(&self, shards: u64) -> Result<()> {
        let mut seen = std::collections::HashMap::with_capacity(shards as usize);
        for s in 0..shards {
            if let Some(first) = seen.insert(self.plain(s), s) {
                anyhow::bail!(
                    "output shards {first} and {s} would both be named {:?}: the key map's templates must name distinct files",
                    self.plain(s)
                );
            }
        }
        Ok(())
    }

    /// The published file name of output shard `s` with `--compress codec`.
    pub(crate) fn published(&self, s: u64, codec: Codec) -> String {
        let base = self.plain(s);
        match codec {
            Codec::Plain => base,
            Codec::Gzip => base + ".gz",
            Codec::Zstd => base + ".zst",
        }
    }
}

/// The smallest run of final pages worth writing back during the exchange.
const MIN_WRITEBACK: u64 = 64 << 10;

/// The shards one rank writes, open for positioned writes.
pub(crate) struct OutputShards {
    /// The shards of `files`, ascending.
    shards: Vec<u64>,
    files: Vec<(PathBuf, Box<dyn Output>)>,
    /// Whole pages written since the last [`OutputShards::start_writeback`]: (file, start, end).
    complete: Mutex<Vec<(usize, u64, u64)>>,
    page: u64,
    /// Set once `copy_file_range` turned out unsupported between input and output.
    no_copy_range: AtomicBool,
}

impl OutputShards {
    /// Creates this rank's shard files in `dir`, each already at its final size: the bytes the
    /// layout does not cover are the zero blocks that end the archive.
    ///
    /// # Errors
    /// A file cannot be created or sized (the message names it).
    pub(crate) fn create(dir: &Path, names: &ShardNames, layout: &ShardLayout) -> Result<Self> {
        let sink = storage::sink(dir);
        let mut files = Vec::with_capacity(layout.shard_bytes.len());
        for (&shard, &bytes) in layout.shards.iter().zip(&layout.shard_bytes) {
            let path = dir.join(names.plain(shard));
            // `--split` shards live in a directory per split, which any of its writers makes.
            if let Some(parent) = path.parent().filter(|p| *p != dir) {
                sink.create_dir_all(parent)
                    .with_context(|| format!("{}: cannot create", parent.display()))?;
            }
            let file = sink.create(&path, bytes).with_context(|| {
                format!(
                    "{}: cannot create output shard of {bytes} bytes",
                    path.display()
                )
            })?;
            files.push((path, file));
        }
        Ok(Self::of(layout, files))
    }

    /// Opens this rank's shard files that an earlier attempt of the same plan created in `dir`
    /// (`--resume`): what they hold stays.
    ///
    /// # Errors
    /// A file is missing or does not have the size the layout gives it (the message names it).
    pub(crate) fn reopen(dir: &Path, names: &ShardNames, layout: &ShardLayout) -> Result<Self> {
        let mut files = Vec::with_capacity(layout.shard_bytes.len());
        for (&shard, &bytes) in layout.shards.iter().zip(&layout.shard_bytes) {
            let path = dir.join(names.plain(shard));
            let file = storage::sink(&path)
                .reopen(&path)
                .with_context(|| format!("{}: cannot reopen output shard", path.display()))?;
            let len = file.size().unwrap_or(u64::MAX);
            if len != bytes {
                anyhow::bail!(
                    "{}: the earlier run left it {len} bytes long, but the plan lays it out in {bytes}: cannot resume",
                    path.display()
                );
            }
            files.push((path, file));
        }
        Ok(Self::of(layout, files))
    }

    fn of(layout: &ShardLayout, files: Vec<(PathBuf, Box<dyn Output>)>) -> Self {
        OutputShards {
            shards: layout.shards.clone(),
            complete: Mutex::new(Vec::new()),
            page: sys::page_size(),
            files,
            no_copy_range: AtomicBool::new(false),
        }
    }

    /// The index of shard `shard`'s file.
    ///
    /// # Panics
    /// If this rank does not write the shard (an internal error: the layout decided).
    fn file_of(&self, shard: u64) -> usize {
        self.shards
            .binary_search(&shard)
            .unwrap_or_else(|_| panic!("internal error: shard {shard} is not written here"))
    }

    /// Writes `data` at `offset` of shard `shard`.
    ///
    /// # Errors
    /// The write fails (disk full, I/O error); the message names the file and offset.
    pub(crate) fn write_at(&self, shard: u64, offset: u64, data: &[u8]) -> Result<()> {
        let i = self.file_of(shard);
        let (path, file) = &self.files[i];
        file.write_at(data, offset).with_context(|| {
            format!(
                "{}: cannot write {} bytes at byte offset {offset}",
                path.display(),
                data.len()
            )
        })?;
        // After the write: the writer thread may start writeback at any moment.
        self.written(i, offset, data.len() as u64);
        Ok(())
    }

    /// Copies `len` bytes at `src_offset` of the input `src` to `offset` of shard `shard`,
    /// inside the storage ([`Output::copy_from`]: `copy_file_range` between local files) where
    /// it allows, through a bounce buffer where it does not. For samples that stay on this rank: no user-space copy at all.
    ///
    /// # Errors
    /// A read or write fails, or the input ends early (it changed since it was indexed); the
    /// message names the file and offset.
    pub(crate) fn copy_in(
        &self,
        shard: u64,
        offset: u64,
        src: &dyn Input,
        src_path: &Path,
        src_offset: u64,
        len: u64,
    ) -> Result<()> {
        let i = self.file_of(shard);
        let (path, file) = &self.files[i];
        let ended = |at: u64| {
            anyhow!(
                "{}: byte offset {at}: expected sample data, found the end of the file (did it change during the run?)",
                src_path.display()
            )
        };
        let (mut done, mut in_kernel) = (0u64, !self.no_copy_range.load(Ordering::Relaxed));
        while done < len {
            if in_kernel {
                let want = usize::try_from(len - done)
                    .unwrap_or(usize::MAX)
                    .min(1 << 30);
                match file.copy_from(src, src_offset + done, offset + done, want) {
                    Some(Ok(0)) => return Err(ended(src_offset + done)),
                    Some(Ok(n)) => {
                        done += n as u64;
                        continue;
                    }
                    None => {
                        self.no_copy_range.store(true, Ordering::Relaxed);
                        in_kernel = false;
                        continue;
                    }
                    Some(Err(e)) => {
                        return Err(e).with_context(|| {
                            format!(
                            "copying {} bytes from {} at byte offset {} to {} at byte offset {}",
                            len - done,
                            src_path.display(),
                            src_offset + done,
                            path.display(),
                            offset + done
                        )
                        })
                    }
                }
            }
            let mut buf = vec![
                0u8;
                usize::try_from(len - done)
                    .unwrap_or(usize::MAX)
                    .min(1 << 20)
            ];
            let n = src.read_at(&mut buf, src_offset + done).with_context(|| {
                format!(
                    "{}: cannot read at byte offset {}",
                    src_path.display(),
                    src_offset + done
                )
            })?;
            if n == 0 {
                return Err(ended(src_offset + done));
            }
            self.write_at(shard, offset + done, &buf[..n])?;
            done += n as u64;
        }
        self.written(i, offset, len);
        Ok(())
    }

    /// Notes that `len` bytes at `offset` of file `i` were written: the pages wholly inside
    /// them are final (no other sample shares them), so they may go to the disk now.
    fn written(&self, i: usize, offset: u64, len: u64) {
        if let Some((start, end)) = whole_pages(offset, len, self.page) {
            self.complete.lock().unwrap().push((i, start, end));
        }
    }

    /// Starts writing back, without waiting, the pages that became final since the last call:
    /// the disk then writes while the exchange still runs instead of after it (a warm np=1 run's
    /// final sync took 1.35-1.6 s of its 3.0 s with the disk idle until then). Pages a sample
    /// shares with another are left to the final sync: written back early they would be written
    /// again once the other sample arrives, and a write to a page under writeback waits for it
    /// (with 4 KiB samples, whole-file writeback each round cost 40% more system CPU and 1.2-1.6x
    /// the time).
    pub(crate) fn start_writeback(&self) {
        let ranges = std::mem::take(&mut *self.complete.lock().unwrap());
        for (file, start, end) in merged(ranges) {
            // Small runs stay for the final sync, which writes each file's dirty pages in file
            // order: written back one by one they would reach the disk as many small writes.
            if end - start >= MIN_WRITEBACK {
                // Only a hint: where the filesystem does not support it, the final sync does
                // all the work.
                self.files[file].1.start_writeback(start, end - start);
            }
        }
    }

    /// Flushes the data written to every shard to stable storage (a checkpoint: the files'
    /// sizes do not change, so `fdatasync` suffices).
    ///
    /// # Errors
    /// An fdatasync fails.
    pub(crate) fn sync_data(&self) -> Result<()> {
        for (path, file) in &self.files {
            file.sync_data()
                .with_context(|| format!("{}: cannot sync", path.display()))?;
        }
        Ok(())
    }

    /// Flushes every shard to stable storage.
    ///
    /// # Errors
    /// An fsync fails.
    pub(crate) fn sync(&self) -> Result<()> {
        for (path, file) in &self.files {
            file.sync_all()
                .with_context(|| format!("{}: cannot sync", path.display()))?;
        }
        Ok(())
    }
}

/// The pages wholly inside `len` bytes at `offset` (pages of `page` bytes), as a byte range.
fn whole_pages(offset: u64, len: u64, page: u64) -> Option<(u64, u64)> {
    let start = offset.next_multiple_of(page);
    let end = (offset + len) / page * page;
    (end > start).then_some((start, end))
}

/// (file, start, end) ranges sorted, with ranges of one file that overlap or touch merged.
fn merged(mut ranges: Vec<(usize, u64, u64)>) -> Vec<(usize, u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(usize, u64, u64)> = Vec::with_capacity(ranges.len());
    for (file, start, end) in ranges {
        match out.last_mut() {
            Some(last) if last.0 == file && start <= last.2 => last.2 = last.2.max(end),
            _ => out.push((file, start, end)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_shards_are_named_inside_their_split_and_listed_by_split() {
        let names = ShardNames::Splits {
            prefix: "shard".into(),
            splits: vec![(0, "train".into()), (3, "val".into()), (4, "test".into())],
        };
        assert_eq!(names.plain(2), "train/shard-000002.tar");
        assert_eq!(names.plain(3), "val/shard-000000.tar");
        assert_eq!(names.published(5, Codec::Zstd), "test/shard-000001.tar.zst");
        let parts = names.split_parts(6, Codec::Plain).unwrap();
        let got: Vec<(&str, usize)> = parts
            .iter()
            .map(|p| (p.name.as_str(), p.shards.len()))
            .collect();
        assert_eq!(got, [("train", 3), ("val", 1), ("test", 2)]);
        assert_eq!(parts[2].shards[1], "test/shard-000001.tar");
        assert!(ShardNames::Prefix("shard".into())
            .split_parts(6, Codec::Plain)
            .is_none());
    }

    #[test]
    fn only_pages_no_other_sample_shares_are_final() {
        // A 4 KiB sample at an unaligned offset owns no whole page; a 100 KiB one owns 24.
        assert_eq!(whole_pages(512, 4096, 4096), None);
        assert_eq!(whole_pages(0, 4096, 4096), Some((0, 4096)));
        assert_eq!(whole_pages(1536, 100 << 10, 4096), Some((4096, 25 * 4096)));
        assert_eq!(whole_pages(4096, 4095, 4096), None);
    }

    #[test]
    fn runs_of_one_file_merge_when_they_touch() {
        let got = merged(vec![
            (1, 8192, 12288),
            (0, 4096, 8192),
            (0, 0, 4096),
            (1, 0, 4096),
            (0, 12288, 16384),
            (0, 8192, 8192 + 4096),
        ]);
        assert_eq!(got, [(0, 0, 16384), (1, 0, 4096), (1, 8192, 12288)]);
    }
}
