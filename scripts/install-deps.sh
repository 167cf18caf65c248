#!/usr/bin/env bash
# Installs every dependency shardfeed needs on Debian 12 (bookworm): Debian's archive, plus the
# Python build backend (scikit-build-core and the two newer-than-Debian packages it needs) as
# wheels from PyPI, cached for `pip install --no-build-isolation` and the tests.
# Idempotent: packages already present are left alone.
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build pkg-config
  liblmdb-dev lmdb-utils            # LMDB container backend
  libhdf5-dev hdf5-tools            # HDF5 container backend
  libzstd-dev                       # per-record compression
  libxxhash-dev                     # XXH3 record checksums
  libjpeg62-turbo-dev libturbojpeg0-dev  # JPEG decode/encode (libjpeg-turbo)
  libpng-dev libwebp-dev libstb-dev libtiff-dev libheif-dev  # other input formats
  libheif-examples                  # heif-enc: the test data's HEIC/AVIF files
  libopencv-imgproc-dev             # resizing (SIMD area/bilinear)
  libboost-program-options-dev      # CLI
  nlohmann-json3-dev                # manifest and reports
  catch2                            # C++ tests
  clang libclang-rt-dev             # libFuzzer targets (scripts/fuzz.sh)
  libopenmpi-dev openmpi-bin        # mpirun -n N shardfeed pack
  pybind11-dev python3-dev python3-numpy python3-pytest python3-torch python3-torchvision
  python3-pil python3-lmdb python3-h5py  # Python module, its tests and baselines
  python3-matplotlib                # python -m shardfeed.plot (bench --sweep --plot)
  python3-pip python3-venv python3-setuptools python3-wheel  # pip install .
  libcurl4-openssl-dev              # s3:// and http(s):// archives (storage/)
  nginx-light                       # bench/remote_bench.py serves archives over http://
  chromium                          # tests/cli/test_stats_html.py opens stats --html headless
)
# --bench: also the photographs the benchmark corpus is cut from (bench/make_corpus.py).
if [ "${1:-}" = "--bench" ]; then PKGS+=(plasma-workspace-wallpapers); fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# scikit-build-core (pyproject.toml's build backend) for builds without network or isolation:
# its wheels, with packaging >= 23.2 and pathspec >= 0.12, kept in a local folder.
WHEELS=${SHARDFEED_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/shardfeed/wheels}
if ! ls "$WHEELS"/scikit_build_core-*.whl >/dev/null 2>&1; then
  mkdir -p "$WHEELS"
  /usr/bin/python3 -m pip download -q --disable-pip-version-check -d "$WHEELS" \
    "scikit-build-core>=0.10,<2"
fi
# pyarrow for the parquet / Hugging Face importer (python -m shardfeed.importers.parquet) and its
# tests: not in Debian 12, so from PyPI into Debian's python3. Current wheels need numpy 2 at run
# time (25.0 refuses Debian's 1.24); 18.1 runs on it.
if ! /usr/bin/python3 -c "import pyarrow" 2>/dev/null; then
  /usr/bin/python3 -m pip install -q --disable-pip-version-check --break-system-packages \
    "pyarrow>=14,<19"
fi
# The remote tests' S3 server: moto_server (moto[server] from PyPI) in a virtual environment
# that also sees Debian's packages (numpy, pytest, torch), so tests/remote runs with its python.
REMOTE_VENV=${SHARDFEED_REMOTE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/shardfeed/remote-venv}
if [ ! -x "$REMOTE_VENV/bin/moto_server" ]; then
  /usr/bin/python3 -m venv --system-site-packages "$REMOTE_VENV"
  "$REMOTE_VENV/bin/pip" install -q --disable-pip-version-check "moto[server]>=5,<6"
fi
