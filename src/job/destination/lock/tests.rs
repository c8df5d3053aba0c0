//! The tests of the output's lock ([`super`]): holders, takeovers, heartbeats, guards.

use super::*;
use std::fs;

const OUT: &str = "out";

/// Someone else, as seen from here: another PID namespace on this very host (a container).
fn elsewhere() -> Owner {
    let mut o = Owner::me().unwrap();
    o.pidns = "pid:[1]".into();
    o
}

fn beat_of(path: &Path) -> u64 {
    read_owner(path).unwrap().unwrap().beat
}

/// Waits (generously) until `cond` holds.
fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(60), "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_lock_and_run_directory_names_follow_the_staging_pointer() {
    let staging = Path::new("/d/.out.reshard-tmp");
    assert_eq!(lock_path(staging), Path::new("/d/.out.reshard-lock"));
    // One name on every store: beside the output, outside what it holds.
    assert_eq!(lock_of(Path::new("/d/out")), lock_path(staging));
    let bucket = Path::new("s3://b/p/epoch-1");
    assert_eq!(lock_of(bucket), Path::new("s3://b/p/.epoch-1.reshard-lock"));
    let tmp = tempfile::tempdir().unwrap();
    let pointer = tmp.path().join(".out.reshard-tmp");
    let lock = silent(&lock_path(&pointer), elsewhere());
    let run = lock.run_dir(&pointer);
    let name = format!(".out.reshard-tmp.{}", lock.owner.token);
    assert_eq!(run, tmp.path().join(name));
    assert_eq!(crate::job::destination::staging::pointer_of(&run), pointer);
    assert_eq!(
        guard_path(&lock_path(staging)),
        Path::new("/d/.out.reshard-lock.takeover")
    );
}

#[test]
fn tokens_are_unique_and_the_lock_reads_back() {
    let (a, b) = (Owner::me().unwrap(), Owner::me().unwrap());
    assert_ne!(a.token, b.token);
    assert!(is_token(&a.token) && a.token.len() == 32, "{}", a.token);
    assert!(!is_token("../x") && !is_token(""));
    assert!(!a.boot.is_empty() && a.pidns.starts_with("pid:"), "{a:?}");
    assert_eq!(Owner::parse(&a.render()), Some(a.clone()));
    // An older reshard's lock (no token, boot or PID namespace) is read, and its pid is
    // never trusted.
    let old = format!("{HEADER}host h\npid 1\nstart 2\nsince 3\nbeat {:020}\n", 4);
    let old = Owner::parse(&old).unwrap();
    assert!(old.token.is_empty() && !old.pid_checkable_from(&a));
    assert!(a.pid_checkable_from(&b) && !elsewhere().pid_checkable_from(&a));
}

#[test]
fn a_live_pid_with_another_start_time_is_dead() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(".x.reshard-lock");
    let me = Owner::me().unwrap();
    let alive = |o: &Owner| judge(&path, o, &me, Duration::ZERO);
    assert_eq!(alive(&me), Holder::Alive);
    // This very pid, started at another time: the pid was reused, its holder is dead.
    let mut reused = me.clone();
    reused.start += 1;
    assert_eq!(alive(&reused), Holder::Dead { surely: true });
    reused.start = 0;
    assert_eq!(
        alive(&reused),
        Holder::Alive,
        "start unknown: the pid decides"
    );
}

#[test]
fn one_holder_at_a_time_and_a_dead_one_is_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(".out.reshard-lock");
    let window = Duration::from_secs(60);
    let lock = OutputLock::acquire(&path, Path::new(OUT), window).unwrap();
    let again = OutputLock::acquire(&path, Path::new(OUT), window).map(|_| ());
    let msg = format!("{:#}", again.unwrap_err());
    assert!(
        msg.contains("another reshard run") && msg.contains(&format!("pid {}", std::process::id())),
        "{msg}"
    );
    drop(lock);
    assert!(!path.exists(), "released");
    // A lock of a process that is gone (beyond any pid_max), surely dead by its pid.
    let mut dead = Owner::me().unwrap();
    dead.pid = u32::MAX - 1;
    create_exclusive(&path, &dead).unwrap();
    let lock = OutputLock::acquire(&path, Path::new(OUT), window).unwrap();
    assert_eq!(read_owner(&path).unwrap().unwrap().pid, std::process::id());
    assert!(lock.took_over.as_ref().is_some_and(|t| t.surely_dead));
    drop(lock);
}

#[test]
fn another_pid_namespace_or_boot_is_judged_by_its_heartbeat() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(".x.reshard-lock");
    let me = Owner::me().unwrap();
    // Same host name and a pid that lives here (this test's own), but another namespace or
    // boot: the pid says nothing.
    let mut other_boot = me.clone();
    other_boot.boot = "another-boot".into();
    for other in [elsewhere(), other_boot] {
        let _ = fs::remove_file(&path);
        create_exclusive(&path, &other).unwrap();
        let window = Duration::from_millis(600);
        assert_eq!(
            judge(&path, &other, &me, window),
            Holder::Dead { surely: false }
        );
        // Beating: alive.
        let (p, o) = (path.clone(), other.clone());
        let beating = std::thread::spawn(move || {
            let mut o = o;
            for _ in 0..5 {
                std::thread::sleep(Duration::from_millis(100));
                o.beat += 1;
                rewrite_beat(&p, &o).unwrap();
            }
        });
        assert_eq!(judge(&path, &other, &me, window), Holder::Alive);
        beating.join().unwrap();
    }
}

#[test]
fn a_lock_that_changed_hands_while_watched_is_looked_at_again() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(".x.reshard-lock");
    let me = Owner::me().unwrap();
    let (first, mut second) = (elsewhere(), elsewhere());
    assert_ne!(first.token, second.token);
    // The newcomer read `first`; by the time it looks again, `second` holds the lock (and
    // has beaten): that is not `first` being alive.
    second.beat = first.beat + 1;
    create_exclusive(&path, &second).unwrap();
    let window = Duration::from_millis(600);
    assert_eq!(judge(&path, &first, &me, window), Holder::Changed);
    fs::remove_file(&path).unwrap();
    assert_eq!(judge(&path, &first, &me, window), Holder::Changed);
}

#[test]
fn the_takeover_note_comes_once_after_a_quiet_spell_inside_the_window() {
    let s = Duration::from_secs;
    let window = s(10);
    assert!(!note_due(
        false,
        QUIET_NOTE - Duration::from_millis(1),
        window
    ));
    assert!(note_due(false, QUIET_NOTE, window));
    assert!(note_due(false, s(5), window));
    assert!(!note_due(true, s(5), window), "once");
    // At or past the window's end the holder is taken over now: nothing left to announce.
    assert!(!note_due(false, window, window));
    assert!(!note_due(false, s(11), window));
}

/// A run that holds `path` as `owner` without a heartbeat (a suspended run).
fn silent(path: &Path, owner: Owner) -> OutputLock {
    create_exclusive(path, &owner).unwrap();
    OutputLock {
        path: path.to_path_buf(),
        owner,
        took_over: None,
        lost: Arc::new(Mutex::new(None)),
        stop: None,
        beat: None,
    }
}

#[test]
fn a_silent_owner_is_taken_over_and_its_staging_directory_is_left_to_it() {
    let tmp = tempfile::tempdir().unwrap();
    let pointer = tmp.path().join(".out.reshard-tmp");
    let path = lock_path(&pointer);
    let paused = silent(&path, elsewhere());
    let a_dir = paused.run_dir(&pointer);
    fs::create_dir(&a_dir).unwrap();
    paused.mark_staging(&a_dir).unwrap();
    fs::write(a_dir.join("shard"), b"A's").unwrap();
    paused.check_owned(&a_dir).unwrap();

    let window = Duration::from_millis(600);
    let newcomer = OutputLock::acquire(&path, Path::new(OUT), window).unwrap();
    assert!(!newcomer.may_take(&a_dir, &pointer).unwrap());
    let b_dir = newcomer.run_dir(&pointer);
    assert_ne!(a_dir, b_dir, "no path of one run leads to the other's");
    assert_eq!(fs::read(a_dir.join("shard")).unwrap(), b"A's", "left alone");
    fs::create_dir(&b_dir).unwrap();
    newcomer.mark_staging(&b_dir).unwrap();

    // The paused run wakes: it owns the lock no more, and removes only its own directory.
    let msg = format!("{:#}", paused.check_owned(&a_dir).unwrap_err());
    assert!(
        msg.contains(&path.display().to_string())
            && msg.contains("lost the output's lock")
            && msg.contains("Nothing is published"),
        "{msg}"
    );
    assert!(!paused.may_clean_up(&a_dir));
    assert!(!a_dir.exists(), "its own staging directory is removed");
    assert!(
        Staging::at(&b_dir).owner_file().exists(),
        "the newcomer's is not"
    );
    drop(paused);
    assert!(path.exists(), "the newcomer's lock stays");
    newcomer.check_before_publish(&b_dir).unwrap();
    assert!(
        !Staging::at(&b_dir).owner_file().exists(),
        "the mark is not published"
    );
}

#[test]
fn an_older_staging_directory_of_a_silent_owner_is_renamed_beside_the_pointer() {
    let tmp = tempfile::tempdir().unwrap();
    let pointer = tmp.path().join(".out.reshard-tmp");
    let path = lock_path(&pointer);
    let paused = silent(&path, elsewhere());
    fs::create_dir(&pointer).unwrap();
    let newcomer = OutputLock::acquire(&path, Path::new(OUT), Duration::from_millis(600)).unwrap();
    assert!(!newcomer.may_take(&pointer, &pointer).unwrap());
    assert!(!pointer.exists());
    assert!(paused.run_dir(&pointer).is_dir(), "named after its token");
}

#[test]
fn a_foreign_mark_on_the_staging_directory_fails_the_check() {
    let tmp = tempfile::tempdir().unwrap();
    let staging = tmp.path().join(".out.reshard-tmp");
    let lock = OutputLock::acquire(&lock_path(&staging), Path::new(OUT), STALE_AFTER).unwrap();
    fs::create_dir(&staging).unwrap();
    fs::write(
        Staging::at(&staging).owner_file(),
        format!("{}\n", elsewhere().token),
    )
    .unwrap();
    let msg = format!("{:#}", lock.check_before_publish(&staging).unwrap_err());
    assert!(
        msg.contains(&staging.display().to_string()) && msg.contains("not this run's"),
        "{msg}"
    );
    assert!(
        Staging::at(&staging).owner_file().exists(),
        "not taken out when not ours"
    );
    lock.mark_staging(&staging).unwrap();
    lock.check_owned(&staging).unwrap();
}

#[test]
fn the_heartbeat_survives_failed_writes_and_notices_a_takeover() {
    let tmp = tempfile::tempdir().unwrap();
    let staging = tmp.path().join(".out.reshard-tmp");
    let path = lock_path(&staging);
    let lock = OutputLock::acquire(&path, Path::new(OUT), STALE_AFTER).unwrap();
    fs::create_dir(&staging).unwrap();
    lock.mark_staging(&staging).unwrap();
    // Writes fail for a while: a directory in the lock's place (swapped atomically, so the
    // lock never looks removed).
    let blocker = tmp.path().join("blocker");
    fs::create_dir(&blocker).unwrap();
    crate::sys::exchange_paths(&path, &blocker).unwrap();
    std::thread::sleep(3 * BEAT);
    crate::sys::exchange_paths(&path, &blocker).unwrap();
    let before = beat_of(&path);
    wait_for("the heartbeat moves again", || beat_of(&path) > before);
    lock.check_owned(&staging).unwrap();

    // Another run takes the lock: the heartbeat records it, and that stands even if the
    // lock file were put back.
    let mine = fs::read(&path).unwrap();
    fs::remove_file(&path).unwrap();
    create_exclusive(&path, &elsewhere()).unwrap();
    wait_for("the heartbeat notices", || {
        lock.lost.lock().unwrap().is_some()
    });
    fs::write(&path, mine).unwrap();
    let msg = format!("{:#}", lock.check_owned(&staging).unwrap_err());
    assert!(msg.contains("holds it now"), "{msg}");
}

#[test]
fn a_guard_left_by_a_dead_run_elsewhere_is_cleared() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(".out.reshard-lock");
    let guard = guard_path(&path);
    create_exclusive(&path, &elsewhere()).unwrap();
    create_exclusive(&guard, &elsewhere()).unwrap();
    let window = Duration::from_millis(600);
    let lock = OutputLock::acquire(&path, Path::new(OUT), window).unwrap();
    assert!(!guard.exists());
    assert!(lock.took_over.as_ref().is_some_and(|t| !t.surely_dead));
    drop(lock);
    // A guard whose holder lives here (this process) is waited for; the message names it.
    let mut dead = Owner::me().unwrap();
    dead.pid = u32::MAX - 1;
    create_exclusive(&path, &dead).unwrap();
    create_exclusive(&guard, &Owner::me().unwrap()).unwrap();
    let err = OutputLock::acquire(&path, Path::new(OUT), window).map(|_| ());
    let msg = format!("{:#}", err.unwrap_err());
    assert!(msg.contains(&guard.display().to_string()), "{msg}");
}

#[test]
fn a_lock_that_cannot_be_made_or_read_is_reported_as_such() {
    let tmp = tempfile::tempdir().unwrap();
    let window = Duration::from_millis(600);
    let acquire = |path: &Path| {
        let got = OutputLock::acquire(path, Path::new(OUT), window).map(|_| ());
        format!("{:#}", got.unwrap_err())
    };
    let nowhere = tmp.path().join("missing").join(".out.reshard-lock");
    let msg = acquire(&nowhere);
    assert!(
        msg.contains("cannot create the staging directory's lock")
            && msg.contains(&nowhere.display().to_string()),
        "{msg}"
    );
    // A directory where the lock is: it exists but cannot be read.
    let path = tmp.path().join(".out.reshard-lock");
    fs::create_dir(&path).unwrap();
    let msg = acquire(&path);
    assert!(msg.contains("cannot read the output's lock"), "{msg}");
    fs::remove_dir(&path).unwrap();
    // Not a lock of reshard's: left alone.
    fs::write(&path, b"mine\n").unwrap();
    let msg = acquire(&path);
    assert!(msg.contains("not a reshard lock file"), "{msg}");
    assert_eq!(fs::read(&path).unwrap(), b"mine\n");
    // An empty file is a lock still being written (object storage): no holder yet.
    fs::write(&path, b"").unwrap();
    assert_eq!(read_owner(&path).unwrap(), None);
}

#[test]
fn a_takeover_guard_that_cannot_be_created_is_reported() {
    let tmp = tempfile::tempdir().unwrap();
    // A lock name so long that the guard's (and the file it is written to first) is over
    // the file system's limit of 255 bytes while the lock's own fits.
    let path = tmp
        .path()
        .join(format!(".{}.reshard-lock", "o".repeat(220)));
    let mut dead = Owner::me().unwrap();
    dead.pid = u32::MAX - 1;
    create_exclusive(&path, &dead).unwrap();
    let got = OutputLock::acquire(&path, Path::new(OUT), STALE_AFTER).map(|_| ());
    let msg = format!("{:#}", got.unwrap_err());
    assert!(msg.contains("cannot create the takeover guard"), "{msg}");
    assert_eq!(read_owner(&path).unwrap(), Some(dead), "left as it was");
}

#[test]
fn a_run_that_holds_its_lock_cleans_up_after_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let staging = tmp.path().join(".out.reshard-tmp");
    let lock = OutputLock::acquire(&lock_path(&staging), Path::new(OUT), STALE_AFTER).unwrap();
    assert!(lock.may_clean_up(&staging));
}

#[test]
fn a_lock_removed_under_its_run_is_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let staging = tmp.path().join(".out.reshard-tmp");
    fs::create_dir(&staging).unwrap();
    let path = lock_path(&staging);
    // Without a heartbeat, the check itself finds it gone.
    let paused = silent(&path, elsewhere());
    paused.mark_staging(&staging).unwrap();
    fs::remove_file(&path).unwrap();
    let msg = format!("{:#}", paused.check_owned(&staging).unwrap_err());
    assert!(msg.contains("(it was removed)"), "{msg}");
    drop(paused);
    // With one, the heartbeat finds it gone first.
    let lock = OutputLock::acquire(&path, Path::new(OUT), STALE_AFTER).unwrap();
    fs::remove_file(&path).unwrap();
    wait_for("the heartbeat notices", || {
        lock.lost.lock().unwrap().is_some()
    });
    let why = lock.lost.lock().unwrap().clone();
    assert_eq!(why.as_deref(), Some("it was removed"));
}

#[test]
fn a_dead_guard_is_cleared_within_one_takeover_and_a_live_one_stays() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(".out.reshard-lock");
    let guard = guard_path(&path);
    let me = Owner::me().unwrap();
    let mut dead = Owner::me().unwrap();
    dead.pid = u32::MAX - 1;
    create_exclusive(&path, &dead).unwrap();
    create_exclusive(&guard, &dead).unwrap();
    assert!(take_over(&path, &dead, &me, true, STALE_AFTER).unwrap());
    assert!(!path.exists() && !guard.exists());
    // A guard whose holder lives (this process) is not cleared: wait for it.
    create_exclusive(&path, &dead).unwrap();
    create_exclusive(&guard, &me).unwrap();
    assert!(!clear_stale_guard(&guard, &me, STALE_AFTER).unwrap());
    assert!(!take_over(&path, &dead, &me, true, STALE_AFTER).unwrap());
    assert!(path.exists() && guard.exists());
}

#[test]
fn a_busy_output_says_for_how_long_its_run_has_held_it() {
    let mut holder = elsewhere();
    holder.since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 3600;
    let msg = busy(Path::new(OUT), Path::new(".out.reshard-lock"), &holder);
    // 3600 s, or a second more if the clock ticked between.
    assert!(
        msg.contains(&format!("({}, for 360", holder.who())),
        "{msg}"
    );
}

#[test]
fn a_failing_heartbeat_is_told_once_when_it_starts_and_once_when_it_ends() {
    let path = Path::new(".out.reshard-lock");
    let mut writes = Writes::default();
    let failed = || Err(io::Error::from(ErrorKind::PermissionDenied));
    let said: Vec<Option<String>> = [Ok(()), failed(), failed(), failed(), Ok(()), Ok(())]
        .into_iter()
        .chain([failed(), Ok(())])
        .map(|w| writes.after(path, w))
        .collect();
    let told: Vec<usize> = (0..said.len()).filter(|&i| said[i].is_some()).collect();
    assert_eq!(told, [1, 4, 6, 7], "{said:?}");
    let line = said[1].as_deref().unwrap();
    assert!(
        line.contains("cannot write the lock's heartbeat") && line.contains(".out.reshard-lock"),
        "{line}"
    );
    assert!(said[4]
        .as_deref()
        .unwrap()
        .contains("the heartbeat is written again"));
}

#[test]
fn a_lock_taken_over_or_lost_is_no_longer_held() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(".out.reshard-lock");
    let lock = OutputLock::acquire(&path, Path::new(OUT), STALE_AFTER).unwrap();
    lock.check_held().unwrap();
    drop(lock);
    // Without a heartbeat, the check itself reads the lock: another run's now.
    let paused = silent(&path, elsewhere());
    paused.check_held().unwrap();
    let other = elsewhere();
    fs::remove_file(&path).unwrap();
    create_exclusive(&path, &other).unwrap();
    let msg = format!("{:#}", paused.check_held().unwrap_err());
    assert!(
        msg.contains(&path.display().to_string())
            && msg.contains(&format!("({} holds it now)", other.who()))
            && msg.contains("nothing is published"),
        "{msg}"
    );
    // What the heartbeat found stands, even with the lock back in this run's hands.
    fs::remove_file(&path).unwrap();
    create_exclusive(&path, &paused.owner).unwrap();
    paused.check_held().unwrap();
    *paused.lost.lock().unwrap() = Some("found by the heartbeat".into());
    let msg = format!("{:#}", paused.check_held().unwrap_err());
    assert!(msg.contains("(found by the heartbeat)"), "{msg}");
}

#[test]
fn only_a_takeover_of_a_run_that_may_live_leaves_its_staging_directory_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let staging = tmp.path().join(".out.reshard-tmp");
    let path = lock_path(&staging);
    fs::create_dir(&staging).unwrap();
    // No takeover: the earlier directory is this run's to continue or remove.
    let lock = OutputLock::acquire(&path, Path::new(OUT), STALE_AFTER).unwrap();
    assert!(lock.may_take(&staging, &staging).unwrap());
    drop(lock);
    // A holder whose pid proved it gone cannot wake: its staging directory is this run's.
    let mut dead = Owner::me().unwrap();
    dead.pid = u32::MAX - 1;
    create_exclusive(&path, &dead).unwrap();
    let lock = OutputLock::acquire(&path, Path::new(OUT), STALE_AFTER).unwrap();
    assert!(lock.took_over.as_ref().is_some_and(|t| t.surely_dead));
    assert!(lock.may_take(&staging, &staging).unwrap());
    assert!(staging.is_dir());
    // Its own directory, named after its token, is; one the pointer leads to that another
    // run named after itself is not (that run set the pointer after losing the lock).
    let its = crate::job::destination::staging::run_dir(&staging, &dead.token);
    assert!(lock.may_take(&its, &staging).unwrap());
    let another = crate::job::destination::staging::run_dir(&staging, &elsewhere().token);
    assert!(!lock.may_take(&another, &staging).unwrap());
}
