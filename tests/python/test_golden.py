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
    info = shardfeed.inspect(os.path.join(GOLDEN, "v%d" % versions[-1], "lmdb-jpeg"))
    assert versions == list(range(1, info["format_version"] + 1))
