"""HDF5 archives are standard files: h5py (Debian's python3-h5py) reads them without shardfeed."""
import json
import os

import h5py
import numpy as np
import pytest

import shardfeed

DATA = os.environ.get("SHARDFEED_TEST_DATA", "")
GOOD = os.path.join(DATA, "good")
PLUGIN = os.environ.get("SHARDFEED_HDF5_PLUGIN_DIR", "")


def test_jpeg_archive_datasets_and_bytes(tmp_path):
    out = tmp_path / "h"
    shardfeed.pack(GOOD, out, backend="hdf5", encoding="jpeg")
    archive = shardfeed.Archive(out)
    with h5py.File(out / "shard-00000.h5", "r") as f:
        for name in ("records", "record_offsets", "record_sizes", "labels", "shapes",
                     "shardfeed/header", "shardfeed/index", "shardfeed/chunk_sizes"):
            assert name in f, name
        assert f.attrs["format"] in (b"shardfeed", "shardfeed")
        assert int(f.attrs["format_version"]) == 4
        manifest = json.loads(f.attrs["manifest"])
        assert manifest["sample_count"] == 36 and manifest["backend"] == "hdf5"
        assert f["records"].chunks is not None  # chunked
        labels = f["labels"][:]
        assert list(labels) == list(archive.labels())
        for i in range(36):
            o, s = int(f["record_offsets"][i]), int(f["record_sizes"][i])
            stored = f["records"][o:o + s].tobytes()
            assert stored == bytes(archive.record(i))
            assert stored[:2] == b"\xff\xd8"
        # The first record is the first file of the first class, byte for byte.
        with open(os.path.join(GOOD, "cat", "cat_000.jpg"), "rb") as src:
            o, s = int(f["record_offsets"][0]), int(f["record_sizes"][0])
            assert f["records"][o:o + s].tobytes() == src.read()


def test_fixed_shape_raw_archive_is_an_nhwc_array(tmp_path):
    out = tmp_path / "r"
    shardfeed.pack(GOOD, out, backend="hdf5", encoding="raw", size=32, crop="center")
    archive = shardfeed.Archive(out)
    with h5py.File(out / "shard-00000.h5", "r") as f:
        images = f["images"]
        assert images.shape == (36, 32, 32, 3) and images.dtype == np.uint8
        assert images.chunks == (1, 32, 32, 3)
        for i in (0, 17, 35):
            assert np.array_equal(images[i], archive[i][0])


@pytest.mark.skipif(not PLUGIN, reason="plugin folder not given")
def test_zstd_images_read_through_the_filter_plugin(tmp_path):
    out = tmp_path / "z"
    shardfeed.pack(GOOD, out, backend="hdf5", encoding="zstd", size=24, crop="center")
    archive = shardfeed.Archive(out)
    with h5py.File(out / "shard-00000.h5", "r") as f:
        images = f["images"]
        assert 32015 in images._filters or "32015" in images._filters
        for i in (0, 20):
            assert np.array_equal(images[i], archive[i][0])


def test_convert_between_backends(tmp_path):
    lmdb = tmp_path / "l"
    shardfeed.pack(GOOD, lmdb)
    h5 = tmp_path / "h"
    shardfeed.convert(lmdb, h5, backend="hdf5")
    back = tmp_path / "b"
    shardfeed.convert(h5, back, backend="lmdb")
    a, b, c = shardfeed.Archive(lmdb), shardfeed.Archive(h5), shardfeed.Archive(back)
    for i in range(36):
        assert bytes(a.record(i)) == bytes(b.record(i)) == bytes(c.record(i))
    assert shardfeed.inspect(h5)["backend"] == "hdf5"
    assert shardfeed.verify(h5, decode=True)["ok"]
    # As `shardfeed convert`: the other backend by default, and jpeg_layout (it had neither).
    assert shardfeed.convert(lmdb, tmp_path / "d") == 36
    assert shardfeed.inspect(tmp_path / "d")["backend"] == "hdf5"
    assert shardfeed.convert(lmdb, tmp_path / "i", jpeg_layout="indexed") == 36
    assert shardfeed.inspect(tmp_path / "i")["backend"] == "lmdb"  # a re-layout keeps its own
    assert shardfeed.verify(tmp_path / "i", decode=True)["ok"]
    with pytest.raises(ValueError, match="jpeg_layout \\(--jpeg-layout\\) must be original"):
        shardfeed.convert(lmdb, tmp_path / "x", jpeg_layout="fancy")
    with pytest.raises(ValueError, match="backend \\(--backend\\) must be lmdb or hdf5"):
        shardfeed.convert(lmdb, tmp_path / "x", backend="tar")
