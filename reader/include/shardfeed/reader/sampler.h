// Which samples an epoch visits, in which order, on which rank: computed on demand, in O(1)
// memory, whatever the number of samples or ranks.
//
// The global order of an epoch is a pure function of (sample count, seed, epoch, shuffle,
// shuffle_block, shuffle_window, shard_starts): a seeded bijection of [0, n) evaluated per
// position, never a vector. Rank r of W takes global positions r, r + W, r + 2W, ... (as
// DistributedSampler does), so the order is independent of workers, timing and, for the global
// order, of W. That is what makes a resume exact at the same world size and elastic across world
// sizes: a run that consumed the first c global positions resumes, at any W, with positions [c, n).
//
// Thread-safety: Sampler and EpochPlan are immutable after construction; At() may be called from
// any number of threads.
#pragma once

#include <cstdint>
#include <vector>

#include "shardfeed/base/random.h"

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
  // are permuted, and samples are permuted within each window of `shuffle_window` consecutive
  // (permuted) blocks, so any stretch of the epoch reads from at most `shuffle_window` blocks.
  uint32_t shuffle_block = 0;
  uint32_t shuffle_window = 8;
  // Shuffle by shard (shuffle="block", for remote archives read through a small cache): when
  // not empty, the first sample of each shard, ascending, from 0. The shards are visited in a
  // seeded order and samples are permuted within each window of `shuffle_window` consecutive
  // (permuted) shards, so a stretch of the epoch needs at most `shuffle_window` shards at once
  // and each shard is read in one window. Takes precedence over `shuffle_block`.
  std::vector<uint64_t> shard_starts;
};

// A seeded bijection of [0, n): a Feistel network of 6 rounds (a multiply-xorshift round
// function) on the smallest number of bits covering n, with halves of alternating width when
// that number is odd, and cycle walking back into [0, n) (fewer than 2 steps on average). O(1)
// memory; about 10-30 ns per element.
class Permutation {
 public:
  Permutation() = default;
  Permutation(uint64_t n, uint64_t key);
  uint64_t operator()(uint64_t i) const;  // i < size()
  uint64_t Inverse(uint64_t y) const;     // the i with (*this)(i) == y
  uint64_t size() const { return n_; }

 private:
  uint64_t Encrypt(uint64_t x) const;
  uint64_t Decrypt(uint64_t y) const;
  uint64_t n_ = 0;
  unsigned a_ = 0, b_ = 0;  // widths of the halves (a_ + b_ bits in all; b_ = a_ or a_ + 1)
  uint64_t keys_[6] = {};
};

// One rank's share of one epoch, starting at global position `start` (0: the whole epoch; a
// resume, possibly at another world size, starts where the interrupted run stood).
struct EpochPlan {
  uint64_t epoch = 0;
  uint64_t start = 0;    // global positions [start, n) are this plan's
  uint64_t samples = 0;  // this rank visits this many (padded or dropped as the options say)
  uint64_t batches = 0;
  Permutation order;        // the global order (identity without shuffle)
  Permutation block_order;  // shuffle_block: the order of blocks
  uint64_t short_slot = 0;  // shuffle_block: where the short last block landed in that order
  // Shuffle by shard: global position where each permuted slot's shard starts (shards + 1).
  std::vector<uint64_t> slot_starts;
};

class Sampler {
 public:
  Sampler(uint64_t sample_count, const SamplerOptions& options);

  // The plan of `epoch` from global position `start` on. Without drop_last, ranks are padded to
  // equal length by repeating positions from `start` on, as DistributedSampler does from 0, so
  // every rank has the same number of batches; with drop_last the remainder is dropped.
  EpochPlan Plan(uint64_t epoch, uint64_t start = 0) const;
  // The k-th sample (k < plan.samples) this rank visits. O(1).
  uint64_t At(const EpochPlan& plan, uint64_t k) const;
  // The sample at global position g (< n) of `plan`'s epoch.
  uint64_t GlobalAt(const EpochPlan& plan, uint64_t g) const;
  // Global positions consumed once every rank delivered `batches` batches of `plan`: where a
  // run at any world size resumes (Plan(epoch, Consumed(...))).
  uint64_t Consumed(const EpochPlan& plan, uint64_t batches) const;

  // This rank's whole epoch, materialised (O(samples) memory: tests and tools only).
  std::vector<uint64_t> EpochOrder(uint64_t epoch) const;
  uint64_t samples_per_rank() const;   // of a whole epoch
  uint64_t batches_per_epoch() const;  // of a whole epoch
  uint64_t size() const { return n_; }
  const SamplerOptions& options() const { return options_; }

 private:
  uint64_t ShardShuffleAt(const EpochPlan& plan, uint64_t g) const;
  uint64_t n_;
  SamplerOptions options_;
};

// A reproducible 64-bit generator (splitmix64) used for shuffles and augmentation draws.
using Rng = shardfeed::Rng;  // base/random.h: the one implementation, shared with the packer

// Mixes several values into one seed (for per-(seed, epoch, sample) streams).
uint64_t MixSeed(uint64_t a, uint64_t b, uint64_t c = 0);

}  // namespace shardfeed::reader
