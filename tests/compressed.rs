//! Compressed input shards (gzip, zstd), told by content: the output is byte-identical to the
//! output of the same shards uncompressed, on any rank count; a damaged stream is a clear error.

use std::fs;

use crate::util::corpus::md5_hex;
use crate::util::runs::run;
use crate::util::tar::{compress, decompress};
use crate::util::verifier::{assert_same_output, verify, Expected};
use crate::util::{index_json, tar_files, Dir, FAIL_FAST, NPS};

#[test]
fn gzip_and_zstd_inputs_give_the_same_shards_as_plain_ones() {
    let dir = Dir::new("compressed");
    let plain = dir.generate(
        "plain",
        &[
            "--shards",
            "4",
            "--samples",
            "80",
            "--mean-size",
            "3KiB",
            "--long-names-every",
            "7",
            "--seed",
            "6",
        ],
    );
    let mixed = dir.create_dir("mixed");
    for (i, p) in plain.iter().enumerate() {
        // Names that lie about the content: the codec must come from the bytes.
        let (bytes, name) = match i % 3 {
            0 => (compress(p, "gz"), format!("part-{i}.tar.gz")),
            1 => (compress(p, "zst"), format!("part-{i}.tar")),
            _ => (fs::read(p).unwrap(), format!("part-{i}.tar")),
        };
        fs::write(mixed.join(name), bytes).unwrap();
    }
    run(&dir, Some(2), &["plain"], "from-plain", 5, 2, &[]);
    for np in NPS {
        let out = format!("from-mixed-np{np}");
        let res = run(
            &dir,
            Some(np),
            &["mixed"],
            &out,
            5,
            2,
            &["--mem-limit", "1MiB"],
        );
        res.check(res.elapsed < FAIL_FAST, "slow");
        assert_same_output(
            &dir.join("from-plain"),
            &dir.join(&out),
            &["inputs", "input_bytes", "ranks"],
        );
    }
}

#[test]
fn a_truncated_compressed_shard_is_a_clear_error() {
    let dir = Dir::new("compressed-bad");
    let plain = dir.generate(
        "in",
        &[
            "--shards",
            "2",
            "--samples",
            "20",
            "--mean-size",
            "4KiB",
            "--seed",
            "6",
        ],
    );
    let gz = compress(&plain[1], "gz");
    fs::remove_file(&plain[1]).unwrap();
    fs::write(dir.join("in/train-000001.tar.gz"), &gz[..gz.len() / 2]).unwrap();
    for np in [1, 2] {
        let mut cmd = dir.mpi(np);
        cmd.args([
            "run", "--input", "in", "--output", "out", "--shards", "2", "--seed", "1",
        ]);
        let res = cmd.assert_code(1);
        res.stderr_has("train-000001.tar.gz");
        res.stderr_has("Gzip-compressed");
        res.check(!dir.join("out").exists(), "nothing may be published");
    }
}

#[test]
fn compressed_outputs_hold_the_plain_shards_and_feed_the_next_epoch() {
    let dir = Dir::new("compress-out");
    dir.generate(
        "in",
        &[
            "--shards",
            "3",
            "--samples",
            "50",
            "--mean-size",
            "3KiB",
            "--seed",
            "9",
        ],
    );
    run(&dir, Some(2), &["in"], "plain", 4, 5, &[]);
    run(&dir, Some(2), &["plain"], "plain-next", 4, 6, &[]);
    verify(
        &Expected::new(dir.path(), &tar_files(&dir.join("plain")), 4, 6, 2),
        &dir.join("plain-next"),
    );
    for (codec, ext) in [("gz", "tar.gz"), ("zst", "tar.zst")] {
        for np in [1, 3] {
            let out = dir.join(format!("{codec}-np{np}"));
            run(
                &dir,
                Some(np),
                &["in"],
                out.to_str().unwrap(),
                4,
                5,
                &["--compress", codec, "--checksum"],
            );
            let index = index_json(&out);
            for (i, entry) in index["shardlist"].as_array().unwrap().iter().enumerate() {
                let name = format!("shard-{i:06}.{ext}");
                assert_eq!(entry["url"], name.as_str());
                let path = out.join(&name);
                assert_eq!(
                    entry["filesize"].as_u64().unwrap(),
                    fs::metadata(&path).unwrap().len()
                );
                // --checksum: the MD5 of the compressed file as stored, which wids checks.
                assert_eq!(
                    entry["md5sum"].as_str(),
                    Some(md5_hex(&fs::read(&path).unwrap()).as_str()),
                    "{name}: md5sum"
                );
                let plain = fs::read(dir.join(format!("plain/shard-{i:06}.tar"))).unwrap();
                assert!(
                    decompress(&path) == plain,
                    "{name}: not the plain shard's bytes"
                );
            }
            assert!(
                !out.join("shard-000000.tar").exists(),
                "the plain shard must be gone"
            );
            // reshard verify reads compressed outputs.
            let mut v = dir.mpi(np);
            v.args(["verify", "--input", "in", "--output", out.to_str().unwrap()]);
            v.assert_success();
        }
        // The next epoch reads the compressed output through its saved index.
        let prev = format!("{codec}-np1");
        let res = run(
            &dir,
            Some(2),
            &[prev.as_str()],
            &format!("{codec}-next"),
            4,
            6,
            &[],
        );
        res.stderr_has("reused the saved index of 4 of 4 input shards");
        // What the saved index cut out must be the samples themselves: the same epoch from the
        // plain shards (checked sample by sample by the verifier) has the same bytes.
        assert_same_output(
            &dir.join("plain-next"),
            &dir.join(format!("{codec}-next")),
            &["inputs", "input_bytes", "ranks"],
        );
    }
}
