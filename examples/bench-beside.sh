#!/usr/bin/env bash
# Benchmark: a reshuffle beside training (`examples/bench.sh --beside` runs this). A training
# stand-in reads epoch N with webdataset while reshard writes epoch N+1 on the same disk.
# Reports, from one run, side by side: the reader's throughput alone, beside an unlimited
# reshard, and beside reshard at two limits; reshard's achieved rate against its limit. The reader
# runs at full speed and at a fixed rate (training that consumes at its own pace).
#
#   examples/bench.sh --beside [--size 4GiB] [--mean 100KiB] [--np 2] [--repeat 3]
#                              [--fractions "2 4"] [--limits "A B"] [--reader-rate BYTES]
#                              [--alone-seconds 20] [--run-args "--nice 19"] [--also "--nice 19"]
#                              [--bin PATH] [--dir bench-beside] [--input-dir DIR] [--python PATH]
#
# The disk's write bandwidth is measured first, in the same run: 1 GiB of random bytes written
# with O_DIRECT and fsynced, three times, the median. The limits (given to both --max-read-rate
# and --max-write-rate) are that bandwidth divided by each of --fractions (default half and a
# quarter) unless --limits gives them. --reader-rate (bytes per second) is the fixed-rate reader's
# pace; by default half of what a first, discarded full-speed pass reached.
#
# The cases: the reader alone; reshard alone (unlimited, no reader: what it reaches by itself,
# so whether a limit binds at all); the reader beside an unlimited reshard, and beside reshard at
# each limit; with --also FLAGS, beside reshard at the first limit with FLAGS added too (say
# "--nice 19 --io-priority low", to see what of the rest is the CPU). --run-args go to every run.
#
# Each repeat runs every case for both reader modes, in an order rotated from one repeat to the
# next (a virtual disk's speed drifts between minutes); the table gives medians. Before every case
# the page cache is dropped (as root: `sync; echo 3 > /proc/sys/vm/drop_caches`; otherwise the
# files' pages are dropped with posix_fadvise), and the reader drops epoch N's pages before each
# pass, so both read the disk. A reader beside reshard runs until reshard (and its `sync`) is
# done; alone, for --alone-seconds. With every figure the machine's state is recorded: the
# 1-minute load average at the end of the case and the share of the case's time during which
# some task stalled on I/O (/proc/pressure/io "some" and "full") and on the CPU
# (/proc/pressure/cpu "some"), so a figure taken while other work ran shows it. Rows go to
# DIR/beside.tsv. Figures, never assertions: this script does not fail on slow results.
#
# --input-dir puts reshard's input elsewhere (default: DIR), e.g. on /dev/shm when the disk has
# no room for three copies: reshard then reads from memory and only its writes meet the reader.
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE=4GiB MEAN=100KiB NP=2 LIMITS="" FRACTIONS="2 4" DIR=bench-beside REPEAT=3 READER_RATE=""
ALONE_SECONDS=20 RUN_ARGS="" ALSO="" BIN="" INPUT_DIR="" PY=${RESHARD_TEST_PYTHON:-target/pyenv/bin/python}
while [ $# -gt 0 ]; do
  case "$1" in
    --size) SIZE=$2; shift 2;;
    --mean) MEAN=$2; shift 2;;
    --np) NP=$2; shift 2;;
    --repeat) REPEAT=$2; shift 2;;
    --fractions) FRACTIONS=$2; shift 2;;
    --limits) LIMITS=$2; shift 2;;
    --reader-rate) READER_RATE=$2; shift 2;;
    --alone-seconds) ALONE_SECONDS=$2; shift 2;;
    --run-args) RUN_ARGS=$2; shift 2;;
    --also) ALSO=$2; shift 2;;
    --bin) BIN=$(realpath "$2"); shift 2;;
    --dir) DIR=$2; shift 2;;
    --input-dir) INPUT_DIR=$2; shift 2;;
    --python) PY=$2; shift 2;;
    -h|--help) sed -n '2,36p' "$0"; exit 0;;
    *) echo "bench-beside.sh: unknown option $1" >&2; exit 2;;
  esac
done
"$PY" -c 'import webdataset' 2>/dev/null || { echo "bench-beside.sh: $PY has no webdataset (--python PATH)" >&2; exit 2; }
if [ -z "$BIN" ]; then
  cargo build --release --quiet
  BIN=$PWD/target/release/reshard
fi
INPUT_DIR=${INPUT_DIR:-$DIR}
mkdir -p "$DIR" "$INPUT_DIR"
INPUT="$INPUT_DIR/input-$SIZE-$MEAN"
if [ ! -f "$INPUT/.complete" ]; then
  rm -rf "$INPUT"
  "$BIN" generate --output "$INPUT" --shards 32 --total-size "$SIZE" --mean-size "$MEAN" --seed 1 >&2
  touch "$INPUT/.complete"
fi
# Epoch N, what training reads: a reshuffle of the input, written once.
EPOCH_N="$DIR/epoch-n-$SIZE-$MEAN"
[ -f "$EPOCH_N/index.json" ] || "$BIN" run --input "$INPUT" --output "$EPOCH_N" --shards 32 --seed 7 --epoch 0 > /dev/null

# cold FILES...: nothing of FILES (or, as root, of anything) left in the page cache.
cold() {
  if [ -w /proc/sys/vm/drop_caches ]; then
    sync; echo 3 > /proc/sys/vm/drop_caches
  else
    "$PY" -c 'import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY); os.fdatasync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$@"
  fi
}

# The machine's state: "load1 io-some-us io-full-us cpu-some-us" (PSI totals in microseconds).
state() {
  local io cpu
  io=$(sed -n 's/.*total=//p' /proc/pressure/io | tr '\n' ' ')
  cpu=$(sed -n '1s/.*total=//p' /proc/pressure/cpu)
  echo "$(cut -d' ' -f1 /proc/loadavg) $io $cpu"
}
# pressure T0 STATE0 STATE1: "load1 io-some% io-full% cpu-some%" over the T0..now interval.
pressure() {
  awk -v t0="$1" -v t1="$(date +%s.%N)" -v a="$2" -v b="$3" 'BEGIN{
    split(a, x, " "); split(b, y, " "); d = (t1 - t0) * 1e4;
    printf "%s %.0f %.0f %.0f", y[1], (y[2]-x[2])/d, (y[3]-x[3])/d, (y[4]-x[4])/d }'
}

# The disk's write bandwidth, bytes per second: 1 GiB written direct (no page cache) and synced.
write_bandwidth() {
  "$PY" - "$DIR/bandwidth.tmp" <<'PY'
import os, sys, time, mmap
buf = mmap.mmap(-1, 8 << 20); buf.write(os.urandom(8 << 20))
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT)
t = time.monotonic()
for _ in range(128):
    os.write(fd, buf)
os.fsync(fd); os.close(fd); os.unlink(sys.argv[1])
print(int((1 << 30) / (time.monotonic() - t)))
PY
}
median() { sort -n | awk '{v[NR]=$1} END{print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }

RESULTS="$DIR/beside.tsv"
: > "$RESULTS"
if [ -z "$LIMITS" ]; then
  bws=""
  for _ in 1 2 3; do
    t0=$(date +%s.%N) s0=$(state)
    bw=$(write_bandwidth)
    printf 'disk\t%s\t%s\n' "$bw" "$(pressure "$t0" "$s0" "$(state)")" >> "$RESULTS"
    bws+="$bw"$'\n'
  done
  bw=$(printf '%s' "$bws" | median)
  LIMITS=""
  for f in $FRACTIONS; do LIMITS+="$((bw / f))/s "; done
  echo "disk write bandwidth: $((bw >> 20)) MiB/s (direct, 1 GiB, median of 3): limits $LIMITS" >&2
fi

# The training stand-in: passes over epoch N with webdataset, at RATE bytes per second (0: as
# fast as it can), until STOP exists or SECONDS pass; prints "bytes seconds most-behind", the
# last the longest it fell behind its fixed-rate schedule (seconds; 0 at full speed).
READER="$DIR/reader.py"
cat > "$READER" <<'PY'
import glob, os, sys, time
import webdataset as wds
root, stop, limit, rate = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
shards = sorted(glob.glob(os.path.join(root, "*.tar")))
start, moved, done, behind = time.monotonic(), 0, False, 0.0
while not done:
    for p in shards:
        fd = os.open(p, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
    for sample in wds.WebDataset(shards, shardshuffle=False, empty_check=False):
        moved += sum(len(v) for v in sample.values() if isinstance(v, bytes))
        now = time.monotonic() - start
        if rate > 0:
            due = moved / rate
            behind = max(behind, now - due)
            if due > now:
                time.sleep(due - now)
        if os.path.exists(stop) or now > limit:
            done = True
            break
print(moved, time.monotonic() - start, f"{behind:.2f}")
PY

if [ -z "$READER_RATE" ]; then
  cold "$EPOCH_N"/*.tar
  READER_RATE=$("$PY" "$READER" "$EPOCH_N" "$DIR/never" "$ALONE_SECONDS" 0 | awk '{printf "%d", $1 / $2 / 2}')
  echo "fixed-rate reader: $((READER_RATE / 1000000)) MB/s (half of a first full-speed pass)" >&2
fi

# reshard_run LIMIT [FLAGS]: writes epoch N+1 (LIMIT "": no limit) and syncs; prints its seconds.
reshard_run() {
  local limit=$1 args=() t0 t1
  [ -n "$limit" ] && args=(--max-read-rate "$limit" --max-write-rate "$limit")
  # shellcheck disable=SC2206 # FLAGS is a list of flags
  [ -n "${2:-}" ] && args+=($2)
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086 # RUN_ARGS is a list of flags
  mpirun -np "$NP" "$BIN" run --input "$INPUT" --output "$DIR/epoch-n1" --shards 32 --seed 7 \
    --epoch 1 ${args[@]+"${args[@]}"} $RUN_ARGS > "$DIR/run.log" 2>&1 || { cat "$DIR/run.log" >&2; exit 1; }
  sync
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}'
}
# one REP MODE CASE LIMIT [FLAGS]: one case (CASE "alone": the reader alone; "reshard alone":
# no reader); appends a row.
one() {
  local rep=$1 mode=$2 case=$3 limit=$4 flags=${5:-} stop="$DIR/stop" rate=0 secs=- achieved=- reader t0 s0
  [ "$mode" = fixed ] && rate=$READER_RATE
  rm -rf "$DIR/epoch-n1" "$stop"
  cold "$INPUT"/*.tar "$EPOCH_N"/*.tar
  t0=$(date +%s.%N) s0=$(state)
  if [ "$case" = alone ]; then
    reader=$("$PY" "$READER" "$EPOCH_N" "$DIR/never" "$ALONE_SECONDS" "$rate")
  elif [ "$case" = "reshard alone" ]; then
    secs=$(reshard_run "" "")
    reader="0 1 0"
  else
    "$PY" "$READER" "$EPOCH_N" "$stop" 3600 "$rate" > "$DIR/reader.out" &
    local pid=$!
    secs=$(reshard_run "$limit" "$flags")
    touch "$stop"
    wait "$pid"
    reader=$(cat "$DIR/reader.out")
    achieved=$(sed -n 's/.*write limit [^:]*: achieved [^(]*(\([0-9.]*\) \([KMGT]\)iB in \([0-9.]*\) s.*/\1 \2 \3/p' "$DIR/run.log" |
      awk '{m = index("KMGT", $2); printf "%d", $1 * 1024^m / $3}')
    [ -n "$achieved" ] || achieved=-
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$rep" "$mode" "$case" "$reader" "$secs" "${limit:--}" \
    "$achieved" "$(pressure "$t0" "$s0" "$(state)")" "$(date -u +%H:%M:%S)" >> "$RESULTS"
  echo "repeat $rep, $mode reader, $case: $(tail -1 "$RESULTS" | cut -f4-)" >&2
}

CASES=(alone unlimited)
for limit in $LIMITS; do CASES+=("limit $limit"); done
[ -n "$ALSO" ] && CASES+=("limit ${LIMITS%% *} with $ALSO")
for rep in $(seq "$REPEAT"); do
  n=${#CASES[@]}
  # Reshard alone once per repeat: the reader's mode does not matter to it.
  one "$rep" full "reshard alone" ""
  for mode in full fixed; do
    for i in $(seq 0 $((n - 1))); do
      case="${CASES[$(((i + rep - 1) % n))]}"
      limit="" flags=""
      if [ "${case#limit }" != "$case" ]; then
        limit=${case#limit }
        limit=${limit%% with *}
        [ "${case#* with }" != "$case" ] && flags=${case#* with }
      fi
      one "$rep" "$mode" "$case" "$limit" "$flags"
    done
  done
done
rm -rf "$DIR/epoch-n1"

"$PY" - "$RESULTS" "$(du -sb --exclude=.complete "$INPUT" | cut -f1)" "$READER_RATE" <<'PY'
import statistics as st, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
size, reader_rate = int(sys.argv[2]), float(sys.argv[3])
med = st.median
disk = [r for r in rows if r[0] == "disk"]
if disk:
    print("disk write bandwidth (direct, 1 GiB): " + ", ".join(
        f"{int(r[1]) / 1e6:.0f} MB/s (load {r[2].split()[0]}, io some {r[2].split()[1]}%)" for r in disk))
runs = [r for r in rows if r[0] != "disk"]
def mbs(r):
    b, s, _ = r[3].split()
    return float(b) / float(s) / 1e6
def label(case):
    """"limit 677629820/s with --nice 19" -> "limit 678 MB/s + --nice 19"."""
    if not case.startswith("limit "):
        return case
    rate, _, flags = case[6:].partition(" with ")
    return f"limit {int(rate[:-2]) / 1e6:.0f} MB/s" + (f" + {flags}" if flags else "")
for mode in ("full", "fixed"):
    mine = [r for r in runs if r[1] == mode]
    reps = sorted({r[0] for r in mine})
    alone = {r[0]: mbs(r) for r in mine if r[2] == "alone"}
    title = "full-speed reader" if mode == "full" else f"fixed-rate reader ({reader_rate / 1e6:.0f} MB/s)"
    print(f"\n{title}, medians of {len(reps)} (range)")
    print(f"{'case':<40} {'reader MB/s':>15} {'vs alone':>8} {'behind s':>8} {'reshard s':>9}"
          f" {'reshard MB/s':>12} {'limit MB/s':>10} {'achieved/limit':>16} {'load1':>5} {'io some/full %':>14} {'cpu some %':>10}")
    for case in dict.fromkeys(r[2] for r in mine):
        rs = [r for r in mine if r[2] == case]
        m = [mbs(r) for r in rs if case != "reshard alone"]
        vs = [mbs(r) / alone[r[0]] for r in rs if r[0] in alone and case != "reshard alone"]
        behind = med(float(r[3].split()[2]) for r in rs)
        secs = [float(r[4]) for r in rs if r[4] != "-"]
        lim = float(rs[0][5][:-2]) if rs[0][5] != "-" else None
        ach = [int(r[6]) / lim for r in rs if r[6] != "-" and lim]
        p = [r[7].split() for r in rs]
        cell = lambda v, f: f"{f(med(v))} ({f(min(v))}-{f(max(v))})" if v else "-"
        print(f"{label(case)[:40]:<40} {cell(m, lambda x: f'{x:.0f}'):>15} {f'{med(vs):.2f}' if vs else '-':>8}"
              f" {behind:>8.2f} {f'{med(secs):.1f}' if secs else '-':>9}"
              f" {f'{size / med(secs) / 1e6:.0f}' if secs else '-':>12} {f'{lim / 1e6:.0f}' if lim else '-':>10}"
              f" {cell(ach, lambda x: f'{x:.2f}'):>16} {med(float(x[0]) for x in p):>5.1f}"
              f" {f'{med(int(x[1]) for x in p)}/{med(int(x[2]) for x in p)}':>14} {med(int(x[3]) for x in p):>10}")
PY
echo "reshard: $NP ranks, input $SIZE (mean sample $MEAN) read and epoch N+1 written beside the reader${RUN_ARGS:+, flags $RUN_ARGS}; achieved: the summary's write rate over the whole run; vs alone: median of each repeat's ratio to that repeat's reader alone; behind: the longest the fixed-rate reader fell behind its schedule; load1, io/cpu some: the machine during the case" >&2
