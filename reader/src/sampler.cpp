#include "shardfeed/reader/sampler.h"

#include <algorithm>

namespace shardfeed::reader {
namespace {

constexpr uint64_t kShuffleSalt = 0x5348554646ull;  // "SHUFF"
constexpr uint64_t kBlockSalt = 0x424C4F434Bull;    // "BLOCK"
constexpr uint64_t kShardSalt = 0x5348415244ull;    // "SHARD"

}  // namespace

uint64_t MixSeed(uint64_t a, uint64_t b, uint64_t c) {
  Rng r(a ^ 0x5851F42D4C957F2Dull);
  uint64_t h = r.Next() ^ b;
  Rng r2(h);
  h = r2.Next() ^ c;
  Rng r3(h);
  return r3.Next();
}

Permutation::Permutation(uint64_t n, uint64_t key) : n_(n) {
  unsigned bits = 2;
  while (bits < 64 && (uint64_t{1} << bits) < n) ++bits;
  a_ = bits / 2;
  b_ = bits - a_;
  Rng rng(key);
  for (uint64_t& k : keys_) k = rng.Next() | 1;
}

namespace {

// The round function: a multiply-xorshift of (value ^ key), its top `width` bits.
inline uint64_t Round(uint64_t x, uint64_t key, unsigned width) {
  x = (x ^ key) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  x *= key;
  return x >> (64 - width);
}

}  // namespace

// (left: w_l bits, right: w_r bits) -> (right, left ^ F(right)): the halves swap widths each
// round, so after the (even) 6 rounds they are back as they started.
uint64_t Permutation::Encrypt(uint64_t x) const {
  unsigned wl = a_, wr = b_;
  uint64_t left = x >> wr, right = x & ((uint64_t{1} << wr) - 1);
  for (uint64_t k : keys_) {
    const uint64_t next = left ^ Round(right, k, wl);
    left = right;
    right = next;
    std::swap(wl, wr);
  }
  return (left << wr) | right;
}

uint64_t Permutation::Decrypt(uint64_t y) const {
  unsigned wl = a_, wr = b_;
  uint64_t left = y >> wr, right = y & ((uint64_t{1} << wr) - 1);
  for (int r = 5; r >= 0; --r) {
    // Undo (left, right) = (R, L ^ F(R)): R had width wl and L width wr before the round.
    std::swap(wl, wr);
    const uint64_t prev_left = right ^ Round(left, keys_[r], wl);
    right = left;
    left = prev_left;
  }
  return (left << wr) | right;
}

uint64_t Permutation::Inverse(uint64_t y) const {
  uint64_t x = Decrypt(y);
  while (x >= n_) x = Decrypt(x);
  return x;
}

uint64_t Permutation::operator()(uint64_t i) const {
  // Cycle walking: the network permutes [0, 2^bits); following it until the value falls back
  // into [0, n) permutes [0, n).
  uint64_t y = Encrypt(i);
  while (y >= n_) y = Encrypt(y);
  return y;
}

Sampler::Sampler(uint64_t sample_count, const SamplerOptions& options)
    : n_(sample_count), options_(options) {
  if (options_.world_size == 0) options_.world_size = 1;
  if (options_.batch_size == 0) options_.batch_size = 1;
  if (options_.shuffle_window == 0) options_.shuffle_window = 1;
}

EpochPlan Sampler::Plan(uint64_t epoch, uint64_t start) const {
  EpochPlan p;
  p.epoch = epoch;
  p.start = std::min(start, n_);
  const uint64_t w = options_.world_size, b = options_.batch_size;
  const uint64_t remaining = n_ - p.start;
  if (options_.drop_last) {
    p.batches = remaining / w / b;
    p.samples = p.batches * b;
  } else {
    p.samples = (remaining + w - 1) / w;
    p.batches = (p.samples + b - 1) / b;
  }
  if (options_.shuffle) {
    const uint64_t key = MixSeed(options_.seed, epoch, kShuffleSalt);
    const uint64_t block = options_.shuffle_block;
    const std::vector<uint64_t>& shards = options_.shard_starts;
    if (shards.size() > 1) {
      p.block_order = Permutation(shards.size(), MixSeed(key, kBlockSalt));
      p.slot_starts.resize(shards.size() + 1);
      for (uint64_t slot = 0; slot < shards.size(); ++slot) {
        const uint64_t s = p.block_order(slot);
        const uint64_t end = s + 1 < shards.size() ? shards[s + 1] : n_;
        p.slot_starts[slot + 1] = p.slot_starts[slot] + (end - shards[s]);
      }
    } else if (block == 0 || block >= n_) {
      p.order = Permutation(n_, key);
    } else {
      const uint64_t blocks = (n_ + block - 1) / block;
      p.block_order = Permutation(blocks, MixSeed(key, kBlockSalt));
      p.short_slot = p.block_order.Inverse(blocks - 1);
    }
  }
  return p;
}

uint64_t Sampler::GlobalAt(const EpochPlan& plan, uint64_t g) const {
  if (!options_.shuffle) return g;
  if (plan.order.size()) return plan.order(g);
  if (!plan.slot_starts.empty()) return ShardShuffleAt(plan, g);
  // Block shuffle. Window w holds the blocks at permuted slots [w*W, w*W + W) and permutes their
  // samples among themselves. Every block has `block` samples but the last (original numbering),
  // which sits at slot plan.short_slot; so a window's start and size are O(1) to compute.
  const uint64_t block = options_.shuffle_block, blocks = plan.block_order.size();
  const uint64_t per = options_.shuffle_window, shortfall = blocks * block - n_;
  auto start_of = [&](uint64_t w) {  // first global position of window w
    const uint64_t slot = std::min(blocks, w * per);
    return slot * block - (plan.short_slot < slot ? shortfall : 0);
  };
  uint64_t w = g / (block * per);
  while (w > 0 && start_of(w) > g) --w;
  while (start_of(w + 1) <= g) ++w;
  const uint64_t first = start_of(w), size = start_of(w + 1) - first;
  const Permutation inner(size, MixSeed(options_.seed, plan.epoch, MixSeed(w, kBlockSalt)));
  uint64_t q = inner(g - first);
  for (uint64_t slot = w * per; slot < std::min(blocks, (w + 1) * per); ++slot) {
    const uint64_t bsize = slot == plan.short_slot ? block - shortfall : block;
    if (q < bsize) return plan.block_order(slot) * block + q;
    q -= bsize;
  }
  return g;  // unreachable: q < size
}

// Shuffle by shard: window w holds the shards at permuted slots [w*W, w*W + W); its positions
// map through a permutation of its own onto their samples. O(log shards).
uint64_t Sampler::ShardShuffleAt(const EpochPlan& plan, uint64_t g) const {
  const std::vector<uint64_t>& starts = plan.slot_starts;
  const uint64_t slots = starts.size() - 1, per = options_.shuffle_window;
  auto slot_of = [&](uint64_t pos) {
    return static_cast<uint64_t>(std::upper_bound(starts.begin(), starts.end(), pos) -
                                 starts.begin()) -
           1;
  };
  const uint64_t w = slot_of(g) / per;
  const uint64_t first = starts[w * per], end = starts[std::min(slots, (w + 1) * per)];
  const Permutation inner(end - first, MixSeed(options_.seed, plan.epoch, MixSeed(w, kShardSalt)));
  const uint64_t pos = first + inner(g - first);
  const uint64_t slot = slot_of(pos);
  return options_.shard_starts[plan.block_order(slot)] + (pos - starts[slot]);
}

uint64_t Sampler::At(const EpochPlan& plan, uint64_t k) const {
  const uint64_t remaining = n_ - plan.start;
  uint64_t rel = k * options_.world_size + options_.rank;
  if (rel >= remaining) rel %= remaining;  // padding repeats from the plan's start
  return GlobalAt(plan, plan.start + rel);
}

uint64_t Sampler::Consumed(const EpochPlan& plan, uint64_t batches) const {
  const uint64_t done = batches * options_.batch_size * options_.world_size;
  return std::min(n_, plan.start + std::min(done, n_));
}

std::vector<uint64_t> Sampler::EpochOrder(uint64_t epoch) const {
  const EpochPlan plan = Plan(epoch);
  std::vector<uint64_t> mine(plan.samples);
  for (uint64_t k = 0; k < plan.samples; ++k) mine[k] = At(plan, k);
  return mine;
}

uint64_t Sampler::samples_per_rank() const {
  const uint64_t w = options_.world_size;
  return options_.drop_last ? n_ / w : (n_ + w - 1) / w;
}

uint64_t Sampler::batches_per_epoch() const { return Plan(0).batches; }

}  // namespace shardfeed::reader
