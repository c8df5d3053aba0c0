//! Sample hygiene: required extensions (--require-ext, --on-incomplete) and duplicates
//! (--on-duplicate), with webdataset's sample rules as the reference.

use crate::util::runs::run_two_shards;
use std::path::PathBuf;

use crate::util::samples::{assert_same_samples, flat, input, output};
use crate::util::tar::{decompress, tar_of};
use crate::util::verifier::{walk_file, Kind};
use crate::util::{index_json, tar_files, Dir};

/// Every regular member of the tar files `paths` as (name, content), sorted: what moved, however
/// reshard grouped the members into samples (a repeated name counts each time).
fn members_of(paths: &[PathBuf]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut v: Vec<_> = paths
        .iter()
        .flat_map(|p| {
            let w = walk_file(p);
            w.records
                .iter()
                .filter(|r| r.kind == Kind::File)
                .map(|r| (r.path.clone(), w.bytes[r.data..r.data + r.size].to_vec()))
                .collect::<Vec<_>>()
        })
        .collect();
    v.sort();
    v
}

#[test]
fn required_extensions_abort_warn_or_exclude() {
    let dir = Dir::new("require-ext");
    dir.create_dir("in");
    let members: [(&str, &[u8]); 5] = [
        ("a.jpg", b"1"),
        ("a.cls", b"1"),
        ("b.jpg", b"2"),
        ("c.jpg", b"3"),
        ("c.cls", b"3"),
    ];
    dir.create_bytes("in/x.tar", &tar_of(&members));
    for np in [1, 2] {
        let res = run_two_shards(&dir, np, "out", &["--require-ext", "jpg,cls"], 1);
        res.stderr_has("x.tar");
        res.stderr_has("sample \"b\" lacks .cls (has .jpg)");
        res.stderr_has("byte offset 2048");
        res.check(!dir.join("out").exists(), "nothing may be published");
    }
    let res = run_two_shards(
        &dir,
        2,
        "warned",
        &["--require-ext", "jpg,cls", "--on-incomplete", "warn"],
        0,
    );
    res.stderr_has("warning");
    let idx = index_json(&dir.join("warned"));
    assert_eq!(idx["reshard"]["samples"], 3);
    assert_eq!(idx["reshard"]["hygiene"]["incomplete"], 1);
    // Warned about, the incomplete sample still moves, with the others, byte for byte.
    let all = input(&[dir.join("in/x.tar")]);
    assert_same_samples(&all, &flat(&output(&dir.join("warned"))));
    run_two_shards(
        &dir,
        2,
        "excluded",
        &["--require-ext", ".jpg, cls", "--on-incomplete", "exclude"],
        0,
    );
    let idx = index_json(&dir.join("excluded"));
    assert_eq!(idx["reshard"]["samples"], 2, "b is left out");
    assert_eq!(idx["reshard"]["hygiene"]["excluded"], 1);
    let kept: Vec<_> = all.into_iter().filter(|g| g.key != "b").collect();
    assert_same_samples(&kept, &flat(&output(&dir.join("excluded"))));
}

/// A case: its name, the files to write, and what the error must say.
type Case = (&'static str, Vec<(&'static str, Vec<u8>)>, &'static str);

#[test]
fn duplicates_abort_by_default_and_can_be_kept() {
    let cases: [Case; 3] = [
        (
            "repeated-ext",
            vec![(
                "in/x.tar",
                tar_of(&[("a.jpg", b"1"), ("a.jpg", b"2"), ("b.jpg", b"3")]),
            )],
            "sample \"a\" has a second .jpg member",
        ),
        (
            "not-adjacent",
            vec![(
                "in/x.tar",
                tar_of(&[("a.jpg", b"1"), ("b.jpg", b"2"), ("a.cls", b"3")]),
            )],
            "sample \"a\" appears again (first at byte offset 0)",
        ),
        (
            "two-shards",
            vec![
                ("in/x.tar", tar_of(&[("a.jpg", b"1"), ("b.jpg", b"2")])),
                ("in/y.tar", tar_of(&[("c.jpg", b"3"), ("a.jpg", b"4")])),
            ],
            "sample key \"a\" occurs in two samples",
        ),
    ];
    for (name, files, needle) in cases {
        let dir = Dir::new(name);
        dir.create_dir("in");
        for (path, bytes) in &files {
            dir.create_bytes(path, bytes);
        }
        for np in [1, 3] {
            let res = run_two_shards(&dir, np, "out", &[], 1);
            res.stderr_has(needle);
            res.stderr_has("x.tar");
            res.check(!dir.join("out").exists(), "nothing may be published");
        }
        run_two_shards(&dir, 2, "kept", &["--on-duplicate", "keep"], 0);
        let res = run_two_shards(&dir, 2, "warned", &["--on-duplicate", "warn"], 0);
        res.stderr_has(needle);
        // Kept or warned about, every member moves once, byte for byte: the output holds the
        // input's members, whichever samples they were grouped into.
        let inputs: Vec<_> = files.iter().map(|(p, _)| dir.join(p)).collect();
        let want = members_of(&inputs);
        for out in ["kept", "warned"] {
            assert_eq!(
                members_of(&tar_files(&dir.join(out))),
                want,
                "{name}: {out}"
            );
        }
        assert_eq!(
            index_json(&dir.join("warned"))["reshard"]["hygiene"]["duplicates"],
            1,
            "{name}"
        );
    }
}

/// Many samples whose members are not adjacent, in a gzip shard and a plain one: each is found
/// once and counted (`--on-duplicate warn`), at any rank count; the keys to confirm are read in
/// one pass per shard.
#[test]
fn many_non_adjacent_samples_in_a_compressed_shard_are_each_counted() {
    let dir = Dir::new("many-dups");
    dir.create_dir("in");
    // a0.jpg a1.jpg ... a49.jpg a0.cls a1.cls ... a49.cls: 50 samples seen twice each.
    let names: Vec<String> = (0..50)
        .map(|i| format!("a{i}.jpg"))
        .chain((0..50).map(|i| format!("a{i}.cls")))
        .collect();
    let members: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), &b"x"[..])).collect();
    let bytes = tar_of(&members);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &bytes).unwrap();
    dir.create_bytes("in/x.tar.gz", &gz.finish().unwrap());
    // And one more copy of a7 in a plain shard: a third sample with that key.
    dir.create_bytes("in/y.tar", &tar_of(&[("a7.txt", b"y"), ("b.txt", b"z")]));
    for np in [1, 2, 3] {
        let out = format!("warned-{np}");
        let res = run_two_shards(&dir, np, &out, &["--on-duplicate", "warn"], 0);
        res.stderr_has("appears again");
        assert_eq!(
            index_json(&dir.join(&out))["reshard"]["hygiene"]["duplicates"],
            51
        );
        let inputs = [dir.join("in/x.tar.gz"), dir.join("in/y.tar")];
        let plain = dir.create_bytes("plain-x.tar", &decompress(&inputs[0]));
        assert_eq!(
            members_of(&tar_files(&dir.join(&out))),
            members_of(&[plain, inputs[1].clone()]),
            "np {np}"
        );
    }
}
