"""A shard cut short on disk while an archive has it mapped (another job rewriting it in place,
a full disk, a hostile user) is an error naming the file and its sizes, in the Archive and the
Loader, never a SIGBUS that kills the training process. Run in a child process with Python's
faulthandler on (as pytest has it), whose own SIGBUS handler ours must leave in place."""
import os
import subprocess
import sys

GOOD = os.path.join(os.environ.get("SHARDFEED_TEST_DATA", ""), "good")

CHILD = r"""
import os, sys, shardfeed
src, out, backend = sys.argv[1:4]
shardfeed.pack(src, out, workers=2, encoding="raw", size=256, crop="center", backend=backend)
a = shardfeed.Archive(out)
shard = max((os.path.join(out, f) for f in os.listdir(out)), key=os.path.getsize)
assert a[0][0].shape == (256, 256, 3)
loader = shardfeed.Loader(a, batch_size=4, size=64, mode=sys.argv[4])
it = iter(loader)
next(it)
os.truncate(shard, 16384)
for what, read in (("loader", lambda: [b for b in it]), ("archive", lambda: a[len(a) - 1])):
    try:
        read()
        print(what, "no error")
    except shardfeed.Error as e:
        print(what, "error:", e)
"""


def test_a_truncated_shard_is_an_error_not_a_crash(tmp_path):
    for backend in ("lmdb", "hdf5"):
        for mode in ("threads", "processes"):
            out = str(tmp_path / ("a-" + backend + "-" + mode))
            p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", CHILD, GOOD, out,
                                backend, mode], capture_output=True, text=True, timeout=120)
            assert p.returncode == 0, (backend, mode, p.returncode, p.stderr[-2000:])
            lines = p.stdout.splitlines()
            assert len(lines) == 2, p.stdout
            for line in lines:
                assert "changed on disk while in use" in line, line
                assert "16384 bytes now" in line and "shard-00000" in line, line
