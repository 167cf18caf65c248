"""`shardfeed stats` and `shardfeed.stats()` on archives made from generated images where every
answer is known (tests/cli/stats_corpus.py): planted exact, cross-label and near duplicates,
look-alikes that must not match, dark/uniform/blurred/tiny/wide images, and a val archive with
planted leaks."""
import html.parser
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, os.path.dirname(__file__))
import stats_corpus as sc  # noqa: E402

CLI = os.environ.get("SHARDFEED_CLI", "shardfeed")
# The Python module is built only in builds with SHARDFEED_PYTHON (not the sanitizer builds).
_p = os.environ.get("SHARDFEED_PYTHONPATH", "")
PYTHONPATH = _p if os.path.isdir(os.path.join(_p, "shardfeed")) else ""


def run(*args, timeout=120):
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def save(path, img_or_bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(img_or_bytes if isinstance(img_or_bytes, bytes) else sc.jpeg(img_or_bytes))


# Sample indices: class folders in order, files sorted by name within each.
A, B, C = 0, 15, 31


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("stats")
    train, val = root / "train", root / "val"
    photos = {s: sc.photo(s) for s in list(range(20)) + [100, 101]}
    for s in range(10):
        save(train / "a" / ("%02d_p%d.jpg" % (s, s)), photos[s])
    save(train / "a" / "10_dup0.jpg", (train / "a" / "00_p0.jpg").read_bytes())
    for k, (name, f) in enumerate(sc.PERTURBATIONS.items()):
        save(train / "a" / ("%02d_near%d_%s.jpg" % (11 + k, k + 1, name)), f(photos[k + 1]))
    for s in range(10, 20):
        save(train / "b" / ("%02d_p%d.jpg" % (s - 10, s)), photos[s])
    save(train / "b" / "10_cross5.jpg", (train / "a" / "05_p5.jpg").read_bytes())
    for k in range(5):  # the palette and brightness of b/0k, other shapes: alike, not the same
        save(train / "b" / ("%02d_lookalike%d.jpg" % (11 + k, k)), sc.photo(10 + k, lookalike=k))
    save(train / "c" / "0_dark.jpg", sc.dark(sc.photo(30)))
    save(train / "c" / "1_uniform.jpg", sc.uniform())
    save(train / "c" / "2_blurred.jpg", sc.blurred(sc.photo(31)))
    save(train / "c" / "3_tiny.jpg", sc.photo(32, size=20))
    save(train / "c" / "4_wide.jpg", sc.photo(33, size=(40, 240)))
    save(val / "a" / "0_v100.jpg", photos[100])
    save(val / "a" / "1_leak6.jpg", (train / "a" / "06_p6.jpg").read_bytes())
    save(val / "a" / "2_leak7.jpg", sc.reencoded(photos[7]))
    save(val / "b" / "0_v101.jpg", photos[101])
    for src in (train, val):
        p = run("pack", src, str(src) + ".sf", "-q")
        assert p.returncode == 0, p.stderr
    return root


def stats_json(corpus, *extra):
    out = corpus / ("s%d.json" % len(os.listdir(corpus)))
    p = run("stats", corpus / "train.sf", "--json", out, "-q", *extra)
    assert p.returncode == 0, p.stderr
    return json.loads(out.read_text())


def test_duplicates_near_duplicates_and_cross_label(corpus):
    s = stats_json(corpus)
    assert s["samples"] == 36 and s["decoded"] == 36
    assert s["duplicates"] == [[A + 0, A + 10], [A + 5, B + 10]]
    assert s["cross_label_duplicates"] == [[A + 5, B + 10]]
    # Re-encoded at quality 50, resized by 10%, shifted by 2 px, 8% brighter: all found; the
    # look-alikes (b/11-15 against b/0-4) and every other distinct photo are not.
    assert s["near_duplicates"] == [[A + 1, A + 11], [A + 2, A + 12], [A + 3, A + 13],
                                    [A + 4, A + 14]]
    assert s["thresholds"]["near_threshold"] == 10


def test_quality_flags(corpus):
    f = stats_json(corpus)["flags"]
    assert f["dark"] == [C + 0]
    assert f["uniform"] == [C + 1]
    assert f["blurry"] == [C + 2]
    assert f["tiny"] == [C + 3]
    assert f["extreme_aspect"] == [C + 4]
    assert f["bright"] == []


def test_labels_and_sizes(corpus):
    s = stats_json(corpus)
    assert s["labels"]["names"] == ["a", "b", "c"]
    assert s["labels"]["counts"] == [15, 16, 5]
    assert s["labels"]["imbalance_ratio"] == pytest.approx(16 / 5)
    sizes = s["sizes"]
    assert sizes["width"]["min"] == 20 and sizes["width"]["max"] == 240
    assert sizes["height"]["min"] == 20 and sizes["height"]["max"] == 128
    assert sum(b["count"] for b in sizes["width"]["bins"]) == 36
    assert sum(b["count"] for b in sizes["file_bytes"]["bins"]) == 36
    assert sizes["grayscale"] == 0  # R = G = B in every pixel (or a 1-channel JPEG)
    assert sizes["cmyk"] == 0 and sizes["exif_rotated"] == 0


def test_mean_and_std_equal_numpy_over_the_same_pixels(corpus):
    if not PYTHONPATH:
        pytest.skip("needs the Python package (SHARDFEED_PYTHONPATH)")
    s = stats_json(corpus)
    code = r"""
import json, sys
import numpy as np
import shardfeed
a = shardfeed.Archive(sys.argv[1])
px = np.concatenate([a[i][0].reshape(-1, 3).astype(np.float64) for i in range(len(a))])
print(json.dumps({"mean": (px.mean(0) / 255).tolist(), "std": (px.std(0) / 255).tolist(),
                  "stats": shardfeed.stats(sys.argv[1])}))
"""
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    p = subprocess.run(["/usr/bin/python3", "-c", code, str(corpus / "train.sf")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    want = json.loads(p.stdout)
    assert np.allclose(s["mean"], want["mean"], atol=1e-4, rtol=0), (s["mean"], want["mean"])
    assert np.allclose(s["std"], want["std"], atol=1e-4, rtol=0), (s["std"], want["std"])
    assert np.allclose(s["mean_255"], np.array(want["mean"]) * 255, atol=1e-3)
    py = want["stats"]  # shardfeed.stats(): the same dict as the command's JSON
    for key in ("mean", "std", "labels", "sizes", "flags", "duplicates", "near_duplicates",
                "cross_label_duplicates", "leaks"):
        assert py[key] == s[key], key


def test_size_takes_the_loaders_centre_crop(corpus):
    whole = stats_json(corpus)
    cropped = stats_json(corpus, "--size", "32")
    assert cropped["size"] == 32 and cropped["pixels"] == 36 * 32 * 32
    assert cropped["mean"] != whole["mean"]
    assert all(abs(a - b) < 0.1 for a, b in zip(cropped["mean"], whole["mean"]))


def test_leaks_against_a_val_archive(corpus):
    val = str(corpus / "val.sf")
    s = stats_json(corpus, "--against", val)
    assert [{k: v for k, v in l.items() if k != "path"} for l in s["leaks"]] == [
        {"index": A + 6, "other": val, "other_index": 1, "kind": "exact"},
        {"index": A + 7, "other": val, "other_index": 2, "kind": "near"},
    ]
    assert [l["path"] for l in s["leaks"]] == ["a/06_p6.jpg", "a/07_p7.jpg"], s["leaks"]


def test_fail_on_exit_codes(corpus):
    train, val = corpus / "train.sf", corpus / "val.sf"
    p = run("stats", train, "-q", "--fail-on", "leaks", "--against", val)
    assert p.returncode == 1
    assert p.stderr.strip().splitlines()[-1] == "shardfeed stats: FAILED: 2 leaks", p.stderr
    p = run("stats", train, "-q", "--fail-on", "duplicates,cross-label,imbalance=3")
    assert p.returncode == 1
    assert ("FAILED: 2 duplicate groups, 4 near-duplicate groups, 1 cross-label duplicate "
            "group, class imbalance 3.2 > 3") in p.stderr, p.stderr
    assert run("stats", train, "-q", "--fail-on", "imbalance=4").returncode == 0
    assert run("stats", val, "-q", "--fail-on", "duplicates,cross-label,flags").returncode == 0
    assert run("stats", train, "-q", "--fail-on", "flags").returncode == 1
    # usage and I/O: exit 2
    assert run("stats", train, "--fail-on", "dupes").returncode == 2
    assert run("stats", train, "--fail-on", "imbalance=x").returncode == 2
    assert run("stats", train, "--near-threshold", "40").returncode == 2
    assert run("stats", corpus / "missing").returncode == 2
    assert run("stats", train, "--against", corpus / "missing").returncode == 2
    assert run("stats").returncode == 2
    # (stats stranger) The ratio is read strictly, as every number option; an empty item is
    # refused wherever it is (a trailing one was taken); the same archive twice in --against
    # (val.sf and ./val.sf) listed each leak twice.
    for bad in ("imbalance=+1.2", "imbalance=0x1.3", "imbalance= 1.2", "duplicates,",
                ",duplicates", "duplicates,,leaks"):
        p = run("stats", train, "-q", "--fail-on", bad)
        assert p.returncode == 2 and "--fail-on" in p.stderr, (bad, p.stderr)
    p = run("stats", train, "-q", "--against", val, str(corpus) + "/./val.sf")
    assert p.returncode == 2 and "an archive given already" in p.stderr, p.stderr
    # --html - writes the page to stdout, alone; both documents to stdout is refused.
    p = run("stats", val, "-q", "--json", "-", "--html", "-")
    assert p.returncode == 2 and p.stdout == "" and "both write to stdout" in p.stderr
    p = run("stats", val, "-q", "--html", "-")
    assert p.returncode == 0 and p.stdout.lstrip().startswith("<!DOCTYPE html>"), p.stdout[:80]


class _Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.images, self.refs = [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.images.append(a)
        for key in ("href", "src"):
            if key in a and tag != "img":
                self.refs.append(a[key])


def test_html_is_one_self_contained_page(corpus, tmp_path):
    import base64
    import io
    from PIL import Image
    page = tmp_path / "s.html"
    p = run("stats", corpus / "train.sf", "-q", "--html", page, "--against", corpus / "val.sf")
    assert p.returncode == 0, p.stderr
    parser = _Page()
    parser.feed(page.read_text())
    assert parser.refs == []  # nothing outside the page
    # duplicates (4 + 2 cross-label) + near (8) + 5 flagged + 2 leaks side by side (4)
    assert len(parser.images) == 4 + 2 + 8 + 5 + 4
    for img in parser.images:
        assert img["src"].startswith("data:image/png;base64,")
        thumb = Image.open(io.BytesIO(base64.b64decode(img["src"].split(",", 1)[1])))
        assert thumb.size == (96, 96)
    alts = [img["alt"] for img in parser.images]
    assert alts[:4] == ["sample 0", "sample 10", "sample 5", "sample 25"]
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser:  # a real browser renders it without a network
        shot = tmp_path / "shot.png"
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                        "--screenshot=%s" % shot, "--window-size=1200,2000", page.as_uri()],
                       capture_output=True, timeout=120)
        assert shot.exists() and Image.open(shot).size == (1200, 2000)


def test_a_sample_that_does_not_decode_is_listed_not_fatal(corpus, tmp_path):
    src = tmp_path / "src"
    save(src / "a" / "0.jpg", sc.photo(1))
    data = sc.jpeg(sc.photo(2))
    save(src / "a" / "1.jpg", data[:len(data) // 2] + b"\xff\xd9")  # a truncated scan
    assert run("pack", src, tmp_path / "x.sf", "-q", "--validate", "none").returncode == 0
    out = tmp_path / "s.json"
    p = run("stats", tmp_path / "x.sf", "-q", "--json", out, "--fail-on", "duplicates")
    assert p.returncode == 0, p.stderr
    s = json.loads(out.read_text())
    assert s["samples"] == 2 and s["decoded"] == 1
    assert [e["index"] for e in s["errors"]] == [1] and "sample 1" in s["errors"][0]["reason"]
    # Left out of everything else, as CLI.md says: class counts and record sizes counted it.
    assert s["labels"]["counts"] == [1]
    assert sum(b["count"] for b in s["sizes"]["file_bytes"]["bins"]) == 1
    assert run("stats", tmp_path / "x.sf", "-q", "--fail-on", "flags").returncode == 1


def test_a_record_damaged_since_the_pack_is_an_error_not_averaged(tmp_path):
    # stats decoded records without their checksum: 16 bytes flipped inside a stored JPEG's
    # scan still decoded, and its pixels went into the mean (and stats.json, with --save).
    src = tmp_path / "src"
    for k in range(3):
        save(src / "a" / ("%d.jpg" % k), sc.photo(40 + k))
    data = (src / "a" / "1.jpg").read_bytes()
    assert run("pack", src, tmp_path / "x.sf", "-q").returncode == 0
    clean = json.loads(run("stats", tmp_path / "x.sf", "-q", "--json", "-").stdout)
    assert clean["errors"] == [] and clean["decoded"] == 3
    shard = next(p for p in (tmp_path / "x.sf").iterdir() if p.name.startswith("shard-"))
    blob = bytearray(shard.read_bytes())
    at = blob.find(data[len(data) // 2:len(data) // 2 + 64])
    assert at > 0
    blob[at:at + 16] = bytes(b ^ 0x5A for b in blob[at:at + 16])
    shard.write_bytes(bytes(blob))
    p = run("stats", tmp_path / "x.sf", "-q", "--json", "-")
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert [e["index"] for e in s["errors"]] == [1], s["errors"]
    assert "checksum" in s["errors"][0]["reason"] and s["decoded"] == 2
    assert s["labels"]["counts"] == [2]


def test_a_sharp_strip_under_3_pixels_high_is_not_blurry(tmp_path):
    # No Laplacian can be measured on fewer than 3 rows: it read 0, so every such strip (sharp
    # noise included) was flagged blurry.
    rng = np.random.default_rng(5)
    src = tmp_path / "src"
    for k, shape in enumerate([(2, 600), (600, 2), (1, 1)]):
        noise = rng.integers(0, 256, shape + (3,), dtype=np.uint8)
        (src / "a").mkdir(parents=True, exist_ok=True)
        Image.fromarray(noise).save(src / "a" / ("%d.png" % k))
    assert run("pack", src, tmp_path / "x.sf", "-q").returncode == 0
    s = json.loads(run("stats", tmp_path / "x.sf", "-q", "--json", "-").stdout)
    assert s["decoded"] == 3 and s["flags"]["blurry"] == [], s["flags"]
    assert s["flags"]["tiny"] == [0, 1, 2]


def test_cli_and_python_read_the_options_through_one_table(corpus):
    # The same bad value is refused with the same message by both; an unknown Python keyword
    # is refused naming the closest option (before, Python took fixed positional parameters and
    # the CLI parsed with boost, each with its own ranges).
    p = run("stats", corpus / "train.sf", "--near-threshold", "17")
    assert p.returncode == 2
    assert "near_threshold (--near-threshold) must be" in p.stderr, p.stderr
    if not PYTHONPATH:
        pytest.skip("needs the Python package (SHARDFEED_PYTHONPATH)")
    code = r"""
import sys, shardfeed
for kw in ({"near_threshold": 17}, {"near_treshold": 3}):
    try:
        shardfeed.stats(sys.argv[1], **kw)
        print("accepted")
    except ValueError as e:
        print(e)
"""
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    q = subprocess.run(["/usr/bin/python3", "-c", code, str(corpus / "train.sf")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert q.returncode == 0, q.stderr
    bad, unknown = q.stdout.splitlines()
    assert bad in p.stderr, (bad, p.stderr)
    assert "did you mean 'near_threshold'" in unknown, unknown


def test_stats_save_feeds_a_loader_given_mean_archive(corpus, tmp_path):
    # Issue 23: `stats --save` keeps mean/std in ARCHIVE/stats.json; a loader with
    # mean="archive" normalises with exactly those numbers; a record that does not describe the
    # archive open now (copied from another archive) is refused, never used.
    a = tmp_path / "a.sf"
    shutil.copytree(corpus / "train.sf", a)
    p = run("stats", a, "--save", "-q")
    assert p.returncode == 0, p.stderr
    saved = json.loads((a / "stats.json").read_text())
    assert saved["format"] == "shardfeed-stats" and saved["size"] == 0
    assert np.allclose(saved["mean"], stats_json(corpus)["mean"], atol=1e-9)
    if not PYTHONPATH:
        pytest.skip("needs the Python package (SHARDFEED_PYTHONPATH)")
    other = tmp_path / "other.sf"
    shutil.copytree(corpus / "val.sf", other)
    shutil.copy(a / "stats.json", other / "stats.json")
    code = r"""
import json, sys
import numpy as np
import shardfeed
a, other = sys.argv[1], sys.argv[2]
saved = json.load(open(a + "/stats.json"))
opts = dict(batch_size=4, size=32, crop="center", dtype="float32", shuffle=False, workers=1)
x = np.concatenate([b.images.copy() for b in shardfeed.Loader(a, mean="archive", **opts)])
y = np.concatenate([b.images.copy() for b in shardfeed.Loader(a, mean=saved["mean"],
                                                              std=saved["std"], **opts)])
print(np.array_equal(x, y))
for path, kw in ((other, dict(opts)), (a, dict(opts, dtype="uint8"))):
    try:
        shardfeed.Loader(path, mean="archive", **{k: v for k, v in kw.items()})
        print("accepted")
    except ValueError as e:
        print(e)
# A std that float32 makes infinite (1e308): the file's damage (DataError naming it), not the
# caller's ValueError about a std it never gave.
record = dict(saved, std=[1e308] * 3)
with open(a + "/stats.json", "w") as f:
    json.dump(record, f)
try:
    shardfeed.Loader(a, mean="archive", **opts)
    print("accepted")
except shardfeed.DataError as e:
    print("DataError", e)
"""
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    q = subprocess.run(["/usr/bin/python3", "-c", code, str(a), str(other)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert q.returncode == 0, q.stderr
    same, changed, uint8, damaged = q.stdout.splitlines()
    assert damaged.startswith("DataError") and str(a / "stats.json") in damaged, damaged
    assert same == "True"
    assert "another state of the archive" in changed and "--save" in changed, changed
    assert "float dtype" in uint8, uint8


def test_stats_save_never_replaces_a_stats_json_it_did_not_write(corpus, tmp_path):
    # A user's own ARCHIVE/stats.json (not our record: no "format": "shardfeed-stats") is left
    # as it was and --save refused with exit 2, before the pass; a record of ours is replaced.
    a = tmp_path / "a.sf"
    shutil.copytree(corpus / "train.sf", a)
    for mine in (b'{"my": "own notes"}\n', b"not json at all", b'{"format": "other"}'):
        (a / "stats.json").write_bytes(mine)
        p = run("stats", a, "--save", "-q")
        assert p.returncode == 2, (mine, p.returncode, p.stdout, p.stderr)
        assert "stats.json" in p.stderr and "not written by" in p.stderr, p.stderr
        assert (a / "stats.json").read_bytes() == mine
        assert not p.stdout  # refused before the pass: no report
    (a / "stats.json").unlink()
    (a / "stats.json").mkdir()  # not a file at all
    assert run("stats", a, "--save", "-q").returncode == 2
    (a / "stats.json").rmdir()
    assert run("stats", a, "--save", "-q").returncode == 0
    ours = json.loads((a / "stats.json").read_text())
    ours["mean"] = [0.5, 0.5, 0.5]  # an older record of ours: replaced
    (a / "stats.json").write_text(json.dumps(ours))
    assert run("stats", a, "--save", "-q").returncode == 0
    assert json.loads((a / "stats.json").read_text())["mean"] != [0.5, 0.5, 0.5]


def test_stats_save_writes_no_record_a_loader_would_refuse(tmp_path):
    # Every image one colour: std 0, which --save wrote (exit 0) and Loader(mean="archive")
    # then refused without naming stats.json. Now refused at --save, and nothing written.
    src = tmp_path / "src"
    for k in range(2):
        save(src / "a" / ("%d.jpg" % k), sc.uniform())
    assert run("pack", src, tmp_path / "u.sf", "-q").returncode == 0
    p = run("stats", tmp_path / "u.sf", "--save", "-q", "--json", tmp_path / "r.json")
    assert p.returncode == 2 and "--save" in p.stderr and "std" in p.stderr, p.stderr
    assert not (tmp_path / "u.sf" / "stats.json").exists()
    # The pass's report is still written (and printed): only the record is not.
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["decoded"] == 2 and "std" in report["save_error"]
    assert "2 samples, 2 decoded" in p.stdout


def test_report_files_are_checked_before_the_pass(corpus, tmp_path):
    # --json/--html FILE that exists (or whose folder does not) failed with exit 2 only after
    # the whole pass and its summary; now before it, as pack --report does.
    taken = tmp_path / "taken.json"
    taken.write_text("mine")
    for flag, path in (("--json", taken), ("--html", taken), ("--json", tmp_path / "no" / "x"),
                       ("--html", tmp_path / "no" / "x.html")):
        p = run("stats", corpus / "train.sf", flag, path)
        assert p.returncode == 2 and str(path) in p.stderr, (flag, path, p.stderr)
        assert not p.stdout  # no pass, no summary
    assert taken.read_text() == "mine"
    p = run("inspect", corpus / "train.sf", "--grid", taken)
    assert p.returncode == 2 and "exists" in p.stderr and taken.read_text() == "mine"


def test_stats_summarises_every_field_and_names_duplicates_by_path(tmp_path):
    # Issue 23 on version-4 archives: per field, what its values span (rows of boxes, element
    # ranges, text lengths); duplicate groups also by source path when the pack kept one.
    from PIL import Image
    rows = []
    for i in range(4):
        Image.new("RGB", (24, 16), (10 * i, 50, 90)).save(tmp_path / ("%d.png" % i))
        rows.append({"image": "%d.png" % i, "score": 0.5 * i,
                     "boxes": [[0, 0, 4, 4]] * (i + 1), "caption": "x" * (i + 2)})
    with open(tmp_path / "m.jsonl", "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    assert run("pack", tmp_path / "m.jsonl", tmp_path / "a.sf", "-q").returncode == 0
    p = run("stats", tmp_path / "a.sf", "--json", "-", "-q")
    assert p.returncode == 0, p.stderr
    fields = json.loads(p.stdout)["fields"]
    assert fields["boxes"]["rows"] == {"min": 1, "max": 4, "mean": 2.5}
    assert fields["boxes"]["values"]["min"] == 0 and fields["boxes"]["values"]["max"] == 4
    assert fields["score"]["values"] == {"min": 0, "max": 1.5, "mean": 0.75}
    assert fields["caption"]["bytes"] == {"min": 2, "max": 5, "mean": 3.5}
    # REGRESSION: an infinite value (the writers keep inf and nan given) went into the JSON as
    # null, and the summary then failed with a JSON library error after half its report. The
    # figures are now of the finite values, the others counted apart.
    (tmp_path / "s.json").write_text('{"image": "image", "score": "float32"}')
    with open(tmp_path / "inf.jsonl", "w") as f:
        for i, v in enumerate([1.5, "inf", "-inf", "nan", 2.5]):
            f.write(json.dumps({"image": "%d.png" % (i % 4), "score": v}) + "\n")
    assert run("pack", tmp_path / "inf.jsonl", tmp_path / "i.sf", "--schema", tmp_path / "s.json",
               "-q").returncode == 0
    p = run("stats", tmp_path / "i.sf", "--json", tmp_path / "i.json")
    assert p.returncode == 0, p.stderr
    assert "field score (float32) values 1.5..2.5 (mean 2) (3 values NaN or infinite)" in p.stdout
    score = json.loads((tmp_path / "i.json").read_text())["fields"]["score"]["values"]
    assert score == {"min": 1.5, "max": 2.5, "mean": 2, "non_finite": 3}, score
    # A folder pack keeps paths: its duplicate groups are named by them too.
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    for name in ("a.png", "b.png", "c.png"):
        Image.new("RGB", (20, 20), (7, 7, 7) if name != "c.png" else (200, 9, 9)).save(src / name)
    assert run("pack", tmp_path / "src", tmp_path / "f.sf", "-q").returncode == 0
    s = json.loads(run("stats", tmp_path / "f.sf", "--json", "-", "-q").stdout)
    assert s["duplicate_paths"] == [["c/a.png", "c/b.png"]], s["duplicates"]
    # So are the near groups, the flags, the errors and the leaks (they had indices only).
    assert s["near_duplicate_paths"] == [] and s["cross_label_duplicate_paths"] == []
    assert s["flag_paths"]["uniform"] == ["c/a.png", "c/b.png", "c/c.png"], s["flags"]
    assert s["flag_paths"]["dark"] == ["c/a.png", "c/b.png"], s["flags"]
    s = json.loads(run("stats", tmp_path / "f.sf", "--json", "-", "-q", "--against",
                       tmp_path / "f.sf").stdout)
    assert sorted(l["path"] for l in s["leaks"]) == ["c/a.png", "c/b.png", "c/c.png"], s["leaks"]


def test_exact_duplicates_are_equal_pixels_not_equal_sums(tmp_path):
    # Issue 23, the pass's speed: stats hashes the pixels only of images whose size, channel
    # sums and perceptual hash another image shares, decoding them again. Two images made of
    # the same pixels in another order share all of those (two neighbours swapped inside one
    # cell of the perceptual hash) and are not duplicates; the same pixels stored as another
    # file are, here and across archives.
    from PIL import Image
    rng = np.random.default_rng(5)
    noise = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    swapped = noise.copy()
    swapped[0, 0], swapped[0, 1] = noise[0, 1].copy(), noise[0, 0].copy()
    assert not np.array_equal(noise, swapped)
    train, val = tmp_path / "train", tmp_path / "val"
    for folder, name, pixels, level in ((train, "0.png", noise, 9), (train, "1.png", swapped, 9),
                                        (train, "2.png", noise, 1), (val, "0.png", swapped, 1)):
        (folder / "a").mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(folder / "a" / name, compress_level=level)
    assert (train / "a" / "0.png").read_bytes() != (train / "a" / "2.png").read_bytes()
    for src in (train, val):
        p = run("pack", src, str(src) + ".sf", "-q")
        assert p.returncode == 0, p.stderr
    out = tmp_path / "s.json"
    p = run("stats", str(train) + ".sf", "--against", str(val) + ".sf", "--json", out, "-q")
    assert p.returncode == 0, p.stderr
    s = json.loads(out.read_text())
    assert s["duplicates"] == [[0, 2]]
    exact = [(x["index"], x["other_index"]) for x in s["leaks"] if x["kind"] == "exact"]
    assert exact == [(1, 0)]


def test_an_archive_without_a_class_field_has_no_class_counts(tmp_path):
    # REGRESSION (found by a stranger's test): a COCO pack's class names are its categories and
    # its labels are per box; every index entry's label is 0, and stats counted every image as
    # the first category (by_name {"person": 8, "car": 0}), so --fail-on imbalance always
    # failed ("inf > 100"). Archive.labels() and archive[i][1] said 0 too; they say None now.
    from PIL import Image
    for i in range(4):
        save(tmp_path / "images" / ("%d.jpg" % i), Image.new("RGB", (32, 24), (90 + 20 * i,) * 3))
    (tmp_path / "inst.json").write_text(json.dumps({
        "images": [{"id": i, "file_name": "%d.jpg" % i, "width": 32, "height": 24}
                   for i in range(4)],
        "categories": [{"id": 1, "name": "person"}, {"id": 2, "name": "car"}],
        "annotations": [{"id": 1, "image_id": 0, "category_id": 2, "bbox": [1, 1, 4, 4]}]}))
    out = tmp_path / "a"
    p = run("pack", tmp_path / "inst.json", out, "--images", tmp_path / "images", "-q")
    assert p.returncode == 0, p.stderr
    p = run("stats", out, "--json", "-", "-q", "--fail-on", "imbalance=100")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["labels"] == {"names": [], "counts": [], "by_name": {},
                                              "imbalance_ratio": None}
    p = run("stats", out, "-q")
    assert "labels: none (the samples have no class field)" in p.stdout, p.stdout
    if PYTHONPATH:
        code = ("import shardfeed; a = shardfeed.Archive(%r); "
                "print(a.labels(), a[0][1], a.sample(0)['labels'].tolist())" % str(out))
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=PYTHONPATH), timeout=60)
        assert p.stdout.split() == ["None", "None", "[1]"], p.stdout + p.stderr


def test_a_near_group_never_holds_an_exact_pair(tmp_path):
    # A photo, a byte copy of it and a re-encoded copy: the re-encode is near both, and the
    # near group held all three, the exact pair included ("whose pixels differ").
    src = tmp_path / "src"
    save(src / "a" / "0.jpg", sc.photo(60))
    save(src / "a" / "1.jpg", (src / "a" / "0.jpg").read_bytes())
    save(src / "a" / "2.jpg", sc.reencoded(sc.photo(60)))
    save(src / "a" / "3.jpg", sc.photo(61))
    assert run("pack", src, tmp_path / "x.sf", "-q").returncode == 0
    s = json.loads(run("stats", tmp_path / "x.sf", "-q", "--json", "-").stdout)
    assert s["duplicates"] == [[0, 1]]
    assert s["near_duplicates"] == [[0, 2]], s["near_duplicates"]


def test_damaged_field_values_are_an_error_and_the_same_file_twice_is_refused(tmp_path):
    # A sample whose field values (not its image) were damaged since the pack: verify and the
    # loader refuse it, stats counted it (errors: []). And --json F --html F ran the whole pass
    # before saying F exists.
    src = tmp_path / "src"
    for k in range(3):
        save(src / ("%d.jpg" % k), sc.photo(70 + k))
    rows = "".join(json.dumps({"image": "%d.jpg" % k, "cap": "caption number %d" % k}) + "\n"
                   for k in range(3))
    (src / "m.jsonl").write_text(rows)
    assert run("pack", src / "m.jsonl", tmp_path / "x.sf", "-q").returncode == 0
    shard = next(p for p in (tmp_path / "x.sf").iterdir() if p.name.startswith("shard-"))
    blob = bytearray(shard.read_bytes())
    at = blob.find(b"caption number 1")
    assert at > 0
    blob[at:at + 7] = b"CAPTION"
    shard.write_bytes(bytes(blob))
    s = json.loads(run("stats", tmp_path / "x.sf", "-q", "--json", "-").stdout)
    assert [e["index"] for e in s["errors"]] == [1] and "cap" in s["errors"][0]["reason"]
    assert s["fields"]["cap"]["samples"] == 2 and s["decoded"] == 2
    p = run("stats", tmp_path / "x.sf", "--json", tmp_path / "r", "--html", tmp_path / "r")
    assert p.returncode == 2 and "same file" in p.stderr and not p.stdout


def test_the_same_report_file_by_two_spellings_is_refused_before_the_pass(corpus, tmp_path):
    p = run("stats", corpus / "train.sf", "--json", tmp_path / "r", "--html",
            str(tmp_path) + "/./r")
    assert p.returncode == 2 and "same file" in p.stderr and not p.stdout
    assert not (tmp_path / "r").exists()
