#!/usr/bin/env /usr/bin/python3
"""Epoch boundaries: run_ahead=True (workers begin the next epoch once this one's samples are
all handed out) against run_ahead=False (every epoch starts with an empty ring), in one run.

    PYTHONPATH=build/python epoch_bench.py ARCHIVE [--batch-size 16] [--steps-ms 0,20,50]
                                                   [--epochs 6] [--rounds 3] [--size 224]

The consumer sleeps --steps-ms per batch (a training step). For each step and setting it
prints images/s, the consumer's wait fraction, and its mean wait for an epoch's first batch,
over the epochs after a warm-up one (the medians of --rounds runs; the settings alternate
within each round), and the ratio of images/s. Default loader settings otherwise
(workers and prefetch "auto"). A small archive (a few dozen batches an epoch) shows the
boundary best; on a large one both settings converge, as they should.
"""
import argparse
import statistics

import shardfeed
from common import timed_epoch


def run(archive, run_ahead, step_s, a):
    loader = shardfeed.Loader(archive, batch_size=a.batch_size, shuffle=True, crop="center",
                              size=a.size, run_ahead=run_ahead)
    images = seconds = waited = first = 0.0
    for e in range(a.epochs):
        loader.set_epoch(e)
        n, s, w, f = timed_epoch(loader, lambda i: step_s)
        if e > 0:  # the first is the warm-up
            images += n
            seconds += s
            waited += w
            first += f
    loader.close()
    return images / seconds, waited / seconds, 1000 * first / (a.epochs - 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("archive")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--steps-ms", default="0,20,50")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if a.epochs < 2 or a.rounds < 1:
        ap.error("--epochs must be at least 2 and --rounds at least 1")
    batches = len(shardfeed.Loader(a.archive, batch_size=a.batch_size))
    print("%s: batch %d, %d batches an epoch, %d epochs measured after a warm-up one, "
          "medians of %d rounds" % (a.archive, a.batch_size, batches, a.epochs - 1, a.rounds))
    print("| step | run_ahead=False: images/s, waiting, first batch | "
          "run_ahead=True: images/s, waiting, first batch | ratio |")
    print("|---|---|---|---:|")
    for step in (float(s) for s in a.steps_ms.split(",")):
        got = {False: [], True: []}
        for _ in range(a.rounds):
            for setting in (False, True):
                got[setting].append(run(a.archive, setting, step / 1000, a))
        med = {k: [statistics.median(r[i] for r in v) for i in range(3)] for k, v in got.items()}
        cells = ["%s images/s, %.1f%%, %.1f ms" % (format(round(m[0]), ","), 100 * m[1], m[2])
                 for m in (med[False], med[True])]
        print("| %g ms | %s | %s | %.2fx |" % (step, cells[0], cells[1],
                                               med[True][0] / med[False][0]), flush=True)


if __name__ == "__main__":
    main()
