#!/usr/bin/env python3
"""FFCV read throughput on an ImageFolder corpus, for side-by-side figures (output_bench.py runs
it). Run with the peers' interpreter (bench/install-peers.sh makes it):

    /tmp/peers/bin/python bench/ffcv_bench.py CORPUS --beton OUT.beton [--max-resolution 512]
        [--crop center|random] [--normalize] [--workers 2] [--batch-size 64] [--epochs 2]

Writes the .beton once (JPEG mode, FFCV's writer; reused when it exists), then reads epochs as
training would: OrderOption.RANDOM, os_cache, uint8 NCHW torch tensors or, with --normalize,
NormalizeImage (ImageNet mean/std, float32) in the pipeline, as FFCV's ImageNet example does.
Prints one JSON object: images_per_second over the epochs after a warm-up epoch.
"""
import argparse
import json
import os
import time

import numpy as np

from common import consume

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406]) * 255
IMAGENET_STD = np.array([0.229, 0.224, 0.225]) * 255


def write(corpus, beton, max_resolution, workers):
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter
    from torchvision.datasets import ImageFolder
    ds = ImageFolder(corpus)
    fields = {"image": RGBImageField(write_mode="jpg", max_resolution=max_resolution,
                                     jpeg_quality=90),
              "label": IntField()}
    t = time.perf_counter()
    DatasetWriter(beton, fields, num_workers=workers).from_indexed_dataset(ds)
    return len(ds) / (time.perf_counter() - t)


def read(beton, crop, normalize, workers, batch, epochs):
    import torch
    from ffcv.fields.decoders import (CenterCropRGBImageDecoder, IntDecoder,
                                      RandomResizedCropRGBImageDecoder)
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import NormalizeImage, RandomHorizontalFlip, ToTensor, ToTorchImage
    torch.set_num_threads(1)
    if crop == "center":
        image = [CenterCropRGBImageDecoder((224, 224), ratio=224 / 256)]
    else:
        image = [RandomResizedCropRGBImageDecoder((224, 224)), RandomHorizontalFlip()]
    if normalize:
        image.append(NormalizeImage(IMAGENET_MEAN, IMAGENET_STD, np.float32))
    image += [ToTensor(), ToTorchImage()]
    loader = Loader(beton, batch_size=batch, num_workers=workers, order=OrderOption.RANDOM,
                    os_cache=True, drop_last=False,
                    pipelines={"image": image, "label": [IntDecoder(), ToTensor()]})
    first = []  # the first batch's images: dtype and shape
    consume(loader, step=lambda i, item: first.append(item[0]) if i == 1 else None)  # warm-up:
    n, seconds = 0, 0.0                                            # numba, page cache
    for _ in range(epochs):
        c = consume(loader)
        n, seconds = n + c.images, seconds + c.seconds
    return n / seconds, str(first[0].dtype), list(first[0].shape)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus")
    ap.add_argument("--beton", required=True)
    ap.add_argument("--max-resolution", type=int, default=512)
    ap.add_argument("--crop", default="center", choices=["center", "random"])
    ap.add_argument("--normalize", action="store_true")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args()
    out = {}
    if not os.path.exists(args.beton):
        out["write_files_per_second"] = write(args.corpus, args.beton, args.max_resolution,
                                              args.workers)
    ips, dtype, shape = read(args.beton, args.crop, args.normalize, args.workers,
                             args.batch_size, args.epochs)
    out.update(images_per_second=ips, dtype=dtype, shape=shape)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
