#!/usr/bin/env python3
"""Summarizes the round timelines that `RESHARD_TRACE_ROUNDS=1` prints (stderr of every rank).

    examples/timeline.py run.log [--rounds]

Per rank: rounds, the exchange's span (first round handed to the transport to the last one
arrived), how much of it had at least one round in flight, and the gaps with none (where this
rank's link had nothing to carry), plus the time spent packing and writing. With --rounds, one
line per round: when it was in flight on the earliest and the latest rank (times lined up across
ranks by each rank's Unix start), so the wait for the slowest rank shows.
"""
import re
import sys
from collections import defaultdict

START = re.compile(r"rank (\d+): exchange timeline starts at unix time ([0-9.]+)")
ROUND = re.compile(
    r"rank (\d+) round (\d+): pack ([0-9.]+)-([0-9.]+) ms, exchange ([0-9.]+)-([0-9.]+) ms, "
    r"write ([0-9.]+)-([0-9.]+) ms"
)


def union(intervals):
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    per_round = "--rounds" in sys.argv
    zero, rounds = {}, defaultdict(dict)
    for line in open(args[0] if args else "/dev/stdin", errors="replace"):
        if m := START.search(line):
            zero[int(m[1])] = float(m[2]) * 1e3
        elif m := ROUND.search(line):
            rank, n = int(m[1]), int(m[2])
            rounds[rank][n] = [float(x) for x in m.groups()[2:]]
    if not rounds:
        sys.exit("timeline.py: no round timelines (was RESHARD_TRACE_ROUNDS=1 set?)")
    base = min(zero.values(), default=0.0)
    print("rank rounds  span s  in flight  gaps s  packing s  writing s")
    for rank in sorted(rounds):
        r = rounds[rank].values()
        flights = [(t[2], t[3]) for t in r]
        span = max(b for _, b in flights) - min(a for a, _ in flights)
        busy = union(flights)
        pack = sum(t[1] - t[0] for t in r)
        write = sum(t[5] - t[4] for t in r)
        print(
            f"{rank:4} {len(r):6} {span / 1e3:7.2f} {100 * busy / span if span else 0:9.0f}% "
            f"{(span - busy) / 1e3:7.2f} {pack / 1e3:10.2f} {write / 1e3:10.2f}"
        )
    if per_round:
        print("round  in flight from (earliest-latest rank)  until (earliest-latest), ms")
        shift = {rank: zero.get(rank, base) - base for rank in rounds}
        for n in sorted({n for r in rounds.values() for n in r}):
            got = [(t[2] + shift[k], t[3] + shift[k]) for k, r in rounds.items() for m, t in r.items() if m == n]
            starts, ends = [a for a, _ in got], [b for _, b in got]
            print(f"{n:5}  {min(starts):9.0f}-{max(starts):<9.0f}  {min(ends):9.0f}-{max(ends):<9.0f}")


if __name__ == "__main__":
    main()
