"""`shardfeed tune ARCHIVE --step-ms T` (issue 11): measured stage costs, the machine's
ceiling, and the fewest workers (and slots) that keep a consumer of T ms per batch fed,
checked by running them with that step."""
import json
import os
import subprocess

import pytest

CLI = os.environ.get("SHARDFEED_CLI", "shardfeed")
CPUS = len(os.sched_getaffinity(0))


def tune(*args):
    p = subprocess.run([CLI, "tune", *args], capture_output=True, text=True, timeout=300)
    return p


def test_a_slow_step_needs_one_worker_and_is_fed_within_the_target(archive_path):
    # 4 images of 64x64 per 60 ms step: ~67 images/s, a small fraction of one worker's rate.
    p = tune(archive_path, "--step-ms", "60", "--batch-size", "4", "--size", "64",
             "--batches", "12", "--json")
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert j["recommended"]["workers"] == 1, j
    assert j["recommended"]["prefetch"] >= 2
    assert j["data_bound"] is False
    assert j["expected"]["within_target"] is True and j["expected"]["wait_fraction"] <= 0.02, j
    assert j["stage_ms_per_image"]["decode"] > 0
    assert j["stage_ms_per_image"]["total"] >= j["stage_ms_per_image"]["decode"]
    assert j["ceiling"]["workers"] == CPUS and j["ceiling"]["images_per_second"] > 0
    assert j["demand_images_per_second"] == pytest.approx(4 / 0.060)
    assert j["cpus"] == CPUS and j["batch_size"] == 4 and j["step_ms"] == 60


def test_an_empty_step_is_data_bound_and_gets_every_cpu(archive_path):
    p = tune(archive_path, "--step-ms", "0", "--batch-size", "4", "--size", "64",
             "--batches", "8", "--json")
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert j["data_bound"] is True
    assert j["recommended"]["workers"] == CPUS
    assert j["demand_images_per_second"] is None


def test_the_cpu_budget_is_max_workers(archive_path):
    p = tune(archive_path, "--step-ms", "0", "--max-workers", "1", "--batch-size", "4",
             "--size", "32", "--batches", "4", "--json")
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert j["cpus"] == 1 and j["recommended"]["workers"] == 1 and j["ceiling"]["workers"] == 1


def test_the_human_report_names_the_recommendation(archive_path):
    p = tune(archive_path, "--step-ms", "60", "--batch-size", "4", "--size", "32",
             "--batches", "4")
    assert p.returncode == 0, p.stderr
    assert "recommended: --workers 1 --prefetch" in p.stdout
    assert "ceiling" in p.stdout and "stages per image" in p.stdout


def test_wrong_arguments_are_refused_by_name(archive_path, tmp_path):
    for args, what in ((["--step-ms", "-1"], "--step-ms"), (["--step-ms", "nan"], "--step-ms"),
                       ([], "step-ms"), (["--step-ms", "5", "--batches", "0"], "--batches"),
                       (["--step-ms", "5", "--workers", "lots"], "workers"),
                       # tune chooses these itself: not among its options (cli, issue 20 #15)
                       (["--step-ms", "5", "--workers", "2"], "--workers is what tune chooses"),
                       (["--step-ms", "5", "--prefetch", "4"], "--prefetch is what tune chooses")):
        p = tune(archive_path, *args)
        assert p.returncode == 2, (args, p.stderr)
        assert what in p.stderr, (args, p.stderr)
    missing = str(tmp_path / "nothing")
    p = tune(missing, "--step-ms", "5")
    assert p.returncode != 0 and "nothing" in p.stderr
