// Test helper: writes one epoch of the C++ loader's batches (images, then labels as int64, per
// batch) to a file, so the Python tests can compare the bindings with the C++ reader byte for
// byte.
//   dump_batches ARCHIVE OUT EPOCH BATCH SEED CROP SIZE FLIP
#include <cstdio>
#include <cstdlib>
#include <string>

#include "shardfeed/format/archive.h"
#include "shardfeed/reader/loader.h"

using namespace shardfeed;

int main(int argc, char** argv) {
  if (argc != 9) {
    std::fprintf(stderr, "usage: %s ARCHIVE OUT EPOCH BATCH SEED CROP SIZE FLIP\n", argv[0]);
    return 2;
  }
  auto archive = format::Archive::Open(argv[1]);
  if (!archive.ok()) return 3;
  reader::LoaderOptions o;
  o.batch_size = static_cast<uint32_t>(std::atoi(argv[4]));
  o.shuffle = true;
  o.seed = std::strtoull(argv[5], nullptr, 10);
  std::string crop = argv[6];
  o.transform.crop = crop == "random" ? reader::Crop::kRandom
                     : crop == "none" ? reader::Crop::kNone
                                      : reader::Crop::kCenter;
  o.transform.size = static_cast<uint32_t>(std::atoi(argv[7]));
  o.transform.flip = std::atoi(argv[8]) != 0;
  o.workers = 1;
  auto loader = reader::Loader::Create(*archive, o);
  if (!loader.ok()) return 3;
  if (!(*loader)->StartEpoch(std::strtoull(argv[3], nullptr, 10)).ok()) return 3;
  FILE* out = std::fopen(argv[2], "wb");
  if (!out) return 3;
  for (;;) {
    auto b = (*loader)->Next();
    if (!b.ok()) return 1;
    if (!*b) break;
    std::fwrite(b->images(), 1, b->image_bytes(), out);
    std::fwrite(b->labels(), sizeof(int64_t), b->size(), out);
  }
  return std::fclose(out) == 0 ? 0 : 3;
}
