// shuffle="block": shards in a seeded order, samples mixed within windows of W shards.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <set>

#include "shardfeed/reader/sampler.h"

using namespace shardfeed::reader;

namespace {

// Uneven shards: sizes 7, 1, 12, 5, ... covering n samples.
std::vector<uint64_t> Starts(uint64_t n, uint64_t seed) {
  std::vector<uint64_t> starts;
  Rng rng(seed);
  for (uint64_t s = 0; s < n; s += 1 + rng.Below(13)) starts.push_back(s);
  return starts;
}

size_t ShardOf(const std::vector<uint64_t>& starts, uint64_t sample) {
  return std::upper_bound(starts.begin(), starts.end(), sample) - starts.begin() - 1;
}

SamplerOptions ByShard(std::vector<uint64_t> starts, uint32_t window, uint64_t seed = 5) {
  SamplerOptions o;
  o.shuffle = true;
  o.seed = seed;
  o.shard_starts = std::move(starts);
  o.shuffle_window = window;
  return o;
}

}  // namespace

TEST_CASE("shard shuffle: every epoch is a permutation, seeded, new each epoch", "[storage]") {
  for (uint64_t n : {2, 9, 100, 1000}) {
    const auto starts = Starts(n, n);
    Sampler sampler(n, ByShard(starts, 3));
    const auto e0 = sampler.EpochOrder(0), e1 = sampler.EpochOrder(1);
    std::vector<uint64_t> sorted = e0;
    std::sort(sorted.begin(), sorted.end());
    for (uint64_t i = 0; i < n; ++i) REQUIRE(sorted[i] == i);
    CHECK(Sampler(n, ByShard(starts, 3)).EpochOrder(0) == e0);
    if (n >= 100) {
      CHECK(e0 != e1);
      CHECK(Sampler(n, ByShard(starts, 3, 6)).EpochOrder(0) != e0);
    }
  }
}

TEST_CASE("shard shuffle: each shard is read within one window of at most W shards", "[storage]") {
  const uint64_t n = 2000;
  const auto starts = Starts(n, 1);
  for (uint32_t window : {1u, 2u, 5u}) {
    Sampler sampler(n, ByShard(starts, window));
    const EpochPlan plan = sampler.Plan(0);
    std::map<size_t, uint64_t> window_of;  // shard -> the window it was read in
    for (uint64_t w = 0; w * window < starts.size(); ++w) {
      const uint64_t first = plan.slot_starts[w * window];
      const uint64_t end = plan.slot_starts[std::min<uint64_t>(starts.size(), (w + 1) * window)];
      std::set<size_t> shards;
      for (uint64_t g = first; g < end; ++g) {
        const size_t s = ShardOf(starts, sampler.GlobalAt(plan, g));
        shards.insert(s);
        auto [it, fresh] = window_of.emplace(s, w);
        REQUIRE(it->second == w);
      }
      REQUIRE(shards.size() <= window);
    }
    REQUIRE(window_of.size() == starts.size());
    // Not the identity: shards are visited in a seeded order.
    CHECK(ShardOf(starts, sampler.GlobalAt(plan, 0)) +
              ShardOf(starts, sampler.GlobalAt(plan, n - 1)) !=
          starts.size() - 1);
  }
}

TEST_CASE("shard shuffle: an epoch checkpointed at one world size ends at another, once",
          "[storage]") {
  const uint64_t n = 997;
  const auto starts = Starts(n, 3);
  SamplerOptions two = ByShard(starts, 4);
  two.world_size = 2;
  two.batch_size = 8;
  two.drop_last = false;
  std::multiset<uint64_t> seen;
  for (uint32_t r = 0; r < 2; ++r) {
    two.rank = r;
    Sampler s(n, two);
    const EpochPlan plan = s.Plan(2);
    for (uint64_t k = 0; k < 10 * 8; ++k) seen.insert(s.At(plan, k));
  }
  const uint64_t consumed = Sampler(n, two).Consumed(Sampler(n, two).Plan(2), 10);
  SamplerOptions three = two;
  three.world_size = 3;
  three.drop_last = true;
  for (uint32_t r = 0; r < 3; ++r) {
    three.rank = r;
    Sampler s(n, three);
    const EpochPlan plan = s.Plan(2, consumed);
    for (uint64_t k = 0; k < plan.samples; ++k) seen.insert(s.At(plan, k));
  }
  // Every sample at most once; all but the dropped remainder (fewer than 3 * 8) once.
  for (uint64_t i = 0; i < n; ++i) REQUIRE(seen.count(i) <= 1);
  CHECK(seen.size() > n - 3 * 8);
}
