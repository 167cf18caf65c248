// Sampler at scale: per-rank memory and time to the first batch's indices, for N = 10^6, 10^8
// and 10^9 samples and 10,000 ranks, with the on-demand sampler (reader/sampler.h) against the
// vector sampler it replaced (materialise and Fisher-Yates-shuffle the epoch, then take the
// rank's stride). Only the ranks measured are computed; nothing is built for all ranks at once.
//   sampler_scale [max_vector_n]     (default 1e8: the vector sampler at 1e9 needs 8 GB)
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <vector>

#include "shardfeed/reader/sampler.h"

using namespace shardfeed::reader;
using Clock = std::chrono::steady_clock;

namespace {

long MaxRssKb() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

constexpr uint32_t kWorld = 10000, kBatch = 256;

// The replaced sampler, as it worked: the whole epoch's order on every rank.
std::vector<uint64_t> VectorRankOrder(uint64_t n, uint32_t rank, uint64_t seed, uint64_t epoch) {
  std::vector<uint64_t> global(n);
  std::iota(global.begin(), global.end(), uint64_t{0});
  Rng rng(MixSeed(seed, epoch, 0x5348554646ull));
  for (uint64_t i = n; i > 1; --i) std::swap(global[i - 1], global[rng.Below(i)]);
  const uint64_t per = (n + kWorld - 1) / kWorld;
  std::vector<uint64_t> mine;
  mine.reserve(per);
  for (uint64_t k = rank; k < per * kWorld; k += kWorld) mine.push_back(global[k % n]);
  return mine;
}

}  // namespace

int main(int argc, char** argv) {
  const double max_vector = argc > 1 ? std::atof(argv[1]) : 1e8;
  std::printf("%-12s %-10s %14s %16s %18s\n", "N", "sampler", "rank memory", "first batch",
              "per index (avg)");
  uint64_t sink = 0;
  for (double nd : {1e6, 1e8, 1e9}) {
    const uint64_t n = static_cast<uint64_t>(nd);
    // On demand: three ranks, first batch each, then 100,000 lookups for the per-index cost.
    SamplerOptions o;
    o.shuffle = true;
    o.seed = 1;
    o.world_size = kWorld;
    o.batch_size = kBatch;
    double first = 0;
    for (uint32_t rank : {0u, 4999u, 9999u}) {
      o.rank = rank;
      auto t = Clock::now();
      Sampler s(n, o);
      EpochPlan plan = s.Plan(3);
      std::vector<uint64_t> batch(kBatch);
      for (uint32_t k = 0; k < kBatch; ++k) batch[k] = s.At(plan, k);
      first = std::max(first, Since(t));
      sink += batch[0];
    }
    o.rank = 17;
    Sampler s(n, o);
    EpochPlan plan = s.Plan(3);
    auto t = Clock::now();
    const uint64_t lookups = 100000;
    for (uint64_t k = 0; k < lookups; ++k) sink += s.At(plan, k % plan.samples);
    const double per = Since(t) / lookups;
    const size_t bytes = sizeof(Sampler) + sizeof(EpochPlan) + kBatch * sizeof(uint64_t);
    std::printf("%-12.0e %-10s %11zu B %13.1f us %15.1f ns\n", nd, "on-demand", bytes, first * 1e6,
                per * 1e9);
    // Vector: one rank (the cost is the same on every rank).
    if (nd <= max_vector) {
      const long before = MaxRssKb();
      t = Clock::now();
      std::vector<uint64_t> mine = VectorRankOrder(n, 0, 1, 3);
      const double vfirst = Since(t);
      const long grew = MaxRssKb() - before;
      sink += mine[0];
      std::printf("%-12.0e %-10s %10.1f MB %13.2f s  %16s\n", nd, "vector", grew / 1024.0, vfirst,
                  "(materialised)");
    } else {
      std::printf("%-12.0e %-10s %10.1f MB %16s %16s\n", nd, "vector", n * 8.0 / 1048576,
                  "(not run)", "8 bytes x N");
    }
  }
  std::fprintf(stderr, "(checksum %llu)\n", static_cast<unsigned long long>(sink));
  return 0;
}
