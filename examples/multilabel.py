#!/usr/bin/env python3
"""Multi-label classification from an MXNet .lst file with several labels per line
(`index<TAB>label1<TAB>...<TAB>labelk<TAB>path`): `shardfeed pack ROOT OUT --list train.lst`
keeps every label as the field `labels` (int64[*]); shardfeed.Loader gives them per image and
they become a multi-hot target.

    multilabel.py [WORKDIR]
"""
import os

import numpy as np
from PIL import Image

import shardfeed
from _common import pack, run

CLASSES = 5


def make_dataset(root):
    os.makedirs(os.path.join(root, "photos"), exist_ok=True)
    with open(os.path.join(root, "train.lst"), "w") as f:
        for i in range(10):
            labels = sorted({i % CLASSES, (i * 3) % CLASSES})
            path = "photos/%02d.jpg" % i
            Image.new("RGB", (50, 40), (i * 20, 100, 150)).save(os.path.join(root, path))
            f.write("\t".join([str(i)] + [str(l) for l in labels] + [path]) + "\n")


def main(root):
    make_dataset(root)
    out = os.path.join(root, "multilabel.shardfeed")
    pack(root, out, "--list", os.path.join(root, "train.lst"), "--overwrite")
    loader = shardfeed.Loader(out, batch_size=5, crop="center", size=32,
                              fields=["labels", "path"], workers=2)
    for batch in loader:
        target = np.zeros((len(batch["labels"]), CLASSES), np.float32)
        for row, labels in enumerate(batch["labels"]):
            target[row, np.asarray(labels)] = 1
        i = [int(os.path.basename(p)[:2]) for p in batch["path"]]
        want = [sorted({k % CLASSES, (k * 3) % CLASSES}) for k in i]
        assert [np.flatnonzero(t).tolist() for t in target] == want
        print("multi-hot targets", target.tolist())
    loader.close()


if __name__ == "__main__":
    run(main)
