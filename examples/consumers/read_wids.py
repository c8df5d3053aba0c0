#!/usr/bin/env python3
"""Random access to a reshard output with wids: `wids.ShardListDataset("DIR/index.json")`.

    python3 read_wids.py DIR [--keys jpg,cls,json] [--seed 0]
    python3 read_wids.py s3://BUCKET/PREFIX ...   (needs the AWS CLI: wids runs `aws s3 cp`)

wids reads the index.json reshard writes as it is: its length is the sum of the shards'
"nsamples", and `dataset[i]` opens the right shard and returns sample i (a dict of raw member
bytes plus __key__, __shard__, __index__). This reads every sample once in the order of wids'
ShardedSampler (shards in random order, samples in random order within each, as a
DataLoader(dataset, sampler=...) would), then 100 samples at random indices, and checks,
exiting 1 on any mismatch:
  * len(dataset) equals the sum of "nsamples" (and reshard.output_samples);
  * every index gives a sample, every key appears once, and an index gives the same sample
    each time;
  * every sample has the same member extensions (the first one's, or --keys).

Needs: pip install wids (pulls numpy, pyyaml, braceexpand). wids imports torch.distributed
and torch.utils.data at import time, only for its distributed samplers; when torch is not
installed this script puts a small stand-in for those two modules in place first, so the
example runs without the gigabytes of a CUDA torch wheel. With torch installed, the real one
is used.

Known limitation of wids (0.1.x), not of reshard: its tar reader looks at the 100-byte ustar
name field only and ignores GNU long-name and PAX records, so shards whose member paths are
longer than 100 bytes give wrong keys or fail ("Filename must have an extension"). webdataset
(read_webdataset.py) reads such shards correctly.
"""

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import types
import typing


def stub_torch_if_missing():
    """Registers minimal torch.distributed / torch.utils.data modules if torch is absent."""
    try:
        import torch  # noqa: F401

        return False
    except ImportError:
        pass
    T = typing.TypeVar("T")

    class Dataset(typing.Generic[T]):
        """Stand-in for torch.utils.data.Dataset (a generic base class, nothing more)."""

    class Sampler(typing.Generic[T]):
        """Stand-in for torch.utils.data.Sampler."""

    torch = types.ModuleType("torch")
    torch.__doc__ = "stand-in registered by read_wids.py: torch is not installed"
    dist = types.ModuleType("torch.distributed")
    dist.is_available = lambda: False
    dist.is_initialized = lambda: False
    utils = types.ModuleType("torch.utils")
    data = types.ModuleType("torch.utils.data")
    data.Dataset, data.Sampler = Dataset, Sampler
    data.get_worker_info = lambda: None
    torch.distributed, torch.utils, utils.data = dist, utils, data
    sys.modules.update({"torch": torch, "torch.distributed": dist, "torch.utils": utils, "torch.utils.data": data})
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="a reshard output directory (with index.json), or s3://BUCKET/PREFIX")
    ap.add_argument("--keys", help="expected member extensions, comma separated (default: the first sample's)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random access order")
    args = ap.parse_args()

    stubbed = stub_torch_if_missing()
    import wids

    remote = "://" in args.dir
    if remote:
        # An output in a bucket (s3://BUCKET/PREFIX): wids fetches index.json and each shard
        # with its own handler for the URL's scheme (`aws s3 cp` for s3://, which takes the
        # endpoint and credentials from the AWS_* variables), into a cache directory.
        cache = tempfile.mkdtemp(prefix="read-wids-")
        index_path = args.dir.rstrip("/") + "/index.json"
        local_index = os.path.join(cache, "index.json")
        wids.wids_dl.download_file(index_path, local_index)
    else:
        index_path = local_index = os.path.join(args.dir, "index.json")
    with open(local_index) as f:
        index = json.load(f)
    nsamples = sum(s["nsamples"] for s in index["shardlist"])

    # transformations=[]: raw bytes (the default decodes images with PIL).
    # localname=identity: local shards are opened in place; remote ones are downloaded into
    # the cache directory, each once.
    if remote:
        where = {"cache_dir": os.path.join(cache, "shards")}
    else:
        where = {"localname": lambda url: url}
    dataset = wids.ShardListDataset(index_path, transformations=[], **where)
    print(f"{args.dir}: len(dataset) = {len(dataset)}" + (" (torch stand-in)" if stubbed else ""))

    problems = []
    if len(dataset) != nsamples:
        problems.append(f"len(dataset) {len(dataset)} != sum of nsamples {nsamples}")
    output_samples = index.get("reshard", {}).get("output_samples")
    if output_samples is not None and output_samples != len(dataset):
        problems.append(f"len(dataset) {len(dataset)} != reshard.output_samples {output_samples}")

    # Pass 1, as a DataLoader would: wids' ShardedSampler gives the shards in a random order
    # and the indices inside each shard in a random order (random access that keeps locality).
    sampler = wids.ShardedSampler(dataset, seed=args.seed, shufflefirst=True)
    order = list(sampler)
    if sorted(order) != list(range(len(dataset))):
        problems.append("ShardedSampler did not give every index exactly once")
    want = set(args.keys.split(",")) if args.keys else None
    seen = {}
    key_at = {}
    for i in order:
        try:
            sample = dataset[i]
        except Exception as e:  # a shard holding fewer samples than index.json says, ...
            problems.append(f"dataset[{i}]: {type(e).__name__}: {e}")
            continue
        key = sample["__key__"]
        key_at[i] = key
        if key in seen:
            problems.append(f"key {key!r} at index {i} and at index {seen[key]}")
        seen[key] = i
        # wids names members by extension with the dot: ".jpg".
        exts = {k.lstrip(".") for k in sample if not k.startswith("__")}
        if want is None:
            want = exts
        elif exts != want:
            problems.append(f"index {i} ({key!r}) has members {sorted(exts)}, expected {sorted(want)}")
    if len(seen) != len(dataset) and not problems:
        problems.append(f"{len(seen)} distinct keys for {len(dataset)} indices")

    # Pass 2: plain random access by index gives the same samples.
    rng = random.Random(args.seed + 1)
    probes = rng.sample(range(len(dataset)), min(100, len(dataset)))
    for i in probes:
        if i not in key_at:
            continue
        key = dataset[i]["__key__"]
        if key != key_at.get(i):
            problems.append(f"dataset[{i}] is {key!r} now, {key_at.get(i)!r} before")

    if remote:
        shutil.rmtree(cache, ignore_errors=True)
    print(
        f"read {len(order)} samples in ShardedSampler order and {len(probes)} at random indices, "
        f"{len(seen)} distinct keys, members {sorted(want or [])}"
    )
    for p in problems[:20]:
        print(f"ERROR: {p}")
    if problems:
        print(f"FAIL: {len(problems)} problems")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
