#!/usr/bin/env python3
"""Per-rank figures of a reshard run summary (`reshard run --report FILE`), by node.

    python3 slurm/rank-report.py reshard-1234.report.json \
        --nodes "$(scontrol show hostnames "$SLURM_JOB_NODELIST")" \
        --tasks-per-node "$SLURM_TASKS_PER_NODE"

Prints rank 0's phase times, then one line per rank with every per-rank figure of the report
(bytes read, bytes written, peak RSS, and whatever else a newer reshard adds) and the node the
rank ran on, marking values far from the median over ranks; then the same summed per node.
Ranks are mapped to nodes as srun's default block distribution places them (the first
tasks-per-node ranks on the first node, ...); with --distribution=cyclic the mapping differs.
Standard library only.
"""

import argparse
import json
import re
import statistics
import sys

# A value this far from the median over ranks (either way) is marked.
OUTLIER = 1.25


def human(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def tasks_per_node(spec, nodes):
    """Slurm's SLURM_TASKS_PER_NODE ("8(x4)", "8,8,7", "2(x3),1") as a list, one per node."""
    counts = []
    for part in filter(None, spec.split(",")):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            return None
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    if nodes and len(counts) == 1:
        counts *= len(nodes)
    return counts or None


def phases(report):
    p = report.get("phases", [])
    if isinstance(p, dict) and "phases" in p:
        p = p["phases"]
    if isinstance(p, dict):
        p = list(p.items())
    out = []
    for item in p:
        if isinstance(item, dict):
            out.append((item.get("name", "?"), item.get("seconds", item.get("secs", 0.0))))
        else:
            out.append((item[0], item[1]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", help="the JSON file written by reshard run --report")
    ap.add_argument("--nodes", default="", help="node names in job order, space separated")
    ap.add_argument("--tasks-per-node", default="", help="as in SLURM_TASKS_PER_NODE")
    ap.add_argument("--expect-ranks", default="", help="the task count (SLURM_NTASKS) to check against")
    args = ap.parse_args()

    with open(args.report) as f:
        report = json.load(f)
    ranks = report.get("per_rank") or []
    if not ranks:
        print(f"{args.report}: no per_rank figures")
        return 1

    if args.expect_ranks.isdigit() and int(args.expect_ranks) != len(ranks):
        print(
            f"WARNING: the report has {len(ranks)} ranks but Slurm started {args.expect_ranks} tasks: "
            "srun's --mpi plugin does not match the MPI reshard was built with (see slurm/README.md)"
        )

    nodes = args.nodes.split()
    counts = tasks_per_node(args.tasks_per_node, nodes)
    node_of = {}
    if nodes and counts and len(counts) == len(nodes) and sum(counts) == len(ranks):
        r = 0
        for name, n in zip(nodes, counts):
            for _ in range(n):
                node_of[r] = name
                r += 1

    total = sum(s for _, s in phases(report))
    print(f"phases (rank 0), {total:.2f} s in all:")
    for name, secs in phases(report):
        print(f"  {name:<10} {secs:9.3f} s")
    if report.get("mem_limit"):
        print(f"memory budget per rank (--mem-limit): {human(report['mem_limit'])}")

    fields = [k for k, v in ranks[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    medians = {k: statistics.median(r.get(k, 0) for r in ranks) for k in fields}

    def cell(k, v):
        text = human(v) if ("bytes" in k or "rss" in k) else f"{v:g}"
        med = medians[k]
        mark = " "
        if med > 0 and (v > OUTLIER * med or v < med / OUTLIER):
            mark = "!"
        return f"{text}{mark}"

    width = 14
    header = f"{'rank':>5} {'node':<16}" + "".join(f"{k:>{width + 1}}" for k in fields)
    print()
    print(header)
    flagged = []
    for i, r in enumerate(ranks):
        cells = [cell(k, r.get(k, 0)) for k in fields]
        if any(c.endswith("!") for c in cells):
            flagged.append(i)
        print(f"{i:>5} {node_of.get(i, '-'):<16}" + "".join(f"{c:>{width + 1}}" for c in cells))
    print(f"{'median':<22}" + "".join(f"{cell(k, medians[k]):>{width + 1}}" for k in fields))

    if node_of:
        print()
        print(f"{'node':<22}" + "".join(f"{k:>{width + 1}}" for k in fields))  # summed (RSS: max)
        for name in dict.fromkeys(node_of.values()):
            members = [r for i, r in enumerate(ranks) if node_of.get(i) == name]
            sums = []
            for k in fields:
                vals = [m.get(k, 0) for m in members]
                v = max(vals) if "rss" in k else sum(vals)
                sums.append(human(v) if ("bytes" in k or "rss" in k) else f"{v:g}")
            print(f"{name:<22}" + "".join(f"{s + ' ':>{width + 1}}" for s in sums))

    print()
    if flagged:
        print(f"'!': more than {OUTLIER}x off the median: ranks {', '.join(map(str, flagged))}")
    else:
        print(f"no rank is more than {OUTLIER}x off the median")
    return 0


if __name__ == "__main__":
    sys.exit(main())
