#!/usr/bin/env python3
"""Tuned online against hand-picked and DataLoader defaults: images/s, the consumer's wait
fraction and CPU-seconds per 1,000 images at simulated step times, all measured in one run.

    autotune_bench.py CORPUS ARCHIVE [--build build] [--steps 0,5,20,50] [--batch-size 64]

CORPUS is the image folder ARCHIVE was packed from. For each step time (the consumer sleeps
that long per batch, as a training step would take):
- shardfeed defaults: workers="auto", prefetch="auto" (`shardfeed bench --sweep`, one point);
- the best hand-picked shardfeed setting of a sweep over workers=1..CPUs x prefetch=2,4,8 (the
  highest images/s; among settings within 2% of it, the fewest workers, then slots);
- torch DataLoader defaults over torchvision ImageFolder (num_workers=0, pin_memory=False), and
  DataLoader with num_workers = CPUs (prefetch_factor 2, its default), decoding with PIL and
  Resize(256) + CenterCrop(224) + PILToTensor: the same uint8 224x224 centre crops.
Every figure is over the epochs after a warm-up epoch. CPU is the process's and its children's
(DataLoader workers are reaped at the end of each epoch, so they count).
"""
import argparse
import json
import os
import resource
import subprocess
import sys


def cpu_seconds():
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def sweep(cli, archive, step_ms, batch, epochs, specs):
    out = subprocess.run([cli, "bench", archive, "--batch-size", str(batch), "--crop", "center",
                          "--size", "224", "--epochs", str(epochs), "--step-ms", str(step_ms),
                          "--sweep", *specs, "--json"],
                         check=True, capture_output=True, text=True).stdout
    lines = out.splitlines()
    return json.loads("\n".join(lines[lines.index("{"):]))["results"]


def dataloader_run(corpus, step_ms, batch, epochs, workers):
    """Runs in a child process (its CPU, workers included, is then its own)."""
    code = r"""
import json, resource, sys, time
import torch
from torchvision import datasets, transforms
torch.set_num_threads(1)
corpus, step, batch, epochs, workers = sys.argv[1], float(sys.argv[2]) / 1000, int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
def cpu():
    s = resource.getrusage(resource.RUSAGE_SELF); c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
t = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.PILToTensor()])
ds = datasets.ImageFolder(corpus, transform=t)
kw = dict(num_workers=workers) if workers else {}
dl = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, **kw)
sys.path.insert(0, sys.argv[6])
from common import consume, sleep_step
images = seconds = waited = used = 0.0
for e in range(epochs):
    c0 = cpu()
    # consume's iterator ends with it: the workers exit and are reaped, their CPU counted below
    c = consume(dl, step=sleep_step(lambda i: step))
    if e == 0:
        continue  # warm-up: worker start-up, page cache
    images += c.images; seconds += c.seconds; waited += c.waited; used += cpu() - c0
print(json.dumps({"images_per_second": images / seconds, "wait_fraction": waited / seconds,
                  "cpu_seconds_per_1000_images": 1000 * used / images}))
"""
    here = os.path.dirname(os.path.abspath(__file__))  # for `from common import consume`
    out = subprocess.run([sys.executable, "-c", code, corpus, str(step_ms), str(batch),
                          str(epochs), str(workers), here], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def best(results):
    top = max(r["images_per_second"] for r in results)
    near = [r for r in results if r["images_per_second"] >= 0.98 * top]
    return min(near, key=lambda r: (int(r["settings"]["workers"]), int(r["settings"]["prefetch"])))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus")
    ap.add_argument("archive")
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", default="0,5,20,50")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=3, help="per setting, the first a warm-up")
    ap.add_argument("--skip-torch", action="store_true")
    a = ap.parse_args()
    cli = os.path.join(a.build, "shardfeed")
    cpus = len(os.sched_getaffinity(0))
    rows = []
    for step in [float(s) for s in a.steps.split(",")]:
        auto = sweep(cli, a.archive, step, a.batch_size, a.epochs,
                     ["workers=auto", "prefetch=auto"])[0]
        grid = sweep(cli, a.archive, step, a.batch_size, a.epochs,
                     ["workers=" + ",".join(str(w) for w in range(1, cpus + 1)),
                      "prefetch=2,4,8"])
        hand = best(grid)
        row = {"step_ms": step, "auto": auto, "best": hand}
        if not a.skip_torch:
            row["dataloader_defaults"] = dataloader_run(a.corpus, step, a.batch_size, 2, 0)
            row["dataloader_workers"] = dataloader_run(a.corpus, step, a.batch_size, 2, cpus)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)

    def cell(r):
        return "%s / %.1f%% / %.2f" % (format(round(r["images_per_second"]), ","),
                                       100 * r["wait_fraction"],
                                       r["cpu_seconds_per_1000_images"])
    print("images/s / consumer waiting / CPU-s per 1,000 images; batch %d, %d CPUs" %
          (a.batch_size, cpus))
    head = "| step | shardfeed auto (chose) | best of sweep (setting) |"
    if not a.skip_torch:
        head += " DataLoader defaults (num_workers=0) | DataLoader num_workers=%d |" % cpus
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        au, b = r["auto"], r["best"]
        line = "| %g ms | %s (%d workers, %d slots, %.0f MB) | %s (workers %s, prefetch %s) |" % (
            r["step_ms"], cell(au), au["active_workers"], au["prefetch"], au["ring_bytes"] / 1e6,
            cell(b), b["settings"]["workers"], b["settings"]["prefetch"])
        if not a.skip_torch:
            line += " %s | %s |" % (cell(r["dataloader_defaults"]), cell(r["dataloader_workers"]))
        print(line)
    for r in rows:
        print("ratio at %g ms: auto / best %.2f, auto / DataLoader defaults %s" % (
            r["step_ms"], r["auto"]["images_per_second"] / r["best"]["images_per_second"],
            "%.1f" % (r["auto"]["images_per_second"] /
                      r["dataloader_defaults"]["images_per_second"])
            if "dataloader_defaults" in r else "-"))


if __name__ == "__main__":
    main()
