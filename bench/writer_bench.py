#!/usr/bin/env python3
"""Writer throughput: shardfeed.Writer fed from a Python iterable of JPEG bytes against the pack
CLI on the same images (goal: the Writer at >= 0.5x the CLI's files/s), beside FFCV's
DatasetWriter (BytesField + IntField + JSONField) and MosaicML Streaming's MDSWriter (bytes,
int, json columns) when they can be imported.

    PYTHONPATH=build/python python3 bench/writer_bench.py CORPUS [--shardfeed build/shardfeed]
        [--workers N] [--repeat 3]

CORPUS is an ImageFolder tree (bench/make_corpus.py makes one). The CLI reads the files itself;
every Python writer gets the same list of (JPEG bytes, label) held in memory (read before the
clock starts), so the figures compare the writers, not the disk. The page cache is warm for all.
Each figure is the best of --repeat runs; every run writes to a fresh directory on the corpus's
disk. The Writer's figure includes the Python loop (one dict per sample) and its close().
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import shardfeed

from common import scan_folder as scan



def best(fn, repeat, tmp):
    """The shortest of `repeat` runs of fn(out) (seconds), each into a fresh path."""
    times = []
    for r in range(repeat):
        out = os.path.join(tmp, "out%d" % r)
        t = time.perf_counter()
        fn(out)
        times.append(time.perf_counter() - t)
        shutil.rmtree(out, ignore_errors=True)
    return min(times)


def cli_pack(shardfeed_bin, corpus, workers):
    def run(out):
        subprocess.run([shardfeed_bin, "pack", corpus, out, "--workers", str(workers)],
                       check=True, stdout=subprocess.DEVNULL)
    return run


def writer(data, workers, meta):
    schema = {"image": "image", "label": "int64"}
    if meta:
        schema["meta"] = "json"

    def run(out):
        with shardfeed.Writer(out, schema=schema, workers=workers) as w:
            if meta:
                for i, (b, label) in enumerate(data):
                    w.write({"image": b, "label": label, "meta": {"id": i, "src": "bench"}})
            else:
                for b, label in data:
                    w.write({"image": b, "label": label})
    return run


def ffcv_writer(data, workers):
    try:
        import numpy as np
        from ffcv.fields import BytesField, IntField, JSONField
        from ffcv.writer import DatasetWriter
    except ImportError:
        return None

    class Source:
        def __len__(self):
            return len(data)

        def __getitem__(self, i):
            b, label = data[i]
            return np.frombuffer(b, np.uint8), label, {"id": i, "src": "bench"}

    def run(out):
        os.makedirs(out)
        DatasetWriter(os.path.join(out, "data.beton"),
                      {"image": BytesField(), "label": IntField(), "meta": JSONField()},
                      num_workers=workers).from_indexed_dataset(Source())
    return run


def streaming_writer(data):
    try:
        from streaming import MDSWriter
    except ImportError:
        return None

    def run(out):
        with MDSWriter(out=out, columns={"image": "bytes", "label": "int", "meta": "json"}) as w:
            for i, (b, label) in enumerate(data):
                w.write({"image": b, "label": label, "meta": {"id": i, "src": "bench"}})
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus")
    ap.add_argument("--shardfeed", default="build/shardfeed")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    items = scan(args.corpus)
    data = []
    for path, label in items:
        with open(path, "rb") as f:
            data.append((f.read(), label))
    n = len(data)
    mb = sum(len(b) for b, _ in data) / 1e6
    tmp = tempfile.mkdtemp(prefix="shardfeed-writerbench-",
                           dir=os.path.dirname(os.path.abspath(args.corpus)))
    print("%d JPEGs (%.1f MB), %d workers, best of %d, python %s" % (
        n, mb, args.workers, args.repeat, sys.version.split()[0]))
    try:
        cli = n / best(cli_pack(args.shardfeed, args.corpus, args.workers), args.repeat, tmp)
        py = n / best(writer(data, args.workers, False), args.repeat, tmp)
        py_meta = n / best(writer(data, args.workers, True), args.repeat, tmp)
        print("%-44s %10.0f files/s" % ("shardfeed pack (CLI, files)", cli))
        print("%-44s %10.0f files/s  %.2fx the CLI (goal >= 0.5x)" % (
            "shardfeed.Writer (image, label)", py, py / cli))
        print("%-44s %10.0f files/s  %.2fx the CLI" % (
            "shardfeed.Writer (image, label, json)", py_meta, py_meta / cli))
        peers = (("FFCV DatasetWriter (bytes, int, json)", ffcv_writer(data, args.workers)),
                 ("Streaming MDSWriter (bytes, int, json)", streaming_writer(data)))
        for name, run in peers:
            if run is None:
                print("%-44s %10s" % (name, "not installed"))
            else:
                rate = n / best(run, args.repeat, tmp)
                print("%-44s %10.0f files/s  %.2fx the CLI" % (name, rate, rate / cli))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
