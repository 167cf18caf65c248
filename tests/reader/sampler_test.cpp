// The on-demand sampler (sampler.h): a bijection per epoch, exactly-once coverage and equal
// batch counts on every rank for any world size, locality of the block shuffle, elastic resume
// across world sizes through real loaders, and the same properties as the vector sampler it
// replaced (re-implemented here as the reference).
#include "shardfeed/reader/sampler.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "constant_archive.h"
#include "shardfeed/reader/loader.h"
#include "test_util.h"

namespace shardfeed::reader {
namespace {

// The sampler before this one: a materialised Fisher-Yates shuffle, ranks by stride.
std::vector<uint64_t> VectorSampler(uint64_t n, const SamplerOptions& o, uint64_t epoch) {
  std::vector<uint64_t> global(n);
  std::iota(global.begin(), global.end(), uint64_t{0});
  if (o.shuffle) {
    Rng rng(MixSeed(o.seed, epoch, 1));
    for (uint64_t i = n; i > 1; --i) std::swap(global[i - 1], global[rng.Below(i)]);
  }
  const uint64_t w = o.world_size, per = o.drop_last ? n / w : (n + w - 1) / w;
  std::vector<uint64_t> mine;
  for (uint64_t k = o.rank; k < per * w; k += w) mine.push_back(global[k % n]);
  if (o.drop_last) mine.resize(per / o.batch_size * o.batch_size);
  return mine;
}

TEST_CASE("the permutation is a bijection of [0, n) for any n, and differs per key") {
  for (uint64_t n : {1ull, 2ull, 3ull, 5ull, 17ull, 100ull, 1000ull, 4097ull, 65537ull}) {
    for (uint64_t key : {0ull, 1ull, 0xdeadbeefull}) {
      Permutation p(n, key);
      std::vector<bool> seen(n);
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t y = p(i);
        REQUIRE(y < n);
        REQUIRE(!seen[y]);
        seen[y] = true;
        REQUIRE(p.Inverse(y) == i);
      }
    }
    if (n >= 100) {
      Permutation a(n, 1), b(n, 2);
      uint64_t same = 0;
      for (uint64_t i = 0; i < n; ++i) same += a(i) == b(i);
      CHECK(same < n / 10);  // two keys: two unrelated orders
    }
  }
}

struct Case {
  bool shuffle, drop_last;
  uint32_t block;
};

TEST_CASE("every rank gets as many batches; the epoch is covered exactly once (1..64 ranks)") {
  const Case cases[] = {{false, false, 0}, {true, false, 0}, {true, true, 0}, {true, false, 7}};
  for (uint64_t n : {1ull, 7ull, 97ull, 1000ull, 1023ull}) {
    for (uint32_t w = 1; w <= 64; ++w) {
      for (const Case& c : cases) {
        SamplerOptions o;
        o.shuffle = c.shuffle;
        o.drop_last = c.drop_last;
        o.shuffle_block = c.block;
        o.shuffle_window = 3;
        o.seed = 42;
        o.world_size = w;
        o.batch_size = 4;
        INFO("n " << n << " world " << w << " shuffle " << c.shuffle << " drop_last " << c.drop_last
                  << " block " << c.block);
        std::vector<uint64_t> count(n);
        uint64_t batches = 0, total = 0;
        for (uint32_t r = 0; r < w; ++r) {
          o.rank = r;
          Sampler s(n, o);
          const EpochPlan plan = s.Plan(3);
          if (r == 0) batches = plan.batches;
          REQUIRE(plan.batches == batches);
          REQUIRE(plan.batches == s.batches_per_epoch());
          for (uint64_t k = 0; k < plan.samples; ++k) ++count[s.At(plan, k)];
          total += plan.samples;
          // The reference gives the same shares (not the same order).
          auto ref = VectorSampler(n, o, 3);
          REQUIRE(ref.size() == plan.samples);
        }
        const uint64_t seen_once = std::count(count.begin(), count.end(), uint64_t{1});
        if (c.drop_last) {
          REQUIRE(*std::max_element(count.begin(), count.end()) <= 1);
          REQUIRE(total == seen_once);
        } else {
          REQUIRE(*std::min_element(count.begin(), count.end()) >= 1);  // nothing skipped
          REQUIRE(total - n < w);                                       // padding < one row
        }
      }
    }
  }
}

TEST_CASE("the global order depends on seed and epoch only, not on world size") {
  SamplerOptions o;
  o.shuffle = true;
  o.seed = 7;
  Sampler one(5000, o);
  o.world_size = 8;
  o.rank = 3;
  Sampler eight(5000, o);
  const EpochPlan a = one.Plan(2), b = eight.Plan(2), c = one.Plan(3);
  uint64_t differs = 0;
  for (uint64_t g = 0; g < 5000; ++g) {
    REQUIRE(one.GlobalAt(a, g) == eight.GlobalAt(b, g));
    differs += one.GlobalAt(a, g) != one.GlobalAt(c, g);
  }
  CHECK(differs > 4500);
  for (uint64_t k = 0; k < b.samples; ++k) REQUIRE(eight.At(b, k) == one.GlobalAt(a, k * 8 + 3));
}

TEST_CASE("a block-shuffled epoch reads any window of positions from a bounded set of blocks") {
  SamplerOptions o;
  o.shuffle = true;
  o.shuffle_block = 16;
  o.shuffle_window = 4;
  for (uint64_t n : {1000ull, 1024ull, 65ull}) {
    Sampler s(n, o);
    const EpochPlan plan = s.Plan(1);
    std::vector<bool> seen(n);
    for (uint64_t g = 0; g < n; ++g) {
      const uint64_t i = s.GlobalAt(plan, g);
      REQUIRE(!seen[i]);
      seen[i] = true;
    }
    // A window is 4 blocks: 64 positions when every block is full, so 64 consecutive positions
    // overlap at most two windows; a window holding the short block is shorter, so then three.
    for (uint64_t start = 0; start < n; ++start) {
      std::set<uint64_t> blocks;
      for (uint64_t g = start; g < std::min(n, start + 64); ++g) {
        blocks.insert(s.GlobalAt(plan, g) / 16);
      }
      const size_t bound = n % 16 != 0 ? 12u : start % 64 == 0 ? 4u : 8u;
      REQUIRE(blocks.size() <= bound);
    }
  }
}

// Reads `batches` batches on every rank of a world (all ranks equal, as a synchronous step
// does), returns the samples seen and rank 0's state.
std::vector<uint64_t> ReadRanks(std::shared_ptr<format::Archive> archive, uint32_t world,
                                const LoaderState* resume, uint64_t batches, LoaderState* state) {
  std::vector<uint64_t> seen;
  for (uint32_t r = 0; r < world; ++r) {
    LoaderOptions o;
    o.batch_size = 10;
    o.workers = 1;
    o.prefetch = 2;
    o.shuffle = true;
    o.seed = 5;
    o.rank = r;
    o.world_size = world;
    o.transform.crop = Crop::kNone;
    o.transform.size = 0;
    auto loader = Loader::Create(archive, o);
    REQUIRE(loader.ok());
    REQUIRE((resume ? (*loader)->Resume(*resume) : (*loader)->StartEpoch(6)).ok());
    for (uint64_t b = 0; b < batches; ++b) {
      auto batch = (*loader)->Next();
      REQUIRE(batch.ok());
      if (!*batch) break;
      seen.insert(seen.end(), batch->indices(), batch->indices() + batch->size());
    }
    if (state && r == 0) *state = (*loader)->State();
  }
  return seen;
}

TEST_CASE("elastic resume: an epoch checkpointed at one world size ends at another, once") {
  testing::TempDir dir;
  auto archive = testing::MakeConstantArchive(dir / "a", 1200, 4);
  struct Change {
    uint32_t from, to;
    uint64_t after;  // batches each rank read before the checkpoint
  };
  for (Change c : {Change{4, 3, 6}, Change{2, 5, 14}, Change{3, 7, 5}}) {
    INFO("world " << c.from << " -> " << c.to << " after " << c.after << " batches");
    LoaderState state;
    std::vector<uint64_t> seen = ReadRanks(archive, c.from, nullptr, c.after, &state);
    CHECK(state.consumed == c.after * 10 * c.from);
    CHECK(state.world_size == c.from);
    std::vector<uint64_t> rest = ReadRanks(archive, c.to, &state, ~uint64_t{0}, nullptr);
    std::vector<uint64_t> count(1200);
    for (uint64_t i : seen) ++count[i];
    for (uint64_t i : rest) ++count[i];
    const uint64_t padding = seen.size() + rest.size() - 1200;
    CHECK(padding < c.to);  // DistributedSampler-style padding of the last row only
    CHECK(*std::min_element(count.begin(), count.end()) == 1);
    CHECK(*std::max_element(count.begin(), count.end()) <= 2);
    if ((1200 - state.consumed) % c.to == 0) CHECK(padding == 0);
  }
}

TEST_CASE("a resume at the same world size gives exactly the batches that were next") {
  testing::TempDir dir;
  auto archive = testing::MakeConstantArchive(dir / "a", 333, 4);
  LoaderState state;
  ReadRanks(archive, 3, nullptr, 4, &state);
  std::vector<uint64_t> resumed = ReadRanks(archive, 3, &state, ~uint64_t{0}, nullptr);
  std::vector<uint64_t> whole = ReadRanks(archive, 3, nullptr, ~uint64_t{0}, nullptr);
  // Rank by rank: whole = first 4 batches + the resumed rest (rank 0's share is checked here).
  SamplerOptions o;
  o.shuffle = true;
  o.seed = 5;
  o.world_size = 3;
  o.batch_size = 10;
  Sampler s(333, o);
  const EpochPlan plan = s.Plan(6);
  std::vector<uint64_t> rank0(resumed.begin(), resumed.begin() + (plan.samples - 40));
  for (uint64_t k = 40; k < plan.samples; ++k) REQUIRE(rank0[k - 40] == s.At(plan, k));
  CHECK(whole.size() == 3 * plan.samples);
}

}  // namespace
}  // namespace shardfeed::reader

namespace shardfeed::reader {
namespace {

TEST_CASE("with the block shuffle, one step of the whole job reads a bounded set of blocks") {
  // Ranks stride through the same global positions, so step k of all W ranks covers positions
  // [k*B*W, (k+1)*B*W): with windows of that many positions, at most two or three windows.
  const uint32_t world = 8, batch = 8, block = 16, window = 4;  // B*W = 64 = one window
  SamplerOptions o;
  o.shuffle = true;
  o.shuffle_block = block;
  o.shuffle_window = window;
  o.world_size = world;
  o.batch_size = batch;
  const uint64_t n = 16 * 1000 + 5;
  std::vector<Sampler> ranks;
  for (uint32_t r = 0; r < world; ++r) {
    o.rank = r;
    ranks.emplace_back(n, o);
  }
  const EpochPlan plan = ranks[0].Plan(2);
  for (uint64_t step = 0; step < plan.batches; ++step) {
    std::set<uint64_t> blocks;
    for (uint32_t r = 0; r < world; ++r) {
      const EpochPlan p = ranks[r].Plan(2);
      for (uint64_t k = step * batch; k < std::min(p.samples, (step + 1) * batch); ++k) {
        blocks.insert(ranks[r].At(p, k) / block);
      }
    }
    REQUIRE(blocks.size() <= 3 * window);
  }
}

}  // namespace
}  // namespace shardfeed::reader
