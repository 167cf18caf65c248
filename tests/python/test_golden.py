"""Golden archives (tests/format/golden/vN, written once by the build that introduced format
version N; scripts/make_golden.py): every build must read every version it supports identically,
through the Archive API, the Loader and `verify`. A matching mistake in writer and reader cannot
pass here, since these files were not written by the build under test."""
import hashlib
import json
import os
import shutil

import numpy as np
import pytest

import shardfeed

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "format", "golden")
CASES = [(v, name) for v in sorted(os.listdir(GOLDEN))
         for name in sorted(json.load(open(os.path.join(GOLDEN, v, "expected.json"))))]


@pytest.mark.parametrize("version,name", CASES)
def test_golden_archive_reads_identically(version, name, tmp_path):
    expected = json.load(open(os.path.join(GOLDEN, version, "expected.json")))[name]
    path = tmp_path / name  # a copy: nothing may write into the committed files
    shutil.copytree(os.path.join(GOLDEN, version, name), path)
    a = shardfeed.Archive(str(path))
    assert a.class_names == expected["class_names"]
    assert a.encoding == expected["encoding"]
    assert len(a) == len(expected["samples"])
    for i, want in enumerate(expected["samples"]):
        image, label = a[i]
        assert label == want["label"]
        assert list(image.shape) == want["shape"]
        assert hashlib.sha256(bytes(a.record(i))).hexdigest() == want["record_sha256"]
        got = hashlib.sha256(np.ascontiguousarray(image).tobytes()).hexdigest()
        assert got == want["pixels_sha256"], (name, i)
    report = shardfeed.verify(str(path), decode=True)
    assert report["ok"], report
    loader = shardfeed.Loader(str(path), batch_size=4, crop="center", size=8)
    labels = sorted(int(l) for b in loader for l in b.labels)
    assert labels == sorted(s["label"] for s in expected["samples"])


def test_the_golden_versions_cover_every_readable_version():
    versions = sorted(int(v[1:]) for v in os.listdir(GOLDEN))
    newest = os.path.join(GOLDEN, "v%d" % versions[-1])
    name = sorted(json.load(open(os.path.join(newest, "expected.json"))))[0]
    info = shardfeed.inspect(os.path.join(newest, name))
    assert versions == list(range(1, info["format_version"] + 1))


# Element types of expected.json's field types (numpy's names, as in the schema).
def _dtype(type_name):
    if type_name in ("int64", "float32", "float64"):
        return np.dtype(type_name)
    if type_name == "boxes":
        return np.dtype("float32")
    if type_name == "mask":
        return np.dtype("uint8")
    return np.dtype(type_name.split("[")[0])


def _matches(value, type_name, want):
    """A field's value as Archive.sample gives it against expected.json's dims and bytes."""
    raw = bytes.fromhex(want["hex"])
    if type_name in ("str", "json", "bytes"):
        if isinstance(value, str):
            return value.encode() == raw
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value) == raw
        return type_name == "json" and value == json.loads(raw)  # parsed JSON
    got = np.asarray(value)
    return (list(got.shape) == want["dims"] and got.dtype == _dtype(type_name)
            and np.ascontiguousarray(got).tobytes() == raw)


FIELD_CASES = [(v, name) for v, name in CASES
               if "values" in json.load(open(os.path.join(GOLDEN, v, "expected.json")))[name]]


@pytest.mark.parametrize("version,name", FIELD_CASES)
def test_golden_fields_read_identically(version, name, tmp_path):
    """Version 4: every field of every sample, bit-exact (the C++ side reads the same values in
    tests/format/fields_golden_test.cpp)."""
    if not hasattr(shardfeed.Archive, "sample"):
        pytest.skip("this build's Python module has no Archive.sample (typed fields) yet")
    expected = json.load(open(os.path.join(GOLDEN, version, "expected.json")))[name]
    path = tmp_path / name
    shutil.copytree(os.path.join(GOLDEN, version, name), path)
    a = shardfeed.Archive(str(path))
    types = {f["name"]: f["type"] for f in expected["fields"]}
    for i, want in enumerate(expected["values"]):
        sample = a.sample(i)
        for field, value in want.items():
            assert _matches(sample[field], types[field], value), (name, i, field)
