#!/usr/bin/env /usr/bin/python3
"""Where ring depth matters: a bursty consumer (a few quick steps, then a long one, as with
periodic logging, evaluation or checkpointing) against prefetch=2, 4, 8 and auto, all in one run.

    PYTHONPATH=build/python ring_bench.py ARCHIVE [--batch-size 64] [--quick-ms 5] [--quick 3]
                                                  [--long-ms 100] [--epochs 3]

Each cycle is --quick steps of --quick-ms then one of --long-ms. On average the consumer asks
for less than the workers deliver, so a deep enough ring lets the workers fill it during the
long step and the quick steps never wait; a shallow one makes them wait. Prints images/s, the
consumer's wait fraction and the pinned ring memory per setting, over the epochs after a
warm-up epoch (workers="auto" throughout).
"""
import argparse

import shardfeed
from common import timed_epoch


def run(archive, prefetch, a):
    loader = shardfeed.Loader(archive, batch_size=a.batch_size, shuffle=True, crop="center",
                              size=224, prefetch=prefetch)
    images = seconds = waited = 0.0
    step = lambda i: (a.long_ms if i % (a.quick + 1) == 0 else a.quick_ms) / 1000  # noqa: E731
    for e in range(a.epochs):
        loader.set_epoch(e)
        n, s, w, _ = timed_epoch(loader, step)
        if e > 0:  # the first is the warm-up
            images += n
            seconds += s
            waited += w
    st = loader.stats()
    return images / seconds, waited / seconds, st


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("archive")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--quick-ms", type=float, default=5)
    ap.add_argument("--quick", type=int, default=3)
    ap.add_argument("--long-ms", type=float, default=100)
    ap.add_argument("--epochs", type=int, default=3)
    a = ap.parse_args()
    print("consumer: %d steps of %g ms, then one of %g ms; batch %d" %
          (a.quick, a.quick_ms, a.long_ms, a.batch_size))
    print("| prefetch | images/s | consumer waiting | slots at the end | ring memory |")
    print("|---|---:|---:|---:|---:|")
    for prefetch in (2, 4, 8, "auto"):
        ips, wait, st = run(a.archive, prefetch, a)
        print("| %s | %s | %.1f%% | %d | %.0f MB |" % (prefetch, format(round(ips), ","),
                                                       100 * wait, st["prefetch"],
                                                       st["ring_bytes"] / 1e6), flush=True)


if __name__ == "__main__":
    main()
