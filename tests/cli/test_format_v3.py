"""Format version 3 (docs/FORMAT.md, "Versions"): an archive whose records all decode to one
shape records it, whatever options made it (issue 20, item 2), so crop "none" gives whole,
undistorted batches of same-size JPEGs; merge and convert keep the shape."""
import json
import os
import subprocess

import pytest
from PIL import Image

CLI = os.environ.get("SHARDFEED_CLI", "shardfeed")
# The Python module is built only in builds with SHARDFEED_PYTHON (not the sanitizer builds).
_p = os.environ.get("SHARDFEED_PYTHONPATH", "")
PYTHONPATH = _p if os.path.isdir(os.path.join(_p, "shardfeed")) else ""


def run(*args, check=None):
    p = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=120)
    if check is not None:
        assert p.returncode == check, (p.returncode, p.stdout, p.stderr)
    return p


def shape_of(archive):
    return json.loads((archive / "manifest.json").read_text())["shape"]


@pytest.fixture
def same_size_jpegs(tmp_path):
    """Two classes of 500x375 JPEGs; one is stored 375x500 with EXIF orientation 6 (upright it
    is 500x375 like the others)."""
    src = tmp_path / "src"
    for c, name in enumerate(["a", "b"]):
        (src / name).mkdir(parents=True)
        for k in range(3):
            rotated = c == 1 and k == 2
            img = Image.new("RGB", (375, 500) if rotated else (500, 375), (40 * k, 90 * c, 7))
            exif = None
            if rotated:
                exif = Image.Exif()
                exif[0x0112] = 6
            kwargs = {"exif": exif} if exif else {}
            img.save(src / name / f"{k}.jpg", quality=90, **kwargs)
    return src


def load_whole_batches(archive):
    code = ("import sys, shardfeed\n"
            "shapes = set()\n"
            "for images, labels in shardfeed.Loader(sys.argv[1], batch_size=3, crop='none',"
            " workers=1):\n"
            "    shapes.add(tuple(images.shape))\n"
            "print(sorted(shapes))\n")
    p = subprocess.run(["/usr/bin/python3", "-c", code, str(archive)], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=PYTHONPATH), timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


@pytest.mark.parametrize("backend", ["lmdb", "hdf5"])
def test_same_size_jpegs_make_a_fixed_shape_archive(tmp_path, same_size_jpegs, backend):
    a = tmp_path / "a"
    run("pack", same_size_jpegs, a, "--backend", backend, "--encoding", "jpeg", "-q", check=0)
    m = json.loads((a / "manifest.json").read_text())
    assert m["format_version"] >= 3  # version 3 features, kept by every later version
    assert m["shape"] == [375, 500, 3]  # upright: the EXIF-rotated file counts as 500x375
    info = json.loads(run("inspect", a, "--json", check=0).stdout)
    assert info["shape"] == [375, 500, 3]
    run("verify", a, check=0)
    if PYTHONPATH:
        assert load_whole_batches(a) == "[(3, 375, 500, 3)]"


def test_merge_and_convert_keep_the_shape(tmp_path, same_size_jpegs):
    for i in range(2):
        run("pack", same_size_jpegs, tmp_path / "m", "--part", f"{i}/2", "-q", check=0)
    run("merge", tmp_path / "m.parts", tmp_path / "m", check=0)
    assert shape_of(tmp_path / "m") == [375, 500, 3]
    run("convert", tmp_path / "m", tmp_path / "c", "--backend", "hdf5", check=0)
    assert shape_of(tmp_path / "c") == [375, 500, 3]
    run("verify", tmp_path / "c", check=0)


def test_different_sizes_stay_variable(tmp_path, same_size_jpegs):
    Image.new("RGB", (64, 48)).save(same_size_jpegs / "a" / "small.jpg")
    run("pack", same_size_jpegs, tmp_path / "a", "-q", check=0)
    assert shape_of(tmp_path / "a") is None
    # Parts with different shapes of their own merge into a variable-shape archive.
    for i in range(2):
        run("pack", same_size_jpegs, tmp_path / "m", "--part", f"{i}/2", "-q", check=0)
    run("merge", tmp_path / "m.parts", tmp_path / "m", check=0)
    assert shape_of(tmp_path / "m") is None


# ---- encoding auto: lossless inputs stay lossless (issue 20, item 3) -----------------------

def read_archive(archive, code_body):
    code = ("import sys, json, hashlib, numpy as np, shardfeed\n"
            "a = shardfeed.Archive(sys.argv[1])\n" + code_body)
    p = subprocess.run(["/usr/bin/python3", "-c", code, str(archive)], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=PYTHONPATH), timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


needs_python = pytest.mark.skipif(not PYTHONPATH, reason="needs the shardfeed Python module")


@needs_python
def test_pngs_packed_with_defaults_read_back_pixel_for_pixel(tmp_path):
    import numpy as np
    src = tmp_path / "src"
    files = []
    for c, name in enumerate(["a", "b"]):
        (src / name).mkdir(parents=True)
        for k in range(3):
            w, h = 17 + 5 * k, 11 + 3 * c
            img = Image.new("RGB", (w, h))
            img.putdata([((x * 37 + k) % 256, (y * 91 + c) % 256, (x * y) % 256)
                         for y in range(h) for x in range(w)])
            img.save(src / name / f"{k}.png")
            files.append(src / name / f"{k}.png")
    run("pack", src, tmp_path / "a", "--report", tmp_path / "r.json", check=0)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["reencoded"] == 6, report
    m = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert m["encoding"] == "auto" and m["reencoded_records"] == 6
    got = read_archive(tmp_path / "a", "print(json.dumps([a[i][0].tolist() for i in range(len(a))]))")
    for i, f in enumerate(files):
        want = np.asarray(Image.open(f).convert("RGB"))
        assert np.array_equal(np.asarray(got[i], dtype=np.uint8), want), f
    run("verify", tmp_path / "a", "--decode", check=0)


@needs_python
@pytest.mark.parametrize("backend", ["lmdb", "hdf5"])
def test_a_mixed_folder_keeps_jpeg_bytes_and_stores_the_rest_lossless(tmp_path, backend):
    import hashlib
    src = tmp_path / "src"
    (src / "x").mkdir(parents=True)
    Image.new("RGB", (30, 20), (200, 10, 60)).save(src / "x" / "0.jpg", quality=85)
    Image.new("RGBA", (12, 9), (1, 2, 3, 255)).save(src / "x" / "1.png")
    Image.new("RGB", (7, 5), (9, 8, 7)).save(src / "x" / "2.bmp")
    run("pack", src, tmp_path / "a", "--backend", backend, "-q", check=0)
    got = read_archive(tmp_path / "a", (
        "print(json.dumps({'encoding': a.encoding, 'records': "
        "[hashlib.sha256(bytes(a.record(i))).hexdigest() for i in range(len(a))], "
        "'pixels': [a[i][0].tolist() for i in range(len(a))]}))"))
    assert got["encoding"] == "auto"
    assert got["records"][0] == hashlib.sha256((src / "x" / "0.jpg").read_bytes()).hexdigest()
    import numpy as np
    for i, name in [(1, "1.png"), (2, "2.bmp")]:
        want = np.asarray(Image.open(src / "x" / name).convert("RGB"))
        assert np.array_equal(np.asarray(got["pixels"][i], dtype=np.uint8), want), name
    m = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert m["reencoded_records"] == 2
    run("verify", tmp_path / "a", "--decode", check=0)
    # convert and merge keep per-record encodings
    run("convert", tmp_path / "a", tmp_path / "c",
        "--backend", "hdf5" if backend == "lmdb" else "lmdb", check=0)
    run("verify", tmp_path / "c", "--decode", check=0)


def test_encoding_jpeg_counts_its_lossy_reencodes(tmp_path):
    src = tmp_path / "src"
    (src / "x").mkdir(parents=True)
    Image.new("RGB", (30, 20)).save(src / "x" / "0.jpg")
    Image.new("RGB", (12, 9)).save(src / "x" / "1.png")
    run("pack", src, tmp_path / "a", "--encoding", "jpeg", "--report", tmp_path / "r.json",
        check=0)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["reencoded"] == 1
    assert json.loads((tmp_path / "a" / "manifest.json").read_text())["reencoded_records"] == 1


def test_a_size_cap_with_the_default_encoding_packs_as_jpeg(tmp_path):
    src = tmp_path / "src"
    (src / "x").mkdir(parents=True)
    Image.new("RGB", (30, 20)).save(src / "x" / "0.png")
    run("pack", src, tmp_path / "a", "--size", "8", check=0)
    m = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert m["encoding"] == "jpeg" and m["resized_records"] == 1
    p = run("pack", src, tmp_path / "b", "--crop", "center", "--size", "8")
    assert p.returncode == 2 and "crop" in p.stderr, p.stderr
