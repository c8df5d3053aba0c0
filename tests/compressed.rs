//! Compressed input shards (gzip, zstd), told by content: the output is byte-identical to the
//! output of the same shards uncompressed, on any rank count; a damaged stream is a clear error.

use std::fs;
use std::io::Write;
use std::path::Path;

use crate::run::run;
use crate::util::{Dir, FAIL_FAST, NPS};
use crate::verify::assert_same_output;

fn compress(path: &Path, codec: &str) -> Vec<u8> {
    let raw = fs::read(path).unwrap();
    match codec {
        "gz" => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(&raw).unwrap();
            e.finish().unwrap()
        }
        _ => zstd::encode_all(&raw[..], 3).unwrap(),
    }
}

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
