#!/usr/bin/env bash
# Network-bound benchmark: reshard across simulated nodes whose links are capped, against the
# scaling model in docs/performance.md.
#
#   examples/netbench.sh [--size 2GiB] [--rate 1gbit] [--nodes 4] [--ppn 1] [--mean 100KiB]
#                        [--in-shards 64] [--out-shards 64] [--mem-limit 1GiB]
#                        [--dir netbench-data] [--cold] [--bin PATH]
#
# Builds a cluster of NODES network namespaces with tests/cluster/simcluster.sh (each node's link
# capped at RATE in both directions), generates the dataset once (kept in DIR), measures this
# machine's storage (a read of the dataset, a write of as many bytes with fsync), runs
# `reshard run` as NODES x PPN ranks and prints: wall time and phases, the bytes each node
# received against (1 - 1/n) * D / n, and the model's stage times, read D/n / B_read, network
# (1 - 1/n) * D/n / RATE, write D/n / B_write, whose maximum is the predicted time (the three
# overlap) and whose sum is what no overlap would cost. All nodes share this machine's storage,
# so a node's share of it is B/n and its storage stages take D / B. --cold drops the page cache
# before each measurement and the run. Needs root, iproute2, MPICH, python3. Figures only: it
# never fails on a slow result. Per-round timings of every rank (RESHARD_TRACE_ROUNDS=1) are in
# DIR/run.log (examples/timeline.py DIR/run.log summarizes them). --bin runs that reshard binary
# instead of building this checkout (to interleave runs of two builds).
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE=2GiB RATE=1gbit NODES=4 PPN=1 MEAN=100KiB IN_SHARDS=64 OUT_SHARDS=64 MEM=1GiB
DIR=netbench-data COLD=0 BIN=
while (($# > 0)); do
  case $1 in
    --size) SIZE=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --nodes) NODES=$2; shift 2 ;;
    --ppn) PPN=$2; shift 2 ;;
    --mean) MEAN=$2; shift 2 ;;
    --in-shards) IN_SHARDS=$2; shift 2 ;;
    --out-shards) OUT_SHARDS=$2; shift 2 ;;
    --mem-limit) MEM=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --cold) COLD=1; shift ;;
    --bin) BIN=$(realpath "$2"); shift 2 ;;
    -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "netbench.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $(id -u) == 0 ]] || { echo "netbench.sh: needs root (network namespaces)" >&2; exit 1; }

# RATE in bytes per second (tc units: kbit, mbit, gbit are powers of 1000).
rate_bytes() {
  [[ $1 =~ ^([0-9]+)([kmg]?)bit$ ]] || { echo "netbench.sh: bad rate $1" >&2; exit 2; }
  local mult=1
  case ${BASH_REMATCH[2]} in k) mult=1000 ;; m) mult=1000000 ;; g) mult=1000000000 ;; esac
  echo $((BASH_REMATCH[1] * mult / 8))
}
RATE_BYTES=$(rate_bytes "$RATE")

# UCX over TCP sends large messages by rendezvous (a handshake, then the data pulled by the
# receiver): measured here at 250mbit, 4 nodes, the exchange took 26-27 s that way and 18-20 s
# with eager sends. Set UCX_RNDV_THRESH yourself to compare.
export UCX_RNDV_THRESH=${UCX_RNDV_THRESH:-inf}

if [[ -z $BIN ]]; then
  cargo build --release --quiet
  BIN=$PWD/target/release/reshard
fi
SIM=$PWD/tests/cluster/simcluster.sh
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)

INPUT=$DIR/input-$SIZE-$MEAN-$IN_SHARDS
if [[ ! -f $INPUT/.complete ]]; then
  rm -rf "$INPUT"
  echo "generating $SIZE in $IN_SHARDS uneven shards (mean sample $MEAN) at $INPUT" >&2
  "$BIN" generate --output "$INPUT" --shards "$IN_SHARDS" --total-size "$SIZE" \
    --mean-size "$MEAN" --skew 3 --seed 1 >&2
  touch "$INPUT/.complete"
fi
BYTES=$(du -sb --exclude=.complete "$INPUT" | cut -f1)

drop() { if ((COLD)); then sync; echo 3 >/proc/sys/vm/drop_caches; fi; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }

# Storage, as this machine delivers it to all nodes together.
drop
t0=$(now); cat "$INPUT"/*.tar >/dev/null; READ_S=$(since "$t0")
t0=$(now)
dd if=/dev/zero of="$DIR/write-test" bs=4M count=$((BYTES / 4194304 + 1)) conv=fsync status=none
WRITE_S=$(since "$t0")
rm -f "$DIR/write-test"

# A cluster id of our own: `up` exits 3 while another live run holds one.
export SIMCLUSTER_OWNER=$$
id=$(($$ % 250 + 1))
for ((tries = 0; ; tries++)); do
  export SIMCLUSTER_ID=$id
  status=0
  "$SIM" up "$NODES" "$RATE" >&2 || status=$?
  ((status == 0)) && break
  if ((status != 3 || tries >= 250)); then echo "netbench.sh: cannot build the cluster" >&2; exit 1; fi
  id=$((id % 250 + 1))
done
trap '"$SIM" down' EXIT
trap 'exit 130' INT TERM

# Busy and total CPU time of the machine (all nodes share its cores), in clock ticks.
cpu_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 }' /proc/stat; }

mapfile -t BEFORE < <("$SIM" counters)
rm -rf "$DIR/out" "$DIR/report.json"
drop
read -r BUSY0 ALL0 < <(cpu_ticks)
t0=$(now)
(cd "$DIR" && RESHARD_TRACE_ROUNDS=1 "$SIM" run "$PPN" -- "$BIN" run --input "$INPUT" --output "$DIR/out" \
  --shards "$OUT_SHARDS" --seed 7 --mem-limit "$MEM" --report "$DIR/report.json") \
  >"$DIR/run.log" 2>&1 || { cat "$DIR/run.log" >&2; exit 1; }
WALL=$(since "$t0")
read -r BUSY1 ALL1 < <(cpu_ticks)
CPU=$(awk -v b=$((BUSY1 - BUSY0)) -v a=$((ALL1 - ALL0)) 'BEGIN { printf "%.0f", 100 * b / a }')
mapfile -t AFTER < <("$SIM" counters)
rm -rf "$DIR/out"

read -r SAMPLE_BYTES ROUNDS EXCHANGE PHASES < <(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
phases = r["phases"]["phases"]
print(r["sample_bytes"], r["rounds"], dict(phases).get("exchange", 0),
      " ".join(f"{p}={s:.2f}" for p, s in phases))
' "$DIR/report.json")

awk -v d="$SAMPLE_BYTES" -v n="$NODES" -v ppn="$PPN" -v rate="$RATE_BYTES" -v rname="$RATE" \
  -v rs="$READ_S" -v ws="$WRITE_S" -v wall="$WALL" -v phases="$PHASES" -v size="$SIZE" \
  -v before="${BEFORE[*]}" -v after="${AFTER[*]}" -v rounds="$ROUNDS" -v exch="$EXCHANGE" \
  -v cpu="$CPU" -v cores="$(nproc)" -v mem="$MEM" '
function mib(b) { return b / 1048576 }
function max(a, b) { return a > b ? a : b }
BEGIN {
  cross = (1 - 1 / n) * d / n
  printf "netbench: %s (%.1f MiB of samples) on %d nodes x %d rank(s), links capped at %s\n",
    size, mib(d), n, ppn, rname
  printf "wall time          %8.2f s   phases (s): %s\n", wall, phases
  printf "exchange           %d round(s) (--mem-limit %s); CPU busy %d%% of %d cores during the run\n",
    rounds, mem, cpu, cores
  nb = split(before, b, " "); split(after, a, " ")
  printf "received per node  model (1 - 1/%d) * D / %d = %.1f MiB\n", n, n, mib(cross)
  busiest = 0
  for (i = 0; i < nb / 4; i++) {
    rx = a[4 * i + 3] - b[4 * i + 3]; tx = a[4 * i + 4] - b[4 * i + 4]
    printf "  node %d           %8.1f MiB received (%.2fx the model), %.1f MiB sent\n",
      i, mib(rx), rx / cross, mib(tx)
    busiest = max(busiest, max(rx, tx))
  }
  read_t = rs; write_t = ws; net_t = cross / rate
  pred = max(read_t, max(net_t, write_t))
  printf "model stages       read %.2f s (D / %.0f MB/s), network %.2f s, write %.2f s (D / %.0f MB/s)\n",
    read_t, d / rs / 1e6, net_t, write_t, d / ws / 1e6
  printf "predicted          %8.2f s   (the slowest stage; without overlap the sum: %.2f s)\n",
    pred, read_t + net_t + write_t
  printf "measured/predicted %8.2f   (exchange phase / network stage: %.2f)\n", wall / pred, exch / net_t
  # Whole input shards and whole samples make some node carry more than its share by the model;
  # the exchange cannot end before its link has carried it.
  printf "busiest link       %8.1f MiB: %.2f s at %s (exchange phase / that: %.2f)\n",
    mib(busiest), busiest / rate, rname, exch / (busiest / rate)
}'
