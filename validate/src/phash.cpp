// The perceptual hash and the near-duplicate search of stats (validate/stats.h).
#include <algorithm>
#include <array>
#include <cmath>

#include "shardfeed/validate/stats.h"

namespace shardfeed::validate {
namespace {

// cos((2x + 1) u pi / 64) for the 8 lowest frequencies u over 32 samples x.
const std::array<std::array<double, 32>, 8>& CosTable() {
  static const auto table = [] {
    std::array<std::array<double, 32>, 8> t{};
    for (int u = 0; u < 8; ++u) {
      for (int x = 0; x < 32; ++x) t[u][x] = std::cos((2 * x + 1) * u * M_PI / 64.0);
    }
    return t;
  }();
  return table;
}

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
  std::vector<float> luma(size_t{width} * height);
  for (uint32_t y = 0; y < height; ++y) {
    const uint8_t* row = rgb + y * stride;
    for (uint32_t x = 0; x < width; ++x) {
      luma[size_t{y} * width + x] =
          0.299f * row[3 * x] + 0.587f * row[3 * x + 1] + 0.114f * row[3 * x + 2];
    }
  }
  return LumaHash(luma.data(), width, height);
}

uint64_t LumaHash(const float* image, uint32_t width, uint32_t height) {
  // Area averages over 32 x 32 cells (a cell is at least one pixel: small images repeat).
  double luma[32][32] = {};
  if (width >= 32 && height >= 32) {
    for (uint32_t y = 0; y < height; ++y) {
      auto& cells = luma[uint64_t{y} * 32 / height];
      const float* row = image + size_t{y} * width;
      for (uint32_t x = 0; x < width; ++x) cells[uint64_t{x} * 32 / width] += row[x];
    }
    for (int cy = 0; cy < 32; ++cy) {
      const uint64_t rows =
          (uint64_t(cy + 1) * height + 31) / 32 - (uint64_t(cy) * height + 31) / 32;
      for (int cx = 0; cx < 32; ++cx) {
        const uint64_t cols =
            (uint64_t(cx + 1) * width + 31) / 32 - (uint64_t(cx) * width + 31) / 32;
        luma[cy][cx] /= double(std::max<uint64_t>(1, rows * cols));
      }
    }
  } else {
    for (int cy = 0; cy < 32; ++cy) {
      for (int cx = 0; cx < 32; ++cx) {
        luma[cy][cx] = image[size_t{cy * height / 32} * width + cx * width / 32];
      }
    }
  }
  const auto& c = CosTable();
  double rows[32][8];  // each row's 8 lowest frequencies
  for (int y = 0; y < 32; ++y) {
    for (int u = 0; u < 8; ++u) {
      double s = 0;
      for (int x = 0; x < 32; ++x) s += luma[y][x] * c[u][x];
      rows[y][u] = s;
    }
  }
  double coef[64];
  for (int v = 0; v < 8; ++v) {
    for (int u = 0; u < 8; ++u) {
      double s = 0;
      for (int y = 0; y < 32; ++y) s += rows[y][u] * c[v][y];
      coef[v * 8 + u] = s;
    }
  }
  double ac[63];
  std::copy(coef + 1, coef + 64, ac);
  std::nth_element(ac, ac + 31, ac + 63);
  const double median = ac[31];
  uint64_t h = 0;
  for (int i = 0; i < 64; ++i) {
    if (coef[i] > median) h |= uint64_t{1} << i;
  }
  return h;
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
