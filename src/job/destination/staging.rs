//! The staging directory's layout: where the output is assembled before the publishing rename,
//! and what reshard keeps inside it besides the shards. One type names every part, so no phase
//! joins these names itself.
//!
//! Every run stages in a directory of its own, named after its token, so that no two runs ever
//! share a path: a run that lost the output's lock (suspended past `--lock-stale-after`, then
//! taken over) and goes on writing by path writes only into its own directory, which its
//! successor neither uses nor reads. The staging pointer, a symbolic link beside the output,
//! leads to the directory of the run that last took the lock; a run continues (`--resume`) or
//! removes only the directory the pointer leads to, and only when that run surely ended, and it
//! continues it by renaming it to its own name first: from then on the earlier run's paths lead
//! nowhere.
//!
//! ```text
//! .OUT.reshard-tmp -> .OUT.reshard-tmp.TOKEN   the pointer
//! .OUT.reshard-tmp.TOKEN/
//!   .reshard-owner      the owning run's token (see crate::job::destination::lock)
//!   .reshard/           saved indexes of the shards (published with the output)
//!   .heartbeats/        the ranks' heartbeats from indexing to publishing (moved beside,
//!                       to .OUT.reshard-tmp.TOKEN.heartbeats, before the publishing rename,
//!                       and removed when the job ends; see crate::heartbeat)
//!   .resume/            the plan record and checkpoints for --resume (removed after publishing)
//!   index.json, shards
//! ```

use std::io;
use std::path::{Path, PathBuf};

use crate::output::saved_index;
use crate::storage::{self, Kind, Sink};

/// The file, inside the staging directory, that names the run owning it.
const OWNER_FILE: &str = ".reshard-owner";
/// Where the ranks leave heartbeats from indexing to publishing.
const HEARTBEATS: &str = ".heartbeats";

/// A staging directory (borrowed: the path lives in the job's set-up).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Staging<'a>(&'a Path);

/// The staging pointer of the output `NAME` in `parent`: beside it, `.NAME.reshard-tmp`. A
/// symbolic link to the staging directory of the run that last took the output's lock ([`run_dir`]);
/// a directory there is an older reshard's staging directory, or a staged upload moved back.
pub(crate) fn path_for(parent: &Path, name: &std::ffi::OsStr) -> PathBuf {
    parent.join(format!(".{}.reshard-tmp", name.to_string_lossy()))
}

/// The staging directory of the run whose token is `token`, beside the `pointer`:
/// `.NAME.reshard-tmp.TOKEN`. Only that run's token leads there.
pub(crate) fn run_dir(pointer: &Path, token: &str) -> PathBuf {
    let name = pointer.file_name().unwrap_or_default().to_string_lossy();
    pointer.with_file_name(format!("{name}.{token}"))
}

/// The pointer beside the run directory `run` ([`run_dir`]'s inverse).
pub(crate) fn pointer_of(run: &Path) -> PathBuf {
    let name = run.file_name().unwrap_or_default().to_string_lossy();
    let base = name
        .rsplit_once('.')
        .filter(|(base, _)| base.ends_with(".reshard-tmp"))
        .map_or(&*name, |(base, _)| base);
    run.with_file_name(base)
}

/// The staging directory the `pointer` leads to now, if any: its link's target, or the pointer
/// itself when it is a directory. Only a directory: see [`pointed_entry`].
///
/// # Errors
/// It cannot be examined.
pub(crate) fn pointed(pointer: &Path) -> io::Result<Option<PathBuf>> {
    Ok(pointed_entry(pointer)?.and_then(|(to, kind)| (kind == Kind::Dir).then_some(to)))
}

/// What the `pointer` leads to now, and its kind: the pointer itself when it is a directory, or
/// the run directory beside it that its link names, `.NAME.reshard-tmp.TOKEN` ([`run_dir`]).
/// The link is read one level and never resolved further: what stands at the run directory's
/// name is looked at itself, so a symbolic link there (an output that was a link, swapped there
/// by a `--force` run's exchange) is [`Kind::Link`], and never taken for the directory it leads
/// to. A link that names anything else leads nowhere reshard staged (`None`).
///
/// # Errors
/// It cannot be examined.
pub(crate) fn pointed_entry(pointer: &Path) -> io::Result<Option<(PathBuf, Kind)>> {
    let source = storage::source(pointer);
    let not_found = |e: io::Error| match e.kind() {
        io::ErrorKind::NotFound => Ok(None),
        _ => Err(e),
    };
    let to = match source.stat_link(pointer) {
        Ok(s) if s.kind == Kind::Dir => return Ok(Some((pointer.to_path_buf(), Kind::Dir))),
        Ok(s) if s.kind == Kind::Link => match source.read_link(pointer) {
            Ok(to) => to,
            Err(e) => return not_found(e),
        },
        Ok(_) => {
            return Err(io::Error::other(format!(
                "{}: not reshard's staging pointer (neither a symbolic link nor a directory)",
                pointer.display()
            )))
        }
        Err(e) => return not_found(e),
    };
    let name = pointer.file_name().unwrap_or_default().to_string_lossy();
    let ours = to
        .to_str()
        .and_then(|to| to.strip_prefix(&*name))
        .and_then(|rest| rest.strip_prefix('.'))
        .is_some_and(crate::hex::is_token);
    if !ours {
        return Ok(None);
    }
    let run = pointer.with_file_name(&to);
    match source.stat_link(&run) {
        Ok(s) if matches!(s.kind, Kind::Dir | Kind::Link) => Ok(Some((run, s.kind))),
        Ok(_) => Ok(None),
        Err(e) => not_found(e),
    }
}

/// Points the `pointer` at the run directory `run`: a new link under a temporary name, renamed
/// over the old one (only the run holding the output's lock does this). Where the store has no
/// symbolic links (the in-memory store of the unit tests) there is no pointer: a `--resume`
/// there finds nothing to continue.
///
/// # Errors
/// The link cannot be made or renamed.
pub(crate) fn point(pointer: &Path, run: &Path) -> io::Result<()> {
    let sink = storage::sink(pointer);
    if !sink.capabilities().symlinks {
        return Ok(());
    }
    let name = pointer.file_name().unwrap_or_default().to_string_lossy();
    let tmp = pointer.with_file_name(format!("{name}.pointing"));
    let _ = sink.remove_file(&tmp);
    if storage::source(pointer)
        .stat_link(pointer)
        .is_ok_and(|s| s.kind == Kind::Dir)
    {
        return Err(io::Error::other(format!(
            "{}: a directory is there still",
            pointer.display()
        )));
    }
    sink.symlink(Path::new(run.file_name().unwrap_or_default()), &tmp)?;
    sink.rename(&tmp, pointer)
}

/// Removes the `pointer` if it leads to the run directory `run`, or nowhere (the run published
/// its directory, or removed it).
pub(crate) fn unpoint(pointer: &Path, run: &Path) {
    let source = storage::source(pointer);
    if !source
        .stat_link(pointer)
        .is_ok_and(|s| s.kind == Kind::Link)
    {
        return;
    }
    let ours = match pointed_entry(pointer) {
        Ok(to) => to.is_none_or(|(to, _)| to == run),
        Err(_) => false,
    };
    if ours {
        let _ = storage::sink(pointer).remove_file(pointer);
    }
}

impl<'a> Staging<'a> {
    /// The staging directory at `dir`.
    pub(crate) fn at(dir: &'a Path) -> Self {
        Staging(dir)
    }

    /// The directory itself.
    #[cfg(test)]
    pub(crate) fn dir(&self) -> &'a Path {
        self.0
    }

    /// The file naming the run that owns the directory.
    pub(crate) fn owner_file(&self) -> PathBuf {
        self.0.join(OWNER_FILE)
    }

    /// Where the watchdogs leave heartbeats.
    pub(crate) fn heartbeats(&self) -> PathBuf {
        self.0.join(HEARTBEATS)
    }

    /// Where the shards' saved indexes go (without `--split`).
    pub(crate) fn saved_indexes(&self) -> PathBuf {
        self.0.join(saved_index::DIR_NAME)
    }

    /// Where the plan record and the checkpoints for `--resume` are.
    pub(crate) fn resume_records(&self) -> PathBuf {
        self.0.join(crate::output::checkpoint::DIR_NAME)
    }

    /// Whether something is at the staging directory's path.
    pub(crate) fn present(&self) -> bool {
        storage::source(self.0).stat(self.0).is_ok()
    }

    fn sink(&self) -> &'static dyn Sink {
        storage::sink(self.0)
    }

    /// Whether the directory holds the output a `--force` run replaced (its publishing exchange
    /// put it at the run's staging name) rather than a run's staging: reshard's index.json, and
    /// none of what a run's staging holds until it is published (the owner's mark, taken out
    /// right before the publishing rename; the `--resume` records, kept until after it; the
    /// heartbeats, moved aside before it). An output can keep `.resume/` (its own run was
    /// killed between its rename and their removal), but never at a staging name: `--force`
    /// removes the records of the output it replaces before its exchange
    /// ([`crate::job::destination::by_rename`]'s `drop_replaced_records`). So the records still
    /// tell a run killed right before its rename (no owner's mark, no heartbeats, index.json
    /// written: only its records say it is staging) from a replaced output. A run cut short
    /// between its exchange and the end of the replaced output's removal leaves it so; the next
    /// run finishes that removal as `--force` does
    /// ([`crate::job::destination::by_rename::finish_replaced`]) rather than removing the
    /// directory whole, with the user's files inside.
    pub(crate) fn holds_a_replaced_output(&self) -> bool {
        let source = storage::source(self.0);
        let absent =
            |p: &Path| matches!(source.stat_link(p), Err(e) if e.kind() == io::ErrorKind::NotFound);
        absent(&self.owner_file())
            && absent(&self.resume_records())
            && absent(&self.heartbeats())
            && crate::job::destination::owned::OutputManifest::parse(self.0).is_ok()
    }

    /// Creates the staging directory with the saved-index and heartbeat directories inside.
    /// Only the run holding the output's lock creates it, so asking first is no race.
    ///
    /// # Errors
    /// It exists already, or a directory cannot be made.
    pub(crate) fn create(&self) -> io::Result<()> {
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

    /// The same directory on a node that does not see the lock holder's (node-local
    /// `--scratch`, [`crate::job::destination::scratch`]): made there by every rank of that
    /// node, so nothing where it exists. Its path carries the run's token: it is this run's.
    ///
    /// # Errors
    /// A directory cannot be made.
    pub(crate) fn make_on_this_node(&self) -> io::Result<()> {
        let sink = self.sink();
        sink.create_dir_all(&self.saved_indexes())
            .and_then(|()| sink.create_dir_all(&self.heartbeats()))
    }

    /// `--resume`: removes what an earlier attempt's finish phase may have left (saved indexes,
    /// heartbeats, index.json), so that this attempt makes them again.
    ///
    /// # Errors
    /// The directories cannot be made again.
    pub(crate) fn prepare_resume(&self) -> io::Result<()> {
        let sink = self.sink();
        let _ = sink.remove_dir_all(&self.saved_indexes());
        let _ = sink.remove_dir_all(&self.heartbeats());
        let _ = sink.remove_file(&self.0.join("index.json"));
        sink.create_dir_all(&self.saved_indexes())
            .and_then(|()| sink.create_dir_all(&self.heartbeats()))
    }

    /// Where the heartbeats go for publishing and after, beside the staging directory
    /// (`.OUT.reshard-tmp.TOKEN.heartbeats`): they are no part of the output, and the ranks go
    /// on beating until the job ends.
    pub(crate) fn heartbeats_aside(&self) -> PathBuf {
        let mut name = self.0.file_name().unwrap_or_default().to_os_string();
        name.push(".heartbeats");
        self.0.with_file_name(name)
    }

    /// Moves the heartbeats aside (before publishing). A failure to move them removes them: the
    /// heartbeats then stop, but they are never published.
    pub(crate) fn move_heartbeats_aside(&self) {
        let sink = self.sink();
        if sink
            .rename(&self.heartbeats(), &self.heartbeats_aside())
            .is_err()
        {
            let _ = sink.remove_dir_all(&self.heartbeats());
        }
    }

    /// Removes the heartbeats, wherever they are. Whatever fails to go stays: it is not the
    /// output's.
    pub(crate) fn remove_heartbeats(&self) {
        let _ = self.sink().remove_dir_all(&self.heartbeats());
        self.remove_heartbeats_aside();
    }

    /// Removes the heartbeats moved aside for publishing, if they are there.
    pub(crate) fn remove_heartbeats_aside(&self) {
        let _ = self.sink().remove_dir_all(&self.heartbeats_aside());
    }

    /// Removes the whole staging directory.
    ///
    /// # Errors
    /// Something in it cannot be removed.
    pub(crate) fn remove(&self) -> io::Result<()> {
        self.sink().remove_dir_all(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::checkpoint;
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
        // Moved aside for publishing: beside the directory, never in it, and removed there.
        fs::create_dir(staging.heartbeats()).unwrap();
        staging.move_heartbeats_aside();
        let aside = staging.heartbeats_aside();
        assert!(!staging.heartbeats().exists() && aside.is_dir());
        assert_eq!(aside.parent(), dir.parent());
        staging.remove_heartbeats();
        assert!(!aside.exists());
        staging.remove().unwrap();
        assert!(!staging.present());
    }

    #[test]
    fn a_replaced_output_is_told_from_a_runs_staging() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(".out.reshard-tmp.T0KEN");
        let staging = Staging::at(&dir);
        staging.create().unwrap();
        fs::write(staging.owner_file(), b"T0KEN\n").unwrap();
        let index = format!(
            r#"{{"__kind__": "{}", "reshard": {{}}, "shardlist": [{{"url": "s-0.tar", "filesize": 1}}]}}"#,
            crate::output::manifest::Manifest::KIND
        );
        fs::write(dir.join("index.json"), index).unwrap();
        assert!(!staging.holds_a_replaced_output(), "the owner's mark");
        fs::remove_file(staging.owner_file()).unwrap();
        assert!(!staging.holds_a_replaced_output(), "the heartbeats");
        fs::remove_dir(staging.heartbeats()).unwrap();
        fs::create_dir(staging.resume_records()).unwrap();
        assert!(!staging.holds_a_replaced_output(), "the --resume records");
        fs::remove_dir(staging.resume_records()).unwrap();
        assert!(staging.holds_a_replaced_output());
        fs::write(dir.join("index.json"), b"the user's").unwrap();
        assert!(
            !staging.holds_a_replaced_output(),
            "not reshard's index.json"
        );
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
