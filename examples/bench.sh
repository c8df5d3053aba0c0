#!/usr/bin/env bash
# Benchmark: reshard run vs a plain `cp -r` of the same data, measured in the same run.
#
#   examples/bench.sh [--size 2GiB] [--mean 100KiB] [--in-shards 64] [--out-shards 64]
#                     [--skew 3] [--mem-limit 1GiB] [--np "1 2 4"] [--dir bench-data] [--warm]
#
# Prints one table row per command: wall time, MB/s, ratio to cp, peak RSS of the largest rank,
# and reshard's phase times. Each timed command ends with `sync` inside the timing. As root the
# page cache is dropped before every timed command (cold); --warm also runs everything on a warm
# cache. Figures, never assertions: this script does not fail on slow results.
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE=2GiB MEAN=100KiB IN_SHARDS=64 OUT_SHARDS=64 SKEW=3 MEM=1GiB NPS="1 2 4" DIR=bench-data WARM=0
while [ $# -gt 0 ]; do
  case "$1" in
    --size) SIZE=$2; shift 2;;
    --mean) MEAN=$2; shift 2;;
    --in-shards) IN_SHARDS=$2; shift 2;;
    --out-shards) OUT_SHARDS=$2; shift 2;;
    --skew) SKEW=$2; shift 2;;
    --mem-limit) MEM=$2; shift 2;;
    --np) NPS=$2; shift 2;;
    --dir) DIR=$2; shift 2;;
    --warm) WARM=1; shift;;
    -h|--help) sed -n '2,10p' "$0"; exit 0;;
    *) echo "bench.sh: unknown option $1" >&2; exit 2;;
  esac
done

if mpirun --version 2>/dev/null | grep -qi "open mpi"; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
fi
cargo build --release --quiet
BIN=$PWD/target/release/reshard

INPUT="$DIR/input-$SIZE-$MEAN-$IN_SHARDS-$SKEW"
if [ ! -f "$INPUT/.complete" ]; then
  rm -rf "$INPUT"
  echo "generating $SIZE in $IN_SHARDS shards (mean sample $MEAN, skew $SKEW) at $INPUT" >&2
  "$BIN" generate --output "$INPUT" --shards "$IN_SHARDS" --total-size "$SIZE" --mean-size "$MEAN" \
    --skew "$SKEW" --seed 1 --long-names-every 97 >&2
  touch "$INPUT/.complete"
fi
BYTES=$(du -sb --exclude=.complete "$INPUT" | cut -f1)

can_drop=0
if [ -w /proc/sys/vm/drop_caches ]; then can_drop=1; fi
drop() { if [ "$1" = cold ] && [ $can_drop = 1 ]; then sync; echo 3 > /proc/sys/vm/drop_caches; fi; }

# now_s: seconds with nanoseconds
now_s() { date +%s.%N; }

CP_SECS=""
printf '%-6s %-22s %9s %9s %8s %12s  %s\n' cache command seconds MB/s ratio "max RSS" "phases (s)"
run_row() { # cache label seconds rss phases
  local mbs ratio
  mbs=$(awk -v b="$BYTES" -v s="$3" 'BEGIN{printf "%.0f", b/s/1e6}')
  ratio=$(awk -v s="$3" -v c="$CP_SECS" 'BEGIN{printf "%.2f", s/c}')
  printf '%-6s %-22s %9.2f %9s %8s %12s  %s\n' "$1" "$2" "$3" "$mbs" "$ratio" "$4" "$5"
}

caches=cold
[ $can_drop = 1 ] || { echo "(not root: cannot drop the page cache; all runs are warm)" >&2; caches=warm; }
[ $WARM = 1 ] && [ $can_drop = 1 ] && caches="cold warm"
for cache in $caches; do
  rm -rf "$DIR/cp-out"
  drop $cache
  t0=$(now_s); cp -r "$INPUT" "$DIR/cp-out"; sync; t1=$(now_s)
  CP_SECS=$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')
  rm -rf "$DIR/cp-out"
  run_row $cache "cp -r" "$CP_SECS" "-" ""
  for np in $NPS; do
    rm -rf "$DIR/out" "$DIR/report.json"
    drop $cache
    t0=$(now_s)
    mpirun -np "$np" "$BIN" run --input "$INPUT" --output "$DIR/out" --shards "$OUT_SHARDS" --seed 7 \
      --mem-limit "$MEM" --report "$DIR/report.json" > "$DIR/run.log" 2>&1 || { cat "$DIR/run.log" >&2; exit 1; }
    sync; t1=$(now_s)
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')
    read -r rss phases < <(python3 - "$DIR/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
rss = max(x["peak_rss"] for x in r["per_rank"]) / 2**20
print(f"{rss:.0f}MiB", " ".join(f"{n}={s:.2f}" for n, s in r["phases"]["phases"]))
PY
)
    run_row $cache "reshard np=$np" "$secs" "$rss" "$phases"
  done
  rm -rf "$DIR/out"
done
echo "data: $BYTES bytes in $IN_SHARDS shards at $INPUT; mem-limit $MEM; $(nproc) cores" >&2
