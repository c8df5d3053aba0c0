#!/usr/bin/env bash
# examples/bench-files.sh: `reshard run --input-files` against GNU `tar -cf` of the same tree of
# loose files (one stream, the classic way), at several rank counts, interleaved, medians.
#
#   examples/bench-files.sh [--dir DIR] [--files N] [--dirs D] [--size BYTES] [--np "1 2"]
#                           [--repeat R] [--keep-tree] [--shardwriter PYTHON]
#
# Builds (once, deterministically: sizes vary +-50% around --size, bytes from a seeded PRNG) a
# tree of N files in D directories under DIR/tree, then per repeat runs `tar -cf` and reshard at
# each rank count in turn, each writing under DIR and removing what it wrote. With
# --shardwriter, also the serial script a user writes today (PYTHON has webdataset): list the
# tree, group files into samples by WebDataset's key rule, shuffle the samples (seed 1), write
# 256 MiB shards with webdataset's ShardWriter. Prints per tool:
# median seconds, files/s, MiB/s, peak RSS (tar: the process; reshard: the largest rank, from
# its summary, and /usr/bin/time's largest process). Caches stay warm (the machine is shared:
# nothing is dropped); the load average is printed before and after.
set -euo pipefail
dir=/tmp/bench-files files=200000 dirs=1000 size=8192 nps="1 2" repeat=3 keep=0 sw=""
while [ $# -gt 0 ]; do
  case $1 in
    --dir) dir=$2; shift 2;; --files) files=$2; shift 2;; --dirs) dirs=$2; shift 2;;
    --size) size=$2; shift 2;; --np) nps=$2; shift 2;; --repeat) repeat=$2; shift 2;;
    --keep-tree) keep=1; shift;;
    --shardwriter) sw=$2; shift 2;;
    -h|--help) sed -n '2,17p' "$0"; exit 0;;
    *) echo "unknown argument $1" >&2; exit 2;;
  esac
done
reshard=${RESHARD:-$(dirname "$0")/../target/release/reshard}
mkdir -p "$dir"
tree=$dir/tree
if [ ! -e "$tree/.done" ]; then
  rm -rf "$tree"
  python3 - "$tree" "$files" "$dirs" "$size" <<'PY'
import os, random, sys
root, files, dirs, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(1)
blob = rng.randbytes(4 * size)
for d in range(dirs):
    os.makedirs(f"{root}/d{d:05d}", exist_ok=True)
for i in range(files):
    n = rng.randint(size // 2, size * 3 // 2)
    off = rng.randint(0, len(blob) - n)
    with open(f"{root}/d{i % dirs:05d}/f{i:08d}.bin", "wb") as f:
        f.write(blob[off:off + n])
PY
  touch "$tree/.done"
fi
bytes=$(du -sb --exclude=.done "$tree" | cut -f1)
echo "tree: $files files in $dirs directories, $bytes bytes, under $dir; load: $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A secs rss ranks
for r in $(seq "$repeat"); do
  t0=$(date +%s.%N)
  /usr/bin/time -f "%M" -o "$dir/time" tar -cf "$dir/out.tar" -C "$tree" --exclude=.done .
  t1=$(date +%s.%N)
  secs[tar]+="$(echo "$t1 - $t0" | bc) "; rss[tar]+="$(cat "$dir/time") "
  rm -f "$dir/out.tar"
  if [ -n "$sw" ]; then
    mkdir -p "$dir/sw"
    t0=$(date +%s.%N)
    /usr/bin/time -f "%M" -o "$dir/time" "$sw" - "$tree" "$dir/sw" <<'PY'
import os, random, sys
import webdataset as wds
root, out = sys.argv[1], sys.argv[2]
samples = {}
for d, subdirs, names in os.walk(root):
    subdirs.sort()
    for n in sorted(names):
        if n.startswith("."):
            continue
        rel = os.path.relpath(os.path.join(d, n), root)
        head, base = os.path.split(rel)
        stem, _, ext = base.partition(".")
        samples.setdefault(os.path.join(head, stem), []).append((ext, os.path.join(d, n)))
keys = sorted(samples)
random.Random(1).shuffle(keys)
with wds.ShardWriter(f"{out}/shard-%06d.tar", maxsize=256 << 20, verbose=0) as w:
    for k in keys:
        s = {"__key__": k}
        for ext, path in samples[k]:
            with open(path, "rb") as f:
                s[ext] = f.read()
        w.write(s)
PY
    t1=$(date +%s.%N)
    secs[shardwriter]+="$(echo "$t1 - $t0" | bc) "; rss[shardwriter]+="$(cat "$dir/time") "
    rm -rf "$dir/sw"
  fi
  for np in $nps; do
    t0=$(date +%s.%N)
    /usr/bin/time -f "%M" -o "$dir/time" mpirun -np "$np" "$reshard" run --input-files "$tree" \
      --output "$dir/out" --shard-size 256MiB --seed 1 --progress none >"$dir/summary" 2>"$dir/log"
    t1=$(date +%s.%N)
    secs[np$np]+="$(echo "$t1 - $t0" | bc) "
    rss[np$np]+="$(cat "$dir/time") "
    ranks[np$np]+="$(grep 'peak RSS' "$dir/summary" | awk '{print $(NF-4)$(NF-3)}') "
    rm -rf "$dir/out"
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf '%-11s %10s %12s %10s %16s %s\n' tool "median s" "files/s" "MiB/s" "max RSS (KiB)" "largest rank (reshard)"
for t in tar ${sw:+shardwriter} $(for np in $nps; do echo np$np; done); do
  m=$(echo "${secs[$t]}" | median)
  printf '%-11s %10.2f %12.0f %10.1f %16s %s   (runs: %s)\n' "$t" "$m" "$(echo "$files / $m" | bc -l)" \
    "$(echo "$bytes / 1048576 / $m" | bc -l)" "$(echo "${rss[$t]}" | median)" "${ranks[$t]:-}" "${secs[$t]}"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
[ "$keep" = 1 ] || rm -rf "$tree"
