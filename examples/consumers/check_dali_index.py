#!/usr/bin/env python3
"""Checks the DALI webdataset indexes of a reshard output written with --dali-index.

    python3 check_dali_index.py DIR

reshard --dali-index writes NAME.idx beside each NAME.tar, in the text format of DALI's
wds2idx tool: a line "v1.2 SAMPLES", then one line per sample with "EXT OFFSET SIZE PATH" for
each of its members (the data offset and size of the member). DALI reads them through
fn.readers.webdataset(paths=[...tar], index_paths=[...idx], ext=[...]). This reads every shard
listed in DIR/index.json with Python's tarfile and checks each index line field by field
against it, exiting 1 on any mismatch. Needs only the standard library (DALI itself needs a GPU
build from NVIDIA's package index).

In a DALI pipeline:
    tars = sorted(glob.glob(f"{DIR}/*.tar"))
    fn.readers.webdataset(paths=tars, index_paths=[t[:-4] + ".idx" for t in tars],
                          ext=["jpg", "cls"], random_shuffle=True)
"""

import json
import os
import sys
import tarfile


def expected_lines(tar_path):
    """The index lines for a shard: its regular members grouped by key, in archive order."""
    samples = []
    with tarfile.open(tar_path) as tar:
        for m in tar:
            if not m.isreg():
                continue
            directory, _, base = m.name.rpartition("/")
            if "." not in base[1:]:
                continue
            stem, ext = base.split(".", 1)
            key = (directory + "/" if directory else "") + stem
            if not samples or samples[-1][0] != key:
                samples.append((key, []))
            samples[-1][1].append(f"{ext} {m.offset_data} {m.size} {m.name}")
    return [f"v1.2 {len(samples)}"] + [" ".join(parts) for _, parts in samples]


def main():
    out = sys.argv[1]
    with open(os.path.join(out, "index.json")) as f:
        names = [s["url"] for s in json.load(f)["shardlist"]]
    problems = []
    samples = 0
    for name in names:
        idx = os.path.join(out, name[: -len(".tar")] + ".idx")
        try:
            with open(idx) as f:
                got = f.read().split("\n")
        except OSError as e:
            problems.append(f"{idx}: {e}")
            continue
        want = expected_lines(os.path.join(out, name))
        samples += len(want) - 1
        if got != want + [""]:
            first = next(
                (i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want))
            )
            problems.append(f"{idx}: line {first + 1} differs from the tar")
    print(f"dali: {len(names)} indexes, {samples} samples checked field by field against the tars")
    for p in problems[:10]:
        print(f"dali: MISMATCH: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
