"""Pieces the benchmark programs share."""
import argparse
import json
import os
import subprocess
import time


def arguments(doc, **extra):
    """The options every read benchmark takes: CORPUS, --build, --workers, --batch-size, --epochs."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("corpus")
    ap.add_argument("--build", default="build")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2)
    for name, (kind, default, help_text) in extra.items():
        ap.add_argument("--" + name, type=kind, default=default, help=help_text)
    return ap.parse_args()


def dataloader_ips(dl, epochs):
    """Images/s of a torch DataLoader over `epochs` epochs, after one warm-up batch (worker
    start-up and page cache, as the shardfeed runs get)."""
    for _ in dl:
        break
    n, t = 0, time.perf_counter()
    for _ in range(epochs):
        for images, _ in dl:
            n += images.shape[0]
    return n / (time.perf_counter() - t)


def shardfeed_ips(shardfeed, archive, args, *extra):
    """Images/s of `shardfeed bench`, its first epoch being the warm-up."""
    out = subprocess.run([shardfeed, "bench", archive, "--batch-size", str(args.batch_size),
                          "--workers", str(args.workers), "--epochs", str(args.epochs + 1),
                          "--json", *extra], check=True, capture_output=True, text=True).stdout
    epochs = json.loads(out)["epochs"][1:]
    return sum(e["images"] for e in epochs) / sum(e["seconds"] for e in epochs)


def timed_epoch(loader, step_s):
    """One epoch of a shardfeed.Loader (set_epoch first) with a consumer that sleeps step_s(i)
    seconds after its i-th batch (from 1), a training step: (images, seconds, seconds waiting
    for data, seconds waiting for the first batch)."""
    n, waited, first, i = 0, 0.0, None, 0
    start = time.perf_counter()
    it = iter(loader)
    while True:
        t = time.perf_counter()
        b = next(it, None)
        if b is None:
            break
        dt = time.perf_counter() - t
        waited += dt
        first = dt if first is None else first
        n += len(b.labels)
        del b
        i += 1
        if step_s(i):
            time.sleep(step_s(i))
    return n, time.perf_counter() - start, waited, first or 0.0
