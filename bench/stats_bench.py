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
- CleanVision and fastdup (PyPI; bench/install-peers.sh puts them in the peers' venv, given by
  --peers-python) on the corpus's image files with the same workers: seconds for their
  duplicate / near-duplicate / quality pass, and what they found beside what `stats` found
  (exact and near groups, near pairs across source photographs, dark and blurry counts). A peer
  that does not import or run is reported with its error.
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


def cross_pairs(groups, labels):
    """Pairs inside `groups` (lists of indices into `labels`) whose labels differ."""
    return sum(1 for g in groups for i in range(len(g)) for j in range(i + 1, len(g))
               if labels[g[i]] != labels[g[j]])


# Each peer runs in the peers' venv, on the image files, and prints one JSON line: seconds for
# its pass, and its groups as lists of paths relative to the corpus.
CLEANVISION = r"""
import json, os, sys, time
from cleanvision import Imagelab
corpus, workers = sys.argv[1], int(sys.argv[2])
t = time.perf_counter()
lab = Imagelab(data_path=corpus)
lab.find_issues({"exact_duplicates": {}, "near_duplicates": {}, "dark": {}, "blurry": {},
                 "low_information": {}}, n_jobs=workers, verbose=False)
seconds = time.perf_counter() - t
rel = lambda p: os.path.relpath(p, corpus)
issues = lab.issues
print(json.dumps({
    "seconds": seconds,
    "exact": [[rel(p) for p in g] for g in lab.info["exact_duplicates"]["sets"]],
    "near": [[rel(p) for p in g] for g in lab.info["near_duplicates"]["sets"]],
    "dark": int(issues["is_dark_issue"].sum()), "blurry": int(issues["is_blurry_issue"].sum()),
    "uniform": int(issues["is_low_information_issue"].sum())}))
"""

FASTDUP = r"""
import json, os, sys, tempfile, time
import fastdup
corpus, workers = sys.argv[1], int(sys.argv[2])
work = tempfile.mkdtemp(prefix="fastdup-")
t = time.perf_counter()
fd = fastdup.create(work_dir=work, input_dir=corpus)
fd.run(num_threads=workers, overwrite=True, verbose=False)
seconds = time.perf_counter() - t
rel = lambda p: os.path.relpath(p, corpus)
cc, _ = fd.connected_components()
near = [[rel(p) for p in g["filename"]] for _, g in cc.groupby("component_id") if len(g) > 1]
stats = fd.img_stats()
print(json.dumps({"seconds": seconds, "exact": [], "near": near,
                  "dark": int((stats["mean"] < 25).sum()) if "mean" in stats else None,
                  "blurry": int((stats["blur"] < 50).sum()) if "blur" in stats else None,
                  "uniform": None}))
"""

PEERS = {"cleanvision": CLEANVISION, "fastdup": FASTDUP}


def peer(tool, args, labels, n):
    """Runs `tool` on the corpus's images in the peers' venv and prints what it found, or why
    it could not."""
    if not os.path.exists(args.peers_python):
        print("%s: not run: no %s (bash bench/install-peers.sh)" % (tool, args.peers_python))
        return
    p = subprocess.run([args.peers_python, "-c", PEERS[tool], os.path.abspath(args.corpus),
                        str(args.workers)], capture_output=True, text=True, timeout=3600,
                       env=dict(os.environ, SENTRY_OPT_OUT="1"))  # fastdup: no telemetry
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0 or not lines:
        err = (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
        print("%s: did not run: %s" % (tool, err))
        return
    r = json.loads(lines[-1])
    index = {path: i for i, (_, path) in enumerate(
        (c, os.path.relpath(f, args.corpus)) for c, f in files_of(args.corpus))}
    near = [[index[p] for p in g if p in index] for g in r["near"]]
    print("%-11s %6.2f s  %7.0f img/s on the image files: %d exact groups, %d near groups "
          "(%d pairs across source photographs), dark %s, blurry %s, low information %s"
          % (tool, r["seconds"], n / r["seconds"], len(r["exact"]), len(near),
             cross_pairs(near, labels), r["dark"], r["blurry"], r["uniform"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus")
    ap.add_argument("--build", default="build")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--planted", type=int, default=200)
    ap.add_argument("--peers-python", default="/tmp/peers/bin/python",
                    help="the interpreter of bench/install-peers.sh's venv")
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
        print("stats findings: %d exact groups, %d near groups (%d pairs across source "
              "photographs), %d dark, %d blurry, %d uniform"
              % (len(s["duplicates"]), len(s["near_duplicates"]),
                 cross_pairs(s["near_duplicates"], labels), len(s["flags"]["dark"]),
                 len(s["flags"]["blurry"]), len(s["flags"]["uniform"])))
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
        for tool in PEERS:
            peer(tool, args, labels, n)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
