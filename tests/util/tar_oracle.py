"""What real tar readers make of an archive, for tests/entry_types.rs and tests/fuzz_tars.rs.

  tar_oracle.py list OUT.json FILE...     tarfile's keyed regular members of each file
  tar_oracle.py types DIR OUT.json        one archive per type flag and size, listed by GNU tar,
                                          bsdtar and tarfile
  tar_oracle.py mutants DIR SEED COUNT OUT.json
                                          small shards by several writers, COUNT seeded mutants
                                          of them, each listed by tarfile

A member counts when tarfile reads it as a regular file (what webdataset reads) and its name
has a sample key as reshard forms it (a '.' in the last path component, not at its start).
Members are [name as hex, md5 of the bytes]; a file tarfile cannot read has "ok": false.
"""

import hashlib
import io
import json
import os
import random
import subprocess
import sys
import tarfile


def has_key(name):
    base = name.rsplit(b"/", 1)[-1]
    dot = base.find(b".")
    return dot > 0


def tarfile_members(path):
    """tarfile's keyed regular members of `path`, or the error it raised."""
    try:
        out = []
        with tarfile.open(path, "r:") as t:
            for m in t:
                name = m.name.encode("utf-8", "surrogateescape")
                if not m.isreg() or not has_key(name):
                    continue
                data = t.extractfile(m).read()
                out.append([name.hex(), hashlib.md5(data).hexdigest()])
        return {"ok": True, "members": sorted(out)}
    except Exception as e:  # any failure: tarfile does not read the file
        return {"ok": False, "error": repr(e)[:200], "members": []}


def header(name, typeflag, size, magic=b"ustar\x0000", link=b""):
    h = bytearray(512)
    h[0 : len(name)] = name
    h[157 : 157 + len(link)] = link
    h[100:108] = b"0000644\0"
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"00000000000\0"
    h[156] = typeflag
    h[257:265] = magic
    checksum(h)
    return bytes(h)


def checksum(h):
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)


def pad(b):
    return b + b"\0" * (-len(b) % 512)


def member(name, data):
    return header(name, ord("0"), len(data)) + pad(data)


def regular_names(cmd, path):
    """The regular files a `tar tvf`-style listing shows, and its exit status."""
    r = subprocess.run(cmd + [path], capture_output=True)
    # GNU tar shows a contiguous file (type 7) as `C`; links end in "link to X" or "-> X".
    names = [l.split()[-1] for l in r.stdout.splitlines()
             if l[:1] in (b"-", b"C") and b" link to " not in l and b" -> " not in l]
    return r.returncode, [n for n in names if has_key(n)]


TYPES = [b"0", b"\0", b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"g", b"x", b"X", b"L",
         b"K", b"S", b"V", b"M", b"N", b"D", b"A", b"E", b"I", b"Z", b"9", b"\xff"]


def types(dir, out):
    """Per type flag, size and name: an archive `a.txt`, the entry, `b.txt`, `c.txt`."""
    cases = []
    for t in TYPES:
        for size in (0, 1024):
            for name in (b"t.x", b"d/", b"b.txt"):
                body = (member(b"a.txt", b"AAAAA") + header(name, t[0], size, link=b"a.txt" if t in (b"1", b"2") else b"")
                        + member(b"b.txt", b"BBBB") + member(b"c.txt", b"CCC") + b"\0" * 1024)
                path = os.path.join(dir, "type-%s-%d-%s.tar" % (t.hex(), size, name.hex()))
                with open(path, "wb") as f:
                    f.write(body)
                py = tarfile_members(path)
                gnu = regular_names(["tar", "tvf"], path)
                bsd = regular_names(["bsdtar", "tvf"], path)
                py_names = None
                if py["ok"]:
                    with tarfile.open(path) as tf:
                        py_names = [m.name.encode("utf-8", "surrogateescape") for m in tf
                                    if m.isreg() and has_key(m.name.encode())]
                agree = (py_names is not None and gnu[0] == 0 and bsd[0] == 0
                         and gnu[1] == bsd[1] == py_names)
                cases.append({"file": path, "typeflag": t.hex(), "size": size,
                              "name": name.decode(), "agree": agree,
                              "gnu": [gnu[0], [n.decode() for n in gnu[1]]],
                              "bsd": [bsd[0], [n.decode() for n in bsd[1]]],
                              "tarfile": py})
    with open(out, "w") as f:
        json.dump(cases, f)


def bases(dir, rng):
    """Small shards of three samples by several writers."""
    src = os.path.join(dir, "src")
    files = []
    for i, (key, long) in enumerate([("a", False), ("b", True), ("c", False)]):
        k = ("d/" + "long_directory_name_" * 6 + key) if long else key
        for ext, n in (("jpg", 300 + 700 * i), ("cls", 2)):
            p = os.path.join(src, "%s.%s" % (k, ext))
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(bytes(rng.randrange(256) for _ in range(n)))
            files.append(os.path.relpath(p, src))
    out = []

    def cmd(name, args):
        path = os.path.join(dir, name)
        subprocess.run(args + [path] + files if args[0] != "bsdtar" else
                       args + [path, "-C", src] + files, cwd=src, check=True)
        out.append(path)

    cmd("gnu.tar", ["tar", "--format=gnu", "-cf"])
    cmd("posix.tar", ["tar", "--format=posix", "-cf"])
    cmd("bsd.tar", ["bsdtar", "--format=pax", "-cf"])
    for fmt, name in ((tarfile.USTAR_FORMAT, "py-ustar.tar"), (tarfile.GNU_FORMAT, "py-gnu.tar"),
                      (tarfile.PAX_FORMAT, "py-pax.tar")):
        path = os.path.join(dir, name)
        with tarfile.open(path, "w", format=fmt) as t:
            for f in files:
                try:
                    t.add(os.path.join(src, f), arcname=f)
                except ValueError:  # a name ustar cannot hold
                    pass
        out.append(path)
    try:
        import webdataset as wds
        path = os.path.join(dir, "wds.tar")
        with wds.TarWriter(path) as w:
            for key in ("a", "b", "c"):
                w.write({"__key__": "w/" + key, "jpg": bytes(range(200)) * 3, "cls": b"1"})
        out.append(path)
    except ImportError:
        pass
    return out


def headers(data):
    """Offsets of the header blocks tarfile finds."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as t:
            return [m.offset for m in t] + [m.offset_data - 512 for m in t] or [0]
    except Exception:
        return [0]


def edit_field(b, rng, at):
    h = bytearray(b[at : at + 512])
    field = rng.choice(["size", "size", "type", "type", "name", "magic", "mode"])
    if field == "size":
        old = int(h[124:135].strip(b"\0 ") or b"0", 8) if h[124] < 0x80 else 0
        new = max(0, rng.choice([0, 1, 511, 512, 513, old + 512, old - 512, old + 1, old * 2,
                                 len(b), 8 << 30]))
        h[124:136] = b"%011o\0" % new if new < 8 ** 11 else b"\x80" + new.to_bytes(11, "big")
    elif field == "type":
        h[156] = rng.choice(b"0\x0012345676gxXLKSVMNDAZ")
    elif field == "name":
        n = h[0:100].split(b"\0")[0]
        h[0:100] = pad(rng.choice([n + b"/", n.replace(b".", b"_"), b"", b"a.jpg", n[:-1]]))[:100]
        h[0:100] = h[0:100].ljust(100, b"\0")
    elif field == "magic":
        h[257:265] = rng.choice([b"ustar  \0", b"ustar\x0000", b"\0" * 8, b"ustaR\x0000"])
    else:
        h[100:108] = b"%07o\0" % rng.randrange(8 ** 7)
    if rng.random() < 0.9:
        checksum(h)
    return b[:at] + bytes(h) + b[at + 512 :]


def mutate(b, rng):
    """One mutation of `b`, and what it was."""
    n = len(b)
    if n < 1024:
        return b + bytes(512), "append a zero block"
    kind = rng.choice(["flip", "zeros", "random", "truncate", "field", "field", "field",
                       "swap", "repeat", "drop"])
    blocks = n // 512
    if kind == "flip":
        b = bytearray(b)
        for _ in range(rng.choice([1, 1, 2, 8])):
            i = rng.randrange(n)
            b[i] ^= 1 << rng.randrange(8)
        return bytes(b), kind
    if kind in ("zeros", "random"):
        at, k = rng.randrange(n), rng.choice([1, 8, 100, 512, 1500])
        fill = bytes(k) if kind == "zeros" else bytes(rng.randrange(256) for _ in range(k))
        return b[:at] + fill[: n - at] + b[at + k :], "%s %d@%d" % (kind, k, at)
    if kind == "truncate":
        at = rng.choice([rng.randrange(n), rng.randrange(blocks) * 512])
        return b[:at], "truncate@%d" % at
    if kind == "field":
        at = rng.choice(headers(b))
        return edit_field(b, rng, at), "field@%d" % at
    i, j = rng.randrange(blocks), rng.randrange(blocks)
    blk = lambda k: b[k * 512 : (k + 1) * 512]
    if kind == "swap":
        i, j = min(i, j), max(i, j)
        if i == j:
            return b, "swap-none"
        return (b[: i * 512] + blk(j) + b[(i + 1) * 512 : j * 512] + blk(i) + b[(j + 1) * 512 :],
                "swap %d,%d" % (i, j))
    if kind == "repeat":
        return b[: j * 512] + blk(i) + b[j * 512 :], "repeat %d@%d" % (i, j)
    return b[: i * 512] + b[(i + 1) * 512 :], "drop %d" % i


def mutants(dir, seed, count, out):
    rng = random.Random(seed)
    base = bases(dir, random.Random(0))
    data = {p: open(p, "rb").read() for p in base}
    cases = []
    for i in range(count):
        src = base[i % len(base)]
        b, how = data[src], []
        for _ in range(rng.choice([1, 1, 1, 2])):
            b, what = mutate(b, rng)
            how.append(what)
        path = os.path.join(dir, "m%05d-%s" % (i, os.path.basename(src)))
        with open(path, "wb") as f:
            f.write(b)
        case = tarfile_members(path)
        case.update({"file": path, "how": "%s: %s" % (os.path.basename(src), "; ".join(how))})
        cases.append(case)
    with open(out, "w") as f:
        json.dump(cases, f)


def main():
    cmd = sys.argv[1]
    if cmd == "list":
        res = [dict(tarfile_members(p), file=p) for p in sys.argv[3:]]
        with open(sys.argv[2], "w") as f:
            json.dump(res, f)
    elif cmd == "types":
        types(sys.argv[2], sys.argv[3])
    elif cmd == "mutants":
        mutants(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        sys.exit("unknown command " + cmd)


if __name__ == "__main__":
    main()
