//! The tests of an `s3://` output's upload ([`super`]): its lock object, what
//! `--force` and `--keep` remove.

use super::*;

/// What a create of the object `shard` under `target` answers on a store without ETags.
fn made(target: &Path, shard: &str) -> storage::Created {
    let size = storage::stamp(&target.join(shard)).unwrap().size;
    storage::Created { size, e_tag: None }
}

#[test]
fn the_lock_object_is_beside_the_output() {
    assert_eq!(
        lock_path(Path::new("s3://b/p/epoch-1")),
        Path::new("s3://b/p/.epoch-1.reshard-lock")
    );
}

#[test]
fn a_resumed_upload_keeps_only_the_shards_noted_and_still_as_uploaded() {
    let local = Path::new("mem://upload-kept/local");
    let target = Path::new("mem://upload-kept/target");
    for dir in [local, target] {
        storage::sink(dir).create_dir_all(dir).unwrap();
    }
    let put = |dir: &Path, name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        storage::sink(&path).write(&path, bytes).unwrap();
    };
    for name in ["a.tar", "b.tar", "c.tar", "d.tar"] {
        put(local, name, b"staged shard");
        put(target, name, b"staged shard");
    }
    assert_eq!(
        uploaded_before(local, target).unwrap(),
        Vec::<String>::new()
    );
    for name in ["a.tar", "b.tar", "c.tar"] {
        note_uploaded(local, target, name, &made(target, name)).unwrap();
    }
    // b.tar uploaded again since (another identity), c.tar gone, d.tar never noted.
    put(target, "b.tar", b"staged shard");
    let c = target.join("c.tar");
    storage::sink(&c).remove_file(&c).unwrap();
    let up = uploaded_before(local, target).unwrap();
    assert_eq!(up, ["a.tar"]);
    // Kept while the staged file is the one it was uploaded from and the output names it.
    let files = |names: &[&str]| -> Vec<(String, u64)> {
        names.iter().map(|n| ((*n).to_string(), 12)).collect()
    };
    assert_eq!(
        still_staged(local, &files(&["a.tar", "b.tar"]), &up),
        ["a.tar"]
    );
    assert_eq!(
        still_staged(local, &files(&["a.tar.gz"]), &up),
        Vec::<String>::new()
    );
    // A staged file made again (a resumed run that started over): not the object's source.
    put(local, "a.tar", b"staged shard");
    assert_eq!(
        still_staged(local, &files(&["a.tar"]), &up),
        Vec::<String>::new()
    );
}

/// A note damaged anywhere (or an older reshard's, unsealed) is not believed: its shard
/// is not kept as uploaded, whatever the damage made the stamp say.
#[test]
fn a_damaged_upload_note_is_not_believed() {
    let local = Path::new("mem://upload-note/local");
    let target = Path::new("mem://upload-note/target");
    for dir in [local, target] {
        storage::sink(dir).create_dir_all(dir).unwrap();
        let path = dir.join("a.tar");
        storage::sink(&path).write(&path, b"staged shard").unwrap();
    }
    note_uploaded(local, target, "a.tar", &made(target, "a.tar")).unwrap();
    assert_eq!(uploaded_before(local, target).unwrap(), ["a.tar"]);
    let record = upload_record(local, "a.tar");
    let good = storage::source(&record).read(&record).unwrap();
    let mut edits: Vec<Vec<u8>> = (0..good.len())
        .map(|i| {
            let mut bad = good.clone();
            bad[i] ^= 0x01;
            bad
        })
        .collect();
    edits.push(seal::open(&good).unwrap().to_vec());
    for bad in edits {
        storage::sink(&record).write(&record, &bad).unwrap();
        assert!(read_note(local, "a.tar").is_none());
        assert_eq!(
            uploaded_before(local, target).unwrap(),
            Vec::<String>::new()
        );
    }
}

/// A marker as a run writes it: the names it uploads and replaces, its token, the runs it
/// supersedes.
fn marker(uploads: &[&str], replaces: &[&str], token: &str, carried: &[&str]) -> Marker {
    let names = |v: &[&str]| v.iter().map(|n| (*n).to_string()).collect();
    Marker {
        uploads: names(uploads),
        replaces: names(replaces),
        records: Some(token.to_string()),
        carried: names(carried),
        superseded_by: None,
    }
}

/// Tokens as runs draw them (32 hex digits).
const F: &str = "f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0";
const A: &str = "a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0";
const B: &str = "b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0";

#[test]
fn markers_are_found_by_listing_each_runs_and_an_older_reshards_single_one() {
    let target = Path::new("mem://upload-marker/out");
    storage::sink(target).create_dir_all(target).unwrap();
    assert_eq!(marker::Found::all(target, A).unwrap(), []);
    let written = marker(
        &["s-0.tar", ".reshard/s-0.tar.reshard-layout"],
        &["old-0.tar"],
        F,
        &[],
    );
    written.put(target, F, None).unwrap();
    written.put(target, A, None).unwrap();
    // An older reshard's single marker, as a plain list of names; a name like a marker's but
    // of no token is not one.
    let path = target.join(marker::INCOMPLETE);
    storage::sink(&path)
        .write(&path, b"s-0.tar\n../escape\n/abs\n\nindex.json\n")
        .unwrap();
    let other = target.join(".reshard-incomplete.mine");
    storage::sink(&other).write(&other, b"[]").unwrap();
    let found = marker::Found::all(target, A).unwrap();
    let older = Marker {
        uploads: vec!["s-0.tar".into(), "index.json".into()],
        ..Marker::default()
    };
    assert_eq!(
        found,
        [
            marker::Found {
                name: ".reshard-incomplete".into(),
                token: None,
                marker: older,
            },
            marker::Found {
                name: marker::name_of(F),
                token: Some(F.into()),
                marker: written,
            },
        ],
        "this run's own (A) is not among them"
    );
}

#[test]
fn a_failed_runs_objects_go_but_those_kept_and_this_runs_marker_then_names_what_is_left() {
    let target = Path::new("mem://upload-clean/out");
    storage::sink(target).create_dir_all(target).unwrap();
    let names = [
        "a.tar",
        "b.tar",
        ".reshard/a.tar.reshard-layout",
        ".reshard/b.tar.reshard-layout",
    ];
    for n in names {
        let path = target.join(n);
        storage::sink(&path).write(&path, b"x").unwrap();
    }
    marker(&names, &["old.tar"], F, &[])
        .put(target, F, None)
        .unwrap();
    // An older reshard's marker names one more object.
    Marker {
        uploads: vec!["c.tar".into()],
        ..Marker::default()
    }
    .write(target)
    .unwrap();
    let (found, run) = marker::claim(target, A, None, None).unwrap();
    assert_eq!(
        marker::Found::named(&found),
        None,
        "two runs, neither superseded"
    );
    assert_eq!(run.lineage, [F]);
    let (rest, written) =
        clean_up_failed_run(target, (&found, true), &["a.tar".to_string()], &run).unwrap();
    let left = marker(
        &[".reshard/a.tar.reshard-layout", "a.tar"],
        &["old.tar"],
        A,
        &[F],
    );
    assert_eq!(rest, left);
    let present = |n: &str| storage::source(target).stat(&target.join(n)).is_ok();
    assert!(present("a.tar") && present(".reshard/a.tar.reshard-layout"));
    assert!(!present("b.tar") && !present(".reshard/b.tar.reshard-layout"));
    // Only this run's marker is left, written once, carrying what stays named.
    let path = target.join(marker::name_of(A));
    assert_eq!(Some(storage::source(&path).read(&path).unwrap()), written);
    let found = marker::Found::all(target, "").unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(marker::Found::named(&found).as_deref(), Some(A));
    // Nothing left to name: this run's marker names nothing, the failed run's goes all the same.
    let (found, run) = marker::claim(target, B, None, None).unwrap();
    let (rest, _) = clean_up_failed_run(target, (&found, true), &[], &run).unwrap();
    assert_eq!(rest, marker(&[], &["old.tar"], B, &[A, F]));
    assert!(!present("a.tar") && !present(&marker::name_of(A)));
    // No marker found, the lock taken over from no run: nothing written yet (a run refused
    // next leaves nothing at what may be a user's prefix; `begin` creates it).
    let empty = Path::new("mem://upload-clean/users");
    storage::sink(empty).create_dir_all(empty).unwrap();
    let (found, run) = marker::claim(empty, A, None, None).unwrap();
    let (rest, written) = clean_up_failed_run(empty, (&found, true), &[], &run).unwrap();
    assert_eq!((rest, written), (marker(&[], &[], A, &[]), None));
    assert_eq!(storage::source(empty).list(empty).unwrap().len(), 0);
}

/// Fenced by construction (issue 37): run A clears what a failed run F left and is suspended
/// right after its lock check, before it removes F's marker (its own, written first, carries
/// F's forward); B takes the lock over, clears the same (its marker, written first, carries
/// forward A's and F's), keeps a shard for `--resume` and names its uploads, then fails. A
/// wakes and removes what it was about to: B's marker survives, and the next run finds what
/// B named, and B as the last failed run. Before, every run shared one marker object, and A
/// removed B's.
#[test]
fn a_run_suspended_in_its_clearing_never_removes_its_successors_marker() {
    let target = Path::new("mem://upload-clear-suspended/out");
    storage::sink(target).create_dir_all(target).unwrap();
    let put = |n: &str| {
        let path = target.join(n);
        storage::sink(&path).write(&path, b"x").unwrap();
    };
    put("kept.tar");
    marker(&["kept.tar"], &[], F, &[])
        .put(target, F, None)
        .unwrap();
    // A clears up to its marker, and is suspended after its lock check.
    let (found_by_a, a) = marker::claim(target, A, None, None).unwrap();
    let kept = ["kept.tar".to_string()];
    marker::carry_forward(target, (&found_by_a, true), &kept, &a).unwrap();
    // B takes the lock over from A by its silence, clears, and names its uploads.
    let (found_by_b, b) = marker::claim(target, B, Some(A), None).unwrap();
    assert_eq!(found_by_b.len(), 2, "F's and A's: {found_by_b:?}");
    let (rest, seen) = clean_up_failed_run(target, (&found_by_b, true), &kept, &b).unwrap();
    assert_eq!(rest, marker(&["kept.tar"], &[], B, &[A, F]));
    assert_eq!(
        marker::read_of(target, A),
        None,
        "A's marker was carried forward"
    );
    put("b-0.tar");
    let uploads = marker(&["b-0.tar", "kept.tar"], &[], B, &[A, F]);
    uploads.put(target, B, seen.as_deref()).unwrap();
    // A wakes: its check passed before it was suspended, and it removes what it found.
    marker::remove_superseded(target, &found_by_a, &a).unwrap();
    assert_eq!(
        marker::read_of(target, B),
        Some(uploads),
        "B's marker survives"
    );
    // A writes nothing more there: its marker was carried forward and removed.
    let late = marker(&[], &[], A, &[F]).put(target, A, Some(b"anything"));
    assert!(late.is_err(), "{late:?}");
    assert_eq!(marker::read_of(target, A), None);
    // The next run finds B's names, and B as the last failed run.
    let next = marker::Found::all(target, "").unwrap();
    let named: Vec<&String> = next.iter().flat_map(|f| &f.marker.uploads).collect();
    assert_eq!(named, ["b-0.tar", "kept.tar"]);
    assert_eq!(marker::Found::named(&next).as_deref(), Some(B));
}

/// A manifest whose create was sent again after its answer was lost finds its own first copy:
/// the run goes on (the output is live); another run's manifest there still fails it.
#[test]
fn a_manifest_created_again_finds_its_own_copy_but_refuses_another() {
    let local = Path::new("mem://upload-manifest-again/local");
    let target = Path::new("mem://upload-manifest-again/target");
    for dir in [local, target] {
        storage::sink(dir).create_dir_all(dir).unwrap();
    }
    let put = |dir: &Path, bytes: &[u8]| {
        let path = dir.join(MANIFEST);
        storage::sink(&path).write(&path, bytes).unwrap();
    };
    put(local, b"{\"ours\": 1}");
    put(target, b"{\"ours\": 1}");
    let made = fenced::create(local, target, MANIFEST, fenced::Found::Fail, None, None).unwrap();
    assert_eq!(made.size, 11);
    put(target, b"{\"theirs\": 2}");
    let err = fenced::create(local, target, MANIFEST, fenced::Found::Fail, None, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("another run published"), "{err}");
}

/// After its manifest, a run that lost the lock removes nothing more at the output: not the
/// objects of the output it replaced (a successor may have published them since), not the
/// staged copy.
#[test]
fn after_its_manifest_a_run_that_lost_the_lock_removes_nothing() {
    let local = Path::new("mem://upload-after-lost/local");
    let target = Path::new("mem://upload-after-lost/target");
    for dir in [local, target] {
        storage::sink(dir).create_dir_all(dir).unwrap();
    }
    let lock = RemoteLock::acquire(target, Duration::from_secs(60)).unwrap();
    let put = |path: &Path, bytes: &[u8]| storage::sink(path).write(path, bytes).unwrap();
    put(&target.join(marker::name_of(lock.lock.token())), b"marker");
    put(&target.join("old.tar"), b"a successor's shard now");
    put(&local.join("new.tar"), b"staged");
    let lock = RemoteLock {
        replaced: vec!["old.tar".into()],
        ..lock
    };
    // Another run took the lock over: the lock as it wrote it, with its own token.
    let held = String::from_utf8(
        storage::source(&lock_path(target))
            .read(&lock_path(target))
            .unwrap(),
    )
    .unwrap();
    let theirs = held.replace(lock.lock.token(), "someone-else");
    assert_ne!(held, theirs);
    put(&lock_path(target), theirs.as_bytes());
    let err = after_commit(target, local, ("new.tar", 6), &lock, true).unwrap_err();
    assert!(
        format!("{err:#}").contains("lost the output's lock"),
        "{err:#}"
    );
    assert!(
        storage::stamp(&target.join("old.tar")).is_ok(),
        "old.tar removed"
    );
    assert!(
        storage::stamp(&local.join("new.tar")).is_ok(),
        "staged copy removed"
    );
}

/// A run that lost the lock before its upload begins writes no marker, even with nothing
/// replaced or preserved; its successor's stays as it is.
#[test]
fn a_run_that_lost_the_lock_writes_no_marker() {
    let target = Path::new("mem://upload-begin-lost/target");
    storage::sink(target).create_dir_all(target).unwrap();
    let lock = RemoteLock::acquire(target, Duration::from_secs(60)).unwrap();
    let put = |path: &Path, bytes: &[u8]| storage::sink(path).write(path, bytes).unwrap();
    let read = |path: &Path| storage::source(path).read(path).unwrap();
    let held = String::from_utf8(read(&lock_path(target))).unwrap();
    put(
        &lock_path(target),
        held.replace(lock.lock.token(), "someone-else").as_bytes(),
    );
    let theirs = target.join(marker::name_of(B));
    put(&theirs, b"the successor's marker");
    let files = vec![("new.tar".to_string(), 6)];
    let err = name_uploads(target, &files, &[], &lock).unwrap_err();
    assert!(
        format!("{err:#}").contains("lost the output's lock"),
        "{err:#}"
    );
    assert_eq!(read(&theirs), b"the successor's marker");
    let own = target.join(marker::name_of(lock.lock.token()));
    assert!(storage::stamp(&own).is_err(), "a marker of this run");
}

/// A kept shard's saved index is checked at the output, whichever node staged it: on node-local
/// scratch rank 0's copy (`local`) holds no saved index of a shard another node's writer staged
/// (`copy`). Missing at the output, the check fails (before, rank 0 found none in its copy and
/// skipped it silently); its writer writes it again from its own copy, stamped for the object,
/// and the check then holds.
#[test]
fn a_kept_shard_gets_its_saved_index_again_from_its_writers_node() {
    let local = Path::new("mem://upload-kept-layout/local");
    let copy = Path::new("mem://upload-kept-layout/node-1");
    let target = Path::new("mem://upload-kept-layout/target");
    let put = |dir: &Path, shard: &str| {
        let path = dir.join(shard);
        let sink = storage::sink(&path);
        sink.create_dir_all(path.parent().unwrap()).unwrap();
        sink.write(&path, &[0; 1024]).unwrap();
    };
    for dir in [local, copy, target] {
        put(dir, "a.tar");
        put(dir, "s/b.tar");
    }
    // Only node 1's copy holds the saved index of s/b.tar (a split's shard) it staged.
    let staged = copy.join("s").join(saved_index::DIR_NAME);
    storage::sink(&staged).create_dir_all(&staged).unwrap();
    saved_index::save(&staged, &copy.join("s/b.tar"), std::iter::empty()).unwrap();
    for shard in ["a.tar", "s/b.tar"] {
        note_uploaded(local, target, shard, &made(target, shard)).unwrap();
    }
    let layout = layout_of("s/b.tar");
    assert_eq!(layout, "s/.reshard/b.tar.reshard-layout");
    let names: HashSet<&str> = ["a.tar", "s/b.tar", layout.as_str()].into();
    let kept = vec!["a.tar".to_string(), "s/b.tar".to_string()];
    let err = fenced::check_kept(local, target, &kept, &[], &names).unwrap_err();
    assert!(
        format!("{err:#}").contains("the saved index of s/b.tar"),
        "{err:#}"
    );
    let verified = noted_object(local, "s/b.tar").unwrap();
    fenced::restore_layouts(copy, target, &[("s/b.tar", verified)], &names, None, 0).unwrap();
    fenced::check_kept(local, target, &kept, &[], &names).unwrap();
    let dir = target.join("s").join(saved_index::DIR_NAME);
    assert!(matches!(
        saved_index::load(&target.join("s/b.tar"), Some(&dir)),
        saved_index::Lookup::Found(_)
    ));
}

/// The staging directory on `--scratch` of an object store's output, noting the steps asked of
/// it, the lock's token each was asked under and the marker in the bucket at its `begin`.
struct ScratchNoted {
    target: PathBuf,
    steps: Vec<String>,
}

impl life::StagingSteps for ScratchNoted {
    fn clear_failed(&mut self, lock: Option<&OutputLock>) -> Result<()> {
        let token = lock.map_or("none", OutputLock::token);
        self.steps.push(format!("clear_failed {token}"));
        Ok(())
    }
    fn check_replace(&mut self, taken: bool) -> Result<()> {
        self.steps.push(format!("check_replace {taken}"));
        Ok(())
    }
    fn begin(&mut self, lock: Option<&OutputLock>, _: Option<Option<&str>>) -> Result<()> {
        let token = lock.map_or("none", OutputLock::token);
        let marker = marker::read_of(&self.target, token).and_then(|m| m.records);
        self.steps
            .push(format!("begin {token}, marker of {marker:?}"));
        Ok(())
    }
}

fn upload_settings(target: &Path, local: &Path) -> UploadSettings {
    UploadSettings {
        target: Some(target.to_path_buf()),
        local: Some(local.to_path_buf()),
        force: false,
        dry_run: false,
        resume: false,
        lock_stale_after: Duration::from_secs(60),
        keep: None,
        epoch: 0,
        progress: Default::default(),
    }
}

/// An object store's run runs one sequence: its staging on `--scratch` is part of it, under the
/// bucket's lock (one token), and begins after the marker of the upload under way is written,
/// naming that token. A run that ends there (killed right after it) leaves the marker, which
/// the next run reads and clears before it writes its own; the upload phase adds its names only
/// over the very marker its run wrote.
#[test]
fn an_object_store_run_prepares_once_its_marker_first_and_its_scratch_under_its_lock() {
    let target = Path::new("mem://upload-one-sequence/target");
    let local = Path::new("mem://upload-one-sequence/scratch/target");
    storage::sink(target).create_dir_all(target).unwrap();
    let cfg = upload_settings(target, local);
    let mut scratch = ScratchNoted {
        target: target.to_path_buf(),
        steps: Vec::new(),
    };
    let first = prepare(&cfg, &mut scratch).unwrap().unwrap();
    let t = first.lock().token().to_string();
    assert_eq!(
        scratch.steps,
        [
            format!("clear_failed {t}"),
            "check_replace false".to_string(),
            format!("begin {t}, marker of Some({t:?})"),
        ]
    );
    let path = target.join(marker::name_of(&t));
    let read = |p: &Path| storage::source(p).read(p).unwrap();
    assert_eq!(first.marker.as_deref(), Some(&read(&path)[..]));
    // The run is killed: its lock is released (its pid proves it dead), its marker stays.
    drop(first);
    let mut scratch = ScratchNoted {
        target: target.to_path_buf(),
        steps: Vec::new(),
    };
    let second = prepare(&cfg, &mut scratch).unwrap().unwrap();
    let t2 = second.lock().token().to_string();
    assert_ne!(t, t2);
    assert_eq!(
        marker::Found::all(target, "").unwrap(),
        [marker::Found {
            name: marker::name_of(&t2),
            token: Some(t2.clone()),
            marker: Marker {
                records: Some(t2.clone()),
                carried: vec![t.clone()],
                ..Marker::default()
            },
        }],
        "this run's marker written, superseding the first run's, which was then removed"
    );
    assert_eq!(scratch.steps.len(), 3, "{:?}", scratch.steps);
    // The upload phase names its uploads over that marker...
    let files = vec![("a.tar".to_string(), 6)];
    name_uploads(target, &files, &[], &second).unwrap();
    let own = target.join(marker::name_of(&t2));
    assert_eq!(marker::read_of(target, &t2).unwrap().uploads, ["a.tar"]);
    // ...and over no other: once a successor carried it forward and removed it, it is not
    // written again.
    let second = RemoteLock {
        marker: Some(read(&own)),
        ..second
    };
    storage::sink(&own).remove_file(&own).unwrap();
    let err = name_uploads(target, &files, &[], &second).unwrap_err();
    assert!(
        format!("{err:#}").contains("lost the output's lock"),
        "{err:#}"
    );
    assert!(storage::stamp(&own).is_err(), "written again");
}

/// Fenced by construction (issue 37), after the commit: run A publishes and is suspended right
/// after its manifest, before it removes its marker; B takes the lock over with `--force` (its
/// marker names the objects of A's output it replaces) and fails. A wakes and removes its
/// own marker: B's survives, so the next run still knows A's objects for reshard's. Before,
/// A removed the one marker object, B's, and its `replaces` list was lost.
#[test]
fn a_run_suspended_after_its_manifest_never_removes_its_successors_marker() {
    let local = Path::new("mem://upload-publish-suspended/local");
    let target = Path::new("mem://upload-publish-suspended/target");
    for dir in [local, target] {
        storage::sink(dir).create_dir_all(dir).unwrap();
    }
    let a = RemoteLock::acquire(target, Duration::from_secs(60)).unwrap();
    let a_token = a.lock.token().to_string();
    let put = |path: &Path, bytes: &[u8]| storage::sink(path).write(path, bytes).unwrap();
    let ours = marker(&["a-0.tar"], &[], &a_token, &[]);
    let seen = ours.put(target, &a_token, None).unwrap();
    put(&target.join("a-0.tar"), b"A's shard");
    put(&target.join(MANIFEST), b"A's manifest");
    // B takes the lock over (the lock as it wrote it, with its own token), finds A's manifest,
    // and supersedes A's marker: it names what it replaces, and A's marker goes.
    let held =
        String::from_utf8(storage::source(target).read(&lock_path(target)).unwrap()).unwrap();
    put(&lock_path(target), held.replace(&a_token, B).as_bytes());
    let (found, b) = marker::claim(target, B, Some(&a_token), None).unwrap();
    let (_, b_seen) = clean_up_failed_run(target, (&found, false), &[], &b).unwrap();
    let replacing = marker(&["b-0.tar"], &["a-0.tar"], B, &[&a_token]);
    replacing.put(target, B, b_seen.as_deref()).unwrap();
    let manifest = target.join(MANIFEST);
    storage::sink(&manifest).remove_file(&manifest).unwrap();
    // A wakes after its manifest: it removes its own marker only, then finds it lost the lock.
    let a = RemoteLock {
        marker: Some(seen),
        ..a
    };
    let err = after_commit(target, local, ("a-0.tar", 9), &a, false).unwrap_err();
    assert!(
        format!("{err:#}").contains("lost the output's lock"),
        "{err:#}"
    );
    assert_eq!(
        marker::read_of(target, B),
        Some(replacing),
        "B's marker survives"
    );
    let next = marker::Found::all(target, "").unwrap();
    assert_eq!(next.len(), 1, "{next:?}");
    assert_eq!(next[0].marker.replaces, ["a-0.tar"]);
}

/// Fenced by construction: a kept shard's saved index is stamped for the object this run
/// verified (its record or note), not for whatever a look at the shard's name finds. With
/// another object of the same size put there (a successor's shard), the index is not written at
/// all, and the run fails; written for the verified object, an index there already is replaced
/// only when it does not hold, and one that holds stays (a successor's, or this run's own).
#[test]
fn a_kept_shards_saved_index_is_stamped_for_the_verified_object_only() {
    let copy = Path::new("mem://upload-verified-layout/copy");
    let target = Path::new("mem://upload-verified-layout/target");
    let (shard, layout) = ("a.tar", layout_of("a.tar"));
    let sink = storage::sink(target);
    let put = |path: &Path, bytes: &[u8]| {
        sink.create_dir_all(path.parent().unwrap()).unwrap();
        sink.write(path, bytes).unwrap();
    };
    let staged = copy.join(saved_index::DIR_NAME);
    put(&copy.join(shard), &[0; 1024]);
    let one = [crate::tar::Sample {
        start: 0,
        len: 1024,
    }];
    saved_index::save(&staged, &copy.join(shard), one.into_iter()).unwrap();
    put(&target.join(shard), &[0; 1024]);
    let stamp = storage::stamp(&target.join(shard)).unwrap();
    let verified = saved_index::Verified {
        size: stamp.size,
        identity: Some(stamp.identity),
    };
    let names: HashSet<&str> = [shard, layout.as_str()].into();
    let restore = |v| fenced::restore_layouts(copy, target, &[(shard, v)], &names, None, 0);
    // Another object of the same size at the shard's name: nothing written, the run fails.
    put(&target.join(shard), &[1; 1024]);
    let err = restore(verified).unwrap_err();
    assert!(format!("{err:#}").contains("not the object"), "{err:#}");
    assert!(
        storage::stamp(&target.join(&layout)).is_err(),
        "an index was written"
    );
    // Stamped for the object verified now: a stale index there (not one at all) is replaced.
    let stamp = storage::stamp(&target.join(shard)).unwrap();
    let verified = saved_index::Verified {
        size: stamp.size,
        identity: Some(stamp.identity),
    };
    put(&target.join(&layout), b"not an index");
    restore(verified).unwrap();
    assert!(fenced::layout_holds(target, shard));
    let written = storage::source(target).read(&target.join(&layout)).unwrap();
    // An index that holds for the object stays (another writer's, here one of two samples).
    let two = [(0, 512), (512, 512)].map(|(start, len)| crate::tar::Sample { start, len });
    let other = Path::new("mem://upload-verified-layout/other");
    put(&other.join(shard), &[0; 1024]);
    saved_index::save(&other.join(".reshard"), &other.join(shard), two.into_iter()).unwrap();
    let (theirs, to) = (other.join(&layout), target.join(&layout));
    let there = saved_index::write_for(&theirs, &target.join(shard), &to, &verified);
    assert_eq!(there.unwrap(), saved_index::Restamped::There);
    assert_eq!(storage::source(target).read(&to).unwrap(), written);
    // This run's own, written again (an answer lost): the same bytes, no error.
    let ours = staged.join("a.tar.reshard-layout");
    let again = saved_index::write_for(&ours, &target.join(shard), &to, &verified);
    assert_eq!(again.unwrap(), saved_index::Restamped::Written);
}

/// Seal, then read (issue 37, review 1): a run A that lost the lock while suspended before it
/// names its uploads, its check passed, writes over its own last bytes only; once its successor
/// B sealed A's marker, A's write fails, so no upload of A's is named by nothing. A write of
/// A's that lands between B's listing and B's seal is what B seals and carries forward.
/// Before, B removed A's marker without reading the version that named A's uploads.
#[test]
fn a_lost_runs_late_marker_write_fails_once_sealed_or_is_carried_forward_by_the_seal() {
    let target = Path::new("mem://upload-seal/out");
    storage::sink(target).create_dir_all(target).unwrap();
    let a_seen = marker(&[], &[], A, &[]).put(target, A, None).unwrap();
    // B takes the lock over from A, silent, and seals A's marker before anything else.
    let (found_by_b, b) = marker::claim(target, B, Some(A), None).unwrap();
    assert_eq!(found_by_b[0].marker.superseded_by.as_deref(), Some(B));
    // A wakes: its write over its own bytes fails; it uploads nothing.
    let late = marker(&["shard-000007.tar"], &[], A, &[]).put(target, A, Some(&a_seen));
    assert!(
        late.is_err(),
        "A named its uploads after B sealed its marker"
    );
    clean_up_failed_run(target, (&found_by_b, true), &[], &b).unwrap();
    assert_eq!(marker::read_of(target, A), None);
    // A's write landing between B's listing and its seal: sealed, and carried forward.
    let target = Path::new("mem://upload-seal/late");
    storage::sink(target).create_dir_all(target).unwrap();
    let a_seen = marker(&[], &[], A, &[]).put(target, A, None).unwrap();
    let mut found = marker::Found::all(target, B).unwrap();
    marker(&["shard-000007.tar"], &[], A, &[])
        .put(target, A, Some(&a_seen))
        .unwrap();
    marker::seal(target, &mut found, B).unwrap();
    assert_eq!(found[0].marker.uploads, ["shard-000007.tar"]);
}

/// A run that finds a marker superseding it (its successor's, written while it was suspended
/// before its listing) stops there: it writes no marker, removes nothing, and the next run
/// names the successor as the last failed run (review 2). Before, it created its own marker
/// superseding its successor's: two markers superseding each other, no run named.
#[test]
fn a_run_that_finds_its_successors_marker_stops_and_the_successor_stays_named() {
    let target = Path::new("mem://upload-superseded/out");
    storage::sink(target).create_dir_all(target).unwrap();
    marker(&["kept.tar"], &[], F, &[])
        .put(target, F, None)
        .unwrap();
    let kept = ["kept.tar".to_string()];
    let (found_by_b, b) = marker::claim(target, B, Some(A), None).unwrap();
    clean_up_failed_run(target, (&found_by_b, true), &kept, &b).unwrap();
    let err = marker::claim(target, A, None, None).err().unwrap();
    assert!(format!("{err:#}").contains("supersedes it"), "{err:#}");
    assert_eq!(marker::read_of(target, A), None, "A wrote a marker");
    let next = marker::Found::all(target, "").unwrap();
    assert_eq!(marker::Found::named(&next).as_deref(), Some(B), "{next:?}");
    assert_eq!(next[0].marker.uploads, ["kept.tar"]);
}

/// A run that takes the lock over names itself before any step that can fail (review 5a): a
/// failed `--force` run F's marker found, this run (no `--force`) refused; its own marker is
/// there already, superseding F's, so the next run names it, not F (whose live copy, per node,
/// a run named F's would take). Before, it failed before its marker existed.
#[test]
fn a_run_refused_after_it_took_the_lock_is_the_one_the_next_run_names() {
    let target = Path::new("mem://upload-named-first/target");
    let local = Path::new("mem://upload-named-first/scratch/target");
    storage::sink(target).create_dir_all(target).unwrap();
    marker(&[], &["old-0.tar"], F, &[])
        .put(target, F, None)
        .unwrap();
    let cfg = upload_settings(target, local);
    let mut scratch = ScratchNoted {
        target: target.to_path_buf(),
        steps: Vec::new(),
    };
    let err = prepare(&cfg, &mut scratch).err().unwrap();
    assert!(format!("{err:#}").contains("rerun with --force"), "{err:#}");
    let next = marker::Found::all(target, "").unwrap();
    let named = marker::Found::named(&next);
    assert!(named.is_some() && named.as_deref() != Some(F), "{next:?}");
    assert!(next.iter().all(|f| f.marker.replaces == ["old-0.tar"]));
}

/// A `--force` run P that published and stopped before it removed what it replaced leaves its
/// marker, naming it (review 4): its removal comes after theirs. The next run, finding that
/// marker beside P's manifest, removes what the manifest does not name, and keeps what it
/// does. Before, P's marker went first, and the replaced output's objects stayed for ever.
#[test]
fn what_a_force_run_replaced_is_named_until_removed_and_cleared_beside_its_manifest() {
    let local = Path::new("mem://upload-replaced-named/local");
    let target = Path::new("mem://upload-replaced-named/target");
    for dir in [local, target] {
        storage::sink(dir).create_dir_all(dir).unwrap();
    }
    let put = |path: &Path, bytes: &[u8]| storage::sink(path).write(path, bytes).unwrap();
    for n in ["s-0.tar", "s-1.tar", "s-1.tar.idx"] {
        put(&target.join(n), b"x");
    }
    let manifest = r#"{"__kind__": "wids-shard-index-v1", "reshard": {},
        "shardlist": [{"url": "s-0.tar", "filesize": 1}]}"#;
    put(&target.join(MANIFEST), manifest.as_bytes());
    let p = RemoteLock::acquire(target, Duration::from_secs(60)).unwrap();
    let p_token = p.lock.token().to_string();
    let replaces = ["s-0.tar", "s-1.tar", "s-1.tar.idx"];
    let seen = marker(&["s-0.tar"], &replaces, &p_token, &[])
        .put(target, &p_token, None)
        .unwrap();
    let p = RemoteLock {
        marker: Some(seen),
        replaced: replaces.iter().map(|n| (*n).to_string()).collect(),
        ..p
    };
    // P's lock taken over (its run silent) before P removes what it replaced.
    let held =
        String::from_utf8(storage::source(target).read(&lock_path(target)).unwrap()).unwrap();
    put(&lock_path(target), held.replace(&p_token, B).as_bytes());
    assert!(after_commit(target, local, ("s-0.tar", 1), &p, true).is_err());
    let left = marker::read_of(target, &p_token).expect("P's marker removed first");
    assert_eq!(left.replaces, replaces);
    // B clears beside P's manifest: what it does not name goes.
    let (found, b) = marker::claim(target, B, Some(&p_token), None).unwrap();
    let (rest, _) = clean_up_failed_run(target, (&found, false), &[], &b).unwrap();
    assert!(!rest.names_objects(), "{rest:?}");
    let present = |n: &str| storage::source(target).stat(&target.join(n)).is_ok();
    assert!(present("s-0.tar") && !present("s-1.tar") && !present("s-1.tar.idx"));
    assert_eq!(marker::read_of(target, &p_token), None);
}

/// `life::after_commit` of a `ByManifest` strategy that uploaded the one file `(name, size)`
/// from `local` to `target` under `lock`, with no `--link` or `--keep` (`replaced`: whether it
/// replaced an output).
fn after_commit(
    target: &Path,
    local: &Path,
    (name, size): (&str, u64),
    lock: &RemoteLock,
    replaced: bool,
) -> Result<()> {
    let files = vec![(name.to_string(), size)];
    let strategy = ByManifest {
        target,
        local,
        files: &files,
        lock: Some(lock),
        not_published: String::new(),
        stale_after: Duration::from_secs(60),
    };
    let rules = life::Rules {
        link: None,
        keep: None,
        epoch: 0,
    };
    life::after_commit(&strategy, replaced, &rules)
}
