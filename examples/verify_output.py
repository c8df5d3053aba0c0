#!/usr/bin/env python3
"""Independent check of a `reshard run` output directory against its input shards.

Usage:
    examples/verify_output.py INPUT... --output DIR [--shards N] [--seed S] [--epoch E]

INPUT is a .tar file, a directory (its *.tar files, sorted by name), a brace pattern such as
'data/train-{000000..000015}.tar', or @list.txt (one path per line), as for `reshard run`.

It shares no code with reshard: it reads every shard with Python's own tarfile module and checks

* every input sample appears exactly once in the output, with the same member names in the same
  order and the same raw bytes (headers, long-name/PAX records, data and padding);
* the members of each sample are adjacent in the output;
* output shard sample counts differ by at most one;
* every output shard ends with zero blocks after its last member;
* index.json is a wids shard index whose shardlist matches the files (url, nsamples, filesize),
  and whose "reshard" totals match what was found.

A sample is a run of consecutive regular-file members sharing a key: the member path up to the
first '.' of its last component (a last component without a '.', or starting with one, has no
key). Directories, keyless files and other entries are skipped and end the current sample.

Prints one line starting with OK, or the problems found; exits 1 when there is any problem.
Standard library only.
"""

import argparse
import hashlib
import json
import os
import re
import sys
import tarfile
from collections import Counter, defaultdict

BLOCK = 512
MAX_REPORTED = 40
EXAMPLES = 3
INDEX_KIND = "wids-shard-index-v1"
SHARD_NAME = re.compile(r"^(?P<prefix>.+)-(?P<num>\d{6})\.tar$")


class Problems:
    """Collects problems; the first MAX_REPORTED are kept verbatim, the rest only counted."""

    def __init__(self):
        self.items = []
        self.count = 0

    def add(self, message):
        self.count += 1
        if len(self.items) < MAX_REPORTED:
            self.items.append(message)

    def __bool__(self):
        return self.count > 0


def human(n):
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def expand_braces(pattern):
    """Expands webdataset-style numeric ranges, e.g. 'a-{000..012}.tar' (padding kept)."""
    m = re.search(r"\{(\d+)\.\.(\d+)\}", pattern)
    if not m:
        return [pattern]
    lo_text, hi_text = m.group(1), m.group(2)
    lo, hi = int(lo_text), int(hi_text)
    if lo > hi:
        raise ValueError(f"{pattern}: empty range {m.group(0)}")
    width = len(lo_text) if lo_text.startswith("0") and len(lo_text) > 1 else 0
    head, tail = pattern[: m.start()], pattern[m.end():]
    out = []
    for i in range(lo, hi + 1):
        out.extend(expand_braces(f"{head}{i:0{width}d}{tail}"))
    return out


def expand_input(spec):
    """Turns one INPUT argument into an ordered list of tar paths."""
    if spec.startswith("@"):
        list_file = spec[1:]
        base = os.path.dirname(list_file)
        paths = []
        with open(list_file, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                paths.append(line if os.path.isabs(line) else os.path.join(base, line))
        return paths
    if os.path.isdir(spec):
        names = sorted(n for n in os.listdir(spec) if n.endswith(".tar"))
        return [os.path.join(spec, n) for n in names if os.path.isfile(os.path.join(spec, n))]
    if "{" in spec and not os.path.exists(spec):
        return expand_braces(spec)
    return [spec]


def sample_key(name):
    """The webdataset key of a member path, or None when it has none."""
    slash = name.rfind("/")
    base = name[slash + 1:]
    dot = base.find(".")
    if dot <= 0:
        return None
    return name[: slash + 1 + dot]


def padded(size):
    return (size + BLOCK - 1) // BLOCK * BLOCK


class Sample:
    __slots__ = ("key", "names", "start", "end", "digest")

    def __init__(self, key, start):
        self.key = key
        self.names = []
        self.start = start
        self.end = start
        self.digest = None

    def signature(self):
        return (self.key, tuple(self.names), self.end - self.start, self.digest)


def digest_range(fh, start, end):
    h = hashlib.blake2b(digest_size=20)
    fh.seek(start)
    left = end - start
    while left > 0:
        chunk = fh.read(min(left, 1 << 20))
        if not chunk:
            raise EOFError(f"file ends at byte {fh.tell()}, inside a sample ending at {end}")
        h.update(chunk)
        left -= len(chunk)
    return h.digest()


class ShardScan:
    """The samples of one shard, in file order, and what was skipped."""

    def __init__(self, path):
        self.path = path
        self.size = os.path.getsize(path)
        self.samples = []
        self.skipped = Counter()
        self.data_end = 0  # end of the last record's padded data
        self.tail_is_zero = True

    def scan(self):
        current = None
        with tarfile.open(self.path, mode="r:") as tar, open(self.path, "rb") as raw:
            for member in tar:
                end = member.offset_data
                if member.isreg() or member.type not in tarfile.SUPPORTED_TYPES:
                    end += padded(member.size)
                self.data_end = max(self.data_end, end)
                key = sample_key(member.name) if member.isreg() else None
                if key is None:
                    if member.isdir():
                        self.skipped["directories"] += 1
                    elif member.isreg():
                        self.skipped["keyless_files"] += 1
                    else:
                        self.skipped["other_entries"] += 1
                    current = None
                    continue
                if current is None or current.key != key:
                    current = Sample(key, member.offset)
                    self.samples.append(current)
                current.names.append(member.name)
                current.end = end
            for s in self.samples:
                s.digest = digest_range(raw, s.start, s.end)
            raw.seek(self.data_end)
            while True:
                chunk = raw.read(1 << 20)
                if not chunk:
                    break
                if chunk.count(0) != len(chunk):
                    self.tail_is_zero = False
                    break
        return self


def scan_all(paths, role, problems):
    scans = []
    for p in paths:
        try:
            scans.append(ShardScan(p).scan())
        except (OSError, tarfile.TarError, EOFError) as e:
            problems.add(f"{role} shard {p}: cannot read: {e}")
    return scans


def check_samples(inputs, outputs, problems):
    want = Counter()
    for shard in inputs:
        for s in shard.samples:
            want[s.signature()] += 1
    got = Counter()
    where = {}
    runs_per_key = defaultdict(int)
    for shard in outputs:
        for i, s in enumerate(shard.samples):
            sig = s.signature()
            got[sig] += 1
            where.setdefault(sig, f"{os.path.basename(shard.path)} sample {i} (byte {s.start})")
            runs_per_key[s.key] += 1
    input_runs_per_key = Counter(s.key for shard in inputs for s in shard.samples)

    for key, runs in sorted(runs_per_key.items()):
        if runs > input_runs_per_key.get(key, 0) > 0:
            problems.add(
                f"sample {key!r}: its members form {runs} separate groups in the output "
                f"(input has {input_runs_per_key[key]}): members not adjacent, or duplicated"
            )
    missing = [(sig, n - got[sig]) for sig, n in sorted(want.items()) if got[sig] < n]
    extra = [(sig, n - want[sig]) for sig, n in sorted(got.items()) if n > want[sig]]
    if missing:
        problems.add(
            f"{sum(n for _, n in missing)} input sample(s) missing from the output or changed, e.g. "
            + "; ".join(f"{sig[0]!r} ({len(sig[1])} members, {sig[2]} bytes)" for sig, _ in missing[:EXAMPLES])
        )
    if extra:
        problems.add(
            f"{sum(n for _, n in extra)} output sample(s) that match no input sample or repeat one, e.g. "
            + "; ".join(
                f"{sig[0]!r} at {where[sig]} "
                + ("(duplicate)" if want[sig] else f"(members {list(sig[1])}, {sig[2]} bytes)")
                for sig, _ in extra[:EXAMPLES]
            )
        )


def check_shards(outputs, problems):
    for shard in outputs:
        tail = shard.size - shard.data_end
        if tail < 2 * BLOCK or not shard.tail_is_zero:
            problems.add(
                f"output shard {shard.path}: expected at least two zero blocks after the last "
                f"member (byte {shard.data_end}), found {tail} bytes"
                + ("" if shard.tail_is_zero else " that are not all zero")
            )
        if sum(shard.skipped.values()):
            problems.add(f"output shard {shard.path}: holds entries that belong to no sample: {dict(shard.skipped)}")
    counts = [len(s.samples) for s in outputs]
    if counts and max(counts) - min(counts) > 1:
        problems.add(f"output shard sample counts differ by more than one: min {min(counts)}, max {max(counts)}")


def check_index(out_dir, input_paths, inputs, outputs, args, problems):
    path = os.path.join(out_dir, "index.json")
    try:
        with open(path, encoding="utf-8") as f:
            index = json.load(f)
    except (OSError, ValueError) as e:
        problems.add(f"{path}: cannot read: {e}")
        return
    if index.get("__kind__") != INDEX_KIND:
        problems.add(f"index.json: __kind__ is {index.get('__kind__')!r}, expected {INDEX_KIND!r}")
    if index.get("wids_version") != 1:
        problems.add(f"index.json: wids_version is {index.get('wids_version')!r}, expected 1")
    shardlist = index.get("shardlist")
    if not isinstance(shardlist, list):
        problems.add("index.json: no shardlist")
        return
    by_name = {os.path.basename(s.path): s for s in outputs}
    listed = set()
    prefixes = set()
    for i, entry in enumerate(shardlist):
        url = entry.get("url") if isinstance(entry, dict) else None
        if not isinstance(url, str):
            problems.add(f"index.json: shardlist[{i}] has no url")
            continue
        listed.add(url)
        m = SHARD_NAME.match(url)
        if not m or int(m.group("num")) != i:
            problems.add(f"index.json: shardlist[{i}] url {url!r}, expected PREFIX-{i:06}.tar")
        else:
            prefixes.add(m.group("prefix"))
        shard = by_name.get(url)
        if shard is None:
            problems.add(f"index.json: shardlist[{i}] url {url!r} is not a readable shard in {out_dir}")
            continue
        if entry.get("nsamples") != len(shard.samples):
            problems.add(f"index.json: {url} nsamples {entry.get('nsamples')!r}, file holds {len(shard.samples)}")
        if entry.get("filesize") != shard.size:
            problems.add(f"index.json: {url} filesize {entry.get('filesize')!r}, file is {shard.size} bytes")
    if len(prefixes) > 1:
        problems.add(f"index.json: shard urls use several prefixes: {sorted(prefixes)}")
    for name in sorted(os.listdir(out_dir)):
        if name not in ("index.json", ".reshard") and name not in listed:
            problems.add(f"{out_dir}: {name!r} is not listed in index.json")

    meta = index.get("reshard")
    if not isinstance(meta, dict):
        problems.add("index.json: no \"reshard\" object")
        return
    samples = sum(len(s.samples) for s in outputs)
    sample_bytes = sum(x.end - x.start for s in outputs for x in s.samples)
    expected = {
        "shards": len(outputs),
        "samples": samples,
        "sample_bytes": sample_bytes,
        "output_bytes": sum(s.size for s in outputs),
        "input_bytes": sum(s.size for s in inputs),
    }
    if args.shards is not None:
        expected["shards"] = args.shards
    if args.seed is not None:
        expected["seed"] = args.seed
    if args.epoch is not None:
        expected["epoch"] = args.epoch
    for field, value in expected.items():
        if meta.get(field) != value:
            problems.add(f"index.json: reshard.{field} is {meta.get(field)!r}, expected {value!r}")
    if args.shards is not None and len(shardlist) != args.shards:
        problems.add(f"index.json: shardlist has {len(shardlist)} entries, expected {args.shards}")
    for field in ("seed", "epoch", "ranks", "version"):
        if field not in meta:
            problems.add(f"index.json: reshard.{field} is missing")
    listed_inputs = meta.get("inputs")
    if not isinstance(listed_inputs, list):
        problems.add("index.json: reshard.inputs is not a list")
    elif [os.path.basename(str(p)) for p in listed_inputs] != [os.path.basename(p) for p in input_paths]:
        problems.add(
            f"index.json: reshard.inputs lists {len(listed_inputs)} shards that differ from the "
            f"{len(input_paths)} given here (compared by file name, in order)"
        )
    skipped = meta.get("skipped")
    if isinstance(skipped, dict):
        found = Counter()
        for s in inputs:
            found.update(s.skipped)
        for field in ("directories", "keyless_files", "other_entries"):
            if field in skipped and skipped[field] != found[field]:
                problems.add(f"index.json: reshard.skipped.{field} is {skipped[field]!r}, inputs hold {found[field]}")


def main():
    parser = argparse.ArgumentParser(
        description="Check a reshard output directory against its input shards (stdlib only)."
    )
    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help="input shards: .tar files, directories, brace patterns or @list.txt")
    parser.add_argument("--output", "-o", required=True, metavar="DIR", help="reshard's output directory")
    parser.add_argument("--shards", type=int, help="expected number of output shards")
    parser.add_argument("--seed", type=int, help="expected seed in index.json")
    parser.add_argument("--epoch", type=int, help="expected epoch in index.json")
    args = parser.parse_args()

    problems = Problems()
    input_paths = []
    for spec in args.inputs:
        try:
            input_paths.extend(expand_input(spec))
        except (OSError, ValueError) as e:
            problems.add(f"input {spec}: {e}")
    if not input_paths:
        problems.add("no input shards found")
    if not os.path.isdir(args.output):
        problems.add(f"output {args.output}: not a directory")
        report(problems, "")
    output_paths = sorted(
        os.path.join(args.output, n) for n in os.listdir(args.output) if n.endswith(".tar")
    )
    if not output_paths:
        problems.add(f"output {args.output}: no .tar shards")

    inputs = scan_all(input_paths, "input", problems)
    outputs = scan_all(output_paths, "output", problems)
    check_samples(inputs, outputs, problems)
    check_shards(outputs, problems)
    check_index(args.output, input_paths, inputs, outputs, args, problems)

    n_in = sum(len(s.samples) for s in inputs)
    counts = [len(s.samples) for s in outputs] or [0]
    summary = (
        f"{n_in} samples from {len(inputs)} input shards ({human(sum(s.size for s in inputs))}) "
        f"each found exactly once, verbatim, in {len(outputs)} output shards "
        f"({min(counts)}-{max(counts)} samples each, {human(sum(s.size for s in outputs))}); "
        f"index.json matches"
    )
    report(problems, summary)


def report(problems, summary):
    if not problems:
        print(f"OK: {summary}")
        sys.exit(0)
    print(f"FAILED: {problems.count} problem(s)", file=sys.stderr)
    for p in problems.items:
        print(f"  - {p}", file=sys.stderr)
    if problems.count > len(problems.items):
        print(f"  ... and {problems.count - len(problems.items)} more", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
    main()
