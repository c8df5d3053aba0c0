#!/usr/bin/env python3
"""Writes a WebDataset of N one-member, header-only samples (a 0-byte `.cls` member each: 512
bytes per sample) in S tar shards: the largest sample count a disk or tmpfs holds, for measuring
what grows with the number of samples (issue 27 part 5, docs/performance.md).

    python3 examples/header_only_set.py DIR N S      # DIR/shard-000000.tar ...
"""
import os
import sys


def header(name: bytes) -> bytes:
    """A ustar header of a 0-byte regular file `name`, checksum filled in."""
    h = bytearray(512)
    h[0 : len(name)] = name
    h[100:108] = b"0000644\0"
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = b"00000000000\0"
    h[136:148] = b"14701540000\0"
    h[148:156] = b" " * 8
    h[156:157] = b"0"
    h[257:265] = b"ustar\x0000"
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def main() -> None:
    out, n, shards = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    os.makedirs(out, exist_ok=True)
    g = 0
    for s in range(shards):
        count = n // shards + (1 if s < n % shards else 0)
        with open(os.path.join(out, f"shard-{s:06d}.tar"), "wb") as f:
            batch = []
            for _ in range(count):
                batch.append(header(b"%010d.cls" % g))
                g += 1
                if len(batch) == 4096:
                    f.write(b"".join(batch))
                    batch = []
            f.write(b"".join(batch) + bytes(1024))


if __name__ == "__main__":
    main()
