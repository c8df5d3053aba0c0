//! Samples as the tests read them back: key, bytes and member contents, by the independent
//! verifier's walk (never reshard's own reader).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::index_json;
use super::verifier::{input_samples, Kind};

/// One sample as the test reads it: key, bytes, and each member's content by extension.
#[derive(Debug, Clone, PartialEq)]
pub struct Got {
    pub key: String,
    pub bytes: Vec<u8>,
    pub members: BTreeMap<String, Vec<u8>>,
}

/// The samples of a tar file, each with its member contents by extension, as the verifier's
/// walk finds them (the stored data of each regular member, extension records skipped).
pub fn samples_of(path: &Path) -> Vec<Got> {
    let shard = input_samples(path);
    let walk = &shard.walk;
    shard
        .samples
        .iter()
        .map(|s| {
            let members = walk
                .records
                .iter()
                .filter(|r| r.kind == Kind::File && r.start >= s.start && r.end <= s.end)
                .map(|r| {
                    let name = String::from_utf8_lossy(&r.path).into_owned();
                    let base = name.rsplit('/').next().unwrap();
                    let ext = base.split_once('.').map_or("", |(_, e)| e).to_string();
                    (ext, walk.bytes[r.data..r.data + r.size].to_vec())
                })
                .collect();
            Got {
                key: s.key.clone(),
                bytes: shard.sample_bytes(s).to_vec(),
                members,
            }
        })
        .collect()
}

/// The input's samples in canonical order.
pub fn input(inputs: &[PathBuf]) -> Vec<Got> {
    inputs.iter().flat_map(|p| samples_of(p)).collect()
}

/// The output's shards in shardlist order, each as its samples.
pub fn output(out: &Path) -> Vec<(String, Vec<Got>)> {
    index_json(out)["shardlist"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let url = e["url"].as_str().unwrap().to_string();
            let got = samples_of(&out.join(&url));
            assert_eq!(got.len() as u64, e["nsamples"].as_u64().unwrap(), "{url}");
            (url, got)
        })
        .collect()
}

/// The samples of every shard, in shard order.
pub fn flat(shards: &[(String, Vec<Got>)]) -> Vec<Got> {
    shards.iter().flat_map(|s| s.1.clone()).collect()
}

/// The keys of an output directory's samples, shard by shard.
pub fn keys_in(out: &Path) -> Vec<String> {
    flat(&output(out)).into_iter().map(|g| g.key).collect()
}

/// The integer class in a sample's `.cls` member.
pub fn cls(g: &Got) -> i64 {
    String::from_utf8_lossy(&g.members["cls"])
        .trim()
        .parse()
        .unwrap()
}

/// Every output sample is an input sample byte for byte, each exactly once.
pub fn assert_same_samples(input: &[Got], output: &[Got]) {
    let mut a: Vec<&Vec<u8>> = input.iter().map(|g| &g.bytes).collect();
    let mut b: Vec<&Vec<u8>> = output.iter().map(|g| &g.bytes).collect();
    a.sort();
    b.sort();
    assert!(
        a == b,
        "the output does not hold exactly the input's samples"
    );
}

/// The worst |count − ideal| over labels and shards, the ideal being the label's share of all
/// samples times the shard's size.
pub fn worst_deviation(shards: &[(String, Vec<Got>)], label_of: &BTreeMap<String, String>) -> f64 {
    let total: usize = shards.iter().map(|s| s.1.len()).sum();
    let mut n: BTreeMap<&str, usize> = BTreeMap::new();
    for s in shards {
        for g in &s.1 {
            *n.entry(&label_of[&g.key]).or_default() += 1;
        }
    }
    let mut worst: f64 = 0.0;
    for s in shards {
        for (&l, &nl) in &n {
            let count = s.1.iter().filter(|g| label_of[&g.key] == l).count();
            let ideal = nl as f64 * s.1.len() as f64 / total as f64;
            worst = worst.max((count as f64 - ideal).abs());
        }
    }
    worst
}

/// Every sample of every input shard: key → its bytes.
pub fn input_by_key(inputs: &[PathBuf]) -> HashMap<String, Vec<u8>> {
    let mut all = HashMap::new();
    for p in inputs {
        let shard = input_samples(p);
        for s in &shard.samples {
            assert!(
                all.insert(s.key.clone(), shard.sample_bytes(s).to_vec())
                    .is_none(),
                "generator keys are unique"
            );
        }
    }
    all
}

/// The samples of each output shard, as (key, bytes).
pub fn output_shards(out: &Path) -> Vec<Vec<(String, Vec<u8>)>> {
    let shards = index_json(out)["shardlist"].as_array().unwrap().len();
    (0..shards)
        .map(|i| {
            let shard = input_samples(&out.join(format!("shard-{i:06}.tar")));
            shard
                .samples
                .iter()
                .map(|s| (s.key.clone(), shard.sample_bytes(s).to_vec()))
                .collect()
        })
        .collect()
}

/// A JSON array of strings (e.g. index.json's `dropped` keys) as strings.
pub fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().to_string())
        .collect()
}
