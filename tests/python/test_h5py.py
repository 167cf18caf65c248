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


def _xxh3_64(data):
    """XXH3-64 (seed 0) through the libxxhash the project links."""
    import ctypes
    import ctypes.util
    lib = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
    lib.XXH3_64bits.restype = ctypes.c_uint64
    lib.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return lib.XXH3_64bits(data, len(data))


def _problems(path):
    report = shardfeed.verify(path)
    return None if report["ok"] else json.dumps(report)


@pytest.mark.parametrize("damage", ["labels", "shapes", "record_offsets", "record_sizes",
                                    "format", "format_version"])
def test_verify_checks_what_h5py_users_read(tmp_path, damage):
    # REGRESSION (found by a stranger's test): /labels, /shapes, /record_offsets, /record_sizes
    # and the root attributes were outside every check: a flipped label passed verify, and h5py
    # then read another class than shardfeed.
    out = tmp_path / "h"
    shardfeed.pack(GOOD, out, backend="hdf5", encoding="jpeg")
    assert _problems(out) is None
    with h5py.File(out / "shard-00000.h5", "r+") as f:
        if damage in ("format", "format_version"):
            f.attrs[damage] = "nope" if damage == "format" else np.uint64(99)
        else:
            d = f[damage]
            value = d[1]
            d[1] = value + 1
    problems = _problems(out)
    assert problems is not None
    named = {"format": "attribute format", "format_version": "attribute format_version"}
    assert named.get(damage, "/%s disagrees with the index at sample 1" % damage) in problems


def test_convert_and_extract_refuse_an_index_verify_refuses(tmp_path):
    # REGRESSION (found by a stranger's test): index entry 1 made a copy of entry 0 (checksums
    # and hashes recomputed, as a crafted archive would): verify refused it, and convert wrote it
    # with fresh checksums that verify then passed (sample 1's image lost, sample 0's in its
    # place); extract wrote it out for a fresh pack.
    out = tmp_path / "h"
    with shardfeed.Writer(out, schema={"image": "image", "label": "int64", "cap": "str"},
                          backend="hdf5") as w:
        for k in range(4):
            w.write({"image": np.full((8 + k, 8, 3), 40 * k, np.uint8), "label": 0,
                     "cap": "caption %d" % k})
    shard = out / "shard-00000.h5"
    with h5py.File(shard, "r+") as f:
        index = bytearray(f["shardfeed/index"][()])
        index[32:64] = index[0:32]
        header = bytearray(f["shardfeed/header"][()])
        fields = bytes(f["shardfeed/fields"][()]) if "shardfeed/fields" in f else b""
        chunk = int(f.attrs["chunk_bytes"])
        records = f["records"][()].tobytes()
        stream, at = b"", 0
        for size in f["shardfeed/chunk_sizes"][()]:
            stream += records[at:at + int(size)]
            at += (int(size) + chunk - 1) // chunk * chunk
        content = _xxh3_64(stream + bytes(index) + fields)
        header[40:48] = _xxh3_64(bytes(index)).to_bytes(8, "little")
        header[48:56] = content.to_bytes(8, "little")
        f["shardfeed/index"][...] = np.frombuffer(bytes(index), np.uint8)
        f["shardfeed/header"][...] = np.frombuffer(bytes(header), np.uint8)
    m = json.loads((out / "manifest.json").read_text())
    m["shards"][0]["xxh3"] = "%016x" % content
    m.pop("manifest_xxh3")
    canonical = json.dumps(m, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    m["manifest_xxh3"] = "%016x" % _xxh3_64(canonical.encode())
    (out / "manifest.json").write_text(json.dumps(m))
    refused = "disagrees with the index at sample 1"  # /shapes (the var blob check comes after)
    assert refused in _problems(out)
    with pytest.raises(shardfeed.DataError, match=refused):
        shardfeed.convert(out, tmp_path / "c", backend="lmdb")
    import subprocess
    p = subprocess.run([os.environ.get("SHARDFEED_CLI", "shardfeed"), "extract", str(out),
                        str(tmp_path / "x")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 3 and refused in p.stderr, (p.returncode, p.stderr)
    assert not (tmp_path / "c").exists() and not (tmp_path / "x").exists()
