"""The parquet / Hugging Face (save_to_disk) importer: python -m shardfeed.importers.parquet.
Rows read back equal through Archive.sample(); the image column is found (struct {bytes, path},
binary, path strings); ClassLabel names become class names; bad rows are named; without pyarrow
the error says so."""
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import shardfeed
from shardfeed.importers import parquet as importer

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402


def jpeg(i, h=12, w=10):
    buf = io.BytesIO()
    Image.fromarray(np.full((h, w, 3), 10 * i, np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


def table(n=20):
    rng = np.random.default_rng(3)
    boxes = [rng.uniform(0, 9, (i % 3, 4)).astype(np.float32) for i in range(n)]
    boxes = [np.concatenate([np.minimum(b[:, :2], b[:, 2:]), np.maximum(b[:, :2], b[:, 2:])],
                            axis=1) for b in boxes]  # valid boxes: x0 <= x1, y0 <= y1
    return pa.table({
        "image": pa.array([{"bytes": jpeg(i), "path": "img%d.jpg" % i} for i in range(n)],
                          pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
        "label": pa.array([i % 4 for i in range(n)], pa.int64()),
        "caption": pa.array(["row %d ✓" % i for i in range(n)]),
        "tags": pa.array([list(range(i % 5)) for i in range(n)], pa.list_(pa.int64())),
        "score": pa.array([i / 7 for i in range(n)], pa.float64()),
        "conf": pa.array([i / 3 for i in range(n)], pa.float32()),
        "boxes": pa.array([b.tolist() for b in boxes], pa.list_(pa.list_(pa.float32(), 4))),
        "emb": pa.array([[float(i)] * 3 for i in range(n)], pa.list_(pa.float32(), 3)),
        "meta": pa.array([{"k": i, "s": "x"} for i in range(n)],
                         pa.struct([("k", pa.int64()), ("s", pa.string())])),
        "blob": pa.array([bytes([i] * i) for i in range(n)], pa.binary()),
    }), boxes


def check(out, n, boxes):
    a = shardfeed.Archive(out)
    assert len(a) == n
    # A box-named column of 4-number lists is "boxes" (moved with resize, crop and flip).
    assert a.schema == {"image": "image", "label": "int64", "caption": "str", "tags": "int64[*]",
                        "score": "float64", "conf": "float32", "boxes": "boxes",
                        "emb": "float32[3]", "meta": "json", "blob": "bytes"}
    for i in range(n):
        s = a.sample(i)
        assert s["image"].shape == (12, 10, 3) and abs(int(s["image"][0, 0, 0]) - 10 * i) <= 2
        assert s["label"] == i % 4 and s["caption"] == "row %d ✓" % i
        assert s["tags"].tolist() == list(range(i % 5)) and s["score"] == i / 7
        assert s["conf"] == float(np.float32(i / 3))
        assert s["boxes"].tobytes() == boxes[i].tobytes() and s["boxes"].shape == (i % 3, 4)
        assert s["emb"].tolist() == [float(i)] * 3
        assert s["meta"] == {"k": i, "s": "x"} and s["blob"] == bytes([i] * i)
    return a


def test_parquet_file_round_trip(tmp_path):
    t, boxes = table()
    pq.write_table(t, tmp_path / "train.parquet", row_group_size=7)
    r = importer.pack_parquet(tmp_path / "train.parquet", tmp_path / "out")
    assert r["packed"] == 20
    assert check(tmp_path / "out", 20, boxes).class_names == ["0", "1", "2", "3"]


def test_parquet_directory_in_name_order_via_the_module(tmp_path):
    t, boxes = table()
    (tmp_path / "src").mkdir()
    pq.write_table(t.slice(10), tmp_path / "src" / "part-1.parquet")
    pq.write_table(t.slice(0, 10), tmp_path / "src" / "part-0.parquet")
    run = subprocess.run([sys.executable, "-m", "shardfeed.importers.parquet",
                          str(tmp_path / "src"), str(tmp_path / "out"), "--workers", "2",
                          "--backend", "hdf5"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "packed 20 samples" in run.stdout
    check(tmp_path / "out", 20, boxes)
    # An existing archive: refused without --overwrite (exit 2), replaced with it.
    run = subprocess.run([sys.executable, "-m", "shardfeed.importers.parquet",
                          str(tmp_path / "src"), str(tmp_path / "out")], capture_output=True,
                         text=True)
    assert run.returncode == 2 and "overwrite" in run.stderr
    run = subprocess.run([sys.executable, "-m", "shardfeed.importers.parquet",
                          str(tmp_path / "src"), str(tmp_path / "out"), "--overwrite"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    # A flag this importer does not take: one line saying why (argparse printed its usage).
    for flag in (["--shuffle"], ["--class-names", "n.txt"], ["--over"]):  # no prefixes
        run = subprocess.run([sys.executable, "-m", "shardfeed.importers.parquet",
                              str(tmp_path / "src"), str(tmp_path / "o2"), *flag],
                             capture_output=True, text=True)
        assert run.returncode == 2, run.stderr
        if flag[0] != "--over":  # argparse's own refusal of an unknown flag
            assert "usage:" not in run.stderr, run.stderr
            assert run.stderr.startswith("shardfeed: error: " + flag[0]), run.stderr
        assert not (tmp_path / "o2").exists()


def test_hugging_face_save_to_disk_layout(tmp_path):
    # What datasets.Dataset.save_to_disk writes: Arrow IPC streams named by state.json, the
    # features in dataset_info.json (ClassLabel names, the Image feature).
    t, boxes = table()
    src = tmp_path / "hf"
    src.mkdir()
    for k, part in enumerate((t.slice(0, 12), t.slice(12))):
        with pa.OSFile(str(src / ("data-%05d-of-00002.arrow" % k)), "wb") as sink:
            with pa.ipc.new_stream(sink, part.schema) as w:
                w.write_table(part)
    (src / "state.json").write_text(json.dumps({"_data_files": [
        {"filename": "data-00000-of-00002.arrow"}, {"filename": "data-00001-of-00002.arrow"}]}))
    names = ["cat", "dog", "eel", "fox"]
    (src / "dataset_info.json").write_text(json.dumps({"features": {
        "image": {"_type": "Image"}, "label": {"names": names, "_type": "ClassLabel"}}}))
    importer.pack_parquet(src, tmp_path / "out")
    assert check(tmp_path / "out", 20, boxes).class_names == names


def test_image_as_path_strings_and_a_given_schema(tmp_path):
    for i in range(4):
        (tmp_path / ("f%d.jpg" % i)).write_bytes(jpeg(i, 8, 6))
    t = pa.table({"file_name": ["f%d.jpg" % i for i in range(4)], "y": [1, 2, 3, 4],
                  "note": ["a", "b", "c", "d"]})
    pq.write_table(t, tmp_path / "t.parquet")
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"image": "image", "y": "float32"}))
    run = subprocess.run([sys.executable, "-m", "shardfeed.importers.parquet",
                          str(tmp_path / "t.parquet"), str(tmp_path / "out"), "--schema",
                          str(schema)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    a = shardfeed.Archive(tmp_path / "out")
    assert a.schema == {"image": "image", "y": "float32"}
    assert [a.sample(i)["y"] for i in range(4)] == [1.0, 2.0, 3.0, 4.0]
    assert a.sample(3)["image"].shape == (8, 6, 3)


def test_a_bad_row_is_named_and_skip_bad_skips_it(tmp_path):
    t = pa.table({"image": [jpeg(0), jpeg(1), jpeg(2)], "label": [0, -1, 1]})  # -1: unlabelled
    pq.write_table(t, tmp_path / "t.parquet")
    args = [sys.executable, "-m", "shardfeed.importers.parquet", str(tmp_path / "t.parquet"),
            str(tmp_path / "out")]
    run = subprocess.run(args, capture_output=True, text=True)
    assert run.returncode == 1 and "row 1): field 'label'" in run.stderr, run.stderr
    assert not (tmp_path / "out").exists()
    run = subprocess.run(args + ["--skip-bad"], capture_output=True, text=True)
    assert run.returncode == 0 and "skipped sample 1" in run.stdout
    assert len(shardfeed.Archive(tmp_path / "out")) == 2


def test_a_bad_row_names_its_file_and_row(tmp_path):
    # Found by a stranger's test: a bad row of a directory of files was "sample 2: ...", its
    # number counted over every file, which no user can find; it now names the file and row.
    d = tmp_path / "d"
    d.mkdir()
    pq.write_table(pa.table({"image": [jpeg(0), jpeg(1)], "label": [0, 1]}), d / "a.parquet")
    pq.write_table(pa.table({"image": [jpeg(2), None], "label": [1, 0]}), d / "b.parquet")
    args = [sys.executable, "-m", "shardfeed.importers.parquet", str(d), str(tmp_path / "out")]
    run = subprocess.run(args, capture_output=True, text=True)
    assert run.returncode == 1, run.stderr
    assert "sample 3 (%s, row 1): field 'image'" % (d / "b.parquet") in run.stderr, run.stderr
    run = subprocess.run(args + ["--skip-bad"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "skipped sample 3 (%s, row 1): field 'image'" % (d / "b.parquet") in run.stdout


def test_without_pyarrow_the_error_says_so(tmp_path):
    code = ("import sys; sys.modules['pyarrow'] = None\n"
            "from shardfeed.importers import parquet\n"
            "sys.exit(parquet.main([%r, %r]))" % (str(tmp_path), str(tmp_path / "out")))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 2 and "needs pyarrow" in run.stderr


@pytest.mark.skipif(not os.environ.get("SHARDFEED_CLI"), reason="SHARDFEED_CLI not set")
def test_shardfeed_pack_runs_the_importer(tmp_path):
    # `shardfeed pack` recognises a .parquet SRC (or takes --from parquet) and passes its
    # flags on to this module: pack's options, -q; other sources' flags are refused.
    t, boxes = table()
    pq.write_table(t, tmp_path / "t.parquet")
    cli = os.environ["SHARDFEED_CLI"]
    run = subprocess.run([cli, "pack", str(tmp_path / "t.parquet"), str(tmp_path / "a"),
                          "--workers", "2", "-q"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    check(tmp_path / "a", 20, boxes)
    run = subprocess.run([cli, "pack", str(tmp_path), str(tmp_path / "b"), "--from", "parquet",
                          "--backend", "hdf5"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    check(tmp_path / "b", 20, boxes)
    run = subprocess.run([cli, "pack", str(tmp_path / "t.parquet"), str(tmp_path / "c"),
                          "--images", "x"], capture_output=True, text=True)
    assert run.returncode == 2 and "--images does not apply" in run.stderr


def test_a_damaged_file_is_named(tmp_path):
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    run = subprocess.run([sys.executable, "-m", "shardfeed.importers.parquet",
                          str(tmp_path / "d.parquet"), str(tmp_path / "out")],
                         capture_output=True, text=True)
    assert run.returncode == 2 and str(tmp_path / "d.parquet") in run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "out").exists()


def test_report_is_a_new_file_or_a_previous_report(tmp_path):
    t, _ = table(4)
    pq.write_table(t, tmp_path / "d.parquet")
    mine = tmp_path / "mine.txt"
    mine.write_text("a user's notes")

    def pack(out, report, *extra):
        return subprocess.run([sys.executable, "-m", "shardfeed.importers.parquet",
                               str(tmp_path / "d.parquet"), str(tmp_path / out), "--report",
                               str(report), *extra], capture_output=True, text=True)

    run = pack("a", mine, "--overwrite")
    assert run.returncode == 2 and "not a pack report" in run.stderr
    assert mine.read_text() == "a user's notes" and not (tmp_path / "a").exists()
    assert pack("a", tmp_path / "r.json").returncode == 0
    assert json.loads((tmp_path / "r.json").read_text())["packed"] == 4
    assert pack("b", tmp_path / "r.json").returncode == 2  # a report, but no --overwrite
    assert pack("b", tmp_path / "r.json", "--overwrite").returncode == 0
    assert json.loads((tmp_path / "r.json").read_text())["output"].endswith("b")


def test_real_world_columns_pack(tmp_path):
    # pandas' `Unnamed: 0`, names with spaces, timestamps, dates and decimals, ragged lists of
    # lists and boxes as list<list<double>> (what pandas writes) failed or were not boxes.
    import datetime
    import decimal
    t = pa.table({
        "image": pa.array([jpeg(1), jpeg(2)], pa.binary()),
        "Unnamed: 0": [0, 1],
        "caption with space": ["a", "b"],
        "taken": pa.array([datetime.datetime(2024, 1, 2, 3, 4, 5),
                           datetime.datetime(2024, 1, 2, 3, 4, 6, 500)], pa.timestamp("us")),
        "day": [datetime.date(2024, 1, 2), datetime.date(2025, 2, 3)],
        "price": pa.array([decimal.Decimal("1.25"), decimal.Decimal("3.50")],
                          pa.decimal128(5, 2)),
        "poly": [[[1, 2, 3], [4]], []],
        "boxes": [[[1.0, 2.0, 5.0, 6.0]], []],
        # pandas 2 writes ns (datetime cannot hold 123 ns), category columns as dictionaries,
        # NaN as null; small decimals printed with an exponent (1E-30).
        "ns": pa.array([1_700_000_000_000_000_123, 0], pa.timestamp("ns")),
        "kind": pa.array(["cat", "dog"]).dictionary_encode(),
        "tiny": pa.array([decimal.Decimal("1E-6"), decimal.Decimal("0")], pa.decimal128(10, 8)),
        "w": pa.array([0.5, None], pa.float64()),
    })
    pq.write_table(t, tmp_path / "t.parquet")
    report = importer.pack_parquet(str(tmp_path / "t.parquet"), str(tmp_path / "a"))
    assert report["packed"] == 2
    a = shardfeed.Archive(tmp_path / "a")
    assert a.schema == {
        "image": "image", "Unnamed__0": "int64", "caption_with_space": "str", "taken": "str",
        "day": "str", "price": "str", "poly": "json", "boxes": "boxes", "ns": "str",
        "kind": "str", "tiny": "str", "w": "float64"}
    s0, s1 = a.sample(0), a.sample(1)
    assert (s0["Unnamed__0"], s0["caption_with_space"], s1["caption_with_space"]) == (0, "a", "b")
    assert (s0["taken"], s1["taken"]) == ("2024-01-02T03:04:05.000000",
                                          "2024-01-02T03:04:06.000500")
    assert (s0["day"], s0["price"], s1["price"]) == ("2024-01-02", "1.25", "3.50")
    assert s0["poly"] == [[1, 2, 3], [4]] and s1["poly"] == []
    assert s0["boxes"].tolist() == [[1, 2, 5, 6]] and s1["boxes"].shape == (0, 4)
    assert (s0["ns"], s1["ns"]) == ("2023-11-14T22:13:20.000000123",
                                    "1970-01-01T00:00:00.000000000")
    assert (s0["kind"], s1["kind"]) == ("cat", "dog")
    assert (s0["tiny"], s1["tiny"]) == ("0.00000100", "0.00000000")
    assert s0["w"] == 0.5 and np.isnan(s1["w"])
    # --schema may name a field by the name its column becomes.
    schema = {"image": "image", "caption_with_space": "str", "poly": "json"}
    importer.pack_parquet(str(tmp_path / "t.parquet"), str(tmp_path / "b"), schema=schema)
    assert shardfeed.Archive(tmp_path / "b").sample(1)["caption_with_space"] == "b"


def test_timestamps_read_one_way_in_every_batch(tmp_path):
    # Rows are read 256 at a time: a batch whose nanoseconds Python's datetime could not hold
    # was printed another way ("2023-11-14 22:13:20.000000123") than the others ("...T22:13:20").
    n = 300
    stamps = [1_700_000_000_000_000_000 + (123 if i == 280 else 0) for i in range(n)]
    t = pa.table({"image": pa.array([jpeg(1)] * n, pa.binary()),
                  "at": pa.array(stamps, pa.timestamp("ns")),
                  "took": pa.array([1_000_000_123] * n, pa.duration("ns"))})
    pq.write_table(t, tmp_path / "t.parquet")
    importer.pack_parquet(str(tmp_path / "t.parquet"), str(tmp_path / "a"))
    a = shardfeed.Archive(tmp_path / "a")
    got = [a.sample(i)["at"] for i in (0, 255, 256, 280, 299)]
    assert got == ["2023-11-14T22:13:20.000000000"] * 3 + ["2023-11-14T22:13:20.000000123",
                                                            "2023-11-14T22:13:20.000000000"]
    assert a.sample(0)["took"] == "1000000123ns"


def test_a_label_column_of_strings_is_the_class_field(tmp_path):
    # As the CSV importer: the class field, its sorted distinct strings the class names (it was
    # a str field, and the archive had no class at all). Dictionary (pandas category) columns too.
    names = ["dog", "cat", "zebra", "cat", "dog", "cat"]
    for kind, column in (("plain", pa.array(names)),
                         ("category", pa.array(names).dictionary_encode())):
        src = tmp_path / ("%s.parquet" % kind)
        pq.write_table(pa.table({"image": pa.array([jpeg(i) for i in range(6)], pa.binary()),
                                 "label": column}), src)
        importer.pack_parquet(src, tmp_path / kind)
        a = shardfeed.Archive(tmp_path / kind)
        assert a.schema == {"image": "image", "label": "int64"}
        assert a.class_names == ["cat", "dog", "zebra"]
        assert [a.class_names[a.sample(i)["label"]] for i in range(6)] == names
    # class_names= sets the ids; a string it does not list is a bad row, named.
    src = tmp_path / "plain.parquet"
    importer.pack_parquet(src, tmp_path / "given", class_names=["zebra", "dog", "cat"])
    given = shardfeed.Archive(tmp_path / "given")
    assert [given.sample(i)["label"] for i in range(6)] == [1, 2, 0, 2, 1, 2]
    with pytest.raises(ValueError, match=r"sample 2 \(.*plain.parquet, row 2\): .*label.*"
                                         r"'zebra' is not one of the 2 class_names"):
        importer.pack_parquet(src, tmp_path / "short", class_names=["dog", "cat"])
    r = importer.pack_parquet(src, tmp_path / "skipped", class_names=["dog", "cat"],
                              skip_bad=True)
    assert r["packed"] == 5 and [s["sample"] for s in r["skipped"]] == [2]
