#!/usr/bin/env bash
# The main job on built-in sample data: install dependencies, build, make a small image folder
# (real JPEG/PNG/BMP/WebP files written by Pillow, plus broken ones), pack it, verify it, inspect
# it, and read it back as training would, with a throughput line.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target shardfeed
work=build/demo
rm -rf "$work" && mkdir -p "$work"
/usr/bin/python3 scripts/make_sample_data.py "$work/images" --per-class 200 --bad "$work/broken"
cp -a "$work/broken/broken" "$work/images/"   # a real folder has broken files too
echo "== pack (bad files are skipped and reported)"
build/shardfeed pack "$work/images" "$work/archive" --report "$work/report.json"
echo "== verify"
build/shardfeed verify "$work/archive" --decode
echo "== inspect"
build/shardfeed inspect "$work/archive"
echo "== read back (random-resized-crop 112 + flip, shuffled, 3 epochs)"
build/shardfeed bench "$work/archive" --crop random --flip --size 112 --batch-size 32 --epochs 3
