//! Golden digests: the output of fixed arguments on a fixed generated dataset is pinned, so that
//! a refactor, a new data path or a new rank count cannot change a byte of it unnoticed.
//!
//! Each case runs at np 1 and np 3; the digest covers every output shard's name and bytes and
//! index.json with its rank count left out. When a change is meant to alter the output, the
//! failure message prints the new digests.

use crate::util::verifier::output_digest;
use crate::util::Dir;

/// (name, arguments after `--input in --output OUT`, digest).
const CASES: &[(&str, &[&str], &str)] = &[
    (
        "shuffle",
        &["--shards", "5", "--seed", "7"],
        "49ff502967f30f745d9251456d1767f1",
    ),
    (
        "gpus-drop",
        &[
            "--gpus",
            "2",
            "--workers",
            "2",
            "--shard-size",
            "20KiB",
            "--equalize",
            "drop",
            "--seed",
            "3",
        ],
        "738981afbf56eb7050dc6181b8495995",
    ),
    (
        "pad",
        &["--shards", "6", "--equalize", "pad", "--seed", "11"],
        "95fd26471c5526105baf038ecd64c71b",
    ),
    (
        "bytes-epoch",
        &[
            "--shards",
            "4",
            "--balance",
            "bytes",
            "--seed",
            "5",
            "--epoch",
            "3",
        ],
        "a4195a304ee50446049d856ef7719346",
    ),
    (
        "stratify",
        &["--shards", "7", "--stratify-by", "cls", "--seed", "9"],
        "aebb9582ad3397c3addec6d76a71f447",
    ),
    (
        "key-order",
        &["--shards", "3", "--order", "key"],
        "ee115a04b891bbefb49e2a638b8945e9",
    ),
];

#[test]
fn outputs_match_their_golden_digests_at_np_1_and_3() {
    let dir = Dir::new("golden");
    dir.generate(
        "in",
        &[
            "--shards",
            "5",
            "--samples",
            "400",
            "--mean-size",
            "1KiB",
            "--sigma",
            "1",
            "--skew",
            "2",
            "--long-names-every",
            "7",
            "--seed",
            "42",
        ],
    );
    let mut wrong = Vec::new();
    for (name, args, want) in CASES {
        for np in [1, 3] {
            let out = format!("{name}-np{np}");
            dir.mpi(np)
                .args(["run", "--input", "in", "--output", &out])
                .args(*args)
                .assert_success();
            let got = output_digest(&dir.join(&out));
            if got != *want {
                wrong.push(format!("{name} at np {np}: {got} (pinned: {want})"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "outputs differ from their golden digests:\n{}",
        wrong.join("\n")
    );
}
