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


class Consumed:
    """What consume() measured: items taken, images in them, wall seconds, seconds spent
    waiting for the next item, the wait for the first one."""

    def __init__(self):
        self.batches, self.images, self.seconds, self.waited, self.first = 0, 0, 0.0, 0.0, 0.0


def batch_images(item):
    """Images in one item: a shardfeed Batch (.labels) or an (images, labels) pair."""
    labels = item.labels if hasattr(item, "labels") else item[1]
    return len(labels)


def consume(batches, limit=None, step=None):
    """The consumer every Python benchmark runs (as `shardfeed bench` runs cli::Consume): takes
    items from the iterable `batches` as a training loop does, until it ends or `limit` items
    were taken, timing each wait for data; after the i-th item (from 1) it runs `step(i, item)`,
    the training step (a sleep, a model update; None: no step). Returns a Consumed."""
    c = Consumed()
    start = time.perf_counter()  # iter() counts: a DataLoader starts its workers there
    it = iter(batches)
    while limit is None or c.batches < limit:
        t = time.perf_counter()
        item = next(it, None)
        if item is None:
            break
        dt = time.perf_counter() - t
        c.waited += dt
        c.first = dt if c.batches == 0 else c.first
        c.batches += 1
        c.images += batch_images(item)
        if step is not None:
            step(c.batches, item)
        del item
    c.seconds = time.perf_counter() - start
    return c


def sleep_step(step_s):
    """A consume() step that sleeps step_s(i) seconds after the i-th batch."""
    def step(i, _):
        if step_s(i):
            time.sleep(step_s(i))
    return step


def dataloader_ips(dl, epochs):
    """Images/s of a torch DataLoader over `epochs` epochs, after one warm-up batch (worker
    start-up and page cache, as the shardfeed runs get)."""
    consume(dl, limit=1)
    n = seconds = 0
    for _ in range(epochs):
        c = consume(dl)
        n, seconds = n + c.images, seconds + c.seconds
    return n / seconds


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
    c = consume(loader, step=sleep_step(step_s))
    return c.images, c.seconds, c.waited, c.first


def scan_folder(root):
    """(path, label) of every file of an ImageFolder tree, in torchvision's order: classes by
    sorted name, files sorted within each directory."""
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    items = []
    for label, c in enumerate(classes):
        for dirpath, _, files in sorted(os.walk(os.path.join(root, c))):
            for f in sorted(files):
                items.append((os.path.join(dirpath, f), label))
    return items
