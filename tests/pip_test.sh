#!/bin/sh
# Python packaging as a user meets it, in a fresh virtual environment (Debian's numpy and torch
# visible): `pip install .` gives the module and the `shardfeed` command on PATH; `pip wheel .`
# gives a wheel holding the extension, the worker program and the command; `pip install -e .`
# uses the .py files in place. One CMake build directory serves all three (incremental).
#   pip_test.sh PYTHON SOURCE_DIR SAMPLE_IMAGES WORK_DIR
set -eu
PY=$1 SRC=$2 IMAGES=$3 WORK=$4
WHEELS=${SHARDFEED_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/shardfeed/wheels}
rm -rf "$WORK/venv" "$WORK/wheel" "$WORK/a"
mkdir -p "$WORK"
"$PY" -m venv --system-site-packages "$WORK/venv"
V="$WORK/venv/bin"
# The build backend: from scripts/install-deps.sh's wheel cache, else from PyPI.
"$V/pip" install -q --disable-pip-version-check --no-index --find-links "$WHEELS" \
  scikit-build-core 2>/dev/null || "$V/pip" install -q --disable-pip-version-check scikit-build-core
OPTS="--no-build-isolation --no-deps --disable-pip-version-check -q --config-settings=build-dir=$WORK/cmake"

"$V/pip" install $OPTS "$SRC"
cd /
PATH="$V:$PATH" shardfeed --version
PATH="$V:$PATH" shardfeed pack "$IMAGES" "$WORK/a" -q
"$V/python" - "$WORK" <<'PY'
import os, sys, shardfeed, shardfeed.torch
work = sys.argv[1]
assert shardfeed.__file__.startswith(os.path.join(work, "venv")), shardfeed.__file__
loader = shardfeed.Loader(os.path.join(work, "a"), batch_size=6, size=16, mode="processes",
                          workers=2, dtype="float32")
assert sum(len(b.indices) for b in loader) == 36
print("pip install OK:", shardfeed.__file__)
PY

"$V/pip" wheel $OPTS -w "$WORK/wheel" "$SRC"
"$V/python" - "$WORK/wheel" <<'PY'
import glob, sys, zipfile
(whl,) = glob.glob(sys.argv[1] + "/shardfeed-*.whl")
names = zipfile.ZipFile(whl).namelist()
for want in ("shardfeed/__init__.py", "shardfeed/torch.py", "shardfeed/shardfeed-worker",
             "shardfeed-0.1.0.data/scripts/shardfeed"):
    assert want in names, (want, names)
assert any(n.startswith("shardfeed/_native") and n.endswith(".so") for n in names), names
print("pip wheel OK:", whl.rsplit("/", 1)[-1])
PY

"$V/pip" install $OPTS -e "$SRC"
"$V/python" - "$SRC" <<'PY'
import os, sys, shardfeed
src = sys.argv[1]
assert os.path.realpath(shardfeed.__file__) == os.path.realpath(
    os.path.join(src, "python", "shardfeed", "__init__.py")), shardfeed.__file__
print("pip install -e OK:", shardfeed.__file__)
PY
