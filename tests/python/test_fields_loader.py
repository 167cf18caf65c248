"""Loader batches with typed fields (issue 21, "Reading"): every field a JSONL pack can hold
comes back from shardfeed.Loader and shardfeed.torch.Loader, in thread and process mode, as
lists or (values, offsets); fields= selects; an unknown name is refused with the closest."""
import json
import os
import subprocess

import numpy as np
import pytest
from PIL import Image

import shardfeed

CLI = os.environ.get("SHARDFEED_CLI", "shardfeed")
W, H = 64, 48

SCHEMA = {"image": "image", "label": "int64", "boxes": "boxes",
          "box_labels": {"type": "int64[*]", "per": "boxes"}, "caption": "str", "meta": "json",
          "emb": "float32[3]", "tags": "int64[*]", "score": "float64"}


def sample(i):
    boxes = [[4.0 + 10 * k, 3.0 + 6 * k, 14.0 + 10 * k + i % 3, 13.0 + 6 * k] for k in range(i % 4)]
    if i % 5 == 0:
        boxes.append([20.0, 20.0, 20.5, 30.0])  # half a pixel wide: dropped, with its label
    return {"label": i % 3, "boxes": boxes, "box_labels": [100 * i + k for k in range(len(boxes))],
            "caption": "" if i % 4 == 0 else "photo %d \u00e9" % i,
            "meta": {"i": i, "odd": [bool(i % 2)]}, "emb": [i, i + 0.5, -i],
            "tags": list(range(i % 3)), "score": i / 3}


def pack(tmp_path, n, schema=SCHEMA, make=sample):
    os.makedirs(tmp_path / "img", exist_ok=True)
    with open(tmp_path / "m.jsonl", "w") as f:
        for i in range(n):
            Image.new("RGB", (W, H), (i * 9 % 256, 40, 80)).save(tmp_path / "img" / ("%d.jpg" % i),
                                                                  quality=95)
            row = {"image": "img/%d.jpg" % i}
            row.update(make(i))
            f.write(json.dumps(row) + "\n")
    with open(tmp_path / "schema.json", "w") as f:
        json.dump(schema, f)
    out = str(tmp_path / "a.sf")
    r = subprocess.run([CLI, "pack", str(tmp_path / "m.jsonl"), out, "--schema",
                        str(tmp_path / "schema.json"), "-q"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


def kept(boxes):
    """What crop none keeps: boxes at least a pixel wide and high (the loader's rule)."""
    return [k for k, b in enumerate(boxes) if b[2] - b[0] >= 1 and b[3] - b[1] >= 1]


def check(batch, ragged):
    for p, index in enumerate(batch.indices):
        want = sample(int(index))
        assert batch.labels[p] == want["label"]
        assert batch["label"][p] == want["label"]
        keep = kept(want["boxes"])
        if ragged == "list":
            boxes, labels, tags = batch["boxes"][p], batch["box_labels"][p], batch["tags"][p]
        else:
            (bv, bo), (lv, lo), (tv, to) = batch["boxes"], batch["box_labels"], batch["tags"]
            boxes, labels, tags = bv[bo[p]:bo[p + 1]], lv[lo[p]:lo[p + 1]], tv[to[p]:to[p + 1]]
        assert boxes.dtype == np.float32 and boxes.shape == (len(keep), 4)
        np.testing.assert_array_equal(boxes, np.array([want["boxes"][k] for k in keep],
                                                      np.float32).reshape(-1, 4))
        assert labels.tolist() == [want["box_labels"][k] for k in keep]
        assert tags.tolist() == want["tags"]
        assert batch["caption"][p] == want["caption"]
        assert batch["meta"][p] == want["meta"]
        np.testing.assert_array_equal(batch["emb"][p], np.array(want["emb"], np.float32))
        assert batch["score"][p] == want["score"]
    assert batch["emb"].shape == (len(batch.indices), 3)
    assert batch["image"] is batch.images


@pytest.mark.parametrize("mode", ["threads", "processes"])
@pytest.mark.parametrize("ragged", ["list", "offsets"])
def test_every_field_comes_back(tmp_path, mode, ragged):
    path = pack(tmp_path, 23)
    loader = shardfeed.Loader(path, batch_size=5, workers=2, shuffle=True, crop="none",
                              mode=mode, ragged=ragged)
    seen = 0
    for batch in loader:
        images, labels = batch  # tuple unpacking still works
        assert images.shape[1:] == (H, W, 3)
        check(batch, ragged)
        assert set(batch.keys()) == {"image", "label"} | (set(SCHEMA) - {"image", "label"})
        seen += len(labels)
    assert seen == 23
    loader.close()


def test_offsets_are_one_array_per_field(tmp_path):
    path = pack(tmp_path, 10)
    loader = shardfeed.Loader(path, batch_size=10, workers=1, crop="none", ragged="offsets")
    batch = next(iter(loader))
    values, offsets = batch["box_labels"]
    assert offsets.dtype == np.int64 and offsets.shape == (11,) and offsets[0] == 0
    assert offsets[-1] == len(values)
    boxes, box_offsets = batch["boxes"]
    np.testing.assert_array_equal(offsets, box_offsets)  # per-box rows follow their boxes
    loader.close()


def test_torch_loader_gives_tensors(tmp_path):
    torch = pytest.importorskip("torch")
    import shardfeed.torch as sft

    path = pack(tmp_path, 12)
    for ragged in ("list", "offsets"):
        loader = sft.Loader(path, batch_size=4, num_workers=1, crop="none", ragged=ragged)
        for batch in loader:
            images, labels = batch
            assert isinstance(batch["emb"], torch.Tensor) and batch["emb"].shape == (4, 3)
            if ragged == "list":
                assert all(isinstance(b, torch.Tensor) for b in batch["boxes"])
                assert [b.shape[1] for b in batch["boxes"]] == [4] * 4
            else:
                values, offsets = batch["boxes"]
                assert values.dtype == torch.float32 and offsets.dtype == torch.int64
            assert isinstance(batch["caption"], list) and isinstance(batch["meta"][0], dict)
            for p, index in enumerate(batch.indices.tolist()):
                assert batch["caption"][p] == sample(index)["caption"]
        loader.close()


def test_fields_selects_and_unknown_names_are_refused(tmp_path):
    path = pack(tmp_path, 6)
    loader = shardfeed.Loader(path, batch_size=3, workers=1, crop="none", fields=["caption"])
    batch = next(iter(loader))
    assert batch.keys() == ["image", "label", "caption"]
    with pytest.raises(KeyError, match="caption"):
        batch["boxes"]
    loader.close()
    none = shardfeed.Loader(path, batch_size=3, workers=1, crop="none", fields=[])
    assert next(iter(none)).keys() == ["image", "label"]
    none.close()
    with pytest.raises(ValueError, match="did you mean 'caption'"):
        shardfeed.Loader(path, batch_size=3, crop="none", fields=["captoin"])


def test_labels_are_none_without_a_class_field(tmp_path):
    schema = {"image": "image", "caption": "str"}
    path = pack(tmp_path, 4, schema=schema, make=lambda i: {"caption": "c%d" % i})
    loader = shardfeed.Loader(path, batch_size=4, workers=1, crop="none")
    batch = next(iter(loader))
    images, labels = batch
    assert labels is None and batch.labels is None
    assert sorted(batch["caption"]) == ["c0", "c1", "c2", "c3"]
    loader.close()


def test_kept_batches_keep_their_fields(tmp_path):
    path = pack(tmp_path, 30)
    loader = shardfeed.Loader(path, batch_size=3, workers=2, prefetch=2, crop="none",
                              shuffle=True)
    batches = list(loader)  # every batch kept: slots beyond the ring
    assert loader.stats()["kept_slots"] > 0
    for batch in batches:
        check(batch, "list")
    loader.close()


def test_image_and_label_by_name(tmp_path):
    torch = pytest.importorskip("torch")
    import shardfeed.torch as sft

    path = pack(tmp_path, 4)
    loader = sft.Loader(path, batch_size=4, num_workers=1, crop="none")
    batch = next(iter(loader))
    assert batch["image"] is batch.images and batch["images"] is batch.images
    assert torch.equal(batch["label"], batch.labels)
    loader.close()
