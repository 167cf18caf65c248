// Which samples an epoch visits, in which order, on which rank.
//
// The order is a pure function of (sample count, seed, epoch, shuffle, rank, world size,
// drop_last): it does not depend on the number of workers or on timing, so a run is reproducible
// and a resume lands on exactly the same batches.
#pragma once

#include <cstdint>
#include <vector>

namespace shardfeed::reader {

struct SamplerOptions {
  bool shuffle = false;
  uint64_t seed = 0;
  bool drop_last = false;  // drop the incomplete final batch (and, across ranks, the remainder)
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint32_t batch_size = 1;
  // Locality-friendly shuffle for archives larger than RAM: 0 keeps the true global shuffle.
  // Otherwise samples are cut into blocks of `shuffle_block` consecutive indices, the blocks
  // are shuffled, and samples are shuffled within each window of `shuffle_window` blocks, so
  // any stretch of the epoch reads from at most `shuffle_window` blocks of the archive.
  uint32_t shuffle_block = 0;
  uint32_t shuffle_window = 8;
};

class Sampler {
 public:
  Sampler(uint64_t sample_count, const SamplerOptions& options);

  // Sample indices this rank visits in `epoch`, in order. Without drop_last, ranks are padded to
  // equal length by repeating samples from the start of the global order, as
  // torch.utils.data.DistributedSampler does, so every rank sees the same number of batches.
  std::vector<uint64_t> EpochOrder(uint64_t epoch) const;
  // Samples per rank per epoch, and batches per rank per epoch.
  uint64_t samples_per_rank() const { return per_rank_; }
  uint64_t batches_per_epoch() const;
  const SamplerOptions& options() const { return options_; }

 private:
  uint64_t n_;
  SamplerOptions options_;
  uint64_t per_rank_;
};

// A reproducible 64-bit generator (splitmix64) used for shuffles and augmentation draws.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  uint64_t Below(uint64_t bound) { return bound ? Next() % bound : 0; }

 private:
  uint64_t state_;
};

// Mixes several values into one seed (for per-(seed, epoch, sample) streams).
uint64_t MixSeed(uint64_t a, uint64_t b, uint64_t c = 0);

}  // namespace shardfeed::reader
