#!/usr/bin/env python3
"""Read a reshard output with the webdataset package, streaming, on one process.

    python3 read_webdataset.py DIR [--keys jpg,cls,json]

The shard list and the number of samples come from DIR/index.json (the wids index reshard
writes): webdataset itself streams tar files and does not know how many samples they hold,
and a training loop wants that number for its schedule (`.with_length(n)`).

Checks, and exits 1 on any mismatch:
  * the number of samples iterated equals the sum of "nsamples" in index.json, and each shard's
    own count equals its "nsamples" entry;
  * every key appears once;
  * every sample has the same member extensions (the first sample's, or --keys).

Needs: pip install webdataset (pulls numpy, pyyaml, braceexpand; not torch).
"""

import argparse
import collections
import json
import os
import sys
import warnings

import webdataset as wds


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="a reshard output directory (with index.json)")
    ap.add_argument("--keys", help="expected member extensions, comma separated (default: the first sample's)")
    args = ap.parse_args()

    with open(os.path.join(args.dir, "index.json")) as f:
        index = json.load(f)
    shards = index["shardlist"]
    urls = [os.path.join(args.dir, s["url"]) for s in shards]
    expected = {os.path.join(args.dir, s["url"]): s["nsamples"] for s in shards}
    nsamples = sum(expected.values())

    # shardshuffle=False: read the shards in index order (they are already globally shuffled
    # by reshard). A training job would rather set shardshuffle to a number and add
    # .shuffle(1000) for a little local variety between epochs of the same output.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # with_length's note that __len__ is a workaround
        dataset = wds.WebDataset(urls, shardshuffle=False).with_length(nsamples)
    print(f"{args.dir}: {len(shards)} shards, {len(dataset)} samples according to index.json")

    want = set(args.keys.split(",")) if args.keys else None
    per_shard = collections.Counter()
    seen = set()
    problems = []
    count = 0
    for sample in dataset:
        count += 1
        key = sample["__key__"]
        per_shard[sample["__url__"]] += 1
        if key in seen:
            problems.append(f"key {key!r} appears twice")
        seen.add(key)
        exts = {k for k in sample if not k.startswith("__")}
        if want is None:
            want = exts
        elif exts != want:
            problems.append(f"sample {key!r} has members {sorted(exts)}, expected {sorted(want)}")
        for ext in exts:
            if not isinstance(sample[ext], bytes):
                problems.append(f"sample {key!r}: member {ext} is not raw bytes")

    if count != nsamples:
        problems.append(f"iterated {count} samples, index.json says {nsamples}")
    for url, n in expected.items():
        if per_shard[url] != n:
            problems.append(f"{url}: {per_shard[url]} samples, index.json says {n}")
    output_samples = index.get("reshard", {}).get("output_samples")
    if output_samples is not None and output_samples != nsamples:
        problems.append(f"index.json: reshard.output_samples {output_samples} != sum of nsamples {nsamples}")

    print(f"iterated {count} samples, {len(seen)} distinct keys, members {sorted(want or [])}")
    for p in problems[:20]:
        print(f"ERROR: {p}")
    if problems:
        print(f"FAIL: {len(problems)} problems")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
