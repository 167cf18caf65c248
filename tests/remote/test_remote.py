"""Archives read over s3:// (moto_server) and http:// (http.server) through the local cache,
against the same archive read from disk, and the faults a network brings (conftest.FaultProxy)."""
import gc
import json
import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

import shardfeed
from conftest import upload

CLI = os.environ.get("SHARDFEED_CLI", "shardfeed")
OPTS = dict(batch_size=8, shuffle=True, seed=7, size=32, crop="random", flip=True, workers=2)


def epoch(loader, n=1):
    out = []
    for e in range(n):
        loader.set_epoch(e)
        out += [(b.images.copy(), b.labels.copy(), b.indices.copy()) for b in loader]
    return out


def same(a, b):
    assert len(a) == len(b)
    for (ia, la, xa), (ib, lb, xb) in zip(a, b):
        assert np.array_equal(xa, xb) and np.array_equal(la, lb) and np.array_equal(ia, ib)


def cache_bytes(root):
    total = 0
    for d, _, files in os.walk(root):
        for f in files:
            try:
                st = os.stat(os.path.join(d, f))
            except FileNotFoundError:
                continue
            total += max(st.st_size, st.st_blocks * 512)
    return total


def shard_files(root):
    return sorted(f for _, _, files in os.walk(root) for f in files
                  if f.startswith("shard-") and f.endswith((".mdb", ".h5"))
                  or ".mdb." in f and not f.endswith((".lock", ".part")))


def test_s3_batches_and_bytes_equal_a_local_read(env, s3_archive, local_archive):
    same(epoch(shardfeed.Loader(s3_archive, **OPTS), 2),
         epoch(shardfeed.Loader(local_archive, **OPTS), 2))
    remote, local = shardfeed.Archive(s3_archive), shardfeed.Archive(local_archive)
    assert len(remote) == len(local) == 36
    assert [bytes(remote.record(i)) for i in range(36)] == \
           [bytes(local.record(i)) for i in range(36)]
    assert list(remote.labels()) == list(local.labels())


def test_http_batches_equal_a_local_read(env, http_url, local_archive):
    same(epoch(shardfeed.Loader(http_url, **OPTS)), epoch(shardfeed.Loader(local_archive, **OPTS)))


def test_worker_processes_read_the_shared_cache(env, s3_archive, local_archive):
    same(epoch(shardfeed.Loader(s3_archive, mode="processes", **OPTS)),
         epoch(shardfeed.Loader(local_archive, **OPTS)))


def test_cli_inspect_and_verify_over_s3(env, s3_archive):
    out = subprocess.run([CLI, "inspect", s3_archive], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "samples:     36" in out.stdout
    out = subprocess.run([CLI, "verify", s3_archive], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "0 bad samples" in out.stdout


def test_verify_catches_a_flipped_byte(env, moto_url, local_archive, tmp_path):
    damaged = tmp_path / "damaged"
    subprocess.run(["cp", "-r", local_archive, str(damaged)], check=True)
    shard = damaged / "shard-00002.mdb"
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0x01
    shard.write_bytes(bytes(data))
    url = upload(moto_url, str(damaged), "damaged")
    out = subprocess.run([CLI, "verify", url], capture_output=True, text=True)
    assert out.returncode != 0
    assert "shard-00002.mdb" in out.stdout + out.stderr
    assert "mismatch" in out.stdout + out.stderr
    # The damaged download was discarded both times: nothing of it is in the cache.
    assert not [f for f in shard_files(os.environ["SHARDFEED_CACHE_DIR"]) if "00002" in f]


def test_a_missing_object_fails_at_once_naming_the_url(env, moto_url):
    with pytest.raises(FileNotFoundError) as e:
        shardfeed.Archive("s3://data/no-such-archive")
    assert "s3://data/no-such-archive/manifest.json" in str(e.value)
    assert "test-secret-never-shown" not in str(e.value)


def test_a_too_small_cache_limit_is_refused_at_open(env, s3_archive, local_archive):
    need = sum(os.path.getsize(os.path.join(local_archive, f)) for f in os.listdir(local_archive)
               if f.startswith("shard-"))
    env.setenv("SHARDFEED_CACHE_LIMIT", str(need - 1))
    with pytest.raises(shardfeed.Error, match=f"at least {need}"):
        shardfeed.Loader(s3_archive, **OPTS)
    env.setenv("SHARDFEED_CACHE_LIMIT", str(need))
    assert len(epoch(shardfeed.Loader(s3_archive, **OPTS))) == 5


def test_the_cache_never_holds_more_than_its_limit(env, moto_url, s3_archive, local_archive):
    need = sum(os.path.getsize(os.path.join(local_archive, f)) for f in os.listdir(local_archive)
               if f.startswith("shard-"))
    second = upload(moto_url, local_archive, "second-copy")
    limit = need + need // 2
    env.setenv("SHARDFEED_CACHE_LIMIT", str(limit))
    root = os.environ["SHARDFEED_CACHE_DIR"]
    peak, done = [0], threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], cache_bytes(root))
            done.wait(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for url in (s3_archive, second, s3_archive):
            a = shardfeed.Archive(url)
            assert [bytes(a.record(i))[:4] for i in range(36)]
            del a
            gc.collect()
            peak[0] = max(peak[0], cache_bytes(root))
    finally:
        done.set()
        watcher.join()
    assert 0 < peak[0] <= limit
    assert cache_bytes(root) <= limit


def test_resets_and_5xx_are_retried_until_the_read_completes(proxy, s3_archive, local_archive):
    proxy.rules({"shard-00003": ["reset", "reset", "half", "reset"], "shard-00005": ["reset"]})
    same(epoch(shardfeed.Loader(s3_archive, **OPTS)), epoch(shardfeed.Loader(local_archive, **OPTS)))
    gets = proxy.shard_gets()
    assert gets["/data/good/shard-00003.mdb"] == 5
    assert gets["/data/good/shard-00005.mdb"] == 2


def test_a_stalled_body_times_out_and_is_fetched_again(proxy, s3_archive, local_archive):
    os.environ["SHARDFEED_FETCH_STALL_TIMEOUT"] = "1"
    try:
        proxy.rules({"shard-00001": ["stall"]})
        a = shardfeed.Archive(s3_archive)
        assert bytes(a.record(10)) == bytes(shardfeed.Archive(local_archive).record(10))
    finally:
        del os.environ["SHARDFEED_FETCH_STALL_TIMEOUT"]
    assert proxy.shard_gets()["/data/good/shard-00001.mdb"] == 2


def test_a_server_that_stays_down_fails_with_a_clear_error(proxy, s3_archive, env):
    env.setenv("SHARDFEED_FETCH_RETRIES", "2")
    proxy.all_reset(True)
    with pytest.raises(shardfeed.Error, match="after 3 attempts"):
        shardfeed.Archive(s3_archive)
    env.setenv("AWS_ENDPOINT_URL", proxy.url.rsplit(":", 1)[0] + ":1")  # nothing listens
    with pytest.raises(shardfeed.Error, match="(?i)connect"):
        shardfeed.Archive(s3_archive)


def test_a_corrupt_body_is_fetched_again_once_then_a_data_error(proxy, env, s3_archive,
                                                                local_archive):
    proxy.rules({"shard-00004": ["corrupt"]})
    same(epoch(shardfeed.Loader(s3_archive, **OPTS)), epoch(shardfeed.Loader(local_archive, **OPTS)))
    assert proxy.shard_gets()["/data/good/shard-00004.mdb"] == 2

    env.setenv("SHARDFEED_CACHE_DIR", os.environ["SHARDFEED_CACHE_DIR"] + "-2")
    before = proxy.shard_gets()["/data/good/shard-00006.mdb"]
    proxy.rules({"shard-00006": ["corrupt", "corrupt"]})
    with pytest.raises(shardfeed.DataError, match="shard-00006.mdb.*mismatch"):
        shardfeed.Archive(s3_archive)
    assert proxy.shard_gets()["/data/good/shard-00006.mdb"] == before + 2


READER = """
import sys, shardfeed
a = shardfeed.Archive(sys.argv[1])
sys.stdout.write("".join("%d," % a.labels()[i] for i in range(len(a))))
"""


def shard_count(local_archive):
    with open(os.path.join(local_archive, "manifest.json")) as f:
        return len(json.load(f)["shards"])


def test_two_processes_sharing_a_cache_download_each_shard_once(proxy, s3_archive, local_archive):
    proxy.rules({"shard-00000": ["stall"]})  # the first downloader holds shard 0's lock
    first = subprocess.Popen([sys.executable, "-c", READER, s3_archive], stdout=subprocess.PIPE)
    assert proxy.wait_stalled()
    second = subprocess.Popen([sys.executable, "-c", READER, s3_archive], stdout=subprocess.PIPE)
    # The second has read the manifest (so it is about to wait on shard 0) before the first goes on.
    for _ in range(6000):
        if proxy.state()["gets"].get("/data/good/manifest.json", 0) >= 2 or second.poll() is not None:
            break
        threading.Event().wait(0.01)
    proxy.release()  # the stalled body ends short: the first retries, the second waits
    out1, _ = first.communicate(timeout=120)
    out2, _ = second.communicate(timeout=120)
    assert first.returncode == 0 and second.returncode == 0
    assert out1 == out2 and out1.count(b",") == 36
    gets = proxy.shard_gets()
    assert gets.pop("/data/good/shard-00000.mdb") == 2  # the stalled body and its retry
    assert sorted(gets.values()) == [1] * (shard_count(local_archive) - 1)


def test_an_interrupted_download_is_never_used(proxy, s3_archive, local_archive):
    proxy.rules({"shard-00000": ["stall"]})
    cli = subprocess.Popen([CLI, "verify", s3_archive], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    assert proxy.wait_stalled()
    cli.send_signal(signal.SIGINT)
    assert cli.wait(60) != 0
    root = os.environ["SHARDFEED_CACHE_DIR"]
    assert not [f for f in shard_files(root) if "00000" in f and not f.endswith(".part")]
    proxy.release()
    a = shardfeed.Archive(s3_archive)
    assert bytes(a.record(0)) == bytes(shardfeed.Archive(local_archive).record(0))
    assert not [f for _, _, fs in os.walk(root) for f in fs if f.endswith(".part")]


def test_block_shuffle_is_the_same_over_s3_and_locally_and_reads_shards_in_windows(
        env, s3_archive, local_archive):
    opts = dict(OPTS, shuffle="block", shuffle_window=2)
    remote = epoch(shardfeed.Loader(s3_archive, **opts), 2)
    same(remote, epoch(shardfeed.Loader(local_archive, **opts), 2))
    with open(os.path.join(local_archive, "manifest.json")) as f:
        firsts = [s["first_sample"] for s in json.load(f)["shards"]]
    shard_of = np.searchsorted(firsts, np.arange(36), side="right") - 1
    order = np.concatenate([x for _, _, x in remote[:5]])  # epoch 0
    assert sorted(order) == list(range(36))
    # Shards in windows of 2: the epoch reads runs of 2 shards, each shard in one run.
    windows = []
    for sample in order:
        if not windows or len(windows[-1] | {shard_of[sample]}) > 2:
            windows.append(set())
        windows[-1].add(shard_of[sample])
    shards = len(firsts)
    assert shards >= 6
    assert len(windows) == (shards + 1) // 2
    assert sorted(s for w in windows for s in w) == list(range(shards))
