#!/usr/bin/env bash
# Benchmark: a reshuffle beside training (`examples/bench.sh --beside` runs this). A training
# stand-in reads epoch N with webdataset at full speed while reshard writes epoch N+1 on the same
# disk. Reports, from one run, the reader's throughput alone, beside an unlimited reshard, and
# beside reshard at two write (and read) limits; and reshard's achieved rate against its limit.
#
#   examples/bench.sh --beside [--size 1GiB] [--mean 100KiB] [--np 2] [--limits "A B"]
#                              [--dir bench-beside] [--python PATH]
#
# --limits: the two limits (rates such as 200MiB/s) given to both --max-read-rate and
# --max-write-rate; by default half and a quarter of the disk's write bandwidth, measured here
# first (a direct write of 256 MiB). The reader's pages are dropped from the page cache before
# each pass (posix_fadvise DONTNEED, no root needed), and so are reshard's inputs before each run,
# so both read the disk. The reader runs in passes over epoch N until reshard has finished (or,
# alone, for as long as the unlimited reshard took); its throughput is over that time. Figures,
# never assertions.
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE=1GiB MEAN=100KiB NP=2 LIMITS="" DIR=bench-beside PY=${RESHARD_TEST_PYTHON:-target/pyenv/bin/python}
while [ $# -gt 0 ]; do
  case "$1" in
    --size) SIZE=$2; shift 2;;
    --mean) MEAN=$2; shift 2;;
    --np) NP=$2; shift 2;;
    --limits) LIMITS=$2; shift 2;;
    --dir) DIR=$2; shift 2;;
    --python) PY=$2; shift 2;;
    -h|--help) sed -n '2,17p' "$0"; exit 0;;
    *) echo "bench-beside.sh: unknown option $1" >&2; exit 2;;
  esac
done
"$PY" -c 'import webdataset' 2>/dev/null || { echo "bench-beside.sh: $PY has no webdataset (--python PATH)" >&2; exit 2; }
cargo build --release --quiet
BIN=$PWD/target/release/reshard
mkdir -p "$DIR"
INPUT="$DIR/input-$SIZE-$MEAN"
if [ ! -f "$INPUT/.complete" ]; then
  rm -rf "$INPUT"
  "$BIN" generate --output "$INPUT" --shards 32 --total-size "$SIZE" --mean-size "$MEAN" --seed 1 >&2
  touch "$INPUT/.complete"
fi
# Epoch N, what training reads: a reshuffle of the input, written once.
EPOCH_N="$DIR/epoch-n"
[ -f "$EPOCH_N/index.json" ] || "$BIN" run --input "$INPUT" --output "$EPOCH_N" --shards 32 --seed 7 --epoch 0 > /dev/null

# evict FILES...: drops their clean pages from the page cache.
evict() { "$PY" -c 'import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY); os.fdatasync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$@"; }

if [ -z "$LIMITS" ]; then
  # The disk's write bandwidth: 256 MiB written direct (no page cache) and synced.
  bw=$("$PY" - "$DIR/bandwidth.tmp" <<'PY'
import os, sys, time, mmap
buf = mmap.mmap(-1, 8 << 20); buf.write(os.urandom(8 << 20))
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT)
t = time.monotonic()
for _ in range(32):
    os.write(fd, buf)
os.fsync(fd); os.close(fd); os.unlink(sys.argv[1])
print(int((256 << 20) / (time.monotonic() - t)))
PY
)
  LIMITS="$((bw / 2))/s $((bw / 4))/s"
  echo "disk write bandwidth: $((bw >> 20)) MiB/s (direct, 256 MiB): limits $LIMITS" >&2
fi

# The training stand-in: passes over epoch N with webdataset until STOP exists or SECONDS pass;
# prints "bytes seconds".
READER="$DIR/reader.py"
cat > "$READER" <<'PY'
import glob, os, sys, time
import webdataset as wds
root, stop, limit = sys.argv[1], sys.argv[2], float(sys.argv[3])
shards = sorted(glob.glob(os.path.join(root, "*.tar")))
start, moved, done = time.monotonic(), 0, False
while not done:
    for p in shards:
        fd = os.open(p, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
    for sample in wds.WebDataset(shards, shardshuffle=False, empty_check=False):
        moved += sum(len(v) for v in sample.values() if isinstance(v, bytes))
        if os.path.exists(stop) or time.monotonic() - start > limit:
            done = True
            break
print(moved, time.monotonic() - start)
PY

RESULTS="$DIR/beside.tsv"
: > "$RESULTS"
# reshard_run LIMIT: writes epoch N+1 (LIMIT "": no limit); prints "seconds achieved-line".
reshard_run() {
  local limit=$1 args=()
  [ -n "$limit" ] && args=(--max-read-rate "$limit" --max-write-rate "$limit")
  rm -rf "$DIR/epoch-n1"
  evict "$INPUT"/*.tar
  local t0 t1
  t0=$(date +%s.%N)
  mpirun -np "$NP" "$BIN" run --input "$INPUT" --output "$DIR/epoch-n1" --shards 32 --seed 7 \
    --epoch 1 ${args[@]+"${args[@]}"} > "$DIR/run.log" 2>&1 || { cat "$DIR/run.log" >&2; exit 1; }
  sync
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}'
}
# beside CASE LIMIT: the reader beside a reshard at LIMIT; records a row.
beside() {
  local case=$1 limit=$2 stop="$DIR/stop" secs
  rm -f "$stop"
  "$PY" "$READER" "$EPOCH_N" "$stop" 3600 > "$DIR/reader.out" &
  local reader=$!
  secs=$(reshard_run "$limit")
  touch "$stop"
  wait "$reader"
  local achieved
  achieved=$(grep -o 'write limit [^:]*: achieved [0-9.]* [KMGT]iB/s' "$DIR/run.log" | sed 's/.*achieved //' || true)
  printf '%s\t%s\t%s\t%s\t%s\n' "$case" "$(cat "$DIR/reader.out")" "$secs" "${limit:--}" "${achieved:--}" >> "$RESULTS"
  echo "$secs"
}

UNLIMITED=$(beside "beside unlimited" "")
# Alone: as long as the unlimited reshard took (at least 5 s).
ALONE=$(awk -v s="$UNLIMITED" 'BEGIN{print (s < 5 ? 5 : s)}')
evict "$EPOCH_N"/*.tar
printf '%s\t%s\t-\t-\t-\n' "alone" "$("$PY" "$READER" "$EPOCH_N" "$DIR/never" "$ALONE")" >> "$RESULTS"
for limit in $LIMITS; do
  beside "beside limit $limit" "$limit" > /dev/null
done
rm -rf "$DIR/epoch-n1"

"$PY" - "$RESULTS" "$(du -sb "$INPUT" | cut -f1)" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
size = int(sys.argv[2])
alone = next(float(r[1].split()[0]) / float(r[1].split()[1]) for r in rows if r[0] == "alone")
def rate(text):
    if text.endswith("/s") and text[:-2].isdigit():
        return int(text[:-2])
    n, unit = text.split()
    return float(n) * {"KiB/s": 2**10, "MiB/s": 2**20, "GiB/s": 2**30}[unit]
print(f"{'case':<34} {'reader MB/s':>11} {'vs alone':>8} {'reshard s':>9} {'reshard MB/s':>12} {'limit MB/s':>10} {'achieved/limit':>14}")
for case, reader, secs, limit, achieved in sorted(rows, key=lambda r: r[0] != "alone"):
    b, s = map(float, reader.split())
    mbs = b / s / 1e6
    rs = f"{size / float(secs) / 1e6:.0f}" if secs != "-" else "-"
    lim = f"{rate(limit) / 1e6:.0f}" if limit != "-" else "-"
    ratio = f"{rate(achieved) / rate(limit):.2f}" if achieved != "-" and limit != "-" else "-"
    print(f"{case:<34} {mbs:>11.0f} {mbs / (alone / 1e6):>8.2f} {secs:>9} {rs:>12} {lim:>10} {ratio:>14}")
PY
echo "reshard: $NP ranks, input $SIZE (mean sample $MEAN) read and epoch N+1 written beside the reader; achieved: over the whole run (summary line)" >&2
