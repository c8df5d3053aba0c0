//! The corpus of archives made at test time by real writers (GNU tar's sparse formats, bsdtar,
//! Python's tarfile, pax, cpio, webdataset's TarWriter): the source files, the archives, and the
//! whole check an accepted archive must pass (moved verbatim, read back by GNU tar, tarfile and
//! webdataset as the original files).

use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use md5::{Digest, Md5};
use serde_json::Value;

use super::runs::run;
use super::verifier::{
    assert_indexer_agrees, assert_same_output, input_samples, key_of, verify, walk, Expected, Kind,
    Record, Verified,
};
use super::{have_python, noise, skip, tar_files, test_python, Dir};

/// The members of the corpus archives, in archive order: the sparse file is the first member of
/// `sp/a` and the last of `sp/b`, and a plain sample follows each, so that a sparse member
/// whose stored size is misread corrupts its neighbour.
pub const MEMBERS: [&str; 8] = [
    "sp/a.npy",
    "sp/a.cls",
    "sp/a.json",
    "sp/b.cls",
    "sp/b.txt",
    "sp/b.npy",
    "sp/c.jpg",
    "sp/c.cls",
];

/// Data regions of `sp/b.npy`: many more than the 4 an old GNU header holds (so GNU tar writes
/// chained extension blocks: 21 regions each) and a PAX 1.0 map longer than one block.
pub const B_REGIONS: u64 = 60;

/// Writes a file of `len` bytes that holds data only in `regions` (offset, length): the rest is
/// left as holes (`set_len`, then writes at offsets), which the filesystem stores as holes when
/// it can. The data has no zero bytes, so zero-scanning hole detection finds the same regions.
pub fn sparse_file(path: &Path, len: u64, regions: &[(u64, usize)], seed: u64) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut f = fs::File::create(path).unwrap();
    f.set_len(len).unwrap();
    for (i, &(at, n)) in regions.iter().enumerate() {
        let data: Vec<u8> = noise(seed + i as u64, n)
            .into_iter()
            .map(|b| b.max(1))
            .collect();
        f.seek(SeekFrom::Start(at)).unwrap();
        f.write_all(&data).unwrap();
    }
}

/// The files the archives are made from, under `src/`: the members of [`MEMBERS`], two with
/// non-ASCII names (`sg/déjà.*`) and two pairs for the link cases (`lk/`).
pub fn sources(dir: &Dir) -> PathBuf {
    let src = dir.create_dir("src");
    // One data region and a trailing hole.
    sparse_file(&src.join("sp/a.npy"), 64 * 1024, &[(0, 5000)], 1);
    // A leading hole, then B_REGIONS regions of growing length 8 KiB apart, then a hole.
    let regions: Vec<(u64, usize)> = (0..B_REGIONS)
        .map(|i| (4096 + i * 8192, 600 + 37 * i as usize))
        .collect();
    sparse_file(&src.join("sp/b.npy"), (B_REGIONS + 2) * 8192, &regions, 100);
    for (name, bytes) in [
        ("sp/a.cls", b"7\n".to_vec()),
        ("sp/a.json", br#"{"label": 7}"#.to_vec()),
        ("sp/b.cls", b"3\n".to_vec()),
        ("sp/b.txt", noise(5, 700)),
        ("sp/c.jpg", noise(6, 1500)),
        ("sp/c.cls", b"1\n".to_vec()),
        ("sg/d\u{e9}j\u{e0}.jpg", noise(7, 1000)),
        ("sg/d\u{e9}j\u{e0}.cls", b"2\n".to_vec()),
        ("lk/a.jpg", noise(8, 300)),
        ("lk/a.cls", b"4\n".to_vec()),
        ("lk/b.jpg", noise(9, 300)),
        ("lk/b.cls", b"5\n".to_vec()),
    ] {
        dir.create_bytes(format!("src/{name}"), &bytes);
    }
    fs::hard_link(src.join("lk/a.jpg"), src.join("lk/a.png")).unwrap();
    std::os::unix::fs::symlink("b.jpg", src.join("lk/b.txt")).unwrap();
    src
}

/// Whether the filesystem under `src` stored the holes of the sparse sources: GNU tar and bsdtar
/// write a sparse member only for a file with fewer blocks allocated than its size says. Reports
/// a skip of `test` when it did not.
pub fn holes_stored(src: &Path, test: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(src.join("sp/b.npy")).unwrap();
    let ok = m.blocks() * 512 < m.len();
    if !ok {
        skip(
            test,
            &format!(
                "the filesystem of {} stores no holes, so no tool writes sparse members",
                src.display()
            ),
        );
    }
    ok
}

/// `tar ARGS --sparse -cf NAME -C src MEMBERS` (deterministic owners and times; holes found by
/// scanning for zeros, so the sparse maps do not depend on the filesystem).
pub fn gnu_tar(dir: &Dir, name: &str, args: &[&str], members: &[&str]) -> PathBuf {
    let out = dir.join(name);
    dir.program("tar")
        .args(args)
        .args([
            "--sparse",
            "--hole-detection=raw",
            "--mtime=@1700000000",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "-cf",
        ])
        .arg(&out)
        .arg("-C")
        .arg(dir.join("src"))
        .args(members)
        .assert_success();
    out
}

/// Whether `needle` occurs in `hay`.
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The record of `archive` whose member path is `path`, with the archive's bytes.
pub fn record(archive: &Path, path: &str) -> (Vec<u8>, Record) {
    let w = walk(fs::read(archive).unwrap())
        .unwrap_or_else(|e| panic!("{}: the verifier cannot walk it: {e}", archive.display()));
    let r = w
        .records
        .iter()
        .find(|r| r.path == path.as_bytes())
        .unwrap_or_else(|| panic!("{}: no member {path}", archive.display()))
        .clone();
    (w.bytes, r)
}

/// The files below `dir`, as sorted paths relative to `root`.
pub fn files_below(root: &Path, dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files_below(root, &p));
        } else {
            out.push(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
        }
    }
    out.sort();
    out
}

/// The MD5 of `bytes` in hex, as Python's `hexdigest` prints it.
pub fn md5_hex(bytes: &[u8]) -> String {
    format!("{:x}", Md5::digest(bytes))
}

/// Reads shards with Python: `tarfile` lists every regular member with its content's MD5;
/// `wds` groups them into samples with webdataset's own iterators.
pub const PY_READ: &str = r#"
import hashlib, json, sys, tarfile

mode, shards = sys.argv[1], sys.argv[2:]
out = []
for path in shards:
    if mode == "tarfile":
        with tarfile.open(path) as tf:
            out.append([[m.name, hashlib.md5(tf.extractfile(m).read()).hexdigest()]
                        for m in tf.getmembers() if m.isreg()])
    else:
        from webdataset import tariterators
        with open(path, "rb") as f:
            files = (dict(f, __url__=path) for f in tariterators.tar_file_iterator(f))
            samples = tariterators.group_by_keys(files)
            out.append([[s["__key__"], {k: hashlib.md5(v).hexdigest()
                                        for k, v in s.items() if not k.startswith("__")}]
                        for s in samples])
print(json.dumps(out))
"#;

/// Reads the shards of `out` back with GNU tar (listing, then extracting: every file equals its
/// original, sparse files included), Python's tarfile (member names in the order the verifier
/// found, contents) and webdataset (the samples of each shard in output order, their members'
/// contents).
pub fn read_back(dir: &Dir, src: &Path, out: &str, v: &Verified, test: &str) {
    let shards = tar_files(&dir.join(out));
    assert_eq!(shards.len(), v.members.len());
    read_back_with_gnu_tar(dir, src, out, v, &shards);
    // Python: tarfile, and webdataset when its venv is there.
    let py = match test_python() {
        Some(py) => Some(py),
        None => {
            skip(
                test,
                "no Python with webdataset (set RESHARD_TEST_PYTHON, or make the venv as \
                 .ci/run does: python3 -m venv target/pyenv && target/pyenv/bin/pip install \
                 webdataset): read back with tarfile only",
            );
            have_python(test).then(|| PathBuf::from("python3"))
        }
    };
    let Some(py) = py else { return };
    read_back_with_tarfile(dir, src, &py, v, &shards);
    if py == Path::new("python3") {
        return;
    }
    read_back_with_webdataset(dir, src, &py, v, &shards);
}

/// The bytes of the source file `name`.
fn original(src: &Path, name: &str) -> Vec<u8> {
    fs::read(src.join(name)).unwrap_or_else(|e| panic!("{name}: no such source file: {e}"))
}

/// GNU tar lists every shard as the verifier found it and extracts the original files.
fn read_back_with_gnu_tar(dir: &Dir, src: &Path, out: &str, v: &Verified, shards: &[PathBuf]) {
    let x = dir.create_dir(format!("x-{out}"));
    for (i, shard) in shards.iter().enumerate() {
        let listed = dir
            .program("tar")
            .args(["--quoting-style=literal", "-tf"])
            .arg(shard)
            .assert_success();
        let listed: Vec<&str> = listed.stdout.lines().collect();
        assert_eq!(listed, v.members[i], "tar -tf {}", shard.display());
        dir.program("tar").arg("-tvf").arg(shard).assert_success();
        dir.program("tar")
            .arg("-xf")
            .arg(shard)
            .arg("-C")
            .arg(&x)
            .assert_success();
    }
    let mut want: Vec<String> = v.members.iter().flatten().cloned().collect();
    want.sort();
    assert_eq!(
        files_below(&x, &x),
        want,
        "the files GNU tar extracts from {out}"
    );
    for name in &want {
        assert!(
            fs::read(x.join(name)).unwrap() == original(src, name),
            "{out}: {name} as GNU tar extracts it differs from the original"
        );
    }
}

/// `PY_READ` in `mode` over the shards, its JSON answer.
fn py_read(dir: &Dir, py: &Path, mode: &str, shards: &[PathBuf]) -> Value {
    let res = dir
        .program(py)
        .args(["-c", PY_READ, mode])
        .args(shards)
        .assert_success();
    serde_json::from_str(&res.stdout).unwrap_or_else(|e| res.fail(&format!("not JSON: {e}")))
}

/// Python's tarfile reads the members the verifier found, with the original contents.
fn read_back_with_tarfile(dir: &Dir, src: &Path, py: &Path, v: &Verified, shards: &[PathBuf]) {
    let listed = py_read(dir, py, "tarfile", shards);
    for (i, members) in v.members.iter().enumerate() {
        let got: Vec<(String, String)> = listed[i]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m[0].as_str().unwrap().to_string(),
                    m[1].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let want: Vec<(String, String)> = members
            .iter()
            .map(|n| (n.clone(), md5_hex(&original(src, n))))
            .collect();
        assert_eq!(
            got,
            want,
            "tarfile reads other members or contents from {}",
            shards[i].display()
        );
    }
}

/// webdataset reads each shard's samples in output order, with their members' contents.
fn read_back_with_webdataset(dir: &Dir, src: &Path, py: &Path, v: &Verified, shards: &[PathBuf]) {
    let samples = py_read(dir, py, "wds", shards);
    let mut order = v.order.iter();
    for (i, members) in v.members.iter().enumerate() {
        let got = samples[i].as_array().unwrap();
        assert_eq!(
            got.len(),
            v.counts[i],
            "webdataset samples in {}",
            shards[i].display()
        );
        let mut names = Vec::new();
        for s in got {
            let key = s[0].as_str().unwrap();
            assert_eq!(
                Some(&key.to_string()),
                order.next(),
                "webdataset sample order"
            );
            for (ext, md5) in s[1].as_object().unwrap() {
                let name = format!("{key}.{ext}");
                assert_eq!(
                    md5.as_str().unwrap(),
                    md5_hex(&original(src, &name)),
                    "webdataset reads other bytes for {name} from {}",
                    shards[i].display()
                );
                names.push(name);
            }
        }
        let mut want = members.clone();
        want.sort();
        names.sort();
        assert_eq!(names, want, "webdataset members of {}", shards[i].display());
    }
}

/// Cross-checks the verifier's sample ranges of `archive` with GNU tar, whatever reshard does:
/// each range, followed by an end-of-archive marker, must be a tar that GNU tar lists as the
/// sample's members and extracts to the original files (sparse ones included).
pub fn samples_stand_alone(dir: &Dir, archive: &Path) {
    let shard = input_samples(archive);
    let name = archive.file_stem().unwrap().to_string_lossy().into_owned();
    for (i, s) in shard.samples.iter().enumerate() {
        let mut bytes = shard.sample_bytes(s).to_vec();
        bytes.extend([0u8; 1024]);
        let one = dir.create_bytes(format!("alone-{name}/{i}.tar"), &bytes);
        let listed = dir
            .program("tar")
            .args(["--quoting-style=literal", "-tf"])
            .arg(&one)
            .assert_success();
        let listed: Vec<&str> = listed.stdout.lines().collect();
        assert_eq!(
            listed,
            s.members,
            "{}: bytes {}..{} (sample {:?} by the verifier's reading) as GNU tar lists them",
            archive.display(),
            s.start,
            s.end,
            s.key
        );
        let x = dir.create_dir(format!("alone-{name}/{i}"));
        dir.program("tar")
            .arg("-xf")
            .arg(&one)
            .arg("-C")
            .arg(&x)
            .assert_success();
        for m in &s.members {
            assert!(
                fs::read(x.join(m)).unwrap() == fs::read(dir.join("src").join(m)).unwrap(),
                "{}: {m} extracted from its sample's bytes alone differs from the original",
                archive.display()
            );
        }
    }
}

/// The whole check of an archive that must be accepted: the verifier's reading of it (keys,
/// members under their real names, skipped entries, each sample a tar of its own to GNU tar),
/// reshard at np 1 and np 3 (verified: each
/// sample's records byte-identical; both outputs identical), the indexer's agreement with the
/// verifier, and the output read back by GNU tar, tarfile and webdataset.
pub fn moves_verbatim(dir: &Dir, archive: &Path, members: &[&str], other_entries: u64, test: &str) {
    let shard = input_samples(archive);
    let got: Vec<String> = shard
        .samples
        .iter()
        .flat_map(|s| s.members.clone())
        .collect();
    assert_eq!(
        got,
        members,
        "{}: members by the verifier's reading",
        archive.display()
    );
    let mut keys: Vec<&[u8]> = members
        .iter()
        .map(|m| key_of(m.as_bytes()).unwrap())
        .collect();
    keys.dedup();
    let got: Vec<&[u8]> = shard.samples.iter().map(|s| s.key.as_bytes()).collect();
    assert_eq!(got, keys, "{}: sample keys", archive.display());
    samples_stand_alone(dir, archive);
    assert_eq!(
        shard.skipped.other_entries,
        other_entries,
        "{}",
        archive.display()
    );
    let name = archive.file_stem().unwrap().to_string_lossy().into_owned();
    let spec = archive.display().to_string();
    let shards = 2;
    let mut first = None;
    for np in [1, 3] {
        let out = format!("out-{name}-np{np}");
        run(dir, Some(np), &[&spec], &out, shards, 5, &[]);
        let v = verify(
            &Expected::new(dir.path(), &[archive.to_path_buf()], shards, 5, np),
            &dir.join(&out),
        );
        assert_eq!(v.skipped.other_entries, other_entries);
        // reshard's own verify, whose walk of the tar shares no code with the run's reader,
        // agrees on every writer's archive.
        dir.reshard(Some(np))
            .args(["verify", "--input", &spec, "--output", &out])
            .assert_success();
        first.get_or_insert((out, v));
    }
    assert_same_output(
        &dir.join(format!("out-{name}-np1")),
        &dir.join(format!("out-{name}-np3")),
        &["ranks"],
    );
    assert_indexer_agrees(archive);
    let (out, v) = first.unwrap();
    read_back(dir, &dir.join("src"), &out, &v, test);
}

/// Checks that GNU tar wrote old GNU sparse members: `S` headers, `sp/b.npy` with extension
/// blocks (its `isextended` flag set) and a stored size well below its real size.
pub fn assert_old_gnu_sparse(archive: &Path) {
    for (path, extended) in [("sp/a.npy", false), ("sp/b.npy", true)] {
        let (bytes, r) = record(archive, path);
        let h = &bytes[r.header..r.header + 512];
        assert_eq!(
            h[156],
            b'S',
            "{}: {path} is not an old GNU sparse member",
            archive.display()
        );
        assert_eq!(
            h[482] != 0,
            extended,
            "{}: {path}: isextended",
            archive.display()
        );
        let real = fs::metadata(Path::new(archive).with_file_name("src").join(path))
            .unwrap()
            .len();
        assert!(
            ((r.end - r.header) as u64) < real,
            "{}: {path} is stored whole",
            archive.display()
        );
    }
}

/// Checks that `archive` holds its sparse files as PAX sparse members: the PAX records hold
/// `needle`, and the member's own header holds a `GNUSparseFile.` placeholder name when
/// `placeholder`.
pub fn assert_pax_sparse(archive: &Path, needle: &str, placeholder: bool) {
    for path in ["sp/a.npy", "sp/b.npy"] {
        let (bytes, r) = record(archive, path);
        assert_eq!(r.kind, Kind::File);
        assert!(
            r.types.starts_with(b"x"),
            "{}: {path}: types {:?}",
            archive.display(),
            r.types
        );
        assert!(
            contains(&bytes[r.start..r.header], needle.as_bytes()),
            "{}: {path}: no {needle} in its PAX records",
            archive.display()
        );
        assert_eq!(
            contains(&bytes[r.header..r.header + 100], b"GNUSparseFile."),
            placeholder,
            "{}: {path}: placeholder name",
            archive.display()
        );
    }
}
