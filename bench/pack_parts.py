#!/usr/bin/env python3
"""Split packing on one machine: a single `pack` (all cores) against N parts run in parallel
(`pack --part I/N`, cores split between them) followed by `merge`, on the same corpus, page cache
warm, each configuration run `--rounds` times interleaved (median). Then a projection to many
nodes, with the assumptions printed beside it.

    pack_parts.py CORPUS [--cli build/shardfeed] [--parts 2] [--rounds 3] [--nodes 100]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time


def timed(cmds):
    """Runs the commands in parallel; returns the wall time until all are done."""
    t = time.perf_counter()
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c in cmds]
    for p in procs:
        _, err = p.communicate()
        assert p.returncode == 0, err.decode()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("--cli", default="build/shardfeed")
    ap.add_argument("--parts", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=100)
    args = ap.parse_args()
    files = sum(len(fs) for _, _, fs in os.walk(args.corpus))
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(args.corpus) for f in fs)
    cores = os.cpu_count()
    per_part = max(1, cores // args.parts)
    single, split, merge = [], [], []
    work = tempfile.mkdtemp(prefix="pack-parts-")
    try:
        for _ in range(args.rounds):
            out = os.path.join(work, "single")
            shutil.rmtree(out, ignore_errors=True)
            single.append(timed([[args.cli, "pack", args.corpus, out, "-q",
                                  "--workers", str(cores)]]))
            out = os.path.join(work, "split")
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(out + ".parts", ignore_errors=True)
            split.append(timed([[args.cli, "pack", args.corpus, out, "-q", "--part",
                                 "%d/%d" % (i, args.parts), "--workers", str(per_part)]
                                for i in range(args.parts)]))
            merge.append(timed([[args.cli, "merge", out + ".parts", out]]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    s, p, m = statistics.median(single), statistics.median(split), statistics.median(merge)
    print("corpus: %d files, %.1f MB; %d cores; median of %d rounds" % (files, size / 1e6, cores,
                                                                        args.rounds))
    print("%-44s %8.2f s %9.0f files/s" % ("single pack (%d workers)" % cores, s, files / s))
    print("%-44s %8.2f s %9.0f files/s   vs single %.2fx" % (
        "%d parts in parallel (%d workers each)" % (args.parts, per_part), p, files / p, s / p))
    print("%-44s %8.3f s (%.1f%% of the split pack)" % ("merge (hard links, manifest)", m,
                                                        100 * m / p))
    per_node = files / p  # this machine as one node
    print("\nprojection to %d nodes like this one (assumptions below):" % args.nodes)
    print("  %.0f files/s x %d nodes = %.0f files/s (%.0f MB/s read), then one merge of about"
          " %.0f ms per part (%.1f s for %d parts), whatever the data size" % (
              per_node, args.nodes, per_node * args.nodes, size / p * args.nodes / 1e6,
              1e3 * m / args.parts, m / args.parts * args.nodes, args.nodes))
    print("  assumes: parts are independent (they are: no communication until merge), the shared")
    print("  storage serves %.0f MB/s of reads and the writes (else it, not the nodes, bounds the"
          % (size / p * args.nodes / 1e6))
    print("  rate), and merge stays O(shards): %d parts x a few shards each, metadata only." %
          args.nodes)


if __name__ == "__main__":
    main()
