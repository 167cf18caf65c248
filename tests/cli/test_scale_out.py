"""Split packing: `pack --part I/N` on any scheduler, `merge`, and `mpirun -n N shardfeed pack`.
A merged archive must equal a single-machine pack of the same source sample by sample (labels,
class names, order, record bytes); merge refuses parts that do not belong together, naming
them, and gives the same archive when run again."""
import filecmp
import os
import shutil
import subprocess

import pytest

CLI = os.environ.get("SHARDFEED_CLI", "shardfeed")
DATA = os.environ.get("SHARDFEED_TEST_DATA", "")
GOOD = os.path.join(DATA, "good")
PYTHONPATH = os.environ.get("SHARDFEED_PYTHONPATH", "")


def run(*args, check=None, env=None, timeout=120):
    p = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, env=env,
                       timeout=timeout)
    if check is not None:
        assert p.returncode == check, (p.returncode, p.stdout, p.stderr)
    return p


def same_samples(a, b):
    """Compares two archives sample by sample through `extract`: DIR/<class>/<index>.jpg holds
    each JPEG record's exact bytes, so equal trees mean equal class names, labels, order and
    records. Returns the number of samples."""
    trees = []
    for archive in (a, b):
        out = str(archive) + ".extracted"
        shutil.rmtree(out, ignore_errors=True)
        run("extract", archive, out, check=0)
        trees.append(out)

    def compare(x, y):
        cmp = filecmp.dircmp(x, y)
        assert not cmp.left_only and not cmp.right_only, (cmp.left_only, cmp.right_only)
        _, mismatch, errors = filecmp.cmpfiles(x, y, cmp.common_files, shallow=False)
        assert not mismatch and not errors, (mismatch, errors)
        return len(cmp.common_files) + sum(compare(os.path.join(x, d), os.path.join(y, d))
                                           for d in cmp.common_dirs)
    return compare(*trees)


def pack_parts(src, out, n, *extra):
    for i in range(n):
        run("pack", src, out, "--part", "%d/%d" % (i, n), "-q", *extra, check=0)
    return out.parent / (out.name + ".parts")


@pytest.mark.parametrize("backend", ["lmdb", "hdf5"])
@pytest.mark.parametrize("shuffle", [[], ["--shuffle", "--seed", "9"]])
def test_parts_merged_equal_a_single_pack(tmp_path, backend, shuffle):
    extra = ["--backend", backend, "--chunk-size", "4K", *shuffle]
    run("pack", GOOD, tmp_path / "single", "-q", *extra, check=0)
    parts = pack_parts(GOOD, tmp_path / "merged", 3, *extra)
    assert sorted(os.listdir(parts)) == ["part-00000-of-00003", "part-00001-of-00003",
                                        "part-00002-of-00003"]
    p = run("merge", parts, tmp_path / "merged", check=0)
    assert "merged 3 parts" in p.stdout and "copied" not in p.stdout
    run("verify", tmp_path / "merged", "--decode", check=0)
    assert same_samples(tmp_path / "single", tmp_path / "merged") == 36
    # No record bytes copied: the shard files are the parts' (hard links).
    merged_shard = next(f for f in os.listdir(tmp_path / "merged") if f.startswith("shard-"))
    assert os.stat(tmp_path / "merged" / merged_shard).st_nlink == 2


def test_merging_again_gives_the_same_archive(tmp_path):
    parts = pack_parts(GOOD, tmp_path / "m", 2)
    run("merge", parts, tmp_path / "m", check=0)
    run("merge", parts, tmp_path / "again", check=0)
    first = (tmp_path / "m" / "manifest.json").read_text()
    assert first == (tmp_path / "again" / "manifest.json").read_text()
    run("merge", parts, tmp_path / "m", "--overwrite", check=0)
    assert first == (tmp_path / "m" / "manifest.json").read_text()
    assert sorted(f for f in os.listdir(tmp_path / "m") if f.startswith("shard")) == [
        "shard-00000.mdb", "shard-00001.mdb"]  # no duplicated shards
    run("verify", tmp_path / "m", check=0)


def test_more_parts_than_images(tmp_path):
    parts = pack_parts(GOOD, tmp_path / "m", 40)
    run("merge", parts, tmp_path / "m", check=0)
    run("pack", GOOD, tmp_path / "s", "-q", check=0)
    assert same_samples(tmp_path / "s", tmp_path / "m") == 36


def test_a_part_says_where_it_was_written(tmp_path):
    # It printed "packed ... into OUT", where no archive is until the merge.
    p = run("pack", GOOD, tmp_path / "o", "--part", "1/2", "-q", check=0)
    assert "into %s (" % (tmp_path / "o.parts" / "part-00001-of-00002") in p.stdout, p.stdout


@pytest.fixture
def three_parts(tmp_path):
    return pack_parts(GOOD, tmp_path / "m", 3)


def test_merge_refuses_a_missing_part(tmp_path, three_parts):
    shutil.rmtree(three_parts / "part-00001-of-00003")
    p = run("merge", three_parts, tmp_path / "out", check=2)
    assert "part 1 of 3 is missing" in p.stderr
    assert not (tmp_path / "out").exists()


def test_merge_refuses_a_part_given_twice(tmp_path, three_parts):
    shutil.copytree(three_parts / "part-00002-of-00003", three_parts / "copy-of-2")
    p = run("merge", three_parts, tmp_path / "out", check=2)
    assert "part 2 of 3 is given twice" in p.stderr and "copy-of-2" in p.stderr


def test_merge_refuses_a_part_of_another_source(tmp_path, three_parts):
    other = tmp_path / "other"
    shutil.copytree(GOOD, other)
    os.remove(next((other / "cat").iterdir()))
    shutil.rmtree(three_parts / "part-00001-of-00003")
    run("pack", other, tmp_path / "m", "--part", "1/3", "-q", check=0)
    p = run("merge", three_parts, tmp_path / "out", check=2)
    assert "part-00001-of-00003" in p.stderr and "source list" in p.stderr


def test_merge_refuses_a_part_with_other_options(tmp_path, three_parts):
    shutil.rmtree(three_parts / "part-00002-of-00003")
    run("pack", GOOD, tmp_path / "m", "--part", "2/3", "--chunk-size", "64K", "-q", check=0)
    p = run("merge", three_parts, tmp_path / "out", check=2)
    assert "part-00002-of-00003" in p.stderr and "pack options" in p.stderr


def test_merge_names_the_option_that_differs(tmp_path, three_parts):
    shutil.rmtree(three_parts / "part-00002-of-00003")
    run("pack", GOOD, tmp_path / "m", "--part", "2/3", "--chunk-size", "64K", "-q", check=0)
    p = run("merge", three_parts, tmp_path / "out", check=2)
    assert "chunk_size: 65536 here, 1048576 in" in p.stderr, p.stderr


def test_converted_parts_stay_parts(tmp_path, three_parts):
    # REGRESSION (found by a stranger's test): convert dropped "part", so parts converted to
    # the other backend could no longer be merged. A part re-laid since (another jpeg_layout
    # under the same fingerprint) is told apart by the recorded options.
    h5 = tmp_path / "h5"
    h5.mkdir()
    for part in sorted(three_parts.iterdir()):
        run("convert", part, h5 / part.name, "--backend", "hdf5", check=0)
    run("merge", h5, tmp_path / "merged", "-q", check=0)
    run("pack", GOOD, tmp_path / "single", "-q", check=0)
    assert same_samples(tmp_path / "single", tmp_path / "merged") == 36
    assert run("verify", tmp_path / "merged").returncode == 0
    shutil.rmtree(h5 / "part-00001-of-00003")
    run("convert", three_parts / "part-00001-of-00003", h5 / "part-00001-of-00003",
        "--backend", "hdf5", "--jpeg-layout", "indexed", check=0)
    p = run("merge", h5, tmp_path / "mixed", check=2)
    assert 'jpeg_layout: "indexed" here, "original" in' in p.stderr, p.stderr


def test_merge_refuses_an_archive_that_is_not_a_part(tmp_path, three_parts):
    run("pack", GOOD, tmp_path / "whole", "-q", check=0)
    p = run("merge", three_parts / "part-00000-of-00003", tmp_path / "whole", tmp_path / "o",
            check=2)
    assert "not a part" in p.stderr


@pytest.mark.skipif(not os.path.isdir(os.path.join(PYTHONPATH, "shardfeed")),
                    reason="this build has no Python module (-DSHARDFEED_PYTHON=OFF)")
def test_parts_from_python(tmp_path):
    code = ("import shardfeed, sys\n"
            "src, out = sys.argv[1], sys.argv[2]\n"
            "for i in range(2):\n"
            "    shardfeed.pack(src, out, part='%d/2' % i)\n"
            "r = shardfeed.merge(out + '.parts', out)\n"
            "assert r['parts'] == 2 and r['samples'] == 36, r\n"
            "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    p = subprocess.run(["/usr/bin/python3", "-c", code, GOOD, str(tmp_path / "py")],
                       capture_output=True, text=True, env=env)
    assert p.stdout.strip() == "ok", p.stderr
    run("pack", GOOD, tmp_path / "s", "-q", check=0)
    assert same_samples(tmp_path / "s", tmp_path / "py") == 36


# ---- MPI ------------------------------------------------------------------------------------

def mpi_env():
    # CI runs as root; OpenMPI refuses that unless told it is meant. In the ASan build, leak
    # detection is off under mpirun: OpenMPI's components (dlopen'ed) keep allocations until exit;
    # the same pack and merge code is leak-checked by the tests above.
    asan = os.environ.get("ASAN_OPTIONS", "")
    return dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                OMPI_MCA_btl_vader_single_copy_mechanism="none",
                ASAN_OPTIONS=(asan + ":" if asan else "") + "detect_leaks=0")


needs_mpi = pytest.mark.skipif(
    shutil.which("mpirun") is None or "mpi" not in run("--version").stdout,
    reason="needs mpirun and a shardfeed built with MPI (libopenmpi-dev)")


@needs_mpi
@pytest.mark.parametrize("backend", ["lmdb", "hdf5"])
def test_mpirun_pack_equals_a_single_pack(tmp_path, backend):
    run("pack", GOOD, tmp_path / "single", "--backend", backend, "-q", check=0)
    p = subprocess.run(["mpirun", "--oversubscribe", "-n", "2", CLI, "pack", GOOD,
                        str(tmp_path / "mpi"), "--backend", backend, "-q"], capture_output=True,
                       text=True, env=mpi_env(), timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "on 2 ranks" in p.stdout
    assert not (tmp_path / "mpi.parts").exists()
    run("verify", tmp_path / "mpi", check=0)
    assert same_samples(tmp_path / "single", tmp_path / "mpi") == 36


@needs_mpi
@pytest.mark.parametrize("broken", ["zebra/zz-broken.jpg", "cat/aa-broken.jpg"])  # rank 1, 0
def test_a_failing_rank_fails_the_job_and_leaves_no_archive(tmp_path, broken):
    src = tmp_path / "src"
    shutil.copytree(GOOD, src)
    (src / broken).write_bytes(b"\xff\xd8 not really a jpeg")
    p = subprocess.run(["mpirun", "--oversubscribe", "-n", "2", CLI, "pack", str(src),
                        str(tmp_path / "mpi"), "--strict", "-q"], capture_output=True, text=True,
                       env=mpi_env(), timeout=300)
    # The same code as a single process: a --strict skip is bad data (1), on every rank.
    single = run("pack", src, tmp_path / "single", "--strict", "-q")
    assert single.returncode == 1, single.stderr
    assert p.returncode == 1, (p.returncode, p.stderr)
    rank = 1 if broken.startswith("zebra") else 0
    assert f"rank {rank} of 2" in p.stderr and os.path.basename(broken) in p.stderr, p.stderr
    assert not (tmp_path / "mpi").exists() and not (tmp_path / "mpi.parts").exists()


def mpirun_pack(*args):
    return subprocess.run(["mpirun", "--oversubscribe", "-n", "2", CLI, "pack", *map(str, args)],
                          capture_output=True, text=True, env=mpi_env(), timeout=300)


@needs_mpi
@pytest.mark.parametrize("existing", ["archive", "folder"])
def test_mpirun_into_an_existing_out_is_refused_before_packing(tmp_path, existing):
    out = tmp_path / "mpi"
    if existing == "archive":
        run("pack", GOOD, out, "-q", check=0)
    else:
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    before = sorted(os.listdir(out))
    report = tmp_path / "r.json"
    p = mpirun_pack(GOOD, out, "-q", "--report", report,
                    *(["--overwrite"] if existing == "folder" else []))
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert not any(f.startswith("r.json") for f in os.listdir(tmp_path))  # no rank packed
    assert ("already exists" if existing == "archive" else "not a shardfeed archive") in p.stderr
    assert not (tmp_path / "mpi.parts").exists()  # refused before any rank packed
    assert sorted(os.listdir(out)) == before


@needs_mpi
def test_a_killed_ranks_leftovers_do_not_block_the_next_run(tmp_path):
    # What a rank killed mid-pack leaves: its lock file (the flock died with it) and its partial
    # directory; another rank's finished part. The next run packs, merges and cleans up.
    parts = tmp_path / "mpi.parts"
    run("pack", GOOD, tmp_path / "mpi", "--part", "0/2", "-q", check=0)
    (parts / "part-00001-of-00002.lock").write_bytes(b"")
    partial = parts / "part-00001-of-00002.partial"
    partial.mkdir()
    (partial / ".shardfeed-partial").write_text("")
    (partial / "shard-00000.mdb").write_bytes(b"half")
    p = mpirun_pack(GOOD, tmp_path / "mpi", "-q")
    assert p.returncode == 0, p.stderr
    assert not parts.exists(), os.listdir(parts)
    run("verify", tmp_path / "mpi", check=0)


def test_a_held_lock_says_how_to_find_its_owner(tmp_path):
    import fcntl
    lock = tmp_path / "a.lock"
    with open(lock, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        p = run("pack", GOOD, tmp_path / "a", "-q")
    assert p.returncode != 0 and "fuser" in p.stderr and "running process" in p.stderr, p.stderr
    assert lock.exists()  # not ours: it was held
    run("pack", GOOD, tmp_path / "a", "-q", check=0)
    assert not lock.exists()  # released by its owner: the next writer removes it
