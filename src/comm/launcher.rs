//! Whether the launcher that started this process and the MPI library agree on the job's size.
//!
//! A binary started by a launcher that its MPI library cannot talk to runs as N independent
//! worlds of one, each of which would rewrite the whole output, racing the others on one staging
//! directory. Two launchers say how many tasks they started:
//!
//! - MPI launchers (`mpirun`, hydra's `mpiexec`, srun's `pmi2` and `pmix` plugins) set
//!   `OMPI_COMM_WORLD_SIZE`, `PMI_SIZE` or `PMIX_SIZE`: any of them that differs from the world
//!   size means the binary was built against another MPI.
//! - srun sets `SLURM_STEP_NUM_TASKS` in every task of a step (the batch shell of `sbatch` has
//!   none), whatever its `--mpi` plugin. More tasks than the world holds means the plugin did not
//!   connect them (`--mpi=none`, or `MpiDefault=none` in slurm.conf). Fewer is normal: an MPI
//!   launcher inside an allocation (hydra's `mpiexec`, Open MPI's `mpirun`) starts one proxy per
//!   node with srun, and its ranks inherit that step's count, the number of nodes.
//!
//! Pure code: the environment comes in as a function, so the decision is unit-tested.

use std::fmt;

/// The launcher started more processes than the MPI world holds: every process refuses before
/// anything is written (`reshard` exits with [`crate::exit::Exit::Usage`]: the way it was started
/// is wrong, and running it again the same way cannot work).
#[derive(Debug)]
pub struct LauncherMismatch(String);

impl fmt::Display for LauncherMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LauncherMismatch {}

/// The variables MPI launchers set to the number of ranks they started.
const MPI_SIZE_VARS: [&str; 3] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"];

/// Checks the launchers' task counts in `env` against the MPI world's `size`.
///
/// # Errors
/// srun started more tasks than `size` (`SLURM_STEP_NUM_TASKS`), or an MPI launcher's count
/// differs from `size`.
pub(crate) fn check(
    size: usize,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(), LauncherMismatch> {
    let count = |var: &str| env(var).and_then(|v| v.trim().parse::<usize>().ok());
    if let Some(tasks) = count("SLURM_STEP_NUM_TASKS").filter(|&n| n > size) {
        return Err(LauncherMismatch(srun_message(tasks, size)));
    }
    for var in MPI_SIZE_VARS {
        if let Some(n) = count(var).filter(|&n| n != size) {
            return Err(LauncherMismatch(format!(
                "the launcher started {n} ranks ({var}={n}) but MPI reports a world of {size}: \
                 reshard was built against a different MPI than the mpirun/srun that started it \
                 (rebuild it after `cargo clean -p mpi-sys`, or use the matching launcher); \
                 nothing was written"
            )));
        }
    }
    Ok(())
}

/// The variables launchers set to a process's rank, most specific first: an MPI launcher's, then
/// srun's task id (an MPI launcher inside an allocation runs its ranks under srun steps of its
/// own, whose task ids number nodes, not ranks).
const RANK_VARS: [&str; 4] = [
    "PMI_RANK",
    "PMIX_RANK",
    "OMPI_COMM_WORLD_RANK",
    "SLURM_PROCID",
];

/// This process's rank as its launcher numbered it, before (or without) MPI: `None` without a
/// launcher.
pub(crate) fn launcher_rank(env: impl Fn(&str) -> Option<String>) -> Option<usize> {
    RANK_VARS
        .iter()
        .find_map(|var| env(var).and_then(|v| v.trim().parse().ok()))
}

/// Whether this process speaks for the job where every process meets the same problem before
/// MPI can tell them apart (a usage error, a launcher mismatch): the launcher's rank 0, or a
/// process started without a launcher. The others stay quiet, so that the message is printed
/// once per job, not once per rank.
pub fn speaks_for_the_job() -> bool {
    launcher_rank(|k| std::env::var(k).ok()).is_none_or(|r| r == 0)
}

fn srun_message(tasks: usize, size: usize) -> String {
    let worlds = if size == 1 {
        format!("each of the {tasks} tasks is a job of its own")
    } else {
        "the tasks form several separate jobs".to_string()
    };
    format!(
        "srun started {tasks} tasks but MPI sees a world of {size} (SLURM_STEP_NUM_TASKS={tasks}): \
         {worlds}, and they would race on one output, so every task refuses and nothing was \
         written. srun's MPI plugin did not connect them into one job (`--mpi=none`, or the \
         cluster's MpiDefault, or a plugin the MPI reshard was built against does not speak): \
         pass --mpi=pmi2 for MPICH (also MVAPICH, Intel MPI) or --mpi=pmix for Open MPI \
         (`srun --mpi=list` shows this cluster's plugins; the slurm/*.sbatch scripts take it as \
         SRUN_MPI). See slurm/README.md, \"PMI or PMIx\"."
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k: &str| {
            vars.iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn srun_without_a_matching_plugin_is_refused() {
        // srun -n 3 --mpi=none: three worlds of one, no PMI variables.
        let e = check(1, env(&[("SLURM_STEP_NUM_TASKS", "3")])).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("srun started 3 tasks but MPI sees a world of 1"),
            "{msg}"
        );
        assert!(msg.contains("--mpi=pmi2 for MPICH"), "{msg}");
        assert!(msg.contains("--mpi=pmix for Open MPI"), "{msg}");
        assert!(msg.contains("slurm/README.md"), "{msg}");
        // Two worlds of two (srun -n 4 around an mpirun -np 2) are refused as well.
        let e = check(2, env(&[("SLURM_STEP_NUM_TASKS", "4"), ("PMI_SIZE", "2")])).unwrap_err();
        assert!(e
            .to_string()
            .contains("srun started 4 tasks but MPI sees a world of 2"));
    }

    #[test]
    fn the_launchers_rank_comes_from_the_most_specific_variable() {
        assert_eq!(launcher_rank(|_| None), None);
        assert_eq!(launcher_rank(env(&[("SLURM_PROCID", "3")])), Some(3));
        // hydra's rank 0 on the second node of an allocation: its proxy is srun's task 1.
        let hydra = env(&[("SLURM_PROCID", "1"), ("PMI_RANK", "0")]);
        assert_eq!(launcher_rank(hydra), Some(0));
    }

    #[test]
    fn srun_with_a_matching_plugin_runs() {
        // srun -n 3 --mpi=pmi2 with MPICH.
        assert!(check(3, env(&[("SLURM_STEP_NUM_TASKS", "3"), ("PMI_SIZE", "3")])).is_ok());
        // One task, or a plain `reshard` in an `srun --pty bash` of one task.
        assert!(check(1, env(&[("SLURM_STEP_NUM_TASKS", "1")])).is_ok());
    }

    #[test]
    fn mpi_launchers_inside_an_allocation_run() {
        // hydra's mpiexec in a batch job: one proxy per node started by srun (2 nodes), 8 ranks.
        assert!(check(8, env(&[("SLURM_STEP_NUM_TASKS", "2"), ("PMI_SIZE", "8")])).is_ok());
        // The batch shell itself has no step: no launcher at all.
        assert!(check(1, env(&[("SLURM_NTASKS", "8")])).is_ok());
        assert!(check(1, |_| None).is_ok());
        // Unparsable values say nothing.
        assert!(check(1, env(&[("SLURM_STEP_NUM_TASKS", "three")])).is_ok());
    }

    #[test]
    fn a_foreign_mpi_launcher_is_refused() {
        let open_mpi = env(&[("OMPI_COMM_WORLD_SIZE", "4")]);
        assert!(check(1, &open_mpi)
            .unwrap_err()
            .to_string()
            .contains("different MPI"));
        assert!(check(4, &open_mpi).is_ok());
        // srun --mpi=pmi2 starting a binary built against Open MPI: PMI_SIZE says 3, MPI 1; the
        // srun message comes first, it names the plugins.
        let e = check(1, env(&[("SLURM_STEP_NUM_TASKS", "3"), ("PMI_SIZE", "3")])).unwrap_err();
        assert!(e.to_string().starts_with("srun started 3 tasks"));
    }
}
