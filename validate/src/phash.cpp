// The perceptual hash and the near-duplicate search of stats (validate/stats.h).
#include <algorithm>
#include <vector>

#include "pixel_measures.h"
#include "shardfeed/validate/stats.h"

namespace shardfeed::validate {
namespace {

// The multi-index: for each of the four 16-bit chunks, the entries sorted by chunk value
// (offsets[c][v] .. offsets[c][v + 1] index ids[c]).
struct ChunkIndex {
  std::vector<std::vector<uint32_t>> offsets, ids;
  ChunkIndex(const std::vector<uint64_t>& hashes, const std::vector<bool>& skip)
      : offsets(4, std::vector<uint32_t>(65537, 0)), ids(4) {
    for (int c = 0; c < 4; ++c) {
      auto& off = offsets[c];
      for (size_t i = 0; i < hashes.size(); ++i) {
        if (skip.empty() || !skip[i]) ++off[Chunk(hashes[i], c) + 1];
      }
      for (size_t v = 1; v < off.size(); ++v) off[v] += off[v - 1];
      ids[c].resize(off.back());
      std::vector<uint32_t> fill(off.begin(), off.end() - 1);
      for (size_t i = 0; i < hashes.size(); ++i) {
        if (skip.empty() || !skip[i]) ids[c][fill[Chunk(hashes[i], c)]++] = uint32_t(i);
      }
    }
  }
  static uint32_t Chunk(uint64_t h, int c) { return uint32_t(h >> (16 * c)) & 0xFFFF; }

  // Calls f(id) for every entry whose hash is within `threshold` bits of `q`, once each.
  template <typename F>
  void Query(const std::vector<uint64_t>& hashes, uint64_t q, int threshold, F f) const {
    const int r = threshold / 4;  // pigeonhole: some chunk is within r bits
    std::vector<uint32_t> keys;
    for (int c = 0; c < 4; ++c) {
      const uint32_t base = Chunk(q, c);
      keys.clear();
      keys.push_back(base);
      // Every 16-bit value within r bits of base (r <= 4: at most 2517 of them).
      for (int a = 0; a < 16 && r >= 1; ++a) {
        keys.push_back(base ^ (1u << a));
        for (int b = a + 1; b < 16 && r >= 2; ++b) {
          keys.push_back(base ^ (1u << a) ^ (1u << b));
          for (int d = b + 1; d < 16 && r >= 3; ++d) {
            keys.push_back(base ^ (1u << a) ^ (1u << b) ^ (1u << d));
            for (int e = d + 1; e < 16 && r >= 4; ++e) {
              keys.push_back(base ^ (1u << a) ^ (1u << b) ^ (1u << d) ^ (1u << e));
            }
          }
        }
      }
      for (uint32_t k : keys) {
        for (uint32_t p = offsets[c][k]; p < offsets[c][k + 1]; ++p) {
          const uint32_t id = ids[c][p];
          const uint64_t h = hashes[id];
          if (__builtin_popcountll(h ^ q) > threshold) continue;
          // Reported from the first chunk within r bits only: once per pair.
          bool earlier = false;
          for (int e = 0; e < c && !earlier; ++e) {
            earlier = __builtin_popcount(Chunk(h, e) ^ Chunk(q, e)) <= r;
          }
          if (!earlier) f(id);
        }
      }
    }
  }
};

}  // namespace

uint64_t PerceptualHash(const uint8_t* rgb, uint32_t width, uint32_t height, size_t stride) {
  if (stride == 0) stride = size_t{width} * 3;
  std::vector<uint16_t> luma(size_t{width} * height);
  for (uint32_t y = 0; y < height; ++y) {
    const uint8_t* row = rgb + y * stride;
    for (uint32_t x = 0; x < width; ++x) {
      luma[size_t{y} * width + x] =
          uint16_t(77u * row[3 * x] + 150u * row[3 * x + 1] + 29u * row[3 * x + 2]);
    }
  }
  return LumaHash(luma.data(), width, height);
}

std::vector<std::pair<uint32_t, uint32_t>> NearPairs(const std::vector<uint64_t>& hashes,
                                                     int threshold, const std::vector<bool>& skip) {
  std::vector<std::pair<uint32_t, uint32_t>> pairs;
  const ChunkIndex index(hashes, skip);
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (!skip.empty() && skip[i]) continue;
    index.Query(hashes, hashes[i], threshold, [&](uint32_t j) {
      if (j > i) pairs.emplace_back(uint32_t(i), j);
    });
  }
  std::sort(pairs.begin(), pairs.end());
  return pairs;
}

std::vector<std::pair<uint32_t, uint32_t>> NearMatches(const std::vector<uint64_t>& hashes,
                                                       const std::vector<uint64_t>& queries,
                                                       int threshold, const std::vector<bool>& skip,
                                                       const std::vector<bool>& skip_query) {
  std::vector<std::pair<uint32_t, uint32_t>> pairs;
  const ChunkIndex index(hashes, skip);
  for (size_t q = 0; q < queries.size(); ++q) {
    if (!skip_query.empty() && skip_query[q]) continue;
    index.Query(hashes, queries[q], threshold,
                [&](uint32_t j) { pairs.emplace_back(uint32_t(q), j); });
  }
  std::sort(pairs.begin(), pairs.end());
  return pairs;
}

}  // namespace shardfeed::validate
