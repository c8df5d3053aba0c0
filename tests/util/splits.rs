//! `--split` outputs as the tests read them: each split's samples through its own index.json,
//! and the byte surgery that puts a sample into two splits.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use super::index_json;
use super::samples::{flat, output, Got};

/// Every split of a split output, by the names its index.json gives, in that order: the split's
/// samples in shard order, read through the split's own index.json.
pub fn splits_of(out: &Path) -> Vec<(String, Vec<Got>)> {
    let splits = index_json(out)["reshard"]["splits"].clone();
    splits
        .as_array()
        .unwrap_or_else(|| panic!("{}: no reshard.splits", out.display()))
        .iter()
        .map(|s| {
            let name = s["split"].as_str().unwrap().to_string();
            let dir = out.join(&name);
            for e in index_json(&dir)["shardlist"].as_array().unwrap() {
                let url = e["url"].as_str().unwrap();
                assert!(!url.contains('/'), "{url}: not relative to the split");
            }
            (name, flat(&output(&dir)))
        })
        .collect()
}

/// The keys of each split, as sets.
pub fn key_sets(splits: &[(String, Vec<Got>)]) -> BTreeMap<String, BTreeSet<String>> {
    splits
        .iter()
        .map(|(name, got)| (name.clone(), got.iter().map(|g| g.key.clone()).collect()))
        .collect()
}

/// Appends `sample` to the end of the shard `url` of the output `out` (before its two zero
/// blocks), and fixes the sizes and counts in index.json and in the split's own index.json, so
/// that only the sample itself is wrong.
pub fn append_sample(out: &Path, split: &str, shard: &str, sample: &[u8]) {
    let path = out.join(split).join(shard);
    let mut bytes = fs::read(&path).unwrap();
    let trailer = bytes.split_off(bytes.len() - 1024);
    assert!(trailer.iter().all(|&b| b == 0));
    bytes.extend_from_slice(sample);
    bytes.extend_from_slice(&trailer);
    fs::write(&path, &bytes).unwrap();
    let size = bytes.len() as u64;
    let fix = |index: &Path, url: &str| {
        let mut v = index_json(index);
        for e in v["shardlist"].as_array_mut().unwrap() {
            if e["url"] == url {
                e["filesize"] = size.into();
                e["nsamples"] = (e["nsamples"].as_u64().unwrap() + 1).into();
            }
        }
        let listed: u64 = v["shardlist"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["nsamples"].as_u64().unwrap())
            .sum();
        v["reshard"]["output_samples"] = listed.into();
        fs::write(
            index.join("index.json"),
            serde_json::to_vec_pretty(&v).unwrap(),
        )
        .unwrap();
    };
    fix(out, &format!("{split}/{shard}"));
    fix(&out.join(split), shard);
}

/// Runs `reshard run ARGS` under `mpirun -np NP` with every rank under `strace`, which logs the
/// files each rank creates: the writer of every output shard, seen from outside the binary.
/// Returns the run and each shard's writer, by its path relative to the output directory.
/// `None` when strace is not installed (reported as a skip).
pub fn writers_seen_by_strace(
    dir: &super::Dir,
    np: usize,
    out: &str,
    args: &[&str],
) -> Option<(super::RunOutput, BTreeMap<String, usize>)> {
    let test = "writers seen by strace";
    let Some(strace) = super::find_on_path("strace") else {
        super::skip(test, "strace not found on PATH");
        return None;
    };
    let trace = dir.join(format!("trace-{np}"));
    // Hydra numbers the ranks in PMI_RANK; one trace file per rank.
    let script = "exec \"$0\" -f -qq -e trace=openat -o \"$1.$PMI_RANK\" \"$2\" run \"${@:3}\"";
    let run = dir
        .program(super::mpirun())
        .args(["-np", &np.to_string(), "bash", "-c", script])
        .arg(strace)
        .arg(&trace)
        .arg(super::reshard_exe())
        .args(["--output", out])
        .args(args)
        .assert_success();
    // The run's staging directory, `.OUT.reshard-tmp.TOKEN`.
    let staging = format!("/.{out}.reshard-tmp.");
    let mut writers = BTreeMap::new();
    for rank in 0..np {
        let path = format!("{}.{rank}", trace.display());
        let log = fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
        for line in log.lines().filter(|l| l.contains("O_CREAT|O_EXCL")) {
            let Some(name) = line.split('"').nth(1) else {
                continue;
            };
            let rel = name
                .split_once(&staging)
                .and_then(|(_, r)| r.split_once('/'));
            if let Some((_, rel)) = rel {
                if rel.ends_with(".tar") && !rel.contains("/.") {
                    let before = writers.insert(rel.to_string(), rank);
                    assert!(before.is_none(), "{rel} created by two ranks");
                }
            }
        }
    }
    Some((run, writers))
}
