// Reads one shuffled epoch of an archive through an installed shardfeed (find_package) and
// prints what it saw: `count_batches ARCHIVE` -> "samples N batches B classes C shape HxW".
#include <cstdio>

#include "shardfeed/format/archive.h"
#include "shardfeed/reader/loader.h"

int main(int argc, char** argv) {
  using namespace shardfeed;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s ARCHIVE\n", argv[0]);
    return 2;
  }
  auto archive = format::Archive::Open(argv[1]);
  if (!archive.ok()) {
    std::fprintf(stderr, "%s\n", archive.status().ToString().c_str());
    return 1;
  }
  reader::LoaderOptions options;
  options.batch_size = 8;
  options.workers = 2;
  options.shuffle = true;
  options.transform.size = 32;
  options.transform.dtype = reader::DType::kFloat32;
  auto loader = reader::Loader::Create(*archive, options);
  if (!loader.ok()) {
    std::fprintf(stderr, "%s\n", loader.status().ToString().c_str());
    return 1;
  }
  if (Status s = (*loader)->StartEpoch(0); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  uint64_t samples = 0, batches = 0;
  for (;;) {
    auto batch = (*loader)->Next();
    if (!batch.ok()) {
      std::fprintf(stderr, "%s\n", batch.status().ToString().c_str());
      return 1;
    }
    if (!*batch) break;
    samples += batch->size();
    ++batches;
  }
  std::printf("samples %llu batches %llu classes %zu shape %ux%u\n",
              static_cast<unsigned long long>(samples), static_cast<unsigned long long>(batches),
              (*archive)->manifest().class_names.size(), (*loader)->out_height(),
              (*loader)->out_width());
  return samples == (*archive)->size() ? 0 : 1;
}
