#!/usr/bin/env bash
# The prepared check of the CUDA path, for a machine with a GPU (a few minutes): builds with the
# CUDA runtime, packs the sample data at a realistic size, then reads it (1) into pinned host
# memory only and (2) with every batch copied to the device on its slot's stream, with a
# simulated 20 ms training step so copies must overlap the consumer's work to stay hidden.
# Prints the two bench lines and the copy-overlap verdict, then runs the device correctness tests
# (tests/python/test_device.py: device bytes equal the host batch; two-way slot ordering; float
# batches and the normalisation kernel bit-identical to the CPU path);
# figures go to docs/BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp}
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHARDFEED_CUDA=ON \
  -DSHARDFEED_TESTS=OFF -DSHARDFEED_PYTHON=OFF >/dev/null
cmake --build build-gpu -j "$(nproc)" --target shardfeed
python3 scripts/make_sample_data.py /tmp/gpu-images --per-class 400 >/dev/null
build-gpu/shardfeed pack /tmp/gpu-images /tmp/gpu-archive --encoding raw --size 224 --crop center -q --overwrite
common=(--crop none --size 0 --batch-size 256 --epochs 3 --prefetch 4 --step-ms 20 --json)
build-gpu/shardfeed bench /tmp/gpu-archive "${common[@]}" | tee "$out/host.json"
build-gpu/shardfeed bench /tmp/gpu-archive "${common[@]}" --device | tee "$out/device.json"
python3 - "$out/host.json" "$out/device.json" <<'PY'
import json, sys
h, d = (json.load(open(p)) for p in sys.argv[1:3])
assert d["device"], "the device run did not copy to the GPU"
last = lambda r: r["epochs"][-1]
print("host ring  : %.0f images/s, wait %.1f%%, ring in %s" % (h["images_per_second"], 100 * last(h)["wait_fraction"], h["pinned"]))
print("to device  : %.0f images/s, wait %.1f%%, copy issue time %.3f s, ring in %s" % (
    d["images_per_second"], 100 * last(d)["wait_fraction"], last(d)["stage_seconds"]["copy"], d["pinned"]))
print("copies overlap the step" if last(d)["wait_fraction"] <= last(h)["wait_fraction"] + 0.02
      else "copies are NOT hidden behind the step")
PY
# Normalised float32 NCHW batches on the device: normalised by the workers and copied as floats,
# against uint8 copied (a quarter of the bytes) and normalised by the CUDA kernel.
norm=(--dtype float32 --layout nchw --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225 --device)
build-gpu/shardfeed bench /tmp/gpu-archive "${common[@]}" "${norm[@]}" | tee "$out/float-cpu.json"
build-gpu/shardfeed bench /tmp/gpu-archive "${common[@]}" "${norm[@]}" --normalize-on-device \
  | tee "$out/float-gpu.json"
python3 - "$out/float-cpu.json" "$out/float-gpu.json" <<'PY'
import json, sys
c, g = (json.load(open(p)) for p in sys.argv[1:3])
print("float32 NCHW, CPU-normalised, floats copied : %.0f images/s" % c["images_per_second"])
print("float32 NCHW, uint8 copied, GPU kernel       : %.0f images/s" % g["images_per_second"])
PY
cmake -S . -B build-gpu -DSHARDFEED_PYTHON=ON >/dev/null
cmake --build build-gpu -j "$(nproc)" --target _native shardfeed_py
python3 scripts/make_sample_data.py /tmp/gpu-test-data/good --per-class 12 >/dev/null
SHARDFEED_TEST_DATA=/tmp/gpu-test-data PYTHONPATH=build-gpu/python \
  python3 -m pytest -q -p no:cacheprovider tests/python/test_device.py tests/python/test_normalize.py
