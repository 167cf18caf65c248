"""`shardfeed pack` from JSONL, CSV, COCO, WebDataset and MXNet list sources (issue 21, item 4):
each importer's fields read back equal (through the Python module's Archive.sample when it is
built), schema inference and --schema, errors naming file:line and the field, --skip-bad, and
the path field of a folder pack."""
import base64
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tarfile

import pytest
from PIL import Image

CLI = os.environ.get("SHARDFEED_CLI", "shardfeed")
DATA = os.environ.get("SHARDFEED_TEST_DATA", "")
GOOD = os.path.join(DATA, "good")
_p = os.environ.get("SHARDFEED_PYTHONPATH", "")
PYTHONPATH = _p if os.path.isdir(os.path.join(_p, "shardfeed")) else ""

# Reads every sample's fields but the image as extract's samples.jsonl writes them (arrays as
# nested lists, bytes as {"base64": ...}, json parsed).
READ = r"""
import base64, json, sys
import numpy as np
import shardfeed
a = shardfeed.Archive(sys.argv[1])
types = {f["name"]: f["type"] for f in json.load(open(sys.argv[1] + "/manifest.json"))["fields"]}
def plain(name, v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"base64": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, np.generic):
        return v.item()
    if types.get(name) == "json" and isinstance(v, str):
        return json.loads(v)
    return v
print(json.dumps([{k: plain(k, v) for k, v in a.sample(i).items() if k != "image"}
                  for i in range(len(a))]))
"""


def run(*args, check=None):
    p = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=300)
    if check is not None:
        assert p.returncode == check, (p.returncode, p.stdout, p.stderr)
    return p


def manifest(archive):
    return json.loads((archive / "manifest.json").read_text())


def fields(archive):
    """{name: type} of the manifest's schema (format version 4)."""
    m = manifest(archive)
    if "fields" not in m:
        pytest.skip("the archive writer does not record fields yet (format engineer's part)")
    return {f["name"]: f["type"] for f in m["fields"]}


def samples(archive, tmp_path):
    """Every sample's fields but the image: through shardfeed.Archive(path).sample(i) where the
    Python module has it, else through `shardfeed extract` (its samples.jsonl)."""
    if PYTHONPATH:
        p = subprocess.run([sys.executable, "-c", READ, str(archive)], capture_output=True,
                           text=True, env=dict(os.environ, PYTHONPATH=PYTHONPATH), timeout=120)
        if p.returncode == 0:
            return json.loads(p.stdout)
        assert "has no attribute 'sample'" in p.stderr, p.stderr
    out = tmp_path / ("extracted-" + archive.name)
    run("extract", archive, out, "-q", check=0)
    with open(out / "samples.jsonl") as f:
        rows = [json.loads(line) for line in f]
    for r in rows:
        r.pop("image", None)
    return rows


def jpeg(path, size=(40, 30), color=(200, 30, 30)):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new("RGB", size, color).save(path, "JPEG")


@pytest.fixture
def jsonl_source(tmp_path):
    rows = []
    for i in range(4):
        jpeg(str(tmp_path / "imgs" / ("%d.jpg" % i)), size=(40 + i, 30))
        rows.append({"image": "imgs/%d.jpg" % i, "caption": "picture %d" % i, "label": i % 2,
                     "score": i * 0.25, "tags": list(range(i)), "emb": [0.5 * i, 1.5],
                     "boxes": [[1, 2, 10 + i, 12]] * (i % 3), "meta": {"i": i}})
    src = tmp_path / "d.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return src, rows


def test_jsonl_round_trips_every_inferred_field(tmp_path, jsonl_source):
    src, rows = jsonl_source
    out = tmp_path / "a"
    run("pack", src, out, "-q", check=0)
    assert manifest(out)["sample_count"] == 4
    assert manifest(out)["options"]["source"] == "jsonl"
    assert fields(out) == {"image": "image", "caption": "str", "label": "int64",
                           "score": "float64", "tags": "int64[*]", "emb": "float32[*]",
                           "boxes": "boxes", "meta": "json", "path": "str"}
    got = samples(out, tmp_path)
    for row, s in zip(rows, got):
        assert s["caption"] == row["caption"]
        assert s["label"] == row["label"]
        assert s["score"] == row["score"]
        assert s["tags"] == row["tags"]
        assert s["emb"] == row["emb"]
        assert s["boxes"] == row["boxes"]
        assert s["meta"] == row["meta"]
        assert s["path"] == row["image"]


def test_schema_file_overrides_inference(tmp_path, jsonl_source):
    src, rows = jsonl_source
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"image": "image", "score": "float32", "emb": "float64[2]",
                                  "caption": "bytes"}))
    out = tmp_path / "a"
    run("pack", src, out, "--schema", schema, "-q", check=0)
    assert fields(out) == {"image": "image", "score": "float32", "emb": "float64[2]",
                           "caption": "bytes"}
    got = samples(out, tmp_path)
    assert [s["emb"] for s in got] == [r["emb"] for r in rows]
    assert [s["score"] for s in got] == [r["score"] for r in rows]  # exact in float32


def test_a_bad_row_names_file_line_and_field_and_skip_bad_skips_it(tmp_path, jsonl_source):
    src, rows = jsonl_source
    lines = src.read_text().splitlines()
    bad = dict(rows[2], tags="three")  # a string where the schema wants int64[*]
    lines[2] = json.dumps(bad)
    src.write_text("\n".join(lines) + "\n")
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"image": "image", "tags": "int64[*]"}))
    out = tmp_path / "a"
    p = run("pack", src, out, "--schema", schema, "-q", check=1)
    assert "d.jsonl:3" in p.stderr and "field 'tags'" in p.stderr, p.stderr
    assert not out.exists()
    report = tmp_path / "r.json"
    run("pack", src, out, "--schema", schema, "--skip-bad", "--report", report, "-q", check=0)
    assert manifest(out)["sample_count"] == 3
    skipped = json.loads(report.read_text())["skipped"]
    assert [s["path"] for s in skipped] == [str(src) + ":3"]
    assert "field 'tags'" in skipped[0]["reason"]
    p = run("pack", src, tmp_path / "b", "--skip-bad", "--strict", "-q", check=2)
    assert "contradict" in p.stderr


def test_the_report_is_written_when_the_import_fails(tmp_path, jsonl_source):
    # docs/CLI.md: "written also when the pack fails"; an import failure (a bad row) returned
    # before the report was written.
    src, _ = jsonl_source
    with open(src, "a") as f:
        f.write("{not json\n")
    report = tmp_path / "r.json"
    p = run("pack", src, tmp_path / "a", "--report", report, "-q", check=1)
    got = json.loads(report.read_text())
    assert got["packed"] == 0 and "not valid JSON" in got["error"], (got, p.stderr)


def test_a_per_box_field_with_the_wrong_row_count_names_the_sample(tmp_path):
    jpeg(str(tmp_path / "a.jpg"))
    src = tmp_path / "d.jsonl"
    src.write_text(json.dumps({"image": "a.jpg", "boxes": [[0, 0, 1, 1]], "labels": [1, 2]}) + "\n")
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"image": "image", "boxes": "boxes",
                                  "labels": {"type": "int64[*]", "per": "boxes"}}))
    p = run("pack", src, tmp_path / "out", "--schema", schema, "-q", check=1)
    assert "d.jsonl:1" in p.stderr and "field 'labels'" in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def test_csv_with_quotes_and_class_names_from_strings(tmp_path):
    for i in range(3):
        jpeg(str(tmp_path / "img" / ("%d.png" % i)).replace(".png", ".jpg"))
    src = tmp_path / "d.csv"
    src.write_text('filename,caption,label,weight\n'
                   'img/0.jpg,"a, b and ""c""",dog,1\n'
                   'img/1.jpg,"two\nlines",cat,2.5\n'
                   'img/2.jpg,plain,dog,3\n')
    out = tmp_path / "a"
    run("pack", src, out, "-q", check=0)
    assert manifest(out)["class_names"] == ["cat", "dog"]
    assert fields(out) == {"image": "image", "caption": "str", "label": "int64",
                           "weight": "float64", "path": "str"}
    got = samples(out, tmp_path)
    assert [s["caption"] for s in got] == ['a, b and "c"', "two\nlines", "plain"]
    assert [s["label"] for s in got] == [1, 0, 1]
    assert [s["weight"] for s in got] == [1.0, 2.5, 3.0]
    assert [s["path"] for s in got] == ["img/0.jpg", "img/1.jpg", "img/2.jpg"]
    src.write_text("filename,weight\nimg/0.jpg,1\nimg/1.jpg,heavy\n")
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"image": "image", "weight": "float32"}))
    p = run("pack", src, tmp_path / "b", "--schema", schema, "-q", check=1)
    assert "d.csv:3" in p.stderr and "field 'weight'" in p.stderr, p.stderr


def test_csv_class_ids_among_class_names_are_refused(tmp_path):
    # Labels 0, n/a, 0: the names ("n/a") number the classes, so id 0 became class "n/a" for
    # every row, silently (exit 0). Now each id among names is an error naming it and a name.
    for i in range(3):
        jpeg(str(tmp_path / ("%d.jpg" % i)))
    src = tmp_path / "d.csv"
    src.write_text("filename,label\n0.jpg,0\n1.jpg,n/a\n2.jpg,0\n")
    p = run("pack", src, tmp_path / "a", "-q", check=1)
    assert "d.csv:2" in p.stderr and "field 'label'" in p.stderr, p.stderr
    assert "class id 0 among class names ('n/a' at" in p.stderr and "d.csv:3" in p.stderr, p.stderr
    run("pack", src, tmp_path / "b", "--skip-bad", "-q", check=0)
    assert manifest(tmp_path / "b")["sample_count"] == 1
    assert manifest(tmp_path / "b")["class_names"] == ["n/a"]



def test_inference_says_what_a_user_may_not_expect(tmp_path):
    # REGRESSION: one word among numbers made a CSV column str, and a column with no value in
    # any row was left out, both silently (exit 0, nothing printed, nothing in the report);
    # JSONL labels mixing ids and names became a json field with no classes. Now the first two
    # are notes (stderr and the report's "notes") and the third is refused as in CSV.
    for i in range(4):
        jpeg(str(tmp_path / ("%d.jpg" % i)))
    src = tmp_path / "d.csv"
    src.write_text("filename,score,comment\n0.jpg,0.5,\n1.jpg,n/a,\n2.jpg,1,\n3.jpg,2,\n")
    p = run("pack", src, tmp_path / "a", "--report", tmp_path / "r.json", "-q", check=0)
    assert fields(tmp_path / "a") == {"image": "image", "score": "str", "path": "str"}
    assert [s["score"] for s in samples(tmp_path / "a", tmp_path)] == ["0.5", "n/a", "1", "2"]
    notes = json.loads((tmp_path / "r.json").read_text())["notes"]
    assert len(notes) == 2, notes
    assert notes[0].startswith("column 'score' stored as str") and "d.csv:2" in notes[0]
    assert '"n/a"' in notes[0] and "d.csv:3" in notes[0], notes[0]
    assert notes[1] == "column 'comment' has no value in any row: not stored"
    assert "note: " + notes[0] in p.stderr and "note: " + notes[1] in p.stderr, p.stderr
    assert "fields: image image, score str, path str" in p.stdout, p.stdout

    rows = tmp_path / "d.jsonl"
    rows.write_text('{"image": "0.jpg", "label": "dog"}\n{"image": "1.jpg", "label": 1}\n')
    p = run("pack", rows, tmp_path / "b", "-q", check=1)
    assert "d.jsonl:2" in p.stderr and "class id 1 among class names ('dog' at" in p.stderr
    rows.write_text('{"image": "0.jpg", "label": "dog"}\n{"image": "1.jpg", "label": "cat"}\n')
    p = run("pack", rows, tmp_path / "c", "-q", check=0)
    assert manifest(tmp_path / "c")["class_names"] == ["cat", "dog"]
    assert "fields: image image, label int64 (the class field, 2 classes), path str" in p.stdout
    rows.write_text('{"image": "0.jpg", "b": [[1, 2, 3, 4]]}\n{"image": "1.jpg", "b": [1, 2]}\n')
    p = run("pack", rows, tmp_path / "e", "-q", check=0)
    assert "note: column 'b' stored as json: its values are of different kinds, a list of " \
           "lists ([[1,2,3,4]]) at" in p.stderr and "a list ([1,2]) at" in p.stderr, p.stderr
    rows.write_text('{"image": "0.jpg", "label": [1]}\n{"image": "1.jpg", "label": "cat"}\n')
    p = run("pack", rows, tmp_path / "d", "-q", check=0)
    assert fields(tmp_path / "d")["label"] == "json"
    assert "note: column 'label' stored as json (not as the class field)" in p.stderr, p.stderr



def test_null_and_empty_values_are_nan_in_float_fields_and_null_in_json(tmp_path):
    # REGRESSION (found by a stranger's test): pandas writes a missing value as an empty CSV
    # cell (to_csv) or null (to_json): every such row failed the pack with "missing", although
    # the key was there, and --skip-bad dropped the whole sample. Float fields now keep it as
    # NaN (what pandas reads back), json fields as null; other types say why they refuse it.
    def missing(v):  # NaN through Python; extract's samples.jsonl (no Python module): "NaN"
        return v == "NaN" or (isinstance(v, float) and math.isnan(v))

    for i in range(3):
        jpeg(str(tmp_path / ("%d.jpg" % i)))
    src = tmp_path / "d.csv"
    src.write_text('filename,score,meta\n0.jpg,0.5,"{""a"": 1}"\n1.jpg,,\n2.jpg,1.5,[2]\n')
    run("pack", src, tmp_path / "a", "-q", check=0)
    assert fields(tmp_path / "a") == {"image": "image", "score": "float64", "meta": "json",
                                      "path": "str"}
    got = samples(tmp_path / "a", tmp_path)
    assert got[0]["score"] == 0.5 and missing(got[1]["score"]) and got[2]["score"] == 1.5
    assert [s["meta"] for s in got] == [{"a": 1}, None, [2]]
    rows = tmp_path / "d.jsonl"
    rows.write_text('{"image": "0.jpg", "w": 0.25, "n": 1}\n{"image": "1.jpg", "w": null, "n": 2}\n'
                    '{"image": "2.jpg", "w": 1, "n": null}\n')
    p = run("pack", rows, tmp_path / "b", "-q", check=1)
    assert "d.jsonl:3: field 'n': null: no value, and a field of type int64 needs one" in p.stderr
    run("pack", rows, tmp_path / "b", "-q", "--skip-bad", check=0)
    got = samples(tmp_path / "b", tmp_path)
    assert got[0]["w"] == 0.25 and missing(got[1]["w"]) and len(got) == 2


def test_messages_point_at_the_cause(tmp_path):
    # Found by a stranger's test: a string category_id ("90") was reported as "not in
    # categories", and a ';'-separated CSV as "2 cells, the header has 1" or "no image column"
    # with no word about the separator.
    instances, images = coco_source(tmp_path)
    coco = json.loads(instances.read_text())
    coco["annotations"][0]["category_id"] = "18"
    instances.write_text(json.dumps(coco))
    p = run("pack", instances, tmp_path / "a", "--images", images, "-q", check=1)
    assert "annotations[0]: field 'labels': category_id \"18\" is not an integer" in p.stderr
    coco["annotations"][0]["category_id"] = 5
    instances.write_text(json.dumps(coco))
    p = run("pack", instances, tmp_path / "a", "--images", images, "-q", check=1)
    assert "category_id 5 not in \"categories\"" in p.stderr, p.stderr
    jpeg(str(tmp_path / "0.jpg"))
    src = tmp_path / "d.csv"
    for text in ("image;label\n0.jpg;cat\n", "image;score\n0.jpg;0,5\n"):
        src.write_text(text)
        p = run("pack", src, tmp_path / "b", "-q")
        assert p.returncode in (1, 2) and "only ',' separates" in p.stderr, p.stderr

def test_a_users_path_column_says_loaders_leave_it_out_by_default(tmp_path):
    # A JSONL column `path` (the user's own data, say where the photo came from) is the str
    # field `path`, which loaders leave out of batches by default as a source path: batch["path"]
    # was a KeyError with no word at pack time. The pack now says so; a pack's own path does not.
    jpeg(tmp_path / "a.jpg")
    (tmp_path / "m.jsonl").write_text(json.dumps({"image": "a.jpg", "path": "s3://b/a.jpg"}) + "\n")
    p = run("pack", tmp_path / "m.jsonl", tmp_path / "m.sf", "-q", check=0)
    assert "column 'path' is the str field 'path'" in p.stderr and "fields='*'" in p.stderr, p.stderr
    (tmp_path / "n.jsonl").write_text(json.dumps({"image": "a.jpg"}) + "\n")
    p = run("pack", tmp_path / "n.jsonl", tmp_path / "n.sf", "-q", check=0)
    assert "column 'path'" not in p.stderr, p.stderr


def test_jsonl_labels_with_a_row_per_box_are_linked_to_the_boxes(tmp_path):
    # REGRESSION: a JSONL detection manifest's "labels" beside "boxes" was inferred a plain
    # int64[*]: a crop that dropped a box kept every label, and the rows went out of step with
    # no word. With box counts that vary, one value per box in every row links the column to
    # the boxes ("per"); with a constant count (could be chance) a note says how to link it.
    jpeg(tmp_path / "a.jpg", size=(40, 30))
    rows = [{"image": "a.jpg", "boxes": [[0, 0, 5, 5]] * n, "labels": list(range(n)),
             "scores": [0.5] * n, "tags": [7, 8]} for n in (1, 2, 0, 3)]
    (tmp_path / "v.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = run("pack", tmp_path / "v.jsonl", tmp_path / "v.sf", "-q", check=0)
    per = {f["name"]: f.get("per") for f in manifest(tmp_path / "v.sf")["fields"]}
    assert per["labels"] == per["scores"] == "boxes" and per["tags"] is None, per
    assert "column 'labels' stored per box of 'boxes'" in p.stderr, p.stderr
    same = [{"image": "a.jpg", "boxes": [[0, 0, 5, 5]] * 2, "labels": [1, 2]}] * 2
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in same))
    p = run("pack", tmp_path / "c.jsonl", tmp_path / "c.sf", "-q", check=0)
    per = {f["name"]: f.get("per") for f in manifest(tmp_path / "c.sf")["fields"]}
    assert per["labels"] is None, per
    assert "every row has 2 boxes: not linked" in p.stderr and '"per": "boxes"' in p.stderr


def test_a_pandas_index_column_does_not_take_the_path_field(tmp_path):
    # REGRESSION (found by a stranger's test): df.to_csv() writes an unnamed index column (a
    # header cell ""); the implicit `path` field looked its column up as column_of["path"],
    # which made an entry "" and so read the index: path was '0', '1', ... instead of the image.
    for i in range(2):
        jpeg(str(tmp_path / "img" / ("%d.jpg" % i)))
    src = tmp_path / "d.csv"
    src.write_text(",image,label\n0,img/0.jpg,cat\n1,img/1.jpg,dog\n")
    run("pack", src, tmp_path / "a", "-q", check=0)
    got = samples(tmp_path / "a", tmp_path)
    assert [s["path"] for s in got] == ["img/0.jpg", "img/1.jpg"]
    assert [s["_"] for s in got] == [0, 1]  # the index itself is kept, as a field "_"

def coco_source(tmp_path):
    images = tmp_path / "images"
    for i in range(3):
        jpeg(str(images / ("%03d.jpg" % i)), size=(64, 48))
    instances = {
        "images": [{"id": 100 + i, "file_name": "%03d.jpg" % i, "width": 64, "height": 48}
                   for i in range(3)],
        "categories": [{"id": 18, "name": "dog"}, {"id": 1, "name": "person"},
                       {"id": 3, "name": "car"}],
        "annotations": [
            {"id": 1, "image_id": 100, "category_id": 18, "bbox": [1, 2, 10, 20], "iscrowd": 0},
            {"id": 2, "image_id": 100, "category_id": 1, "bbox": [5, 5, 2.5, 3], "iscrowd": 1},
            {"id": 3, "image_id": 102, "category_id": 3, "bbox": [0, 0, 64, 48], "iscrowd": 0}]}
    (tmp_path / "instances.json").write_text(json.dumps(instances))
    (tmp_path / "captions.json").write_text(json.dumps({"annotations": [
        {"image_id": 101, "caption": "nothing here"}, {"image_id": 100, "caption": "a dog"}]}))
    return tmp_path / "instances.json", images


def test_coco_boxes_labels_iscrowd_captions(tmp_path):
    instances, images = coco_source(tmp_path)
    out = tmp_path / "a"
    run("pack", instances, out, "--images", images, "--captions", tmp_path / "captions.json",
        "-q", check=0)
    m = manifest(out)
    assert m["sample_count"] == 3  # the image without annotations is kept
    assert m["class_names"] == ["person", "car", "dog"]  # category ids 1, 3, 18 -> 0, 1, 2
    assert fields(out) == {"image": "image", "boxes": "boxes", "labels": "int64[*]",
                           "iscrowd": "int64[*]", "category_id": "int64[*]",
                           "image_id": "int64", "path": "str",
                           "captions": "json"}
    per = {f["name"]: f.get("per") for f in m["fields"]}
    assert per["labels"] == per["category_id"] == "boxes"
    got = samples(out, tmp_path)
    assert got[0]["boxes"] == [[1, 2, 11, 22], [5, 5, 7.5, 8]]
    assert got[0]["labels"] == [2, 0]
    assert got[0]["iscrowd"] == [0, 1]
    assert got[0]["category_id"] == [18, 1] and got[2]["category_id"] == [3]  # COCO's own ids
    assert got[1]["boxes"] == [] and got[1]["labels"] == []
    assert got[2]["labels"] == [1]
    assert [s["image_id"] for s in got] == [100, 101, 102]
    assert [s["captions"] for s in got] == [["a dog"], ["nothing here"], []]
    # The contact sheet draws boxes: an image without any memcpy'd from a null view (UBSan's
    # "null pointer passed as argument" in the sanitized run).
    run("inspect", out, "--grid", tmp_path / "g.png", "--size", "32", check=0)
    assert Image.open(tmp_path / "g.png").size[0] > 32


def test_coco_size_that_is_not_whole_pixels_is_refused_and_an_unknown_frame_is_noted(tmp_path):
    # A "width"/"height" that was a string, 100.5, 0 or -1 was taken as "not declared": the
    # upright boxes of an EXIF-turned photo were then turned a second time, without a word.
    images = tmp_path / "images"
    images.mkdir()
    exif = Image.Exif()
    exif[0x0112] = 6  # stored 64 x 48, shown upright 48 x 64
    Image.new("RGB", (64, 48), (200, 30, 30)).save(images / "t.jpg", "JPEG", exif=exif)
    base = {"categories": [{"id": 1, "name": "r"}],
            "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [4, 8, 10, 20]}]}
    for w, h in (("48", 64), (48.5, 64), (0, 64), (-1, 64), (48, None)):
        image = {"id": 1, "file_name": "t.jpg", "width": w, "height": h}
        if h is None:
            del image["height"]
        (tmp_path / "c.json").write_text(json.dumps(dict(base, images=[image])))
        p = run("pack", tmp_path / "c.json", tmp_path / "a", "--images", images, "-q")
        assert p.returncode == 1, (w, h, p.stderr)
        assert "images[0]" in p.stderr and '"width"' in p.stderr, p.stderr
        assert not (tmp_path / "a").exists()
    # Upright size: the boxes are turned into the stored frame, without a note.
    (tmp_path / "c.json").write_text(json.dumps(dict(base, images=[
        {"id": 1, "file_name": "t.jpg", "width": 48, "height": 64}])))
    p = run("pack", tmp_path / "c.json", tmp_path / "b", "--images", images, check=0)
    assert "note:" not in p.stderr, p.stderr
    # No size given (absent, null or 0 x 0: how exporters write an unknown one): the frame
    # cannot be told, and the pack says what it assumed, counting the images with boxes only
    # (a reused worker slot counted images without boxes too, more with fewer workers).
    many = [{"id": k, "file_name": "t.jpg", "width": [0, None][k % 2], "height": [0, None][k % 2]}
            for k in range(1, 13)]
    (tmp_path / "c.json").write_text(json.dumps(dict(base, images=many)))
    for workers in ("1", "3"):
        p = run("pack", tmp_path / "c.json", tmp_path / ("c" + workers), "--images", images,
                "--workers", workers, check=0)
        assert "note: 1 samples with boxes have an EXIF orientation" in p.stderr, p.stderr
        assert "images[0] (t.jpg)" in p.stderr and "stored pixels" in p.stderr, p.stderr
    # A size that is no size on an image without boxes does not matter: packed.
    (tmp_path / "c.json").write_text(json.dumps(dict(base, annotations=[], images=[
        {"id": 1, "file_name": "t.jpg", "width": "?", "height": -1}])))
    run("pack", tmp_path / "c.json", tmp_path / "d", "--images", images, "-q", check=0)


def test_coco_shapes_that_were_read_silently(tmp_path):
    # Each of these packed with exit 0 and lost or changed something without a word.
    instances, images = coco_source(tmp_path)
    good = json.loads(instances.read_text())

    def pack(data, *check):
        instances.write_text(json.dumps(data))
        shutil.rmtree(tmp_path / "a", ignore_errors=True)
        return run("pack", instances, tmp_path / "a", "--images", images, *check)

    p = pack(dict(good, annotations=5))  # was: no boxes at all
    assert p.returncode == 1 and '"annotations" is number, not a list' in p.stderr, p.stderr
    cats = [dict(c) for c in good["categories"]]
    cats[0]["name"] = {"en": "dog"}  # was: the class name "18"
    p = pack(dict(good, categories=cats))
    assert p.returncode == 1 and "categories[0]" in p.stderr and '"name"' in p.stderr, p.stderr
    bad = dict(good, images=[dict(i) for i in good["images"]])
    bad["images"][0]["file_name"] = "000.jpg\u0000x"  # was: 000.jpg read, the NUL stored
    p = pack(bad)
    assert p.returncode == 1 and "images[0]" in p.stderr and "NUL" in p.stderr, p.stderr
    # A repeated category name: class names are unique (the Writer refuses a repeat, extract
    # merged them into one folder), so the later one gets its id; said in a note.
    cats = [{"id": 18, "name": "dog"}, {"id": 1, "name": "person"}, {"id": 3, "name": "dog"},
            {"id": 7}, {"id": 2, "name": "dog (id 18)"}]
    anns = [dict(a) for a in good["annotations"]]
    for a in anns:
        a["segmentation"] = [[0, 0, 1, 1, 2, 2]]
    p = pack(dict(good, categories=cats, annotations=anns))
    assert p.returncode == 0, p.stderr
    # Made unique against every name, an added one included ("dog (id 18)" is id 2's own).
    assert manifest(tmp_path / "a")["class_names"] == ["person", "dog (id 18)", "dog", "7",
                                                       "dog (id 18, 2)"]
    assert "1 categories repeat an earlier category's name" in p.stderr, p.stderr
    assert "1 categories have no \"name\"" in p.stderr, p.stderr
    assert '3 annotations with a "segmentation"' in p.stderr, p.stderr


def test_inspect_of_a_coco_archive_has_no_class_rows_or_counts(tmp_path):
    # Its class names are the boxes' categories; no sample has a class. The contact sheet put
    # every sample in the first category's row, and inspect counted 0 per category.
    instances, images = coco_source(tmp_path)
    run("pack", instances, tmp_path / "a", "--images", images, "-q", check=0)
    info = json.loads(run("inspect", tmp_path / "a", "--json", check=0).stdout)
    assert [c["name"] for c in info["classes"]] == ["person", "car", "dog"]
    assert [c["count"] for c in info["classes"]] == [None, None, None]
    text = run("inspect", tmp_path / "a", check=0).stdout
    assert "classes:     3 (names of per-box labels; no class field)" in text, text
    heights = []
    for per in (3, 1):  # rows of 3 samples: one row; of 1: three (class rows: three both times)
        sheet = tmp_path / ("g%d.png" % per)
        run("inspect", tmp_path / "a", "--grid", sheet, "--per-class", per, "--size", "32",
            check=0)
        heights.append(Image.open(sheet).size[1])
    assert heights[0] < heights[1], heights


def test_a_caption_says_which_of_its_parts_is_wrong(tmp_path):
    # One message ("no caption text for a known image_id") stood for both an image_id that is
    # not an image and a caption that is not text.
    instances, images = coco_source(tmp_path)
    for entry, says in (({"image_id": 424242, "caption": "x"}, "image_id 424242 is not among"),
                        ({"image_id": 100, "caption": 5}, '"caption" is not text'),
                        ({"caption": "x"}, 'no integer "image_id"')):
        (tmp_path / "c.json").write_text(json.dumps({"annotations": [entry]}))
        p = run("pack", instances, tmp_path / "a", "--images", images, "--captions",
                tmp_path / "c.json")
        assert p.returncode == 1 and "annotations[0]" in p.stderr and says in p.stderr, p.stderr


def test_csv_numbers_with_leading_zeros_stay_text(tmp_path):
    # 01234 (a postcode, an id) became the int 1234: its zeros were lost without a note.
    jpeg(tmp_path / "a.jpg")
    (tmp_path / "c.csv").write_text("image,zip,n,neg\na.jpg,01234,0,-007\na.jpg,00501,10,5\n")
    run("pack", tmp_path / "c.csv", tmp_path / "a", "-q", check=0)
    assert {k: v for k, v in fields(tmp_path / "a").items() if k in ("zip", "n")} == {
        "zip": "str", "n": "int64"}
    got = samples(tmp_path / "a", tmp_path)
    assert [s["zip"] for s in got] == ["01234", "00501"] and [s["n"] for s in got] == [0, 10]
    assert [s["neg"] for s in got] == ["-007", "5"]


def test_extract_of_a_coco_archive_puts_a_taken_name_under_samples(tmp_path):
    # Two images of one file name: the second fell back to a folder named after the first box
    # category ("person/"), though no sample has a class.
    instances, images = coco_source(tmp_path)
    data = json.loads(instances.read_text())
    data["images"][1]["file_name"] = data["images"][0]["file_name"]
    instances.write_text(json.dumps(data))
    run("pack", instances, tmp_path / "a", "--images", images, "-q", check=0)
    run("extract", tmp_path / "a", tmp_path / "x", "-q", check=0)
    rows = [json.loads(line) for line in
            (tmp_path / "x" / "samples.jsonl").read_text().splitlines()]
    assert [r["image"] for r in rows] == ["000.jpg", "samples/00000001.jpg", "002.jpg"], rows


def test_coco_needs_images_and_names_a_bad_annotation(tmp_path):
    instances, images = coco_source(tmp_path)
    p = run("pack", instances, tmp_path / "a", "-q", check=2)
    assert "--images" in p.stderr
    data = json.loads(instances.read_text())
    data["annotations"][1]["bbox"] = [1, 2, 3]
    instances.write_text(json.dumps(data))
    p = run("pack", "--from", "coco", instances, tmp_path / "a", "--images", images, "-q", check=1)
    assert "annotations[1]" in p.stderr and "field 'boxes'" in p.stderr, p.stderr


def add_member(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def test_webdataset_members_become_fields_read_in_place(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    expected = []
    for shard in range(2):
        with tarfile.open(shards / ("train-%05d.tar" % shard), "w",
                          format=tarfile.GNU_FORMAT) as tar:
            for i in range(3):
                key = "sample%d%d" % (shard, i)
                b = io.BytesIO()
                Image.new("RGB", (20 + i, 10), (i * 50, 0, 0)).save(b, "JPEG")
                add_member(tar, key + ".jpg", b.getvalue())
                add_member(tar, key + ".cls", b"%d\n" % (i % 2))
                add_member(tar, key + ".txt", ("caption %s" % key).encode())
                add_member(tar, key + ".json", json.dumps({"k": key}).encode())
                add_member(tar, key + ".seg.bin", bytes([shard, i, 255]))
                expected.append((key, i % 2))
    out = tmp_path / "a"
    run("pack", shards, out, "-q", check=0)
    m = manifest(out)
    assert m["sample_count"] == 6 and m["options"]["source"] == "webdataset"
    assert fields(out) == {"image": "image", "label": "int64", "txt": "str", "json": "json",
                           "seg_bin": "bytes", "key": "str"}
    got = samples(out, tmp_path)
    assert [(s["key"], s["label"]) for s in got] == expected
    assert [s["txt"] for s in got] == ["caption " + k for k, _ in expected]
    assert got[4]["seg_bin"] == {"base64": "AQH/"}  # bytes 1, 1, 255
    assert got[4]["json"] == {"k": "sample11"}


def test_webdataset_sample_without_image_is_an_error_naming_the_key(tmp_path):
    with tarfile.open(tmp_path / "a.tar", "w") as tar:
        b = io.BytesIO()
        Image.new("RGB", (8, 8)).save(b, "PNG")
        add_member(tar, "x.png", b.getvalue())
        add_member(tar, "x.txt", b"an image")
        add_member(tar, "y.txt", b"no image")
    p = run("pack", tmp_path / "a.tar", tmp_path / "out", "-q", check=1)
    assert "a.tar:y" in p.stderr and "field 'image'" in p.stderr, p.stderr
    run("pack", tmp_path / "a.tar", tmp_path / "out", "--skip-bad", "-q", check=0)
    assert manifest(tmp_path / "out")["sample_count"] == 1



def test_webdataset_member_or_key_given_twice_is_said(tmp_path):
    # A key seen again later read as "missing (no .cls member)"; a member given twice in a row
    # lost its second copy without a word.
    b = io.BytesIO()
    Image.new("RGB", (8, 8)).save(b, "PNG")
    png = b.getvalue()
    for name, members, says in (
            ("again", [("a.png", png), ("a.cls", b"0"), ("b.png", png), ("b.cls", b"1"),
                       ("a.png", png), ("a.cls", b"1")],
             "key 'a' again (member a.png): it was a sample already"),
            ("twice", [("a.png", png), ("a.cls", b"0"), ("a.cls", b"1"), ("b.png", png),
                       ("b.cls", b"1")], "member a.cls given twice")):
        with tarfile.open(tmp_path / (name + ".tar"), "w") as tar:
            for member, data in members:
                add_member(tar, member, data)
        p = run("pack", tmp_path / (name + ".tar"), tmp_path / name, "-q", check=1)
        assert name + ".tar:a" in p.stderr and says in p.stderr, p.stderr


def test_webdataset_json_member_that_does_not_parse_is_bad_data(tmp_path):
    # REGRESSION (found by a stranger's test): a .json member holding `{bad` was stored as the
    # JSON string "{bad" (exit 0, verify OK), as a CSV cell that is not JSON text is; a member is
    # a JSON document, so it is now an error naming the tar, key and member, with the reason.
    with tarfile.open(tmp_path / "a.tar", "w") as tar:
        for key, doc in (("good", b'{"k": 1}'), ("list", b"[1, 2]\n"), ("bad", b"{bad")):
            b = io.BytesIO()
            Image.new("RGB", (8, 8)).save(b, "PNG")
            add_member(tar, key + ".png", b.getvalue())
            add_member(tar, key + ".json", doc)
    p = run("pack", tmp_path / "a.tar", tmp_path / "out", "-q", check=1)
    assert "a.tar:bad: field 'json': member bad.json is not valid JSON: parse error at line 1, " \
           "column 2" in p.stderr, p.stderr
    run("pack", tmp_path / "a.tar", tmp_path / "out", "--skip-bad", "-q", check=0)
    got = samples(tmp_path / "out", tmp_path)
    assert [s["json"] for s in got] == [{"k": 1}, [1, 2]]


def test_json_that_does_not_parse_is_refused_saying_where_and_why(tmp_path):
    # REGRESSION (found by a stranger's test): a COCO file that is not JSON said only "not valid
    # JSON", with no line, column or reason, and JSONL lines named the line only. Python's
    # json.dump writes NaN by default (pycocotools loads it): that gets a hint.
    instances, images = coco_source(tmp_path)
    text = instances.read_text().replace('"iscrowd": 1', '"iscrowd": 1, "area": NaN')
    instances.write_text(text)
    p = run("pack", instances, tmp_path / "a", "--images", images, "-q", check=1)
    assert "instances.json: not valid JSON: parse error at line 1, column" in p.stderr, p.stderr
    assert "NaN and Infinity are not JSON" in p.stderr and "allow_nan=False" in p.stderr
    jpeg(str(tmp_path / "0.jpg"))
    rows = tmp_path / "d.jsonl"
    rows.write_text('{"image": "0.jpg", "w": 1}\n{"image": "0.jpg", "w": }\n')
    p = run("pack", rows, tmp_path / "b", "-q", check=1)
    assert "d.jsonl:2: not valid JSON: parse error at line 1, column 25: syntax error" in p.stderr
    assert "NaN" not in p.stderr, p.stderr

def test_webdataset_links_to_files_in_the_tar_are_followed_and_others_reported(tmp_path):
    # Hard links (to an earlier member) and symbolic links (relative to their folder) that name a
    # file of the same tar read that file's bytes; a link out of the tar, and a member that is
    # not a file, are listed in the report with the reason (they used to vanish unreported,
    # taking a whole sample of hard links with them).
    def jpg(color):
        b = io.BytesIO()
        Image.new("RGB", (12, 8), color).save(b, "JPEG")
        return b.getvalue()

    def link(tar, name, target, kind):
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, target
        tar.addfile(info)

    with tarfile.open(tmp_path / "a.tar", "w", format=tarfile.GNU_FORMAT) as tar:
        add_member(tar, "s0.jpg", jpg((200, 0, 0)))
        add_member(tar, "s0.cls", b"0")
        add_member(tar, "s0.txt", b"zero")
        add_member(tar, "s1.jpg", jpg((0, 200, 0)))
        add_member(tar, "s1.cls", b"1")
        link(tar, "s1.txt", "s0.txt", tarfile.SYMTYPE)
        link(tar, "s2.jpg", "s1.jpg", tarfile.LNKTYPE)
        link(tar, "s2.cls", "s1.cls", tarfile.LNKTYPE)
        add_member(tar, "s2.txt", b"two")
        add_member(tar, "sub/s3.jpg", jpg((0, 0, 200)))
        add_member(tar, "sub/s3.cls", b"0")
        link(tar, "sub/s3.txt", "../s0.txt", tarfile.SYMTYPE)
        link(tar, "s4.jpg", "../outside.jpg", tarfile.SYMTYPE)
        add_member(tar, "s4.cls", b"1")
        add_member(tar, "s4.txt", b"four")
        pipe = tarfile.TarInfo("s5.jpg")
        pipe.type = tarfile.FIFOTYPE
        tar.addfile(pipe)
        link(tar, "loop.jpg", "loop.jpg", tarfile.SYMTYPE)  # a cycle: followed 40 times at most
        # A member with an absolute name (tar -P): a link out of the tar must not find it.
        add_member(tar, "/abs/s9.txt", b"not an image")
    out, report = tmp_path / "out", tmp_path / "report.json"
    p = run("pack", tmp_path / "a.tar", out, "-q", check=1)
    assert "a.tar:s4" in p.stderr and "field 'image'" in p.stderr, p.stderr
    run("pack", tmp_path / "a.tar", out, "--skip-bad", "--report", report, "-q", check=0)
    got = samples(out, tmp_path)
    assert [(s["key"], s["label"], s["txt"]) for s in got] == [
        ("s0", 0, "zero"), ("s1", 1, "zero"), ("s2", 1, "two"), ("sub/s3", 0, "zero")]
    ignored = {i["path"].split(":")[-1]: i["reason"] for i in json.loads(report.read_text())["ignored"]}
    assert "symbolic link to ../outside.jpg" in ignored["s4.jpg"], ignored
    assert "not a regular file" in ignored["s5.jpg"], ignored
    assert "symbolic link to loop.jpg" in ignored["loop.jpg"], ignored
    extracted = tmp_path / "x"
    run("extract", out, extracted, "-q", check=0)
    images = {f: open(os.path.join(d, f), "rb").read()
              for d, _, files in os.walk(extracted) for f in files if f.endswith(".jpg")}
    # Samples 1 and 2 hold s1's bytes (s2.jpg is a hard link to it), byte for byte.
    assert images["00000001.jpg"] == images["00000002.jpg"] == jpg((0, 200, 0)), sorted(images)
    assert images["00000003.jpg"] == jpg((0, 0, 200))


def test_mxnet_list_with_several_labels_keeps_them_all(tmp_path):
    cats = sorted(f for f in os.listdir(os.path.join(GOOD, "cat")) if not f.startswith("."))
    lst = tmp_path / "multi.lst"
    lst.write_text("0\t1\t0\tcat/%s\n1\t3\tcat/%s\n2\t2\t5\t7\tcat/%s\n" % tuple(cats[:3]))
    out = tmp_path / "a"
    run("pack", GOOD, out, "--list", lst, "-q", check=0)
    assert fields(out) == {"image": "image", "labels": "int64[*]", "path": "str"}
    got = samples(out, tmp_path)
    assert [s["labels"] for s in got] == [[1, 0], [3], [2, 5, 7]]
    assert [s["path"] for s in got] == ["cat/" + c for c in cats[:3]]


def test_folder_pack_stores_each_files_path_relative_to_src(tmp_path):
    out = tmp_path / "a"
    run("pack", GOOD, out, "--shuffle", "--seed", "3", "--encoding", "jpeg", "-q", check=0)
    assert fields(out) == {"image": "image", "label": "int64", "path": "str"}
    # extract writes each record at its path field: the source tree comes back, byte for byte
    # for the JPEGs, although the archive is shuffled.
    x = tmp_path / "x"
    run("extract", out, x, "-q", check=0)
    extracted = sorted(os.path.relpath(os.path.join(d, f), x)
                       for d, _, files in os.walk(x) for f in files)
    source = sorted(os.path.relpath(os.path.join(d, f), GOOD)
                    for d, _, files in os.walk(GOOD) for f in files if not f.startswith("."))
    assert [os.path.splitext(p)[0] for p in extracted] == [os.path.splitext(p)[0] for p in source]
    for rel in extracted:
        if rel.endswith(".jpg") and rel in source:
            assert (x / rel).read_bytes() == open(os.path.join(GOOD, rel), "rb").read()
    if PYTHONPATH:
        p = subprocess.run([sys.executable, "-c", READ, str(out)], capture_output=True,
                           text=True, env=dict(os.environ, PYTHONPATH=PYTHONPATH), timeout=120)
        if p.returncode == 0:
            classes = manifest(out)["class_names"]
            got = json.loads(p.stdout)
            assert [classes[s["label"]] for s in got] == [s["path"].split("/")[0] for s in got]
            assert sorted(s["path"] for s in got) != [s["path"] for s in got]  # shuffled


def test_unrecognised_source_asks_for_from(tmp_path):
    (tmp_path / "x.json").write_text('{"a": 1}')
    p = run("pack", tmp_path / "x.json", tmp_path / "out", "-q", check=2)
    assert "--from" in p.stderr
    p = run("pack", tmp_path / "x.json", tmp_path / "out", "--from", "nonsense", "-q", check=2)
    assert "folder|list|jsonl|csv|coco|webdataset|parquet" in p.stderr


def test_parquet_is_run_by_the_python_package_or_explained(tmp_path):
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    p = run("pack", tmp_path / "d.parquet", tmp_path / "out", "-q")
    if p.returncode == 3 and "pyarrow" in p.stderr:
        return  # no package or no pyarrow: said clearly
    # The Python importer ran (and refused this 4-byte file as the bad parquet it is).
    assert p.returncode != 0
    assert "Traceback" not in p.stderr or "parquet" in p.stderr
    # A package the import needs that is broken: its own error is said (any failure read as
    # "needs pyarrow").
    (tmp_path / "py" / "pyarrow").mkdir(parents=True)
    (tmp_path / "py" / "pyarrow" / "__init__.py").write_text("raise ImportError('broken here')")
    p = subprocess.run([CLI, "pack", str(tmp_path / "d.parquet"), str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(tmp_path / "py")))
    assert p.returncode == 3, p.stderr
    assert "the import failed: ImportError: broken here" in p.stderr, p.stderr


def test_a_damaged_tar_is_an_error_naming_the_file_and_offset(tmp_path):
    with tarfile.open(tmp_path / "a.tar", "w") as tar:
        b = io.BytesIO()
        Image.new("RGB", (8, 8)).save(b, "PNG")
        add_member(tar, "x.png", b.getvalue())
        add_member(tar, "y.png", b.getvalue())
    data = bytearray((tmp_path / "a.tar").read_bytes())
    data[1024 + 100] ^= 0xFF  # y.png's header (after x.png's header and one data block)
    (tmp_path / "a.tar").write_bytes(bytes(data))
    p = run("pack", tmp_path / "a.tar", tmp_path / "out", "-q", check=1)
    assert "a.tar: byte 1024: not a tar header" in p.stderr, p.stderr
    (tmp_path / "b.tar").write_bytes(bytes(data[:540]))  # x.png (69 bytes) cut short
    p = run("pack", tmp_path / "b.tar", tmp_path / "out", "-q", check=1)
    assert "b.tar: byte 0" in p.stderr and "past the end" in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def test_extract_then_pack_round_trips_bytes_fields(tmp_path):
    # extract writes a bytes field as {"base64": ...} in samples.jsonl; the JSONL importer takes
    # that form back (before: "expected a string, got object"), so extract + pack --schema
    # round-trips it.
    jpeg(tmp_path / "a.jpg")
    (tmp_path / "m.jsonl").write_text(json.dumps({"image": "a.jpg", "raw": "x", "n": 3}) + "\n")
    (tmp_path / "s.json").write_text(json.dumps({"image": "image", "raw": "bytes", "n": "int64"}))
    run("pack", tmp_path / "m.jsonl", tmp_path / "a.sf", "--schema", tmp_path / "s.json", "-q",
        check=0)
    line = {"image": "a.jpg", "raw": {"base64": "AAD/"}, "n": 3}
    (tmp_path / "b.jsonl").write_text(json.dumps(line) + "\n")
    run("pack", tmp_path / "b.jsonl", tmp_path / "b.sf", "--schema", tmp_path / "s.json", "-q",
        check=0)
    got = samples(tmp_path / "b.sf", tmp_path)
    assert got[0]["raw"] == {"base64": "AAD/"}, got
    bad = dict(line, raw={"base64": "A*D/"})
    (tmp_path / "c.jsonl").write_text(json.dumps(bad) + "\n")
    p = run("pack", tmp_path / "c.jsonl", tmp_path / "c.sf", "--schema", tmp_path / "s.json", "-q")
    assert p.returncode == 1 and "base64" in p.stderr and "'raw'" in p.stderr, p.stderr


def test_extract_then_pack_round_trips_nan_and_infinities(tmp_path):
    # extract wrote NaN and +-inf as null (JSON has no such numbers): a scalar -inf came back
    # NaN, and a NaN in a list failed the re-pack. They are now the texts "NaN", "Infinity",
    # "-Infinity", which the importer reads (also "nan", "inf", "-inf" in any case) for float
    # fields, JSONL and CSV.
    jpeg(tmp_path / "a.jpg")
    schema = {"image": "image", "d": "float64", "f": "float32", "v": "float32[*]",
              "h": "float16[*]", "w": "float64[*,2]"}
    (tmp_path / "s.json").write_text(json.dumps(schema))
    row = {"image": "a.jpg", "d": "-inf", "f": "NaN", "v": [1.5, "nan", "INF", "-Infinity"],
           "h": ["Infinity", 2], "w": [[1, "-inf"]]}
    (tmp_path / "m.jsonl").write_text(json.dumps(row) + "\n")
    run("pack", tmp_path / "m.jsonl", tmp_path / "a", "--schema", tmp_path / "s.json", "-q",
        check=0)
    run("extract", tmp_path / "a", tmp_path / "x", "-q", check=0)
    first = json.loads((tmp_path / "x" / "samples.jsonl").read_text())
    want = {"d": "-Infinity", "f": "NaN", "v": [1.5, "NaN", "Infinity", "-Infinity"],
            "h": ["Infinity", 2.0], "w": [[1.0, "-Infinity"]]}
    assert {k: first[k] for k in want} == want, first
    run("pack", tmp_path / "x" / "samples.jsonl", tmp_path / "b", "--schema",
        tmp_path / "x" / "schema.json", "-q", check=0)
    run("extract", tmp_path / "b", tmp_path / "y", "-q", check=0)
    again = json.loads((tmp_path / "y" / "samples.jsonl").read_text())
    assert {k: again[k] for k in want} == want, again
    # A CSV cell too; text that is not a number is still refused, as is "inf" for an int64.
    (tmp_path / "c.csv").write_text("image,d\na.jpg,-Infinity\n")
    (tmp_path / "c.json").write_text(json.dumps({"image": "image", "d": "float64"}))
    run("pack", tmp_path / "c.csv", tmp_path / "c", "--schema", tmp_path / "c.json", "-q",
        check=0)
    run("extract", tmp_path / "c", tmp_path / "z", "-q", check=0)
    assert json.loads((tmp_path / "z" / "samples.jsonl").read_text())["d"] == "-Infinity"
    for bad in ('"infinite"', '"-inf"'):
        (tmp_path / "n.jsonl").write_text('{"image": "a.jpg", "n": %s}\n' % bad)
        (tmp_path / "n.json").write_text(json.dumps({"image": "image", "n": "float64" if
                                                     bad == '"infinite"' else "int64"}))
        p = run("pack", tmp_path / "n.jsonl", tmp_path / "n", "--schema", tmp_path / "n.json",
                "-q")
        assert p.returncode == 1 and "field 'n'" in p.stderr, p.stderr


def test_a_float_list_float32_would_round_is_inferred_float64(tmp_path):
    # Lists of floats were always float32[*]: timestamps and coordinates came back rounded
    # (1700000000.5 as 1700000000.0), without a note. float32 is kept where it holds every
    # value as written (at most 6 significant digits, or exact).
    jpeg(tmp_path / "a.jpg")
    rows = [{"image": "a.jpg", "t": [1700000000.5, 1.0], "geo": [[37.123456789, -122.5]],
             "emb": [0.1, 0.25, -3.5], "rows": [[0.5, 1]], "big": [2.5, 16777217],
             "tiny": [1.5e-40, 0.5]}]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run("pack", tmp_path / "m.jsonl", tmp_path / "a", "-q", check=0)
    assert {k: v for k, v in fields(tmp_path / "a").items() if k in rows[0]} == {
        "image": "image", "t": "float64[*]", "geo": "float64[*,2]", "emb": "float32[*]",
        "rows": "float32[*,2]", "big": "float64[*]", "tiny": "float64[*]"}  # subnormal in f32
    run("extract", tmp_path / "a", tmp_path / "x", "-q", check=0)
    got = json.loads((tmp_path / "x" / "samples.jsonl").read_text())
    assert got["t"] == [1700000000.5, 1.0] and got["geo"] == [[37.123456789, -122.5]]
    assert got["big"] == [2.5, 16777217.0] and got["tiny"] == [1.5e-40, 0.5]


def test_class_names_file_and_the_extract_round_trip_keeps_class_names(tmp_path):
    # extract wrote class ids and no names: a re-pack named the classes "0".."max" (CSV's
    # cat/dog, COCO's categories). extract now writes class_names.json, and pack takes it.
    jpeg(tmp_path / "a.jpg")
    (tmp_path / "c.csv").write_text("image,label,n\na.jpg,cat,1\na.jpg,dog,2\na.jpg,cat,3\n")
    run("pack", tmp_path / "c.csv", tmp_path / "a", "-q", check=0)
    run("extract", tmp_path / "a", tmp_path / "x", "-q", check=0)
    x = tmp_path / "x"
    assert json.loads((x / "class_names.json").read_text()) == ["cat", "dog"]
    run("pack", x / "samples.jsonl", tmp_path / "b", "--schema", x / "schema.json",
        "--class-names", x / "class_names.json", "-q", check=0)
    assert manifest(tmp_path / "b")["class_names"] == ["cat", "dog"]
    assert [s["label"] for s in samples(tmp_path / "b", tmp_path)] == [0, 1, 0]
    # A names file (one per line) orders string labels: dog is class 0 here.
    (tmp_path / "n.txt").write_text("dog\r\ncat\r\n\n")
    run("pack", tmp_path / "c.csv", tmp_path / "c", "--class-names", tmp_path / "n.txt", "-q",
        check=0)
    assert manifest(tmp_path / "c")["class_names"] == ["dog", "cat"]
    assert [s["label"] for s in samples(tmp_path / "c", tmp_path)] == [1, 0, 1]
    # A label the file does not list, an id past its names, repeats: refused, saying which.
    (tmp_path / "one.txt").write_text("dog\n")
    p = run("pack", tmp_path / "c.csv", tmp_path / "d", "--class-names", tmp_path / "one.txt")
    assert p.returncode == 1 and "c.csv:2" in p.stderr and "'cat' is not in" in p.stderr
    (tmp_path / "i.csv").write_text("image,label\na.jpg,0\na.jpg,2\n")
    p = run("pack", tmp_path / "i.csv", tmp_path / "d", "--class-names", tmp_path / "n.txt")
    assert p.returncode == 1 and "i.csv:3" in p.stderr and "class id 2" in p.stderr, p.stderr
    # An empty name: a JSON list may give it (an archive may have one: a COCO category ""),
    # a blank line is taken for a mistake; more names than an archive may have is refused.
    (tmp_path / "e.json").write_text('["", "x", "y"]')
    run("pack", tmp_path / "i.csv", tmp_path / "ee", "--class-names", tmp_path / "e.json", "-q",
        check=0)
    assert manifest(tmp_path / "ee")["class_names"] == ["", "x", "y"]
    (tmp_path / "blank.txt").write_text("a\n\nb\n")
    p = run("pack", tmp_path / "i.csv", tmp_path / "d", "--class-names", tmp_path / "blank.txt")
    assert p.returncode == 2 and "line 2 is empty" in p.stderr, p.stderr
    (tmp_path / "many.txt").write_text("".join("c%d\n" % k for k in range(4194305)))
    p = run("pack", tmp_path / "i.csv", tmp_path / "d", "--class-names", tmp_path / "many.txt")
    assert p.returncode == 2 and "at most 4194304 classes" in p.stderr, p.stderr
    (tmp_path / "twice.json").write_text('["a", "b", "a"]')
    p = run("pack", tmp_path / "i.csv", tmp_path / "d", "--class-names", tmp_path / "twice.json")
    assert p.returncode == 2 and "'a' is given twice" in p.stderr, p.stderr
    assert not (tmp_path / "d").exists()
    # COCO: its categories are the class names (of the boxes' labels); they round-trip too.
    instances, images = coco_source(tmp_path)
    run("pack", instances, tmp_path / "e", "--images", images, "-q", check=0)
    p = run("pack", instances, tmp_path / "f", "--images", images, "--class-names",
            tmp_path / "n.txt")
    assert p.returncode == 2 and "coco" in p.stderr, p.stderr
    run("extract", tmp_path / "e", tmp_path / "y", "-q", check=0)
    y = tmp_path / "y"
    run("pack", y / "samples.jsonl", tmp_path / "g", "--schema", y / "schema.json",
        "--class-names", y / "class_names.json", "-q", check=0)
    assert manifest(tmp_path / "g")["class_names"] == ["person", "car", "dog"]
    # ... and their per-box labels are checked against the names given, as class ids are.
    (tmp_path / "two.json").write_text('["person", "car"]')
    p = run("pack", y / "samples.jsonl", tmp_path / "h", "--schema", y / "schema.json",
            "--class-names", tmp_path / "two.json")
    assert p.returncode == 1 and "field 'labels': label 2 is not below the 2 names" in p.stderr
    # A names file whose first line starts with '[' (not JSON), with a BOM and CRLF: lines.
    (tmp_path / "b.txt").write_bytes("\ufeff[bg]\r\ncat\r\ndog\r\n".encode())
    run("pack", tmp_path / "c.csv", tmp_path / "k", "--class-names", tmp_path / "b.txt", "-q",
        check=0)
    assert manifest(tmp_path / "k")["class_names"] == ["[bg]", "cat", "dog"]
    assert [s["label"] for s in samples(tmp_path / "k", tmp_path)] == [1, 2, 1]
    p = run("pack", tmp_path / "c.csv", tmp_path / "m", "--class-names", tmp_path)
    assert p.returncode == 2 and "is a directory" in p.stderr, p.stderr
    # JSONL string labels "0", "1" are names (looked up), not ids.
    (tmp_path / "s.jsonl").write_text('{"image": "a.jpg", "label": "1"}\n'
                                      '{"image": "a.jpg", "label": "0"}\n')
    (tmp_path / "01.json").write_text('["1", "0"]')
    run("pack", tmp_path / "s.jsonl", tmp_path / "n", "--class-names", tmp_path / "01.json", "-q",
        check=0)
    assert [s["label"] for s in samples(tmp_path / "n", tmp_path)] == [0, 1]


def test_numbers_are_read_as_json_writes_them_and_kept_or_refused(tmp_path):
    # Found by a stranger's test, each silently stored: 1e39 as inf in float32 (70000 in
    # float16); CSV "0x1F" as 31.0 and "+4912345678" (a phone number) as an int; "a b" and a_b
    # columns swapped their values; 1e400 failed with the JSON library's text and no line.
    jpeg(tmp_path / "a.jpg")
    (tmp_path / "s.json").write_text(json.dumps({"image": "image", "x": "float32",
                                                 "h": "float16[*]"}))
    for row, says in (({"x": 1e39, "h": [1]}, "1e+39 is outside float32's range"),
                      ({"x": 1, "h": [70000]}, "70000 is outside float16's range")):
        (tmp_path / "m.jsonl").write_text(json.dumps(dict(row, image="a.jpg")) + "\n")
        p = run("pack", tmp_path / "m.jsonl", tmp_path / "o", "--schema", tmp_path / "s.json")
        assert p.returncode == 1 and "m.jsonl:1" in p.stderr and says in p.stderr, p.stderr
    (tmp_path / "c.csv").write_text("image,color,phone,lead,n\na.jpg,0x1F,+4912345678, 5,7\n")
    run("pack", tmp_path / "c.csv", tmp_path / "c", "-q", check=0)
    assert {k: v for k, v in fields(tmp_path / "c").items() if k != "path"} == {
        "image": "image", "color": "str", "phone": "str", "lead": "str", "n": "int64"}
    got = samples(tmp_path / "c", tmp_path)[0]
    assert (got["color"], got["phone"], got["lead"], got["n"]) == ("0x1F", "+4912345678", " 5", 7)
    (tmp_path / "d.jsonl").write_text(json.dumps({"image": "a.jpg", "a b": 1, "a_b": 2}) + "\n")
    p = run("pack", tmp_path / "d.jsonl", tmp_path / "d", check=0)
    assert "column 'a b' stored as field 'a_b_2'" in p.stderr, p.stderr
    got = samples(tmp_path / "d", tmp_path)[0]
    assert (got["a_b"], got["a_b_2"]) == (2, 1)
    # A field --schema declares numeric still reads "+5", ".5" and " 5" (review: they were
    # refused, "+5" as "does not fit int64"); float32's largest as numpy prints it is kept.
    (tmp_path / "k.csv").write_text("image,i,f\na.jpg,+5,.5\na.jpg, 6,3.4028235e+38\n")
    (tmp_path / "k.json").write_text(json.dumps({"image": "image", "i": "int64", "f": "float32"}))
    run("pack", tmp_path / "k.csv", tmp_path / "k", "--schema", tmp_path / "k.json", "-q",
        check=0)
    got = samples(tmp_path / "k", tmp_path)
    assert [(s["i"], s["f"]) for s in got] == [(5, 0.5), (6, 3.4028234663852886e+38)], got
    # A 20-digit id no int64 holds is text (every row failed the pack as int64); "-0" keeps
    # its sign in a float field.
    (tmp_path / "z.csv").write_text("image,id,f\na.jpg,12345678901234567890,-0\na.jpg,7,1.5\n")
    run("pack", tmp_path / "z.csv", tmp_path / "z", "-q", check=0)
    assert fields(tmp_path / "z")["id"] == "str"
    got = samples(tmp_path / "z", tmp_path)
    assert [s["id"] for s in got] == ["12345678901234567890", "7"]
    assert got[0]["f"] == 0 and math.copysign(1, got[0]["f"]) == -1, got
    # A header byte of another encoding (Latin-1 "\xb0") is a character: temp_C, not tempC.
    (tmp_path / "l.csv").write_bytes(b"image,temp\xb0C,na\xc3\xafve\na.jpg,1,2\n")
    run("pack", tmp_path / "l.csv", tmp_path / "l", "-q", check=0)
    assert {"temp_C", "na_ve"} <= set(fields(tmp_path / "l")), fields(tmp_path / "l")
    (tmp_path / "n.jsonl").write_text('{"image": "a.jpg", "x": 1}\n{"image": "a.jpg", "x": 1e400}\n')
    p = run("pack", tmp_path / "n.jsonl", tmp_path / "n")
    assert p.returncode == 1 and "n.jsonl:2" in p.stderr and "overflow" in p.stderr, p.stderr


def test_extract_keeps_the_labels_of_images_outside_their_class_folders(tmp_path):
    # A CSV (or list) pack of image and label only: extract wrote the images at their source
    # paths and nothing else, so the labels were lost. samples.jsonl now carries them.
    jpeg(tmp_path / "imgs" / "0.jpg")
    jpeg(tmp_path / "imgs" / "1.jpg", color=(0, 0, 200))
    (tmp_path / "c.csv").write_text("image,label\nimgs/0.jpg,dog\nimgs/1.jpg,cat\n")
    run("pack", tmp_path / "c.csv", tmp_path / "a", "-q", check=0)
    run("extract", tmp_path / "a", tmp_path / "x", "-q", check=0)
    x = tmp_path / "x"
    rows = [json.loads(r) for r in (x / "samples.jsonl").read_text().splitlines()]
    assert [(r["image"], r["label"]) for r in rows] == [("imgs/0.jpg", 1), ("imgs/1.jpg", 0)]
    run("pack", x / "samples.jsonl", tmp_path / "b", "--schema", x / "schema.json",
        "--class-names", x / "class_names.json", "-q", check=0)
    assert manifest(tmp_path / "b")["class_names"] == ["cat", "dog"]
    assert [s["label"] for s in samples(tmp_path / "b", tmp_path)] == [1, 0]
    # Class names a folder re-pack would renumber (an order given by --class-names, a class
    # without samples): samples.jsonl and class_names.json too, though every image sits in
    # its class's folder (review).
    jpeg(tmp_path / "cat" / "1.jpg")
    jpeg(tmp_path / "dog" / "2.jpg")
    (tmp_path / "o.csv").write_text("image,label\ncat/1.jpg,cat\ndog/2.jpg,dog\n")
    (tmp_path / "o.json").write_text('["dog", "cat", "bird"]')
    run("pack", tmp_path / "o.csv", tmp_path / "o", "--class-names", tmp_path / "o.json", "-q",
        check=0)
    run("extract", tmp_path / "o", tmp_path / "z", "-q", check=0)
    assert json.loads((tmp_path / "z" / "class_names.json").read_text()) == ["dog", "cat", "bird"]
    # A folder pack keeps its class folders, and no samples.jsonl (nothing to carry).
    run("pack", GOOD, tmp_path / "f", "-q", check=0)
    run("extract", tmp_path / "f", tmp_path / "y", "-q", check=0)
    assert not (tmp_path / "y" / "samples.jsonl").exists()
    # Found by a stranger's test: a folder pack with an empty class folder came back without
    # it, so `pack DIR` renumbered the classes after it (c: 2 -> 1) without a word. Its empty
    # folder is written now; where samples.jsonl is needed, extract says how to pack it again.
    for name in ("a", "b", "c"):
        (tmp_path / "e" / name).mkdir(parents=True)
    jpeg(tmp_path / "e" / "a" / "1.jpg")
    jpeg(tmp_path / "e" / "c" / "2.jpg")
    run("pack", tmp_path / "e", tmp_path / "ea", "-q", check=0)
    p = run("extract", tmp_path / "ea", tmp_path / "ex", check=0)
    assert sorted(os.listdir(tmp_path / "ex")) == ["a", "b", "c"] and "pack them" not in p.stdout
    run("pack", tmp_path / "ex", tmp_path / "eb", "-q", check=0)
    assert manifest(tmp_path / "eb")["class_names"] == ["a", "b", "c"]
    assert manifest(tmp_path / "eb")["class_counts"] == [1, 0, 1]  # labels 0 and 2
    p = run("extract", tmp_path / "o", tmp_path / "z2", check=0)
    assert "to pack them again: shardfeed pack %s OUT --schema %s --class-names %s" % (
        tmp_path / "z2" / "samples.jsonl", tmp_path / "z2" / "schema.json",
        tmp_path / "z2" / "class_names.json") in p.stdout, p.stdout


def test_inverted_boxes_are_refused_naming_the_sample_and_field(tmp_path):
    # The hostile review of issue 21: a box with x1 < x0 (COCO: a negative width) was stored and
    # later dropped silently by the loader's geometry. Refused at pack time, naming where.
    instances, images = coco_source(tmp_path)
    data = json.loads(instances.read_text())
    data["annotations"][2]["bbox"] = [10, 10, -4, 5]
    instances.write_text(json.dumps(data))
    p = run("pack", instances, tmp_path / "a", "--images", images, "-q", check=1)
    assert "annotations[2]" in p.stderr and "field 'boxes'" in p.stderr, p.stderr
    assert "negative width or height" in p.stderr, p.stderr
    assert not (tmp_path / "a").exists()
    jpeg(str(tmp_path / "b.jpg"))
    src = tmp_path / "d.jsonl"
    src.write_text(json.dumps({"image": "b.jpg", "boxes": [[1, 1, 5, 5]]}) + "\n" +
                   json.dumps({"image": "b.jpg", "boxes": [[1, 1, 5, 5], [1, 9, 5, 2]]}) + "\n")
    p = run("pack", src, tmp_path / "c", "-q")
    assert p.returncode == 1 and "d.jsonl:2" in p.stderr, (p.returncode, p.stderr)
    assert "field 'boxes'" in p.stderr and "box 1 [1, 9, 5, 2] is inverted" in p.stderr, p.stderr
    assert not (tmp_path / "c").exists()


def test_coco_images_that_do_not_exist_are_a_usage_error_naming_the_path(tmp_path):
    # Before: exit 1 (every image "damaged") for what is a wrong option.
    instances, _ = coco_source(tmp_path)
    for images in (tmp_path / "nonexistent", instances):  # missing; a file, not a folder
        p = run("pack", "--from", "coco", instances, tmp_path / "a", "--images", images, "-q")
        assert p.returncode == 2, (p.returncode, p.stderr)
        assert "--images " + str(images) in p.stderr, p.stderr
        assert not (tmp_path / "a").exists()


def test_jsonl_integers_beyond_2_53_stay_exact_or_are_refused(tmp_path):
    # An id beyond 2^53 was rounded (a float64 column) or wrapped (beyond int64) silently.
    jpeg(str(tmp_path / "a.jpg"))
    big = 2**53 + 1
    src = tmp_path / "d.jsonl"
    src.write_text(json.dumps({"image": "a.jpg", "id": big, "ids": [big, -big]}) + "\n")
    run("pack", src, tmp_path / "a", "-q", check=0)
    assert fields(tmp_path / "a")["id"] == "int64"
    got = samples(tmp_path / "a", tmp_path)
    assert got[0]["id"] == big and got[0]["ids"] == [big, -big], got
    cases = [({"id": 0.5}, {"id": big}, "d.jsonl:2"),   # mixed: float64, which rounds big
             ({"id": 1}, {"id": 2**63}, "d.jsonl:2"),    # beyond int64: would wrap
             ({"id": [0.5]}, {"id": [1, big]}, "d.jsonl:2")]
    for n, (first, second, where) in enumerate(cases):
        src.write_text(json.dumps(dict(first, image="a.jpg")) + "\n" +
                       json.dumps(dict(second, image="a.jpg")) + "\n")
        out = tmp_path / ("b%d" % n)
        p = run("pack", src, out, "-q")
        assert p.returncode == 1, (first, second, p.returncode, p.stderr)
        assert where in p.stderr and "field 'id'" in p.stderr and str(second["id"] if not
               isinstance(second["id"], list) else big) in p.stderr, p.stderr
        assert not out.exists()
    # A CSV cell is text until read: one no int64 holds is kept as that text (the column str,
    # with a note), never rounded; before, the pack failed on it.
    csv = tmp_path / "d.csv"
    csv.write_text("filename,id\na.jpg,1.5\na.jpg,%d\n" % 2**64)
    p = run("pack", csv, tmp_path / "c", "-q")
    assert p.returncode == 0 and "column 'id' stored as str" in p.stderr, p.stderr
    assert [s["id"] for s in samples(tmp_path / "c", tmp_path)] == ["1.5", str(2 ** 64)]


def test_json_integers_no_64_bit_integer_holds_are_refused_not_rounded(tmp_path):
    # nlohmann keeps an integer beyond uint64 (or below int64) as a rounded double: a JSONL
    # column of them became float64 (2^64 + 1 stored as 1.8446744073709552e19), a list float32[*],
    # a json field re-dumped rounded; COCO wrapped an id past INT64_MAX to -2^63. All exit 0.
    jpeg(str(tmp_path / "a.jpg"))
    src = tmp_path / "d.jsonl"
    for n, value in enumerate([2**64 + 1, -2**63 - 1, [1, 2**64], {"x": {"y": 2**70}}]):
        src.write_text(json.dumps({"image": "a.jpg", "id": 1}) + "\n" +
                       json.dumps({"image": "a.jpg", "id": value}) + "\n")
        p = run("pack", src, tmp_path / ("j%d" % n), "-q")
        assert p.returncode == 1 and "d.jsonl:2" in p.stderr, (value, p.stderr)
        assert "does not fit 64 bits" in p.stderr, p.stderr
    # Exact ones still pack: 2^53 + 1 as int64, 2^63 inside a json field (nlohmann's uint64).
    src.write_text(json.dumps({"image": "a.jpg", "id": 2**53 + 1, "m": {"big": 2**63}}) + "\n")
    run("pack", src, tmp_path / "ok", "-q", check=0)
    got = samples(tmp_path / "ok", tmp_path)
    assert got[0]["id"] == 2**53 + 1 and got[0]["m"] == {"big": 2**63}, got
    # A CSV cell holding a JSON list.
    (tmp_path / "d.csv").write_text('filename,ids\na.jpg,"[1, 2]"\na.jpg,"[1, %d]"\n' % 2**64)
    p = run("pack", tmp_path / "d.csv", tmp_path / "c", "-q")
    assert p.returncode == 1 and "d.csv:3" in p.stderr and "64 bits" in p.stderr, p.stderr
    # COCO: an image id past INT64_MAX, and one past uint64.
    for n, big in enumerate([2**63, 2**64]):
        instances, images = coco_source(tmp_path / ("coco%d" % n))
        data = json.loads(instances.read_text())
        data["images"][0]["id"] = big
        for a in data["annotations"]:
            if a["image_id"] == 100:
                a["image_id"] = big
        instances.write_text(json.dumps(data))
        p = run("pack", instances, tmp_path / ("k%d" % n), "--images", images, "-q")
        assert p.returncode == 1, p.stderr  # bad data, as a bad JSONL or CSV row
        assert "images[0]" in p.stderr or str(big) in p.stderr, p.stderr
        assert not (tmp_path / ("k%d" % n)).exists()


def test_json_nested_past_the_depth_limit_is_refused_not_a_crash(tmp_path):
    # REGRESSION (found by a stranger's test): a JSONL value of 100,000 nested lists crashed pack
    # (SIGSEGV in nlohmann's recursive dump), and a CSV cell of them packed as a json field that
    # verify passed and extract crashed on. Refused, naming the row; 256 levels still pack.
    # (Deeper JSON in a shard is refused by the writers, and by extract as the sample's error.)
    jpeg(str(tmp_path / "a.jpg"))
    deep = "[" * 100000 + "]" * 100000
    (tmp_path / "d.jsonl").write_text('{"image": "a.jpg", "x": 1}\n{"image": "a.jpg", "x": %s}\n'
                                     % deep)
    p = run("pack", tmp_path / "d.jsonl", tmp_path / "j", "-q")
    assert p.returncode == 1 and "d.jsonl:2" in p.stderr, (p.returncode, p.stderr)
    assert "nested deeper than 264 levels" in p.stderr, p.stderr
    assert not (tmp_path / "j").exists()
    (tmp_path / "e.jsonl").write_text('{"image": "a.jpg", "x": %s}\n' % ("[" * 257 + "]" * 257))
    p = run("pack", tmp_path / "e.jsonl", tmp_path / "e", "-q")  # the value itself: 257 levels
    assert p.returncode == 1 and "e.jsonl:1" in p.stderr, (p.returncode, p.stderr)
    assert "'x'" in p.stderr and "nested deeper than 256 levels" in p.stderr, p.stderr
    # A CSV cell is JSON only when it parses within the limit: deeper, it is kept as text.
    (tmp_path / "d.csv").write_text('image,x\na.jpg,"%s"\n' % deep)
    run("pack", tmp_path / "d.csv", tmp_path / "c", "-q", check=0)
    assert fields(tmp_path / "c")["x"] == "str"
    run("extract", tmp_path / "c", tmp_path / "c-x", "-q", check=0)
    assert json.loads((tmp_path / "c-x" / "samples.jsonl").read_text())["x"] == deep
    # ... unless --schema makes it a json field: then refused, as in JSONL (not a JSON string).
    (tmp_path / "s.json").write_text('{"image": "image", "x": "json"}')
    (tmp_path / "e.csv").write_text('image,x\na.jpg,"%s"\n' % ("[" * 300 + "]" * 300))
    p = run("pack", tmp_path / "e.csv", tmp_path / "c2", "--schema", tmp_path / "s.json", "-q")
    assert p.returncode == 1 and "e.csv:2" in p.stderr, (p.returncode, p.stderr)
    assert "nested deeper than 256 levels" in p.stderr, p.stderr
    ok = "[" * 256 + "]" * 256
    (tmp_path / "ok.jsonl").write_text('{"image": "a.jpg", "x": %s}\n' % ok)
    run("pack", tmp_path / "ok.jsonl", tmp_path / "ok", "-q", check=0)
    run("extract", tmp_path / "ok", tmp_path / "ok-x", "-q", check=0)
    row = json.loads((tmp_path / "ok-x" / "samples.jsonl").read_text().splitlines()[0])
    assert json.dumps(row["x"], separators=(",", ":")) == ok


def test_extract_then_pack_round_trips_masks_bit_for_bit(tmp_path):
    # extract writes a mask as a PNG file (DIR/masks/<field>/I.png) named in samples.jsonl; the
    # JSONL importer reads that path back (before: a bad row, "expected ..." for a string).
    rows = []
    for i in range(3):
        jpeg(str(tmp_path / ("%d.jpg" % i)), size=(40, 30))
        mask = [[(x * 7 + y * 3 + i) % 5 if (x + y) % 9 else 255 for x in range(40)]
                for y in range(30)]
        rows.append({"image": "%d.jpg" % i, "mask": mask})
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "s.json").write_text(json.dumps({"image": "image", "mask": "mask"}))
    run("pack", tmp_path / "m.jsonl", tmp_path / "a.sf", "--schema", tmp_path / "s.json", "-q",
        check=0)
    run("extract", tmp_path / "a.sf", tmp_path / "x", "-q", check=0)
    lines = [json.loads(x) for x in (tmp_path / "x" / "samples.jsonl").read_text().splitlines()]
    assert all(isinstance(x["mask"], str) and x["mask"].endswith(".png") for x in lines), lines
    run("pack", tmp_path / "x" / "samples.jsonl", tmp_path / "b.sf", "--schema",
        tmp_path / "x" / "schema.json", "-q", check=0)
    run("extract", tmp_path / "b.sf", tmp_path / "y", "-q", check=0)
    again = [json.loads(x) for x in (tmp_path / "y" / "samples.jsonl").read_text().splitlines()]
    for i, (first, second) in enumerate(zip(lines, again)):
        a = Image.open(tmp_path / "x" / first["mask"])
        b = Image.open(tmp_path / "y" / second["mask"])
        assert a.mode == b.mode == "L" and list(b.getdata()) == list(a.getdata())
        assert list(a.getdata()) == [v for row in rows[i]["mask"] for v in row]
    # A colour PNG is no mask: refused naming the line and the field.
    Image.new("RGB", (40, 30), (1, 2, 3)).save(tmp_path / "colour.png")
    (tmp_path / "c.jsonl").write_text(json.dumps({"image": "0.jpg", "mask": "colour.png"}) + "\n")
    p = run("pack", tmp_path / "c.jsonl", tmp_path / "c.sf", "--schema", tmp_path / "s.json",
            "-q")
    assert p.returncode == 1 and "c.jsonl:1" in p.stderr and "field 'mask'" in p.stderr, p.stderr
    assert "colour" in p.stderr, p.stderr


def test_a_mask_png_gives_the_ids_it_stores_whatever_its_layout(tmp_path):
    # REGRESSION: a mask PNG went through the photo decoder: a 16-bit grey mask (Cityscapes
    # *_instanceIds.png) was cut to its high byte without a word (26001 -> 101, 7 -> 0), a
    # palette mask (VOC SegmentationClass) was refused as colour, a 1-bit one scaled to 255.
    # Now the stored values are the ids; a 16-bit id over 255 is refused.
    jpeg(tmp_path / "a.jpg", size=(8, 6))
    ids = [(x + 2 * y) % 4 for y in range(6) for x in range(8)]
    pal = Image.new("P", (8, 6))
    pal.putpalette([0, 0, 0, 128, 0, 0, 0, 128, 0, 128, 128, 0] + [0] * 756)
    pal.putdata(ids)
    pal.save(tmp_path / "pal.png")
    wide = Image.new("I;16", (8, 6))
    wide.putdata(ids)
    wide.save(tmp_path / "wide.png")
    one = Image.new("1", (8, 6))
    one.putdata([255 * (i % 2) for i in ids])
    one.save(tmp_path / "one.png")
    la = Image.new("LA", (8, 6))
    la.putdata([(i, 17 * i) for i in ids])
    la.save(tmp_path / "la.png")
    files = ["pal.png", "wide.png", "one.png", "la.png"]
    want = [ids, ids, [i % 2 for i in ids], ids]
    (tmp_path / "m.jsonl").write_text(
        "".join(json.dumps({"image": "a.jpg", "mask": f}) + "\n" for f in files))
    (tmp_path / "s.json").write_text(json.dumps({"image": "image", "mask": "mask"}))
    run("pack", tmp_path / "m.jsonl", tmp_path / "a.sf", "--schema", tmp_path / "s.json", "-q",
        check=0)
    run("extract", tmp_path / "a.sf", tmp_path / "x", "-q", check=0)
    rows = [json.loads(x) for x in (tmp_path / "x" / "samples.jsonl").read_text().splitlines()]
    for f, row, w in zip(files, rows, want):
        assert list(Image.open(tmp_path / "x" / row["mask"]).getdata()) == w, f
    big = Image.new("I;16", (8, 6))
    big.putdata([26001 if i == 3 else i for i in ids])
    big.save(tmp_path / "big.png")
    (tmp_path / "b.jsonl").write_text(json.dumps({"image": "a.jpg", "mask": "big.png"}) + "\n")
    p = run("pack", tmp_path / "b.jsonl", tmp_path / "b.sf", "--schema", tmp_path / "s.json",
            "-q")
    assert p.returncode == 1 and "b.jsonl:1" in p.stderr and "big.png" in p.stderr, p.stderr
    assert "16-bit PNG with ids up to 26001" in p.stderr and "0-255" in p.stderr, p.stderr
    assert not (tmp_path / "b.sf").exists()


def test_a_webdataset_png_member_declared_a_mask_is_read_as_one(tmp_path):
    # A segmentation map beside the photo (x.seg.png) declared a mask by --schema: it failed as
    # "not a JSON list", the message cut at the PNG's first NUL byte, with no reason. Now it is
    # read as a mask PNG; declared an array, the error shows the bytes escaped and says why.
    src = tmp_path / "s"
    src.mkdir()
    jpeg(tmp_path / "a.jpg", size=(8, 6))
    ids = [(x * y) % 3 for y in range(6) for x in range(8)]
    seg = Image.new("L", (8, 6))
    seg.putdata(ids)
    buf = io.BytesIO()
    seg.save(buf, "PNG")
    with tarfile.open(src / "a.tar", "w") as t:
        add_member(t, "x.jpg", (tmp_path / "a.jpg").read_bytes())
        add_member(t, "x.seg.png", buf.getvalue())
        add_member(t, "x.cls", b"0")
    (tmp_path / "s.json").write_text(
        json.dumps({"image": "image", "label": "int64", "seg_png": "mask"}))
    run("pack", src, tmp_path / "a.sf", "-q", "--schema", tmp_path / "s.json", check=0)
    run("extract", tmp_path / "a.sf", tmp_path / "x", "-q", check=0)
    row = json.loads((tmp_path / "x" / "samples.jsonl").read_text().splitlines()[0])
    assert list(Image.open(tmp_path / "x" / row["seg_png"]).getdata()) == ids
    (tmp_path / "t.json").write_text(
        json.dumps({"image": "image", "label": "int64", "seg_png": "int64[*]"}))
    p = run("pack", src, tmp_path / "b.sf", "-q", "--schema", tmp_path / "t.json")
    assert p.returncode != 0 and "field 'seg_png'" in p.stderr, p.stderr
    assert "PNG" in p.stderr and "is not a JSON list" in p.stderr, p.stderr
    assert "\x00" not in p.stderr, p.stderr


def test_a_webdataset_png_beside_the_photo_is_a_field_not_dropped(tmp_path):
    # REGRESSION: a sample with x.jpg (the photo) and x.png (its segmentation map, the usual
    # layout) took the first of them as the image and dropped the other without a word (no
    # field, nothing in `ignored`). The image is now the jpg whatever the order in the tar, and
    # the png a bytes field named by its extension.
    src = tmp_path / "s"
    src.mkdir()
    jpeg(tmp_path / "a.jpg", size=(8, 6))
    photo = (tmp_path / "a.jpg").read_bytes()
    maps = {}
    with tarfile.open(src / "a.tar", "w") as t:
        for i, key in enumerate(("x", "y")):
            buf = io.BytesIO()
            Image.new("L", (8, 6), i + 1).save(buf, "PNG")
            maps[key] = buf.getvalue()
            members = [(key + ".png", maps[key]), (key + ".jpg", photo), (key + ".cls", b"0")]
            for name, data in members if key == "x" else members[::-1]:
                add_member(t, name, data)
    run("pack", src, tmp_path / "a.sf", "-q", check=0)
    assert fields(tmp_path / "a.sf")["png"] == "bytes"
    run("extract", tmp_path / "a.sf", tmp_path / "x", "-q", check=0)
    rows = [json.loads(x) for x in (tmp_path / "x" / "samples.jsonl").read_text().splitlines()]
    for row in rows:
        assert base64.b64decode(row["png"]["base64"]) == maps[row["key"]]
        assert (tmp_path / "x" / row["image"]).read_bytes() == photo
    # (review) A sample whose only image is a png: png is then no field (the sample would miss
    # it and fail the pack); the maps beside the photos are left out, listed in `ignored`.
    with tarfile.open(src / "b.tar", "w") as t:
        add_member(t, "z.png", maps["x"])
        add_member(t, "z.cls", b"0")
    p = run("pack", src, tmp_path / "b.sf", "-q", "--report", tmp_path / "r.json", check=0)
    assert "png" not in fields(tmp_path / "b.sf"), fields(tmp_path / "b.sf")
    ignored = json.loads((tmp_path / "r.json").read_text())["ignored"]
    assert sorted(os.path.basename(i["path"]) for i in ignored) == ["a.tar:x.png", "a.tar:y.png"]
    assert all("other samples' image" in i["reason"] for i in ignored), ignored


def test_a_label_beyond_the_class_limit_is_refused_naming_the_line(tmp_path):
    # Numeric labels become class names "0".."max": one label of 2000000000 made pack build two
    # billion names (out of memory: std::bad_alloc, abort). It is refused where it is read.
    jpeg(tmp_path / "a.jpg")
    (tmp_path / "l.txt").write_text("a.jpg 1\na.jpg 2000000000\n")
    p = run("pack", tmp_path, tmp_path / "o1", "--list", tmp_path / "l.txt", "-q")
    assert p.returncode == 1 and "l.txt:2" in p.stderr and "0..4194303" in p.stderr, p.stderr
    (tmp_path / "m.jsonl").write_text('{"image": "a.jpg", "label": 0}\n'
                                      '{"image": "a.jpg", "label": 4194304}\n')
    p = run("pack", tmp_path / "m.jsonl", tmp_path / "o2", "-q")
    assert p.returncode == 1 and "m.jsonl:2" in p.stderr and "class id" in p.stderr, p.stderr
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
    # The largest class id is taken.
    (tmp_path / "l.txt").write_text("a.jpg 4194303\n")
    run("pack", tmp_path, tmp_path / "o3", "--list", tmp_path / "l.txt", "-q", check=0)
    m = manifest(tmp_path / "o3")
    assert len(m["class_names"]) == 4194304 and m["class_names"][-1] == "4194303"
    # Several labels on a line are a labels field, not class ids: no limit there.
    (tmp_path / "l.txt").write_text("0\t1\t2000000000\ta.jpg\n1\t5\ta.jpg\n")  # MXNet .lst
    run("pack", tmp_path, tmp_path / "o4", "--list", tmp_path / "l.txt", "-q", check=0)
    assert samples(tmp_path / "o4", tmp_path)[0]["labels"] == [1, 2000000000]


def test_a_class_name_that_is_not_utf8_is_refused_naming_it(tmp_path):
    # REGRESSION (found by a stranger's test): a class folder named in Latin-1 ("caf\xe9") made
    # pack fail after the whole run with nlohmann's "[json.exception.type_error.316] incomplete
    # UTF-8 string", naming nothing; a CSV label the same.
    src = tmp_path.as_posix().encode() + b"/src"
    for name in (b"caf\xe9", b"dog"):
        os.makedirs(src + b"/" + name)
        jpeg((src + b"/" + name + b"/x.jpg").decode("utf-8", "surrogateescape"))
    p = subprocess.run([CLI, "pack", src, str(tmp_path / "a"), "-q"], capture_output=True,
                       timeout=300)
    err = p.stderr.decode("utf-8", "replace")
    assert p.returncode == 2 and "class 0 name \"caf\ufffd\" is not valid UTF-8" in err, err
    assert "rename it" in err and "json.exception" not in err, err
    assert not (tmp_path / "a").exists()
    jpeg(str(tmp_path / "c0.jpg"))
    (tmp_path / "l.csv").write_bytes(b"image,label\nc0.jpg,caf\xe9\nc0.jpg,dog\n")
    p = run("pack", tmp_path / "l.csv", tmp_path / "b", "-q")
    assert p.returncode == 2 and "is not valid UTF-8" in p.stderr, p.stderr


def test_a_number_cell_with_a_nul_byte_is_text_not_a_cut_number(tmp_path):
    # REGRESSION (found by a stranger's test): "1\0" "2" was stored as the int64 1 (strtoll
    # stopped at the NUL and the check looked no further), "2.5\0" "9" as 2.5.
    jpeg(str(tmp_path / "c0.jpg"))
    (tmp_path / "n.csv").write_bytes(b"image,x,y\nc0.jpg,1\x002,2.5\x009\n")
    run("pack", tmp_path / "n.csv", tmp_path / "a", "-q", check=0)
    assert fields(tmp_path / "a")["x"] == "str" and fields(tmp_path / "a")["y"] == "str"
    if PYTHONPATH:
        got = samples(tmp_path / "a", tmp_path)
        assert got[0]["x"] == "1\x002" and got[0]["y"] == "2.5\x009", got


def test_label_columns_that_do_not_become_what_a_user_meant_say_so(tmp_path):
    # Found by a stranger's test: JSONL labels "5".."10" (strings) silently became class names in
    # text order ("10" class 0), a label column with one 2.0 silently became float64 (no class
    # field: the loader gave labels=None), and CSV booleans (true/False) became str.
    jpeg(str(tmp_path / "a.jpg"))
    (tmp_path / "s.jsonl").write_text("".join('{"image": "a.jpg", "label": "%d"}\n' % n
                                              for n in (5, 10, 7)))
    p = run("pack", tmp_path / "s.jsonl", tmp_path / "s", "-q", check=0)
    assert "note: column 'label' holds strings of digits ('5' at " in p.stderr, p.stderr
    assert "('10' is class 0, '5' class 1); write them as numbers" in p.stderr, p.stderr
    (tmp_path / "f.jsonl").write_text('{"image": "a.jpg", "label": 1}\n'
                                      '{"image": "a.jpg", "label": 2.0}\n')
    p = run("pack", tmp_path / "f.jsonl", tmp_path / "f", "-q", check=0)
    assert "column 'label' stored as float64 (not as the class field): it holds numbers " \
        "written as floats (2.0 at" in p.stderr, p.stderr
    (tmp_path / "b.csv").write_text("image,flag\na.jpg,true\na.jpg,False\na.jpg,TRUE\n")
    run("pack", tmp_path / "b.csv", tmp_path / "b", "-q", check=0)
    assert fields(tmp_path / "b")["flag"] == "int64"
    if PYTHONPATH:
        assert [s["flag"] for s in samples(tmp_path / "b", tmp_path)] == [1, 0, 1]
