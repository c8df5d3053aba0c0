#!/usr/bin/env bash
# Benchmark: reshard run vs a plain `cp -r` of the same data, measured in the same run.
#
#   examples/bench.sh [--size 2GiB] [--mean 100KiB] [--in-shards 64] [--out-shards 64]
#                     [--skew 3] [--mem-limit 1GiB] [--np "1 2 4"] [--dir bench-data] [--warm]
#                     [--repeat 1]
#
# Prints one table row per command: wall time, MB/s, ratio to cp, peak RSS of the largest rank,
# and reshard's phase times. Each timed command ends with `sync` inside the timing. As root the
# page cache is dropped before every timed command (cold); --warm also runs everything on a warm
# cache. --repeat N runs the whole sequence (cp, then every np) N times and prints the median of
# each command, its range, and the phases of its median run: a virtual disk's speed drifts between
# minutes, so cp and reshard are interleaved. Figures, never assertions: this script does not fail
# on slow results.
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE=2GiB MEAN=100KiB IN_SHARDS=64 OUT_SHARDS=64 SKEW=3 MEM=1GiB NPS="1 2 4" DIR=bench-data WARM=0
REPEAT=1
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
    --repeat) REPEAT=$2; shift 2;;
    -h|--help) sed -n '2,14p' "$0"; exit 0;;
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

TIMES="$DIR/times.tsv" # cache, command, seconds, max RSS, phases: one line per timed run
: > "$TIMES"
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$@" >> "$TIMES"; }

caches=cold
[ $can_drop = 1 ] || { echo "(not root: cannot drop the page cache; all runs are warm)" >&2; caches=warm; }
[ $WARM = 1 ] && [ $can_drop = 1 ] && caches="cold warm"
for cache in $caches; do
  for rep in $(seq "$REPEAT"); do
    rm -rf "$DIR/cp-out"
    if [ $cache = warm ]; then cat "$INPUT"/* > /dev/null; fi
    drop $cache
    t0=$(now_s); cp -r "$INPUT" "$DIR/cp-out"; sync; t1=$(now_s)
    rm -rf "$DIR/cp-out"
    record $cache "cp -r" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')" "-" ""
    for np in $NPS; do
      rm -rf "$DIR/out" "$DIR/report.json"
      if [ $cache = warm ]; then cat "$INPUT"/* > /dev/null; fi
      drop $cache
      t0=$(now_s)
      mpirun -np "$np" "$BIN" run --input "$INPUT" --output "$DIR/out" --shards "$OUT_SHARDS" --seed 7 \
        --mem-limit "$MEM" --report "$DIR/report.json" > "$DIR/run.log" 2>&1 || { cat "$DIR/run.log" >&2; exit 1; }
      sync; t1=$(now_s)
      read -r rss phases < <(python3 - "$DIR/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
rss = max(x["peak_rss"] for x in r["per_rank"]) / 2**20
print(f"{rss:.0f}MiB", " ".join(f"{n}={s:.2f}" for n, s in r["phases"]["phases"]))
PY
)
      record $cache "reshard np=$np" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')" "$rss" "$phases"
      rm -rf "$DIR/out"
    done
  done
done

python3 - "$TIMES" "$BYTES" <<'PY'
import sys, statistics
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
size = int(sys.argv[2])
print(f"{'cache':<6} {'command':<16} {'seconds':>8} {'range':>13} {'MB/s':>6} {'ratio':>6} {'max RSS':>8}  phases of the median run (s)")
for cache in dict.fromkeys(r[0] for r in rows):
    runs = {}
    for r in rows:
        if r[0] == cache:
            runs.setdefault(r[1], []).append(r)
    def median_run(rs):
        return sorted(rs, key=lambda r: float(r[2]))[(len(rs) - 1) // 2]
    cp = float(median_run(runs["cp -r"])[2])
    for command, rs in runs.items():
        m = median_run(rs)
        secs = [float(r[2]) for r in rs]
        span = f"{min(secs):.2f}-{max(secs):.2f}" if len(rs) > 1 else ""
        s = float(m[2])
        print(f"{cache:<6} {command:<16} {s:>8.2f} {span:>13} {size / s / 1e6:>6.0f} {s / cp:>6.2f} {m[3]:>8}  {m[4]}")
PY
echo "data: $BYTES bytes in $IN_SHARDS shards at $INPUT; mem-limit $MEM; $(nproc) cores; median of $REPEAT" >&2
