#!/usr/bin/env bash
# Runs the consumer examples end to end: what a training job sees of a reshard output.
#
#   1. creates a Python venv (target/consumers-venv) and pip installs requirements.txt
#      (webdataset, wids; no torch) and, with --no-deps, energon-requirements.txt
#      (megatron-energon without torch) — or, when PyPI cannot be reached or python3 / its venv
#      module is missing, says so and exits 0 without running anything;
#   2. generates a small WebDataset with `reshard generate` (uneven input shards);
#   3. reshuffles it twice with `mpirun -np $NP reshard run` (no launcher if there is no
#      mpirun): plain (--shards 7, sample counts differ by one) and for 2 GPUs x 2 workers
#      with --equalize drop; and with --energon --dali-index;
#   4. runs read_webdataset.py and read_wids.py on both outputs, ddp_equal_batches.py on the
#      GPU output (must pass) and on the plain one (must report unequal ranks, exit 1);
#      read_energon.py and check_dali_index.py on the --energon --dali-index output.
#
# Exits 1 when any example reports wrong counts. Environment overrides:
#   RESHARD=path/to/reshard   (default: cargo build, then target/debug/reshard)
#   NP=2                      MPI ranks for reshard run
#   CONSUMERS_VENV=DIR        the venv (kept between runs; reinstalled when requirements change)
#   CONSUMERS_WORK=DIR        scratch data (wiped first; default target/consumers-data)
set -euo pipefail

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.."
HERE=examples/consumers
TARGET=${CARGO_TARGET_DIR:-target}
VENV=${CONSUMERS_VENV:-$TARGET/consumers-venv}
WORK=${CONSUMERS_WORK:-$TARGET/consumers-data}
NP=${NP:-2}

skip() {
    echo "consumers: SKIP: $*"
    exit 0
}
started=$SECONDS

# ---- Python and packages --------------------------------------------------------------------
command -v python3 >/dev/null || skip "python3 not found"
if [ ! -x "$VENV/bin/python" ]; then
    mkdir -p "$(dirname "$VENV")"
    if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
        rm -rf "$VENV"
        skip "python3 -m venv failed (on Debian/Ubuntu: apt-get install python3-venv)"
    fi
fi
PY=$VENV/bin/python
PIP=("$PY" -m pip --disable-pip-version-check --no-input)
stamp=$VENV/.consumers-requirements
wanted=$(cat "$HERE/requirements.txt" "$HERE/energon-requirements.txt")
if [ "$wanted" = "$(cat "$stamp" 2>/dev/null)" ] && "$PY" -c 'import webdataset, wids.wids_mmtar' 2>/dev/null; then
    echo "consumers: packages already installed in $VENV"
else
    # Reachability first, through pip itself (so pip.conf, PIP_INDEX_URL and proxies apply):
    # an unreachable index skips the examples, a reachable one that then fails is an error.
    probe=$(mktemp -d)
    if ! "${PIP[@]}" download -q --no-deps --timeout 20 --retries 1 --dest "$probe" \
        "$(grep -m 1 '^webdataset' "$HERE/requirements.txt")" >/dev/null 2>&1; then
        rm -rf "$probe"
        skip "the Python package index is not reachable (pip download webdataset failed)"
    fi
    rm -rf "$probe"
    echo "consumers: pip install -r $HERE/requirements.txt into $VENV"
    if ! "${PIP[@]}" install -q --timeout 60 --retries 3 -r "$HERE/requirements.txt" ||
        ! "${PIP[@]}" install -q --timeout 60 --retries 3 --no-deps -r "$HERE/energon-requirements.txt"; then
        echo "consumers: ERROR: pip install failed although the index answered" >&2
        exit 1
    fi
    printf '%s' "$wanted" >"$stamp"
fi
"${PIP[@]}" list 2>/dev/null | grep -iE '^(webdataset|wids|megatron-energon|numpy|pyyaml|braceexpand|torch) ' | sed 's/^/    /'
if "$PY" -c 'import torch' 2>/dev/null; then
    echo "consumers: note: torch is installed in the venv (not needed)"
fi

# ---- data -----------------------------------------------------------------------------------
if [ -z "${RESHARD:-}" ]; then
    cargo build --quiet --bin reshard
    RESHARD=$TARGET/debug/reshard
fi
LAUNCH=()
if command -v mpirun >/dev/null; then
    LAUNCH=(mpirun -np "$NP")
    # Harmless for MPICH; lets Open MPI run as root and oversubscribe.
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
fi
rm -rf "$WORK"
mkdir -p "$WORK"
echo "consumers: generating a dataset in $WORK/input"
"$RESHARD" generate --output "$WORK/input" --shards 6 --samples 1003 --mean-size 2KiB --skew 1 --seed 7 >/dev/null
echo "consumers: ${LAUNCH[*]} reshard run (plain, and --gpus 2 --workers 2 --equalize drop)"
"${LAUNCH[@]}" "$RESHARD" run --input "$WORK/input" --output "$WORK/plain" --shards 7 --seed 1 >/dev/null
"${LAUNCH[@]}" "$RESHARD" run --input "$WORK/input" --output "$WORK/gpus" --gpus 2 --workers 2 \
    --shard-size 64KiB --equalize drop --batch-size 16 --seed 1 --epoch 1 >/dev/null
echo "consumers: ${LAUNCH[*]} reshard run --energon --dali-index"
"${LAUNCH[@]}" "$RESHARD" run --input "$WORK/input" --output "$WORK/loaders" --shards 5 --seed 1 \
    --energon --dali-index >/dev/null

# ---- examples -------------------------------------------------------------------------------
passed=0
failed=0
# check EXPECTED-EXIT-CODE SCRIPT ARGS...
check() {
    local want=$1 rc=0
    shift
    echo
    echo "==> $* (expect exit $want)"
    local out
    out=$(timeout 300 "$PY" "$HERE/$1" "${@:2}" 2>&1) || rc=$?
    # (wids prints a line about every index it opens; left out.)
    printf '%s\n' "$out" | grep -v '/index.json base: ' | sed 's/^/    /' || true
    if [ "$rc" -eq "$want" ]; then
        passed=$((passed + 1))
    else
        echo "    !!! exit code $rc, expected $want"
        failed=$((failed + 1))
    fi
}
check 0 read_webdataset.py "$WORK/plain" --keys cls,jpg,json
check 0 read_webdataset.py "$WORK/gpus" --keys cls,jpg,json
check 0 read_wids.py "$WORK/plain" --keys cls,jpg,json
check 0 read_wids.py "$WORK/gpus" --keys cls,jpg,json
check 0 ddp_equal_batches.py "$WORK/gpus" --gpus 2 --workers 2 --batch-size 16
check 0 ddp_equal_batches.py "$WORK/gpus" --gpus 2 --workers 1 --batch-size 16
# The plain output's 7 shards split 4/3 over 2 ranks: the checker must see the imbalance.
check 1 ddp_equal_batches.py "$WORK/plain" --gpus 2 --batch-size 16
check 0 read_energon.py "$WORK/loaders"
check 0 check_dali_index.py "$WORK/loaders"

echo
echo "consumers: $passed passed, $failed failed ($((SECONDS - started)) s)"
[ "$failed" -eq 0 ]
