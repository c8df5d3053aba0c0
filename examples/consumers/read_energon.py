#!/usr/bin/env python3
"""Reads a reshard output written with --energon through Megatron-Energon's own readers.

    python3 read_energon.py DIR [--split train] [--no-key-index]
    MSC_CONFIG=msc.yaml python3 read_energon.py msc://PROFILE/PREFIX ...   (an output in a bucket)

reshard --energon writes .nv-meta/ (.info.json, split.yaml, dataset.yaml, index.sqlite,
index.uuid) and NAME.tar.idx beside each shard, so that `energon prepare` is not needed. This
loads the split's shards from that metadata as energon does (WebdatasetMeta.from_config), then
reads every sample twice, with the two readers energon's datasets are built on:
  * by position, through the .tar.idx offsets (ShardInfosITarReader: what the training loader
    slices), and
  * by key, through index.sqlite (SqliteITarEntryReader: energon's random access), unless
    --no-key-index (an output written with --energon-no-sqlite: the training reader alone),
and checks, exiting 1 on any mismatch:
  * the split holds as many samples as its index.json lists (DIR/SPLIT/index.json for a --split
    output, else DIR/index.json), every key exactly once, and index.sqlite holds every sample;
  * the sample read by key has the same members and bytes as the one read by position.

Needs: pip install -r requirements.txt, then pip install --no-deps -r energon-requirements.txt.
Energon imports torch everywhere, but these readers do no tensor work: when torch is not
installed, this script puts torch_standin/ (a placeholder module, beside it) on sys.path first.
With torch installed, the real one is used.
"""

import argparse
import json
import os
import sys

try:
    import torch  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_standin"))

from megatron.energon.epathlib import EPath
from megatron.energon.flavors.webdataset.itar_reader import (
    ShardInfosITarReader,
    SqliteITarEntryReader,
)
from megatron.energon.flavors.webdataset.metadata import WebdatasetMeta


def members(sample):
    """The member bytes of a sample energon returned (its __-fields left out)."""
    return {k: v for k, v in sample.items() if not k.startswith("__")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--split", default="train")
    ap.add_argument("--no-key-index", action="store_true",
                    help="read by position only (written with --energon-no-sqlite)")
    args = ap.parse_args()
    # A directory, or a URL energon reads through its Multi-Storage Client: msc://PROFILE/PREFIX
    # (the profile in the file MSC_CONFIG names says which bucket and endpoint).
    path = EPath(args.dir if "://" in args.dir else os.path.abspath(args.dir))
    meta = WebdatasetMeta.from_config(path, split_part=args.split, split_config="split.yaml")
    by_position = ShardInfosITarReader(path, meta.shards)
    by_key = None if args.no_key_index else SqliteITarEntryReader(path)

    def samples_listed(index):
        return sum(s["nsamples"] for s in json.loads(index.read_text())["shardlist"])

    everything = samples_listed(path / "index.json")
    # A --split output: the split's own index.json lists its samples; index.sqlite holds all.
    split_index = path / args.split / "index.json"
    listed = samples_listed(split_index) if split_index.is_file() else everything
    problems = []
    seen = set()
    for i in range(len(by_position)):
        sample = by_position[i]
        key = sample["__key__"]
        if key in seen:
            problems.append(f"key {key!r} read twice")
        seen.add(key)
        if by_key is not None and members(by_key[key]) != members(sample):
            problems.append(f"sample {key!r}: index.sqlite and .tar.idx give different members")
    indexed = everything if by_key is None else len(by_key)
    if len(seen) != listed or indexed != everything:
        problems.append(
            f"{len(seen)} samples by position (index.json lists {listed}), "
            f"{indexed} in index.sqlite (index.json lists {everything} in all)"
        )
    print(
        f"energon: split {args.split!r}: {len(meta.shards)} shards, {len(seen)} samples, "
        f"each read by position (.tar.idx)"
        + ("" if by_key is None else " and by key (index.sqlite)")
    )
    for p in problems[:10]:
        print(f"energon: MISMATCH: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
