"""Read throughput with typed fields (issue 21): what carrying fields costs the loader.

    /usr/bin/python3 bench/fields_bench.py CORPUS WORKDIR [--cli build/shardfeed] [--rounds 3]

Packs CORPUS (an image folder, e.g. bench/make_corpus.py's) twice: as a folder (schema image,
label, path) and from a JSONL manifest as a detection set (image, label, boxes float32[n,4] with
1-5 random boxes per image, box_labels int64[*] per box, caption str). Then reads each with
`shardfeed bench` (batch 64, 2 workers, uint8, 2 epochs) in alternated rounds and prints the
median images/s of each case and its ratio to the image + label case (the folder pack read with
--fields "": no field work at all), and the CPU time (user + system, all threads) per image,
which a busy shared machine disturbs far less than wall-clock rates: on a CPU-bound reader the
throughput ratio at full use is the inverse of the CPU-time ratio. Cases: centre crop 224 and
RRC 224 + flip.

With --raw16 the same two sources are packed as raw 16x16 records instead, and read with RRC 16
+ flip, 1 worker, 20 epochs: decoding then costs a few microseconds, so the CPU time per image
shows the field work itself (docs/BENCHMARKS.md, "Typed fields in batches").
"""
import argparse
import json
import os
import random
import resource
import statistics
import subprocess

from PIL import Image


def detection_manifest(corpus, out_dir):
    rng = random.Random(0)
    files = sorted(os.path.relpath(os.path.join(d, f), corpus)
                   for d, _, fs in os.walk(corpus) for f in fs)
    classes = sorted({f.split("/")[0] for f in files})
    path = os.path.join(out_dir, "detection.jsonl")
    with open(path, "w") as out:
        for f in files:
            w, h = Image.open(os.path.join(corpus, f)).size  # stored pixels (no EXIF turn)
            boxes = []
            for _ in range(rng.randint(1, 5)):
                bw, bh = rng.uniform(0.1, 0.6) * w, rng.uniform(0.1, 0.6) * h
                x0, y0 = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
                boxes.append([round(x0, 2), round(y0, 2), round(x0 + bw, 2), round(y0 + bh, 2)])
            out.write(json.dumps({
                "image": os.path.join(os.path.abspath(corpus), f),
                "label": classes.index(f.split("/")[0]), "boxes": boxes,
                "box_labels": [rng.randrange(80) for _ in boxes],
                "caption": "a photo of %s number %d" % (f.split("/")[0], rng.randrange(10 ** 6)),
            }) + "\n")
    schema = os.path.join(out_dir, "detection.schema.json")
    with open(schema, "w") as s:
        json.dump({"image": "image", "label": "int64", "boxes": "boxes",
                   "box_labels": {"type": "int64[*]", "per": "boxes"}, "caption": "str"}, s)
    return path, schema


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("workdir")
    ap.add_argument("--cli", default="build/shardfeed")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--raw16", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    raw = ["--encoding", "raw", "--size", "16", "--crop", "center"] if a.raw16 else []
    suffix = "_raw16" if a.raw16 else ""
    folder = os.path.join(a.workdir, "folder%s.sf" % suffix)
    det = os.path.join(a.workdir, "detection%s.sf" % suffix)
    if not os.path.isdir(folder):
        subprocess.run([a.cli, "pack", a.corpus, folder, "-q"] + raw, check=True)
    if not os.path.isdir(det):
        manifest, schema = detection_manifest(a.corpus, a.workdir)
        subprocess.run([a.cli, "pack", manifest, det, "--schema", schema, "-q"] + raw, check=True)

    common = ["--batch-size", "64", "--workers", "2", "--epochs", "2", "--size", "224"]
    crops = {"centre 224": ["--crop", "center"], "RRC 224 + flip": ["--crop", "random", "--flip"]}
    if a.raw16:
        common = ["--batch-size", "64", "--workers", "1", "--epochs", "20", "--size", "16"]
        crops = {"raw 16x16, RRC 16 + flip": ["--crop", "random", "--flip"]}
    cases = [("image + label (folder pack, --fields '')", folder, ["--fields", ""]),
             ("image + label + path (folder pack, default fields)", folder, []),
             ("detection archive, --fields ''", det, ["--fields", ""]),
             ("image + boxes + box_labels + caption (all fields)", det, [])]
    env = dict(os.environ, SHARDFEED_DISABLE_CUDA="1")
    for crop, crop_args in crops.items():
        got = {name: [] for name, _, _ in cases}
        cpu = {name: [] for name, _, _ in cases}
        for _ in range(a.rounds):
            for name, path, extra in cases:
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                r = subprocess.run([a.cli, "bench", path, "--json"] + common + crop_args + extra,
                                   check=True, capture_output=True, text=True, env=env)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                out = json.loads(r.stdout)
                got[name].append(out["images_per_second"])
                seconds = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                cpu[name].append(seconds / out["images"] * 1e6)
        base = statistics.median(got[cases[0][0]])
        base_cpu = statistics.median(cpu[cases[0][0]])
        print("## %s (median of %d alternated rounds)" % (crop, a.rounds))
        for name, _, _ in cases:
            m, c = statistics.median(got[name]), statistics.median(cpu[name])
            print("%-56s %8.0f img/s %.3fx  %7.1f us CPU/img %.3fx" % (name, m, m / base, c,
                                                                        c / base_cpu))


if __name__ == "__main__":
    main()
