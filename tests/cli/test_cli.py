"""The shardfeed commands as a user runs them: exit codes, reports, atomicity under kill -9."""
import json
import re
import os
import shutil
import socket
import signal
import subprocess
import time

import pytest

CLI = os.environ.get("SHARDFEED_CLI", "shardfeed")
DATA = os.environ.get("SHARDFEED_TEST_DATA", "")
GOOD = os.path.join(DATA, "good")
BAD = os.path.join(DATA, "bad")


def run(*args, check=None):
    p = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True)
    if check is not None:
        assert p.returncode == check, (p.returncode, p.stdout, p.stderr)
    return p


@pytest.fixture
def mixed(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(os.path.join(GOOD, "dog"), src / "dog")
    shutil.copytree(os.path.join(BAD, "broken"), src / "broken", symlinks=True)
    return src


def test_pack_verify_inspect_extract(tmp_path):
    out = tmp_path / "a"
    p = run("pack", GOOD, out, "--report", tmp_path / "r.json", check=0)
    assert "packed 36 of 36" in p.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["packed"] == 36 and report["skipped"] == []
    v = json.loads(run("verify", out, "--decode", "--json", check=0).stdout)
    assert v["ok"] and v["checked"] == 36
    info = json.loads(run("inspect", out, "--json", check=0).stdout)
    assert info["samples"] == 36
    assert [c["name"] for c in info["classes"]] == ["cat", "dog", "zebra"]
    assert [c["count"] for c in info["classes"]] == [12, 12, 12]
    assert info["encoding"] == "auto"  # the default: JPEGs kept, the other images lossless
    run("extract", out, tmp_path / "x", check=0)
    assert sorted(os.listdir(tmp_path / "x")) == ["cat", "dog", "zebra"]
    assert len(os.listdir(tmp_path / "x" / "dog")) == 12


def test_inspect_shows_upright_ranges_and_re_encoded_records(tmp_path):
    # REGRESSION: inspect's height/width ranges were the stored frame, not the upright one its
    # own shape gives (half the photos turned by EXIF: "height 48..48, width 64..64"), and it
    # never showed reencoded_records: PNGs re-encoded as lossy JPEG read as "the others are the
    # source files' bytes".
    from PIL import Image
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    for i in range(4):
        exif = Image.Exif()
        exif[0x0112] = 6 if i % 2 else 1
        Image.new("RGB", (64, 48), (9 * i, 40, 80)).save(src / ("%d.jpg" % i), exif=exif)
    run("pack", tmp_path / "src", tmp_path / "o", "-q", check=0)
    info = json.loads(run("inspect", tmp_path / "o", "--json", check=0).stdout)
    assert info["height_range"] == [48, 64] and info["width_range"] == [48, 64], info
    assert info["reencoded_records"] == 0
    text = run("inspect", tmp_path / "o", check=0).stdout
    assert "height 48..64, width 48..64" in text, text
    for i in range(4):
        Image.new("RGB", (64, 64), (9 * i, 40, 80)).save(src / ("p%d.png" % i))
    run("pack", tmp_path / "src", tmp_path / "j", "-q", "--encoding", "jpeg", "--size", "128",
        check=0)
    info = json.loads(run("inspect", tmp_path / "j", "--json", check=0).stdout)
    assert info["reencoded_records"] == 4, info
    text = run("inspect", tmp_path / "j", check=0).stdout
    assert "re-encoded:  4 of 8 records decoded and stored again at pack (as JPEG, lossy)" in text
    assert "the others are the source files' bytes" not in text, text


def test_report_names_every_bad_file(tmp_path, mixed):
    out = tmp_path / "a"
    p = run("pack", mixed, out, "--report", tmp_path / "r.json", check=0)
    assert "9 skipped" in p.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    skipped = {os.path.basename(s["path"]): s["reason"] for s in report["skipped"]}
    assert set(skipped) == {"bomb.jpg", "dangling.jpg", "empty.jpg", "header_only.jpg",
                            "html.jpeg", "not_an_image.jpg", "random.png", "truncated.jpg",
                            "truncated.png"}
    assert all(skipped.values())
    assert json.loads(run("inspect", out, "--json", check=0).stdout)["samples"] == 12


def test_strict_fails_and_leaves_no_archive(tmp_path, mixed):
    out = tmp_path / "a"
    p = run("pack", mixed, out, "--strict", "--report", tmp_path / "r.json")
    assert p.returncode == 1
    assert "bomb.jpg" in p.stderr
    assert not out.exists() and not (tmp_path / "a.partial").exists()
    assert json.loads((tmp_path / "r.json").read_text())["skipped"]


def test_verify_fails_on_a_flipped_byte_and_names_the_sample(tmp_path):
    out = tmp_path / "a"
    run("pack", GOOD, out, "--encoding", "zstd", "--size", "32", check=0)
    shard = out / "shard-00000.mdb"
    data = bytearray(shard.read_bytes())
    # The last chunk is written right before the header and index: flip a byte well inside the
    # first page of record data (LMDB's first two pages are meta pages).
    data[3 * 4096 + 100] ^= 0xFF
    shard.write_bytes(bytes(data))
    p = run("verify", out, "--json")
    assert p.returncode == 1
    v = json.loads(p.stdout)
    assert not v["ok"]
    assert v["bad_samples"] or v["bad_shards"]
    if v["bad_samples"]:
        assert "checksum" in v["bad_samples"][0]["reason"]


def test_wrong_arguments_are_usage_errors(tmp_path):
    assert run("pack").returncode == 2
    assert run("pack", GOOD, tmp_path / "a", "--encoding", "png").returncode == 2
    # jpeg takes --size as a resolution cap (issue 13), but not a centre crop or a lone
    # --max-side
    assert run("pack", GOOD, tmp_path / "a", "--size", "64", "--crop", "center").returncode == 2
    assert run("pack", GOOD, tmp_path / "a", "--max-side").returncode == 2
    assert run("frobnicate").returncode == 2
    p = run("verify", tmp_path / "missing")
    assert p.returncode == 2 and "missing" in p.stderr
    p = run("pack", tmp_path / "nope", tmp_path / "a")  # a missing SRC, as verify's ARCHIVE
    assert p.returncode == 2 and "nope" in p.stderr
    run("pack", GOOD, tmp_path / "a", check=0)
    p = run("pack", GOOD, tmp_path / "a")
    assert p.returncode == 2 and "--overwrite" in p.stderr
    run("pack", GOOD, tmp_path / "a", "--overwrite", check=0)


def test_kill_mid_pack_leaves_no_archive_and_rerun_works(tmp_path):
    # Enough work that the pack is surely still running when it is killed.
    src = tmp_path / "src"
    for cls in ("cat", "dog", "zebra"):
        os.makedirs(src / cls)
        for i, name in enumerate(sorted(os.listdir(os.path.join(GOOD, cls)))):
            if name.startswith("."):
                continue
            for k in range(25):
                shutil.copy(os.path.join(GOOD, cls, name), src / cls / ("%02d_%s" % (k, name)))
    out = tmp_path / "a"
    args = [CLI, "pack", str(src), str(out), "--encoding", "zstd", "--level", "19",
            "--workers", "1", "-q"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    partial = tmp_path / "a.partial"
    deadline = time.time() + 60
    while time.time() < deadline and not (partial / "shard-00000.mdb").exists():
        time.sleep(0.01)  # a polling interval, bounded
    # Killed as soon as its first shard exists (no sleep to let it "get further": a crash at
    # any point must leave the same: no archive, and a rerun that succeeds).
    assert proc.poll() is None, "pack finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    p = run("verify", out)
    assert p.returncode != 0
    # A rerun cleans up the partial output and succeeds.
    p = subprocess.run(args, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert not partial.exists()
    v = json.loads(run("verify", out, "--json", check=0).stdout)
    assert v["ok"] and v["samples"] == 900


def test_hdf5_backend_and_convert(tmp_path):
    h5 = tmp_path / "h"
    run("pack", GOOD, h5, "--backend", "hdf5", check=0)
    assert (h5 / "shard-00000.h5").exists()
    v = json.loads(run("verify", h5, "--decode", "--json", check=0).stdout)
    assert v["ok"] and v["checked"] == 36
    assert json.loads(run("inspect", h5, "--json", check=0).stdout)["backend"] == "hdf5"
    run("convert", h5, tmp_path / "l", check=0)  # the other backend by default
    a = json.loads(run("inspect", tmp_path / "l", "--json", check=0).stdout)
    assert a["backend"] == "lmdb" and a["samples"] == 36
    b = json.loads(run("bench", h5, "--size", "32", "--batch-size", "8", "--json", check=0).stdout)
    assert b["images"] == 36 and b["images_per_second"] > 0
    assert b["epochs"][0]["kept_slots"] == 0  # CLI.md names it (it was missing)
    assert run("convert", h5, tmp_path / "x", "--backend", "tar").returncode == 2


def test_hostile_folder(tmp_path):
    """Names and file kinds a scraped dataset really contains: the good images are packed, the
    rest is skipped or ignored with a reason, and nothing hangs or crashes."""
    src = tmp_path / "src"
    good = sorted(f for f in os.listdir(os.path.join(GOOD, "cat")) if not f.startswith("."))
    weird = src / "wéird class"
    os.makedirs(weird)
    names = ["space name.jpg", "new\nline.jpg", "ünïcødé.jpg", "x" * 200 + ".jpg"]
    for name, f in zip(names, good):
        shutil.copy(os.path.join(GOOD, "cat", f), weird / name)
    # A name that is not UTF-8 at all.
    with open(os.path.join(os.fsencode(weird), b"latin1-\xe9t\xe9.jpg"), "wb") as out:
        with open(os.path.join(GOOD, "cat", good[0]), "rb") as f:
            out.write(f.read())
    bad = src / "bad"
    os.makedirs(bad / "nested" / "deeper")
    shutil.copy(os.path.join(GOOD, "dog", "dog_000.jpg"), bad / "nested" / "deeper" / "ok.jpg")
    os.symlink("/dev/zero", bad / "zero.jpg")          # a device: never read
    os.mkfifo(bad / "pipe.png")                         # a FIFO: never opened for reading
    sock = socket.socket(socket.AF_UNIX)                # a socket: open() says ENXIO
    sock.bind(str(bad / "sock.jpg"))
    sock.close()
    os.symlink("..", bad / "nested" / "loop")          # a directory cycle
    os.makedirs(bad / "folder.jpg")                     # a directory with an image name
    with open(bad / "movie.mp4", "wb") as f:            # large and not an image
        f.write(b"\x00\x00\x00\x18ftypmp42" + os.urandom(1 << 20))
    with open(bad / "thumbs.db", "wb") as f:
        f.write(b"\xd0\xcf\x11\xe0" + b"\x00" * 100)
    with open(bad / "page.svg", "w") as f:
        f.write("<svg xmlns='http://www.w3.org/2000/svg'/>")
    with open(src / "README.txt", "w") as f:            # outside any class folder
        f.write("hello")
    out = tmp_path / "a"
    p = subprocess.run([CLI, "pack", str(src), str(out), "--report", str(tmp_path / "r.json")],
                       capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["packed"] == 6  # 5 weird names + the nested one
    reasons = {os.path.basename(s["path"]): s["reason"] for s in report["skipped"]}
    assert "not a regular file" in reasons["zero.jpg"]
    assert "not a regular file" in reasons["pipe.png"]
    assert "not a regular file (a socket)" in reasons["sock.jpg"]  # "No such device or address"
    assert "not an image" in reasons["movie.mp4"]  # MP4 shares HEIF's box: told apart, not read
    assert "not an image" in reasons["thumbs.db"] and "not an image" in reasons["page.svg"]
    ignored = {os.path.basename(s["path"]): s["reason"] for s in report["ignored"]}
    assert "cycle" in ignored.get("loop", "") or "cycle" in " ".join(ignored.values())
    assert "class folder" in ignored["README.txt"]
    v = json.loads(run("verify", out, "--decode", "--json", check=0).stdout)
    assert v["ok"] and v["samples"] == 6
    info = json.loads(run("inspect", out, "--json", check=0).stdout)
    assert [c["name"] for c in info["classes"]] == ["bad", "wéird class"]


def _limit_file_size():
    import resource
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes then fail with EFBIG, like ENOSPC
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))


@pytest.mark.parametrize("backend", ["lmdb", "hdf5"])
def test_a_full_disk_fails_cleanly_and_leaves_no_archive(tmp_path, backend):
    out = tmp_path / "a"
    p = subprocess.run([CLI, "pack", GOOD, str(out), "--encoding", "raw", "--backend", backend],
                       capture_output=True, text=True, preexec_fn=_limit_file_size, timeout=120)
    assert p.returncode == 3, (p.returncode, p.stderr)
    assert "error" in p.stderr and "a.partial/shard-00000" in p.stderr, p.stderr  # names the file
    assert not out.exists() and not (tmp_path / "a.partial").exists()
    run("pack", GOOD, out, "--encoding", "raw", "--backend", backend, check=0)  # room again: works


def test_tiff_heic_avif_are_packed(tmp_path):
    out = tmp_path / "a"
    src = os.path.join(DATA, "formats")
    run("pack", src, out, "--encoding", "raw", "--report", tmp_path / "r.json", check=0)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["packed"] == 6 and report["skipped"] == []
    run("pack", src, tmp_path / "j", check=0)  # re-encoded to JPEG
    v = json.loads(run("verify", tmp_path / "j", "--decode", "--json", check=0).stdout)
    assert v["ok"] and v["samples"] == 6


def test_an_animated_webp_is_its_first_frame_as_pillow_shows_it(tmp_path):
    """It was skipped as "WebP decode failed" (GIF and TIFF already gave their first frame)."""
    import numpy as np
    from PIL import Image
    src = tmp_path / "src" / "cls"
    src.mkdir(parents=True)
    rng = np.random.default_rng(9)
    frames = [Image.fromarray(rng.integers(0, 256, (20, 30, 4), dtype=np.uint8)) for _ in range(3)]
    frames[0].save(src / "moving.webp", save_all=True, append_images=frames[1:], lossless=True,
                   duration=100, loop=0)
    with Image.open(src / "moving.webp") as im:
        assert getattr(im, "is_animated", False) and im.n_frames == 3
        rgba = np.asarray(im.convert("RGBA"), dtype=np.float64)
    # Composited over white, as shardfeed shows every image with alpha.
    alpha = rgba[..., 3:] / 255
    want = np.rint(rgba[..., :3] * alpha + 255 * (1 - alpha))
    run("pack", tmp_path / "src", tmp_path / "a", "--encoding", "raw", check=0)
    run("extract", tmp_path / "a", tmp_path / "x", check=0)  # the stored pixels, as PNG
    got = np.asarray(Image.open(tmp_path / "x" / "cls" / "moving.png"))
    assert got.shape == (20, 30, 3)
    assert np.abs(got.astype(np.int16) - want).max() <= 1
    # Cut short, it is a bad file named as such, not a crash or half an image.
    data = (src / "moving.webp").read_bytes()
    (src / "moving.webp").write_bytes(data[:len(data) * 2 // 3])
    p = run("pack", tmp_path / "src", tmp_path / "b", check=1)
    assert "moving.webp" in p.stderr and "WebP" in p.stderr, p.stderr


def test_packing_into_the_image_folder_never_packs_the_archive(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(GOOD, src)
    out = src / "train.sf"
    run("pack", src, out, check=0)
    # --overwrite never deletes anything inside the source folder, even an archive of ours.
    p = run("pack", src, out, "--overwrite", check=2)
    assert "inside the source" in p.stderr
    # A partial output of another archive sits in the tree too, without our marker: it may be
    # the user's (a copy of an archive), so packing to that name refuses and leaves it alone.
    os.makedirs(src / "again.sf.partial")
    shutil.copy(out / "manifest.json", src / "again.sf.partial" / "manifest.json")
    p = run("pack", src, src / "again.sf", check=2)
    assert "again.sf.partial" in p.stderr and "move it away" in p.stderr
    assert (src / "again.sf.partial" / "manifest.json").read_bytes() == \
        (out / "manifest.json").read_bytes()
    # One of ours (it carries the marker a writer puts there first) is a killed run's leftover:
    # recovered under the lock, and packing takes neither the archive nor the partial for a class.
    (src / "again.sf.partial" / ".shardfeed-partial").write_text("")
    run("pack", src, src / "again.sf", "--report", tmp_path / "r.json", check=0)
    info = json.loads(run("inspect", src / "again.sf", "--json", check=0).stdout)
    assert [c["name"] for c in info["classes"]] == ["cat", "dog", "zebra"]
    assert info["samples"] == 36
    report = json.loads((tmp_path / "r.json").read_text())
    reasons = {os.path.basename(i["path"]): i["reason"] for i in report["ignored"]}
    assert reasons["again.sf.partial"] == "the output archive"
    assert reasons["train.sf"] == "a shardfeed archive"
    assert not os.path.exists(src / "again.sf.partial")


def test_crop_none_keeps_the_stored_shape_and_never_distorts(tmp_path):
    fixed = tmp_path / "fixed"
    run("pack", GOOD, fixed, "--encoding", "raw", "--size", "32", "--crop", "center", check=0)
    j = json.loads(run("bench", fixed, "--crop", "none", "--json", "--epochs", "1",
                       check=0).stdout)
    assert j["output_shape"] == [32, 32]  # not the 224 of the crops' default
    text = run("bench", fixed, "--crop", "none", "--epochs", "1", check=0).stdout
    assert "32x32 whole images at their stored shape" in text
    # A square fixed shape may be resized (no distortion)...
    j = json.loads(run("bench", fixed, "--crop", "none", "--size", "16", "--json", "--epochs",
                       "1", check=0).stdout)
    assert j["output_shape"] == [16, 16]
    # ...but mixed shapes have no single undistorted shape: an error naming what fits.
    mixed = tmp_path / "mixed"
    run("pack", GOOD, mixed, check=0)
    p = run("bench", mixed, "--crop", "none", "--epochs", "1", check=2)
    assert "different shapes" in p.stderr and "'squash'" in p.stderr and "'center'" in p.stderr
    j = json.loads(run("bench", mixed, "--crop", "squash", "--size", "24", "--json", "--epochs",
                       "1", check=0).stdout)
    assert j["output_shape"] == [24, 24] and j["images"] == 36


def test_pack_exit_codes_bad_data_is_1_nothing_to_pack_is_2(tmp_path):
    bad = tmp_path / "bad" / "cls"
    bad.mkdir(parents=True)
    (bad / "a.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (bad / "b.png").write_bytes(b"")
    p = run("pack", tmp_path / "bad", tmp_path / "out", check=1)
    assert "no image could be packed" in p.stderr
    assert not (tmp_path / "out").exists()
    p = run("pack", tmp_path / "bad", tmp_path / "made" / "for" / "out", check=1)
    assert not (tmp_path / "made").exists()  # the folders made for the output go with it
    empty = tmp_path / "empty" / "cls"
    empty.mkdir(parents=True)
    p = run("pack", tmp_path / "empty", tmp_path / "out2", check=2)
    assert "no image files found" in p.stderr


def test_inspect_grid_writes_a_contact_sheet_of_each_class(tmp_path):
    pytest.importorskip("PIL")
    import numpy as np
    from PIL import Image
    out = tmp_path / "a"
    run("pack", GOOD, out, check=0)
    sheet = tmp_path / "sheet.png"
    run("inspect", out, "--grid", sheet, "--per-class", "4", "--size", "32", check=0)
    img = np.asarray(Image.open(sheet).convert("RGB")).astype(np.int32)
    # Layout (validate/inspect.h): a label column as wide as the longest "N name" plus
    # padding, then 4 tiles of 32 px with 6 px gaps; rows of 32 + 15 (caption) + 6 px.
    pad, tile, row_h = 6, 32, 32 + 15 + 6
    label_w = len("0 zebra") * 6 + 2 * pad
    assert img.shape == (3 * row_h + pad, label_w + 4 * (tile + pad) + pad, 3)
    for c in range(3):
        y0 = pad + c * row_h
        # The class label is written in the label column, level with the tiles.
        assert (img[y0:y0 + tile, pad:label_w - pad] < 100).any(), c
        for k in range(4):
            x0 = label_w + k * (tile + pad)
            cell = img[y0:y0 + tile, x0:x0 + tile]
            # A thumbnail (not the grey background, not the red of a sample that failed).
            assert (np.abs(cell - 225).sum(axis=2) > 0).mean() > 0.1, (c, k)  # aspect <= 1:4
            assert not ((cell[..., 0] == 220) & (cell[..., 1] == 40)).all(), (c, k)
            caption = img[y0 + tile + 2:y0 + tile + 13, x0:x0 + tile]
            assert (caption < 150).any(), (c, k)  # "#index" beneath the tile
    p = run("inspect", out, "--grid", sheet, "--per-class", "0", check=2)
    assert "per_class" in p.stderr


@pytest.mark.skipif(not shutil.which("taskset") or (os.cpu_count() or 1) < 2,
                    reason="needs taskset and two CPUs")
def test_workers_0_means_the_cpus_this_process_may_use(tmp_path):
    # Pinned to one CPU (taskset, as a scheduler's binding would), "all cores" is one worker:
    # more would only take turns on that CPU.
    out = tmp_path / "a"
    run("pack", GOOD, out, check=0)
    p = subprocess.run(["taskset", "-c", "0", CLI, "bench", str(out), "--epochs", "1", "--json"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["workers"] == 1
    assert json.loads(run("bench", out, "--epochs", "1", "--json", check=0).stdout)["workers"] > 1


def test_grid_and_plot_never_replace_a_file_the_user_has(tmp_path):
    out = tmp_path / "a"
    run("pack", GOOD, out, check=0)
    precious = tmp_path / "holiday.png"
    precious.write_bytes(b"the only copy")
    p = run("inspect", out, "--grid", precious, check=2)
    assert "exists" in p.stderr and precious.read_bytes() == b"the only copy"
    p = run("bench", out, "--sweep", "workers=1", "--plot", precious, check=2)
    assert "exists" in p.stderr and precious.read_bytes() == b"the only copy"
    notes = tmp_path / "new.png.json"
    notes.write_bytes(b"mine")
    p = run("bench", out, "--sweep", "workers=1", "--plot", tmp_path / "new.png", check=2)
    assert "exists" in p.stderr and notes.read_bytes() == b"mine"
    assert not (tmp_path / "new.png").exists()


# --- Hostile arguments: every numeric option of every command, read from its --help ----------

HELP_ENTRY = re.compile(r"^  (?:-\w \[ )?--([\w-]+)(?: \])?( \[?=?arg)?(?:\(=[^)]*\)\])?"
                        r"(?: \(=([^)]*)\))?\s*(.*)$")
RANGE = re.compile(r"a whole number in (\d+)\.\.(\d+)|a whole number >= (\d+)|a number in "
                   r"[\[(]|a size in bytes|I/N with")


def help_entries(command):
    """{flag: (takes_value, default, help text)} of `shardfeed COMMAND --help`, with the help
    lines that wrap joined."""
    text = run(command, "--help", check=0).stdout
    entries, last = {}, None
    for line in text.splitlines():
        m = HELP_ENTRY.match(line)
        if m:
            last = m.group(1)
            entries[last] = [bool(m.group(2)), m.group(3), m.group(4)]
        elif last and line.startswith("      "):
            entries[last][2] += " " + line.strip()
    return {k: (v[0], v[1], re.sub(r"\s+", " ", v[2])) for k, v in entries.items()}


def numeric_options(command):
    """The options whose help states a numeric range: {flag: (min, max) or None}."""
    out = {}
    for flag, (_, _, text) in help_entries(command).items():
        m = RANGE.search(text)
        if m:
            out[flag] = ((int(m.group(1)), int(m.group(2))) if m.group(1) else
                         (int(m.group(3)), None) if m.group(3) else None)
    return out


@pytest.fixture(scope="module")
def small_archive(tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile") / "a.sf"
    run("pack", GOOD, out, "-q", check=0)
    return out


def command_line(command, archive, tmp):
    return {"pack": ["pack", GOOD, tmp / "out", "-q"],
            "verify": ["verify", archive],
            "inspect": ["inspect", archive],
            "extract": ["extract", archive, tmp / "x"],
            "stats": ["stats", archive, "-q"],
            "bench": ["bench", archive, "--epochs=1"],
            "tune": ["tune", archive, "--step-ms=0", "--batches=1"]}[command]


HOSTILE = ["-1", "-2", " 5", "5 ", "", "nan", "inf", "1e400", "0x10", "+3",
           "99999999999999999999", "18446744073709551616", "1.5.5"]


def test_every_numeric_option_of_every_command_refuses_hostile_values(tmp_path, small_archive):
    """A user's hostile or mistyped numbers: each is exit 2 with an error naming the option,
    never a signal, an abort or a silently wrapped value."""
    expect = {"pack": {"size", "quality", "level", "seed", "max-pixels", "chunk-size",
                       "shard-size", "workers", "part"},
              "verify": {"workers", "max-pixels"},
              "inspect": {"per-class", "size"},
              "extract": {"max-pixels"},
              "stats": {"max-pixels"},
              "bench": {"batch-size", "seed", "max-workers", "workers", "prefetch", "epochs",
                        "step-ms", "timeout", "size", "rank", "world-size", "ring-mb"},
              "tune": {"step-ms", "batches", "max-workers", "batch-size", "wait-target"}}
    for command, names in expect.items():
        options = numeric_options(command)
        assert names <= set(options), (command, names - set(options))
        for flag, bounds in options.items():
            values = list(HOSTILE)
            if bounds and bounds[1] is not None:
                values += [str(bounds[1] + 1), "100000" if bounds[1] < 100000 else "4294967297"]
            if bounds and bounds[0] > 0:
                values.append(str(bounds[0] - 1))
            if flag == "part":
                values += ["0/4294967297", "0/-2", " 0/2", "0/2 ", "1/1", "0/0", "0/100000",
                           "0/2/3", "/2", "0/"]
            if flag == "max-workers":
                values.append("100000")
            for value in values:
                line = command_line(command, small_archive, tmp_path)
                p = subprocess.run([CLI, *map(str, line), "--" + flag, value],
                                   capture_output=True, text=True, timeout=120)
                where = (command, flag, value, p.returncode, p.stdout[-300:], p.stderr)
                assert p.returncode == 2, where  # never a signal (< 0) or an abort (134)
                # the option's own refusal naming its range, or boost's for a missing value
                assert ("(--%s) must be" % flag in p.stderr or
                        "option '--%s'" % flag in p.stderr), where
                assert "terminate" not in p.stderr, where


def test_every_numeric_option_states_its_range_in_help():
    for command in ["pack", "verify", "inspect", "extract", "bench", "tune"]:
        numeric = numeric_options(command)
        for flag, (takes, default, text) in help_entries(command).items():
            if takes and default is not None and re.fullmatch(r"-?[\d.]+", default):
                assert flag in numeric, (command, flag, text)


def test_huge_max_workers_is_refused_not_an_abort(small_archive):
    for command in (["bench", small_archive], ["tune", small_archive, "--step-ms", "0"]):
        p = run(*command, "--max-workers", "100000", check=2)
        assert "max_workers (--max-workers) must be a whole number in 0..4096" in p.stderr


def test_part_is_parsed_strictly(tmp_path):
    for spec in ["0/4294967297", "0/-2", " 0/2", "4294967296/4294967297"]:
        p = run("pack", GOOD, tmp_path / "o", "--part", spec, "-q", check=2)
        assert "part (--part) must be I/N with 0 <= I < N <= 99999" in p.stderr, p.stderr
    assert not (tmp_path / "o.parts").exists()


def test_quiet_is_taken_by_every_command(tmp_path, small_archive):
    for command in ["pack", "verify", "inspect", "extract", "bench", "tune", "convert", "merge"]:
        assert "-q [ --quiet ]" in run(command, "--help", check=0).stdout, command
    run("pack", GOOD, tmp_path / "m", "--part", "0/1", "-q", check=0)
    run("merge", tmp_path / "m.parts", tmp_path / "m", "-q", check=0)


def test_an_unknown_flag_or_command_suggests_the_closest(small_archive):
    p = run("bench", small_archive, "--batch-sise", "8", check=2)
    assert "unrecognised option '--batch-sise'; did you mean --batch-size?" in p.stderr
    p = run("pack", GOOD, "x", "--chunk-bytes", "1M", check=2)
    assert "did you mean --chunk-size?" in p.stderr
    p = run("bench", small_archive, "--num-workers", "2", check=2)
    assert "did you mean --workers?" in p.stderr
    p = run("bench", small_archive, "--sweep", "worker=1,2", check=2)
    assert "unexpected loader option 'worker'; did you mean 'workers'?" in p.stderr
    p = run("verfy", small_archive, check=2)
    assert "did you mean 'verify'?" in p.stderr
    # A prefix of a flag is not the flag: `--worker 2` was taken as --workers, `--over` as
    # --overwrite, without a word.
    p = run("bench", small_archive, "--worker", "2", check=2)
    assert "unrecognised option '--worker'; did you mean --workers?" in p.stderr
    p = run("pack", GOOD, small_archive, "--over", check=2)
    assert "unrecognised option '--over'" in p.stderr


def test_options_that_would_do_nothing_are_refused(small_archive, tmp_path):
    """Each was accepted and ignored, so the user never learnt it did nothing."""
    p = run("inspect", small_archive, "--grid", "", check=2)
    assert "--grid needs the path" in p.stderr
    p = run("inspect", small_archive, "--size", "64", check=2)
    assert "go with --grid" in p.stderr
    run("inspect", small_archive, "--grid", tmp_path / "g.png", "--size", "64", check=0)
    p = run("--version", "extra", check=2)
    assert "--version takes no argument" in p.stderr
    for encoding in ("raw", "zstd"):
        p = run("pack", GOOD, tmp_path / "x", "--jpeg-layout", "indexed", "--encoding", encoding,
                check=2)
        assert "stores none" in p.stderr and not (tmp_path / "x").exists()


def test_overwrite_of_a_symlink_leaves_the_link_and_its_archive(small_archive, tmp_path):
    link = tmp_path / "current"
    link.symlink_to(small_archive)
    before = (small_archive / "manifest.json").read_bytes()
    p = run("pack", GOOD, link, "--overwrite", "--encoding", "raw", check=2)
    assert "is a symbolic link" in p.stderr and str(small_archive) in p.stderr
    assert link.is_symlink() and os.readlink(link) == str(small_archive)
    assert (small_archive / "manifest.json").read_bytes() == before
    # Without --overwrite, a link (even a dangling one) is not told to use --overwrite.
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    p = run("pack", GOOD, dangling, check=2)
    assert "is a symbolic link" in p.stderr and "--overwrite" not in p.stderr
    assert dangling.is_symlink() and not (tmp_path / "nowhere").exists()
    # convert refuses --jpeg-layout indexed for an archive that holds no JPEG, as pack does.
    run("pack", GOOD, tmp_path / "raw", "--encoding", "raw", check=0)
    p = run("convert", tmp_path / "raw", tmp_path / "c", "--jpeg-layout", "indexed", check=2)
    assert "stores none (encoding raw" in p.stderr and not (tmp_path / "c").exists()


def test_tune_help_lists_only_what_tune_takes(small_archive):
    options = help_entries("tune")
    assert "workers" not in options and "prefetch" not in options
    assert "max-workers" in options and "max-prefetch" in options
    p = run("tune", small_archive, "--step-ms", "0", "--workers", "2", check=2)
    assert "--workers is what tune chooses" in p.stderr and "--max-workers caps" in p.stderr
    p = run("tune", small_archive, "--step-ms", "0", "--prefetch=3", check=2)
    assert "--prefetch is what tune chooses" in p.stderr and "--max-prefetch caps" in p.stderr


def test_bench_echoes_every_resolved_option(small_archive):
    for flag, on in [("--flip=false", False), ("--flip", True), ("--flip=true", True)]:
        j = json.loads(run("bench", small_archive, flag, "--epochs", "1", "--json",
                           check=0).stdout)
        assert j["flip"] is on and j["options"]["flip"] == ("true" if on else "false")
        assert {"batch_size", "seed", "crop", "dtype", "timeout", "decode"} <= set(j["options"])
        assert j["options"]["workers"] == "auto"  # as asked (it echoed the first count chosen)
        text = run("bench", small_archive, flag, "--epochs", "1", check=0).stdout
        assert ("random flip" if on else "no flip") in text
        assert (" flip=%s " % ("true" if on else "false")) in text


def png_file(path, pixels, gamma=None):
    """A PNG of `pixels` (uint8 or uint16; H x W, H x W x 2/3/4) written by hand, so that 16-bit
    colour, 16-bit alpha and a gAMA chunk are all at hand (Pillow writes none of them)."""
    import struct
    import zlib

    import numpy as np
    channels = 1 if pixels.ndim == 2 else pixels.shape[2]
    depth = 16 if pixels.dtype == np.uint16 else 8
    colour = {1: 0, 2: 4, 3: 2, 4: 6}[channels]

    def chunk(kind, body):
        return (struct.pack(">I", len(body)) + kind + body +
                struct.pack(">I", zlib.crc32(kind + body) & 0xffffffff))
    rows = pixels.astype(">u2" if depth == 16 else np.uint8).reshape(pixels.shape[0], -1)
    raw = b"".join(b"\0" + r.tobytes() for r in rows)
    head = struct.pack(">IIBBBBB", pixels.shape[1], pixels.shape[0], depth, colour, 0, 0, 0)
    text = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head)
    if gamma is not None:
        text += chunk(b"gAMA", struct.pack(">I", int(gamma * 100000)))
    path.write_bytes(text + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def test_png_pixels_are_the_stored_values_without_gamma(tmp_path):
    # libpng's simplified API took 16-bit samples (and any file with a gAMA chunk) as linear
    # light and re-encoded them to sRGB: 16-bit gray 64*257 read back as 136. Pillow and OpenCV
    # give the stored values (16 bits: the high byte); so must the packer.
    np = pytest.importorskip("numpy")
    Image = pytest.importorskip("PIL.Image")
    v = np.array([0, 1, 64, 128, 192, 254, 255], np.uint16)
    ramp = np.tile(v * 257 + 100 * (v < 255), (5, 1)).astype(np.uint16)  # low bytes: dropped
    rgb = np.stack([ramp, ramp[:, ::-1], np.full_like(ramp, 30 * 257)], axis=2)
    alpha = np.tile(np.array([0, 255, 128, 255, 64, 255, 255], np.uint16) * 257, (5, 1))
    src = tmp_path / "src" / "x"
    src.mkdir(parents=True)
    cases = {"gray16": ramp, "rgb16": rgb, "rgba16": np.dstack([rgb, alpha]),
             "gray8_linear_gamma": (ramp >> 8).astype(np.uint8)}
    for name, pixels in cases.items():
        png_file(src / (name + ".png"), pixels, gamma=1.0 if "gamma" in name else None)
    run("pack", tmp_path / "src", tmp_path / "a", "--encoding", "zstd", check=0)
    run("extract", tmp_path / "a", tmp_path / "x", check=0)
    for name, pixels in cases.items():
        got = np.asarray(Image.open(tmp_path / "x" / "x" / (name + ".png")).convert("RGB"))
        p = (pixels >> 8).astype(np.int64) if pixels.dtype == np.uint16 else pixels.astype(np.int64)
        p = np.dstack([p] * 3) if p.ndim == 2 else p
        if p.shape[2] == 4:  # over white, as every decoder here composites
            a = p[:, :, 3:]
            p = (p[:, :, :3] * a + 255 * (255 - a) + 127) // 255
        assert got.tolist() == p.astype(np.uint8).tolist(), name


def test_size_rounds_the_long_side_from_the_source_for_jpeg_and_png(tmp_path):
    # 301x211 to a short side of 48: 301 * 48 / 211 = 68.47 -> 68. The JPEG, decoded at a DCT
    # scale (76x53) first, came out 69 wide.
    np = pytest.importorskip("numpy")
    Image = pytest.importorskip("PIL.Image")
    pixels = np.random.default_rng(2).integers(0, 255, (211, 301, 3), np.uint8)
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    Image.fromarray(pixels).save(src / "a.jpg", quality=90)
    Image.fromarray(pixels).save(src / "b.png")
    for encoding in ("zstd", "jpeg", "auto"):  # raw/zstd records and re-encoded JPEG ones
        out, x = tmp_path / ("a-" + encoding), tmp_path / ("x-" + encoding)
        run("pack", tmp_path / "src", out, "--encoding", encoding, "--size", "48", check=0)
        run("extract", out, x, check=0)
        for name in ("a.jpg", "b.png"):
            stem = name.rsplit(".", 1)[0]
            got = [f for f in os.listdir(x / "c") if f.startswith(stem)]
            assert Image.open(x / "c" / got[0]).size == (68, 48), (encoding, name)
