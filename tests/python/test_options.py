"""One declaration per loader option (reader/options.h): walks the table and checks that the
CLI (`shardfeed bench --flag VALUE`) and Python (`shardfeed.Loader(path, name=VALUE)`) accept
and refuse the same values with the same message."""
import os
import subprocess

import pytest

import shardfeed
from shardfeed import _native

CLI = os.environ.get("SHARDFEED_CLI", "shardfeed")
GOOD = os.path.join(os.environ.get("SHARDFEED_TEST_DATA", ""), "good")
OPTIONS = _native.loader_options()
MIN_ONE = {"batch_size", "shuffle_window", "world_size", "prefetch", "max_pixels"}


def cases(option):
    """(text, expect_valid_text) pairs for one option: its default, every choice, and values
    its kind must refuse."""
    kind, default = option["kind"], option["default"]
    out = [(default, True)]
    if kind == "bool":
        out += [("true", True), ("false", True), ("maybe", False)]
    elif kind == "count":
        out += [("x", False), ("-1", False), ("1.5", False)]
        if option["name"] in MIN_ONE:
            out.append(("0", False))
    elif kind == "number":
        out += [("x", False), ("inf", False)]
    elif kind == "choice":
        out += [(c, True) for c in option["choices"].split("|")] + [("bogus", False)]
    elif kind == "list":
        out += [("1,x", False), ("1,2,3,4", False)]
    else:
        out += [("gpu", False)]
    return out


def cli_outcome(archive_path, option, text):
    extra = [] if option["name"] == "batch_size" else ["--batch-size", "8"]
    p = subprocess.run([CLI, "bench", archive_path, option["flag"] + "=" + text, "--epochs", "1",
                        "--shuffle=false", *extra] if option["name"] != "shuffle" else
                       [CLI, "bench", archive_path, option["flag"] + "=" + text, "--epochs", "1",
                        *extra], capture_output=True, text=True, timeout=120)
    if p.returncode == 0:
        return None
    assert p.returncode in (2, 3), (p.returncode, p.stderr)
    return p.stderr.strip()


def python_outcome(archive_path, option, text):
    kwargs = {"batch_size": 8}  # the CLI's bench defaults to shuffle=true; compare unshuffled
    kwargs[option["name"]] = text
    try:
        loader = shardfeed.Loader(archive_path, **kwargs)
        for _ in loader:
            pass
        loader.close()
        return None
    except TypeError:
        raise
    except Exception as e:  # ValueError, shardfeed.Error: the message is what we compare
        return str(e)


@pytest.mark.parametrize("option", OPTIONS, ids=[o["name"] for o in OPTIONS])
def test_cli_and_python_agree(archive_path, option):
    for text, _ in cases(option):
        cli = cli_outcome(archive_path, option, text)
        py = python_outcome(archive_path, option, text)
        where = "%s=%r" % (option["name"], text)
        assert (cli is None) == (py is None), (where, cli, py)
        if py is not None:
            assert py in cli, (where, cli, py)  # the CLI adds "shardfeed: error: <kind>: "


@pytest.mark.parametrize("option", OPTIONS, ids=[o["name"] for o in OPTIONS])
def test_refusals_name_the_option_and_its_flag(archive_path, option):
    bad = [t for t, ok in cases(option) if not ok]
    assert bad, option
    for text in bad:
        msg = python_outcome(archive_path, option, text)
        assert msg and option["name"] in msg and option["flag"] in msg, (text, msg)


def test_typed_python_values_mean_what_their_text_means(archive_path):
    # Python callers pass typed values; they are read as the CLI reads their text.
    a = [b.images.copy() for b in shardfeed.Loader(archive_path, batch_size=8, flip=True, seed=3,
                                                    crop="random", mean=(0.5, 0.5, 0.5),
                                                    std=0.25, dtype="float32", timeout=None)]
    b = [b.images.copy() for b in shardfeed.Loader(archive_path, batch_size="8", flip="true",
                                                    seed="3", crop="random",
                                                    mean="0.5,0.5,0.5", std="0.25",
                                                    dtype="float32", timeout="none")]
    assert all((x == y).all() for x, y in zip(a, b)) and len(a) == len(b) == 5


def test_every_option_is_in_the_cli_help():
    text = subprocess.run([CLI, "bench", "--help"], capture_output=True, text=True).stdout
    for o in OPTIONS:
        assert o["flag"] in text, o["flag"]
        assert "(=%s)" % o["default"] in text or o["name"] == "shuffle", (o["flag"], o["default"])


PACK_OPTIONS = _native.pack_options()


def pack_cases(option):
    kind, default = option["kind"], option["default"]
    out = [default] if default else []
    if kind == "bool":
        out += ["true", "maybe"]
    elif kind == "count":
        out += ["x", "-1"]
    elif kind == "choice":
        out += option["choices"].split("|") + ["bogus"]
    elif kind == "bytes":
        out += ["64K", "lots"]
    else:
        out += ["0/2", "2/2"]
    return out


def pack_outcomes(tmp_path, option, text):
    case = len(list(tmp_path.iterdir()))  # a fresh output per case
    cli_out, py_out = tmp_path / ("cli%d" % case), tmp_path / ("py%d" % case)
    p = subprocess.run([CLI, "pack", GOOD, str(cli_out), option["flag"] + "=" + text, "-q"],
                       capture_output=True, text=True, timeout=300)
    cli = None if p.returncode == 0 else p.stderr.strip()
    try:
        shardfeed.pack(GOOD, str(py_out), **{option["name"]: text})
        py = None
    except TypeError:
        raise
    except Exception as e:
        py = str(e)
    return cli, py


@pytest.mark.parametrize("option", PACK_OPTIONS, ids=[o["name"] for o in PACK_OPTIONS])
def test_pack_cli_and_python_agree(tmp_path, option):
    for text in pack_cases(option):
        cli, py = pack_outcomes(tmp_path, option, text)
        where = "%s=%r" % (option["name"], text)
        assert (cli is None) == (py is None), (where, cli, py)
        if py is not None:
            assert py in cli, (where, cli, py)


def test_cli_and_python_packs_record_the_same_options(tmp_path):
    subprocess.run([CLI, "pack", GOOD, str(tmp_path / "cli"), "--encoding", "zstd", "--size",
                    "32", "--crop", "center", "-q"], check=True)
    shardfeed.pack(GOOD, str(tmp_path / "py"), encoding="zstd", size=32, crop="center")
    a = shardfeed.inspect(str(tmp_path / "cli"))
    b = shardfeed.inspect(str(tmp_path / "py"))
    import json
    ma = json.load(open(tmp_path / "cli" / "manifest.json"))
    mb = json.load(open(tmp_path / "py" / "manifest.json"))
    assert ma["options"] == mb["options"] and ma["options"]["size"] == 32, (ma["options"],
                                                                             mb["options"])
    assert a["samples"] == b["samples"] == 36


def test_an_unknown_keyword_suggests_the_closest_option(archive_path, tmp_path):
    # The same function (base's ClosestName through OptionTable::Unknown) as the CLI and C++.
    with pytest.raises(TypeError, match=r"unexpected loader option 'batch_sise'; did you mean "
                                        r"'batch_size'\?"):
        shardfeed.Loader(archive_path, batch_sise=8)
    with pytest.raises(TypeError, match=r"did you mean 'chunk_size'\?"):
        shardfeed.pack(GOOD, str(tmp_path / "o"), chunk_bytes="1M")


def test_refusals_state_the_range_and_quote_what_python_passed(archive_path):
    with pytest.raises(Exception, match=r"rank \(--rank\) must be a whole number in "
                                        r"0\.\.4294967295, not '-1'"):
        shardfeed.Loader(archive_path, rank=-1)
    with pytest.raises(Exception, match=r"seed \(--seed\) must be a whole number >= 0, "
                                        r"not 'None'"):
        shardfeed.Loader(archive_path, seed=None)
    with pytest.raises(Exception, match=r"max_workers \(--max-workers\) must be a whole number "
                                        r"in 0\.\.4096"):
        shardfeed.Loader(archive_path, max_workers=100000)
    ranges = {o["name"]: o["range"] for o in OPTIONS}
    assert ranges["batch_size"] == "a whole number in 1..65536"
    assert all(ranges[o["name"]] for o in OPTIONS if o["kind"] in ("count", "number"))


def test_verify_reads_workers_and_max_pixels_through_the_cli_table(archive_path):
    # shardfeed.verify() took workers=5000 and workers=-1 that `shardfeed verify` refuses, and a
    # wrong type gave pybind's "incompatible function arguments".
    for bad in (5000, -1, "x"):
        with pytest.raises(ValueError, match=r"workers \(--workers\) must be a whole number in "
                                             r"0\.\.4096, not '%s'" % bad):
            shardfeed.verify(archive_path, workers=bad)
    with pytest.raises(ValueError, match=r"max_pixels \(--max-pixels\) must be a whole number"):
        shardfeed.verify(archive_path, max_pixels=-3)
    assert shardfeed.verify(archive_path, workers=2, max_pixels=10 ** 8, decode=True)["ok"]
