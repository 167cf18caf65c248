#!/usr/bin/env python3
"""Detection from COCO: a tiny COCO-style dataset (a bright rectangle per box) packed with
`shardfeed pack instances.json OUT --images DIR`, then read through shardfeed.Loader with its
boxes and per-box labels following the crop and flip.

    detection_coco.py [WORKDIR]
"""
import json
import os

import numpy as np
from PIL import Image

import shardfeed
from _common import pack, run


def make_dataset(root):
    os.makedirs(os.path.join(root, "images"), exist_ok=True)
    images, annotations = [], []
    for i in range(8):
        pixels = np.zeros((120, 160, 3), np.uint8)
        x, y, w, h = 20 + 5 * i, 30, 50, 40
        pixels[y:y + h, x:x + w] = 255
        name = "%04d.jpg" % i
        Image.fromarray(pixels).save(os.path.join(root, "images", name), quality=95)
        images.append({"id": i + 1, "file_name": name, "width": 160, "height": 120})
        annotations.append({"id": i + 1, "image_id": i + 1, "category_id": 3 if i % 2 else 7,
                            "bbox": [x, y, w, h], "iscrowd": 0})
    with open(os.path.join(root, "instances.json"), "w") as f:
        json.dump({"images": images, "annotations": annotations,
                   "categories": [{"id": 3, "name": "car"}, {"id": 7, "name": "train"}]}, f)


def main(root):
    make_dataset(root)
    out = os.path.join(root, "coco.shardfeed")
    pack(os.path.join(root, "instances.json"), out, "--images", os.path.join(root, "images"),
         "--overwrite")
    archive = shardfeed.Archive(out)
    loader = shardfeed.Loader(archive, batch_size=4, crop="center", size=96, flip=True,
                              fields=["boxes", "labels"], workers=2)
    for batch in loader:
        images, boxes, labels = batch[0], batch["boxes"], batch["labels"]  # images: as ever
        print("images", tuple(images.shape), "boxes of the first image",
              np.asarray(boxes[0]).round(1).tolist(), "labels", np.asarray(labels[0]).tolist())
        for b in boxes:
            b = np.asarray(b)
            assert b.shape[1:] == (4,) and ((b >= 0) & (b <= 96)).all()
    loader.close()


if __name__ == "__main__":
    run(main)
