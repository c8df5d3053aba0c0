//! What Python's tarfile reads from an archive, and the property every input must have: reshard
//! exits 0 only with exactly the (member name, bytes) multiset tarfile reads, and otherwise
//! refuses naming the file and a byte offset; never a panic (exit 70), never a hang. The
//! archives and their mutants are made by `tests/util/tar_oracle.py`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::{tar_files, test_python, Dir};

/// One run of reshard is killed (a hang, which fails the test) after this long.
const HANG: Duration = Duration::from_secs(60);

/// An archive and what tarfile reads from it.
#[derive(Debug, Clone)]
pub struct Case {
    pub file: PathBuf,
    /// Whether tarfile read it to its end without an error.
    pub ok: bool,
    /// Its keyed regular members, `[name as hex, md5]`, sorted.
    pub members: Vec<(String, String)>,
    /// What was done to it (mutants), or which row of the type table it is.
    pub how: String,
}

impl Case {
    fn from_json(v: &Value) -> Case {
        let members = v["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m[0].as_str().unwrap().into(), m[1].as_str().unwrap().into()))
            .collect();
        Case {
            file: PathBuf::from(v["file"].as_str().unwrap()),
            ok: v["ok"].as_bool().unwrap(),
            members,
            how: v["how"].as_str().unwrap_or_default().into(),
        }
    }
}

/// Runs `tar_oracle.py` with `args`, one of them `json`, the file it writes; returns that JSON.
pub fn oracle(dir: &Dir, args: &[&str], json: &str) -> Value {
    let py = test_python().expect("a Python with webdataset (RESHARD_TEST_PYTHON)");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/util/tar_oracle.py");
    dir.program(&py)
        .arg(&script)
        .args(args)
        .timeout(Duration::from_secs(300))
        .assert_success();
    let out = dir.join(json);
    serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap()
}

/// `count` seeded mutants of small shards by several writers, in `dir/name/`.
pub fn mutants(dir: &Dir, name: &str, seed: u64, count: usize) -> Vec<Case> {
    let at = dir.create_dir(name);
    let json = format!("{name}.json");
    let v = oracle(
        dir,
        &[
            "mutants",
            at.to_str().unwrap(),
            &seed.to_string(),
            &count.to_string(),
            &json,
        ],
        &json,
    );
    v.as_array().unwrap().iter().map(Case::from_json).collect()
}

/// tarfile's keyed regular members of each of `files`, and whether it read each to its end.
pub fn tarfile_members(dir: &Dir, files: &[PathBuf]) -> Vec<Case> {
    if files.is_empty() {
        return Vec::new();
    }
    let mut args = vec!["list".to_string(), "listed.json".into()];
    args.extend(files.iter().map(|f| f.to_str().unwrap().to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let v = oracle(dir, &args, "listed.json");
    v.as_array().unwrap().iter().map(Case::from_json).collect()
}

/// How reshard answered one archive.
pub enum Answer {
    /// Exit 0: the output directory.
    Moved(PathBuf),
    /// A refusal naming the file and a byte offset: its message.
    Refused(String),
}

/// Runs `reshard run` over the one input `case.file` (`np` ranks, or no launcher) into `out`,
/// and checks what can be checked at once: no hang, no panic, a refusal that names the file and
/// a byte offset and publishes nothing.
///
/// # Errors
/// What broke the property, with the run's report.
pub fn answer(dir: &Dir, np: Option<usize>, case: &Case, out: &str) -> Result<Answer, String> {
    let res = dir
        .reshard(np)
        .arg("run")
        .arg("--input")
        .arg(&case.file)
        // One output shard: a mutant left with one sample is still an input to move.
        .args(["--output", out, "--shards", "1", "--seed", "1"])
        .timeout(HANG)
        .output();
    let fail = |why: &str| {
        Err(format!(
            "{} ({}): {why}\n{}",
            name(&case.file),
            case.how,
            res.report()
        ))
    };
    match res.code() {
        None => fail("killed: a hang or a signal"),
        Some(0) => Ok(Answer::Moved(dir.join(out))),
        Some(70) => fail("exit 70: a panic"),
        Some(_) if !res.stderr.contains(&name(&case.file)) => {
            fail("a refusal that does not name the file")
        }
        Some(_) if !res.stderr.contains("byte offset") => {
            fail("a refusal that does not name a byte offset")
        }
        Some(_) if dir.join(out).exists() => fail("a refusal that published an output"),
        Some(_) => Ok(Answer::Refused(res.stderr.clone())),
    }
}

fn name(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

/// Checks the outputs of the cases reshard moved (`moved`: the case and its output directory)
/// against tarfile's reading of their inputs, listing every output shard in one call.
pub fn check_moved(dir: &Dir, moved: &[(Case, PathBuf)]) -> Vec<String> {
    let shards: Vec<Vec<PathBuf>> = moved.iter().map(|(_, out)| tar_files(out)).collect();
    let all: Vec<PathBuf> = shards.iter().flatten().cloned().collect();
    let mut listed = tarfile_members(dir, &all).into_iter();
    let mut problems = Vec::new();
    for ((case, out), shards) in moved.iter().zip(&shards) {
        let mut got = Vec::new();
        let mut read = true;
        for _ in shards {
            let l = listed.next().unwrap();
            read &= l.ok;
            got.extend(l.members);
        }
        got.sort();
        if !case.ok || !read || got != case.members {
            problems.push(format!(
                "{} ({}): exit 0, but tarfile reads {} members from the input{} and {} from the output{} ({})",
                name(&case.file),
                case.how,
                case.members.len(),
                if case.ok { "" } else { " (with an error)" },
                got.len(),
                if read { "" } else { " (with an error)" },
                out.display()
            ));
        }
    }
    problems
}

/// Runs every case, checks the property, and returns (moved, refused) counts.
///
/// # Panics
/// Any case breaks the property: every broken case is listed.
pub fn property_holds(dir: &Dir, np: Option<usize>, cases: &[Case]) -> (usize, usize) {
    let mut moved = Vec::new();
    let mut refused = 0;
    let mut problems = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        match answer(dir, np, case, &format!("out-{i}")) {
            Ok(Answer::Moved(out)) => moved.push((case.clone(), out)),
            Ok(Answer::Refused(_)) => refused += 1,
            Err(e) => problems.push(e),
        }
    }
    problems.extend(check_moved(dir, &moved));
    assert!(
        problems.is_empty(),
        "{} of {} archives break the property:\n{}",
        problems.len(),
        cases.len(),
        problems.join("\n\n")
    );
    (moved.len(), refused)
}
