#!/usr/bin/env python3
"""Trains a small torchvision model on a shardfeed archive and reports images/s and the
fraction of time the training loop waited for data.

    train_pytorch.py ARCHIVE [--steps 300] [--batch-size 32] [--size 96] [--workers N]

Runs on the GPU when there is one (batches then arrive on the device through shardfeed's own
pinned ring and CUDA stream), else on the CPU. Uint8 batches are normalised on the device: they
cross PCIe at a quarter of float32's size.
"""
import argparse
import time

import torch
import torchvision

import shardfeed
import shardfeed.torch as sft

MEAN = torch.tensor([0.485, 0.456, 0.406]) * 255
STD = torch.tensor([0.229, 0.224, 0.225]) * 255


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("archive")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--size", type=int, default=96)
    ap.add_argument("--workers", default="auto", help="a number, or auto (tuned online)")
    ap.add_argument("--model", default="mobilenet_v3_small")
    args = ap.parse_args()

    cuda = torch.cuda.is_available() and shardfeed.cuda_available()
    device = torch.device("cuda" if cuda else "cpu")
    archive = shardfeed.Archive(args.archive)
    loader = sft.Loader(archive, batch_size=args.batch_size, shuffle=True, seed=0, crop="random",
                        flip=True, size=args.size, drop_last=True,
                        workers=args.workers if args.workers == "auto" else int(args.workers),
                        device="cuda" if cuda else "cpu")
    model = getattr(torchvision.models, args.model)(num_classes=len(archive.class_names)).to(device)
    model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    mean, std = MEAN.to(device).view(1, 3, 1, 1), STD.to(device).view(1, 3, 1, 1)

    print("training %s on %s: %d images, %d classes, %d batches/epoch, device %s, ring in %s memory"
          % (args.model, args.archive, len(archive), len(archive.class_names), len(loader), device,
             loader.pinned))
    step, waited, images, epoch = 0, 0.0, 0, 0
    start = time.perf_counter()
    while step < args.steps:
        loader.set_epoch(epoch)
        it = iter(loader)
        while step < args.steps:
            t = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            waited += time.perf_counter() - t
            x = x.to(device, non_blocking=True).permute(0, 3, 1, 2).float()
            x = ((x - mean) / std).contiguous(memory_format=torch.channels_last)
            loss = torch.nn.functional.cross_entropy(model(x), y.to(device, non_blocking=True))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            images += y.shape[0]
            del x, y  # let the ring slot go
            if step % 50 == 0:
                if cuda:
                    torch.cuda.synchronize()
                el = time.perf_counter() - start
                print("step %4d  loss %.3f  %.0f images/s  waiting for data %.0f%% of the time"
                      % (step, loss.item(), images / el, 100 * waited / el))
        epoch += 1
    if cuda:
        torch.cuda.synchronize()
    el = time.perf_counter() - start
    print("done: %d steps, %d images in %.1f s = %.0f images/s; data wait %.1f%% of wall time"
          % (step, images, el, images / el, 100 * waited / el))
    st = loader.stats()
    print("loader: %d workers, %d ring slots (%.0f MB); %s"
          % (st["workers"], st["prefetch"], st["ring_bytes"] / 1e6,
             st["tuning"] or ("tuned, no decision yet" if args.workers == "auto" else "fixed")))


if __name__ == "__main__":
    main()
