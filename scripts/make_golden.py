#!/usr/bin/env python3
"""Writes the golden archives under tests/format/golden/vN/: every backend x encoding, packed by
the shardfeed command given, from a small deterministic image folder, plus expected.json with
what any later build must read from them (labels, class names, record bytes and decoded pixels
as SHA-256). Run once per format version, by the build that introduces it; never regenerate an
existing version's files (that would hide a reader change).

    make_golden.py SHARDFEED_CLI OUT_DIR      (PYTHONPATH must reach that build's module)
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

from PIL import Image


def make_images(root):
    """3 classes x 2 JPEGs of different sizes (a gradient with a per-image tint), plus one
    EXIF-rotated photo-like file."""
    files = []
    for c, name in enumerate(["ant", "bee", "cat"]):
        os.makedirs(os.path.join(root, name))
        for k in range(2):
            w, h = 20 + 4 * c + k, 16 + 2 * k
            img = Image.new("RGB", (w, h))
            img.putdata([((x * 255) // w, (y * 255) // h, (40 * c + 90 * k) % 256)
                         for y in range(h) for x in range(w)])
            path = os.path.join(root, name, "%d.jpg" % k)
            exif = None
            if c == 2 and k == 1:
                exif = Image.Exif()
                exif[0x0112] = 6  # rotated 90 degrees
            img.save(path, quality=90, exif=exif) if exif else img.save(path, quality=90)
            files.append(path)
    return files


def main():
    cli, out = sys.argv[1], sys.argv[2]
    import numpy as np
    import shardfeed
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "src")
        make_images(src)
        expected = {}
        for backend in ("lmdb", "hdf5"):
            for encoding, extra in (("jpeg", []), ("raw", ["--size", "12", "--crop", "center"]),
                                    ("zstd", ["--size", "12", "--crop", "center"])):
                name = "%s-%s" % (backend, encoding)
                dst = os.path.join(out, name)
                subprocess.run([cli, "pack", src, dst, "--backend", backend, "--encoding", encoding,
                                "--workers", "1", "--chunk-size", "512"] + extra, check=True,
                               stdout=subprocess.DEVNULL)
                a = shardfeed.Archive(dst)
                samples = []
                for i in range(len(a)):
                    image, label = a[i]
                    samples.append({
                        "label": int(label),
                        "shape": list(image.shape),
                        "record_sha256": hashlib.sha256(bytes(a.record(i))).hexdigest(),
                        "pixels_sha256": hashlib.sha256(np.ascontiguousarray(image).tobytes())
                        .hexdigest(),
                    })
                expected[name] = {"class_names": a.class_names, "encoding": encoding,
                                  "samples": samples}
        with open(os.path.join(out, "expected.json"), "w") as f:
            json.dump(expected, f, indent=1, sort_keys=True)
            f.write("\n")


if __name__ == "__main__":
    main()
