//! `reshard run` on generated data: correctness under every rank count, byte-identical output
//! across rank counts, memory budgets and rounds, seeds and epochs, readers, input specs.

use std::fs;
use std::path::{Path, PathBuf};

use crate::util::data::uneven;
use crate::util::permutation::assert_order;
use crate::util::runs::{exchange_rounds, run, same_bytes_for_every_rank_count};
use crate::util::tar::gnu_tar_list;
use crate::util::verifier::{assert_same_output, input_samples, verify, Expected};
use crate::util::{have_python, index_json, Dir, RunOutput};

#[test]
fn gnu_long_names_same_bytes_for_every_rank_count() {
    same_bytes_for_every_rank_count("gnu", b'L');
}

#[test]
fn pax_long_names_same_bytes_for_every_rank_count() {
    same_bytes_for_every_rank_count("pax", b'x');
}

#[test]
fn tiny_memory_budget_and_rounds_give_the_same_bytes() {
    let dir = Dir::new("rounds");
    // Samples of hundreds of KiB: larger than what one destination may receive per round under
    // a 1 MiB budget, and far larger than a 4 KiB MPI exchange.
    let inputs = dir.generate(
        "in",
        &[
            "--shards",
            "3",
            "--samples",
            "30",
            "--mean-size",
            "96KiB",
            "--sigma",
            "1",
            "--skew",
            "2",
            "--seed",
            "5",
        ],
    );
    // Larger than a quarter of the budget: more than any one destination's share of a round
    // once send and receive buffers are split among two or more ranks.
    let big = inputs
        .iter()
        .flat_map(|p| {
            let s = input_samples(p);
            s.samples
                .iter()
                .map(|x| x.end - x.start)
                .collect::<Vec<_>>()
        })
        .filter(|&len| len > 256 << 10)
        .count();
    assert!(
        big >= 2,
        "only {big} samples over 256 KiB: the test would not prove chunking"
    );

    let shards = 4;
    let reference = run(&dir, Some(2), &["in"], "out-default", shards, 9, &[]);
    let rounds_of = |res: &RunOutput| {
        exchange_rounds(res)
            .unwrap_or_else(|| res.fail("the summary has no \"exchange rounds: N\" line"))
    };
    let default_rounds = rounds_of(&reference);
    verify(
        &Expected::new(dir.path(), &inputs, shards, 9, 2),
        &dir.join("out-default"),
    );
    let cases: [(usize, &[&str]); 4] = [
        (3, &["--mem-limit", "1MiB"]),
        (1, &["--mem-limit", "1MiB", "--max-round-bytes", "4KiB"]),
        (2, &["--max-round-bytes", "4KiB"]),
        (4, &["--mem-limit", "1MiB", "--max-round-bytes", "4KiB"]),
    ];
    for (i, (np, extra)) in cases.iter().enumerate() {
        let out = format!("out-{i}-np{np}");
        let res = run(&dir, Some(*np), &["in"], &out, shards, 9, extra);
        verify(
            &Expected::new(dir.path(), &inputs, shards, 9, *np),
            &dir.join(&out),
        );
        assert_same_output(&dir.join("out-default"), &dir.join(&out), &["ranks"]);
        if extra.contains(&"--mem-limit") {
            let (d, r) = (default_rounds, rounds_of(&res));
            res.check(
                r > d && r > 1,
                &format!("a 1MiB budget took {r} exchange rounds, the default {d}"),
            );
        }
    }
}

#[test]
fn seed_and_epoch_choose_the_order() {
    let dir = Dir::new("seed");
    let inputs = uneven(&dir, "in", "gnu", 200, 4);
    let shards = 5;
    let check = |out: &str, seed: u64, epoch: u64| {
        let mut exp = Expected::new(dir.path(), &inputs, shards, seed, 2);
        exp.epoch = epoch;
        verify(&exp, &dir.join(out))
    };
    run(&dir, Some(2), &["in"], "a", shards, 1, &[]);
    run(&dir, Some(2), &["in"], "b", shards, 1, &[]);
    run(&dir, Some(2), &["in"], "c", shards, 2, &[]);
    run(&dir, Some(2), &["in"], "d", shards, 1, &["--epoch", "1"]);
    run(
        &dir,
        Some(3),
        &["in"],
        "e",
        shards,
        1,
        &["--prefix", "part"],
    );
    let a = check("a", 1, 0);
    let b = check("b", 1, 0);
    let c = check("c", 2, 0);
    let d = check("d", 1, 1);
    assert_same_output(&dir.join("a"), &dir.join("b"), &[]);
    // --prefix names the files, nothing else.
    let mut exp = Expected::new(dir.path(), &inputs, shards, 1, 3);
    exp.prefix = "part".into();
    let e = verify(&exp, &dir.join("e"));
    assert_eq!(a.order, e.order);
    for i in 0..shards {
        let name = |p: &str| format!("{p}-{i:06}.tar");
        assert_eq!(
            fs::read(dir.join("a").join(name("shard"))).unwrap(),
            fs::read(dir.join("e").join(name("part"))).unwrap(),
            "shard {i} differs with --prefix part"
        );
    }
    // The order itself, against the permutation written again from its specification.
    for (v, seed, epoch) in [(&a, 1, 0), (&c, 2, 0), (&d, 1, 1)] {
        assert_order(&v.order, &v.input_order, seed, epoch);
    }
    assert_eq!(a.order, b.order);
    assert_ne!(a.order, c.order, "seed 2 gives the order of seed 1");
    assert_ne!(a.order, d.order, "epoch 1 gives the order of epoch 0");
    assert_ne!(c.order, d.order, "seed 2 and epoch 1 give the same order");
    // Not merely rotated or reversed: most samples change position.
    let moved = a.order.iter().zip(&c.order).filter(|(x, y)| x != y).count();
    assert!(
        moved > 150,
        "only {moved} of 200 samples moved between seeds"
    );
}

const PY_LIST: &str = r#"
import sys, tarfile
for path in sys.argv[1:]:
    with tarfile.open(path, "r:") as tf:
        n = 0
        for m in tf:
            data = tf.extractfile(m).read()
            assert len(data) == m.size, (path, m.name, len(data), m.size)
            n += 1
            print(m.name)
    print("--", n)
"#;

#[test]
fn gnu_tar_and_python_read_every_shard() {
    let dir = Dir::new("readers");
    let gnu = uneven(&dir, "gnu", "gnu", 90, 21);
    // Another seed: the keys overlap the gnu set's, so both sets share key names; samples stay
    // distinct by content.
    let pax = uneven(&dir, "pax", "pax", 90, 22);
    let inputs: Vec<PathBuf> = gnu.iter().chain(&pax).cloned().collect();
    let shards = 4;
    // The same dataset in two formats: every key twice, on purpose.
    run(
        &dir,
        Some(3),
        &["gnu", "pax"],
        "out",
        shards,
        8,
        &["--on-duplicate", "keep"],
    );
    let v = verify(
        &Expected::new(dir.path(), &inputs, shards, 8, 3),
        &dir.join("out"),
    );
    let files: Vec<PathBuf> = (0..shards)
        .map(|i| dir.join(format!("out/shard-{i:06}.tar")))
        .collect();
    for (i, f) in files.iter().enumerate() {
        let listed = gnu_tar_list(&dir, f);
        assert_eq!(
            listed,
            v.members[i],
            "tar -tf {} lists other members than the verifier found",
            f.display()
        );
    }
    if have_python("reading the output with Python's tarfile") {
        let out = dir
            .program("python3")
            .args(["-c", PY_LIST])
            .args(&files)
            .assert_success();
        let mut expected = Vec::new();
        for m in &v.members {
            expected.extend(m.iter().cloned());
            expected.push(format!("-- {}", m.len()));
        }
        let got: Vec<String> = out.stdout.lines().map(str::to_string).collect();
        assert_eq!(got, expected, "python tarfile lists other members");
    }
}

#[test]
fn input_spec_forms_give_the_same_output() {
    let dir = Dir::new("specs");
    let inputs = dir.generate(
        "data",
        &[
            "--shards",
            "4",
            "--samples",
            "60",
            "--mean-size",
            "700",
            "--skew",
            "1",
            "--seed",
            "5",
        ],
    );
    let names: Vec<String> = inputs
        .iter()
        .map(|p| format!("data/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    dir.create_bytes("list.txt", format!("{}\n", names.join("\n")).as_bytes());
    dir.create_bytes(
        "lists/commented.txt",
        format!(
            "# the same shards, relative to this list\n\n{}\n",
            names
                .iter()
                .map(|n| format!("../{n}"))
                .collect::<Vec<_>>()
                .join("\n")
        )
        .as_bytes(),
    );
    let shards = 3;
    let forms: Vec<(&str, Vec<String>)> = vec![
        ("dir", vec!["data".into()]),
        ("brace", vec!["data/train-{000000..000003}.tar".into()]),
        (
            "alternatives",
            vec![
                "data/train-00000{0,1}.tar".into(),
                "data/train-{000002..000003}.tar".into(),
            ],
        ),
        ("list", vec!["@list.txt".into()]),
        ("list-relative", vec!["@lists/commented.txt".into()]),
        ("files", names.clone()),
        (
            "mixed",
            vec![
                names[0].clone(),
                "data/train-{000001..000002}.tar".into(),
                names[3].clone(),
            ],
        ),
    ];
    for (i, (form, specs)) in forms.iter().enumerate() {
        let specs: Vec<&str> = specs.iter().map(String::as_str).collect();
        let np = [1, 2, 3][i % 3];
        run(&dir, Some(np), &specs, form, shards, 3, &[]);
        verify(
            &Expected::new(dir.path(), &inputs, shards, 3, np),
            &dir.join(form),
        );
        if i > 0 {
            assert_same_output(&dir.join("dir"), &dir.join(form), &["ranks", "inputs"]);
        }
    }

    // The canonical order is the spec's order: listing the shards backwards renumbers every
    // sample, which changes the output.
    let reversed: Vec<&str> = names.iter().rev().map(String::as_str).collect();
    run(&dir, Some(2), &reversed, "reversed", shards, 3, &[]);
    let rev_inputs: Vec<PathBuf> = inputs.iter().rev().cloned().collect();
    let v = verify(
        &Expected::new(dir.path(), &rev_inputs, shards, 3, 2),
        &dir.join("reversed"),
    );
    let v0 = verify(
        &Expected::new(dir.path(), &inputs, shards, 3, 1),
        &dir.join("dir"),
    );
    assert_ne!(v.order, v0.order, "the input order does not matter");
}

#[test]
fn more_ranks_than_input_shards_or_output_shards() {
    let dir = Dir::new("few");
    let inputs = dir.generate(
        "in",
        &[
            "--shards",
            "1",
            "--samples",
            "50",
            "--mean-size",
            "800",
            "--long-names-every",
            "3",
            "--seed",
            "8",
        ],
    );
    // One input shard: ranks other than its reader index nothing. One or two output shards:
    // most ranks write nothing. A trailing slash on --output names the same directory.
    for shards in [1, 2, 5] {
        let reference = format!("ref-{shards}");
        run(&dir, Some(1), &["in"], &reference, shards, 6, &[]);
        for np in [2, 4] {
            let out = format!("out-{shards}-np{np}");
            run(
                &dir,
                Some(np),
                &["in/train-000000.tar"],
                &format!("{out}/"),
                shards,
                6,
                &[],
            );
            verify(
                &Expected::new(dir.path(), &inputs, shards, 6, np),
                &dir.join(&out),
            );
            assert_same_output(&dir.join(&reference), &dir.join(&out), &["ranks", "inputs"]);
        }
    }
}

#[test]
fn checksum_adds_the_md5_of_every_shard() {
    let dir = Dir::new("checksum");
    let inputs = uneven(&dir, "in", "gnu", 60, 3);
    for np in [1, 3] {
        let out = format!("out-np{np}");
        run(&dir, Some(np), &["in"], &out, 4, 1, &["--checksum"]);
        verify(
            &Expected::new(dir.path(), &inputs, 4, 1, np),
            &dir.join(&out),
        );
        let index = index_json(&dir.join(&out));
        for entry in index["shardlist"].as_array().unwrap() {
            let url = entry["url"].as_str().unwrap();
            let res = dir
                .program("md5sum")
                .arg(Path::new(&out).join(url))
                .assert_success();
            let want = res.stdout.split_whitespace().next().unwrap().to_string();
            assert_eq!(entry["md5sum"].as_str(), Some(want.as_str()), "{url}");
        }
    }
    // Without the flag, no md5sum key at all.
    run(&dir, Some(2), &["in"], "plain", 4, 1, &[]);
    let index = fs::read_to_string(dir.join("plain/index.json")).unwrap();
    assert!(!index.contains("md5sum"));
}

/// Exactly what differs between the outputs of one rank and of four: `reshard.ranks` in
/// index.json, and in each saved layout (`.reshard/NAME.reshard-layout`) the shard's modification
/// time, which it records to notice a changed shard (and so the layout's checksum trailer); every
/// other byte of every file is the same.
#[test]
fn np_1_and_np_4_outputs_differ_in_ranks_and_layout_mtimes_only() {
    let dir = Dir::new("np-difference");
    dir.generate("in", &["--shards", "4", "--samples", "90", "--seed", "2"]);
    for (np, out) in [(1, "one"), (4, "four")] {
        run(&dir, Some(np), &["in"], out, 3, 5, &[]);
    }
    let (one, four) = (dir.join("one"), dir.join("four"));
    assert_same_output(&one, &four, &["ranks"]);
    let (a, b) = (index_json(&one), index_json(&four));
    assert_eq!(
        (
            a["reshard"]["ranks"].as_u64(),
            b["reshard"]["ranks"].as_u64()
        ),
        (Some(1), Some(4))
    );
    let names = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(d.join(".reshard"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&one), names(&four));
    for name in names(&one) {
        let shard = name
            .strip_suffix(".reshard-layout")
            .expect("reshard's own name");
        // Each file is its body and the body's checksum trailer, which differs with the mtime.
        let (x, y) = (
            fs::read(one.join(".reshard").join(&name)).unwrap(),
            fs::read(four.join(".reshard").join(&name)).unwrap(),
        );
        let (x, y) = (
            reshard::output::seal::open(&x).unwrap().to_vec(),
            reshard::output::seal::open(&y).unwrap().to_vec(),
        );
        let (at_x, at_y) = (mtime_field(&x, shard), mtime_field(&y, shard));
        assert_eq!(at_x, at_y, "{name}: the mtime field sits at the same place");
        let masked = |v: &[u8]| [&v[..at_x.start], &v[at_x.end..]].concat();
        assert_eq!(
            masked(&x),
            masked(&y),
            "{name}: differs outside the mtime field"
        );
        for (bytes, out) in [(&x, &one), (&y, &four)] {
            let mtime = fs::metadata(out.join(shard)).unwrap().modified().unwrap();
            let ns = mtime
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64;
            assert_eq!(
                bytes[at_x.start + 1..at_x.end],
                ns.to_le_bytes(),
                "{name}: the field is the shard's mtime"
            );
        }
    }
}

/// Where a saved layout (bincode, variable-length integers) holds the shard's modification time:
/// after the format (3), the name (its length, then its bytes) and the size, as a u64 marker
/// (253) and 8 bytes; the object version after it is 0 on a file system.
fn mtime_field(bytes: &[u8], name: &str) -> std::ops::Range<usize> {
    assert_eq!(bytes[0], 3, "format 3");
    assert_eq!(bytes[1] as usize, name.len());
    assert_eq!(&bytes[2..2 + name.len()], name.as_bytes());
    let size_at = 2 + name.len();
    let size_len = match bytes[size_at] {
        0..=250 => 1,
        251 => 3,
        252 => 5,
        253 => 9,
        other => panic!("unexpected size marker {other}"),
    };
    let at = size_at + size_len;
    assert_eq!(bytes[at], 253, "a u64-sized mtime");
    assert_eq!(bytes[at + 9], 0, "no object version on a file system");
    at..at + 9
}
