#!/usr/bin/env bash
# The peers the benchmarks compare against, in a venv beside Debian's torch:
#   bash bench/install-peers.sh [VENV]     (default /tmp/peers)
# FFCV 1.0.2 builds its C extension against OpenCV and libjpeg-turbo (Debian packages). Its
# current dependencies would pull numpy 2 into the venv, which Debian's torch (built against
# numpy 1.24) cannot import: numba, llvmlite and OpenCV are pinned to the last releases for
# numpy 1.x, and the venv uses Debian's numpy.
set -euo pipefail
VENV=${1:-/tmp/peers}
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
$SUDO apt-get install -y -q libopencv-dev libturbojpeg0-dev pkg-config python3-venv >/dev/null
/usr/bin/python3 -m venv --system-site-packages "$VENV"
"$VENV/bin/pip" install -q ffcv==1.0.2 "numba==0.58.1" "llvmlite==0.41.1" \
  "opencv-python-headless==4.8.1.78" "numpy==$(/usr/bin/python3 -c 'import numpy; print(numpy.__version__)')"
"$VENV/bin/pip" uninstall -y -q opencv-python 2>/dev/null || true
# MosaicML Streaming (MDSWriter, bench/writer_bench.py): uses Debian's torch and numpy as they are.
"$VENV/bin/pip" install -q mosaicml-streaming
# LitData 0.2.40 and boto3 (bench/remote_bench.py --peers: both peers read from moto's s3:// and
# bench/peers_remote.py uploads their shards with boto3).
"$VENV/bin/pip" install -q "litdata==0.2.40" boto3
# CleanVision and fastdup (bench/stats_bench.py, beside `shardfeed stats`): pandas and OpenCV
# pinned as above (their newest releases need numpy 2).
"$VENV/bin/pip" install -q cleanvision fastdup "pandas<2.1" "opencv-python-headless==4.8.1.78" \
  "numpy==$(/usr/bin/python3 -c 'import numpy; print(numpy.__version__)')"
"$VENV/bin/python" -c "import ffcv, torch, numpy; print('peers ready: ffcv', ffcv.__version__ if hasattr(ffcv, '__version__') else '1.0.2', 'torch', torch.__version__, 'numpy', numpy.__version__)"
