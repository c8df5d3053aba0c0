//! Datasets: the generated inputs of the tests (each named after what it is for), hand-built
//! labelled shards, and webdataset's committed test shards.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use super::tar::tar_of;
use super::verifier::{assert_indexer_agrees, input_samples, longest_path, record_types};
use super::Dir;

/// A small, uneven dataset: skewed shard sizes, lognormal payloads, long names, three members per
/// sample.
pub fn uneven(dir: &Dir, rel: &str, format: &str, samples: u64, seed: u64) -> Vec<PathBuf> {
    let inputs = dir.generate(
        rel,
        &[
            "--shards",
            "6",
            "--samples",
            &samples.to_string(),
            "--mean-size",
            "1KiB",
            "--sigma",
            "1",
            "--skew",
            "3",
            "--long-names-every",
            "5",
            "--format",
            format,
            "--seed",
            &seed.to_string(),
        ],
    );
    assert_eq!(inputs.len(), 6, "generate wrote {inputs:?}");
    inputs
}

/// The generated inputs exercise what the tests claim: uneven shards, long names carried by the
/// format's extension records, several members per sample.
pub fn check_generated(inputs: &[PathBuf], ext: u8) {
    let sizes: Vec<u64> = inputs
        .iter()
        .map(|p| fs::metadata(p).unwrap().len())
        .collect();
    assert!(
        sizes[0] > 3 * sizes[sizes.len() - 1],
        "input shards are not uneven: {sizes:?}"
    );
    assert!(
        longest_path(inputs) > 100,
        "no member path longer than 100 bytes"
    );
    assert!(
        record_types(inputs).contains(&ext),
        "no {:?} extension records in the input",
        ext as char
    );
    for p in inputs {
        assert_indexer_agrees(p);
    }
    let shard = input_samples(&inputs[0]);
    assert!(
        shard.samples.iter().all(|s| s.members.len() == 3),
        "expected three members per generated sample"
    );
}

/// Three small GNU-format shards without long names in `in/`, so that every record is one
/// header block followed by data.
pub fn plain_headers(dir: &Dir) -> Vec<PathBuf> {
    dir.generate(
        "in",
        &[
            "--shards",
            "3",
            "--samples",
            "30",
            "--mean-size",
            "1500",
            "--seed",
            "2",
        ],
    )
}

/// 60 samples of about 2 KiB in 3 shards under `in/`, for the epoch tests.
pub fn small(dir: &Dir) -> Vec<PathBuf> {
    dir.generate(
        "in",
        &[
            "--shards",
            "3",
            "--samples",
            "60",
            "--mean-size",
            "2KiB",
            "--seed",
            "4",
        ],
    )
}

/// 240 samples in 5 uneven shards; the generator's `.cls` members hold class numbers with
/// many repeats (ties).
pub fn with_class_ties(dir: &Dir) -> Vec<PathBuf> {
    dir.generate(
        "in",
        &[
            "--shards",
            "5",
            "--samples",
            "240",
            "--mean-size",
            "1KiB",
            "--skew",
            "2",
            "--seed",
            "4",
        ],
    )
}

/// Six samples in one shard; `cls` gives each one's label (None: no .cls member).
pub fn labelled(dir: &Dir, cls: &[Option<&str>]) {
    let names: Vec<(String, Vec<u8>)> = cls
        .iter()
        .enumerate()
        .flat_map(|(i, c)| {
            let mut m = vec![(format!("s{i:03}.jpg"), vec![b'x'; 100 + i])];
            if let Some(c) = c {
                m.push((format!("s{i:03}.cls"), c.as_bytes().to_vec()));
            }
            m
        })
        .collect();
    let members: Vec<(&str, &[u8])> = names
        .iter()
        .map(|(n, d)| (n.as_str(), d.as_slice()))
        .collect();
    dir.create_bytes("in/a.tar", &tar_of(&members));
}

/// 640 samples over 4 shards with skewed labels: 50%, 25%, 15%, 7%, 3% (rounded).
pub fn skewed_labels(dir: &Dir) -> BTreeMap<String, String> {
    let labels = ["cat", "dog", "emu", "fox", "gnu"];
    let shares = [0.50, 0.75, 0.90, 0.97, 1.0];
    let mut label_of = BTreeMap::new();
    let mut members: Vec<(String, Vec<u8>)> = Vec::new();
    let mut shard = 0;
    for i in 0..640u64 {
        // A fixed pseudo-random draw, so labels are interleaved in the input.
        let u = ((i * 2_654_435_761) % 1000) as f64 / 1000.0;
        let l = labels[shares.iter().position(|&s| u < s).unwrap()];
        let key = format!("k{i:04}");
        members.push((
            format!("{key}.bin"),
            vec![i as u8; 50 + (i as usize * 37) % 400],
        ));
        members.push((format!("{key}.cls"), l.as_bytes().to_vec()));
        label_of.insert(key, l.to_string());
        if i % 160 == 159 {
            let m: Vec<(&str, &[u8])> = members
                .iter()
                .map(|(n, d)| (n.as_str(), d.as_slice()))
                .collect();
            dir.create_bytes(format!("in/part-{shard}.tar"), &tar_of(&m));
            members.clear();
            shard += 1;
        }
    }
    label_of
}

/// webdataset's own test shards, committed under `tests/data/webdataset/` (BSD-3-Clause; see
/// its README.md).
pub fn webdataset_testdata() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/webdataset");
    assert!(
        dir.join("tendata.tar").is_file(),
        "{} is missing from the checkout",
        dir.display()
    );
    dir.canonicalize().unwrap()
}

/// 101 samples (prime: never divides evenly) with very uneven payload sizes.
pub fn prime_count(dir: &Dir) -> Vec<PathBuf> {
    dir.generate(
        "in",
        &[
            "--shards",
            "4",
            "--samples",
            "101",
            "--mean-size",
            "3KiB",
            "--sigma",
            "1.2",
            "--skew",
            "2",
            "--seed",
            "8",
        ],
    )
}

/// Generates an uneven dataset of about `size` in `rel` and returns its shards.
pub fn sized(dir: &Dir, rel: &str, size: &str, mean: &str, shards: usize) -> Vec<PathBuf> {
    dir.generate(
        rel,
        &[
            "--shards",
            &shards.to_string(),
            "--total-size",
            size,
            "--mean-size",
            mean,
            "--skew",
            "2",
            "--long-names-every",
            "7",
            "--seed",
            "8",
        ],
    )
}
