"""The README's shell and Python snippets, run as written (the C++ one: tests/install_test.sh),
so the front page cannot drift from what the code does."""
import os
import re
import subprocess

import pytest

CLI = os.environ.get("SHARDFEED_CLI", "shardfeed")
DATA = os.environ.get("SHARDFEED_TEST_DATA", "")
SOURCE = os.environ.get("SHARDFEED_SOURCE_DIR",
                        os.path.join(os.path.dirname(__file__), "..", ".."))
PYPATH = os.environ.get("SHARDFEED_PYTHONPATH", "")


def snippet(name):
    text = open(os.path.join(SOURCE, "README.md"), encoding="utf-8").read()
    m = re.search(r"<!-- snippet: %s -->\s*```\w*\n(.*?)```" % re.escape(name), text, re.S)
    assert m, "README.md has no '%s' snippet" % name
    return m.group(1)


def test_readme_shell_then_python_snippets(tmp_path):
    env = dict(os.environ, IMAGES=os.path.join(DATA, "good"),
               PATH=os.path.dirname(os.path.abspath(CLI)) + os.pathsep + os.environ["PATH"])
    p = subprocess.run(["bash", "-euo", "pipefail", "-c", snippet("shell")], cwd=tmp_path,
                       env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "packed 36 of 36" in p.stdout and "images/s" in p.stdout
    assert "recommended: --workers" in p.stdout
    if not PYPATH or not os.path.isdir(os.path.join(PYPATH, "shardfeed")):
        pytest.skip("no Python module in this build (the Release build runs this part)")
    env["PYTHONPATH"] = PYPATH
    p = subprocess.run(["/usr/bin/python3", "-c", snippet("python")], cwd=tmp_path, env=env,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "5 batches per epoch" in p.stdout


def test_readme_starts_with_the_two_commands():
    lines = open(os.path.join(SOURCE, "README.md"), encoding="utf-8").read().splitlines()
    block = lines[lines.index("```") + 1:]
    assert block[0].startswith("bash scripts/demo.sh") and block[1].startswith("bash scripts/test.sh")
