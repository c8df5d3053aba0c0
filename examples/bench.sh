#!/usr/bin/env bash
# Benchmark: reshard run vs a plain `cp -r` of the same data, measured in the same run.
#
#   examples/bench.sh [--size 2GiB] [--mean 100KiB | --mean 4KiB,100KiB,1MiB | --sweep]
#                     [--in-shards 64] [--out-shards 64] [--skew 3] [--mem-limit 1GiB]
#                     [--np "1 2 4"] [--dir bench-data] [--warm | --warm-only] [--repeat 1]
#                     [--run-args "--checkpoint-every 0"]
#   examples/bench.sh --tmpfs [DIR] [...]   (input and outputs in RAM: the software's own cost)
#   examples/bench.sh --bin PATH [...]      (time this reshard binary instead of building one)
#   examples/bench.sh --beside [...]   (a reshuffle beside training: see examples/bench-beside.sh)
#   examples/bench.sh --s3 [...]       (s3:// in and out against s5cmd: see examples/bench-s3.sh)
#
# Prints one table row per command: wall time, MB/s, ratio to cp, user and system CPU seconds
# (summed over every process of the command: mpirun, its proxies and all ranks), CPU seconds per
# GiB of input, the ratio of that CPU to cp's in the same repeat, peak RSS of the largest rank (and
# every rank's, for up to 4 ranks), and reshard's phase times. Each timed command ends with `sync`
# inside the timing. As root the page cache is dropped before every timed command (cold); --warm
# also runs everything on a warm cache, --warm-only only on a warm cache (never dropping it).
# --run-args adds flags to every `reshard run`. --repeat N runs the whole sequence (cp, then every np) N
# times and prints the median of each command, its range, and the phases of its median run: a
# virtual disk's speed drifts between minutes, so cp and reshard are interleaved. --mean takes a
# comma- or space-separated list of mean sample sizes: each gets its own dataset of --size bytes,
# its own runs and its own table; --sweep is --mean 4KiB,100KiB,1MiB. Figures, never assertions:
# this script does not fail on slow results.
#
# --tmpfs [DIR] puts the input, reshard's output and cp's copy on a tmpfs (default
# /dev/shm/reshard-bench; refused if DIR is not on a tmpfs), so no disk is involved and the
# figures measure the software's own cost. Unless given, it implies --mean 4KiB,100KiB --np "1 2"
# --repeat 3; runs are warm by nature (nothing to drop), and `sync -f` syncs only the tmpfs. The
# inputs stay in RAM for the next run: `rm -rf DIR` frees them. Needs about 3x --size of free RAM.
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE=2GiB MEANS=100KiB IN_SHARDS=64 OUT_SHARDS=64 SKEW=3 MEM=1GiB NPS="1 2 4" DIR=bench-data WARM=0
REPEAT=1 WARM_ONLY=0 RUN_ARGS="" TMPFS=0 SET="" BIN=""
while [ $# -gt 0 ]; do
  case "$1" in
    --size) SIZE=$2; shift 2;;
    --mean) MEANS=$2; SET+=" mean"; shift 2;;
    --sweep) MEANS=4KiB,100KiB,1MiB; SET+=" mean"; shift;;
    --in-shards) IN_SHARDS=$2; shift 2;;
    --out-shards) OUT_SHARDS=$2; shift 2;;
    --skew) SKEW=$2; shift 2;;
    --mem-limit) MEM=$2; shift 2;;
    --np) NPS=$2; SET+=" np"; shift 2;;
    --dir) DIR=$2; SET+=" dir"; shift 2;;
    --warm) WARM=1; shift;;
    --warm-only) WARM_ONLY=1; shift;;
    --run-args) RUN_ARGS=$2; shift 2;;
    --bin) BIN=$(realpath "$2"); shift 2;;
    --repeat) REPEAT=$2; SET+=" repeat"; shift 2;;
    --tmpfs) TMPFS=1; shift
      if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then DIR=$1; SET+=" dir"; shift; fi;;
    --beside) shift; exec examples/bench-beside.sh "$@";;
    --s3) shift; exec examples/bench-s3.sh "$@";;
    -h|--help) sed -n '2,30p' "$0"; exit 0;;
    *) echo "bench.sh: unknown option $1" >&2; exit 2;;
  esac
done
if [ $TMPFS = 1 ]; then
  case "$SET" in *dir*) ;; *) DIR=/dev/shm/reshard-bench;; esac
  case "$SET" in *mean*) ;; *) MEANS=4KiB,100KiB;; esac
  case "$SET" in *np*) ;; *) NPS="1 2";; esac
  case "$SET" in *repeat*) ;; *) REPEAT=3;; esac
  mkdir -p "$DIR"
  fs=$(stat -f -c %T "$DIR")
  [ "$fs" = tmpfs ] || { echo "bench.sh: --tmpfs: $DIR is on $fs, not on a tmpfs" >&2; exit 2; }
  WARM_ONLY=1
fi
MEANS=${MEANS//,/ }
read -r -a MEAN_LIST <<< "$MEANS"
[ ${#MEAN_LIST[@]} -gt 0 ] || { echo "bench.sh: --mean needs at least one size" >&2; exit 2; }

if mpirun --version 2>/dev/null | grep -qi "open mpi"; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
fi
if [ -z "$BIN" ]; then
  cargo build --release --quiet
  BIN=$PWD/target/release/reshard
fi
mkdir -p "$DIR"
# What ends every timed command: the whole machine's sync, or (tmpfs) only the tmpfs's, so that
# other processes' dirty pages on the disk are not timed.
SYNC_DIR=""
[ $TMPFS = 1 ] && SYNC_DIR=$DIR
export SYNC_DIR
# shellcheck disable=SC2016 # expanded by the sh -c that runs it
SYNC='if [ -n "$SYNC_DIR" ]; then sync -f "$SYNC_DIR"; else sync; fi'

can_drop=0
if [ -w /proc/sys/vm/drop_caches ]; then can_drop=1; fi
drop() { if [ "$1" = cold ] && [ $can_drop = 1 ]; then sync; echo 3 > /proc/sys/vm/drop_caches; fi; }

# now_s: seconds with nanoseconds
now_s() { date +%s.%N; }

# timed FILE COMMAND...: runs COMMAND and writes "user system" CPU seconds to FILE. Both count
# COMMAND and every descendant that was waited for (getrusage RUSAGE_CHILDREN), which takes in
# mpirun's proxies and ranks: mpirun waits for its proxies and they for their ranks.
CPU="$DIR/cpu"
if [ -x /usr/bin/time ]; then
  timed() { local out=$1; shift; /usr/bin/time -f '%U %S' -o "$out" "$@"; }
else # bash's `time` keyword measures the same; its report goes to the group's stderr, FILE
  timed() {
    local out=$1 TIMEFORMAT='%3U %3S'; shift
    { time "$@" 2>&3 3>&-; } 3>&2 2> "$out"
  }
fi
# cpu_of FILE: "user system" from timed's FILE (GNU time puts a line before it on failure)
cpu_of() { tail -n 1 "$1"; }

TIMES="$DIR/times.tsv" # cache, command, seconds, max RSS, phases, repeat, user, system, RSS per rank
record() { printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$TIMES"; }

caches=cold
[ $TMPFS = 1 ] && can_drop=0
[ $can_drop = 1 ] || [ $TMPFS = 1 ] || { echo "(not root: cannot drop the page cache; all runs are warm)" >&2; caches=warm; }
[ $WARM = 1 ] && [ $can_drop = 1 ] && caches="cold warm"
[ $WARM_ONLY = 1 ] && caches=warm
[ $TMPFS = 1 ] && caches=tmpfs
read -r -a EXTRA <<< "$RUN_ARGS"

for MEAN in "${MEAN_LIST[@]}"; do
  INPUT="$DIR/input-$SIZE-$MEAN-$IN_SHARDS-$SKEW"
  if [ ! -f "$INPUT/.complete" ]; then
    rm -rf "$INPUT"
    echo "generating $SIZE in $IN_SHARDS shards (mean sample $MEAN, skew $SKEW) at $INPUT" >&2
    "$BIN" generate --output "$INPUT" --shards "$IN_SHARDS" --total-size "$SIZE" --mean-size "$MEAN" \
      --skew "$SKEW" --seed 1 --long-names-every 97 >&2
    touch "$INPUT/.complete"
  fi
  BYTES=$(du -sb --exclude=.complete "$INPUT" | cut -f1)

  : > "$TIMES"
  load0=$(cut -d' ' -f1-3 /proc/loadavg)
  for cache in $caches; do
    for rep in $(seq "$REPEAT"); do
      rm -rf "$DIR/cp-out"
      if [ "$cache" = warm ]; then cat "$INPUT"/* > /dev/null; fi
      drop "$cache"
      t0=$(now_s)
      # shellcheck disable=SC2016 # $1 and $2 are expanded by sh -c
      timed "$CPU" sh -c 'cp -r "$1" "$2" && '"$SYNC" sh "$INPUT" "$DIR/cp-out"
      t1=$(now_s)
      read -r user sys < <(cpu_of "$CPU")
      rm -rf "$DIR/cp-out"
      record "$cache" "cp -r" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')" "-" "" "$rep" "$user" "$sys" ""
      for np in $NPS; do
        rm -rf "$DIR/out" "$DIR/report.json"
        if [ "$cache" = warm ]; then cat "$INPUT"/* > /dev/null; fi
        drop "$cache"
        t0=$(now_s)
        # shellcheck disable=SC2016 # $@ is expanded by sh -c
        timed "$CPU" sh -c '"$@" && '"$SYNC" sh mpirun -np "$np" "$BIN" run --input "$INPUT" \
          --output "$DIR/out" --shards "$OUT_SHARDS" --seed 7 --mem-limit "$MEM" \
          --report "$DIR/report.json" ${EXTRA[@]+"${EXTRA[@]}"} > "$DIR/run.log" 2>&1 || { cat "$DIR/run.log" "$CPU" >&2; exit 1; }
        t1=$(now_s)
        read -r user sys < <(cpu_of "$CPU")
        IFS='|' read -r rss ranks phases < <(python3 - "$DIR/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
rss = [x["peak_rss"] / 2**20 for x in r["per_rank"]]
print(f"{max(rss):.0f}MiB", ",".join(f"{x:.0f}" for x in rss) if 1 < len(rss) <= 4 else "",
      " ".join(f"{n}={s:.2f}" for n, s in r["phases"]["phases"]), sep="|")
PY
)
        record "$cache" "reshard np=$np" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')" "$rss" "$phases" \
          "$rep" "$user" "$sys" "$ranks"
        rm -rf "$DIR/out"
      done
    done
  done

  [ ${#MEAN_LIST[@]} = 1 ] || echo "== mean sample $MEAN: $(awk -v b="$BYTES" 'BEGIN{printf "%.2f", b/2^30}') GiB"
  python3 - "$TIMES" "$BYTES" <<'PY'
import sys, statistics
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
size = int(sys.argv[2])
gib = size / 2**30
cpu = lambda r: float(r[6]) + float(r[7])
print(f"{'cache':<6} {'command':<16} {'seconds':>8} {'range':>13} {'MB/s':>6} {'ratio':>6} "
      f"{'user':>7} {'sys':>7} {'CPU/GiB':>7} {'CPU/cp':>6} {'max RSS':>8} {'MiB/rank':>12}  "
      "phases of the median run (s)")
for cache in dict.fromkeys(r[0] for r in rows):
    runs = {}
    for r in rows:
        if r[0] == cache:
            runs.setdefault(r[1], []).append(r)
    def median_run(rs):
        return sorted(rs, key=lambda r: float(r[2]))[(len(rs) - 1) // 2]
    cp = float(median_run(runs["cp -r"])[2])
    cp_cpu = {r[5]: cpu(r) for r in runs["cp -r"]}  # repeat -> cp's CPU seconds
    for command, rs in runs.items():
        m = median_run(rs)
        secs = [float(r[2]) for r in rs]
        span = f"{min(secs):.2f}-{max(secs):.2f}" if len(rs) > 1 else ""
        s = float(m[2])
        user = statistics.median(float(r[6]) for r in rs)
        system = statistics.median(float(r[7]) for r in rs)
        per_gib = statistics.median(cpu(r) for r in rs) / gib
        vs_cp = statistics.median(cpu(r) / cp_cpu[r[5]] if cp_cpu[r[5]] else float("nan") for r in rs)
        print(f"{cache:<6} {command:<16} {s:>8.2f} {span:>13} {size / s / 1e6:>6.0f} {s / cp:>6.2f} "
              f"{user:>7.2f} {system:>7.2f} {per_gib:>7.2f} {vs_cp:>6.2f} {m[3]:>8} {m[8]:>12}  {m[4]}")
PY
  echo "data: $BYTES bytes in $IN_SHARDS shards at $INPUT; mem-limit $MEM; $(nproc) cores; median of $REPEAT; load average $load0 before, $(cut -d' ' -f1-3 /proc/loadavg) after" >&2
done
echo "user, sys, CPU/GiB: medians over the repeats, in CPU seconds; CPU/cp: median of (user + sys) / cp's in the same repeat" >&2
