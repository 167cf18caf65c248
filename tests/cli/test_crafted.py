"""Archives crafted so that their damage gets past every hash (craft_lmdb.py recomputes them):
what the writers refuse, verify --decode reports and convert refuses as damage (exit 3); what
no reader may allocate, convert does not either."""
import json
import os
import subprocess
import sys

import pytest
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import craft_lmdb  # noqa: E402

CLI = os.environ.get("SHARDFEED_CLI", "shardfeed")


def run(*args):
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=300)


def fields_archive(tmp_path, schema, rows, encoding="zstd"):
    for i in range(len(rows)):
        Image.new("RGB", (8, 8), (40 * i, 9, 9)).save(tmp_path / ("%d.png" % i))
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "s.json").write_text(json.dumps(schema))
    out = tmp_path / "a.sf"
    p = run("pack", tmp_path / "m.jsonl", out, "--schema", tmp_path / "s.json", "--encoding",
            encoding, "-q")
    assert p.returncode == 0, p.stderr
    return out


SCHEMA = {"image": "image", "label": "int64", "meta": "json", "caption": "str", "boxes": "boxes",
          "pad": "bytes"}


def boxes(*rows):
    import struct
    return craft_lmdb.dims(len(rows), 4) + b"".join(struct.pack("<4f", *r) for r in rows)


@pytest.mark.parametrize("slot,value,says", [
    (1, b"\xff\xfe\xc0\x80", "field 'caption' (str): not valid UTF-8"),
    (0, b"[" * 300 + b"]" * 300, "field 'meta' (json): JSON nested deeper than 256 levels"),
    (2, boxes((float("nan"), 1, 5, 5)), "field 'boxes' (boxes): box 0 has a coordinate that is NaN"),
    (2, boxes((1, 1, float("inf"), 5)), "field 'boxes' (boxes): box 0 has a coordinate that is NaN"),
], ids=["utf8", "json-depth", "nan-box", "inf-box"])
def test_verify_decode_reports_what_the_writers_refuse(tmp_path, slot, value, says):
    # REGRESSION: verify --decode said OK for a str that is not UTF-8, JSON nested past the
    # limit and non-finite boxes; convert then refused them as a wrong argument (exit 2) and
    # extract rewrote or wrote what pack refuses. (Inverted boxes are not damage: archives
    # written before the writers refused them hold some; see the golden v4 fields archives.) verify --decode now checks each value
    # as the writers do, and convert calls it damage (exit 3), naming sample and field.
    rows = [{"image": "%d.png" % i, "label": i % 2, "meta": {"k": i}, "caption": "c%d" % i,
             "boxes": [[1, 1, 5, 5]], "pad": "x" * (8000 if i == 2 else 8)} for i in range(3)]
    a = fields_archive(tmp_path, SCHEMA, rows)

    def edit(i, values):
        if i == 2:
            values[3] = b"x" * 8  # room in the chunk for the new value
        if i == 1:
            values[slot] = value
    craft_lmdb.rewrite_values(a, 4, 0, edit)
    assert run("verify", a).returncode == 0  # every hash matches: a crafted archive
    p = run("verify", a, "--decode")
    assert p.returncode == 1 and "sample 1" in p.stdout and says in p.stdout, p.stdout
    c = run("convert", a, tmp_path / "c.sf")
    assert c.returncode == 3, c.stderr
    assert "sample 1" in c.stderr and says in c.stderr, c.stderr
    assert not (tmp_path / "c.sf").exists()
    x = run("extract", a, tmp_path / "x")
    assert x.returncode == 3 and "sample 1" in x.stderr and says in x.stderr, x.stderr
    assert not (tmp_path / "x").exists()


def test_convert_bounds_a_mask_as_a_decode_is_bounded(tmp_path):
    # REGRESSION: an index entry and mask claiming 20000 x 20000 (a 12 KB zstd frame) made
    # convert allocate 400 MB for the mask (8.4 GB at 65535 x 65535) and succeed, where every
    # other reader refuses the record at max_pixels first. convert now refuses it so too.
    schema = {"image": "image", "mask": "mask", "pad": "bytes"}
    rows = [{"image": "%d.png" % i, "mask": [[0] * 8] * 8, "pad": "x" * (20000 if i == 2 else 8)}
            for i in range(3)]
    a = fields_archive(tmp_path, schema, rows)
    m = json.loads((a / "manifest.json").read_text())
    m["shape"] = None  # not recorded: the sizes vary (rewrite_values hashes the manifest again)
    (a / "manifest.json").write_text(json.dumps(m))

    def edit(i, values):
        if i == 2:
            values[1] = b"x" * 8
        if i == 1:
            values[0] = craft_lmdb.dims(20000, 20000) + craft_lmdb.zstd_rle(20000 * 20000)

    def entry(i, e):
        if i == 1:
            e[5] = e[6] = 20000  # height, width
    craft_lmdb.rewrite_values(a, 2, 0, edit, entry)
    c = run("convert", a, tmp_path / "c.sf")
    assert c.returncode == 3, c.stderr
    assert "sample 1" in c.stderr and "20000x20000" in c.stderr and "max_pixels" in c.stderr
    assert not (tmp_path / "c.sf").exists()


def test_an_archive_with_inverted_boxes_from_an_older_writer_converts(tmp_path):
    # REGRESSION: the golden v4 fields archives (an older writer's) hold inverted boxes, which
    # writers now refuse from sources; convert refused the whole archive for them. Values copied
    # from an archive keep them, as verify --decode and extract do.
    golden = os.path.join(os.environ["SHARDFEED_SOURCE_DIR"], "tests", "format", "golden", "v4",
                          "lmdb-fields")
    c = run("convert", golden, tmp_path / "c.sf", "-q")
    assert c.returncode == 0, c.stderr
    assert run("verify", tmp_path / "c.sf", "--decode").returncode == 0
    for name in ("golden", "c"):
        x = run("extract", golden if name == "golden" else tmp_path / "c.sf", tmp_path / name, "-q")
        assert x.returncode == 0, x.stderr
    assert (tmp_path / "golden" / "samples.jsonl").read_text() == \
        (tmp_path / "c" / "samples.jsonl").read_text()
