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


def make_same_size_images(root):
    """Version 3: 2 classes x 2 JPEGs of one upright shape (20x16), one stored 16x20 with EXIF
    orientation 6, and (for the auto encoding) a PNG of another size beside them."""
    for c, name in enumerate(["ant", "bee"]):
        os.makedirs(os.path.join(root, name))
        for k in range(2):
            rotated = c == 1 and k == 1
            w, h = (16, 20) if rotated else (20, 16)
            img = Image.new("RGB", (w, h))
            img.putdata([((x * 255) // w, (y * 255) // h, (60 * c + 100 * k) % 256)
                         for y in range(h) for x in range(w)])
            kwargs = {}
            if rotated:
                exif = Image.Exif()
                exif[0x0112] = 6
                kwargs["exif"] = exif
            img.save(os.path.join(root, name, "%d.jpg" % k), quality=90, **kwargs)


def add_png(root):
    img = Image.new("RGBA", (9, 7))
    img.putdata([(x * 28, y * 36, 200, 255 - 20 * x) for y in range(7) for x in range(9)])
    img.save(os.path.join(root, "bee", "2.png"))


def main():
    cli, out = sys.argv[1], sys.argv[2]
    import numpy as np
    import shardfeed
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "src")
        make_images(src)
        expected = {}
        same = os.path.join(tmp, "same")
        make_same_size_images(same)
        mixed = os.path.join(tmp, "mixed")
        make_same_size_images(mixed)
        add_png(mixed)
        cases = [(backend, encoding, extra, src, "%s-%s" % (backend, encoding))
                 for backend in ("lmdb", "hdf5")
                 for encoding, extra in (("jpeg", []),
                                         ("raw", ["--size", "12", "--crop", "center"]),
                                         ("zstd", ["--size", "12", "--crop", "center"]))]
        # Version 3: a fixed shape recorded for same-size JPEGs; per-record encodings (auto).
        cases += [("lmdb", "jpeg", [], same, "lmdb-jpeg-same-shape"),
                  ("hdf5", "jpeg", [], same, "hdf5-jpeg-same-shape")]
        if os.environ.get("GOLDEN_AUTO", "1") == "1":
            cases += [("lmdb", "auto", [], mixed, "lmdb-auto"),
                      ("hdf5", "auto", [], mixed, "hdf5-auto")]
        for backend, encoding, extra, source, name in cases:
                dst = os.path.join(out, name)
                subprocess.run([cli, "pack", source, dst, "--backend", backend, "--encoding",
                                encoding, "--workers", "1", "--chunk-size", "512"] + extra,
                               check=True, stdout=subprocess.DEVNULL)
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
