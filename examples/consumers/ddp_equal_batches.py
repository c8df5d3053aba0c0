#!/usr/bin/env python3
"""Simulate the data side of DistributedDataParallel on G ranks and check that every rank gets
the same number of samples and full batches, so that no rank waits forever in an all-reduce at
the end of an epoch.

    python3 ddp_equal_batches.py DIR --gpus G [--workers W] --batch-size B

Meant for an output made with `reshard run --gpus G --workers W --equalize drop` (or pad).
No torch.distributed: each rank is simulated in turn, with the environment variables that
webdataset's pytorch_worker_info() reads in place of a process group (RANK and WORLD_SIZE;
WORKER and NUM_WORKERS for the data loader workers). For rank r the pipeline is the usual
multi-node webdataset one:

    wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node)   # shards r::G
       .batched(B, partial=False)                                               # per worker

so rank r reads shards r, r+G, r+2G, ... and each of its W workers every W-th of those, each
worker batching its own stream (as a DataLoader with num_workers=W does). The script prints
per rank: shards, samples and full batches (the sum over its workers), checks the shards are
exactly urls[r::G], and exits 1 if the ranks differ in samples or full batches, or if the
figures disagree with what index.json's reshard.gpus reports.

Needs: pip install webdataset (not torch).
"""

import argparse
import json
import os
import sys
import warnings

import webdataset as wds


def simulate(urls, rank, gpus, worker, workers, batch_size):
    """One worker of one rank: (shards read, samples, full batches, samples in a partial batch)."""
    env = {"RANK": str(rank), "WORLD_SIZE": str(gpus), "WORKER": str(worker), "NUM_WORKERS": str(workers)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        shards_read = set()
        samples = 0

        def count(sample):
            nonlocal samples
            samples += 1
            shards_read.add(sample["__url__"])
            return sample

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dataset = (
                wds.WebDataset(
                    urls,
                    shardshuffle=False,
                    nodesplitter=wds.split_by_node,
                    workersplitter=wds.split_by_worker,
                    empty_check=False,
                )
                .map(count)
                .batched(batch_size, collation_fn=len, partial=False)
            )
            sizes = list(dataset)
        assert all(s == batch_size for s in sizes), sizes
        return shards_read, samples, len(sizes), samples - batch_size * len(sizes)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="a reshard output directory (with index.json)")
    ap.add_argument("--gpus", type=int, required=True, help="number of ranks G")
    ap.add_argument("--workers", type=int, default=1, help="data loader workers per rank W")
    ap.add_argument("--batch-size", type=int, required=True, help="per-rank batch size B")
    args = ap.parse_args()

    with open(os.path.join(args.dir, "index.json")) as f:
        index = json.load(f)
    shards = index["shardlist"]
    urls = [os.path.join(args.dir, s["url"]) for s in shards]
    G, W, B = args.gpus, args.workers, args.batch_size
    print(f"{args.dir}: {len(urls)} shards, {G} ranks x {W} workers, batch size {B}")
    problems = []
    if len(urls) % (G * W):
        problems.append(f"{len(urls)} shards do not divide into {G} ranks x {W} workers: some workers get one more shard")

    results = []
    for rank in range(G):
        shards_read, samples, batches, leftover = set(), 0, 0, 0
        for worker in range(W):
            s, n, b, left = simulate(urls, rank, G, worker, W, B)
            shards_read |= s
            samples += n
            batches += b
            leftover += left
        if shards_read - set(urls[rank::G]):
            problems.append(f"rank {rank} read shards outside urls[{rank}::{G}]: split_by_node is not rank::G")
        expected = sum(s["nsamples"] for s in shards[rank::G])
        if samples != expected:
            problems.append(f"rank {rank}: {samples} samples read, index.json's nsamples say {expected}")
        results.append((samples, batches))
        print(
            f"rank {rank}: {len(urls[rank::G])} shards, {samples} samples, {batches} full batches of {B}"
            + (f" ({leftover} samples left in partial batches, dropped)" if leftover else "")
        )

    if len(set(results)) > 1:
        problems.append(
            "ranks differ in samples or full batches: DDP would hang at the end of the epoch "
            "(make the output with --gpus G --equalize drop or pad)"
        )
    gpu = index.get("reshard", {}).get("gpus")
    if gpu and gpu.get("gpus") == G:
        if gpu.get("samples_per_gpu_min") != min(r[0] for r in results) or gpu.get("samples_per_gpu_max") != max(
            r[0] for r in results
        ):
            problems.append(f"index.json reshard.gpus says {gpu['samples_per_gpu_min']}..{gpu['samples_per_gpu_max']} samples per GPU")
        # reshard counts one stream per GPU; with W workers each batching alone it can be fewer.
        if gpu.get("batch_size") == B and W == 1 and gpu.get("batches_per_gpu") != min(r[1] for r in results):
            problems.append(f"index.json reshard.gpus says {gpu['batches_per_gpu']} full batches per GPU")

    for p in problems:
        print(f"ERROR: {p}")
    if problems:
        print("FAIL")
        return 1
    print(f"OK: every rank gets {results[0][0]} samples in {results[0][1]} full batches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
