//! Trees of loose files for `--input-files`, built the same way every time (contents, modes and
//! modification times set explicitly), and outputs read back against them.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime};

use super::{noise, Dir};

/// The modification time every file of [`tree`] gets, plus its number.
pub const MTIME: u64 = 1_600_000_000;

/// What [`tree`] expects the output to hold: member name → bytes.
pub type Expected = BTreeMap<String, Vec<u8>>;

/// Writes a file with fixed bytes, mode and modification time.
fn file(root: &Path, rel: &str, bytes: &[u8], n: u64) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(&p, bytes).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
    let f = fs::File::options().write(true).open(&p).unwrap();
    f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(MTIME + n))
        .unwrap();
}

/// A tree of three class directories (one with a subdirectory, one with a directory three
/// levels down: shallow and deep units both), samples of one to three members, an empty file,
/// a 130-byte name, a non-ASCII name, a file that is a tar, and everything that is skipped:
/// hidden files, editors' leftovers, a keyless file, links to a directory (a loop) and to
/// nothing, a FIFO and a socket. Returns the members the output must hold with
/// `--label-from-dir cls` (a link to a file counts as the file), and the number of files.
pub fn tree(dir: &Dir, rel: &str) -> (Expected, usize) {
    let root = dir.create_dir(rel);
    let mut want = Expected::new();
    let mut n = 0;
    let mut add = |rel: &str, bytes: Vec<u8>, class: usize| {
        n += 1;
        file(&root, rel, &bytes, n);
        want.insert(rel.to_string(), bytes);
        let key = &rel
            [..rel.rfind('/').unwrap() + 1 + rel[rel.rfind('/').unwrap() + 1..].find('.').unwrap()];
        want.insert(format!("{key}.cls"), class.to_string().into_bytes());
    };
    for (c, class) in ["c0", "c1", "c2"].iter().enumerate() {
        for i in 0..9u64 {
            let len = (noise(c as u64 * 100 + i, 1)[0] as usize) * 11 + i as usize;
            add(
                &format!("{class}/s{i:03}.jpg"),
                noise(c as u64 * 100 + i, len),
                c,
            );
            if i % 3 == 0 {
                add(
                    &format!("{class}/s{i:03}.json"),
                    format!("{{\"i\":{i}}}").into_bytes(),
                    c,
                );
            }
            if i % 4 == 0 {
                add(&format!("{class}/s{i:03}.seg.png"), noise(7 + i, 700), c);
            }
        }
    }
    add("c0/empty_1.txt", Vec::new(), 0);
    add(
        "c0/archive_1.tar",
        ::tar::Builder::new(Vec::new()).into_inner().unwrap(),
        0,
    );
    add(&format!("c1/{}.jpg", "l".repeat(130)), noise(9, 300), 1);
    add("c1/caf\u{e9}.jpg", noise(10, 200), 1);
    add("c1/sub/deeper_1.jpg", noise(11, 1000), 1);
    add("c2/a/b/c/deep_1.jpg", noise(12, 1500), 2);
    add("c2/a/b/deep_2.jpg", noise(13, 600), 2);
    let files = n as usize;
    // Skipped: hidden, leftovers, keyless, a hidden directory with what it holds.
    for skipped in [
        "c0/.DS_Store",
        "c0/.s000.jpg.swp",
        "c0/s001.jpg~",
        "c0/#s002.jpg#",
        "c0/README",
        ".git/config",
        "c2/.cache/x.jpg",
    ] {
        file(&root, skipped, b"skip me", 0);
    }
    // A link to a file is followed (its bytes under the link's name); these are not.
    symlink("../c0/s000.jpg", root.join("c1/linked.jpg")).unwrap();
    let linked = want["c0/s000.jpg"].clone();
    want.insert("c1/linked.jpg".into(), linked);
    want.insert("c1/linked.cls".into(), b"1".to_vec());
    symlink("..", root.join("c1/loop")).unwrap();
    symlink("nothing", root.join("c1/dangling.jpg")).unwrap();
    let fifo = root.join("c2/pipe.jpg");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(status.success(), "mkfifo");
    drop(std::os::unix::net::UnixListener::bind(root.join("c2/socket.jpg")).unwrap());
    (want, files + 1)
}

/// A member read back: (bytes, mode, mtime, uid, gid, owner names).
pub type Found = (Vec<u8>, u32, u64, u64, u64, String);

/// Every member of the output shards in `out`: name → (bytes, mode, mtime, uid, gid, owner
/// names); a name twice is a failure.
pub fn members(out: &Path) -> BTreeMap<String, Found> {
    let mut found = BTreeMap::new();
    let mut shards: Vec<_> = fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "tar"))
        .collect();
    shards.sort();
    for shard in shards {
        let mut archive = ::tar::Archive::new(fs::File::open(&shard).unwrap());
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let name = String::from_utf8(entry.path_bytes().into_owned()).unwrap();
            let h = entry.header().clone();
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut bytes).unwrap();
            let owners = format!(
                "{:?}/{:?}",
                h.username_bytes().unwrap_or_default(),
                h.groupname_bytes().unwrap_or_default()
            );
            let value = (
                bytes,
                h.mode().unwrap(),
                h.mtime().unwrap(),
                h.uid().unwrap(),
                h.gid().unwrap(),
                owners,
            );
            assert!(found.insert(name.clone(), value).is_none(), "{name} twice");
        }
    }
    found
}

/// A directory of 9,000 files (one sample each, and one of two members) beside a small one.
pub fn flat_tree(dir: &Dir, rel: &str) {
    for i in 0..9000u64 {
        let bytes = noise(i, 100 + (i as usize * 13) % 300);
        dir.create_bytes(format!("{rel}/big/s{i:05}.bin"), &bytes);
    }
    dir.create_bytes(format!("{rel}/big/s04096.txt"), b"a second member");
    for i in 0..5u64 {
        dir.create_bytes(format!("{rel}/small/t{i}.bin"), &noise(i, 50));
    }
}
