//! The staging directory's layout: where the output is assembled before the publishing rename,
//! and what reshard keeps inside it besides the shards. One type names every part, so no phase
//! joins these names itself.
//!
//! ```text
//! .OUT.reshard-tmp/
//!   .reshard-owner      the owning run's token (see crate::job::destination::lock)
//!   .reshard/           saved indexes of the shards (published with the output)
//!   .heartbeats/        the ranks' heartbeats from indexing to publishing (removed before
//!                       publishing; see crate::heartbeat)
//!   .resume/            the plan record and checkpoints for --resume (removed after publishing)
//!   index.json, shards
//! ```

use std::io;
use std::path::{Path, PathBuf};

use crate::output::{checkpoint, saved_index};
use crate::storage::{self, Sink};

/// The file, inside the staging directory, that names the run owning it.
const OWNER_FILE: &str = ".reshard-owner";
/// Where the ranks leave heartbeats from indexing to publishing.
const HEARTBEATS: &str = ".heartbeats";

/// A staging directory (borrowed: the path lives in the job's set-up).
#[derive(Debug, Clone, Copy)]
pub struct Staging<'a>(&'a Path);

/// The staging directory of the output `NAME` in `parent`: beside it, `.NAME.reshard-tmp`.
pub fn path_for(parent: &Path, name: &std::ffi::OsStr) -> PathBuf {
    parent.join(format!(".{}.reshard-tmp", name.to_string_lossy()))
}

impl<'a> Staging<'a> {
    /// The staging directory at `dir`.
    pub fn at(dir: &'a Path) -> Self {
        Staging(dir)
    }

    /// The directory itself.
    pub fn dir(&self) -> &'a Path {
        self.0
    }

    /// The file naming the run that owns the directory.
    pub fn owner_file(&self) -> PathBuf {
        self.0.join(OWNER_FILE)
    }

    /// Where the watchdogs leave heartbeats.
    pub fn heartbeats(&self) -> PathBuf {
        self.0.join(HEARTBEATS)
    }

    /// Where the shards' saved indexes go (without `--split`).
    pub fn saved_indexes(&self) -> PathBuf {
        self.0.join(saved_index::DIR_NAME)
    }

    /// Where the plan record and the checkpoints for `--resume` are.
    pub fn resume_records(&self) -> PathBuf {
        self.0.join(checkpoint::DIR_NAME)
    }

    /// Whether something is at the staging directory's path.
    pub fn present(&self) -> bool {
        storage::source(self.0).stat(self.0).is_ok()
    }

    fn sink(&self) -> &'static dyn Sink {
        storage::sink(self.0)
    }

    /// Creates the staging directory with the saved-index and heartbeat directories inside.
    /// Only the run holding the output's lock creates it, so asking first is no race.
    ///
    /// # Errors
    /// It exists already, or a directory cannot be made.
    pub fn create(&self) -> io::Result<()> {
        if self.present() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{}: exists already", self.0.display()),
            ));
        }
        let sink = self.sink();
        sink.create_dir_all(&self.saved_indexes())
            .and_then(|()| sink.create_dir_all(&self.heartbeats()))
    }

    /// `--resume`: removes what an earlier attempt's finish phase may have left (saved indexes,
    /// heartbeats, index.json), so that this attempt makes them again.
    ///
    /// # Errors
    /// The directories cannot be made again.
    pub fn prepare_resume(&self) -> io::Result<()> {
        let sink = self.sink();
        let _ = sink.remove_dir_all(&self.saved_indexes());
        let _ = sink.remove_dir_all(&self.heartbeats());
        let _ = sink.remove_file(&self.0.join("index.json"));
        sink.create_dir_all(&self.saved_indexes())
            .and_then(|()| sink.create_dir_all(&self.heartbeats()))
    }

    /// Removes the heartbeats (before publishing: they are no part of the output). Whatever
    /// fails to go stays: it is not the output's.
    pub fn remove_heartbeats(&self) {
        let _ = self.sink().remove_dir_all(&self.heartbeats());
    }

    /// Removes the whole staging directory.
    ///
    /// # Errors
    /// Something in it cannot be removed.
    pub fn remove(&self) -> io::Result<()> {
        self.sink().remove_dir_all(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn creates_its_parts_and_prepares_a_resume() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(".out.reshard-tmp");
        let staging = Staging::at(&dir);
        assert!(!staging.present());
        staging.create().unwrap();
        assert!(staging.present());
        assert!(staging.heartbeats().is_dir() && staging.saved_indexes().is_dir());
        // A second run must not take over a directory it did not remove.
        assert!(staging.create().is_err());
        fs::write(staging.heartbeats().join("0"), b"beat").unwrap();
        fs::write(dir.join("index.json"), b"{}").unwrap();
        staging.prepare_resume().unwrap();
        assert!(!dir.join("index.json").exists());
        assert_eq!(fs::read_dir(staging.heartbeats()).unwrap().count(), 0);
        staging.remove_heartbeats();
        assert!(!staging.heartbeats().exists());
        staging.remove().unwrap();
        assert!(!staging.present());
    }

    #[test]
    fn names_every_part_inside_the_directory() {
        let dir = Path::new("/o/.out.reshard-tmp");
        let staging = Staging::at(dir);
        assert_eq!(staging.dir(), dir);
        assert_eq!(staging.owner_file(), dir.join(".reshard-owner"));
        assert_eq!(staging.heartbeats(), dir.join(".heartbeats"));
        // Where the modules that read them look.
        assert_eq!(staging.saved_indexes(), dir.join(saved_index::DIR_NAME));
        assert_eq!(staging.resume_records(), checkpoint::dir(dir));
        assert_eq!(staging.resume_records(), dir.join(".resume"));
    }
}
