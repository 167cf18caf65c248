// The one reproducible 64-bit generator of the project (splitmix64): the packer's shuffle and the
// reader's sample orders and augmentation draws use it, so a seed means the same stream in both.
// Header-only; not thread-safe (one generator per thread or per stream).
#pragma once

#include <cstdint>

namespace shardfeed {

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

}  // namespace shardfeed
