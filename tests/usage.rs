//! A command line that cannot work exits 2 with one `reshard: error:` line naming the flag, the
//! same way for every subcommand, before MPI starts and before anything is read or written.

use crate::util::Dir;

#[test]
fn every_subcommand_exits_2_for_a_bad_argument() {
    let dir = Dir::new("usage-every-command");
    let cases: [(&[&str], &str); 7] = [
        (
            &[
                "run", "-i", "in", "-o", "out", "--shards", "0", "--seed", "1",
            ],
            "--shards",
        ),
        (
            &["plan", "-i", "in", "--shards", "0", "--seed", "1"],
            "--shards",
        ),
        (&["generate", "-o", "out", "--shards", "0"], "--shards"),
        (&["generate", "-o", "out", "--format", "zip"], "--format"),
        (
            &["generate", "-o", "out", "--shards", "3", "--samples", "2"],
            "at least one sample",
        ),
        (
            &["verify", "-i", "in", "-o", "out", "--shards", "2"],
            "--shards",
        ),
        (&["verify", "-i", "in"], "--output"),
    ];
    for np in [None, Some(2)] {
        for (args, flag) in cases {
            let res = dir.reshard(np).args(args).assert_code(2);
            res.stderr_has("error:");
            res.stderr_has(flag);
            res.check(!dir.join("out").exists(), "an output was created");
        }
    }
}
