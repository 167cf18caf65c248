"""pack/convert --jpeg-layout indexed as a user runs them: the records decode to the source
files' pixels (through extract + Pillow, not our decoder) and verify --decode passes. (An index
that disagrees with its bitstream: tests/codec/jpeg_index_test.cpp.)"""
import json
import os

import numpy as np
import pytest
from PIL import Image

from test_cli import CLI, GOOD, run  # noqa: F401


def pixels(path):
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def extracted(archive, out):
    run("extract", archive, out, check=0)
    return sorted(p for p in out.rglob("*") if p.is_file())


@pytest.mark.parametrize("how", ["pack", "convert"])
def test_indexed_layout_keeps_every_pixel(tmp_path, how):
    original, indexed = tmp_path / "orig", tmp_path / "idx"
    run("pack", GOOD, original, check=0)
    if how == "pack":
        run("pack", GOOD, indexed, "--jpeg-layout", "indexed", check=0)
    else:
        run("convert", original, indexed, "--jpeg-layout", "indexed", check=0)
    v = json.loads(run("verify", indexed, "--decode", "--json", check=0).stdout)
    assert v["ok"] and v["checked"] == 36
    info = json.loads((indexed / "manifest.json").read_text())
    assert info["options"]["jpeg_layout"] == "indexed"
    a, b = extracted(original, tmp_path / "xa"), extracted(indexed, tmp_path / "xb")
    assert len(a) == len(b) == 36
    relaid = 0
    for x, y in zip(a, b):
        relaid += x.read_bytes() != y.read_bytes()
        assert np.array_equal(pixels(x), pixels(y)), (x, y)
    # Every JPEG record's bytes changed (restart markers, baseline, optimal tables); the other
    # inputs are lossless pixel records under the default encoding (auto) and stay as they were.
    jpegs = sum(x.read_bytes()[:3] == b"\xff\xd8\xff" for x in a)  # by content: names keep the source's
    assert jpegs >= 12 and relaid == jpegs, (jpegs, relaid)


def test_convert_refuses_an_unknown_layout(tmp_path):
    run("pack", GOOD, tmp_path / "a", check=0)
    p = run("convert", tmp_path / "a", tmp_path / "b", "--jpeg-layout", "zigzag")
    assert p.returncode == 2 and "jpeg-layout" in p.stderr
