#!/usr/bin/env python3
"""Read throughput: shardfeed's loader beside torchvision ImageFolder + DataLoader and the bare
ceilings (a tight libjpeg-turbo decode loop over in-memory bytes; memcpy for raw records), on
the same images, cores and batch size, in one run.

    read_bench.py CORPUS [--build build] [--workers N] [--batch-size 64] [--epochs 2]

CORPUS is an ImageFolder tree of JPEGs (bench/make_corpus.py). The script packs it twice (JPEG
passthrough; raw 224x224 centre crops) into a temporary folder next to it.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from common import arguments, dataloader_ips, shardfeed_ips
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def torchvision_ips(corpus, crop, workers, batch, epochs):
    if crop == "center":
        tf = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224),
                                 transforms.PILToTensor()])
    else:
        tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                                 transforms.PILToTensor()])
    ds = datasets.ImageFolder(corpus, transform=tf)
    dl = DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                    persistent_workers=True, prefetch_factor=2)
    return dataloader_ips(dl, epochs)


def main():
    args = arguments(__doc__)
    sf = os.path.join(args.build, "shardfeed")
    ceiling = os.path.join(args.build, "shardfeed_ceiling")
    tmp = tempfile.mkdtemp(prefix="shardfeed-readbench-",
                           dir=os.path.dirname(os.path.abspath(args.corpus)))
    jpeg, raw = os.path.join(tmp, "jpeg"), os.path.join(tmp, "raw224")
    subprocess.run([sf, "pack", args.corpus, jpeg, "-q"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([sf, "pack", args.corpus, raw, "-q", "--encoding", "raw", "--size", "224",
                    "--crop", "center"], check=True, stdout=subprocess.DEVNULL)
    def bench(archive, *extra):
        return shardfeed_ips(sf, archive, args, *extra)

    torch.set_num_threads(1)
    res = {}
    res["ceiling_decode"] = run_json([ceiling, jpeg, "--threads", str(args.workers), "--repeat", "2"])["images_per_second"]
    res["ceiling_memcpy"] = run_json([ceiling, raw, "--threads", str(args.workers), "--mode", "memcpy", "--repeat", "20"])["images_per_second"]
    res["sf_center"] = bench(jpeg, "--crop", "center", "--size", "224")
    res["sf_random"] = bench(jpeg, "--crop", "random", "--flip", "--size", "224")
    res["sf_random_full"] = bench(jpeg, "--crop", "random", "--flip", "--size", "224", "--decode", "full")
    res["sf_raw"] = bench(raw, "--crop", "none", "--size", "0")
    res["sf_center_proc"] = bench(jpeg, "--crop", "center", "--size", "224", "--mode", "processes")
    res["tv_center"] = torchvision_ips(args.corpus, "center", args.workers, args.batch_size, args.epochs)
    res["tv_random"] = torchvision_ips(args.corpus, "random", args.workers, args.batch_size, args.epochs)
    shutil.rmtree(tmp, ignore_errors=True)

    n = sum(len(f) for _, _, f in os.walk(args.corpus))
    print("corpus: %s (%d JPEGs); %d CPU(s); batch %d, %d workers, uint8 output, %d epochs after a warm-up"
          % (args.corpus, n, os.cpu_count(), args.batch_size, args.workers, args.epochs))
    rows = [
        ("bare libjpeg-turbo decode loop (full size, in memory)", res["ceiling_decode"], ""),
        ("shardfeed, JPEG, centre crop 224", res["sf_center"],
         "%.0f%% of decode ceiling, %.1fx ImageFolder" % (100 * res["sf_center"] / res["ceiling_decode"],
                                                          res["sf_center"] / res["tv_center"])),
        ("shardfeed, JPEG, centre crop 224, worker processes", res["sf_center_proc"],
         "%.0f%% of decode ceiling" % (100 * res["sf_center_proc"] / res["ceiling_decode"])),
        ("ImageFolder+DataLoader, Resize 256 + CenterCrop 224", res["tv_center"], ""),
        ("shardfeed, JPEG, random-resized-crop 224 + flip", res["sf_random"],
         "%.2fx full decode + crop, %.1fx ImageFolder" % (res["sf_random"] / res["sf_random_full"],
                                                          res["sf_random"] / res["tv_random"])),
        ("shardfeed, same, full decode then crop", res["sf_random_full"], ""),
        ("ImageFolder+DataLoader, RandomResizedCrop 224 + flip", res["tv_random"], ""),
        ("memcpy of raw 224x224 records (in memory)", res["ceiling_memcpy"], ""),
        ("shardfeed, raw 224x224 records", res["sf_raw"],
         "%.0f%% of memcpy ceiling" % (100 * res["sf_raw"] / res["ceiling_memcpy"])),
    ]
    print("%-56s %12s  %s" % ("reader", "images/s", "ratio"))
    for name, ips, note in rows:
        print("%-56s %12.0f  %s" % (name, ips, note))


if __name__ == "__main__":
    sys.exit(main())
