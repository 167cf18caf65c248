#include "shardfeed/reader/sampler.h"

#include <numeric>

namespace shardfeed::reader {

uint64_t MixSeed(uint64_t a, uint64_t b, uint64_t c) {
  Rng r(a ^ 0x5851F42D4C957F2Dull);
  uint64_t h = r.Next() ^ b;
  Rng r2(h);
  h = r2.Next() ^ c;
  Rng r3(h);
  return r3.Next();
}

Sampler::Sampler(uint64_t sample_count, const SamplerOptions& options)
    : n_(sample_count), options_(options) {
  if (options_.world_size == 0) options_.world_size = 1;
  if (options_.batch_size == 0) options_.batch_size = 1;
  const uint64_t w = options_.world_size;
  per_rank_ = options_.drop_last ? n_ / w : (n_ + w - 1) / w;
}

uint64_t Sampler::batches_per_epoch() const {
  const uint64_t b = options_.batch_size;
  return options_.drop_last ? per_rank_ / b : (per_rank_ + b - 1) / b;
}

std::vector<uint64_t> Sampler::EpochOrder(uint64_t epoch) const {
  std::vector<uint64_t> global(n_);
  std::iota(global.begin(), global.end(), uint64_t{0});
  if (options_.shuffle) {
    Rng rng(MixSeed(options_.seed, epoch, 0x5348554646ull));
    auto shuffle = [&rng](uint64_t* first, uint64_t count) {
      for (uint64_t i = count; i > 1; --i) std::swap(first[i - 1], first[rng.Below(i)]);
    };
    const uint64_t block = options_.shuffle_block;
    if (block == 0 || block >= n_) {
      shuffle(global.data(), n_);
    } else {
      // Shuffle whole blocks, then samples inside each window of consecutive (shuffled) blocks.
      const uint64_t blocks = (n_ + block - 1) / block;
      std::vector<uint64_t> block_order(blocks);
      std::iota(block_order.begin(), block_order.end(), uint64_t{0});
      shuffle(block_order.data(), blocks);
      global.clear();
      for (uint64_t b : block_order) {
        for (uint64_t i = b * block; i < std::min(n_, (b + 1) * block); ++i) global.push_back(i);
      }
      const uint64_t window = block * std::max<uint32_t>(1, options_.shuffle_window);
      for (uint64_t start = 0; start < n_; start += window) {
        shuffle(global.data() + start, std::min(window, n_ - start));
      }
    }
  }
  const uint64_t w = options_.world_size;
  const uint64_t total = per_rank_ * w;
  std::vector<uint64_t> mine;
  mine.reserve(per_rank_);
  for (uint64_t k = options_.rank; k < total; k += w) {
    mine.push_back(n_ ? global[k % n_] : 0);  // k >= n_ only when padding
  }
  if (options_.drop_last) mine.resize(batches_per_epoch() * options_.batch_size);
  return mine;
}

}  // namespace shardfeed::reader
