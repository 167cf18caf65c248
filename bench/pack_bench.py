#!/usr/bin/env python3
"""Pack throughput: `shardfeed pack` for each encoding beside the straightforward Python loop a
user would write (python-lmdb + Pillow), on the same folder, in one run.

    pack_bench.py CORPUS [--shardfeed build/shardfeed] [--workers N] [--size 256]

CORPUS is an ImageFolder tree (bench/make_corpus.py makes one). All runs read a warm page cache
(the corpus is read once first) and write to a fresh directory on the same disk. Times include
scanning the folder and, for shardfeed, process start-up.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import lmdb
from PIL import Image

from common import scan_folder as scan



def python_loop(root, out, decode_size=None):
    """What people write: one process, read each file, (decode + resize), put into LMDB."""
    items = scan(root)
    env = lmdb.open(out, map_size=1 << 40, subdir=True, sync=False)
    txn = env.begin(write=True)
    nbytes = 0
    for i, (path, label) in enumerate(items):
        if decode_size is None:
            with open(path, "rb") as f:
                value = f.read()
        else:
            img = Image.open(path).convert("RGB")
            w, h = img.size
            s = decode_size / min(w, h)
            img = img.resize((max(1, round(w * s)), max(1, round(h * s))), Image.BILINEAR)
            value = img.tobytes()
        nbytes += os.path.getsize(path)
        txn.put(b"%08d" % i, label.to_bytes(4, "little") + value)
        if i % 1000 == 999:
            txn.commit()
            txn = env.begin(write=True)
    txn.commit()
    env.sync()
    env.close()
    return len(items), nbytes


def timed(fn):
    t = time.perf_counter()
    r = fn()
    return r, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus")
    ap.add_argument("--shardfeed", default="build/shardfeed")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--level", type=int, default=3, help="a second zstd level to compare with the default (1)")
    args = ap.parse_args()

    items = scan(args.corpus)
    total = sum(os.path.getsize(p) for p, _ in items)
    for p, _ in items:  # warm the page cache for every contender alike
        with open(p, "rb") as f:
            f.read()
    tmp = tempfile.mkdtemp(prefix="shardfeed-packbench-", dir=os.path.dirname(os.path.abspath(args.corpus)))

    def settle():
        # Earlier runs' dirty pages must not be written back during the next run (the kernel's
        # flusher threads would take CPU from it).
        os.sync()
        time.sleep(1)

    def shardfeed(*extra):
        out = os.path.join(tmp, "sf")
        shutil.rmtree(out, ignore_errors=True)
        settle()
        cmd = [args.shardfeed, "pack", args.corpus, out, "-q", "--workers", str(args.workers), *extra]
        (_, secs) = timed(lambda: subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL))
        return secs

    def py(decode_size):
        out = os.path.join(tmp, "py")
        shutil.rmtree(out, ignore_errors=True)
        settle()
        (_, secs) = timed(lambda: python_loop(args.corpus, out, decode_size))
        return secs

    n = len(items)
    print("corpus: %s, %d files, %.1f MB; %d CPU(s); shardfeed --workers %d"
          % (args.corpus, n, total / 1e6, os.cpu_count(), args.workers))
    rows = []
    py_copy = py(None)
    py_decode = py(args.size)
    rows.append(("python loop: read + lmdb put (no validation)", py_copy, None))
    rows.append(("shardfeed pack --encoding jpeg (header validation)", shardfeed(), py_copy))
    rows.append(("shardfeed pack --encoding jpeg --validate full", shardfeed("--validate", "full"), py_copy))
    rows.append(("python loop: Pillow decode + resize %d + lmdb put" % args.size, py_decode, None))
    rows.append(("shardfeed pack --encoding raw --size %d" % args.size,
                 shardfeed("--encoding", "raw", "--size", str(args.size)), py_decode))
    rows.append(("shardfeed pack --encoding zstd --size %d --level %d" % (args.size, args.level),
                 shardfeed("--encoding", "zstd", "--size", str(args.size), "--level", str(args.level)),
                 py_decode))
    rows.append(("shardfeed pack --encoding zstd --size %d --level 1" % args.size,
                 shardfeed("--encoding", "zstd", "--size", str(args.size), "--level", "1"), py_decode))
    print("%-58s %10s %8s %14s" % ("method", "files/s", "MB/s", "vs python loop"))
    for name, secs, base in rows:
        ratio = "%.2fx" % (base / secs) if base else "(baseline)"
        print("%-58s %10.0f %8.1f %14s" % (name, n / secs, total / secs / 1e6, ratio))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
