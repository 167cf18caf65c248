"""Archives read over s3:// (moto_server) and http:// (http.server) through the local cache,
against the same archive read from disk, and the faults a network brings (conftest.FaultProxy)."""
import fcntl
import gc
import itertools
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import shardfeed
from conftest import free_port, upload, wait_listening

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


def cache_bytes(root, listing=None):
    """Bytes of every file under the cache folder `root`, counted under the cache's own lock
    (<root>/.cache.lock): every change that adds to the cache (a reservation, an eviction, the
    rename of a finished download) runs under it, so the count is one state of the cache. A walk
    without it can list one archive's folder before an eviction and another's after the
    downloads that followed, and count both (seen once in 12 runs under load: 2x the archive)."""
    total = 0
    if not os.path.isdir(root):
        return 0  # nothing cached yet
    lock = os.open(os.path.join(root, ".cache.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for d, _, files in os.walk(root):
            for f in files:
                try:
                    st = os.stat(os.path.join(d, f))
                except FileNotFoundError:
                    continue
                total += max(st.st_size, st.st_blocks * 512)
                if listing is not None:
                    listing.append((os.path.relpath(os.path.join(d, f), root), st.st_size,
                                    st.st_blocks * 512))
    finally:
        os.close(lock)
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


def test_a_server_that_ignores_range_costs_the_archive_once(env, http_url, local_archive):
    # Python's http.server answers a ranged GET with the whole object (HTTP 200). Each of the
    # ranged GETs in flight read its whole part of that before the fallback to one whole GET:
    # about 1.9x the shards' bytes. Not a byte of a 200 to a range is read now.
    env.setenv("SHARDFEED_FETCH_PART_BYTES", "8192")  # shards above 16 KiB come in parts
    with open(os.path.join(local_archive, "manifest.json")) as f:
        shards = json.load(f)["shards"]
    total = sum(s["file_bytes"] for s in shards)  # and the manifest, fetched at open
    total += os.path.getsize(os.path.join(local_archive, "manifest.json"))
    assert max(s["file_bytes"] for s in shards) > 3 * 8192
    before = shardfeed.fetch_stats()["bytes_fetched"]
    same(epoch(shardfeed.Loader(http_url, **OPTS)), epoch(shardfeed.Loader(local_archive, **OPTS)))
    fetched = shardfeed.fetch_stats()["bytes_fetched"] - before
    assert total <= fetched <= total + 1024, (fetched, total)


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


def test_a_missing_bucket_is_named_as_such(env, moto_url):
    """S3's NoSuchBucket read as "manifest.json: not found": a typo in the bucket looked like a
    missing archive. The reply's error code is now read and said."""
    with pytest.raises(FileNotFoundError) as e:
        shardfeed.Archive("s3://no-such-bucket-here/a")
    assert "the bucket does not exist" in str(e.value) and "NoSuchBucket" in str(e.value)
    out = subprocess.run([CLI, "inspect", "s3://no-such-bucket-here/a"], capture_output=True,
                         text=True)
    assert out.returncode != 0 and "the bucket does not exist" in out.stderr, out.stderr


def test_verify_reports_a_missing_shard_object_as_damage(env, moto_url, local_archive):
    """A missing shard object was exit 2 ("not an archive") with no JSON: the manifest is there,
    so the archive is damaged, as a local one missing a shard file is."""
    from conftest import BUCKET, s3_client
    url = upload(moto_url, local_archive, "missing")
    s3_client(moto_url).delete_object(Bucket=BUCKET, Key="missing/shard-00001.mdb")
    out = subprocess.run([CLI, "verify", url, "--json"], capture_output=True, text=True)
    assert out.returncode == 1, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert not report["ok"] and f"{url}/shard-00001.mdb" in report["error"]
    assert not shardfeed.verify(url)["ok"]
    out = subprocess.run([CLI, "verify", "s3://data/no-such-archive"], capture_output=True,
                         text=True)
    assert out.returncode == 2 and "manifest.json" in out.stderr  # not an archive at all


def test_a_too_small_cache_limit_is_refused_at_open(env, s3_archive, local_archive):
    need = sum(os.path.getsize(os.path.join(local_archive, f)) for f in os.listdir(local_archive)
               if f.startswith("shard-"))
    env.setenv("SHARDFEED_CACHE_LIMIT", str(need - 1))
    with pytest.raises(shardfeed.Error, match=f"at least {need}"):
        shardfeed.Loader(s3_archive, **OPTS)
    env.setenv("SHARDFEED_CACHE_LIMIT", str(need))
    assert len(epoch(shardfeed.Loader(s3_archive, **OPTS))) == 5


class CacheWatch:
    """The largest size of the cache folder `root` seen on disk, measured by a thread every 2 ms
    while the block runs and wherever the test calls measure()."""

    def __init__(self, root):
        self.root, self.peak, self._done = root, 0, threading.Event()
        self.at_peak = []  # (file, size, allocated) at the peak: what a failure shows
        self._lock = threading.Lock()  # the thread and the test both raise the peak
        self._thread = threading.Thread(target=self._run)

    def measure(self):
        listing = []
        size = cache_bytes(self.root, listing)
        with self._lock:
            if size > self.peak:
                self.peak, self.at_peak = size, listing

    def _run(self):
        while not self._done.is_set():
            self.measure()
            self._done.wait(0.002)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()
        self.measure()


def test_the_cache_never_holds_more_than_its_limit(env, moto_url, s3_archive, local_archive):
    need = sum(os.path.getsize(os.path.join(local_archive, f)) for f in os.listdir(local_archive)
               if f.startswith("shard-"))
    second = upload(moto_url, local_archive, "second-copy")
    limit = need + need // 2
    env.setenv("SHARDFEED_CACHE_LIMIT", str(limit))
    root = os.environ["SHARDFEED_CACHE_DIR"]
    with CacheWatch(root) as watch:
        for url in (s3_archive, second, s3_archive):
            a = shardfeed.Archive(url)
            assert [bytes(a.record(i))[:4] for i in range(36)]
            del a
            gc.collect()
            watch.measure()
    assert 0 < watch.peak <= limit, (limit, watch.at_peak)
    assert cache_bytes(root) <= limit


def test_resets_and_5xx_are_retried_until_the_read_completes(proxy, s3_archive, local_archive):
    proxy.rules({"shard-00003": ["reset", "reset", "half", "reset"], "shard-00005": ["reset"]})
    same(epoch(shardfeed.Loader(s3_archive, **OPTS)), epoch(shardfeed.Loader(local_archive, **OPTS)))
    gets = proxy.shard_gets()
    assert gets["/data/good/shard-00003.mdb"] == 5
    assert gets["/data/good/shard-00005.mdb"] == 2


def test_an_error_reply_is_read_no_further_than_its_reason(proxy, s3_archive, local_archive):
    # A 5xx whose body never ends (an error page, a misbehaving gateway) was read to its end
    # before the retry: its first 4 KiB say why, and the transfer ends there.
    proxy.rules({"shard-00002": ["error_flood"]})
    same(epoch(shardfeed.Loader(s3_archive, **OPTS)), epoch(shardfeed.Loader(local_archive, **OPTS)))
    assert proxy.shard_gets()["/data/good/shard-00002.mdb"] == 2
    assert proxy.state()["flood_sent"] < (32 << 20)  # of 256 MiB: socket buffers at most


def test_a_stalled_body_times_out_and_is_fetched_again(proxy, s3_archive, local_archive):
    os.environ["SHARDFEED_FETCH_STALL_TIMEOUT"] = "1"
    try:
        proxy.rules({"shard-00001": ["stall"]})
        a = shardfeed.Archive(s3_archive)
        assert bytes(a.record(10)) == bytes(shardfeed.Archive(local_archive).record(10))
    finally:
        del os.environ["SHARDFEED_FETCH_STALL_TIMEOUT"]
    assert proxy.shard_gets()["/data/good/shard-00001.mdb"] == 2


@pytest.mark.parametrize("name, value", [
    ("SHARDFEED_FETCH_STALL_TIMEOUT", "0"), ("SHARDFEED_FETCH_STALL_TIMEOUT", "abc"),
    ("SHARDFEED_FETCH_RETRIES", "3x"), ("SHARDFEED_FETCH_MAX_DELAY", "-1"),
    ("SHARDFEED_FETCH_WAIT", "soon"), ("SHARDFEED_FETCH_PART_BYTES", "1")])
def test_a_fetch_variable_that_is_not_a_number_in_range_is_refused(s3_archive, env, name, value):
    # Read with atol, "0" or a typo was 0: no stall timeout, and a stalled body hung for ever.
    env.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        shardfeed.Archive(s3_archive)


def test_a_server_that_stays_down_fails_with_a_clear_error(proxy, s3_archive, env):
    env.setenv("SHARDFEED_FETCH_RETRIES", "2")
    proxy.all_reset(True)
    with pytest.raises(shardfeed.Error, match="after 3 attempts") as e:
        shardfeed.Archive(s3_archive)
    # A network failure is an OSError too, as the standard library's are (it was only Error).
    assert isinstance(e.value, OSError) and isinstance(e.value, shardfeed.StorageError)
    env.setenv("AWS_ENDPOINT_URL", proxy.url.rsplit(":", 1)[0] + ":1")  # nothing listens
    with pytest.raises(OSError, match="(?i)connect") as e:
        shardfeed.Archive(s3_archive)
    assert isinstance(e.value, shardfeed.Error)


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


def test_the_downloads_of_an_open_are_counted_in_bench_and_fetch_stats(env, s3_archive,
                                                                        local_archive, tmp_path):
    # Found by a stranger's test: an archive checked whole at open downloads every shard there,
    # before any epoch, and bench's figures (and the loader's) showed no fetching at all.
    n = shard_count(local_archive)
    out = subprocess.run([CLI, "bench", s3_archive, "--cache-dir", str(tmp_path / "c"), "--epochs",
                          "1", "--size", "16", "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    opened = json.loads(out.stdout)["open"]
    assert opened["cache_misses"] == n and opened["bytes_fetched"] > 0, opened
    out = subprocess.run([CLI, "bench", s3_archive, "--cache-dir", str(tmp_path / "c"), "--epochs",
                          "1", "--size", "16"], capture_output=True, text=True)
    assert f"open: remote: 0.0 MB fetched, {n} shards from the cache, 0 downloaded" in out.stdout
    before = shardfeed.fetch_stats()
    shardfeed.Archive(s3_archive, cache_dir=str(tmp_path / "d"))
    after = shardfeed.fetch_stats()
    assert after["cache_misses"] - before["cache_misses"] == n
    assert after["bytes_fetched"] > before["bytes_fetched"]


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


# ---- A cache smaller than the archive: shuffle="block" releases shards as it goes ----------

BLOCK = dict(batch_size=8, shuffle="block", seed=3, crop="none", workers=2)


def watched_epoch(loader, root, limit, e=0):
    """An epoch of `loader`, the cache folder measured on disk after every batch and by a
    watcher thread meanwhile: (batches, the largest size seen, the loader's stats)."""
    out = []
    with CacheWatch(root) as watch:
        loader.set_epoch(e)
        for b in loader:
            out.append((b.images.copy(), b.labels.copy(), b.indices.copy()))
            watch.measure()
        stats = loader.stats()
    return out, watch.peak, stats


def test_a_quarter_of_the_archive_in_cache_reads_an_epoch_as_a_local_read(env, many_shards,
                                                                          tmp_path):
    local, url, total = many_shards
    limit = total // 4
    cache = tmp_path / "quarter"
    # No option but the cache: the default window fits it (1 shard here), and the epoch is the
    # local read's with that window, for the same seed.
    remote = shardfeed.Loader(url, cache_dir=str(cache), cache_limit=limit, **BLOCK)
    got, peak, stats = watched_epoch(remote, str(cache), limit)
    same(got, epoch(shardfeed.Loader(local, shuffle_window=1, **BLOCK)))
    assert sorted(np.concatenate([x for _, _, x in got])) == list(range(3200))
    assert 0 < peak <= limit
    assert stats["cache_misses"] >= 20 and stats["fetch_wait_seconds"] >= 0
    # Bytes fetched per epoch: about the archive once. An epoch's figure also counts the first
    # shards of the next epoch, which run-ahead fetches before it ends: over three epochs.
    fetched = stats["bytes_fetched"]
    for e in (1, 2):
        got, peak, stats = watched_epoch(remote, str(cache), limit, e=e)
        assert len(got) == 400 and 0 < peak <= limit
        fetched += stats["bytes_fetched"]
    # At least what the cache could not carry over from one epoch to the next.
    assert 3 * total - 2 * limit <= fetched <= 3 * 1.1 * total
    assert not os.path.exists(os.environ["SHARDFEED_CACHE_DIR"] + "/remote")  # cache_dir= won


def test_a_shard_replaced_on_the_server_says_reopen_not_skip_errors(env, moto_url, local_archive,
                                                                   tmp_path):
    """A shard object packed again under an open loader failed with the hint to train on with
    skip_errors=True, which would skip every sample of it; the error now says to reopen."""
    from conftest import BUCKET, s3_client
    url = upload(moto_url, local_archive, "replaced")
    shards = sorted(f for f in os.listdir(local_archive) if f.startswith("shard-"))
    total = sum(os.path.getsize(os.path.join(local_archive, f)) for f in shards)
    # Under the archive's size: shards are fetched as the epoch reaches them, not all at open.
    loader = shardfeed.Loader(url, cache_dir=str(tmp_path / "c"), cache_limit=total // 2,
                              batch_size=4, shuffle="block", crop="center", size=32, workers=1)
    last = shards[-1]
    other = open(os.path.join(local_archive, shards[0]), "rb").read()
    assert other != open(os.path.join(local_archive, last), "rb").read()
    s3_client(moto_url).put_object(Bucket=BUCKET, Key=f"replaced/{last}", Body=other)
    with pytest.raises(shardfeed.Error) as e:
        for _ in loader:
            pass
    assert f"{url}/{last}" in str(e.value) and "reopen it" in str(e.value), str(e.value)
    assert "skip_errors" not in str(e.value)


def test_a_shard_object_larger_than_listed_is_not_read_past_its_size(env, moto_url,
                                                                     local_archive, tmp_path):
    # Found by a stranger's test: an object larger than its manifest entry was downloaded whole,
    # twice, past the room the cache had reserved for it (and past cache_limit); on a small
    # disk the error said "No space left on device" instead of naming the object.
    from conftest import BUCKET, s3_client
    url = upload(moto_url, local_archive, "larger")
    shard = sorted(f for f in os.listdir(local_archive) if f.startswith("shard-"))[0]
    size = os.path.getsize(os.path.join(local_archive, shard))
    s3_client(moto_url).put_object(Bucket=BUCKET, Key=f"larger/{shard}",
                                   Body=os.urandom(16 << 20))
    before = shardfeed.fetch_stats()["bytes_fetched"]
    with pytest.raises(shardfeed.DataError, match="more than the %d bytes the manifest lists" %
                       size):
        shardfeed.Archive(url, cache_dir=str(tmp_path / "c"))
    fetched = shardfeed.fetch_stats()["bytes_fetched"] - before
    assert fetched < 8 * size + (4 << 20), fetched  # two tries of about its size, not 2 x 16 MiB


def test_a_full_open_begins_no_download_after_a_shard_failed(proxy, env, many_shards, tmp_path):
    # Found by a stranger's test: after the first shard failed for good, the open went on
    # downloading every other shard, each with its timeouts and retries (against a store that
    # stalls: hours for a thousand shards). At most the downloads already begun finish.
    _, url, _ = many_shards
    env.setenv("SHARDFEED_FETCH_RETRIES", "0")
    proxy.rules({"shard-": ["reset"] * 100})
    with pytest.raises(shardfeed.StorageError, match="shard-000"):
        shardfeed.Archive(url, cache_dir=str(tmp_path / "c"), index_check="full")
    assert sum(proxy.shard_gets().values()) <= 8, proxy.shard_gets()  # of 20 shards


def test_a_cache_that_holds_the_whole_archive_is_never_refused(env, many_shards, tmp_path):
    # At a limit of the archive's size the given Archive opens every shard (held), and the
    # loader's own copy's window was added on top: refused, while a quarter was taken.
    local, url, total = many_shards
    for limit in (total, total + total // 10):
        cache = str(tmp_path / ("c%d" % limit))
        loader = shardfeed.Loader(url, cache_dir=cache, cache_limit=limit, **BLOCK)
        got, peak, _ = watched_epoch(loader, cache, limit)
        assert len(got) == 400 and peak <= limit


def test_a_quarter_cache_needs_no_option_at_batch_64(env, many_shards, tmp_path):
    # Batches of 64 with prefetch="auto": the ring's most slots (8 x 64 samples, over 3 shards
    # of 160) and the shards fetched ahead would need more than a quarter of the archive; the
    # loader takes fewer ring slots instead of refusing (the bench's case).
    local, url, total = many_shards
    opts = dict(BLOCK, batch_size=64)
    remote = shardfeed.Loader(url, cache_dir=str(tmp_path / "q"), cache_limit=total // 4, **opts)
    got, peak, _ = watched_epoch(remote, str(tmp_path / "q"), total // 4)
    assert sorted(np.concatenate([x for _, _, x in got])) == list(range(3200))
    assert 0 < peak <= total // 4

    # The batches are a local read's with the window the loader chose (one of 1..8).
    def equal(a, b):
        return len(a) == len(b) and all(
            np.array_equal(xa, xb) and np.array_equal(la, lb) and np.array_equal(ia, ib)
            for (ia, la, xa), (ib, lb, xb) in zip(a, b))

    assert any(equal(got, epoch(shardfeed.Loader(local, shuffle_window=w, **opts)))
               for w in range(1, 9))


def test_a_quarter_cache_needs_no_option_with_shards_split_by_bytes(env, byte_split_shards,
                                                                   tmp_path):
    # Shards of unequal sample counts (big images pack few to a shard) and a short last one,
    # batches of 64: the minimum once counted every shard as holding as few samples as the
    # smallest, and refused a quarter of the archive (bench/remote_bench.py's case).
    local, url, total = byte_split_shards
    opts = dict(BLOCK, batch_size=64, crop="center", size=8)
    cache = str(tmp_path / "q")
    remote = shardfeed.Loader(url, cache_dir=cache, cache_limit=total // 4, **opts)
    got, peak, _ = watched_epoch(remote, cache, total // 4)
    assert sorted(np.concatenate([x for _, _, x in got])) == list(range(2000))
    assert 0 < peak <= total // 4


def test_a_cache_below_the_minimum_is_refused_at_open_giving_it(env, many_shards, tmp_path):
    local, url, total = many_shards
    with pytest.raises(shardfeed.Error, match=r"at least (\d+)") as e:
        shardfeed.Loader(url, cache_dir=str(tmp_path / "c"), cache_limit=total // 20, **BLOCK)
    minimum = int(re.search(r"at least (\d+)", str(e.value)).group(1))
    assert total // 20 < minimum <= total // 4
    assert "shuffle_window" in str(e.value)
    with pytest.raises(shardfeed.Error, match=f"at least {minimum}"):
        shardfeed.Loader(url, cache_dir=str(tmp_path / "c"), cache_limit=minimum - 1, **BLOCK)
    loader = shardfeed.Loader(url, cache_dir=str(tmp_path / "c"), cache_limit=minimum, **BLOCK)
    got, peak, _ = watched_epoch(loader, str(tmp_path / "c"), minimum)
    assert len(got) == 400 and peak <= minimum
    # A global shuffle holds every shard it has read: refused, pointing at shuffle="block".
    with pytest.raises(shardfeed.Error) as e:
        shardfeed.Loader(url, cache_limit=total // 4, **dict(BLOCK, shuffle=True))
    assert 'shuffle="block"' in str(e.value) and f"at least {total}" in str(e.value)
    # The figure it quotes for shuffle="block" is what that loader takes (it was more), and
    # worker processes' refusal quotes the same.
    quoted = int(re.search(r"needs only (\d+) bytes", str(e.value)).group(1))
    with pytest.raises(shardfeed.Error) as e:
        shardfeed.Loader(url, cache_limit=total // 4, mode="processes", **BLOCK)
    assert f"releases them and needs {quoted} bytes" in str(e.value)
    assert quoted == minimum


def test_cache_options_through_the_cli(env, many_shards, tmp_path):
    local, url, total = many_shards
    cache = tmp_path / "cli-cache"
    out = subprocess.run([CLI, "bench", url, "--cache-dir", str(cache), "--cache-limit",
                          str(total // 4), "--shuffle", "block", "--crop", "none",
                          "--batch-size", "8", "--workers", "2", "--json"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["options"]["shuffle_window"] == "1"
    assert 0 < report["epochs"][0]["bytes_fetched"] <= 1.1 * total
    assert report["epochs"][0]["cache_misses"] >= 20
    assert [f for f in shard_files(str(cache))]
    assert cache_bytes(str(cache)) <= total // 4
    assert not os.path.exists(os.environ["SHARDFEED_CACHE_DIR"] + "/remote")
    out = subprocess.run([CLI, "bench", url, "--cache-dir", str(cache), "--cache-limit", "1KB",
                          "--shuffle", "block"], capture_output=True, text=True)
    assert out.returncode != 0 and "at least" in out.stderr
    out = subprocess.run([CLI, "bench", url, "--cache-limit", "lots"], capture_output=True,
                         text=True)
    assert out.returncode == 2 and "cache_limit (--cache-limit)" in out.stderr
    for tiny in ("0", "0.5", "1.5"):  # were "unlimited" (0) and one byte
        out = subprocess.run([CLI, "bench", url, "--cache-limit", tiny], capture_output=True,
                             text=True)
        assert out.returncode == 2 and "at least 4 KiB" in out.stderr, out.stderr
    for command in (["inspect", url], ["verify", url], ["extract", url, str(tmp_path / "x")]):
        d = tmp_path / ("c-" + command[0])
        out = subprocess.run([CLI, *command, "--cache-dir", str(d), "--cache-limit", "20MB"],
                             capture_output=True, text=True)
        assert out.returncode == 0, (command, out.stderr)
        assert len(shard_files(str(d))) == 20, command
        if command[0] == "extract":
            continue
        out = subprocess.run([CLI, *command, "--cache-dir", str(d), "--cache-limit",
                              str(total // 4)], capture_output=True, text=True)
        assert out.returncode != 0 and f"at least {total}" in out.stderr, command


def test_a_cache_over_a_lowered_limit_is_trimmed_at_open(env, many_shards, tmp_path):
    # REGRESSION: a cache filled without a limit stayed above a cache_limit given later: its
    # reads were all hits, so no download ever evicted for it. Opening with the limit trims it.
    local, url, total = many_shards
    cache = str(tmp_path / "c")
    full = shardfeed.Archive(url, cache_dir=cache)  # no limit: every shard downloaded at open
    assert list(full.labels()) == list(shardfeed.Archive(local).labels())
    del full
    assert cache_bytes(cache) >= total
    # (review, S3 stranger) A limit the open refuses as too small trims nothing: a typo must
    # not empty a cache that every later read would then download again.
    with pytest.raises(shardfeed.Error, match="cache_limit"):
        shardfeed.Loader(url, cache_dir=cache, cache_limit=total // 40, shuffle=True)
    assert cache_bytes(cache) >= total
    lowered = shardfeed.Archive(url, cache_dir=cache, cache_limit=total // 2)
    assert np.array_equal(lowered[3199][0], shardfeed.Archive(local)[3199][0])
    assert 0 < cache_bytes(cache) <= total // 2  # trimmed at the first read


def test_verify_names_a_bad_shard_object_once_as_a_local_verify_does(env, moto_url,
                                                                     local_archive, tmp_path):
    # (S3 stranger) A truncated shard object: a remote verify reported every sample of it as
    # bad, and "manifest disagrees" (the manifest was intact), where a local verify of the same
    # damage names the shard once. A shard whose download does not match is now named once.
    from conftest import BUCKET, s3_client
    url = upload(moto_url, local_archive, "cut-shard")
    shards = sorted(f for f in os.listdir(local_archive) if f.startswith("shard-"))
    body = open(os.path.join(local_archive, shards[1]), "rb").read()
    s3_client(moto_url).put_object(Bucket=BUCKET, Key=f"cut-shard/{shards[1]}",
                                   Body=body[:len(body) // 2])
    local = tmp_path / "local"
    shutil.copytree(local_archive, local)
    with open(local / shards[1], "r+b") as f:
        f.truncate(len(body) // 2)
    reports = []
    for where in (url, str(local)):
        out = subprocess.run([CLI, "verify", where, "--json"], capture_output=True, text=True)
        assert out.returncode == 1, out.stderr
        r = json.loads(out.stdout)
        reports.append((len(r["bad_shards"]), len(r["bad_samples"]), r["bad_manifest"],
                        r["checked"]))
        assert shards[1] in r["bad_shards"][0], r
    assert reports[0] == reports[1] and reports[0][:3] == (1, 0, []), reports


def test_cache_options_in_python(env, s3_archive, local_archive, tmp_path):
    d = tmp_path / "py-cache"
    a = shardfeed.Archive(s3_archive, cache_dir=d, cache_limit="20MB")
    assert list(a.labels()) == list(shardfeed.Archive(local_archive).labels())
    assert len(shard_files(str(d))) == shard_count(local_archive)
    assert not os.path.exists(os.environ["SHARDFEED_CACHE_DIR"] + "/remote")
    with pytest.raises(ValueError, match="cache_limit"):
        shardfeed.Archive(s3_archive, cache_dir=d, cache_limit="much")
    with pytest.raises(TypeError, match="shardfeed.Archive"):
        shardfeed.Loader(a, cache_dir=d)
    import shardfeed.torch as sft
    loader = sft.Loader(s3_archive, cache_dir=str(tmp_path / "torch-cache"), batch_size=8,
                        size=32)
    assert sum(len(b[1]) for b in loader) == 36
    assert len(shard_files(str(tmp_path / "torch-cache"))) == shard_count(local_archive)
    # The tools take them too (they went to the default cache before).
    for name, tool in (("verify", lambda **k: shardfeed.verify(s3_archive, **k)["ok"]),
                       ("stats", lambda **k: shardfeed.stats(s3_archive, size=16, **k)["samples"]),
                       ("inspect", lambda **k: shardfeed.inspect(s3_archive, **k)["samples"])):
        assert tool(cache_dir=tmp_path / name, cache_limit="20MB"), name
        assert len(shard_files(str(tmp_path / name))) == shard_count(local_archive), name
        with pytest.raises(ValueError, match="cache_limit"):
            tool(cache_dir=tmp_path / name, cache_limit="much")
    assert not os.path.exists(os.environ["SHARDFEED_CACHE_DIR"] + "/remote")


def test_a_server_down_mid_epoch_and_back_completes_the_epoch(proxy, env, many_shards, tmp_path):
    local, url, total = many_shards
    env.setenv("SHARDFEED_FETCH_RETRIES", "60")  # ~12 s of retries at most: far more than needed
    loader = shardfeed.Loader(url, cache_dir=str(tmp_path / "c"), cache_limit=total // 4, **BLOCK)
    loader.set_epoch(0)
    it = iter(loader)
    got = [(b.images.copy(), b.labels.copy(), b.indices.copy()) for b in itertools.islice(it, 50)]
    before = sum(proxy.shard_gets().values())
    proxy.all_reset(True)  # the server is down

    def back_up():  # once a shard request has met the down server: up again
        for _ in range(6000):  # bounded: 60 s
            if sum(proxy.shard_gets().values()) > before:
                break
            threading.Event().wait(0.01)
        proxy.all_reset(False)

    helper = threading.Thread(target=back_up)
    helper.start()
    try:
        got += [(b.images.copy(), b.labels.copy(), b.indices.copy()) for b in it]
    finally:
        helper.join()
    assert sum(proxy.shard_gets().values()) > before + 1  # refused, then fetched again
    same(got, epoch(shardfeed.Loader(local, shuffle_window=1, **BLOCK)))


def test_a_server_down_mid_epoch_for_good_fails_with_a_clear_error(proxy, env, many_shards,
                                                                    tmp_path):
    local, url, total = many_shards
    env.setenv("SHARDFEED_FETCH_RETRIES", "2")
    loader = shardfeed.Loader(url, cache_dir=str(tmp_path / "c"), cache_limit=total // 4, **BLOCK)
    loader.set_epoch(0)
    it = iter(loader)
    assert len(list(itertools.islice(it, 50))) == 50
    proxy.all_reset(True)
    with pytest.raises(shardfeed.Error, match="after 3 attempts") as e:
        for _ in it:
            pass
    assert "shard-" in str(e.value) and "test-secret-never-shown" not in str(e.value)


def test_an_epoch_continued_after_a_download_error_delivers_every_batch_once(proxy, env,
                                                                            many_shards, tmp_path):
    # Before, the batch whose download failed was consumed (and the batches after it that failed
    # while the server was down): an epoch continued once the server was back lacked them, and
    # state_dict() counted them as read.
    local, url, total = many_shards
    env.setenv("SHARDFEED_FETCH_RETRIES", "0")
    loader = shardfeed.Loader(url, cache_dir=str(tmp_path / "c"), cache_limit=total // 4, **BLOCK)
    loader.set_epoch(0)
    got = []
    for b in loader:
        got.append((b.images.copy(), b.labels.copy(), b.indices.copy()))
        if len(got) == 50:
            break
    proxy.all_reset(True)  # the server is down
    with pytest.raises(shardfeed.StorageError):
        for b in loader:
            got.append((b.images.copy(), b.labels.copy(), b.indices.copy()))
    assert loader.state_dict()["position"] == len(got)  # the failed batch is not consumed
    proxy.all_reset(False)
    errors = 0
    for _ in range(40):  # bounded: a shard that failed is tried again 2 s later
        try:
            for b in loader:
                got.append((b.images.copy(), b.labels.copy(), b.indices.copy()))
            break
        except shardfeed.StorageError:
            errors += 1
            threading.Event().wait(0.25)
    assert errors < 40
    same(got, epoch(shardfeed.Loader(local, shuffle_window=1, **BLOCK)))


def test_a_shard_whose_download_failed_is_fetched_again_once_the_server_is_back(proxy, env,
                                                                               many_shards,
                                                                               tmp_path):
    # Before, a shard whose download had failed kept that error for the archive's life: a
    # loader (or an Archive) that met the server down could never read that shard again.
    local, url, total = many_shards
    env.setenv("SHARDFEED_FETCH_RETRIES", "1")
    archive = shardfeed.Archive(url, index_check="lazy", cache_dir=str(tmp_path / "c"))
    len(archive)  # opened (the manifest read): each shard is downloaded when first read
    proxy.all_reset(True)
    with pytest.raises(shardfeed.Error, match="after 2 attempts"):
        archive.record(0)
    with pytest.raises(shardfeed.Error, match="after 2 attempts"):
        archive.record(1)  # at once, from the kept error: no storm of downloads
    gets = sum(proxy.shard_gets().values())
    proxy.all_reset(False)
    threading.Event().wait(2.2)  # a failed download is tried again 2 s after it failed
    assert bytes(archive.record(0)) == bytes(shardfeed.Archive(local).record(0))
    assert sum(proxy.shard_gets().values()) > gets


def test_big_shards_come_as_parallel_ranged_gets_each_retried(proxy, env, s3_archive,
                                                              local_archive):
    part = 8192  # shards above 2 parts (16 KiB) come as ranged GETs of 8 KiB
    env.setenv("SHARDFEED_FETCH_PART_BYTES", str(part))
    proxy.rules({"shard-00003": ["reset", "half"]})  # two of its parts fail once each
    same(epoch(shardfeed.Loader(s3_archive, **OPTS)), epoch(shardfeed.Loader(local_archive, **OPTS)))
    with open(os.path.join(local_archive, "manifest.json")) as f:
        sizes = {s["file"]: s["file_bytes"] for s in json.load(f)["shards"]}
    parts = {f: (n + part - 1) // part if n > 2 * part else 1 for f, n in sizes.items()}
    assert max(parts.values()) >= 3
    gets = {p.rsplit("/", 1)[1]: n for p, n in proxy.shard_gets().items()}
    assert gets.pop("shard-00003.mdb") == parts.pop("shard-00003.mdb") + 2
    assert gets == parts


# ---- Review (h/review): shards the keeper released, read again by the consumer ---------------

def test_block_shuffle_with_a_ragged_field_holds_no_more_than_the_cache(env, many_shards,
                                                                        tmp_path):
    # REGRESSION (review): variable fields (str "path" here; boxes, json, ...) are gathered by the
    # consumer in Next() (GatherFields) from the loader's own archive, after the workers' runs
    # finished and the keeper may have released (unmapped) the shard: a gather concurrent with
    # ReleaseShard reads unmapped memory, and a gather after it reopens the shard, which then
    # stays held (nothing releases it until the next epoch), so the cache fills up past what the
    # loader planned for. The epoch must read like one without fields, within the cache limit,
    # and every shard must be downloaded once (cache hits: none, with a fresh cache).
    local, url, total = many_shards
    limit = total // 4
    cache = tmp_path / "ragged"
    loader = shardfeed.Loader(url, cache_dir=str(cache), cache_limit=limit, fields=["path"],
                              run_ahead=False, **BLOCK)
    with CacheWatch(str(cache)) as watch:
        loader.set_epoch(0)
        paths = []
        for b in loader:
            paths += list(b["path"])
            watch.measure()
        stats = loader.stats()
    assert len(paths) == 3200
    assert 0 < watch.peak <= limit
    assert stats["cache_misses"] == 20 and stats["cache_hits"] == 0, stats


def test_a_shard_that_failed_while_the_server_was_down_is_read_in_the_next_epoch(proxy, env,
                                                                                  many_shards,
                                                                                  tmp_path):
    # REGRESSION (review): the keeper's archive reopens released shards, but a shard whose open
    # failed once keeps that error for the loader's life (Archive::Ready: `failed` is sticky), so
    # a network outage during one epoch fails (or, with skip_errors, silently drops) the same
    # shards in every later epoch, though the server is back.
    local, url, total = many_shards
    env.setenv("SHARDFEED_FETCH_RETRIES", "0")
    loader = shardfeed.Loader(url, cache_dir=str(tmp_path / "c"), cache_limit=total // 4,
                              run_ahead=False, **BLOCK)
    proxy.all_reset(True)  # down from the start: the first shards fail
    loader.set_epoch(0)
    with pytest.raises(shardfeed.Error):
        next(iter(loader))
    proxy.all_reset(False)
    loader.set_epoch(1)
    got = [(b.images.copy(), b.labels.copy(), b.indices.copy()) for b in loader]
    assert len(got) == 400


def test_a_loader_over_an_archive_that_holds_shards_counts_them(env, many_shards, tmp_path):
    # A Loader given an Archive opens a private copy for its keeper; shards the caller's Archive
    # has read stay mapped and flocked by it (never evictable). Before, they were not in the
    # cache the loader planned for, so a cache_limit the loader accepted failed mid-epoch with
    # "cache ... is full" (here: 3 shards looked at before the loader was made).
    local, url, total = many_shards
    with pytest.raises(shardfeed.Error, match=r"at least (\d+)") as e:
        shardfeed.Loader(url, cache_dir=str(tmp_path / "c"), cache_limit=total // 20, **BLOCK)
    minimum = int(re.search(r"at least (\d+)", str(e.value)).group(1))
    limit = max(minimum, 3 * (total // 20))  # room for the loader, or for the 3 shards read
    a = shardfeed.Archive(url, cache_dir=str(tmp_path / "c"), cache_limit=limit)
    for i in (0, 160, 320):  # a sample of each of the first 3 shards
        a.record(i)
    try:
        loader = shardfeed.Loader(a, **BLOCK)
    except shardfeed.Error as refused:  # refused at Create, counting them
        assert "at least" in str(refused) and "3 shards the archive given to the loader holds" \
            in str(refused)
        return
    got, peak, _ = watched_epoch(loader, str(tmp_path / "c"), limit)
    assert len(got) == 400 and peak <= limit


def test_a_resume_does_not_wait_for_a_stalled_download_it_no_longer_needs(proxy, env,
                                                                          many_shards, tmp_path):
    # REGRESSION (review): the fetcher threads download the plan's next shards while holding the
    # shard's mutex (Archive::Ready). A resume (StartEpoch) past such a shard has Sweep release it
    # with the loader's lock held: ReleaseShard waits for that download, and with it every worker,
    # the consumer and (the call holds the GIL) the whole Python process, until the stalled body
    # times out (SHARDFEED_FETCH_STALL_TIMEOUT) and the shard is fetched again. Shown without a
    # clock: when the resumed batch arrives, the stalled GET must still be the shard's only one.
    local, url, total = many_shards
    env.setenv("SHARDFEED_FETCH_STALL_TIMEOUT", "5")  # how long the bug freezes the process
    opts = dict(BLOCK, shuffle_window=1, run_ahead=False)
    order = []  # the shards in the order the plan first reads them (160 samples a shard)
    for _, _, x in epoch(shardfeed.Loader(local, **opts)):
        for i in x:
            if i // 160 not in order:
                order.append(int(i // 160))
    stalled = "shard-%05d" % order[2]
    proxy.rules({stalled: ["stall"]})  # fetched ahead once shard order[0] begins
    loader = shardfeed.Loader(url, cache_dir=str(tmp_path / "c"), cache_limit=total // 4, **opts)
    loader.set_epoch(0)
    it = iter(loader)
    for _ in range(3):
        next(it)
    del it  # an early break: the next pass starts where load_state_dict says
    try:
        assert proxy.wait_stalled()
        state = loader.state_dict()
        state["position"] = 60  # batch 60: shard order[3]; order[2] is wholly before it
        loader.load_state_dict(state)
        batch = next(iter(loader))
        gets = sum(n for p, n in proxy.shard_gets().items() if stalled in p)
    finally:
        proxy.release()
    assert all(i // 160 == order[3] for i in batch.indices)
    assert gets == 1, "the resume waited for the stalled download of a shard it does not read"


def test_an_early_break_then_another_epoch_stays_within_the_cache(env, many_shards, tmp_path):
    # REGRESSION (review): StartEpoch's Sweep kept every open shard that the new plan reads at
    # any time later ("pending": last position >= next), so the shards the abandoned epoch had
    # open (its window, those fetched ahead) stayed held until the new epoch reached them, on
    # top of the new epoch's own: "cache ... is full" mid-epoch after an early break.
    local, url, total = many_shards
    limit = total // 4
    cache = tmp_path / "breaks"
    loader = shardfeed.Loader(url, cache_dir=str(cache), cache_limit=limit, **BLOCK)
    for e in range(4):  # break early in three epochs, then read a whole one
        loader.set_epoch(e)
        it = iter(loader)
        for _ in range(30 if e < 3 else 0):
            next(it)
        del it
    got, peak, _ = watched_epoch(loader, str(cache), limit, e=4)
    assert len(got) == 400 and 0 < peak <= limit


def test_early_breaks_with_a_ragged_field_never_fill_the_cache(env, tmp_path):
    # REGRESSION: with a variable field, a batch's shards stay held until the consumer gathers
    # it. After an early break and set_epoch, the abandoned epoch's batches whose runs were
    # still being decoded (or waiting for a download) kept their shards held while the new
    # epoch's batches claimed theirs: two plans' windows in a cache sized for one, and "cache
    # ... is full" mid-epoch. Now no new run is handed out until the abandoned ones end.
    import random
    from PIL import Image
    rng = np.random.default_rng(11)  # long names: the path field weighs more than the pixels
    for c in range(20):
        folder = tmp_path / "src" / f"class{c:02d}"
        folder.mkdir(parents=True)
        for i in range(160):
            pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / ("x" * 100 + f"{i:03d}.png"))
    local = str(tmp_path / "srv" / "a")
    shardfeed.pack(str(tmp_path / "src"), local, encoding="raw", shard_size=40960)
    with open(os.path.join(local, "manifest.json")) as f:
        shards = json.load(f)["shards"]
    total = sum(os.path.getsize(os.path.join(local, s["file"])) for s in shards)
    port = free_port()  # Python's http.server: slow enough that runs wait for downloads
    server = subprocess.Popen([sys.executable, "-m", "http.server", "-b", "127.0.0.1", "-d",
                               os.path.dirname(local), str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port, server)
        url = f"http://127.0.0.1:{port}/{os.path.basename(local)}"
        limit = total // 2
        cache = tmp_path / "ragged-breaks"
        loader = shardfeed.Loader(url, cache_dir=str(cache), cache_limit=limit, fields=["path"],
                                  batch_size=16, shuffle="block", seed=1, crop="none", workers=4)
        rng = random.Random(1)
        batches = 0
        for _ in range(800):
            if rng.random() < 0.3:
                loader.set_epoch(rng.randrange(5))
            stop = rng.randrange(1, 60)
            for i, b in enumerate(loader):
                for path, label in zip(b["path"], b.labels):
                    assert path.startswith("class%02d/" % label), (path, label)
                batches += 1
                if i >= stop:
                    break
            assert cache_bytes(str(cache)) <= limit
        assert batches > 800
    finally:
        server.terminate()
        server.wait(timeout=30)


GATED_CHILD = r"""
import json, sys
import shardfeed
url, cache, limit, e = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
loader = shardfeed.Loader(url, cache_dir=cache, cache_limit=limit, **json.loads(sys.argv[5]))
it = iter(loader)
next(it)  # batch 0
sys.stdin.readline()  # the test saw a worker reach the gate with batch 1's first sample
del it    # an early break, with that run still in flight
print("broke", flush=True)
loader.set_epoch(e)
it = iter(loader)
print("started", flush=True)
print("done", sum(1 for _ in it), flush=True)
"""


def test_a_new_epoch_fetches_nothing_while_abandoned_runs_hold_their_shards(proxy, env,
                                                                           many_shards, tmp_path):
    # REGRESSION (CI): after an early break, Claim hands out no run of the new epoch until the
    # abandoned epoch's runs in flight have ended (their shards and the new epoch's would not fit
    # a cache sized for one epoch's windows), but the fetcher threads did not wait: they
    # downloaded the new epoch's first shards at once, into a cache still holding the abandoned
    # runs' shards, and a download refused there ("cache ... is full") stayed that shard's error,
    # failing the new epoch's first batches. Shown with a gate, not a race: a decode of the
    # abandoned epoch is held (failpoint decode_gate) while the new epoch starts; until it is let
    # go, no shard that only the new epoch reads may be requested.
    local, url, total = many_shards
    opts = dict(BLOCK, batch_size=16, shuffle_window=1, run_ahead=False, prefetch=2)

    def shard_order(e):  # the shards epoch e reads, in order (160 samples a shard), and its batches
        loader = shardfeed.Loader(local, **opts)
        loader.set_epoch(e)
        batches = [b.indices.copy() for b in loader]
        order = []
        for i in np.concatenate(batches):
            if i // 160 not in order:
                order.append(int(i // 160))
        return order, batches

    old, batches = shard_order(0)
    gated = int(batches[1][0])  # a worker decodes it while the consumer takes batch 0
    # An epoch whose first shards are none of those epoch 0 reads first (or fetches ahead).
    firsts = ((e, shard_order(e)[0][:3]) for e in range(1, 60))  # read until one is found
    e, first = next((e, f) for e, f in firsts if not set(f) & set(old[:3]))
    new_only = ["shard-%05d" % s for s in first]
    gate = str(tmp_path / "gate")
    os.mkfifo(gate)
    child_env = dict(os.environ, SHARDFEED_FAILPOINTS="decode_gate=%d" % gated,
                     SHARDFEED_FAILPOINT_GATE=gate)
    child = subprocess.Popen([sys.executable, "-c", GATED_CHILD, url, str(tmp_path / "c"),
                              str(total // 4), str(e), json.dumps(opts)], env=child_env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    release, lines, out = -1, [], ""
    try:
        for _ in range(6000):  # bounded (60 s): the child's worker reaches the gate
            try:
                release = os.open(gate, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError:
                assert child.poll() is None, "the child ended before the gated decode"
                time.sleep(0.01)
        assert release >= 0, "the gated sample was never decoded"
        child.stdin.write("go\n")  # the child breaks off now, with the gated run in flight
        child.stdin.flush()
        # The child prints two lines without waiting for anything held here (a watchdog bounds
        # the wait should it hang: it kills the child, whose pipe then ends).
        watchdog = threading.Timer(120, child.kill)
        watchdog.start()
        lines = [child.stdout.readline(), child.stdout.readline()]
        watchdog.cancel()
        assert lines == ["broke\n", "started\n"]
        early = []
        for _ in range(300):  # 3 s with the abandoned run held: time enough to fetch ahead
            early = [p for p in proxy.shard_gets() if any(s in p for s in new_only)]
            if early:
                break
            time.sleep(0.01)
    finally:
        if release >= 0:
            os.close(release)  # the gated decode goes on, and with it the new epoch
        try:
            out = child.communicate(timeout=120)[0]
        finally:
            if child.poll() is None:  # a gate never reached, or a hang: never left behind
                child.kill()
                child.wait()
    assert child.returncode == 0
    assert out == "done %d\n" % len(batches)
    assert early == [], "fetched for the new epoch while the abandoned run held its shards"


def test_a_download_refused_for_cache_room_is_tried_again_at_the_next_read(env, many_shards,
                                                                          tmp_path):
    # REGRESSION (review): format::Archive kept a shard's failed open as its error, and a
    # download the cache refused for room ("cache ... is full": shards in use held it) was kept
    # too: every later read of that shard failed although the room came back. That is how a
    # loader's download ahead, refused while an abandoned epoch still held its shards, failed
    # the new epoch's reads. A refusal for room is now tried again at the next read.
    local, url, total = many_shards
    with open(os.path.join(local, "manifest.json")) as f:
        biggest = max(s["file_bytes"] for s in json.load(f)["shards"])
    opts = dict(cache_dir=str(tmp_path / "c"), cache_limit=2 * biggest + biggest // 2)
    first = shardfeed.Archive(url, **opts)  # lazy: the cache holds 2 of the 20 shards
    first.record(0), first.record(160)      # shards 0 and 1, held while `first` lives
    second = shardfeed.Archive(url, **opts)
    with pytest.raises(shardfeed.Error, match="is full"):
        second.record(320)
    del first
    gc.collect()
    assert bytes(second.record(320)) == bytes(shardfeed.Archive(local).record(320))


def test_a_refused_shard_is_not_tried_again_at_every_read(env, many_shards, tmp_path):
    # REGRESSION (review): a shard the cache refused for room was tried again at every access,
    # and each try lists the whole cache (4 system calls a file) under the cache-wide lock, which
    # every process on the node shares: 2.7 ms a sample with 500 cached files, 37 ms with 5,000,
    # and with another process holding the lock, each read waited for it (60 s, then a timeout).
    # The refusal is now kept until this process gives room back (or a backoff of 50 ms doubling
    # to 2 s passes, for room given back elsewhere).
    local, url, total = many_shards
    with open(os.path.join(local, "manifest.json")) as f:
        biggest = max(s["file_bytes"] for s in json.load(f)["shards"])
    cache = tmp_path / "c"
    opts = dict(cache_dir=str(cache), cache_limit=2 * biggest + biggest // 2)
    first = shardfeed.Archive(url, **opts)
    first.record(0), first.record(160)  # the cache's room, held
    second = shardfeed.Archive(url, **opts)
    with pytest.raises(shardfeed.Error, match="is full"):
        second.record(320)  # refused: one survey of the cache
    # Every survey (and download) takes <cache>/.cache.lock: hold it. A kept refusal answers at
    # once with its error; a survey would wait for the lock and fail with a timeout instead.
    lock = os.open(cache / ".cache.lock", os.O_RDWR)
    fcntl.flock(lock, fcntl.LOCK_EX)
    errors = []
    try:
        for i in range(50):
            try:
                second.record(321 + i)
            except shardfeed.Error as e:
                errors.append(str(e))
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        os.close(lock)
    assert len(errors) == 50 and all("is full" in e for e in errors), errors[:2]
    del first
    gc.collect()  # room given back in this process: tried again at the next read
    assert bytes(second.record(320)) == bytes(shardfeed.Archive(local).record(320))


def test_a_read_that_waits_for_a_download_lets_other_python_threads_run(env, many_shards, tmp_path):
    # REGRESSION: Archive(...), record(), labels() and sample() opened shards (a remote
    # archive's first read of a shard is its download, or a wait for another process's) with
    # the GIL held: every other Python thread stopped for the whole download. A thread that
    # would have ended the wait (here: it gives back the cache's lock the download needs) could
    # not run, and the read failed after 60 s ("not free after 60 s"; the deadlock seen in
    # CacheWatch, whose thread takes that lock to measure the cache).
    local, url, _ = many_shards
    reference = shardfeed.Archive(local)
    lazy = dict(index_check="lazy")  # shards opened (downloaded) at their first read
    cases = [
        ("open", {}, lambda a: bytes(a.record(5)), bytes(reference.record(5))),
        ("record", lazy, lambda a: bytes(a.record(5)), bytes(reference.record(5))),
        ("labels", lazy, lambda a: a.labels().tolist(), reference.labels().tolist()),
        ("sample", lazy, lambda a: a.sample(341)["label"], reference.sample(341)["label"]),
    ]
    for name, opts, read, expected in cases:
        cache = tmp_path / name
        os.makedirs(cache)
        a = None if name == "open" else shardfeed.Archive(url, cache_dir=str(cache), **opts)
        lock = os.open(cache / ".cache.lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(lock, fcntl.LOCK_EX)  # every download reserves its room under this lock
        released = threading.Event()

        def give_back():
            time.sleep(0.5)  # the read is waiting for the lock by then
            fcntl.flock(lock, fcntl.LOCK_UN)
            released.set()

        t = threading.Thread(target=give_back)
        t.start()
        try:
            if a is None:
                a = shardfeed.Archive(url, cache_dir=str(cache), **opts)  # downloads every shard
            assert read(a) == expected, name
        finally:
            t.join()
            os.close(lock)
        assert released.is_set(), name


def cached_copies(root, shard):
    """Paths of the finished cached copies of `shard` (e.g. shard-00002.mdb) under `root`."""
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files
            if f.startswith(shard + ".") and not f.endswith((".lock", ".part"))]


def shard_samples(local_archive, s):
    with open(os.path.join(local_archive, "manifest.json")) as f:
        info = json.load(f)["shards"][s]
    return info["file"], range(info["first_sample"], info["first_sample"] + info["sample_count"])


def damage_a_record(copy, record):
    """Flips a byte in the middle of `record`'s payload inside the cached file `copy`."""
    data = bytearray(open(copy, "rb").read())
    at = data.find(record)
    assert at >= 0
    data[at + len(record) // 2] ^= 0x40
    with open(copy, "r+b") as f:  # in place: the same file (inode) the cache handed out
        f.write(data)


def test_a_cached_copy_truncated_on_disk_is_downloaded_again(env, s3_archive, local_archive):
    root = os.environ["SHARDFEED_CACHE_DIR"]
    expected = [bytes(shardfeed.Archive(local_archive).record(i)) for i in range(36)]
    assert [bytes(shardfeed.Archive(s3_archive).record(i)) for i in range(36)] == expected
    gc.collect()
    name, _ = shard_samples(local_archive, 2)
    [copy] = cached_copies(root, name)
    os.truncate(copy, os.path.getsize(copy) // 2)  # a disk fault, a full disk, a stray tool
    # A copy that no longer opens is discarded and fetched once more, not an error for good.
    assert [bytes(shardfeed.Archive(s3_archive).record(i)) for i in range(36)] == expected
    [copy] = cached_copies(root, name)
    assert open(copy, "rb").read() == open(os.path.join(local_archive, name), "rb").read()
    gc.collect()
    os.truncate(copy, 100)
    out = subprocess.run([CLI, "verify", s3_archive], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    # verify says which copy it replaced, and why (it gave only a count).
    assert f"REPAIRED cache: {s3_archive}/{name} (cached copy {copy}) no longer opened (" \
        in out.stdout, out.stdout


def test_verify_replaces_a_cached_copy_damaged_since_its_download(env, s3_archive, local_archive):
    root = os.environ["SHARDFEED_CACHE_DIR"]
    name, samples = shard_samples(local_archive, 2)
    record = bytes(shardfeed.Archive(local_archive).record(samples[0]))
    assert len(shardfeed.Archive(s3_archive)) == 36
    gc.collect()
    [copy] = cached_copies(root, name)
    damage_a_record(copy, record)
    out = subprocess.run([CLI, "verify", s3_archive], capture_output=True, text=True)
    # The archive in the store is whole: verify says so, and says what it replaced in the cache.
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"REPAIRED cache: {s3_archive}/{name}: shard hash mismatch in the cached copy " \
        f"{copy}, damaged since its download: discarded; the next open downloads it again" \
        in out.stdout, \
        out.stdout
    assert "0 bad samples, 0 bad shards: OK" in out.stdout
    [copy] = cached_copies(root, name)
    assert open(copy, "rb").read() == open(os.path.join(local_archive, name), "rb").read()
    report = shardfeed.verify(s3_archive)  # nothing left to repair
    assert report["ok"] and report["repaired"] == []


def test_a_checksum_error_in_a_cached_copy_names_it_and_the_next_open_downloads_it_again(
        env, s3_archive, local_archive):
    root = os.environ["SHARDFEED_CACHE_DIR"]
    name, samples = shard_samples(local_archive, 2)
    record = bytes(shardfeed.Archive(local_archive).record(samples[0]))
    opts = dict(OPTS, verify_checksums=True)
    expected = epoch(shardfeed.Loader(local_archive, **opts))
    same(epoch(shardfeed.Loader(s3_archive, **opts)), expected)
    gc.collect()
    [copy] = cached_copies(root, name)
    damage_a_record(copy, record)
    with pytest.raises(shardfeed.Error) as e:
        epoch(shardfeed.Loader(s3_archive, **opts))
    assert f"sample {samples[0]}: payload checksum mismatch" in str(e.value)
    assert f"in the cached copy {copy}, damaged since its download and now discarded" in str(e.value)
    gc.collect()
    same(epoch(shardfeed.Loader(s3_archive, **opts)), expected)


def test_a_slow_download_is_progress_not_a_timeout(proxy, env, many_shards, tmp_path):
    """The loader's timeout counted only completed samples: a shard arriving from a slow store
    for longer than the timeout failed the read, blaming a worker. Bytes arriving count now; a
    store that sends nothing still times out, saying so."""
    local, url, total = many_shards
    archive = shardfeed.Archive(url, index_check="lazy", cache_dir=str(tmp_path / "c"))
    proxy.rules({"shard-00000": ["slow"]})  # about 3 s of bytes arriving
    loader = shardfeed.Loader(archive, batch_size=8, workers=1, timeout=1, shuffle=False)
    first = next(iter(loader))
    want = next(iter(shardfeed.Loader(local, batch_size=8, workers=1, shuffle=False)))
    assert np.array_equal(first.images, want.images) and np.array_equal(first.labels, want.labels)
    archive = shardfeed.Archive(url, index_check="lazy", cache_dir=str(tmp_path / "d"))
    proxy.rules({"shard-00000": ["stall"]})  # half the body, then nothing
    loader = shardfeed.Loader(archive, batch_size=8, workers=1, timeout=1, shuffle=False)
    try:
        with pytest.raises(shardfeed.Timeout, match="no byte arrived from s3://"):
            next(iter(loader))
    finally:
        proxy.release()


def test_a_cached_copy_truncated_while_mapped_is_named_with_its_real_size(env, s3_archive,
                                                                          local_archive):
    root = os.environ["SHARDFEED_CACHE_DIR"]
    name, samples = shard_samples(local_archive, 3)
    archive = shardfeed.Archive(s3_archive)
    [copy] = cached_copies(root, name)
    os.truncate(copy, 8192)
    with pytest.raises(shardfeed.DataError) as e:
        for i in samples:
            archive.sample(i)
    # It stat'ed the URL as a path: "now unreadable: No such file or directory".
    assert f"{name} (cached copy {copy}): changed on disk while in use" in str(e.value)
    assert "8192 bytes now" in str(e.value)


def test_something_else_at_a_cached_copys_name_is_left_alone_and_not_called_damage(
        env, s3_archive, local_archive):
    root = os.environ["SHARDFEED_CACHE_DIR"]
    name, _ = shard_samples(local_archive, 3)
    shardfeed.Archive(s3_archive)
    gc.collect()
    [copy] = cached_copies(root, name)
    os.unlink(copy)
    os.mkdir(copy)  # a folder of that name, the user's
    (pathlib.Path(copy) / "mine.txt").write_text("keep")
    out = subprocess.run([CLI, "verify", s3_archive], capture_output=True, text=True)
    assert out.returncode == 3, out.stdout + out.stderr  # could not read: not "BAD archive"
    assert copy in out.stderr and "BAD" not in out.stdout
    with pytest.raises(shardfeed.StorageError):
        shardfeed.verify(s3_archive)
    assert (pathlib.Path(copy) / "mine.txt").read_text() == "keep"


def test_eviction_never_removes_a_file_the_cache_did_not_name(env, many_shards, tmp_path):
    """Eviction walked the whole cache folder and removed any file, least recently used first:
    a user's notes, a backup of a shard, files in folders of their own."""
    local, url, total = many_shards
    cache = tmp_path / "c"
    loader = shardfeed.Loader(url, cache_dir=str(cache), cache_limit=total // 4, **BLOCK)
    loader.set_epoch(0)
    batches = iter(loader)
    next(batches)  # the cache folders exist now
    [key] = os.listdir(cache / "remote")
    first = shard_files(str(cache))[0]
    folder = cache / "remote" / key
    theirs = [cache / "notes.txt", cache / "remote" / "mine.txt", cache / "remote" / "dir" / "f",
              folder / "notes.txt", folder / (first + ".bak"), folder / "sub" / "x",
              folder / ".hidden.0123456789abcdef"]
    for p in theirs:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"keep" * 1000)
        os.utime(p, (1, 1))  # the least recently used of all
    assert 1 + sum(1 for _ in batches) == 400  # every shard downloaded, most evicted
    assert loader.stats()["cache_misses"] >= 20
    for p in theirs:
        assert p.read_bytes() == b"keep" * 1000, p
