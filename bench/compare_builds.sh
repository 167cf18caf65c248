#!/usr/bin/env bash
# Read throughput of two builds of shardfeed on the same archives, alternated, 3 rounds, median:
# what "before/after" figures in docs/BENCHMARKS.md come from.
#   bench/compare_builds.sh OLD_SHARDFEED NEW_SHARDFEED CORPUS WORKDIR
# The archives are packed by OLD (the format NEW must also read); CUDA is disabled in both.
# With PACK_EACH=1 each build reads archives it packed itself (WORKDIR/old, WORKDIR/new): a
# format change is measured as a user meets it (e.g. version 4's path field beside every image).
set -euo pipefail
OLD=$1 NEW=$2 CORPUS=$3 B=$4
pack_all() {  # pack_all BIN DIR
  local bin=$1 d=$2
  mkdir -p "$d"
  [ -d "$d/jpeg.sf" ] || "$bin" pack "$CORPUS" "$d/jpeg.sf" -q >/dev/null
  [ -d "$d/raw224.sf" ] || "$bin" pack "$CORPUS" "$d/raw224.sf" --encoding raw --size 224 --crop center -q >/dev/null
  if [ ! -d "$d/raw32x30k.sf" ]; then  # 30,000 tiny records: the corpus listed 10 times
    /usr/bin/python3 - "$CORPUS" "$d/list30k.txt" <<'PY'
import os, sys
root, out = sys.argv[1], sys.argv[2]
files = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)
classes = sorted({f.split("/")[0] for f in files})
with open(out, "w") as o:
    for _ in range(10):
        for f in files:
            o.write("%s %d\n" % (f, classes.index(f.split("/")[0])))
PY
    "$bin" pack "$CORPUS" "$d/raw32x30k.sf" --list "$d/list30k.txt" --encoding raw --size 32 --crop center -q >/dev/null
  fi
}
if [ "${PACK_EACH:-0}" = 1 ]; then
  pack_all "$OLD" "$B/old"
  pack_all "$NEW" "$B/new"
  OLD_DIR=$B/old NEW_DIR=$B/new
else
  pack_all "$OLD" "$B"
  OLD_DIR=$B NEW_DIR=$B
fi
run() { local bin=$1; shift; SHARDFEED_DISABLE_CUDA=1 "$bin" bench "$@" --json | /usr/bin/python3 -c "import json,sys; print('%.0f' % json.load(sys.stdin)['images_per_second'])"; }
while IFS= read -r case; do
  set -- $case
  a=$1; shift
  olds=(); news=()
  for round in 1 2 3; do
    olds+=($(run "$OLD" "$OLD_DIR/$a" "$@")); news+=($(run "$NEW" "$NEW_DIR/$a" "$@"))
  done
  /usr/bin/python3 - "$case" "${olds[@]}" "${news[@]}" <<'PY'
import statistics, sys
case = sys.argv[1]; v = list(map(float, sys.argv[2:])); o, n = v[:3], v[3:]
mo, mn = statistics.median(o), statistics.median(n)
print("%-66s before %9.0f  after %9.0f  after/before %.2f" % (case, mo, mn, mn / mo))
PY
done <<'CASES'
jpeg.sf --crop center --size 224 --epochs 2 --workers 2
jpeg.sf --crop random --flip --size 224 --epochs 2 --workers 2
raw224.sf --crop none --size 0 --epochs 5 --workers 2
raw32x30k.sf --crop none --size 0 --batch-size 256 --epochs 10 --workers 2
raw32x30k.sf --crop none --size 0 --batch-size 256 --epochs 10 --workers 1
CASES
