#!/usr/bin/env bash
# The README's test command, several times in a row, in each of several clean clones of this
# checkout's HEAD at once: does the suite pass while another copy of it runs beside it (issue 28)?
#
#   examples/suite-beside.sh [--runs 5] [--copies 2] [--dir /tmp/suite-beside]
#
# Each copy is a `git clone` of HEAD with a target/ of its own (seeded with a copy of this
# checkout's target/debug, if any, so that mostly reshard itself is rebuilt), and runs the
# command exactly as the README and .ci/run give it, with RESHARD_NO_SKIP=1 as in CI
# (RESHARD_TEST_PYTHON from the environment, else this checkout's target/pyenv/bin/python, which
# .ci/run or examples/quickstart.sh make). Prints a line per run as it ends: copy, run, exit
# status, seconds and the test totals; each run's whole output is in DIR/COPY-RUN.log. Exits 1
# if any run failed. Needs what the tests need (.ci/run installs it).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=5 COPIES=2 DIR=/tmp/suite-beside
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS=$2; shift 2;;
    --copies) COPIES=$2; shift 2;;
    --dir) DIR=$2; shift 2;;
    -h|--help) sed -n '2,13p' "$0"; exit 0;;
    *) echo "suite-beside.sh: unknown option $1" >&2; exit 2;;
  esac
done
COMMAND=$(sed -n "s/^TEST_COMMAND='\(.*\)' # README test command$/\1/p" .ci/run)
[ -n "$COMMAND" ] || { echo "suite-beside.sh: no README test command in .ci/run" >&2; exit 1; }
export RESHARD_NO_SKIP=1 CARGO_TERM_COLOR=never
export RESHARD_TEST_PYTHON=${RESHARD_TEST_PYTHON:-$PWD/target/pyenv/bin/python}
[ -x "$RESHARD_TEST_PYTHON" ] || echo "suite-beside.sh: no $RESHARD_TEST_PYTHON: run .ci/run first" >&2

mkdir -p "$DIR"
DIR=$(realpath "$DIR")
copy() {
  local name=$1 clone=$DIR/$1 i start rc totals
  rm -rf "$clone"
  git clone -q . "$clone"
  if [ -d target/debug ]; then mkdir -p "$clone/target" && cp -a target/debug "$clone/target/"; fi
  for i in $(seq "$RUNS"); do
    start=$SECONDS
    rc=0
    (cd "$clone" && bash -c "$COMMAND") > "$DIR/$name-$i.log" 2>&1 < /dev/null || rc=$?
    totals=$(awk '/^test result:/ { for (k = 1; k < NF; k++) { if ($(k + 1) ~ /^passed/) p += $k; if ($(k + 1) ~ /^failed/) f += $k } }
                  END { printf "%d passed, %d failed", p, f }' "$DIR/$name-$i.log")
    echo "copy $name run $i: exit $rc, $((SECONDS - start)) s, $totals$( [ "$rc" -eq 0 ] || echo "; see $DIR/$name-$i.log")"
    [ "$rc" -eq 0 ] || echo failed > "$DIR/$name.failed"
  done
}

rm -f "$DIR"/*.failed
echo "HEAD $(git rev-parse --short HEAD): $RUNS runs in each of $COPIES copies at once; $(nproc) cores"
for c in $(seq "$COPIES"); do copy "$c" & done
wait
if compgen -G "$DIR/*.failed" > /dev/null; then exit 1; fi
echo "every run passed"
