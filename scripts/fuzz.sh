#!/usr/bin/env bash
# Runs every libFuzzer target for SECONDS each (default 60) from the committed seed corpus
# (tests/fuzz/corpus) plus what earlier runs found (build-fuzz/corpus), after replaying every
# committed regression input (tests/fuzz/regressions/<target>/: each crash ever found). A crash
# is saved under build-fuzz/crashes/<target>/ and fails the script; copy it into the
# regressions folder once fixed. The test command runs this briefly; run it longer by hand:
#   bash scripts/fuzz.sh 600
# FUZZ_BUILD_DIR (default build-fuzz) lets a long run use its own build while others go on.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-60}
B=${FUZZ_BUILD_DIR:-build-fuzz}
bash scripts/install-deps.sh
CC=clang CXX=clang++ cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSHARDFEED_FUZZ=ON -DSHARDFEED_TESTS=OFF -DSHARDFEED_PYTHON=OFF >/dev/null
TARGETS=(archive_lmdb_fuzz archive_hdf5_fuzz manifest_fuzz decode_fuzz)
cmake --build "$B" -j "$(nproc)" --target "${TARGETS[@]}"
# HDF5 keeps library-wide state it frees only at exit: leak reports there are not ours.
export ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
failed=0
for t in "${TARGETS[@]}"; do
  seeds=tests/fuzz/corpus/${t%_fuzz}
  work=$B/corpus/${t%_fuzz}
  crashes=$B/crashes/$t
  mkdir -p "$work" "$crashes"
  regressions=(tests/fuzz/regressions/$t/*)
  if [ -e "${regressions[0]}" ]; then
    echo "== $t: ${#regressions[@]} regression inputs"
    "$B/$t" -timeout=20 -rss_limit_mb=2048 "${regressions[@]}" >/dev/null 2>&1 ||
      { echo "   FAILED: a regression input crashes $t again"; failed=1; }
  fi
  echo "== $t: ${SECONDS_EACH} s"
  log=$B/$t.log
  if "$B/$t" -max_total_time="$SECONDS_EACH" -timeout=20 -rss_limit_mb=2048 \
      -artifact_prefix="$crashes/" -print_final_stats=1 "$work" "$seeds" >"$log" 2>&1; then
    grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$log" | tr '\n' ' '
    echo "(no crash)"
  else
    failed=1
    echo "   CRASH: $(ls "$crashes" | head -3) (log: $log)"
    grep -E "ERROR|SUMMARY|#0 |#1 |#2 " "$log" | head -12
  fi
done
exit $failed
