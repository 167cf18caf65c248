// Internal to stats: what it measures on every decoded image, in as few passes over the pixels
// as the answers allow (docs/BENCHMARKS.md, "stats", has the cost of each).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace shardfeed::validate {

// Per-channel sums over RGB pixels, exact in integers (the mean/std of `stats`).
struct PixelSums {
  uint64_t pixels = 0;
  uint64_t sum[3] = {0, 0, 0}, squares[3] = {0, 0, 0};
  // Adds `count` RGB pixels stored contiguously (3 bytes each). One pass; AVX-512BW or AVX2
  // where the CPU has it, the same integers either way.
  void Add(const uint8_t* rgb, size_t count);
  void Merge(const PixelSums& other);
};

// Luma is 77 R + 150 G + 29 B (0..255 x 256 in a uint16: BT.601 weights in eighths of a
// percent), exact in integers, so every CPU gets the same hash and flags.
inline constexpr uint32_t kLumaScale = 256;

// Measures of an image's luma reduced by a whole factor f to at most 256 pixels a side (never
// enlarged): every f-th pixel of every f-th row (the centre of each f x f block).
struct LumaMeasures {
  uint64_t phash = 0;                      // LumaHash of the reduced image
  float mean = 0, std = 0, laplacian = 0;  // 0..255 units; variance of the 4-neighbour Laplacian
                                           // (infinity: under 3 rows or columns to measure)
  bool gray = false;                       // every sampled pixel has R == G == B
};
// What one thread reuses between images.
struct PixelScratch {
  std::vector<uint16_t> luma;     // the reduced luma image
  std::vector<uint32_t> columns;  // byte offset in a row of each sampled column
};
LumaMeasures MeasureLuma(const uint8_t* rgb, uint32_t width, uint32_t height,
                         PixelScratch* scratch);

// The pass over one decoded image (width x height RGB, contiguous): its per-channel sums, its
// luma measures and `key`, a 64-bit hash of its size, sums and perceptual hash. Equal pixels
// give equal keys, so only images that share a key can be exact duplicates: stats confirms
// those with PixelHash after decoding them again, and hashes no other image's pixels (XXH3 of
// every pixel cost 4% of the pass). A band of rows at a time from the last band up, so that
// the sums and the luma samples read each band from the L1/L2 cache, and the rows the decoder
// wrote last (still cached) before the reading evicts them.
struct PixelMeasures {
  PixelSums sums;
  LumaMeasures luma;
  uint64_t key = 0;
};
PixelMeasures MeasurePixels(const uint8_t* rgb, uint32_t width, uint32_t height,
                            PixelScratch* scratch);

// XXH3-64 of the pixels seeded with the size: what makes two images exact duplicates.
uint64_t PixelHash(const uint8_t* rgb, uint32_t width, uint32_t height);

// 64-bit DCT hash of a luma image (kLumaScale units, `width` per row): area averages over 32 x 32
// cells (a cell is at least one pixel: small images repeat), the 8 x 8 lowest frequencies of
// their DCT-II, one bit per coefficient above their median (DC excluded from the median).
uint64_t LumaHash(const uint16_t* luma, uint32_t width, uint32_t height);

// Tests only: with true, the hand-written AVX2 kernels (the sums, the luma samples) take their
// portable paths even on an AVX2 CPU (the answers must be the same; the compiler's clones of
// the integer loops are the same source). Not thread-safe against a running pass.
void ForcePortablePixelLoops(bool portable);
// Tests only: with true, the sums take the AVX2 kernel even on an AVX-512 CPU (the same
// answers). Not thread-safe against a running pass.
void ForceAvx2PixelLoops(bool avx2);

}  // namespace shardfeed::validate
