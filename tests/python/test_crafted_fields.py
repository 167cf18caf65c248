"""Field values crafted past every hash (tests/cli/craft_lmdb.py recomputes them) that the writers
refuse: Archive.sample() raises shardfeed.DataError naming the sample and the field, and the
Loader's workers refuse the sample, so skip_errors skips it, rather than a raw
UnicodeDecodeError, JSONDecodeError or RecursionError where the batch's field is read (JSON's
syntax alone is checked there, as a DataError naming the sample)."""
import os
import sys

import numpy as np
import pytest

import shardfeed

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
import craft_lmdb  # noqa: E402

SCHEMA = {"image": "image", "label": "int64", "meta": "json", "caption": "str", "pad": "bytes",
          "boxes": "boxes", "labels": {"type": "int64[*]", "per": "boxes"}, "seg": "mask"}


def crafted(tmp_path, change):
    """Sample 1 of 4 with the var value in slot `change[0]` replaced by `change[1]` (var fields:
    meta, caption, pad, boxes, labels, seg)."""
    path = str(tmp_path / "a.sf")
    with shardfeed.Writer(path, schema=SCHEMA, class_names=["a", "b"], workers=1,
                          encoding="zstd") as w:
        for i in range(4):
            w.write({"image": np.full((8, 8, 3), 40 * i, np.uint8), "label": i % 2,
                     "meta": {"k": i}, "caption": "c%d" % i, "pad": bytes(8000 if i == 3 else 8),
                     "boxes": np.array([[1, 1, 5, 5]], np.float32), "labels": [i],
                     "seg": np.zeros((8, 8), np.uint8)})

    def edit(i, values):
        if i == 3:
            values[2] = b"x" * 8  # room in the chunk
        if i == 1:
            values[change[0]] = change[1]
    craft_lmdb.rewrite_values(path, 6, 0, edit)
    return path


CASES = {
    "json-syntax": ((0, b'{"k":'), "field 'meta' (json): not valid JSON"),
    "json-depth": ((0, b"[" * 5000 + b"]" * 5000), "JSON nested deeper than 256 levels"),
    "utf8": ((1, b"\xff\xfe"), "field 'caption' (str): not valid UTF-8"),
    "per-box-rows": ((4, craft_lmdb.dims(3) + bytes(24)), "has 3 rows, 'boxes' has 1 boxes"),
    "mask-frame": ((5, craft_lmdb.dims(8, 8) + craft_lmdb.zstd_rle(64, claims=1 << 40)),
                   "field 'seg': mask: the zstd frame holds 1099511627776 bytes"),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_a_crafted_field_value_is_a_data_error_naming_sample_and_field(tmp_path, case):
    # REGRESSION: sample() raised json.JSONDecodeError, RecursionError or UnicodeDecodeError
    # (naming nothing), returned a per-box field whose rows differ from its boxes', and a bad
    # mask frame's error named no file, sample or field; Loader(skip_errors=True) delivered the
    # sample and the batch's field access raised the raw error, ending the epoch.
    change, says = CASES[case]
    path = crafted(tmp_path, change)
    a = shardfeed.Archive(path)
    with pytest.raises(shardfeed.DataError) as e:
        a.sample(1)
    assert path in str(e.value) and "sample 1" in str(e.value) and says in str(e.value), e.value
    assert a.sample(2)["caption"] == "c2"
    got = []
    loader = shardfeed.Loader(path, batch_size=2, workers=1, skip_errors=True, shuffle=False,
                              crop="none")
    if case == "json-syntax":
        # The workers check JSON's UTF-8 and depth, not its syntax (a parse costs 10x a small
        # record's read): the sample is delivered, and reading its field names it.
        with pytest.raises(shardfeed.DataError, match="sample 1: field 'meta' .*not valid JSON"):
            for b in loader:
                b["meta"]
        return
    for b in loader:
        for name in ("meta", "caption", "labels"):
            b[name]
        got.extend(zip(b.indices.tolist(), b.labels.tolist()))
    assert got == [(0, 0), (1, -1), (2, 0), (3, 1)], got
    with pytest.raises(shardfeed.DataError, match="sample 1"):
        for b in shardfeed.Loader(path, batch_size=2, workers=1, shuffle=False, crop="none"):
            b["meta"]
