#!/usr/bin/env python3
"""Builds the benchmark corpus: a folder of real-photo JPEGs shaped like a typical image dataset
(about 460x400 pixels, 50-90 KB), cut from the photographs in Debian's
plasma-workspace-wallpapers package (install with scripts/install-deps.sh --bench).

    make_corpus.py OUT [--count 3000] [--camera]

With --camera, camera-size photos instead: crops of 1600-2560 px on the long side (aspect 4:3
to 3:2, never enlarged), quality 88-95, the size people's own photo collections have.

Each image is a random crop of one photograph, resized with Pillow (Lanczos) to a short side of
360-480 pixels and an aspect ratio of 3:4 to 3:2, saved as baseline JPEG at quality 85-95. The
class is the source photograph. Deterministic for a given --seed.
"""
import argparse
import glob
import os
import random

from PIL import Image

# The wallpapers in the package that are photographs (not paintings or renders).
PHOTOS = ["BytheWater", "ColdRipple", "ColorfulCups", "DarkestHour", "EveningGlow",
          "FallenLeaf", "Grey", "Kite", "OneStandsOut", "Path", "summer_1am"]
ROOT = "/usr/share/wallpapers"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--camera", action="store_true", help="1600-2560 px photos")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    sources = []
    for name in PHOTOS:
        files = sorted(glob.glob(os.path.join(ROOT, name, "contents", "images", "2560x1600.jpg")))
        if not files:
            raise SystemExit("missing %s: run scripts/install-deps.sh --bench" % name)
        sources.append((name, Image.open(files[0]).convert("RGB")))
    total_bytes = 0
    for i in range(args.count):
        name, photo = sources[i % len(sources)]
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        if args.camera:
            aspect = rng.choice([4 / 3, 3 / 2, 3 / 4, 2 / 3])
            long_side = rng.randint(1600, 2560)
            w, h = (long_side, round(long_side / aspect)) if aspect >= 1 else \
                (round(long_side * aspect), long_side)
            w, h = min(w, photo.width), min(h, photo.height)
            x, y = rng.randint(0, photo.width - w), rng.randint(0, photo.height - h)
            img = photo.crop((x, y, x + w, y + h))
            path = os.path.join(d, "%05d.jpg" % i)
            img.save(path, quality=rng.randint(88, 95))
            total_bytes += os.path.getsize(path)
            continue
        aspect = rng.uniform(0.75, 1.5)
        short = rng.randint(360, 480)
        w, h = (round(short * aspect), short) if aspect >= 1 else (short, round(short / aspect))
        scale = rng.uniform(1.2, 3.0)  # crop a region larger than the output, then shrink it
        cw, ch = min(photo.width, round(w * scale)), min(photo.height, round(h * scale))
        x, y = rng.randint(0, photo.width - cw), rng.randint(0, photo.height - ch)
        img = photo.crop((x, y, x + cw, y + ch)).resize((w, h), Image.LANCZOS)
        path = os.path.join(d, "%05d.jpg" % i)
        img.save(path, quality=rng.randint(85, 95))
        total_bytes += os.path.getsize(path)
    print("wrote %d JPEGs (%.1f MB, %.0f KB average) in %d classes to %s"
          % (args.count, total_bytes / 1e6, total_bytes / args.count / 1e3, len(sources), args.out))


if __name__ == "__main__":
    main()
