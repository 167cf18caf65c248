#!/usr/bin/env python3
"""Writes shardfeed's built-in sample data: a small ImageFolder tree of real image files (JPEG in
its common variants, PNG, BMP, WebP, GIF) and, with --bad, a folder of broken and hostile files.

    make_sample_data.py OUT [--per-class N] [--bad BAD_OUT] [--formats FORMATS_OUT]

Images are drawn deterministically (smooth gradients, shapes and noise, so JPEG has real work to
do) and saved by Pillow, an encoder independent of shardfeed's own.
"""
import argparse
import io
import os
import struct
import subprocess

import numpy as np
from PIL import Image

CLASSES = ["cat", "dog", "zebra"]


def photo_like(rng, w, h):
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.empty((h, w, 3), np.float32)
    for c in range(3):
        fx, fy, ph = rng.uniform(0.01, 0.08), rng.uniform(0.01, 0.08), rng.uniform(0, 6.28)
        img[..., c] = 128 + 80 * np.sin(fx * x + ph) * np.cos(fy * y) + rng.uniform(-40, 40)
    for _ in range(4):  # a few discs of flat colour: edges for the DCT
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(5, max(6, min(w, h) / 3))
        mask = (x - cx) ** 2 + (y - cy) ** 2 < r * r
        img[mask] = rng.uniform(0, 255, 3)
    img += rng.normal(0, 6, img.shape)
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


def exif_with_orientation(value):
    # Minimal little-endian TIFF: IFD0 with one entry, Orientation (0x0112, SHORT).
    tiff = b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 1)
    tiff += struct.pack("<HHIHH", 0x0112, 3, 1, value, 0) + struct.pack("<I", 0)
    return b"Exif\x00\x00" + tiff


def write_good(out, per_class, seed=1234):
    rng = np.random.RandomState(seed)
    for label, cls in enumerate(CLASSES):
        d = os.path.join(out, cls)
        os.makedirs(d, exist_ok=True)
        for i in range(per_class):
            w, h = int(rng.randint(48, 220)), int(rng.randint(48, 220))
            img = photo_like(rng, w, h)
            kind = i % 12
            name = os.path.join(d, "%s_%03d" % (cls, i))
            if kind == 0:
                img.save(name + ".jpg", quality=90)
            elif kind == 1:
                img.save(name + ".jpg", quality=85, progressive=True)
            elif kind == 2:
                img.convert("L").save(name + ".jpg", quality=90)
            elif kind == 3:
                img.convert("CMYK").save(name + ".jpg", quality=92)
            elif kind == 4:
                img.save(name + ".jpeg", quality=80, exif=exif_with_orientation(6))
            elif kind == 5:
                img.save(name + ".png")
            elif kind == 6:
                rgba = img.convert("RGBA")
                a = np.array(rgba)
                a[..., 3] = np.linspace(0, 255, a.shape[1], dtype=np.uint8)[None, :]
                Image.fromarray(a, "RGBA").save(name + ".png")
            elif kind == 7:
                img.convert("P", palette=Image.ADAPTIVE, colors=64).save(name + ".png")
            elif kind == 8:
                g16 = (np.array(img.convert("L"), np.uint16) * 257).astype(np.uint16)
                Image.fromarray(g16, "I;16").save(name + ".png")
            elif kind == 9:
                img.save(name + ".bmp")
            elif kind == 10:
                try:
                    img.save(name + ".webp", quality=90)
                except (OSError, KeyError):
                    img.save(name + ".jpg", quality=75)
            else:
                img.save(name + ".JPG", quality=95, subsampling=0)
        # Junk a real folder has, which is not a sample.
        with open(os.path.join(d, ".DS_Store"), "wb") as f:
            f.write(b"\x00\x00\x00\x01Bud1")


def write_bad(out, seed=99):
    """One file per kind of breakage, all in one class folder 'broken'."""
    rng = np.random.RandomState(seed)
    d = os.path.join(out, "broken")
    os.makedirs(d, exist_ok=True)
    buf = io.BytesIO()
    photo_like(rng, 120, 90).save(buf, "JPEG", quality=90)
    jpeg = buf.getvalue()
    buf = io.BytesIO()
    photo_like(rng, 120, 90).save(buf, "PNG")
    png = buf.getvalue()
    files = {
        "empty.jpg": b"",
        "truncated.jpg": jpeg[: len(jpeg) // 2],
        "header_only.jpg": jpeg[:200],
        "not_an_image.jpg": b"This is a text file pretending to be a JPEG.\n" * 10,
        "random.png": rng.bytes(4096),
        "truncated.png": png[: len(png) // 2],
        "html.jpeg": b"<!DOCTYPE html><html><body>404 Not Found</body></html>\n",
    }
    # A JPEG whose frame header claims 60000 x 60000 pixels: a decompression bomb.
    sof = jpeg.find(b"\xff\xc0")
    bomb = bytearray(jpeg)
    bomb[sof + 5: sof + 9] = struct.pack(">HH", 60000, 60000)
    files["bomb.jpg"] = bytes(bomb)
    for name, data in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    link = os.path.join(d, "dangling.jpg")
    if not os.path.lexists(link):
        os.symlink("does-not-exist.jpg", link)
    return sorted(list(files) + ["dangling.jpg"])


def write_formats(out, seed=7):
    """The less common formats real photo folders hold, in one class folder 'formats': TIFF
    (RGB, 16-bit gray, CMYK, with alpha) by Pillow, HEIC and AVIF by libheif's heif-enc.
    Returns {file name: (width, height)} of the upright images."""
    rng = np.random.RandomState(seed)
    d = os.path.join(out, "formats")
    os.makedirs(d, exist_ok=True)
    sizes = {}
    img = photo_like(rng, 90, 70)
    img.save(os.path.join(d, "rgb.tif"))
    sizes["rgb.tif"] = img.size
    g16 = (np.array(img.convert("L"), np.uint16) * 257).astype(np.uint16)
    Image.fromarray(g16, "I;16").save(os.path.join(d, "gray16.tif"))
    sizes["gray16.tif"] = img.size
    img.convert("CMYK").save(os.path.join(d, "cmyk.tif"), compression="tiff_lzw")
    sizes["cmyk.tif"] = img.size
    img.convert("RGBA").save(os.path.join(d, "alpha.tif"))
    sizes["alpha.tif"] = img.size
    png = os.path.join(d, ".source.png")
    img.save(png)
    for name, extra in (("photo.heic", []), ("photo.avif", ["-A"])):
        subprocess.run(["heif-enc", "-q", "90", *extra, png, "-o", os.path.join(d, name)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        sizes[name] = img.size
    os.remove(png)
    return sizes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--per-class", type=int, default=12)
    ap.add_argument("--bad", help="also write broken files to this folder")
    ap.add_argument("--formats", help="also write TIFF/HEIC/AVIF files to this folder")
    args = ap.parse_args()
    write_good(args.out, args.per_class)
    n = args.per_class * len(CLASSES)
    print("wrote %d images in %d classes to %s" % (n, len(CLASSES), args.out))
    if args.bad:
        names = write_bad(args.bad)
        print("wrote %d broken files to %s" % (len(names), args.bad))
    if args.formats:
        sizes = write_formats(args.formats)
        print("wrote %d TIFF/HEIF/AVIF files to %s" % (len(sizes), args.formats))


if __name__ == "__main__":
    main()
