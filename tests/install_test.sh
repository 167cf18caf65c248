#!/bin/sh
# C++ packaging as a user meets it: `cmake --install` into a prefix, then a stand-alone project
# (examples/find_package) built with find_package(shardfeed), and the same program built with
# pkg-config alone; both read an archive the installed CLI packed.
#   install_test.sh BUILD_DIR SOURCE_DIR SAMPLE_IMAGES WORK_DIR GENERATOR
set -eu
BUILD=$1 SRC=$2 IMAGES=$3 WORK=$4 GEN=$5
rm -rf "$WORK"
cmake --install "$BUILD" --prefix "$WORK/prefix" >/dev/null
"$WORK/prefix/bin/shardfeed" --version
"$WORK/prefix/bin/shardfeed" pack "$IMAGES" "$WORK/a" -q
cmake -S "$SRC/examples/find_package" -B "$WORK/build" -G "$GEN" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$WORK/prefix" >/dev/null
cmake --build "$WORK/build" >/dev/null
want="samples 36 batches 5 classes 3 shape 32x32"
got=$("$WORK/build/count_batches" "$WORK/a")
[ "$got" = "$want" ] || { echo "find_package build printed '$got', not '$want'"; exit 1; }
PC_DIR=$(dirname "$(find "$WORK/prefix" -name shardfeed.pc)")
# shellcheck disable=SC2046
c++ -std=c++17 "$SRC/examples/find_package/count_batches.cpp" -o "$WORK/count_pc" \
  $(PKG_CONFIG_PATH="$PC_DIR" pkg-config --static --cflags --libs shardfeed)
got=$("$WORK/count_pc" "$WORK/a")
[ "$got" = "$want" ] || { echo "pkg-config build printed '$got', not '$want'"; exit 1; }
# The README's C++ snippet, as written, against the same install.
awk '/<!-- snippet: cpp -->/{f=1; next} f && /^```cpp/{g=1; next} g && /^```/{exit} g' \
  "$SRC/README.md" > "$WORK/readme.cpp"
[ -s "$WORK/readme.cpp" ] || { echo "README.md has no cpp snippet"; exit 1; }
# shellcheck disable=SC2046
c++ -std=c++17 "$WORK/readme.cpp" -o "$WORK/readme" \
  $(PKG_CONFIG_PATH="$PC_DIR" pkg-config --static --cflags --libs shardfeed)
cp -r "$WORK/a" "$WORK/train.sf"
got=$(cd "$WORK" && ./readme)
[ "$got" = "36 images" ] || { echo "README C++ snippet printed '$got'"; exit 1; }
echo "install + find_package + pkg-config + README C++ OK: $want"
