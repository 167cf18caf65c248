#!/usr/bin/env python3
"""A COCO-shaped import: 100k annotations (synthetic: 5000 small JPEGs, 20 boxes each, 80
categories with COCO's gappy ids, captions) packed with `shardfeed pack instances.json OUT --images
DIR`. Prints the seconds and annotations/s. Issue 21 asks for seconds, not minutes.

  python3 bench/import_bench.py [--cli build/shardfeed] [--annotations 100000] [--images 5000]
"""
import argparse
import io
import json
import os
import random
import subprocess
import sys
import tempfile
import time


def make_jpeg(size=16):
    from PIL import Image
    b = io.BytesIO()
    Image.new("RGB", (size, size), (90, 120, 200)).save(b, "JPEG", quality=80)
    return b.getvalue()


def make_coco(root, n_images, n_annotations, seed=0):
    rng = random.Random(seed)
    images_dir = os.path.join(root, "images")
    os.makedirs(images_dir)
    jpeg = make_jpeg()
    images, annotations, captions = [], [], []
    for i in range(n_images):
        name = "%012d.jpg" % (i + 1)
        with open(os.path.join(images_dir, name), "wb") as f:
            f.write(jpeg)
        images.append({"id": i + 1, "file_name": name, "width": 16, "height": 16})
        captions.append({"id": i + 1, "image_id": i + 1, "caption": "a synthetic picture %d" % i})
    category_ids = [c for c in range(1, 91) if c not in (12, 26, 29, 30, 45, 66, 68, 69, 71, 83)]
    for a in range(n_annotations):
        x, y = rng.uniform(0, 10), rng.uniform(0, 10)
        annotations.append({"id": a + 1, "image_id": a % n_images + 1,
                             "category_id": rng.choice(category_ids),
                             "bbox": [x, y, rng.uniform(1, 6), rng.uniform(1, 6)],
                             "area": 10.0, "iscrowd": int(rng.random() < 0.01),
                             "segmentation": [[x, y, x + 1, y, x + 1, y + 1]]})
    categories = [{"id": c, "name": "class%d" % c, "supercategory": "x"} for c in category_ids]
    instances = os.path.join(root, "instances.json")
    with open(instances, "w") as f:
        json.dump({"images": images, "annotations": annotations, "categories": categories}, f)
    with open(os.path.join(root, "captions.json"), "w") as f:
        json.dump({"images": images, "annotations": captions}, f)
    return instances, images_dir


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cli", default=os.environ.get("SHARDFEED_CLI", "shardfeed"))
    ap.add_argument("--annotations", type=int, default=100000)
    ap.add_argument("--images", type=int, default=5000)
    ap.add_argument("--workers", type=int, default=0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as root:
        instances, images_dir = make_coco(root, args.images, args.annotations)
        out = os.path.join(root, "coco.shardfeed")
        cmd = [args.cli, "pack", instances, out, "--images", images_dir, "--captions",
               os.path.join(root, "captions.json"), "--workers", str(args.workers), "-q"]
        start = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if p.returncode != 0:
            sys.exit("pack failed (%d): %s" % (p.returncode, p.stderr))
        mb = os.path.getsize(instances) / 1e6
        print("COCO import: %d annotations on %d images (%.1f MB of JSON) packed in %.2f s "
              "(%.0f annotations/s, %.0f images/s)"
              % (args.annotations, args.images, mb, seconds, args.annotations / seconds,
                 args.images / seconds))


if __name__ == "__main__":
    main()
