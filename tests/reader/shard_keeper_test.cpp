// ShardKeeper::Need, the cache a remote loader with shuffle="block" needs, against a brute force
// over every shard order: it must never be less than what a run of in-flight positions can hold.
#include "../../reader/src/shard_keeper.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <set>
#include <vector>

namespace shardfeed::reader {
namespace {

std::vector<format::ShardInfo> Shards(const std::vector<uint64_t>& counts,
                                      const std::vector<uint64_t>& bytes) {
  std::vector<format::ShardInfo> infos;
  for (size_t i = 0; i < counts.size(); ++i) {
    format::ShardInfo s;
    s.sample_count = counts[i];
    s.file_bytes = bytes[i];
    infos.push_back(s);
  }
  return infos;
}

// Shard files split by bytes: all alike but the last, whatever their sample counts.
std::vector<uint64_t> BySize(const std::vector<uint64_t>& counts) {
  std::vector<uint64_t> bytes(counts.size(), 7000);
  bytes.back() = 900;
  return bytes;
}

// One epoch's block order as the sampler lays it out: windows of w consecutive shards of the
// order, each window's positions together. Appends, per position, the window's shards.
void Lay(const std::vector<uint64_t>& counts, const std::vector<uint32_t>& order, uint32_t w,
         std::vector<std::vector<uint32_t>>* windows, std::vector<size_t>* window_of) {
  for (size_t first = 0; first < order.size(); first += w) {
    std::vector<uint32_t> shards(order.begin() + first,
                                 order.begin() + std::min(order.size(), first + w));
    uint64_t samples = 0;
    for (uint32_t s : shards) samples += counts[s];
    for (uint64_t i = 0; i < samples; ++i) window_of->push_back(windows->size());
    windows->push_back(shards);
  }
}

struct Held {
  uint64_t shards = 0;  // the most distinct shards held at once
  uint64_t bytes = 0;   // the most bytes: those shards, and the largest others downloaded ahead
};

// Over every order of the shards (and, with run-ahead, every order of the next epoch), what the
// windows that a run of g consecutive positions touches hold. Shard s weighs bytes[s].
Held MostHeld(const std::vector<uint64_t>& counts, const std::vector<uint64_t>& bytes, uint32_t w,
              uint64_t g, bool run_ahead, uint32_t downloads) {
  std::vector<uint32_t> a(counts.size());
  std::iota(a.begin(), a.end(), 0);
  Held most;
  do {
    std::vector<uint32_t> b = a;
    do {
      std::vector<std::vector<uint32_t>> windows;
      std::vector<size_t> window_of;
      Lay(counts, a, w, &windows, &window_of);
      if (run_ahead) Lay(counts, b, w, &windows, &window_of);
      for (size_t start = 0; start < window_of.size(); ++start) {
        const size_t end = std::min(window_of.size(), start + g) - 1;
        std::set<uint32_t> held;
        for (size_t v = window_of[start]; v <= window_of[end]; ++v) {
          held.insert(windows[v].begin(), windows[v].end());
        }
        most.shards = std::max<uint64_t>(most.shards, held.size());
        uint64_t weight = 0;
        std::vector<uint64_t> others;
        for (uint32_t s = 0; s < counts.size(); ++s) {
          if (held.count(s)) {
            weight += bytes[s];
          } else {
            others.push_back(bytes[s]);
          }
        }
        std::sort(others.rbegin(), others.rend());
        for (size_t i = 0; i < std::min<size_t>(downloads, others.size()); ++i) weight += others[i];
        most.bytes = std::max(most.bytes, weight);
      }
    } while (run_ahead && std::next_permutation(b.begin(), b.end()));
  } while (std::next_permutation(a.begin(), a.end()));
  return most;
}

TEST_CASE("the cache a block-shuffled remote loader needs covers every shard order") {
  const std::vector<std::vector<uint64_t>> archives = {
      {10, 10, 10, 10}, {12, 12, 12, 1}, {7, 3, 9, 1}, {7, 3, 9, 1, 5}, {20, 20, 20, 20, 20, 2}};
  for (const auto& counts : archives) {
    // Bytes in proportion to samples (one encoding, alike images), or split by bytes.
    std::vector<uint64_t> proportional;
    for (uint64_t c : counts) proportional.push_back(1000 * c);
    for (const auto& bytes : {proportional, BySize(counts)}) {
      for (uint32_t w : {1u, 2u, 3u}) {
        for (uint64_t g : {1u, 2u, 5u, 11u, 13u, 24u, 40u}) {
          for (bool run_ahead : {false, true}) {
            if (run_ahead && counts.size() > 4) continue;  // 120^2 orders and more: too slow
            for (uint32_t downloads : {0u, 2u}) {
              CAPTURE(counts, bytes, w, g, run_ahead, downloads);
              uint64_t shards = 0;
              const uint64_t need =
                  ShardKeeper::Need(Shards(counts, bytes), w, g, 1, run_ahead, downloads, &shards);
              const Held held = MostHeld(counts, bytes, w, g, run_ahead, downloads);
              CHECK(shards >= std::min<uint64_t>(counts.size(), held.shards + downloads));
              CHECK(shards <= counts.size());
              CHECK(need >= held.bytes);
              // Never more than that many shards at the largest sizes.
              std::vector<uint64_t> sorted = bytes;
              std::sort(sorted.rbegin(), sorted.rend());
              CHECK(need <= std::accumulate(sorted.begin(), sorted.begin() + shards, uint64_t{0}));
              // And exact where the windows are whole and alike: equal shards, the shard count
              // a multiple of w, one epoch.
              if (!run_ahead && counts.size() % w == 0 && bytes == proportional &&
                  std::count(counts.begin(), counts.end(), counts[0]) == long(counts.size())) {
                CHECK(shards == std::min<uint64_t>(counts.size(), held.shards + downloads));
                CHECK(need == held.bytes);
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("one short shard does not make a block-shuffled remote loader need the whole cache") {
  // Before: the windows were counted as if every shard held as few samples as the smallest, so
  // an archive of 19 shards of 100 samples and a last one of 10, read 256 samples in flight,
  // one shard a window, needed all 20 shards (27 windows + 2); it holds at most 5 + 2.
  std::vector<uint64_t> counts(19, 100);
  counts.push_back(10);
  std::vector<uint64_t> bytes(20, 1000);
  uint64_t shards = 0;
  ShardKeeper::Need(Shards(counts, bytes), 1, 256, 1, false, kShardDownloadsAhead, &shards);
  CHECK(shards == 7);
  // In flight counts every rank's positions: two ranks of 128 are the same 256 global ones.
  uint64_t two_ranks = 0;
  ShardKeeper::Need(Shards(counts, bytes), 1, 128, 2, false, kShardDownloadsAhead, &two_ranks);
  CHECK(two_ranks == 7);
}

TEST_CASE("shards split by bytes need no more than their samples can weigh") {
  // The benchmark's case: 20 shards of ~7 MB holding 74-281 samples (big images pack few to a
  // shard) and a 21st of 20 samples; 128 in flight, one shard a window. A run of 128 positions
  // can hold the 20-sample shard and a 74-sample one between its ends (4 windows), but those
  // two weigh one full shard and the small one, not two full ones.
  std::vector<uint64_t> counts = {74,  76,  77,  81,  83,  84,  87,  94,  119, 124, 130,
                                  155, 183, 189, 194, 204, 223, 271, 271, 281, 20};
  std::vector<uint64_t> bytes(21, 7'000'000);
  bytes.back() = 1'000'000;
  uint64_t shards = 0;
  const uint64_t need = ShardKeeper::Need(Shards(counts, bytes), 1, 128, 1, false, 1, &shards);
  CHECK(shards == 5);                        // 4 windows + 1 download
  CHECK(need < 5 * 7'000'000);               // the shards between weigh what 126 samples can
  CHECK(need >= 4 * 7'000'000 + 1'000'000);  // 3 full (ends, download) + 74 samples + 20
}

}  // namespace
}  // namespace shardfeed::reader
