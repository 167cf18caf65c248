#!/usr/bin/env bash
# Runs every test: the C++ (Catch2) and Python (pytest) suites through CTest in a Release build,
# again in an AddressSanitizer + UBSan build, and the reader's tests under ThreadSanitizer.
# Installs dependencies first if any is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
JOBS=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHARDFEED_TESTS=ON >/dev/null
cmake --build build -j "$JOBS"
(cd build && ctest --output-on-failure -j "$JOBS")
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDFEED_SANITIZE=ON \
  -DSHARDFEED_TESTS=ON -DSHARDFEED_PYTHON=OFF >/dev/null
cmake --build build-asan -j "$JOBS"
# quarantine_size_mb=0: ASan otherwise keeps freed memory resident on purpose, which the
# "memory does not grow over 20 epochs" test (it reads RSS) would take for a leak.
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:quarantine_size_mb=0 \
  ctest --output-on-failure -j "$JOBS" -L sanitized)
# The reader's tests (thread and process workers, the lifecycle matrix) under ThreadSanitizer.
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDFEED_TSAN=ON \
  -DSHARDFEED_TESTS=ON -DSHARDFEED_PYTHON=OFF >/dev/null
cmake --build build-tsan -j "$JOBS" --target shardfeed_tests shardfeed-worker
(cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -L tsan)
# libFuzzer targets (format, manifest, decoders): every committed regression input, then 15 s
# each from the seed corpus. Longer runs: bash scripts/fuzz.sh 600.
bash scripts/fuzz.sh 15
