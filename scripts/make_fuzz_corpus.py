#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpus under tests/fuzz/corpus/ (committed; rerun only to
change the seeds):
  archive_lmdb/, archive_hdf5/  u32 manifest length + manifest + shard, from the golden archives
  manifest/                     the golden manifests
  decode/                       one small file per format pack decodes (Pillow, and the HEIF/AVIF
                                files of the test data when given)
    make_fuzz_corpus.py OUT_DIR [FORMATS_DIR]
"""
import io
import os
import shutil
import struct
import sys

from PIL import Image

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
GOLDEN = os.path.join(ROOT, "tests", "format", "golden")


def main():
    out = sys.argv[1]
    formats = sys.argv[2] if len(sys.argv) > 2 else None
    for d in ("archive_lmdb", "archive_hdf5", "manifest", "decode"):
        os.makedirs(os.path.join(out, d), exist_ok=True)
    latest = sorted(os.listdir(GOLDEN))[-1]
    for name in sorted(os.listdir(os.path.join(GOLDEN, latest))):
        path = os.path.join(GOLDEN, latest, name)
        if not os.path.isdir(path):
            continue
        manifest = open(os.path.join(path, "manifest.json"), "rb").read()
        shard = [f for f in os.listdir(path) if f.startswith("shard-")][0]
        data = open(os.path.join(path, shard), "rb").read()
        kind = "archive_lmdb" if shard.endswith(".mdb") else "archive_hdf5"
        with open(os.path.join(out, kind, name), "wb") as f:
            f.write(struct.pack("<I", len(manifest)) + manifest + data)
        with open(os.path.join(out, "manifest", name + ".json"), "wb") as f:
            f.write(manifest)
    img = Image.new("RGB", (19, 13))
    img.putdata([((x * 13) % 256, (y * 19) % 256, (x * y) % 256)
                 for y in range(13) for x in range(19)])
    samples = {
        "baseline.jpg": lambda b: img.save(b, "JPEG", quality=80),
        "progressive.jpg": lambda b: img.save(b, "JPEG", progressive=True),
        "gray.jpg": lambda b: img.convert("L").save(b, "JPEG"),
        "cmyk.jpg": lambda b: img.convert("CMYK").save(b, "JPEG"),
        "rgb.png": lambda b: img.save(b, "PNG"),
        "palette.png": lambda b: img.convert("P").save(b, "PNG"),
        "lossy.webp": lambda b: img.save(b, "WEBP", quality=50),
        "rgb.bmp": lambda b: img.save(b, "BMP"),
        "anim.gif": lambda b: img.convert("P").save(b, "GIF"),
        "rgb.tif": lambda b: img.save(b, "TIFF"),
        "rgb.ppm": lambda b: img.save(b, "PPM"),
        "rgb.tga": lambda b: img.save(b, "TGA"),
    }
    exif = Image.Exif()
    exif[0x0112] = 6
    samples["rotated.jpg"] = lambda b: img.save(b, "JPEG", exif=exif)
    for name, save in samples.items():
        buf = io.BytesIO()
        save(buf)
        with open(os.path.join(out, "decode", name), "wb") as f:
            f.write(buf.getvalue())
    if formats:
        for name in ("photo.heic", "photo.avif"):
            if os.path.exists(os.path.join(formats, name)):
                shutil.copy(os.path.join(formats, name), os.path.join(out, "decode", name))


if __name__ == "__main__":
    main()
