//! Checks of the loader indexes (`--energon`, `--dali-index`) against the shards they index:
//! `.tar.idx` offsets against this crate's independent tar walk, and every index against
//! Python's `tarfile` and `sqlite3` (standard library only); and the real `energon` (installed
//! without torch, see examples/consumers/energon-requirements.txt) when the test venv has it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::verifier::{key_of, walk_file};
use super::{test_python, Dir, RunOutput};

/// Each `.tar.idx` of `out` holds the start of every sample's first record (the block there is
/// a tar header), then the end of the data, as little-endian u64s; returns the samples seen.
pub fn check_tar_idx(out: &Path) -> usize {
    let mut total = 0;
    for shard in super::tar_files(out) {
        let w = walk_file(&shard);
        let mut starts = Vec::new();
        let mut last: Option<Vec<u8>> = None;
        for r in &w.records {
            let key = key_of(&r.path).expect("a keyed member").to_vec();
            if last.as_ref() != Some(&key) {
                starts.push(r.start as u64);
                last = Some(key);
            }
        }
        let idx_path = PathBuf::from(format!("{}.idx", shard.display()));
        let bytes = fs::read(&idx_path).unwrap_or_else(|e| panic!("{}: {e}", idx_path.display()));
        let offsets: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let mut expected = starts.clone();
        expected.push(w.end as u64);
        assert_eq!(offsets, expected, "{}", idx_path.display());
        for &s in &starts {
            let block = &w.bytes[s as usize..s as usize + 512];
            assert_eq!(
                &block[257..262],
                b"ustar",
                "{}: offset {s} is not a tar header",
                idx_path.display()
            );
        }
        total += starts.len();
    }
    total
}

/// Python (standard library only) reading every shard of `out` with `tarfile` and checking
/// DALI's `NAME.idx`, energon's `.tar.idx`, `.info.json` and both tables of `index.sqlite`
/// field by field against it. Prints `ok SAMPLES`.
const CHECK_INDEXES: &str = r#"
import json, sqlite3, struct, sys, tarfile
out, energon, dali = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
names = [s["url"] for s in json.load(open(f"{out}/index.json"))["shardlist"]]
if energon:
    info = json.load(open(f"{out}/.nv-meta/.info.json"))
    assert list(info["shard_counts"]) == names, (info, names)
    db = sqlite3.connect(f"{out}/.nv-meta/index.sqlite")
total = 0
for tid, name in enumerate(names):
    samples = []
    with tarfile.open(f"{out}/{name}") as t:
        for m in t:
            assert m.isreg(), m.name
            d, _, base = m.name.rpartition("/")
            key = (d + "/" if d else "") + base.split(".", 1)[0]
            if not samples or samples[-1][0] != key:
                samples.append((key, m.offset, []))
            samples[-1][2].append((base.split(".", 1)[1], m.offset_data, m.size, m.name))
        end = t.offset
    total += len(samples)
    if dali:
        lines = open(f"{out}/{name[:-4]}.idx").read().split("\n")
        assert lines[0] == f"v1.2 {len(samples)}" and lines[-1] == "", lines[:1]
        for (key, _, parts), line in zip(samples, lines[1:-1], strict=True):
            want = " ".join(f"{e} {o} {s} {p}" for e, o, s, p in parts)
            assert line == want, (name, line, want)
    if energon:
        starts = [s[1] for s in samples] + [end]
        raw = open(f"{out}/{name}.idx", "rb").read()
        assert list(struct.unpack(f"<{len(raw) // 8}Q", raw)) == starts, name
        assert info["shard_counts"][name] == len(samples)
        rows = db.execute("SELECT sample_key, sample_index, byte_offset, byte_size FROM samples "
                          "WHERE tar_file_id = ? ORDER BY sample_index", (tid,)).fetchall()
        assert rows == [(k, i, s, starts[i + 1] - s) for i, (k, s, _) in enumerate(samples)], name
        parts = db.execute("SELECT sample_index, part_name, content_byte_offset, content_byte_size "
                           "FROM sample_parts WHERE tar_file_id = ? ORDER BY rowid", (tid,)).fetchall()
        assert parts == [(i, e, o, s) for i, (_, _, ps) in enumerate(samples) for e, o, s, _ in ps]
if energon:
    assert db.execute("SELECT count(*) FROM samples").fetchone()[0] == total
print("ok", total)
"#;

/// Runs [`CHECK_INDEXES`] on `out` with python3; returns the samples it saw.
pub fn check_with_python(dir: &Dir, out: &Path, energon: bool, dali: bool) -> usize {
    let flag = |b: bool| if b { "1" } else { "0" };
    let res = dir
        .program("python3")
        .args(["-c", CHECK_INDEXES])
        .arg(out)
        .args([flag(energon), flag(dali)])
        .assert_success();
    let n = res.stdout.trim().strip_prefix("ok ").map(str::parse);
    match n {
        Some(Ok(n)) => n,
        _ => res.fail("expected 'ok SAMPLES'"),
    }
}

/// The examples' torch stand-in, for PYTHONPATH.
pub fn torch_standin() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/consumers/torch_standin")
}

/// The test Python when it can import megatron.energon (with the torch stand-in).
pub fn energon_python() -> Option<PathBuf> {
    let py = test_python()?;
    Command::new(&py)
        .args(["-c", "import megatron.energon"])
        .env("PYTHONPATH", torch_standin())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
        .then_some(py)
}

/// `energon ARGS` through `py`, in `dir`.
pub fn energon(dir: &Dir, py: &Path, args: &[&str]) -> RunOutput {
    dir.program(py)
        .env("PYTHONPATH", torch_standin())
        .args([
            "-c",
            "import sys; from megatron.energon.cli.main import main; sys.argv[0] = 'energon'; main()",
        ])
        .args(args)
        .assert_success()
}

/// Both tables of an `index.sqlite`, every row in insertion order, as text.
pub fn sqlite_rows(dir: &Dir, db: &Path) -> String {
    let script = "import sqlite3, sys\nc = sqlite3.connect(sys.argv[1])\nfor t in ('samples', 'sample_parts'):\n    for r in c.execute(f'SELECT * FROM {t} ORDER BY rowid'):\n        print(t, r)";
    dir.program("python3")
        .args(["-c", script])
        .arg(db)
        .assert_success()
        .stdout
}

/// `examples/consumers/read_energon.py OUT [--split SPLIT]` through energon's readers, which
/// must succeed.
pub fn read_energon(dir: &Dir, py: &Path, out: &str, split: Option<&str>) -> RunOutput {
    read_energon_with(dir, py, out, split, &[])
}

/// [`read_energon`] with more arguments (`--no-key-index`).
pub fn read_energon_with(
    dir: &Dir,
    py: &Path,
    out: &str,
    split: Option<&str>,
    extra: &[&str],
) -> RunOutput {
    let mut cmd = dir.program(py);
    cmd.env("PYTHONPATH", torch_standin())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/consumers/read_energon.py"
        ))
        .arg(out);
    if let Some(split) = split {
        cmd.args(["--split", split]);
    }
    cmd.args(extra).assert_success()
}
