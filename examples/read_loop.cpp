// A minimal C++ training-loop reader: open an archive, read shuffled, randomly cropped batches
// for a few epochs, and report how long the "training step" waited for data.
//
//   read_loop ARCHIVE [epochs]
#include <cstdio>
#include <cstdlib>

#include "shardfeed/format/archive.h"
#include "shardfeed/reader/loader.h"

using namespace shardfeed;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s ARCHIVE [epochs]\n", argv[0]);
    return 2;
  }
  auto archive = format::Archive::Open(argv[1]);
  if (!archive.ok()) {
    std::fprintf(stderr, "%s\n", archive.status().ToString().c_str());
    return 3;
  }
  reader::LoaderOptions options;
  options.batch_size = 32;
  options.shuffle = true;
  options.seed = 1;
  options.transform.crop = reader::Crop::kRandom;
  options.transform.flip = true;
  options.transform.size = 128;
  options.device = reader::CudaAvailable();  // batches also land on the GPU when there is one
  auto loader = reader::Loader::Create(*archive, options);
  if (!loader.ok()) {
    std::fprintf(stderr, "%s\n", loader.status().ToString().c_str());
    return 3;
  }
  const int epochs = argc > 2 ? std::atoi(argv[2]) : 2;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    if (Status s = (*loader)->StartEpoch(epoch); !s.ok()) return 3;
    uint64_t checksum = 0;
    for (;;) {
      Result<reader::Batch> batch = (*loader)->Next();
      if (!batch.ok()) {  // a decode error names the archive and the sample
        std::fprintf(stderr, "%s\n", batch.status().ToString().c_str());
        return 1;
      }
      if (!*batch) break;  // end of epoch
      // "Train": touch the labels and one pixel per image. The slot returns to the ring when
      // `batch` goes out of scope.
      for (uint32_t i = 0; i < batch->size(); ++i) {
        checksum += static_cast<uint64_t>(batch->labels()[i]) +
                    batch->images()[i * batch->image_bytes() / batch->size()];
      }
    }
    reader::EpochStats st = (*loader)->Stats();
    std::printf("epoch %d: %llu images, %.0f images/s, waited %.0f%% of the time (checksum %llu)\n",
                epoch, static_cast<unsigned long long>(st.images), st.images / st.seconds,
                100 * st.wait_fraction(), static_cast<unsigned long long>(checksum));
  }
  return 0;
}
