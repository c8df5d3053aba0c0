#!/usr/bin/env bash
# Regenerates the fuzz seeds of issue 13's tar cases in corpus/tar_index/ with the real tools:
# GNU tar sparse members (gnu and oldgnu with an extension block; PAX sparse 0.0, 0.1 and 1.0),
# a volume label, headers with checksums summed over signed bytes, links inside a sample and a
# JPEG. Each seed is a few KiB (blocking factor 1). Needs GNU tar and python3.
#
# The bytes are not reproducible to the bit: GNU tar puts its process id in PAX sparse 0.1 and
# 1.0 placeholder names (GNUSparseFile.<pid>/...). Regenerate only to change the cases.
set -euo pipefail

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")"
OUT=$PWD/corpus/tar_index
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
mkdir s

# Sparse files: 512-byte data regions, each in its own 4 KiB filesystem block, with whole blocks
# of holes between them (GNU tar takes a file for sparse only when it has fewer blocks allocated
# than its size says, then finds the regions by scanning for zeros), so that six regions take
# 3 KiB in the archive. s/a.bin has one region and a trailing hole; s/b.bin has six regions, two
# more than an old GNU header holds.
python3 - <<'EOF'
def sparse(name, length, regions):
    with open(name, "wb") as f:
        f.truncate(length)
        for i, at in enumerate(regions):
            f.seek(at)
            f.write(bytes((j * 7 + i) % 251 + 1 for j in range(512)))
sparse("s/a.bin", 16384, [0])
sparse("s/b.bin", 7 * 8192, [4096 + 8192 * i for i in range(6)])
for name, data in [("s/a.cls", b"1\n"), ("s/b.cls", b"2\n"), ("s/c.txt", b"three\n")]:
    open(name, "wb").write(data)
EOF

T=(tar -b 1 --sparse --hole-detection=raw --mtime=@1700000000 --owner=0 --group=0 --numeric-owner)
PAX=("--pax-option=delete=atime,delete=ctime,exthdr.name=%d/PaxHeaders/%f")
MEMBERS=(s/a.bin s/a.cls s/b.cls s/b.bin s/c.txt)
"${T[@]}" --format=gnu -cf "$OUT/sparse-gnu-ext.tar" "${MEMBERS[@]}"
"${T[@]}" --format=oldgnu -cf "$OUT/sparse-oldgnu-ext.tar" "${MEMBERS[@]}"
"${T[@]}" "${PAX[@]}" --format=posix --sparse-version=0.0 -cf "$OUT/sparse-pax-0.0.tar" "${MEMBERS[@]}"
"${T[@]}" "${PAX[@]}" --format=posix --sparse-version=0.1 -cf "$OUT/sparse-pax-0.1.tar" "${MEMBERS[@]}"
"${T[@]}" "${PAX[@]}" --format=posix --sparse-version=1.0 -cf "$OUT/sparse-pax-1.0.tar" "${MEMBERS[@]}"
"${T[@]}" --format=gnu -V "seed volume" -cf "$OUT/volume-label.tar" s/a.cls s/c.txt

# Links between members of one sample: a hard link (type 1) and a symlink (type 2).
cp s/c.txt s/l.txt
ln s/l.txt s/l.dat
ln -s l.txt s/l.lnk
"${T[@]}" --format=gnu -cf "$OUT/link-in-sample.tar" s/l.txt s/l.dat s/l.lnk s/c.txt

# A ustar archive with non-ASCII names whose checksums are rewritten as signed sums; a JPEG.
python3 - "$OUT" <<'EOF'
import io, sys, tarfile
out = sys.argv[1]
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
    for name, data in [("s/d\u00e9j\u00e0.jpg", b"x" * 600), ("s/d\u00e9j\u00e0.cls", b"4\n"),
                       ("s/e.txt", b"e\n")]:
        ti = tarfile.TarInfo(name)
        ti.size, ti.mtime, ti.mode = len(data), 1700000000, 0o644
        tf.addfile(ti, io.BytesIO(data))
b = bytearray(buf.getvalue())
at = 0
while at + 512 <= len(b) and any(b[at:at + 512]):
    h = b[at:at + 512]
    size = int(h[124:136].strip(b"\0 ") or b"0", 8)
    if any(x >= 0x80 for x in h):
        h[148:156] = b" " * 8
        signed = sum(x - 256 if x >= 0x80 else x for x in h)
        h[148:156] = b"%06o\0 " % signed
        b[at:at + 512] = h
    at += 512 + (size + 511) // 512 * 512
open(out + "/signed-checksum.tar", "wb").write(b)
jpeg = bytes([0xFF, 0xD8, 0xFF, 0xE0, 0, 0x10]) + b"JFIF\0\1\1\0\0\1\0\1\0\0"
open(out + "/jpeg.tar", "wb").write(jpeg + bytes(range(256)) * 4 + b"\xff\xd9")
EOF
ls -l "$OUT"
