#!/usr/bin/env bash
# The test suite N times in a row under CPU load (issue 19: tests must not depend on speed).
# Usage: scripts/stress_suite.sh [BUILD_DIR] [RUNS] [LOAD_PROCS]
#   BUILD_DIR   a configured Release build with tests (default: build)
#   RUNS        how many times (default 10)
#   LOAD_PROCS  busy-loop processes kept running meanwhile (default: 2 x cores)
# Runs every ctest test except the ones that install packages or need the network venv
# (pip_install, install_find_package, remote_tests), stops at the first failure and prints
# which run and test failed. Exit 0 only when every run passed.
set -euo pipefail
build=${1:-build}
runs=${2:-10}
procs=${3:-$(( 2 * $(nproc) ))}
load_pids=()
cleanup() { for p in "${load_pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
for _ in $(seq "$procs"); do
  ( while :; do :; done ) &
  load_pids+=($!)
done
echo "stress_suite: $runs runs of ctest in $build under $procs busy processes on $(nproc) cores"
for run in $(seq "$runs"); do
  start=$(date +%s)
  if ! (cd "$build" && ctest -E 'pip_install|install_find_package|remote_tests' \
          --output-on-failure >"stress-run-$run.log" 2>&1); then
    echo "stress_suite: run $run FAILED; see $build/stress-run-$run.log"
    grep -E 'Failed|FAILED|\*\*\*' "$build/stress-run-$run.log" | head -20
    exit 1
  fi
  echo "stress_suite: run $run passed ($(( $(date +%s) - start )) s)"
done
echo "stress_suite: all $runs runs passed"
