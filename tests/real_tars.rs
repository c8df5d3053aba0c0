//! A corpus of archives made at test time by real writers (issue 13): GNU tar's sparse formats
//! (old GNU `S` members with extension blocks in the gnu and oldgnu formats; PAX sparse 0.0, 0.1
//! and 1.0 in the posix format), bsdtar on a file with holes, Python's tarfile (ustar, gnu, pax),
//! `pax -x ustar`, `cpio -H ustar` and webdataset's TarWriter; a GNU volume label; headers with
//! checksums summed over signed bytes. Each archive must move verbatim (every sample's records
//! byte-identical, np 1 and np 3 identical) and read back with GNU tar, tarfile and webdataset
//! as the same samples and the same file contents as the files it was made from.
//!
//! Archives reshard cannot move are refused, naming the file, the byte offset and the reason: a
//! link between members of one sample, and a file that is not a tar at all (a JPEG).

use std::fs;

use crate::util::corpus::{
    assert_old_gnu_sparse, assert_pax_sparse, gnu_tar, holes_stored, moves_verbatim, record,
    sources, MEMBERS,
};
use crate::util::runs::refused;
use crate::util::tar::sign_checksums;
use crate::util::verifier::walk;
use crate::util::{find_on_path, have_python, noise, skip, test_python, Dir};

#[test]
fn gnu_tar_sparse_gnu_format() {
    old_gnu_sparse("gnu", "gnu_tar_sparse_gnu_format");
}

#[test]
fn gnu_tar_sparse_oldgnu_format() {
    old_gnu_sparse("oldgnu", "gnu_tar_sparse_oldgnu_format");
}

/// GNU tar's `FORMAT` (gnu or oldgnu) with `--sparse`: old GNU sparse members (type `S`), and
/// the archive moves verbatim.
fn old_gnu_sparse(format: &str, test: &str) {
    let dir = Dir::new(&format!("sparse-{format}"));
    if !holes_stored(&sources(&dir), test) {
        return;
    }
    let tar = gnu_tar(
        &dir,
        &format!("{format}-sparse.tar"),
        &[&format!("--format={format}")],
        &MEMBERS,
    );
    assert_old_gnu_sparse(&tar);
    moves_verbatim(&dir, &tar, &MEMBERS, 0, test);
}

/// PAX sparse 1.0 (GNU tar's posix default): a placeholder name in the ustar header, the real
/// one in `GNU.sparse.name`, the map at the start of the member's data.
#[test]
fn gnu_tar_sparse_posix_1_0() {
    pax_sparse(
        "1.0",
        "GNU.sparse.major=1",
        true,
        "gnu_tar_sparse_posix_1_0",
    );
}

/// PAX sparse 0.0: the map as repeated `GNU.sparse.offset`/`numbytes` records, the real name
/// in the header.
#[test]
fn gnu_tar_sparse_posix_0_0() {
    pax_sparse(
        "0.0",
        "GNU.sparse.numbytes=",
        false,
        "gnu_tar_sparse_posix_0_0",
    );
}

/// PAX sparse 0.1: the map in one `GNU.sparse.map` record, the real name in `GNU.sparse.name`.
#[test]
fn gnu_tar_sparse_posix_0_1() {
    pax_sparse("0.1", "GNU.sparse.map=", true, "gnu_tar_sparse_posix_0_1");
}

/// GNU tar's posix format with `--sparse-version=VERSION`: its PAX records hold `record` (and a
/// placeholder name when `placeholder`), and the archive moves verbatim.
fn pax_sparse(version: &str, record: &str, placeholder: bool, test: &str) {
    let dir = Dir::new(&format!("sparse-pax{}", version.replace('.', "")));
    if !holes_stored(&sources(&dir), test) {
        return;
    }
    let tar = gnu_tar(
        &dir,
        &format!("posix-sparse-{version}.tar"),
        &["--format=posix", &format!("--sparse-version={version}")],
        &MEMBERS,
    );
    assert_pax_sparse(&tar, record, placeholder);
    moves_verbatim(&dir, &tar, &MEMBERS, 0, test);
}

/// bsdtar writes PAX sparse 1.0 on its own for a file with holes (found with SEEK_HOLE, so only
/// where the filesystem stores holes).
#[test]
fn bsdtar_pax_sparse_from_a_file_with_holes() {
    const TEST: &str = "bsdtar_pax_sparse_from_a_file_with_holes";
    if find_on_path("bsdtar").is_none() {
        skip(
            TEST,
            "bsdtar not found on PATH (apt-get install libarchive-tools)",
        );
        return;
    }
    let dir = Dir::new("sparse-bsdtar");
    if !holes_stored(&sources(&dir), TEST) {
        return;
    }
    let tar = dir.join("bsdtar.tar");
    dir.program("bsdtar")
        .arg("-cf")
        .arg(&tar)
        .arg("-C")
        .arg(dir.join("src"))
        .args(MEMBERS)
        .assert_success();
    assert_pax_sparse(&tar, "GNU.sparse.major=1", true);
    moves_verbatim(&dir, &tar, &MEMBERS, 0, TEST);
}

const PY_TARFILE: &str = r#"
import sys, tarfile
src, out, fmt = sys.argv[1], sys.argv[2], sys.argv[3]
fmt = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}[fmt]
with tarfile.open(out, "w", format=fmt) as tf:
    for name in sys.argv[4:]:
        tf.add(src + "/" + name, arcname=name)
"#;

/// Python's tarfile (which stores sparse files whole) in its three formats.
#[test]
fn python_tarfile_ustar_gnu_and_pax() {
    const TEST: &str = "python_tarfile_ustar_gnu_and_pax";
    if !have_python(TEST) {
        return;
    }
    let dir = Dir::new("real-tarfile");
    let src = sources(&dir);
    for fmt in ["ustar", "gnu", "pax"] {
        let tar = dir.join(format!("tarfile-{fmt}.tar"));
        dir.program("python3")
            .args(["-c", PY_TARFILE])
            .arg(&src)
            .arg(&tar)
            .arg(fmt)
            .args(MEMBERS)
            .assert_success();
        moves_verbatim(&dir, &tar, &MEMBERS, 0, TEST);
    }
}

/// `pax -w -x ustar` and `cpio -o -H ustar` (which ends with its own trailer).
#[test]
fn pax_and_cpio_ustar() {
    const TEST: &str = "pax_and_cpio_ustar";
    let dir = Dir::new("real-pax-cpio");
    let src = sources(&dir);
    for (tool, script) in [
        (
            "pax",
            r#"cd "$1" && out=$2 && shift 2 && pax -w -x ustar -f "$out" "$@""#,
        ),
        (
            "cpio",
            r#"cd "$1" && out=$2 && shift 2 && printf '%s\n' "$@" | cpio --quiet -o -H ustar > "$out""#,
        ),
    ] {
        if find_on_path(tool).is_none() {
            skip(
                TEST,
                &format!("{tool} not found on PATH (apt-get install {tool})"),
            );
            continue;
        }
        let tar = dir.join(format!("{tool}-ustar.tar"));
        dir.program("sh")
            .args(["-c", script, "sh"])
            .arg(&src)
            .arg(&tar)
            .args(MEMBERS)
            .assert_success();
        moves_verbatim(&dir, &tar, &MEMBERS, 0, TEST);
    }
}

const PY_TARWRITER: &str = r#"
import re, sys, webdataset
src, out = sys.argv[1], sys.argv[2]
samples = {}
for name in sys.argv[3:]:
    key, ext = re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$", name).groups()
    samples.setdefault(key, {"__key__": key})[ext] = open(src + "/" + name, "rb").read()
with webdataset.TarWriter(out, encoder=False, mtime=1700000000) as w:
    for s in samples.values():
        w.write(s)
"#;

/// webdataset's own writer (members of a sample sorted by extension).
#[test]
fn webdataset_tarwriter() {
    const TEST: &str = "webdataset_tarwriter";
    let Some(py) = test_python() else {
        skip(
            TEST,
            "no Python with webdataset (RESHARD_TEST_PYTHON or target/pyenv)",
        );
        return;
    };
    let dir = Dir::new("real-tarwriter");
    let src = sources(&dir);
    let tar = dir.join("tarwriter.tar");
    dir.program(&py)
        .args(["-c", PY_TARWRITER])
        .arg(&src)
        .arg(&tar)
        .args(MEMBERS)
        .assert_success();
    let sorted = [
        "sp/a.cls",
        "sp/a.json",
        "sp/a.npy",
        "sp/b.cls",
        "sp/b.npy",
        "sp/b.txt",
        "sp/c.cls",
        "sp/c.jpg",
    ];
    moves_verbatim(&dir, &tar, &sorted, 0, TEST);
}

/// A GNU volume label (`tar -V`) before the first member is skipped and counted as an "other"
/// entry; the sparse members after it move as in the gnu format.
#[test]
fn gnu_volume_label_is_skipped_and_counted() {
    let dir = Dir::new("real-label");
    sources(&dir);
    let tar = gnu_tar(
        &dir,
        "labelled.tar",
        &["--format=gnu", "-V", "reshard test volume"],
        &MEMBERS,
    );
    let w = walk(fs::read(&tar).unwrap()).unwrap();
    assert_eq!(w.records[0].types, b"V", "no volume label first");
    assert_eq!(w.records[0].path, b"reshard test volume");
    moves_verbatim(
        &dir,
        &tar,
        &MEMBERS,
        1,
        "gnu_volume_label_is_skipped_and_counted",
    );
}

/// Header checksums summed over signed bytes (a ustar archive with non-ASCII names whose
/// checksums were rewritten so) are accepted, and GNU tar, tarfile and webdataset read the
/// output.
#[test]
fn signed_header_checksums_are_accepted() {
    const TEST: &str = "signed_header_checksums_are_accepted";
    if !have_python(TEST) {
        return;
    }
    let dir = Dir::new("real-signed");
    let src = sources(&dir);
    let members = [
        "sg/d\u{e9}j\u{e0}.jpg",
        "sg/d\u{e9}j\u{e0}.cls",
        "sp/c.jpg",
        "sp/c.cls",
    ];
    let tar = dir.join("signed.tar");
    dir.program("python3")
        .args(["-c", PY_TARFILE])
        .arg(&src)
        .arg(&tar)
        .arg("ustar")
        .args(members)
        .assert_success();
    assert_eq!(sign_checksums(&tar), 2, "headers with non-ASCII names");
    // GNU tar takes the signed sums as they are.
    dir.program("tar").arg("-tf").arg(&tar).assert_success();
    moves_verbatim(&dir, &tar, &members, 0, TEST);
}

/// A hard link (GNU tar's type `1` for a second name of one file) between members of one
/// sample: reshard cannot move the sample without its target's data.
#[test]
fn hard_link_inside_a_sample_is_refused() {
    link_inside_a_sample_is_refused("hardlink", ["lk/a.jpg", "lk/a.png", "lk/a.cls"], b"1");
}

/// A symlink between members of one sample.
#[test]
fn symlink_inside_a_sample_is_refused() {
    link_inside_a_sample_is_refused("symlink", ["lk/b.jpg", "lk/b.txt", "lk/b.cls"], b"2");
}

/// Archives `members` (the second a link of type `typeflag` in the sources) with GNU tar as
/// `NAME.tar` and requires the job to refuse it, naming the link, its offset, the file and the
/// way out.
fn link_inside_a_sample_is_refused(name: &str, members: [&str; 3], typeflag: &[u8]) {
    let dir = Dir::new(&format!("real-{name}"));
    sources(&dir);
    let good = gnu_tar(
        &dir,
        "good.tar",
        &["--format=gnu"],
        &["sp/c.jpg", "sp/c.cls"],
    );
    let file = format!("{name}.tar");
    let tar = gnu_tar(&dir, &file, &["--format=gnu"], &members);
    let (_, r) = record(&tar, members[1]);
    assert_eq!(r.types, typeflag, "GNU tar wrote no {name}");
    refused(
        &dir,
        &[&good, &tar],
        &[
            "link".into(),
            members[1].into(),
            format!("byte offset {}", r.start),
            file,
            "dereference".into(),
        ],
    );
}

/// A JPEG given as a shard is not a tar archive, and the message says what it is.
#[test]
fn a_jpeg_is_not_a_tar_archive() {
    let dir = Dir::new("real-jpeg");
    sources(&dir);
    let good = gnu_tar(
        &dir,
        "good.tar",
        &["--format=gnu"],
        &["sp/c.jpg", "sp/c.cls"],
    );
    let mut jpeg = vec![
        0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10, b'J', b'F', b'I', b'F', 0x00, 0x01, 0x01, 0x00, 0x00,
        0x01, 0x00, 0x01, 0x00, 0x00,
    ];
    jpeg.extend(noise(11, 4000));
    jpeg.extend([0xFF, 0xD9]);
    let bad = dir.create_bytes("photo.tar", &jpeg);
    refused(
        &dir,
        &[&good, &bad],
        &[
            "not a tar archive".into(),
            "JPEG".into(),
            "byte offset 0".into(),
            "photo.tar".into(),
        ],
    );
}
