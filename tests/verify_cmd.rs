//! `reshard verify` and `run --verify`: a real run passes under every rank count with a
//! shuffle-like Spearman correlation; each kind of damage to the output fails with exit 1 and a
//! message naming the problem and the file.

use std::fs;

use crate::util::runs::{assert_fails, good_output_for_verify, report_json, run, verify_cmd};
use crate::util::verifier::{input_samples, walk_file};
use crate::util::{damaged, edit_index, tar_files, Dir, NPS};

#[test]
fn verify_passes_on_a_real_run_under_every_rank_count() {
    let dir = Dir::new("verify-ok");
    good_output_for_verify(&dir);
    for np in NPS.iter().copied().map(Some).chain([None]) {
        let got = verify_cmd(&dir, np, "good", &[]);
        if got.code() != Some(0) {
            got.fail("expected verify to pass on a good output");
        }
        got.check(
            got.stdout.contains("reshard verify: OK")
                && got
                    .stdout
                    .contains("0 missing, 0 not in the input, 0 duplicated"),
            "expected an OK report",
        );
        let json = report_json(&verify_cmd(&dir, np, "good", &["--json"]));
        assert_eq!(json["ok"], true, "{json:#}");
        assert_eq!(json["input_samples"], 240);
        assert_eq!(json["output_samples"], 240);
        assert_eq!(json["shuffle"]["pairs"], 240);
        let rho = json["shuffle"]["spearman"].as_f64().unwrap();
        let bound = json["shuffle"]["random_bound"].as_f64().unwrap();
        // 3 / sqrt(239) ≈ 0.19: a shuffled order correlates no more than chance.
        assert!(rho.abs() < bound, "spearman {rho} (bound {bound})");
        let per_shard = &json["shuffle"]["input_shards_per_output_shard"];
        assert!(
            per_shard["min"].as_u64().unwrap() >= 4 && per_shard["max"].as_u64().unwrap() <= 6,
            "{per_shard}"
        );
    }
}

#[test]
fn an_unshuffled_copy_has_spearman_one() {
    // The input itself, listed by a plain wids index (no reshard section), is a valid "output"
    // in the input's own order.
    let dir = Dir::new("verify-identity");
    let inputs = dir.generate("in", &["--shards", "3", "--samples", "50", "--seed", "2"]);
    let out = dir.create_dir("copy");
    let mut shardlist = Vec::new();
    for p in &inputs {
        let name = p.file_name().unwrap().to_str().unwrap();
        fs::copy(p, out.join(name)).unwrap();
        shardlist.push(serde_json::json!({
            "url": name,
            "nsamples": input_samples(p).samples.len(),
            "filesize": fs::metadata(p).unwrap().len(),
        }));
    }
    let index = serde_json::json!({
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "shardlist": shardlist,
    });
    fs::write(out.join("index.json"), index.to_string()).unwrap();
    let got = verify_cmd(&dir, Some(2), "copy", &["--json"]);
    let json = report_json(&got);
    got.check(json["ok"] == true, "expected verify to pass");
    let rho = json["shuffle"]["spearman"].as_f64().unwrap();
    assert!((rho - 1.0).abs() < 1e-9, "spearman {rho}");
    assert_eq!(json["shuffle"]["input_shards_per_output_shard"]["max"], 1);
}

#[test]
fn verify_fails_on_a_flipped_payload_byte() {
    let dir = Dir::new("verify-flip");
    good_output_for_verify(&dir);
    damaged(&dir, "good", "flip", |out| {
        let shard = out.join("shard-000002.tar");
        let walk = walk_file(&shard);
        // A plain member (one header block): its data starts one block after the record.
        let r = walk
            .records
            .iter()
            .find(|r| r.types == b"0" && r.end - r.start > 1024)
            .expect("a member with data");
        let mut bytes = walk.bytes.clone();
        bytes[r.start + 512 + 3] ^= 0x20;
        fs::write(&shard, bytes).unwrap();
    });
    assert_fails(
        &dir,
        "flip",
        &[
            "1 input sample is missing from the output",
            "1 output sample is not in the input",
            "shard-000002.tar at byte offset",
        ],
    );
}

#[test]
fn verify_fails_on_a_missing_shard() {
    let dir = Dir::new("verify-missing");
    good_output_for_verify(&dir);
    damaged(&dir, "good", "missing", |out| {
        fs::remove_file(out.join("shard-000004.tar")).unwrap();
    });
    assert_fails(
        &dir,
        "missing",
        &[
            "shard-000004.tar: listed in index.json but missing",
            "input samples are missing from the output",
        ],
    );
}

#[test]
fn verify_fails_on_a_truncated_shard() {
    let dir = Dir::new("verify-truncated");
    good_output_for_verify(&dir);
    damaged(&dir, "good", "cut", |out| {
        let shard = out.join("shard-000001.tar");
        let len = fs::metadata(&shard).unwrap().len();
        let f = fs::OpenOptions::new().write(true).open(&shard).unwrap();
        f.set_len(len / 2 + 100).unwrap();
    });
    assert_fails(
        &dir,
        "cut",
        &[
            "shard-000001.tar: index.json says filesize",
            "shard-000001.tar: byte offset",
            "input samples are missing from the output",
        ],
    );
    // Cut exactly after a sample: a tar reader sees no error, only no end-of-archive marker.
    damaged(&dir, "good", "cut-clean", |out| {
        let shard = out.join("shard-000001.tar");
        let samples = input_samples(&shard).samples;
        let f = fs::OpenOptions::new().write(true).open(&shard).unwrap();
        f.set_len(samples[samples.len() - 2].end as u64).unwrap();
    });
    assert_fails(&dir, "cut-clean", &["no end-of-archive marker"]);
}

#[test]
fn verify_fails_on_a_wrong_sample_count_in_the_index() {
    let dir = Dir::new("verify-nsamples");
    good_output_for_verify(&dir);
    damaged(&dir, "good", "count", |out| {
        edit_index(out, |v| {
            let n = v["shardlist"][3]["nsamples"].as_u64().unwrap();
            v["shardlist"][3]["nsamples"] = (n + 1).into();
        });
    });
    assert_fails(
        &dir,
        "count",
        &[
            "shard-000003.tar: index.json says nsamples",
            "output_samples",
        ],
    );
}

#[test]
fn verify_fails_on_a_duplicated_sample() {
    let dir = Dir::new("verify-dup");
    good_output_for_verify(&dir);
    let key = damaged(&dir, "good", "dup", |out| {
        // Another shard's sample, inserted before shard 0's end-of-archive blocks, with
        // index.json made to agree: only the sample multiset can tell.
        let donor = input_samples(&out.join("shard-000005.tar"));
        let sample = &donor.samples[1];
        let copy = donor.sample_bytes(sample).to_vec();
        let target = out.join("shard-000000.tar");
        let mut bytes = fs::read(&target).unwrap();
        let end = bytes.len() - 1024;
        bytes.splice(end..end, copy.iter().copied());
        fs::write(&target, &bytes).unwrap();
        edit_index(out, |v| {
            let e = &mut v["shardlist"][0];
            e["nsamples"] = (e["nsamples"].as_u64().unwrap() + 1).into();
            e["filesize"] = (bytes.len() as u64).into();
            let r = &mut v["reshard"];
            r["output_samples"] = (r["output_samples"].as_u64().unwrap() + 1).into();
        });
        sample.key.clone()
    });
    assert_fails(
        &dir,
        "dup",
        &[
            "1 duplicated sample in the output",
            &format!("sample {key:?} is in the output 2 times but in the input 1 time"),
        ],
    );
}

#[test]
fn verify_fails_on_data_after_the_end_and_on_unlisted_shards() {
    let dir = Dir::new("verify-extra");
    good_output_for_verify(&dir);
    damaged(&dir, "good", "extra", |out| {
        let shard = out.join("shard-000006.tar");
        let mut bytes = fs::read(&shard).unwrap();
        bytes.extend_from_slice(&[7u8; 512]);
        fs::write(&shard, bytes).unwrap();
        fs::copy(out.join("shard-000000.tar"), out.join("shard-000007.tar")).unwrap();
    });
    assert_fails(
        &dir,
        "extra",
        &[
            "shard-000006.tar: byte offset",
            "data after the end-of-archive marker",
            "shard-000007.tar: a shard file that index.json does not list",
        ],
    );
}

#[test]
fn verify_fails_against_another_input() {
    let dir = Dir::new("verify-other");
    good_output_for_verify(&dir);
    dir.generate(
        "other",
        &["--shards", "2", "--samples", "20", "--seed", "9"],
    );
    let got = dir
        .mpi(2)
        .args(["verify", "--input", "other", "--output", "good"])
        .assert_code(1);
    got.check(
        got.stdout.contains("not in the input")
            && got
                .stdout
                .contains("index.json says the input held 240 samples"),
        "expected the report to say the samples are not from this input",
    );
}

#[test]
fn equalized_outputs_verify() {
    let dir = Dir::new("verify-equalize");
    good_output_for_verify(&dir);
    for mode in ["drop", "pad"] {
        let out = format!("eq-{mode}");
        let res = run(&dir, Some(3), &["in"], &out, 7, 4, &["--equalize", mode]);
        // The headline counts what was written: 7 * 34 dropping, 7 * 35 padding.
        let (written, why) = if mode == "drop" {
            (238, "--equalize drop: 2 input samples left out")
        } else {
            (245, "--equalize pad: 5 samples written twice")
        };
        res.check(
            res.stdout
                .contains(&format!("reshard: wrote 7 shards ({written} samples,"))
                && res.stdout.contains(why),
            "the summary's headline states the samples written",
        );
        let json = report_json(&verify_cmd(&dir, Some(2), &out, &["--json"]));
        assert_eq!(json["ok"], true, "{json:#}");
        // 240 = 7 * 34 + 2: drop leaves out 2, pad repeats 5.
        let (field, n) = if mode == "drop" {
            ("left_out", 2)
        } else {
            ("repeated", 5)
        };
        assert_eq!(json["mismatches"][field], n, "{json:#}");
    }
    // A padded output whose index lists other repeated keys is caught.
    damaged(&dir, "eq-pad", "pad-wrong", |out| {
        edit_index(out, |v| {
            v["reshard"]["repeated"][0] = "no/such-key".into();
        });
    });
    assert_fails(
        &dir,
        "pad-wrong",
        &["the repeated samples are not the ones"],
    );
}

#[test]
fn run_with_verify_checks_what_it_published() {
    let dir = Dir::new("run-verify");
    dir.generate("in", &["--shards", "3", "--samples", "60", "--seed", "3"]);
    for np in [1, 3] {
        let out = format!("out-{np}");
        let got = run(&dir, Some(np), &["in"], &out, 4, 1, &["--verify"]);
        got.check(
            got.stdout.contains("reshard: wrote 4 shards")
                && got.stdout.contains("reshard verify: OK"),
            "expected the run summary and an OK verify report",
        );
    }
    let got = dir
        .command()
        .args(["run", "--input", "in", "--shards", "2", "--seed", "1"])
        .args(["--dry-run", "--verify"])
        .assert_code(2);
    got.stderr_has("--verify");
}

#[test]
fn gzip_compressed_inputs_and_outputs_verify() {
    // Samples are byte ranges of the decompressed stream: compressing either side keeps them.
    let dir = Dir::new("verify-gzip");
    good_output_for_verify(&dir);
    damaged(&dir, "in", "in-gz", |d| {
        dir.program("gzip")
            .arg("-n")
            .args(tar_files(d))
            .assert_success();
    });
    damaged(&dir, "good", "good-gz", |d| {
        dir.program("gzip")
            .arg("-n")
            .args(tar_files(d))
            .assert_success();
        edit_index(d, |v| {
            for e in v["shardlist"].as_array_mut().unwrap() {
                let url = format!("{}.gz", e["url"].as_str().unwrap());
                e["filesize"] = fs::metadata(d.join(&url)).unwrap().len().into();
                e["url"] = url.into();
            }
        });
    });
    let gz_inputs = "in-gz/train-{000000..000005}.tar.gz";
    for (input, output) in [
        (gz_inputs, "good"),
        ("in", "good-gz"),
        (gz_inputs, "good-gz"),
    ] {
        let got = dir
            .mpi(2)
            .args(["verify", "--input", input, "--output", output])
            .assert_success();
        got.check(
            got.stdout.contains("reshard verify: OK"),
            "expected an OK report",
        );
    }
    // A damaged compressed shard fails, named.
    damaged(&dir, "good-gz", "bad-gz", |d| {
        let shard = d.join("shard-000003.tar.gz");
        let mut bytes = fs::read(&shard).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xFF;
        fs::write(&shard, bytes).unwrap();
    });
    let got = dir
        .mpi(2)
        .args(["verify", "--input", "in", "--output", "bad-gz"])
        .assert_code(1);
    got.check(
        got.stdout.contains("shard-000003.tar.gz"),
        "expected the report to name the damaged shard",
    );
}

/// `verify` checks the seeded order, not only the multiset: two samples swapped inside a shard
/// (every byte of the output still the input's) fail, naming the shard and the positions, at
/// one rank and three. Where verify cannot recompute the order (`--order key`, `--split`), it
/// says so in its report rather than pass silently.
#[test]
fn verify_checks_the_seeded_order_or_says_it_cannot() {
    let dir = Dir::new("verify-order");
    good_output_for_verify(&dir);
    for np in [Some(1), Some(3)] {
        let got = verify_cmd(&dir, np, "good", &[]);
        got.check(got.code() == Some(0), "a good output must pass");
        got.check(
            got.stdout
                .contains("order:    checked: every sample at the position the shuffle of seed 11, epoch 0 gives it"),
            "the order must be checked",
        );
    }
    crate::util::copy_dir(&dir.join("good"), &dir.join("swapped"));
    let shard = tar_files(&dir.join("swapped"))[2].clone();
    let samples = input_samples(&shard).samples;
    let (a, b) = (&samples[3], &samples[4]);
    let mut bytes = fs::read(&shard).unwrap();
    let swapped = [&bytes[b.start..b.end], &bytes[a.start..a.end]].concat();
    bytes[a.start..b.end].copy_from_slice(&swapped);
    fs::write(&shard, &bytes).unwrap();
    assert_fails(
        &dir,
        "swapped",
        &[
            "2 output samples are not at the position the seeded order gives them",
            &format!(
                "swapped/{} at byte offset {}",
                shard.file_name().unwrap().to_str().unwrap(),
                a.start
            ),
            "but the seeded order puts it at output position",
        ],
    );
    for (out, args, why) in [
        (
            "by-key",
            &["--order", "key"][..],
            "not checked: --order key",
        ),
        (
            "split",
            &["--split", "a=0.5,b=rest"][..],
            "not checked: --split",
        ),
    ] {
        run(&dir, Some(2), &["in"], out, 4, 11, args);
        let got = verify_cmd(&dir, Some(2), out, &[]);
        got.check(got.code() == Some(0), "a good output must pass");
        got.check(
            got.stdout.contains(&format!("order:    {why}")),
            "verify must say it did not check the order",
        );
    }
}
