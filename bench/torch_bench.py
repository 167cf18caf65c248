#!/usr/bin/env python3
"""The PyTorch training-loop view: images/s and the fraction of time the loop waits for data,
with shardfeed.torch.Loader versus torchvision ImageFolder + DataLoader(num_workers,
pin_memory=True, persistent_workers=True), on the same images, cores and batch size, in one run.

    torch_bench.py CORPUS [--build build] [--workers N] [--steps 40] [--batch-size 64]

Two loops per reader: a real training step (mobilenet_v3_small, random-resized-crop 112 + flip,
SGD; torch on one thread so the data workers keep the other cores), and an empty step (the loop
only takes batches: the data-bound case). The first batches of each run are a warm-up.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch
import torchvision
from common import consume
from torchvision import datasets, transforms


def loop(batches, steps, model, warmup=5):
    """images/s and the fraction of the time spent waiting, over `steps` batches after `warmup`,
    with a training step of `model` (None: an empty step). The consumer is common.consume."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01) if model is not None else None
    mean = torch.tensor([123.7, 116.3, 103.5]).view(1, 3, 1, 1)

    def train(_, item):
        x, y = item
        if x.shape[-1] == 3:  # NHWC uint8 from shardfeed
            x = x.permute(0, 3, 1, 2)
        x = (x.float() - mean) / 58.0
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    it = iter(batches)
    consume(it, limit=warmup)
    c = consume(it, limit=steps, step=train if model is not None else None)
    return c.images / c.seconds, c.waited / c.seconds


def forever(make_iter):
    while True:
        yield from make_iter()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus")
    ap.add_argument("--build", default="build")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--size", type=int, default=112)
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(os.path.abspath(args.build), "python"))
    import shardfeed.torch as sft

    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="shardfeed-torchbench-")
    archive = os.path.join(tmp, "a")
    subprocess.run([os.path.join(args.build, "shardfeed"), "pack", args.corpus, archive, "-q"],
                   check=True, stdout=subprocess.DEVNULL)
    ds = datasets.ImageFolder(args.corpus, transform=transforms.Compose([
        transforms.RandomResizedCrop(args.size), transforms.RandomHorizontalFlip(),
        transforms.PILToTensor()]))
    dl = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, shuffle=True,
                                     num_workers=args.workers, pin_memory=True,
                                     persistent_workers=True, prefetch_factor=2, drop_last=True)
    sf = sft.Loader(archive, batch_size=args.batch_size, shuffle=True, crop="random", flip=True,
                    size=args.size, workers=args.workers, drop_last=True)
    n_classes = len(ds.classes)
    results = {}
    for name, make in (("shardfeed", lambda: iter(sf)), ("ImageFolder+DataLoader", lambda: iter(dl))):
        torch.manual_seed(0)
        model = torchvision.models.mobilenet_v3_small(num_classes=n_classes)
        results[(name, "train")] = loop(forever(make), args.steps, model)
        results[(name, "empty")] = loop(forever(make), args.steps * 2, None)
    print("corpus %s; %d CPU(s); batch %d, %d data workers, random-resized-crop %d + flip, "
          "uint8; torch on 1 thread; %d steps after 5 warm-up batches"
          % (args.corpus, os.cpu_count(), args.batch_size, args.workers, args.size, args.steps))
    print("%-26s %-28s %10s %12s" % ("reader", "loop", "images/s", "data wait"))
    for (name, kind), (ips, wait) in results.items():
        label = "mobilenet_v3_small SGD step" if kind == "train" else "empty step (data-bound)"
        print("%-26s %-28s %10.0f %11.0f%%" % (name, label, ips, 100 * wait))
    for kind in ("train", "empty"):
        print("shardfeed / ImageFolder, %s: %.2fx images/s" % (
            kind, results[("shardfeed", kind)][0] / results[("ImageFolder+DataLoader", kind)][0]))


if __name__ == "__main__":
    main()
