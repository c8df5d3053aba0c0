//! Stand-ins for Slurm (`srun`, `sbatch`, `module`) and the scripts of `slurm/` and
//! `examples/consumers/` they run.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{mpirun, reshard_exe, Dir, RunOutput};

/// The repository root (where Cargo.toml is).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every shell script of `slurm/` and `examples/consumers/`.
pub fn shell_scripts() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in ["slurm", "examples/consumers"] {
        for e in fs::read_dir(repo().join(dir)).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if name.ends_with(".sh") || name.ends_with(".sbatch") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Every Python script of `slurm/` and `examples/consumers/`.
pub fn python_scripts() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in ["slurm", "examples/consumers"] {
        for e in fs::read_dir(repo().join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "py") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Writes an executable script.
pub fn write_script(path: &Path, text: &str) {
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// A directory of stand-ins to put first on PATH: `srun` (→ `mpirun -np 2`) and `module`, both
/// appending their arguments to `calls.log` in the test directory.
pub fn fake_slurm(dir: &Dir) -> PathBuf {
    let bin = dir.create_dir("fakebin");
    let log = dir.join("calls.log");
    write_script(
        &bin.join("srun"),
        &format!(
            r#"#!/usr/bin/env bash
# Stand-in for Slurm's srun: records the call, drops srun's own options, runs the rest under
# mpirun -np 2.
echo "srun $*" >>'{log}'
while [ $# -gt 0 ]; do
    case $1 in
        --) shift; break ;;
        -N | -n | -c | -t | -p | -J | -A | -w | -m | -o | -e | --nodes | --ntasks | \
        --ntasks-per-node | --cpus-per-task | --time | --partition | --job-name | --account | \
        --nodelist | --distribution | --output | --error | --mpi) shift 2 ;;
        -*) shift ;;
        *) break ;;
    esac
done
exec '{mpirun}' -np 2 "$@"
"#,
            log = log.display(),
            mpirun = mpirun().display()
        ),
    );
    write_script(
        &bin.join("module"),
        &format!(
            "#!/usr/bin/env bash\n# Stand-in for environment modules.\necho \"module $*\" >>'{}'\n",
            log.display()
        ),
    );
    bin
}

/// `bash SCRIPT` in `dir` with the stand-ins first on PATH and `vars` in the environment.
pub fn run_script(dir: &Dir, script: &str, bin: &Path, vars: &[(&str, &str)]) -> RunOutput {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![bin.to_path_buf()];
    paths.extend(std::env::split_paths(&path));
    let mut cmd = dir.program("bash");
    cmd.arg(repo().join(script))
        .env("PATH", std::env::join_paths(paths).unwrap())
        .env("RESHARD", reshard_exe())
        .env("RANK_REPORT", repo().join("slurm/rank-report.py"));
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.assert_success()
}

/// The `nsamples` of every shard an index.json lists.
pub fn shard_counts(index: &Value) -> Vec<u64> {
    index["shardlist"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["nsamples"].as_u64().unwrap())
        .collect()
}

/// The calls the stand-in sbatch recorded: (arguments, OUTPUT, EPOCH, DATA, EXTRA_ARGS).
pub fn epoch_loop(dir: &Dir, vars: &[(&str, &str)]) -> (RunOutput, Vec<[String; 5]>) {
    let bin = dir.create_dir("fakebin");
    let log = dir.join("sbatch.log");
    let _ = fs::remove_file(&log);
    write_script(
        &bin.join("sbatch"),
        &format!(
            r#"#!/usr/bin/env bash
# Stand-in for sbatch --parsable: records the call and the job's variables, prints an id.
n=$(($(cat '{log}.n' 2>/dev/null || echo 100) + 1))
echo "$n" >'{log}.n'
printf '%s\t%s\t%s\t%s\t%s\n' "$*" "${{OUTPUT:-}}" "${{EPOCH:-}}" "${{DATA:-}}" "${{EXTRA_ARGS:-}}" >>'{log}'
echo "$n;cluster1"
"#,
            log = log.display()
        ),
    );
    dir.create_bytes("train.sbatch", b"#!/bin/bash\necho training on $DATA\n");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![bin];
    paths.extend(std::env::split_paths(&path));
    let mut cmd = dir.program("bash");
    cmd.arg(repo().join("slurm/epoch-loop.sh"))
        .env("PATH", std::env::join_paths(paths).unwrap())
        .env("TRAIN_SCRIPT", "train.sbatch")
        .env("RESHARD_SBATCH", repo().join("slurm/reshard.sbatch"))
        .env("RESHARD", reshard_exe())
        .env("INPUT", "input")
        .env("DATA_ROOT", "data");
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let res = cmd.output();
    let calls = fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            std::array::from_fn(|i| f.get(i).copied().unwrap_or("").to_string())
        })
        .collect();
    (res, calls)
}

/// The job name and dependency of a recorded sbatch call.
pub fn job(call: &[String; 5]) -> (String, String) {
    let arg = |prefix: &str| {
        call[0]
            .split(' ')
            .find_map(|w| w.strip_prefix(prefix))
            .unwrap_or("")
            .to_string()
    };
    (arg("--job-name="), arg("--dependency=afterok:"))
}
