"""Ctrl-C while Python opens a remote archive (storage's CancelToken, the bindings'
RunInterruptible): the open stops within seconds instead of when every download is done, raises
KeyboardInterrupt, leaves no partial file in the cache, and the next open reads the archive as
stored. Each opener runs in a child process (a signal to pytest's own would end the session)
against conftest.FaultProxy, whose "stall" and "trickle" hold a shard's body for minutes."""
import os
import signal
import subprocess
import sys
import time

import pytest

import shardfeed

CLI = os.environ.get("SHARDFEED_CLI", "shardfeed")
# Seconds from SIGINT to the child's end: far below what the held downloads last (the stall
# timeout and the trickle's 2 minutes, the server down's back-off), far above a cancel's second.
BOUND_S = 15
STALLED_SHARD = "/data/good/shard-00000.mdb"

OPENER = """
import signal, sys, shardfeed
signal.signal(signal.SIGINT, signal.default_int_handler)
what, url, out = sys.argv[1:4]
opens = {
    "Archive": lambda: shardfeed.Archive(url),
    "Loader": lambda: shardfeed.Loader(url, batch_size=4),
    "verify": lambda: shardfeed.verify(url),
    "stats": lambda: shardfeed.stats(url),
    "inspect": lambda: shardfeed.inspect(url),
    "convert": lambda: shardfeed.convert(url, out),
}
try:
    opens[what]()
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
    sys.exit(3)
print("opened", flush=True)
"""


def start_opener(what, url, tmp_path, **env):
    # A stalled body would time out (and be fetched again) only after 5 minutes.
    env = {**os.environ, "SHARDFEED_FETCH_STALL_TIMEOUT": "300", **env}
    return subprocess.Popen([sys.executable, "-c", OPENER, what, url, str(tmp_path / "out")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def interrupt(child):
    """SIGINT to `child`; its (returncode, stdout, stderr) once it ended, within BOUND_S."""
    child.send_signal(signal.SIGINT)
    start = time.monotonic()
    try:
        out, err = child.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        pytest.fail(f"still running {BOUND_S} s after SIGINT: Ctrl-C waits for the downloads")
    return child.returncode, out, err, time.monotonic() - start


def part_files(root):
    return [f for _, _, files in os.walk(root) for f in files if f.endswith(".part")]


def reads_as_stored(url, local_archive):
    a, b = shardfeed.Archive(url), shardfeed.Archive(local_archive)
    assert len(a) == len(b)
    assert all(bytes(a.record(i)) == bytes(b.record(i)) for i in range(len(b)))


@pytest.mark.parametrize("what, action", [
    ("Archive", "stall"), ("Archive", "trickle"), ("Loader", "stall"), ("verify", "stall"),
    ("stats", "stall"), ("inspect", "stall"), ("convert", "trickle")])
def test_ctrl_c_while_a_remote_archive_opens_raises_keyboard_interrupt_at_once(
        proxy, s3_archive, local_archive, tmp_path, what, action):
    proxy.rules({"shard-00000": [action]})
    child = start_opener(what, s3_archive, tmp_path)
    assert proxy.wait_stalled(), child.communicate(timeout=60)
    code, out, err, _ = interrupt(child)
    assert code == 3 and out == "KeyboardInterrupt\n", (code, out, err)
    # The abandoned download left nothing a later open could take for the shard.
    root = os.environ["SHARDFEED_CACHE_DIR"]
    assert part_files(root) == []
    proxy.release()
    reads_as_stored(s3_archive, local_archive)
    assert proxy.shard_gets()[STALLED_SHARD] == 2  # the abandoned body, then the new open's


def test_ctrl_c_ends_the_back_off_of_a_server_that_is_down(proxy, s3_archive, local_archive,
                                                           tmp_path):
    proxy.all_reset(True)
    # 60 retries up to 60 s apart: a quarter of an hour before the open would give up.
    child = start_opener("Archive", s3_archive, tmp_path, SHARDFEED_FETCH_RETRIES="60",
                         SHARDFEED_FETCH_MAX_DELAY="60")
    manifest = "/data/good/manifest.json"
    deadline = time.monotonic() + 60
    while proxy.state()["gets"].get(manifest, 0) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proxy.state()["gets"].get(manifest, 0) >= 3, child.communicate(timeout=60)
    code, out, err, _ = interrupt(child)
    assert code == 3 and out == "KeyboardInterrupt\n", (code, out, err)
    proxy.all_reset(False)
    reads_as_stored(s3_archive, local_archive)


def test_the_cli_still_dies_by_sigint_while_it_downloads(proxy, s3_archive, local_archive):
    proxy.rules({"shard-00000": ["stall"]})
    cli = subprocess.Popen([CLI, "verify", s3_archive], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "SHARDFEED_FETCH_STALL_TIMEOUT": "300"})
    assert proxy.wait_stalled()
    code, _, err, _ = interrupt(cli)
    assert code == -signal.SIGINT, (code, err)  # the default action: no handler, no cleanup run
    proxy.release()
    reads_as_stored(s3_archive, local_archive)


LOADER_AFTER_OPEN = """
import signal, sys, shardfeed
signal.signal(signal.SIGINT, signal.default_int_handler)
a = shardfeed.Archive(sys.argv[1])  # opened while the server is up
print("opened", flush=True)
sys.stdin.readline()  # the test takes the server down
try:
    shardfeed.Loader(a, batch_size=4, shuffle="block")
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
    sys.exit(3)
print("made", flush=True)
"""


def test_ctrl_c_while_a_loader_re_reads_a_remote_manifest(proxy, s3_archive, local_archive):
    # The loader's own copy of a remote archive (shuffle="block") reads the manifest again:
    # against a server that is down, that was minutes of back-off Ctrl-C could not end.
    child = subprocess.Popen([sys.executable, "-c", LOADER_AFTER_OPEN, s3_archive],
                             env={**os.environ, "SHARDFEED_FETCH_RETRIES": "60",
                                  "SHARDFEED_FETCH_MAX_DELAY": "60"},
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "opened\n", child.communicate(timeout=60)
    manifest = "/data/good/manifest.json"
    before = proxy.state()["gets"].get(manifest, 0)
    proxy.all_reset(True)
    child.stdin.write("\n")
    child.stdin.flush()
    deadline = time.monotonic() + 60
    while proxy.state()["gets"].get(manifest, 0) < before + 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proxy.state()["gets"].get(manifest, 0) >= before + 3, child.communicate(timeout=60)
    code, out, err, _ = interrupt(child)
    assert code == 3 and out == "KeyboardInterrupt\n", (code, out, err)
    proxy.all_reset(False)
    reads_as_stored(s3_archive, local_archive)


LAZY_READ = """
import signal, sys, shardfeed
signal.signal(signal.SIGINT, signal.default_int_handler)
a = shardfeed.Archive(sys.argv[1], index_check="lazy")  # shards download at their first read
try:
    a[0]
    print("read", flush=True)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
sys.stdin.readline()  # the test releases the stalled body
print("again", a[0][0].shape, len(a.record(0)) > 0, flush=True)
"""


def test_ctrl_c_while_a_lazy_read_downloads_then_the_read_again(proxy, s3_archive, tmp_path):
    # archive[i] of a lazily opened remote archive downloaded its shard with Ctrl-C dead; the
    # download is now interruptible, and the cancelled shard is fetched again at the next read.
    proxy.rules({"shard-00000": ["stall"]})
    child = subprocess.Popen([sys.executable, "-c", LAZY_READ, s3_archive],
                             env={**os.environ, "SHARDFEED_FETCH_STALL_TIMEOUT": "300"},
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert proxy.wait_stalled(), child.communicate(timeout=60)
    child.send_signal(signal.SIGINT)
    assert child.stdout.readline() == "KeyboardInterrupt\n", child.communicate(timeout=60)
    proxy.release()
    out, err = child.communicate("\n", timeout=120)
    assert child.returncode == 0 and out.startswith("again (") and out.endswith("True\n"), (
        out, err)
    assert part_files(os.environ["SHARDFEED_CACHE_DIR"]) == []
