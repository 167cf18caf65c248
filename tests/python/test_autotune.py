"""workers="auto" and prefetch="auto", the defaults (issue 11): the loader wakes workers while
the consumer waits for data and lets them sleep when fewer carry the load, grows the ring when
depth is short and gives slots back when calm; it re-tunes when the step time changes, never
changes what is delivered, and stays within the CPUs and ring memory it may use."""
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import shardfeed

CPUS = len(os.sched_getaffinity(0))


def run_epochs(loader, epochs, step_s):
    """The last epoch's stats, with "peak_workers": the most workers any epoch ended with. A
    data-bound run starts at one worker and wakes the second while its consumer waits; under
    CPU load the consumer's own loop is slowed too, and an epoch may end just after a calm
    window let a worker sleep, so the claim is checked on the peak, not on the last epoch."""
    peak = 0
    for e in range(epochs):
        loader.set_epoch(e)
        for _ in loader:
            if step_s:
                time.sleep(step_s)  # the simulated training step (not synchronisation)
        peak = max(peak, loader.stats()["workers"])
    return dict(loader.stats(), peak_workers=peak)


# What "slow" means is measured, not assumed: a step is slow when one worker decodes a batch in
# a fifth of it, the cost taken from the stats of a data-bound run in the same test, on this
# machine under its current load (worker seconds per image, times the batch size). The tuner
# sleeps a worker when the others decode a batch within half to 0.9 of the step (tuner.h,
# kSleepLoad..kSleepLoadMin), so a fifth leaves it a margin of 2.5x against a slower window.
# The step stays within 200 ms (a training step the loader is meant to keep up with).
SLOW_STEP_MIN_S, SLOW_STEP_MAX_S, SLOW_STEP_MARGIN = 0.04, 0.2, 5


def batch_cost_s(stats, batch_size):
    stages = stats["stage_seconds"]
    busy = stages["read"] + stages["decode"] + stages["collate"]
    return busy / max(stats["images"], 1) * batch_size


def slow_step_s(cost_s):
    step = max(SLOW_STEP_MIN_S, SLOW_STEP_MARGIN * cost_s)
    if step > SLOW_STEP_MAX_S:
        pytest.skip(f"a batch costs a worker {cost_s * 1e3:.0f} ms here: no step within "
                    f"{SLOW_STEP_MAX_S * 1e3:.0f} ms is slow enough to need one worker")
    return step


@pytest.mark.skipif(CPUS < 2, reason="needs two CPUs")
def test_a_fast_consumer_gets_more_workers_than_a_slow_one(archive_path):
    # Output 384x384: decoding and resizing a batch takes a worker milliseconds, far above the
    # Python loop's own cost per batch, so an empty step is data-bound on any machine.
    opts = dict(batch_size=4, size=384, crop="random", shuffle=True, workers="auto", max_workers=2)
    fast = run_epochs(shardfeed.Loader(archive_path, **opts), 4, 0)
    step = slow_step_s(batch_cost_s(fast, 4))
    slow = run_epochs(shardfeed.Loader(archive_path, **opts), 2, step)
    assert fast["peak_workers"] == 2, fast["tuning"]  # data-bound: every worker it may use
    assert slow["workers"] == 1, (step, slow["tuning"])  # one worker keeps up with the step
    assert slow["wait_fraction"] <= 0.02, slow       # ... within the target
    assert "consumer waited" in slow["tuning"]


def test_auto_delivers_exactly_the_fixed_setting_batches(archive_path):
    opts = dict(batch_size=5, size=40, crop="random", flip=True, shuffle=True, seed=7)
    fixed = [(b.images.copy(), b.indices.copy()) for b in shardfeed.Loader(archive_path, workers=2,
                                                                           **opts)]
    auto = [(b.images.copy(), b.indices.copy()) for b in shardfeed.Loader(archive_path,
                                                                          workers="auto", **opts)]
    assert len(auto) == len(fixed)
    for (ai, ax), (fi, fx) in zip(auto, fixed):
        assert np.array_equal(ax, fx) and np.array_equal(ai, fi)


def test_auto_stays_within_the_cpus_the_process_may_use(archive_path):
    # Pinned to one CPU (as taskset or a scheduler would), auto never wakes a second worker
    # however much the consumer waits.
    code = """
import os, sys, shardfeed
os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
loader = shardfeed.Loader(sys.argv[1], batch_size=4, size=64, workers="auto")
for e in range(3):
    loader.set_epoch(e)
    for _ in loader:
        pass
print(loader.stats()["workers"])
"""
    p = subprocess.run([sys.executable, "-c", code, archive_path], capture_output=True, text=True,
                       env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "1"


def test_auto_options_are_checked(archive_path):
    with pytest.raises(ValueError, match="wait_target"):
        shardfeed.Loader(archive_path, workers="auto", wait_target=1.5)
    with pytest.raises(ValueError, match="workers"):
        shardfeed.Loader(archive_path, workers="many")


@pytest.mark.skipif(CPUS < 2, reason="needs two CPUs")
def test_auto_retunes_when_the_step_time_changes(archive_path):
    # One loader through three phases of a training run: a slow step (a big model, or a warm-up
    # with evaluation), then an empty step (data-bound), then slow again. The worker count
    # follows each change: 1 keeps up with the slow step, the fast one needs both.
    # (384x384 outputs: an empty step is data-bound, see above; "slow" is measured, see
    # slow_step_s.)
    opts = dict(batch_size=3, size=384, crop="random", shuffle=True)
    probe = run_epochs(shardfeed.Loader(archive_path, workers=2, **opts), 2, 0)
    slow = slow_step_s(batch_cost_s(probe, 3))
    loader = shardfeed.Loader(archive_path, workers="auto", max_workers=2, **opts)
    epoch = iter(range(100))
    seen = []
    for step_s, epochs in ((slow, 2), (0, 6), (slow, 3)):
        peak = 0
        for _ in range(epochs):
            loader.set_epoch(next(epoch))
            for _ in loader:
                if step_s:
                    time.sleep(step_s)
            peak = max(peak, loader.stats()["workers"])
        st = loader.stats()
        seen.append((st["workers"], peak, st["tuning"]))
    # A slow phase ends on one worker; the data-bound phase woke the second (its peak: under CPU
    # load its consumer slows too, and an epoch may end just after a calm window, deep ring
    # full, let a worker sleep; see run_epochs).
    assert (seen[0][0], seen[1][1], seen[2][0]) == (1, 2, 1), seen
    assert all("consumer waited" in why for _, _, why in seen), seen


def test_prefetch_auto_is_the_default_and_grows_for_batches_held(archive_path):
    # list(loader) keeps every batch of the epoch: a fixed ring of 4 refused that; the tuned
    # ring grows a slot at a time (within its budget) and every kept batch stays intact.
    opts = dict(batch_size=4, size=32, shuffle=True, seed=3)
    kept = list(shardfeed.Loader(archive_path, **opts))
    copies = [(b.images.copy(), b.indices.copy()) for b in shardfeed.Loader(archive_path, **opts)]
    assert len(kept) == len(copies) == 9
    for b, (images, indices) in zip(kept, copies):
        assert np.array_equal(b.indices, indices) and np.array_equal(b.images, images)
    loader = shardfeed.Loader(archive_path, **opts)
    held = list(loader)
    st = loader.stats()
    assert st["prefetch"] >= 9 and st["ring_bytes"] >= 9 * 4 * 32 * 32 * 3, st
    del held
    if "kept_mb" in [o["name"] for o in shardfeed._native.loader_options()]:
        # The reader's slot beyond the ring (h/reader, issue 20 item 1): keeping more batches
        # than the ring holds never fails; kept_mb caps that memory.
        kept = list(shardfeed.Loader(archive_path, max_prefetch=2, **opts))
        assert [b.indices.tolist() for b in kept] == [i.tolist() for _, i in copies]
    else:
        with pytest.raises(shardfeed.Error, match="all 2 prefetch slots"):
            list(shardfeed.Loader(archive_path, max_prefetch=2, **opts))


def test_prefetch_auto_options_are_checked(archive_path):
    with pytest.raises(ValueError, match="prefetch"):
        shardfeed.Loader(archive_path, prefetch="deep")
    with pytest.raises(ValueError, match="max_prefetch"):
        shardfeed.Loader(archive_path, max_prefetch=1)
    with pytest.raises(ValueError, match="ring_mb=1"):
        shardfeed.Loader(archive_path, size=1024, crop="squash", batch_size=4, ring_mb=1)
    l = shardfeed.Loader(archive_path, size=32, prefetch="auto", ring_mb=64, max_prefetch=3)
    for _ in l:
        pass
    assert 2 <= l.stats()["prefetch"] <= 3


@pytest.mark.skipif(CPUS < 2, reason="needs two CPUs")
def test_bench_step_ms_0_5_50_with_the_defaults(archive_path):
    # The check, through the command line and the default settings (auto/auto): a
    # data-bound consumer (0 ms) gets every CPU; 5 and 50 ms steps are fed within the 2% target
    # by fewer workers. Small images: one worker decodes a batch in well under 5 ms on an idle
    # machine; under load the short step is raised to a slow one as measured by the 0 ms run
    # (slow_step_s), and the long one stays ten times that.
    cli = os.environ.get("SHARDFEED_CLI", "shardfeed")

    def bench(step_ms):
        p = subprocess.run([cli, "bench", archive_path, "--batch-size", "4", "--size", "32",
                            "--epochs", "4", "--step-ms", str(step_ms), "--json"],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        epochs = json.loads(p.stdout)["epochs"]
        # As run_epochs: the most workers any epoch ended with, beside the last epoch's.
        return dict(epochs[-1], peak_workers=max(e["active_workers"] for e in epochs))

    fast = bench(0)
    cost = batch_cost_s(fast, 4)  # bench's epoch JSON has the stats' stage_seconds and images
    slow_step_s(cost)  # skips when no step within 200 ms is slow enough
    short = max(5, math.ceil(1e3 * SLOW_STEP_MARGIN * cost))
    seen = {}
    for step in (0, short, max(50, min(10 * short, 200))):
        last = bench(step) if step else fast
        seen[step] = (last["peak_workers"] if step == 0 else last["active_workers"],
                      last["wait_fraction"], last["prefetch"])
    slow = [s for s in seen if s]
    assert seen[0][0] == 2, seen
    assert all(seen[s][0] < seen[0][0] and seen[s][1] <= 0.02 for s in slow), seen
    assert all(2 <= s[2] <= 16 for s in seen.values()), seen


def test_bench_says_what_it_chose_and_why(archive_path):
    cli = os.environ.get("SHARDFEED_CLI", "shardfeed")
    p = subprocess.run([cli, "bench", archive_path, "--batch-size", "4", "--size", "32",
                        "--epochs", "2"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "workers (auto)" in p.stdout and "ring slots (auto)" in p.stdout, p.stdout
    assert "tuning: consumer waited" in p.stdout, p.stdout
    p = subprocess.run([cli, "bench", archive_path, "--batch-size", "4", "--size", "32",
                        "--workers", "1", "--prefetch", "3"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert "1 workers, 3 ring slots," in p.stdout and "tuning:" not in p.stdout, p.stdout


def test_the_training_example_runs_and_reports_what_the_loader_chose(archive_path):
    pytest.importorskip("torchvision")
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_pytorch.py")
    p = subprocess.run([sys.executable, example, archive_path, "--steps", "12", "--batch-size",
                        "4", "--size", "32"], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    assert "done: 12 steps" in p.stdout, p.stdout
    assert "loader: " in p.stdout and "ring slots" in p.stdout, p.stdout
