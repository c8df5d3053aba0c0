//! What a user meets on `s3://` beyond the bytes (issue 38): `--keep` over a series whose
//! shards are multipart-sized, and one line that says what is wrong and what to set when the
//! credentials or the endpoint are.

use crate::util::s3::server;
use crate::util::Dir;

/// `--keep 1` over three epochs of an `s3://` series whose shards (about 20 MiB) go up as
/// multipart uploads: each run removes the epoch before it (an emptied `.reshard-multipart/`
/// folder, which SeaweedFS keeps, is no object to remove), and a run finishes the removal an
/// earlier version left half-done (its marker there, its `index.json` gone).
#[test]
fn s3_keep_removes_older_epochs_of_multipart_sized_shards() {
    let test = "s3_keep_removes_older_epochs_of_multipart_sized_shards";
    let Some(s3) = server(test) else {
        return;
    };
    let dir = Dir::new("s3-keep-large");
    dir.generate(
        "in",
        &[
            "--shards",
            "2",
            "--samples",
            "30",
            "--mean-size",
            "2MiB",
            "--seed",
            "3",
        ],
    );
    let bucket = s3.bucket(&dir, test);
    let epoch = |e: u64| {
        let mut cmd = dir.mpi(2);
        cmd.args(["run", "--input", "in", "--output"])
            .arg(format!("s3://{bucket}/out/epoch-{{epoch}}"))
            .args(["--shards", "3", "--seed", "9", "--keep", "1", "--scratch"])
            .arg(dir.join("scratch"))
            .args(["--epoch", &e.to_string()]);
        s3.with_env(&mut cmd).assert_success()
    };
    let tars = |e: u64| -> Vec<String> {
        let keys = s3.keys(&dir, &bucket, &format!("out/epoch-{e}/"));
        keys.into_iter().filter(|k| k.ends_with(".tar")).collect()
    };
    epoch(0);
    assert_eq!(tars(0).len(), 3);
    for e in 1..=2 {
        let out = epoch(e);
        out.stderr_has(&format!(
            "--keep 1: removing the older output s3://{bucket}/out/epoch-{}",
            e - 1
        ));
        assert_eq!(
            s3.keys(&dir, &bucket, &format!("out/epoch-{}/", e - 1)),
            Vec::<String>::new()
        );
        assert_eq!(tars(e).len(), 3);
    }
    // What an earlier version left when its removal of epoch 2 failed: the marker, no
    // index.json, the shards and an emptied journal folder.
    s3.put_bytes(&dir, &bucket, "out/epoch-2/.reshard-removing", b"");
    s3.put_bytes(&dir, &bucket, "out/epoch-2/.reshard-multipart/x", b"1");
    s3.remove(&dir, &bucket, "out/epoch-2/.reshard-multipart/x");
    s3.remove(&dir, &bucket, "out/epoch-2/index.json");
    let out = epoch(3);
    out.stderr_has(&format!(
        "--keep: finishing the removal of s3://{bucket}/out/epoch-2 (an earlier run began it)"
    ));
    assert_eq!(s3.keys(&dir, &bucket, "out/epoch-2/"), Vec::<String>::new());
    assert_eq!(tars(3).len(), 3);
}
