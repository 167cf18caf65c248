"""Seeing the pipeline (issue 11): `bench --sweep` over loader options with `--plot`, drawn by
`python -m shardfeed.plot`, and shardfeed.torch.WaitMeter for a training loop."""
import json
import os
import subprocess

import pytest

import shardfeed
import shardfeed.torch as sft

CLI = os.environ.get("SHARDFEED_CLI", "shardfeed")


def test_sweep_runs_every_combination_and_reports_each(archive_path):
    p = subprocess.run([CLI, "bench", archive_path, "--size", "32", "--batch-size", "6",
                        "--epochs", "2", "--sweep", "workers=1,2", "prefetch=2,3", "--json"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert sum(line.startswith("sweep ") for line in lines) == 4
    data = json.loads("\n".join(lines[lines.index("{"):]))
    assert data["swept"] == ["workers", "prefetch"]
    seen = {(r["settings"]["workers"], r["settings"]["prefetch"]) for r in data["results"]}
    assert seen == {("1", "2"), ("1", "3"), ("2", "2"), ("2", "3")}
    for r in data["results"]:
        assert r["images_per_second"] > 0 and 0 <= r["wait_fraction"] <= 1
        assert r["cpu_seconds_per_1000_images"] > 0
        assert r["workers"] == int(r["settings"]["workers"])
    # auto is -1, as asked (it read the count the loader chose; active_workers has that).
    p = subprocess.run([CLI, "bench", archive_path, "--size", "32", "--epochs", "1", "--sweep",
                        "workers=auto", "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    point = json.loads("\n".join(lines[lines.index("{"):]))["results"][0]
    assert point["workers"] == -1 and point["active_workers"] >= 1


def test_sweep_plot_is_drawn(archive_path, tmp_path):
    from PIL import Image
    png = tmp_path / "sweep.png"
    env = dict(os.environ, SHARDFEED_PYTHON="/usr/bin/python3",
               PYTHONPATH=os.path.dirname(os.path.dirname(shardfeed.__file__)))
    p = subprocess.run([CLI, "bench", archive_path, "--size", "32", "--epochs", "1", "--sweep",
                        "workers=1,2", "--plot", str(png)], capture_output=True, text=True,
                       env=env)
    assert p.returncode == 0, p.stderr
    with Image.open(png) as im:
        assert im.size[0] > 600 and im.size[1] > 300
    assert json.load(open(str(png) + ".json"))["swept"] == ["workers"]


def test_the_plot_needs_no_setup(archive_path, tmp_path):
    # Regression: the command failed as typed on this kind of machine, where the
    # python3 first on PATH is not the one shardfeed was built for and has neither shardfeed
    # nor matplotlib. Now the program carries plot.py and finds an interpreter with matplotlib.
    from PIL import Image
    png = tmp_path / "sweep.png"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SHARDFEED_PYTHON")}
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text("#!/bin/sh\necho 'no matplotlib here' >&2\nexit 4\n")
    (fake / "python3").chmod(0o755)
    env["PATH"] = str(fake) + os.pathsep + env["PATH"]
    p = subprocess.run([CLI, "bench", archive_path, "--size", "32", "--epochs", "1", "--sweep",
                        "workers=1,2", "prefetch=2,auto", "--plot", str(png)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    with Image.open(png) as im:
        assert im.size[0] > 600 and im.size[1] > 300


def test_a_plotter_that_hangs_is_stopped_and_the_sweep_kept(archive_path, tmp_path):
    # Regression: bench waited for its plotting child without a limit.
    hang = tmp_path / "hang.sh"
    hang.write_text("#!/bin/sh\nexec sleep 300\n")
    hang.chmod(0o755)
    png = tmp_path / "sweep.png"
    env = dict(os.environ, SHARDFEED_PYTHON=str(hang), SHARDFEED_PLOT_TIMEOUT="1")
    p = subprocess.run([CLI, "bench", archive_path, "--size", "32", "--epochs", "1", "--sweep",
                        "workers=1", "--plot", str(png)], capture_output=True, text=True,
                       env=env, timeout=60)
    assert p.returncode == 3, p.stderr
    assert "took over 1 s with %s and was stopped" % hang in p.stderr, p.stderr
    assert str(png) + ".json" in p.stderr
    assert json.load(open(str(png) + ".json"))["swept"] == ["workers"]
    assert not png.exists()


@pytest.mark.parametrize("spec,needle", [("bogus=1", "unexpected loader option 'bogus'"), ("workers", "NAME=V1,V2"),
                                         ("workers=1,x", "workers (--workers)")])
def test_bad_sweeps_are_usage_errors(archive_path, spec, needle):
    p = subprocess.run([CLI, "bench", archive_path, "--sweep", spec], capture_output=True,
                       text=True)
    assert p.returncode == 2 and needle in p.stderr, p.stderr


def test_wait_meter_splits_each_step_into_waiting_and_working():
    # A fake clock: the loader takes 2 ticks to hand over each batch, the step takes 6.
    t = [0.0]
    clock = lambda: t[0]  # noqa: E731

    def batches():
        for i in range(8):
            t[0] += 2  # waiting inside next()
            yield i

    logged = []
    meter = sft.WaitMeter(batches(), every=4, log=lambda *a: logged.append(a), clock=clock)
    seen = []
    for b in meter:
        seen.append(b)
        t[0] += 6  # the training step
    assert seen == list(range(8))
    assert meter.steps == 8
    assert meter.wait_fraction == pytest.approx(16 / (16 + 48))  # 8 waits, 8 steps
    first, last, fraction, wait_s, step_s = logged[0]
    assert (first, last) == (1, 4) and wait_s == 8 and step_s == 18
    assert fraction == pytest.approx(8 / 26)
    assert logged[1][:2] == (5, 8)
