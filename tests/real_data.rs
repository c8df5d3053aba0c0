//! Real WebDataset shards from the webdataset project's test data.

use std::path::PathBuf;

use crate::util::data::webdataset_testdata;
use crate::util::runs::run;
use crate::util::verifier::{
    assert_indexer_agrees, assert_same_output, input_samples, verify, Expected,
};
use crate::util::{index_json, snapshot, Dir};

#[test]
fn real_webdataset_shards() {
    let data = webdataset_testdata();
    let names = ["tendata.tar", "mpdata.tar", "testgz.tar", "compressed.tar"];
    let inputs: Vec<PathBuf> = names.iter().map(|n| data.join(n)).collect();
    let specs: Vec<String> = inputs.iter().map(|p| p.display().to_string()).collect();
    let specs: Vec<&str> = specs.iter().map(String::as_str).collect();

    // What the files hold, by the verifier's own reading.
    let counts: Vec<usize> = inputs
        .iter()
        .map(|p| input_samples(p).samples.len())
        .collect();
    assert_eq!(
        &counts[..3],
        &[100, 100, 1000],
        "sample counts of {names:?}"
    );
    let gz = input_samples(&inputs[2]);
    assert!(
        gz.samples.iter().all(|s| !s.key.contains('.')
            && s.members.len() == 1
            && s.members[0] == format!("{}.txt.gz", s.key)),
        "testgz.tar: a key is not the name up to its first dot"
    );
    let compressed = input_samples(&inputs[3]);
    assert_eq!(compressed.skipped.directories, 1);
    assert!(compressed
        .samples
        .iter()
        .all(|s| s.key.starts_with("compressed/")));

    for p in &inputs {
        assert_indexer_agrees(p);
    }

    let dir = Dir::new("real");
    let before = snapshot(&data);
    let shards = 6;
    for np in [1, 3] {
        let out = format!("out-np{np}");
        // tendata and mpdata both number their samples 000000..000099.
        run(
            &dir,
            Some(np),
            &specs,
            &out,
            shards,
            17,
            &["--on-duplicate", "keep"],
        );
        let v = verify(
            &Expected::new(dir.path(), &inputs, shards, 17, np),
            &dir.join(&out),
        );
        assert_eq!(v.skipped.directories, 1);
        assert_eq!(v.index["reshard"]["skipped"]["directories"], 1);
        assert_eq!(v.order.len(), counts.iter().sum::<usize>());
    }
    assert_same_output(&dir.join("out-np1"), &dir.join("out-np3"), &["ranks"]);

    // The directory as the spec: its shards sorted by name, sample.tgz (gzip, 90 samples)
    // included; the same as naming them in that order.
    let mut sorted: Vec<PathBuf> = inputs.clone();
    sorted.push(data.join("sample.tgz"));
    sorted.sort();
    let sorted: Vec<String> = sorted.iter().map(|p| p.display().to_string()).collect();
    let sorted: Vec<&str> = sorted.iter().map(String::as_str).collect();
    run(
        &dir,
        Some(2),
        &sorted,
        "out-list",
        shards,
        17,
        &["--on-duplicate", "keep"],
    );
    run(
        &dir,
        Some(3),
        &[data.to_str().unwrap()],
        "out-dir",
        shards,
        17,
        &["--on-duplicate", "keep"],
    );
    assert_same_output(&dir.join("out-list"), &dir.join("out-dir"), &["ranks"]);
    let index = index_json(&dir.join("out-dir"));
    assert_eq!(
        index["reshard"]["samples"].as_u64().unwrap() as usize,
        counts.iter().sum::<usize>() + 90
    );
    assert!(snapshot(&data) == before, "the test data changed");
}

#[test]
fn gzip_compressed_real_shard_is_read_by_content() {
    let data = webdataset_testdata();
    let dir = Dir::new("gzip");
    // The same samples as a plain tar, decompressed by the test itself.
    let mut plain = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(std::fs::File::open(data.join("sample.tgz")).unwrap()),
        &mut plain,
    )
    .unwrap();
    let plain_path = dir.create_bytes("plain/sample.tar", &plain);
    run(
        &dir,
        Some(1),
        &[plain_path.to_str().unwrap()],
        "from-plain",
        2,
        1,
        &[],
    );
    for np in [1, 3] {
        let out = format!("out-np{np}");
        let tgz = data.join("sample.tgz");
        run(&dir, Some(np), &[tgz.to_str().unwrap()], &out, 2, 1, &[]);
        // Verbatim samples in the same order as from the plain tar: byte-identical shards.
        assert_same_output(
            &dir.join("from-plain"),
            &dir.join(&out),
            &["inputs", "input_bytes", "ranks"],
        );
    }
}

/// Orders that read a member's content work on the real gzip shard too (labels read while
/// streaming the decompressed tar), the same at any rank count.
#[test]
fn real_labels_order_and_stratify_a_gzip_shard() {
    let data = webdataset_testdata();
    let tgz = data.join("sample.tgz");
    let tgz = tgz.to_str().unwrap();
    let dir = Dir::new("real_labels");
    let labels = |out: &str| -> Vec<Vec<i64>> {
        (0..3)
            .map(|s| {
                let shard = input_samples(&dir.join(format!("{out}/shard-{s:06}.tar")));
                shard
                    .samples
                    .iter()
                    .map(|smp| {
                        // The .cls member is the sample's first: its data follows the header.
                        let bytes = shard.sample_bytes(smp);
                        assert!(smp.members[0].ends_with(".cls"), "{:?}", smp.members);
                        let size = usize::from_str_radix(
                            std::str::from_utf8(&bytes[124..135])
                                .unwrap()
                                .trim_matches('\0'),
                            8,
                        )
                        .unwrap();
                        let text = std::str::from_utf8(&bytes[512..512 + size]).unwrap();
                        text.trim().parse().unwrap()
                    })
                    .collect()
            })
            .collect()
    };
    for np in [1, 3] {
        let out = format!("sorted-{np}");
        run(
            &dir,
            Some(np),
            &[tgz],
            &out,
            3,
            1,
            &["--order", "content:cls:int"],
        );
        let all: Vec<i64> = labels(&out).concat();
        assert_eq!(all.len(), 90);
        assert!(all.windows(2).all(|w| w[0] <= w[1]), "{all:?}");
        let out = format!("strat-{np}");
        run(
            &dir,
            Some(np),
            &[tgz],
            &out,
            3,
            1,
            &["--stratify-by", "cls"],
        );
    }
    assert_same_output(&dir.join("sorted-1"), &dir.join("sorted-3"), &["ranks"]);
    assert_same_output(&dir.join("strat-1"), &dir.join("strat-3"), &["ranks"]);
    let shards = labels("strat-1");
    let all: Vec<i64> = shards.concat();
    for label in all.iter().collect::<std::collections::BTreeSet<_>>() {
        let n = all.iter().filter(|l| *l == label).count() as f64;
        for s in &shards {
            let count = s.iter().filter(|l| *l == label).count() as f64;
            assert!(
                (count - n * s.len() as f64 / 90.0).abs() <= 1.0,
                "label {label}"
            );
        }
    }
}
