"""shardfeed.Writer and pack_iterable: every field type written from Python reads back equal
through Archive.sample() (LMDB and HDF5), atomicity, overwrite rules, bad samples named by
number and field, skip_bad, order across producer processes."""
import io
import json
import multiprocessing
import os
import pathlib
import threading
import time

import numpy as np
import pytest
from PIL import Image

import shardfeed

SCHEMA = {
    "image": "image",
    "label": "int64",
    "boxes": "boxes",
    "box_labels": {"type": "int64[*]", "per": "boxes"},
    "mask": "mask",
    "caption": "str",
    "raw": "bytes",
    "meta": "json",
    "embedding": "float32[8]",
    "tags": "int64[*]",
    "score": "float32",
    "weight": "float64",
    "count": "int64",
    "grid": "uint8[*,*]",
    "half": "float16[2,3]",
    "points": "int32[*,2]",
    "cube": "float64[2,*,2]",
}


def jpeg_bytes(h, w, seed):
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def make_sample(i, tmp_path=None):
    """Sample i: the image as pixels (even i), JPEG bytes (i % 4 == 1) or a JPEG file path."""
    rng = np.random.default_rng(1000 + i)
    h, w = 16 + i, 24 + 2 * i
    if i % 2 == 0:
        image = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
    elif i % 4 == 1 or tmp_path is None:
        image = jpeg_bytes(h, w, i)
    else:
        image = tmp_path / ("img%d.jpg" % i)
        image.write_bytes(jpeg_bytes(h, w, i))
    n = i % 4  # 0..3 boxes
    boxes = rng.uniform(0, 10, (n, 4)).astype(np.float32)
    boxes[:, 2:] += boxes[:, :2]
    return {
        "image": image,
        "label": i % 3,
        "boxes": boxes,
        "box_labels": rng.integers(0, 80, n),
        "mask": rng.integers(0, 4, (h, w), dtype=np.uint8),
        "caption": "sample %d: ünïcode ✓" % i,
        "raw": bytes(rng.integers(0, 256, i * 3, dtype=np.uint8)),
        "meta": {"i": i, "name": "s%d" % i, "list": [1, 2.5, None], "nested": {"ok": i % 2 == 0}},
        "embedding": rng.standard_normal(8).astype(np.float32),
        "tags": list(range(i % 5)),  # a Python list
        "score": 0.1 * i,
        "weight": np.float64(1.0 / (i + 1)),
        "count": -(i ** 5) - 3,
        "grid": rng.integers(0, 255, (i % 3 + 1, 2), dtype=np.uint8),
        "half": rng.standard_normal((2, 3)).astype(np.float16),
        "points": rng.integers(-100, 100, (i, 2)).astype(np.int32),
        "cube": rng.standard_normal((2, i % 3, 2)),
    }


ARRAYS = {"boxes": np.float32, "box_labels": np.int64, "mask": np.uint8, "embedding": np.float32,
          "grid": np.uint8, "half": np.float16, "points": np.int32, "cube": np.float64}


def check_equal(got, want, i):
    """A read sample against the written one, field by field (arrays bit-exact)."""
    assert list(got) == list(SCHEMA), i
    image = got["image"]
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    if isinstance(want["image"], np.ndarray):  # stored lossless (auto: zstd pixels)
        assert np.array_equal(image, want["image"]), i
    else:
        assert image.shape[:2] == want["mask"].shape
    assert got["label"] == want["label"] and type(got["label"]) is int
    for name, dtype in ARRAYS.items():
        w = np.asarray(want[name]).astype(dtype)
        assert got[name].dtype == dtype, (i, name)
        assert got[name].shape == w.shape, (i, name)
        assert got[name].tobytes() == w.tobytes(), (i, name)  # bit-exact
    assert np.array_equal(got["tags"], np.asarray(want["tags"], dtype=np.int64).reshape(-1))
    assert got["caption"] == want["caption"]
    assert got["raw"] == want["raw"]
    assert got["meta"] == want["meta"]
    assert got["score"] == np.float32(want["score"]) and type(got["score"]) is np.float32
    assert got["weight"] == float(want["weight"])
    assert got["count"] == want["count"]


@pytest.mark.parametrize("backend", ["lmdb", "hdf5"])
def test_every_field_type_round_trips(tmp_path, backend):
    out = str(tmp_path / "a")
    samples = [make_sample(i, tmp_path) for i in range(12)]
    with shardfeed.Writer(out, schema=SCHEMA, backend=backend, workers=2,
                          class_names=["cat", "dog", "eel"]) as w:
        assert w.write_many(samples) == 12
    assert w.report["packed"] == 12 and w.report["skipped"] == []
    a = shardfeed.Archive(out)
    assert len(a) == 12
    assert a.schema == SCHEMA
    assert a.class_names == ["cat", "dog", "eel"]
    for i, want in enumerate(samples):
        got = a.sample(i)
        check_equal(got, want, i)
        image, label = a[i]  # archive[i] stays (image, label)
        assert np.array_equal(image, got["image"]) and label == got["label"]
    assert shardfeed.verify(out, decode=True)["ok"]


def test_a_label_may_be_a_class_name(tmp_path):
    # A label given as one of class_names is its index (the Parquet importer's string labels
    # used to be looked up there alone); a name it does not list, or one without class_names,
    # is that sample's error.
    img = np.zeros((8, 8, 3), np.uint8)
    with shardfeed.Writer(tmp_path / "a", class_names=["cat", "dog"]) as w:
        w.write_many([{"image": img, "label": "dog"}, (img, "cat"), (img, 1)])
    assert [shardfeed.Archive(tmp_path / "a").sample(i)["label"] for i in range(3)] == [1, 0, 1]
    with pytest.raises(ValueError, match=r"sample 1: field 'label': label 'eel' is not one of "
                                         r"the 2 class_names"):
        with shardfeed.Writer(tmp_path / "b", class_names=["cat", "dog"]) as w:
            w.write_many([(img, "cat"), (img, "eel")])
    assert not (tmp_path / "b").exists()
    with pytest.raises(ValueError, match=r"label 'cat' is a class name, and the Writer has no "
                                         r"class_names"):
        with shardfeed.Writer(tmp_path / "c") as w:
            w.write((img, "cat"))


def test_a_damaged_caption_fails_sample_not_the_image(tmp_path):
    # archive[i] reads the image record alone (as Loader(fields=[]) does); it used to check the
    # var blob too and refuse the image for a damaged caption it does not return.
    img = np.zeros((8, 8, 3), np.uint8)
    with shardfeed.Writer(tmp_path / "a", schema={"image": "image", "cap": "str"}) as w:
        w.write_many([(img, "caption number %d" % k) for k in range(3)])
    shard = next(p for p in (tmp_path / "a").iterdir() if p.name.startswith("shard-"))
    data = bytearray(shard.read_bytes())
    at = data.find(b"caption number 1")
    data[at:at + 7] = b"CAPTION"
    shard.write_bytes(bytes(data))
    a = shardfeed.Archive(tmp_path / "a")
    image, label = a[1]
    assert np.array_equal(image, img) and label is None
    with pytest.raises(shardfeed.DataError, match=r"sample 1.*cap"):
        a.sample(1)


def test_arrays_are_read_only_views_that_keep_the_archive(tmp_path):
    # A chunk larger than an LMDB page is stored on pages of its own (aligned): the var blob in
    # it is 8-byte aligned, so its arrays are views. (Values inside a leaf page may not be
    # aligned; those come as copies.)
    out = str(tmp_path / "a")
    emb = np.arange(8, dtype=np.float32)
    noise = np.random.default_rng(0).integers(0, 255, (48, 48, 3), dtype=np.uint8)
    with shardfeed.Writer(out, schema={"image": "image", "e": "float32[8]", "v": "int64[*]"}) as w:
        w.write({"image": noise, "e": emb, "v": [5, 6, 7]})
    a = shardfeed.Archive(out)
    s = a.sample(0)
    del a
    for name in ("e", "v"):
        assert not s[name].flags.writeable
        with pytest.raises(ValueError):
            s[name][0] = 1
    assert np.array_equal(s["e"], emb) and s["v"].tolist() == [5, 6, 7]


def test_samples_as_tuples_pil_images_and_tensors(tmp_path):
    torch = pytest.importorskip("torch")
    out = str(tmp_path / "a")
    pixels = np.random.default_rng(0).integers(0, 255, (9, 7, 3), dtype=np.uint8)
    with shardfeed.Writer(out, schema={"image": "image", "label": "int64", "v": "float32[*]"}) as w:
        w.write((Image.fromarray(pixels), 1, torch.arange(3, dtype=torch.float32)))
        w.write({"image": torch.from_numpy(pixels), "label": np.int64(0), "v": torch.ones(2)})
        w.write({"image": pathlib.Path(_jpeg_file(tmp_path)), "label": 1, "v": []})
    a = shardfeed.Archive(out)
    assert np.array_equal(a.sample(0)["image"], pixels) and a.sample(0)["v"].tolist() == [0, 1, 2]
    assert np.array_equal(a.sample(1)["image"], pixels) and a.sample(1)["label"] == 0
    assert a.sample(2)["image"].shape == (12, 10, 3) and a.sample(2)["v"].shape == (0,)
    assert a.class_names == ["0", "1"]  # "0".."max label" without class_names


def _jpeg_file(tmp_path):
    p = tmp_path / "file.jpg"
    p.write_bytes(jpeg_bytes(12, 10, 7))
    return str(p)


def test_exception_in_the_block_leaves_nothing(tmp_path):
    out = tmp_path / "a"
    with pytest.raises(RuntimeError, match="boom"):
        with shardfeed.Writer(out) as w:
            w.write({"image": np.zeros((4, 4, 3), np.uint8), "label": 0})
            raise RuntimeError("boom")
    assert not out.exists()
    assert sorted(os.listdir(tmp_path)) in ([], ["a.lock"])  # no partial output left


def test_a_writer_that_never_finishes_removes_the_folders_it_made(tmp_path):
    (tmp_path / "keep").mkdir()
    out = tmp_path / "keep" / "typo" / "deep" / "x.sf"
    with pytest.raises(RuntimeError, match="boom"):
        with shardfeed.Writer(out) as w:
            assert (tmp_path / "keep" / "typo" / "deep").is_dir()
            raise RuntimeError("boom")
    assert os.listdir(tmp_path / "keep") == []  # its own folder stays, the ones made go
    with shardfeed.Writer(out) as w:  # a finished writer keeps them
        w.write({"image": np.zeros((4, 4, 3), np.uint8), "label": 0})
    assert len(shardfeed.Archive(out)) == 1


def _abort_in(folder, n, barrier):
    for i in range(n):
        barrier.wait()
        try:
            with shardfeed.Writer(os.path.join(folder, "n%d" % i, "sub", "a.sf")) as w:
                w.write((np.zeros((8, 8, 3), np.uint8), 0))
                raise KeyError("abort")
        except KeyError:
            pass


def test_a_writer_giving_up_never_takes_the_folder_from_under_another(tmp_path):
    """Two writers make the same new folder; the one that gives up removed it (while empty)
    before the other's lock file was in it: 88 of 1000 of the others failed with ENOENT."""
    ctx = multiprocessing.get_context("fork")
    barrier, n = ctx.Barrier(2, timeout=60), 800
    other = ctx.Process(target=_abort_in, args=(str(tmp_path), n, barrier))
    other.start()
    failed = []
    try:
        for i in range(n):
            barrier.wait()
            time.sleep((i % 40) * 0.0001)  # sweeps the window the other's abort falls in
            try:
                with shardfeed.Writer(tmp_path / ("n%d" % i) / "sub" / "b.sf") as w:
                    w.write((np.zeros((8, 8, 3), np.uint8), 0))
            except Exception as e:  # noqa: BLE001 - counted, reported below
                failed.append(repr(e))
    finally:
        other.join(timeout=120)
    assert other.exitcode == 0
    assert failed == []
    assert all(len(shardfeed.Archive(tmp_path / ("n%d" % i) / "sub" / "b.sf")) == 1
               for i in range(n))


def test_exception_keeps_the_old_archive(tmp_path):
    out = str(tmp_path / "a")
    with shardfeed.Writer(out) as w:
        w.write({"image": np.zeros((4, 4, 3), np.uint8), "label": 0})
    with pytest.raises(KeyError):
        with shardfeed.Writer(out, overwrite=True) as w:
            for _ in range(3):
                w.write({"image": np.ones((5, 5, 3), np.uint8), "label": 0})
            raise KeyError("stop")
    a = shardfeed.Archive(out)
    assert len(a) == 1 and a[0][0].shape == (4, 4, 3)


def test_overwrite_rules(tmp_path):
    out = str(tmp_path / "a")
    one = {"image": np.zeros((4, 4, 3), np.uint8), "label": 0}
    with shardfeed.Writer(out) as w:
        w.write(one)
    with pytest.raises(Exception, match="overwrite"):
        shardfeed.Writer(out)
    with shardfeed.Writer(out, overwrite=True) as w:
        w.write(one)
        w.write(one)
    assert len(shardfeed.Archive(out)) == 2
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("user data")
    with pytest.raises(Exception, match="archive"):
        shardfeed.Writer(str(mine), overwrite=True)
    assert (mine / "keep.txt").read_text() == "user data"


BAD = [
    ({"caption": None}, "caption", "str"),
    ({"boxes": [[1, 2, 3]]}, "boxes", "shape"),
    ({"box_labels": [1, 2, 3, 4, 5]}, "box_labels", "rows"),
    ({"embedding": np.zeros(8, np.float64)}, "embedding", "cast"),
    ({"embedding": np.zeros(7, np.float32)}, "embedding", "shape"),
    ({"grid": [[1, 300]]}, "grid", "range"),
    ({"label": 7}, "label", "outside"),
    ({"count": 1.5}, "count", "whole number"),
    ({"meta": {"x": object()}}, "meta", "JSON"),
    ({"extra": 1}, "extra", "not in the schema"),
    # A finite number that would be stored as inf (it was, silently).
    ({"score": 1e39}, "score", "outside float32's range"),
    ({"score": np.float64(-4e38)}, "score", "outside float32's range"),
    ({"score": 10 ** 400}, "score", "outside float32's range"),
    ({"weight": 10 ** 400}, "weight", "outside float64's range"),
    ({"weight": np.longdouble("1e400")}, "weight", "outside float64's range"),
    ({"score": __import__("decimal").Decimal("-1e400")}, "score", "outside float64's range"),
    ({"weight": __import__("fractions").Fraction(10 ** 400)}, "weight", "outside float64's range"),
    ({"half": [[1, 2, 3], [4, 5, 70000]]}, "half", "70000 is outside float16's range"),
    ({"embedding": [0, 0, 0, 0, 0, 0, 0, 1e300]}, "embedding", "outside float32's range"),
    # An integer a float field cannot hold exactly was rounded (the JSONL importer refused it).
    ({"score": 2 ** 24 + 1}, "score", "integer 16777217 is not exact as float32"),
    ({"weight": 2 ** 53 + 1}, "weight", "integer 9007199254740993 is not exact as float64"),
    ({"weight": np.int64(2 ** 53 + 1)}, "weight", "not exact as float64"),
    ({"half": [[1, 2, 3], [4, 5, 2049]]}, "half", "integer 2049 is not exact as float16"),
    ({"cube": np.full((2, 1, 2), 2 ** 53 + 1, np.int64)}, "cube", "not exact as float64"),
    ({"embedding": [0, 0, 0, 0, 0, 0, 0, 2 ** 24 + 1]}, "embedding", "not exact as float32"),
    # ... and still was beside a float in a list (numpy made the list float64 first).
    ({"embedding": [0.5, 0, 0, 0, 0, 0, 0, 2 ** 24 + 1]}, "embedding", "16777217 is not exact"),
    ({"half": [[1.5, 2, 3], [4, 5, 2049]]}, "half", "integer 2049 is not exact as float16"),
    ({"boxes": [[0.5, 0, 2 ** 24 + 1, 2 ** 24 + 3]]}, "boxes", "16777217 is not exact"),
]


@pytest.mark.parametrize("change,field,why", BAD, ids=[b[1] + "-" + b[2] for b in BAD])
def test_a_bad_sample_names_its_number_and_field(tmp_path, change, field, why):
    out = tmp_path / "a"
    bad = dict(make_sample(1), **change)
    with pytest.raises(ValueError, match=r"sample 1: field '%s': .*%s" % (field, why)):
        with shardfeed.Writer(out, schema=SCHEMA, class_names=["a", "b", "c"]) as w:
            w.write(make_sample(0))
            w.write(bad)
    assert not out.exists()


def test_inf_and_nan_given_are_kept_and_the_largest_finite_values_fit(tmp_path):
    out = tmp_path / "a"
    edge = dict(make_sample(0), score=float("inf"), half=[[65504, -65504, np.nan], [0, 1, -np.inf]],
                embedding=[3.4e38, -3.4e38, np.nan, np.inf, 0, 0, 0, 0])
    with shardfeed.Writer(out, schema=SCHEMA, class_names=["a", "b", "c"]) as w:
        w.write(edge)
    got = shardfeed.Archive(out).sample(0)
    assert got["score"] == np.inf
    np.testing.assert_array_equal(got["half"], np.array(edge["half"], np.float16))
    np.testing.assert_array_equal(got["embedding"], np.array(edge["embedding"], np.float32))


def test_missing_field_and_mask_of_another_shape(tmp_path):
    s = make_sample(2)
    del s["caption"]
    with pytest.raises(ValueError, match="sample 0: field 'caption': missing"):
        with shardfeed.Writer(tmp_path / "a", schema=SCHEMA) as w:
            w.write(s)
    # The mask's shape is checked against the image once it is read (on a worker thread):
    # reported by a later write() or by close(), still naming the sample and the field.
    s = make_sample(3)
    s["mask"] = np.zeros((5, 5), np.uint8)
    with pytest.raises(ValueError, match="sample 1: .*mask"):
        with shardfeed.Writer(tmp_path / "b", schema=SCHEMA) as w:
            w.write(make_sample(0))
            w.write(s)
            w.write(make_sample(2))
    assert not (tmp_path / "b").exists()


def test_skip_bad_skips_and_reports(tmp_path):
    out = str(tmp_path / "a")
    samples = [make_sample(i) for i in range(6)]
    samples[1]["boxes"] = [[1, 2]]                       # found here
    samples[3]["mask"] = np.zeros((2, 2), np.uint8)     # found by the writer's check
    samples[4]["image"] = b"not an image"               # an image that does not decode
    with shardfeed.Writer(out, schema=SCHEMA, skip_bad=True) as w:
        w.write_many(samples)
    skipped = w.skipped
    assert [s["sample"] for s in skipped] == [1, 3, 4]
    assert "boxes" in skipped[0]["reason"] and "mask" in skipped[1]["reason"]
    assert w.report["packed"] == 3 and w.report["skipped_count"] == 3
    a = shardfeed.Archive(out)
    assert [a.sample(i)["count"] for i in range(len(a))] == [samples[i]["count"] for i in (0, 2, 5)]


def test_bad_image_without_skip_bad_is_skipped_like_pack(tmp_path):
    # Undecodable images are pack's "bad files": skipped and reported, as `pack` does.
    with shardfeed.Writer(tmp_path / "a") as w:
        w.write({"image": np.zeros((4, 4, 3), np.uint8), "label": 0})
        w.write({"image": b"\xff\xd8garbage", "label": 0})
        w.write({"image": tmp_path / "no-such.jpg", "label": 0})
    assert [s["sample"] for s in w.skipped] == [1, 2]
    assert str(tmp_path / "no-such.jpg") in w.skipped[1]["reason"]
    assert len(shardfeed.Archive(tmp_path / "a")) == 1


def test_options_are_packs(tmp_path):
    with pytest.raises(TypeError, match="qualty.*quality"):
        shardfeed.Writer(tmp_path / "a", qualty=80)
    with pytest.raises(ValueError, match="quality"):
        shardfeed.Writer(tmp_path / "a", quality=0)
    with pytest.raises(TypeError, match="shuffle"):
        shardfeed.Writer(tmp_path / "a", shuffle=True)
    with pytest.raises(ValueError, match="field"):
        shardfeed.Writer(tmp_path / "a", schema={"image": "image", "x": "float33"})
    assert not (tmp_path / "a").exists()


def indexed(i):
    return {"image": np.full((6, 5, 3), i % 251, np.uint8), "label": i % 4, "idx": i,
            "name": "n%d" % i}


IDX_SCHEMA = {"image": "image", "label": "int64", "idx": "int64", "name": "str"}


def check_order(out, n):
    a = shardfeed.Archive(out)
    assert len(a) == n
    for i in range(n):
        s = a.sample(i)
        assert (s["idx"], s["label"], s["name"]) == (i, i % 4, "n%d" % i)
        assert s["image"][0, 0, 0] == i % 251


def test_pack_iterable_list_and_generator(tmp_path):
    r = shardfeed.pack_iterable([indexed(i) for i in range(50)], tmp_path / "a", schema=IDX_SCHEMA)
    assert r["packed"] == 50 and r["samples_per_second"] > 0
    check_order(tmp_path / "a", 50)
    r = shardfeed.pack_iterable((indexed(i) for i in range(40)), tmp_path / "b",
                                schema=IDX_SCHEMA, workers=3)
    check_order(tmp_path / "b", 40)


def test_pack_iterable_torch_dataset_in_processes_keeps_order(tmp_path):
    torch = pytest.importorskip("torch")

    class Indexed(torch.utils.data.Dataset):
        def __init__(self):
            self.pid = os.getpid()

        def __len__(self):
            return 203

        def __getitem__(self, i):
            s = indexed(i)
            s["name"] = "n%d" % i if os.getpid() != self.pid else "main process"
            return s

    r = shardfeed.pack_iterable(Indexed(), tmp_path / "a", schema=IDX_SCHEMA, workers=3,
                                chunk=16)
    assert r["packed"] == 203
    check_order(tmp_path / "a", 203)  # names say every sample came from a worker process


@pytest.mark.parametrize("workers", [0, 1])
def test_a_map_style_dataset_in_this_process_is_read_by_index_up_to_its_len(tmp_path, workers):
    # REGRESSION (found by a stranger's test): with workers 0 or 1, `for s in dataset` on a torch
    # Dataset (no __iter__) called [0], [1], ... past len() until IndexError, which a Dataset that
    # computes its samples never raises: the pack ran until the disk was full.
    torch = pytest.importorskip("torch")

    class Endless(torch.utils.data.Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, i):
            if i >= 10:
                raise RuntimeError("read past len(): sample %d" % i)
            return indexed(i)

    r = shardfeed.pack_iterable(Endless(), tmp_path / "a", schema=IDX_SCHEMA, workers=workers)
    assert r["packed"] == 10
    check_order(tmp_path / "a", 10)
    with shardfeed.Writer(tmp_path / "b", schema=IDX_SCHEMA) as w:
        assert w.write_many(Endless()) == 10

    class Iterates(Endless):  # its own __iter__ is the order (as a pandas Series' values)
        def __getitem__(self, i):
            raise KeyError(i)

        def __iter__(self):
            return (indexed(i) for i in range(10))

    with shardfeed.Writer(tmp_path / "c", schema=IDX_SCHEMA) as w:
        assert w.write_many(Iterates()) == 10


def test_pack_iterable_dataset_error_leaves_nothing(tmp_path):
    class Broken:
        def __len__(self):
            return 100

        def __getitem__(self, i):
            if i == 70:
                raise OSError("disk on fire")
            return indexed(i)

    with pytest.raises(OSError, match="disk on fire"):
        shardfeed.pack_iterable(Broken(), tmp_path / "a", schema=IDX_SCHEMA, workers=2)
    assert not (tmp_path / "a").exists()


def test_pack_iterable_skip_bad_numbers_samples_by_index(tmp_path):
    class Some:
        def __len__(self):
            return 30

        def __getitem__(self, i):
            s = indexed(i)
            if i in (3, 17):
                s["idx"] = "three"
            return s

    r = shardfeed.pack_iterable(Some(), tmp_path / "a", schema=IDX_SCHEMA, workers=2, chunk=4,
                                skip_bad=True)
    assert [s["sample"] for s in r["skipped"]] == [3, 17]
    assert "field 'idx'" in r["skipped"][0]["reason"]
    a = shardfeed.Archive(tmp_path / "a")
    assert [a.sample(i)["idx"] for i in range(len(a))] == [i for i in range(30) if i not in (3, 17)]


class Dying:
    """A dataset whose worker process dies (os._exit) at sample 50, or blocks forever there."""

    def __init__(self, block=False):
        self.block = block

    def __len__(self):
        return 100

    def __getitem__(self, i):
        if i == 50:
            if self.block:
                threading.Event().wait()
            os._exit(3)
        return indexed(i)


def test_pack_iterable_worker_death_and_timeout_leave_nothing(tmp_path):
    from concurrent.futures.process import BrokenProcessPool

    with pytest.raises(BrokenProcessPool):
        shardfeed.pack_iterable(Dying(), tmp_path / "a", schema=IDX_SCHEMA, workers=2, chunk=8)
    assert not (tmp_path / "a").exists()
    with pytest.raises(TimeoutError):  # a bounded wait for a worker stuck in the dataset
        shardfeed.pack_iterable(Dying(block=True), tmp_path / "b", schema=IDX_SCHEMA, workers=2,
                                chunk=8, timeout=3)
    assert not (tmp_path / "b").exists()
    # The stuck worker was ended, not left behind (polled with a bound: it is reaped async).
    for _ in range(1000):
        if not multiprocessing.active_children():
            break
        threading.Event().wait(0.01)
    assert not multiprocessing.active_children()


@pytest.mark.parametrize("names, error", [
    ("cat", "a list of names, not str"), (["a", "b", "a"], "class_names[2]: 'a' is also"),
    ([], "class_names is empty"), (["a", None], "class_names[1]: a name is a str")])
def test_class_names_are_a_list_of_distinct_names(tmp_path, names, error):
    # "cat" became ['c', 'a', 't'], None the name 'None', and two classes of one name were
    # merged by extract (a folder per name): a later re-pack relabels them.
    with pytest.raises((TypeError, ValueError), match=error.replace("[", r"\[")):
        shardfeed.Writer(tmp_path / "a", schema={"image": "image", "label": "int64"},
                         class_names=names)
    assert not os.path.exists(tmp_path / "a")


def test_class_names_may_be_numpy_integers(tmp_path):
    with shardfeed.Writer(tmp_path / "a", schema={"image": "image", "label": "int64"},
                          class_names=np.arange(3)) as w:
        w.write({"image": np.zeros((4, 4, 3), np.uint8), "label": 2})
    assert shardfeed.Archive(tmp_path / "a").class_names == ["0", "1", "2"]


def test_a_label_beyond_the_class_limit_is_a_bad_sample(tmp_path):
    top = shardfeed._native.max_class_id
    with shardfeed.Writer(tmp_path / "a", schema={"image": "image", "label": "int64"},
                          skip_bad=True) as w:
        w.write({"image": np.zeros((4, 4, 3), np.uint8), "label": top + 1})
        w.write({"image": np.zeros((4, 4, 3), np.uint8), "label": 2})
    assert "at most %d classes" % (top + 1) in w.report["skipped"][0]["reason"]
    assert shardfeed.Archive(tmp_path / "a").class_names == ["0", "1", "2"]


def test_a_tuple_of_the_wrong_length_says_how_many_values(tmp_path):
    # It said "... or a tuple of them in that order, not tuple".
    with pytest.raises(ValueError, match=r"a tuple of 1 values for a schema of 2 fields \(image, label"):
        with shardfeed.Writer(tmp_path / "a", schema={"image": "image", "label": "int64"}) as w:
            w.write((np.zeros((4, 4, 3), np.uint8),))
    assert not os.path.exists(tmp_path / "a")


def test_bad_boxes_are_refused_by_that_write_and_the_writer_goes_on(tmp_path):
    # A NaN or inverted box passed write() and failed a later write() or close(), ending the
    # writer; the docs promise that of a mask's shape only. An empty [] for [*,*] is [0, 0].
    schema = {"image": "image", "boxes": "boxes", "v": "int64[*,*]"}
    img = np.zeros((8, 8, 3), np.uint8)
    with shardfeed.Writer(tmp_path / "a", schema=schema) as w:
        for bad, why in (([[1, 2, 0, 5]], "box 0 \\[1, 2, 0, 5\\] is inverted"),
                         ([[np.nan, 0, 1, 1]], "box 0 has a coordinate that is NaN"),
                         ([[0, 0, 1e31, 1]], "beyond \\+-1e30")):
            with pytest.raises(ValueError, match=r"sample \d: field 'boxes'.*" + why):
                w.write({"image": img, "boxes": bad, "v": []})
        w.write({"image": img, "boxes": [[0, 0, 4, 4]], "v": []})
    got = shardfeed.Archive(tmp_path / "a").sample(0)
    assert got["boxes"].tolist() == [[0, 0, 4, 4]] and got["v"].shape == (0, 0)


def test_class_names_count_only_the_labels_packed(tmp_path):
    # A sample skipped by the writer (an unreadable image, skip_bad) still named classes: its
    # label 5 made class_names "0".."5" for an archive whose only label is 0 (a model head of
    # 6 outputs for 1 class).
    img = np.zeros((8, 8, 3), np.uint8)
    with shardfeed.Writer(tmp_path / "a", skip_bad=True) as w:
        w.write({"image": str(tmp_path / "no-such.jpg"), "label": 5})
        w.write({"image": img, "label": 0})
    a = shardfeed.Archive(tmp_path / "a")
    assert len(a) == 1 and a.class_names == ["0"]
    assert [s["sample"] for s in w.skipped] == [0]


def test_integer_arrays_and_tensors_and_json_big_ints_are_checked_as_ints(tmp_path):
    # A 0-d array or tensor of 2**24 + 1 went into a float32 field as 16777216.0 (only a Python
    # int was checked); a json value's 2**64 + 1 was taken and came back rounded after extract.
    import torch
    schema = {"image": "image", "x": "float32", "j": "json"}
    img = np.zeros((4, 4, 3), np.uint8)
    for x, j, says in ((torch.tensor(2 ** 24 + 1), 0, "integer 16777217 is not exact"),
                       (np.array(2 ** 24 + 1), 0, "integer 16777217 is not exact"),
                       (np.array([2 ** 24 + 1]), 0, "integer 16777217 is not exact"),
                       (np.array(2 ** 64 + 1, dtype=object), 0, "is not exact as float32"),
                       (np.array([2 ** 24 + 1], dtype=object), 0, "16777217 is not exact"),
                       (1.5, {"id": 2 ** 64 + 1}, "does not fit 64 bits"),
                       (1.5, [-2 ** 63 - 1], "does not fit 64 bits")):
        with pytest.raises(ValueError, match="sample 0: field '.': .*" + says):
            with shardfeed.Writer(tmp_path / "a", schema=schema) as w:
                w.write({"image": img, "x": x, "j": j})
    with shardfeed.Writer(tmp_path / "a", schema=schema) as w:
        w.write({"image": img, "x": torch.tensor(2 ** 24), "j": {"id": 2 ** 64 - 1}})
    got = shardfeed.Archive(tmp_path / "a").sample(0)
    assert got["x"] == 2 ** 24 and got["j"] == {"id": 2 ** 64 - 1}


def test_a_json_value_that_is_not_utf8_is_a_bad_sample(tmp_path):
    # A lone surrogate in a json value raised pybind's TypeError, past skip_bad (review).
    img = np.zeros((4, 4, 3), np.uint8)
    with shardfeed.Writer(tmp_path / "a", schema={"image": "image", "j": "json"},
                          skip_bad=True) as w:
        w.write({"image": img, "j": {"a": "\ud800"}})
        w.write({"image": img, "j": {"a": "ok"}})
    assert len(shardfeed.Archive(tmp_path / "a")) == 1 and w.skipped[0]["sample"] == 0
