# A Spack package for reshard, kept with its source. See the README, "Installing with Spack".
#
# SPDX-License-Identifier: (MIT OR Apache-2.0)

from spack.package import *

try:
    # Spack 1.0 and later keep the build systems in the builtin package repository.
    from spack_repo.builtin.build_systems.cargo import CargoPackage
except ImportError:
    # Spack 0.x exports CargoPackage from spack.package.
    pass


class Reshard(CargoPackage):
    """Reorganize sharded WebDataset training data over MPI: a global seeded reshuffle into
    rebalanced shards, run as one process or across many nodes under mpirun or srun."""

    # Where reshard's source is published: set these to your copy of the repository, or build
    # from a checkout with `spack develop` (see the README).
    homepage = "https://git.example.org/reshard"
    git = "https://git.example.org/reshard.git"

    license("MIT OR Apache-2.0")

    version("main", branch="main")

    # Cargo.toml's rust-version.
    depends_on("rust@1.85:", type="build")
    # mpi-sys compiles a small C shim with the MPI compiler wrapper.
    depends_on("c", type="build")
    # Built against the site's MPI (MPICH, Open MPI, Cray MPICH, Intel MPI, ...).
    depends_on("mpi")
    # libclang, for bindgen: mpi-sys generates its bindings from the site's mpi.h.
    depends_on("llvm+clang", type="build")

    @property
    def build_args(self):
        # Exactly the dependency versions the project tests (Cargo.lock).
        return ["--locked"]

    def setup_build_environment(self, env):
        # bindgen finds libclang here; build-probe-mpi asks this wrapper for MPI's flags.
        env.set("LIBCLANG_PATH", self.spec["llvm"].prefix.lib)
        env.set("MPICC", self.spec["mpi"].mpicc)

    @run_after("install")
    def check_binary(self):
        # The binary runs without a launcher (a job of one rank) and reports its version.
        Executable(self.prefix.bin.reshard)("--version")
