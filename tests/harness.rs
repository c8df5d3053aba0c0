//! The harness tests itself: the verifier must reject damaged outputs, and a hanging command
//! must be killed and fail the test.

use std::fs;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::Duration;

use crate::util::runs::{assert_verifier_rejects, good_output_to_damage};
use crate::util::tar::{edit_bytes, fix_checksum};
use crate::util::verifier::walk;
use crate::util::Dir;

#[test]
fn verifier_rejects_damaged_outputs() {
    let dir = Dir::new("verifier");
    let (_, exp) = good_output_to_damage(&dir);
    let shard0 = |d: &Path| d.join("shard-000000.tar");
    let records = walk(fs::read(dir.join("good/shard-000000.tar")).unwrap())
        .unwrap()
        .records;
    // The first record of shard 0 that is a plain header (no extension records in front).
    let plain = records.iter().find(|r| r.types == b"0").unwrap().clone();

    assert_verifier_rejects(
        &dir,
        &exp,
        "payload",
        "not a sequence of input samples",
        |d| edit_bytes(&shard0(d), |b| b[plain.start + 512] ^= 1),
    );
    assert_verifier_rejects(
        &dir,
        &exp,
        "mtime",
        "not a sequence of input samples",
        |d| {
            edit_bytes(&shard0(d), |b| {
                let h = &mut b[plain.start..plain.start + 512];
                h[136..147].copy_from_slice(b"00000000001");
                fix_checksum(h);
            })
        },
    );
    assert_verifier_rejects(&dir, &exp, "checksum", "checksum", |d| {
        edit_bytes(&shard0(d), |b| b[plain.start + 136] ^= 1)
    });
    assert_verifier_rejects(&dir, &exp, "swapped-members", "not a sequence", |d| {
        // The first two records of the first sample, in the other order.
        edit_bytes(&shard0(d), |b| {
            let (a, m, z) = (records[0].start, records[0].end, records[1].end);
            let mut swapped = b[m..z].to_vec();
            swapped.extend_from_slice(&b[a..m]);
            b[a..z].copy_from_slice(&swapped);
        })
    });
    assert_verifier_rejects(&dir, &exp, "extra-zero-block", "two zero blocks", |d| {
        edit_bytes(&shard0(d), |b| b.extend_from_slice(&[0; 512]))
    });
    assert_verifier_rejects(&dir, &exp, "no-end-blocks", "two zero blocks", |d| {
        edit_bytes(&shard0(d), |b| b.truncate(b.len() - 1024))
    });
    assert_verifier_rejects(&dir, &exp, "dropped-sample", "missing", |d| {
        // Move shard 0's first sample (three records) to shard 1: shard 0 no longer holds it, and
        // shard 1 holds it twice...
        let mut moved = Vec::new();
        edit_bytes(&shard0(d), |b| {
            let end = records[2].end;
            moved = b[..end].to_vec();
            b.drain(..end);
        });
        // ...unless it replaces shard 1's own first sample, which is then missing.
        let s1 = d.join("shard-000001.tar");
        let r1 = walk(fs::read(&s1).unwrap()).unwrap().records;
        edit_bytes(&s1, |b| {
            b.splice(..r1[2].end, moved);
        });
    });
    assert_verifier_rejects(&dir, &exp, "nsamples", "nsamples", |d| {
        edit_bytes(&d.join("index.json"), |b| {
            let text = String::from_utf8(b.clone()).unwrap();
            let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
            let n = v["shardlist"][1]["nsamples"].as_u64().unwrap();
            v["shardlist"][1]["nsamples"] = (n + 1).into();
            *b = serde_json::to_vec(&v).unwrap();
        })
    });
    assert_verifier_rejects(&dir, &exp, "extra-file", "expected files", |d| {
        fs::write(d.join("stray.txt"), b"x").unwrap();
    });
}

#[test]
fn a_hanging_command_is_killed_and_fails() {
    let dir = Dir::new("hang");
    let result = catch_unwind(AssertUnwindSafe(|| {
        dir.program("sh")
            .args(["-c", "sleep 60 & sleep 60"])
            .timeout(Duration::from_secs(1))
            .output()
    }));
    let panic = result.expect_err("a command past its timeout must fail the test");
    let msg = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("timed out"), "{msg}");
}
