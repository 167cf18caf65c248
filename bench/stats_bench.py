#!/usr/bin/env python3
"""`shardfeed stats` against `shardfeed verify --decode` on the same archive and workers, and the
near-duplicate defaults measured on real photos.

    stats_bench.py CORPUS [--build build] [--workers 2] [--planted 200]

CORPUS is an image folder (bench/make_corpus.py). Prints:
- seconds and images/s of `verify --decode` and of `stats` (best of 3 each, page cache warm);
- near-duplicate pairs `stats` reports among the corpus's own photos (with the default
  threshold), split by whether the two come from the same source photograph (the corpus is
  crops of 11 photographs, so same-source pairs may be real overlaps) or not (false pairs);
- recall and precision on planted near duplicates: the first --planted photos plus, for each,
  a copy re-encoded at quality 50, resized by 10%, shifted by 2 px and by 4 px, and 8% brighter.
fastdup and CleanVision are compared when importable (neither is installed by
scripts/install-deps.sh; the script says so).
"""
import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from PIL import Image, ImageEnhance

import numpy as np


def run(cli, *args):
    p = subprocess.run([cli, *map(str, args)], capture_output=True, text=True)
    if p.returncode not in (0, 1):
        sys.exit("%s failed: %s" % (" ".join(map(str, args)), p.stderr))
    return p


def best_of(n, fn):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def jpeg(img, quality=90):
    b = io.BytesIO()
    img.save(b, "JPEG", quality=quality)
    return b.getvalue()


def shifted(img, dx, dy):
    a = np.pad(np.asarray(img), ((dy, 0), (dx, 0), (0, 0)), mode="edge")
    return Image.fromarray(np.ascontiguousarray(a[:img.height, :img.width]))


PLANTED = {
    "reencoded-q50": lambda im: Image.open(io.BytesIO(jpeg(im, 50))),
    "resized-90%": lambda im: im.resize((round(im.width * .9), round(im.height * .9)),
                                        Image.BILINEAR),
    "shifted-2px": lambda im: shifted(im, 2, 1),
    "shifted-4px": lambda im: shifted(im, 4, 3),
    "brighter-8%": lambda im: ImageEnhance.Brightness(im).enhance(1.08),
}


def files_of(corpus):
    out = []
    for c in sorted(os.listdir(corpus)):
        d = os.path.join(corpus, c)
        if os.path.isdir(d):
            out += [(c, os.path.join(d, f)) for f in sorted(os.listdir(d))
                    if not f.startswith(".")]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus")
    ap.add_argument("--build", default="build")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--planted", type=int, default=200)
    args = ap.parse_args()
    cli = os.path.join(args.build, "shardfeed")
    work = tempfile.mkdtemp(prefix="stats-bench-")
    try:
        archive = os.path.join(work, "corpus.sf")
        run(cli, "pack", args.corpus, archive, "-q")
        n = len(files_of(args.corpus))
        w = str(args.workers)
        run(cli, "verify", archive, "--decode", "--workers", w)  # warm the page cache
        verify_s = best_of(3, lambda: run(cli, "verify", archive, "--decode", "--workers", w))
        k = [0]

        def stats():
            k[0] += 1
            run(cli, "stats", archive, "-q", "--workers", w, "--json",
                os.path.join(work, "s%d.json" % k[0]))
        stats_s = best_of(3, stats)
        s = json.load(open(os.path.join(work, "s%d.json" % k[0])))
        print("%d images, %s workers" % (n, w))
        print("verify --decode  %6.2f s  %7.0f img/s" % (verify_s, n / verify_s))
        print("stats            %6.2f s  %7.0f img/s  (%.2fx of verify --decode)"
              % (stats_s, n / stats_s, verify_s / stats_s))
        labels = [c for c, _ in files_of(args.corpus)]
        same = cross = 0
        for g in s["near_duplicates"]:
            for i in range(len(g)):
                for j in range(i + 1, len(g)):
                    if labels[g[i]] == labels[g[j]]:
                        same += 1
                    else:
                        cross += 1
        print("near-duplicate pairs among the corpus photos (threshold %d): %d from the same "
              "source photograph, %d across sources (false); exact groups %d"
              % (s["thresholds"]["near_threshold"], same, cross, len(s["duplicates"])))

        # Planted near duplicates.
        src = os.path.join(work, "planted")
        originals = files_of(args.corpus)[:args.planted]
        os.makedirs(os.path.join(src, "x"))
        names = []
        for i, (_, path) in enumerate(originals):
            im = Image.open(path).convert("RGB")
            variants = [("orig", im)] + [(k, f(im)) for k, f in PLANTED.items()]
            for v, (kind, img) in enumerate(variants):
                name = "%05d_%d.jpg" % (i, v)
                with open(os.path.join(src, "x", name), "wb") as f:
                    f.write(jpeg(img.convert("RGB"), 90))
                names.append((i, kind))
        planted = os.path.join(work, "planted.sf")
        run(cli, "pack", src, planted, "-q")
        out = os.path.join(work, "planted.json")
        run(cli, "stats", planted, "-q", "--workers", w, "--json", out)
        p = json.load(open(out))
        group_of = {}
        for g in p["near_duplicates"] + p["duplicates"]:
            for i in g:
                group_of[i] = tuple(g)
        per = len(PLANTED) + 1
        found_pairs = true_pairs = 0
        for g in p["near_duplicates"]:
            for a in range(len(g)):
                for b in range(a + 1, len(g)):
                    found_pairs += 1
                    true_pairs += g[a] // per == g[b] // per
        print("planted near duplicates (%d photos x %d variants):" % (len(originals),
                                                                       len(PLANTED)))
        for v, kind in enumerate(PLANTED, start=1):
            hit = sum(1 for i in range(len(originals))
                      if group_of.get(i * per) is not None and i * per + v in group_of[i * per])
            print("  %-14s recall %.3f (%d of %d)" % (kind, hit / len(originals), hit,
                                                      len(originals)))
        print("  precision %.4f (%d of %d pairs in reported groups are planted)"
              % (true_pairs / max(1, found_pairs), true_pairs, found_pairs))
        for tool in ("fastdup", "cleanvision"):
            try:
                __import__(tool)
                print("%s is importable: not compared yet" % tool)
            except ImportError:
                print("%s: not installed (not in Debian; pip would need the network)" % tool)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
