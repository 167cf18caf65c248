"""pack --encoding jpeg --size N (issue 13): a resolution cap at pack time. Images over the cap
are decoded upright, resized and re-encoded once; every other image keeps its bytes; labels and
order are those of the uncapped pack; the manifest and inspect say how many were re-encoded."""
import os
import subprocess

import numpy as np
import pytest
from PIL import Image

import shardfeed

DATA = os.environ.get("SHARDFEED_TEST_DATA", "")
GOOD = os.path.join(DATA, "good")


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("cap") / "orig")
    assert shardfeed.pack(GOOD, out, workers=2, encoding="jpeg")["packed"] == 36
    return shardfeed.Archive(out)


def resized_reference(image, shape):
    """The uncapped upright image resized to `shape` by Pillow (the expected content)."""
    return np.asarray(Image.fromarray(image).resize((shape[1], shape[0]), Image.BILINEAR),
                      np.float32)


@pytest.mark.parametrize("size,max_side", [(100, False), (150, True)])
def test_capped_pack_keeps_labels_order_and_small_files_bytes(original, tmp_path, size,
                                                              max_side):
    out = str(tmp_path / "capped")
    report = shardfeed.pack(GOOD, out, size=size, max_side=max_side, workers=2)
    assert report["packed"] == 36
    capped = shardfeed.Archive(out)
    assert len(capped) == len(original)
    assert list(capped.labels()) == list(original.labels())
    resized = 0
    for i in range(len(original)):
        img_o, label_o = original[i]
        img_c, label_c = capped[i]
        assert label_c == label_o
        h, w = img_o.shape[:2]
        side = max(h, w) if max_side else min(h, w)
        if side <= size:
            # Not over the cap: the record is byte for byte the uncapped pack's (the source
            # file itself for JPEG sources).
            assert bytes(capped.record(i)) == bytes(original.record(i)), i
            continue
        resized += 1
        hc, wc = img_c.shape[:2]
        assert (max(hc, wc) if max_side else min(hc, wc)) == size, (i, img_o.shape, img_c.shape)
        # Aspect kept (within the rounding of one pixel), orientation applied: a transposed
        # image would swap the sides.
        assert abs(hc / wc - h / w) < 2.0 / min(hc, wc), (img_o.shape, img_c.shape)
        ref = resized_reference(img_o, img_c.shape)
        mae = np.abs(img_c.astype(np.float32) - ref).mean()
        assert mae < 6.0, (i, mae)
    assert resized > 0
    assert report["resized"] == resized
    info = shardfeed.inspect(out)
    assert info["resized_records"] == resized


def test_uncapped_and_raw_archives_record_no_resized_count(original):
    assert shardfeed.inspect(original.path)["resized_records"] is None


def test_cli_pack_size_cap_and_inspect(tmp_path):
    cli = os.environ.get("SHARDFEED_CLI") or os.path.join(os.path.dirname(shardfeed.__file__),
                                                          "..", "..", "shardfeed")
    out = tmp_path / "a"
    p = subprocess.run([cli, "pack", GOOD, str(out), "--size", "100"], capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr
    assert "resized to a short side of 100" in p.stdout
    text = subprocess.run([cli, "inspect", str(out)], capture_output=True, text=True).stdout
    assert "resized:" in text and "short side over 100 px" in text
    bad = subprocess.run([cli, "pack", GOOD, str(tmp_path / "b"), "--max-side"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--max-side" in bad.stderr
    crop = subprocess.run([cli, "pack", GOOD, str(tmp_path / "c"), "--size", "100", "--crop",
                           "center"], capture_output=True, text=True)
    assert crop.returncode == 2 and "raw and zstd" in crop.stderr
