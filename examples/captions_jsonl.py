#!/usr/bin/env python3
"""Image-caption pairs (CLIP-style) from a JSONL manifest: one {"image": path, "caption": text}
per line, packed with `shardfeed pack captions.jsonl OUT` (the schema is inferred: image,
caption (str), path), read through shardfeed.Loader with the captions beside the images.

    captions_jsonl.py [WORKDIR]
"""
import json
import os

import numpy as np
from PIL import Image

import shardfeed
from _common import pack, run

COLOURS = {"red": (220, 20, 20), "green": (20, 200, 20), "blue": (20, 20, 220)}


def make_dataset(root):
    os.makedirs(os.path.join(root, "img"), exist_ok=True)
    with open(os.path.join(root, "captions.jsonl"), "w") as f:
        for i in range(9):
            colour = list(COLOURS)[i % 3]
            path = "img/%d.png" % i
            Image.new("RGB", (64, 48), COLOURS[colour]).save(os.path.join(root, path))
            f.write(json.dumps({"image": path, "caption": "a %s square, number %d" % (colour, i)})
                    + "\n")


def main(root):
    make_dataset(root)
    out = os.path.join(root, "captions.shardfeed")
    pack(os.path.join(root, "captions.jsonl"), out, "--overwrite")
    loader = shardfeed.Loader(out, batch_size=3, crop="center", size=32,
                              fields=["caption"], workers=2)
    for batch in loader:
        for image, caption in zip(batch[0], batch["caption"]):  # batch[0]: the images
            colour = caption.split()[1]
            # PNGs are stored losslessly: the pixels are exactly the caption's colour.
            assert tuple(np.asarray(image)[16, 16]) == COLOURS[colour], caption
        print(list(batch["caption"]))
    loader.close()


if __name__ == "__main__":
    run(main)
