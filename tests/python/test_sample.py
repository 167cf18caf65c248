"""Archive.schema and Archive.sample(): archives of earlier versions read as image + label (plus
what the folder pack stores), and boxes and masks turn with a JPEG's EXIF orientation so they
always match the upright image sample() returns."""
import io

import numpy as np
import pytest
from PIL import Image

import shardfeed


def test_folder_archive_sample_matches_getitem(archive_path):
    a = shardfeed.Archive(archive_path)
    schema = a.schema
    assert list(schema)[:2] == ["image", "label"]
    assert schema["image"] == "image" and schema["label"] == "int64"
    for i in (0, 7, len(a) - 1, -1):
        s = a.sample(i)
        image, label = a[i]
        assert list(s) == list(schema)
        assert np.array_equal(s["image"], image) and s["label"] == label
    with pytest.raises(IndexError):
        a.sample(len(a))


def test_every_accessor_takes_the_same_indices_and_says_what_is_wrong(archive_path):
    # Found by a stranger's test: record(-1) and a[1:3], a[2.0] gave pybind's raw
    # "incompatible function arguments" TypeError, while a[-1] and sample(-1) worked.
    a = shardfeed.Archive(archive_path)
    n = len(a)
    assert bytes(a.record(-1)) == bytes(a.record(n - 1))
    assert bytes(a.record(np.int64(2))) == bytes(a.record(2))
    for accessor in (a.record, a.sample, a.__getitem__):
        with pytest.raises(IndexError, match="out of range: the archive has %d samples" % n):
            accessor(n)
        with pytest.raises(IndexError):
            accessor(-n - 1)
        for bad in (2.0, slice(1, 3), "1"):
            with pytest.raises(TypeError, match="archive indices must be integers, not"):
                accessor(bad)


# Each EXIF orientation as a numpy transform of a stored (H, W) array (the moves of
# imaging::ApplyOrientation).
TURN = {
    1: lambda m: m,
    2: lambda m: m[:, ::-1],
    3: lambda m: m[::-1, ::-1],
    4: lambda m: m[::-1, :],
    5: lambda m: m.T,
    6: lambda m: np.rot90(m, -1),
    7: lambda m: m[::-1, ::-1].T,
    8: lambda m: np.rot90(m, 1),
}


def oriented_jpeg(pixels, orientation):
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=100, subsampling=0, exif=exif.tobytes())
    return buf.getvalue()


def test_boxes_and_masks_turn_with_the_exif_orientation(tmp_path):
    h, w = 32, 48
    y0, y1, x0, x1 = 4, 12, 8, 20  # a bright rectangle, in the stored pixels
    pixels = np.zeros((h, w, 3), np.uint8)
    pixels[y0:y1, x0:x1] = 255
    mask = np.zeros((h, w), np.uint8)
    mask[y0:y1, x0:x1] = 1
    schema = {"image": "image", "boxes": "boxes", "mask": "mask"}
    out = str(tmp_path / "a")
    with shardfeed.Writer(out, schema=schema) as wr:
        for k in range(1, 9):
            wr.write({"image": oriented_jpeg(pixels, k), "boxes": [[x0, y0, x1, y1]], "mask": mask})
    a = shardfeed.Archive(out)
    for k in range(1, 9):
        s = a.sample(k - 1)
        image, m, box = s["image"], s["mask"], s["boxes"]
        assert image.shape[:2] == m.shape == TURN[k](mask).shape, k
        assert np.array_equal(m, TURN[k](mask)), k
        # The box encloses exactly the mask's ones (edges: pixel ys, xs and one past the last).
        ys, xs = np.nonzero(m)
        assert box.tolist() == [[xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]], k
        # And the upright image's bright pixels are the mask's (JPEG at quality 100: IoU >= 0.95).
        bright = image.mean(axis=2) > 128
        iou = (bright & (m > 0)).sum() / (bright | (m > 0)).sum()
        assert iou >= 0.95, (k, iou)


def test_sample_of_a_fixed_field_archive_without_var_fields(tmp_path):
    out = str(tmp_path / "a")
    with shardfeed.Writer(out, schema={"image": "image", "label": "int64", "x": "float64",
                                       "v": "int32[3]"}) as wr:
        for i in range(5):
            wr.write({"image": np.full((3, 4, 3), i, np.uint8), "label": i, "x": i / 3,
                      "v": np.array([i, -i, 7], np.int32)})
    a = shardfeed.Archive(out)
    assert a.schema == {"image": "image", "label": "int64", "x": "float64", "v": "int32[3]"}
    for i in range(5):
        s = a.sample(i)
        assert s["label"] == i and s["x"] == i / 3 and s["v"].tolist() == [i, -i, 7]
        assert s["v"].dtype == np.int32 and s["image"][0, 0, 0] == i
