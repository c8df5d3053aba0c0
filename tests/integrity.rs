//! What reshard writes and later believes is checked when it is read back (issue 36): single
//! byte edits of the saved layout of a reshard output used as input. Each run either exits 0
//! with an output the verifier accepts against the input, or is refused naming the shard.

use std::fs;
use std::path::{Path, PathBuf};

use crate::util::runs::good_output_to_damage;
use crate::util::verifier::{verify, Expected};
use crate::util::{tar_files, Dir, RunOutput};

/// A small seeded generator (xorshift64*), so that the edits are the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The saved layouts of the output `good`, by shard.
fn layouts(good: &Path) -> Vec<(PathBuf, PathBuf)> {
    tar_files(good)
        .into_iter()
        .map(|shard| {
            let name = shard.file_name().unwrap().to_str().unwrap().to_string();
            let layout = good.join(".reshard").join(format!("{name}.reshard-layout"));
            assert!(layout.is_file(), "{}", layout.display());
            (shard, layout)
        })
        .collect()
}

/// Runs reshard on `good` (its layouts read back) into `out` at `np` ranks.
fn reshuffle(dir: &Dir, np: usize, out: &str) -> RunOutput {
    let mut cmd = dir.mpi(np);
    cmd.args(["run", "--input", "good", "--output", out])
        .args(["--shards", "2", "--seed", "5"]);
    cmd.output()
}

/// `edits` single-byte edits of a layout (each alone, the file restored after it), made by
/// `edit` from the file's bytes, an offset and a byte; each run must exit 0 with a verified
/// output or fail naming the shard whose layout was edited. Returns (verified, refused).
fn attack(
    dir: &Dir,
    seed: u64,
    edits: usize,
    edit: impl Fn(&[u8], usize, u8) -> Vec<u8>,
) -> (usize, usize) {
    let good = dir.join("good");
    let shards = layouts(&good);
    let inputs: Vec<PathBuf> = shards.iter().map(|(s, _)| s.clone()).collect();
    let mut rng = Rng(seed);
    let (mut verified, mut refused) = (0, 0);
    for i in 0..edits {
        let (shard, layout) = &shards[rng.below(shards.len())];
        let original = fs::read(layout).unwrap();
        let at = rng.below(original.len());
        let byte = (original[at] as usize + 1 + rng.below(255)) as u8;
        fs::write(layout, edit(&original, at, byte)).unwrap();
        let np = 1 + i % 2;
        let out = format!("out-{i}");
        let res = reshuffle(dir, np, &out);
        fs::write(layout, &original).unwrap();
        let name = shard.file_name().unwrap().to_str().unwrap();
        match res.code() {
            Some(0) => {
                verify(
                    &Expected::new(dir.path(), &inputs, 2, 5, np),
                    &dir.join(&out),
                );
                verified += 1;
            }
            Some(1) => {
                res.stderr_has(name);
                res.stderr_has("saved index");
                res.no_debug_text();
                res.check(!dir.join(&out).exists(), "a refused run published");
                refused += 1;
            }
            _ => res.fail(&format!(
                "edit {i} (byte {at} of {} set to {byte}): neither exit 0 nor a refusal",
                layout.display()
            )),
        }
    }
    (verified, refused)
}

/// Edits as disk damage or a hand edit make them: the checksum no longer matches, the layout
/// is stale, its shard is indexed again from its headers (saying so), and the output is right.
/// Before layouts were sealed, 126 of 300 such edits gave exit 0 with shards GNU tar rejects.
#[test]
fn damaged_saved_layouts_are_reindexed_never_believed() {
    let dir = Dir::new("layout-edits");
    good_output_to_damage(&dir);
    let (verified, refused) = attack(&dir, 36, 24, |bytes, at, byte| {
        let mut v = bytes.to_vec();
        v[at] = byte;
        v
    });
    assert_eq!((verified, refused), (24, 0));
}

/// A saved layout's body as reshard writes it (bincode, standard configuration), to edit it as
/// a layout consistent with itself but not with its shard.
#[derive(serde::Serialize, serde::Deserialize)]
struct Layout {
    format: u32,
    name: String,
    size: u64,
    mtime_ns: u128,
    version: u64,
    samples: Vec<(u64, u64)>,
    skipped: (u64, u64, u64, u64),
}

/// Edits behind a checksum brought up to date (a layout consistent with itself but not with
/// its shard): the boundary between two samples moved by whole blocks, so that every range is
/// still whole blocks, in order and without a gap. Each sample's range is checked against the
/// tar structure before it is copied, at one rank (copied inside the kernel: its headers are
/// read) and two (in memory): each run is refused naming the shard, or gives the right output.
#[test]
fn moved_sample_boundaries_are_refused_before_a_byte_is_copied() {
    let dir = Dir::new("layout-moved");
    good_output_to_damage(&dir);
    let config = bincode::config::standard();
    let (verified, refused) = attack(&dir, 3600, 24, |bytes, at, byte| {
        let body = reshard::output::seal::open(bytes).unwrap();
        let (mut layout, _): (Layout, _) = bincode::serde::decode_from_slice(body, config).unwrap();
        let n = layout.samples.len();
        let i = at % (n - 1);
        let blocks = 1 + u64::from(byte % 3);
        let (a, b) = (layout.samples[i], layout.samples[i + 1]);
        let shift = 512 * blocks;
        if byte % 2 == 0 && b.1 > shift {
            // Later: the first sample takes the next one's first blocks.
            layout.samples[i] = (a.0, a.1 + shift);
            layout.samples[i + 1] = (b.0 + shift, b.1 - shift);
        } else {
            let shift = shift.min(a.1 - 512);
            layout.samples[i] = (a.0, a.1 - shift);
            layout.samples[i + 1] = (b.0 - shift, b.1 + shift);
        }
        reshard::output::seal::seal(bincode::serde::encode_to_vec(&layout, config).unwrap())
    });
    eprintln!("moved boundaries: {verified} verified outputs, {refused} refusals");
    assert!(refused > 0, "no edit reached the structure check");
}

/// One input file named twice through a hard link (or a symlink, or `dir/../dir`) is refused
/// naming both paths, by `run` at every rank count and by `verify`: its samples were read twice
/// with exit 0.
#[test]
fn one_input_file_under_two_names_is_refused() {
    let dir = Dir::new("hard-links");
    let inputs = dir.generate("in", &["--shards", "2", "--samples", "10", "--seed", "1"]);
    fs::create_dir(dir.join("other")).unwrap();
    fs::hard_link(&inputs[0], dir.join("other/linked.tar")).unwrap();
    std::os::unix::fs::symlink(&inputs[1], dir.join("other/sym.tar")).unwrap();
    let first = inputs[0].file_name().unwrap().to_str().unwrap().to_string();
    let second = inputs[1].file_name().unwrap().to_str().unwrap().to_string();
    for (np, other, needle, named) in [
        (1, "other/linked.tar", "is the same file as input", &first),
        (2, "other/linked.tar", "is the same file as input", &first),
        (2, "other/sym.tar", "named twice", &second),
        (1, "other/../in", "named twice", &first),
    ] {
        let mut cmd = dir.mpi(np);
        cmd.args(["run", "--input", "in", "--input", other, "--output", "out"])
            .args(["--shards", "2", "--seed", "1"]);
        let res = cmd.output();
        res.check(res.code() != Some(0), "the same file twice was read twice");
        res.stderr_has(needle);
        res.stderr_has(other);
        res.stderr_has(named);
        res.no_debug_text();
        res.check(!dir.join("out").exists(), "an output was made");
    }
    let mut cmd = dir.mpi(1);
    cmd.args([
        "run", "--input", "in", "--output", "out", "--shards", "2", "--seed", "1",
    ]);
    cmd.assert_success();
    let mut cmd = dir.reshard(None);
    cmd.args([
        "verify",
        "--input",
        "in",
        "--input",
        "other/linked.tar",
        "--output",
        "out",
    ]);
    let res = cmd.output();
    res.check(res.code() != Some(0), "verify read the same file twice");
    res.stderr_has("is the same file as input");
}
