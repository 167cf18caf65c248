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

std::vector<format::ShardInfo> Shards(const std::vector<uint64_t>& counts) {
  std::vector<format::ShardInfo> infos;
  for (uint64_t c : counts) {
    format::ShardInfo s;
    s.sample_count = c;
    s.file_bytes = 1000 * c;
    infos.push_back(s);
  }
  return infos;
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

// The most distinct shards, over every order of the shards (and, with run-ahead, every order of
// the next epoch), of the windows any run of g consecutive positions touches.
uint64_t MostHeld(const std::vector<uint64_t>& counts, uint32_t w, uint64_t g, bool run_ahead) {
  std::vector<uint32_t> a(counts.size());
  std::iota(a.begin(), a.end(), 0);
  uint64_t most = 0;
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
        most = std::max<uint64_t>(most, held.size());
      }
    } while (run_ahead && std::next_permutation(b.begin(), b.end()));
  } while (std::next_permutation(a.begin(), a.end()));
  return most;
}

TEST_CASE("the cache a block-shuffled remote loader needs covers every shard order") {
  const std::vector<std::vector<uint64_t>> archives = {
      {10, 10, 10, 10}, {12, 12, 12, 1}, {7, 3, 9, 1}, {7, 3, 9, 1, 5}, {20, 20, 20, 20, 20, 2}};
  for (const auto& counts : archives) {
    for (uint32_t w : {1u, 2u, 3u}) {
      for (uint64_t g : {1u, 2u, 5u, 11u, 13u, 24u, 40u}) {
        for (bool run_ahead : {false, true}) {
          if (run_ahead && counts.size() > 4) continue;  // 120^2 orders and more: too slow
          CAPTURE(counts, w, g, run_ahead);
          uint64_t shards = 0;
          const uint64_t bytes = ShardKeeper::Need(Shards(counts), w, g, 1, run_ahead, &shards);
          const uint64_t held = MostHeld(counts, w, g, run_ahead);
          CHECK(shards >= std::min<uint64_t>(counts.size(), held + kShardDownloadsAhead));
          CHECK(shards <= counts.size());
          // And no more than that where the windows are whole and alike: equal shards, the
          // shard count a multiple of w, one epoch.
          if (!run_ahead && counts.size() % w == 0 &&
              std::count(counts.begin(), counts.end(), counts[0]) == long(counts.size())) {
            CHECK(shards == std::min<uint64_t>(counts.size(), held + kShardDownloadsAhead));
          }
          // Counted at the largest shards' sizes.
          std::vector<uint64_t> sorted = counts;
          std::sort(sorted.rbegin(), sorted.rend());
          CHECK(bytes ==
                1000 * std::accumulate(sorted.begin(), sorted.begin() + shards, uint64_t{0}));
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
  uint64_t shards = 0;
  ShardKeeper::Need(Shards(counts), 1, 256, 1, false, &shards);
  CHECK(shards == 7);
  // In flight counts every rank's positions: two ranks of 128 are the same 256 global ones.
  uint64_t two_ranks = 0;
  ShardKeeper::Need(Shards(counts), 1, 128, 2, false, &two_ranks);
  CHECK(two_ranks == 7);
}

}  // namespace
}  // namespace shardfeed::reader
