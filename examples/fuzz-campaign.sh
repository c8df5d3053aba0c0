#!/usr/bin/env bash
# A longer fuzz campaign than the suite's (tests/fuzz_tars.rs): COUNT seeded mutants of small
# real shards (GNU tar, bsdtar, tarfile ustar/gnu/pax, webdataset's TarWriter), each run through
# `reshard run`, with the suite's property checked for every one: exit 0 only with exactly the
# (member name, bytes) multiset Python's tarfile reads from the mutant, otherwise a refusal
# naming the file and a byte offset; never a panic (exit 70), never a hang.
#
#   examples/fuzz-campaign.sh [--count N] [--seed S] [--np P]
#
# Needs what the suite needs: RESHARD_TEST_PYTHON (a Python with webdataset), GNU tar, bsdtar,
# and mpirun for --np. Prints "N moved, M refused" and every mutant that breaks the property
# (its file, what was done to it, the run's report); exits non-zero if any does.
set -euo pipefail
count=2000 seed=$RANDOM np=
while [ $# -gt 0 ]; do
    case $1 in
        --count) count=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        --np) np=$2; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
echo "fuzz campaign: $count mutants, seed $seed${np:+, np $np}"
export RESHARD_FUZZ_COUNT=$count RESHARD_FUZZ_SEED=$seed RESHARD_NO_SKIP=1
[ -n "$np" ] && export RESHARD_FUZZ_NP=$np
time cargo test --test integration -- --exact \
    fuzz_tars::mutated_shards_move_as_tarfile_reads_them_or_are_refused --nocapture
