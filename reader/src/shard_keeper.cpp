// Which shards a loader holds in the cache of a remote archive (shard_keeper.h).
#include "shard_keeper.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

namespace shardfeed::reader {

ShardKeeper::ShardKeeper(std::shared_ptr<format::Archive> archive, const Sampler* sampler,
                         uint32_t world_size, uint32_t rank, uint32_t downloads)
    : archive_(std::move(archive)),
      sampler_(sampler),
      world_size_(world_size),
      rank_(rank),
      downloads_(downloads),
      busy_(archive_->shard_count(), 0),
      retry_(archive_->shard_count(), 0),
      fetched_for_(archive_->shard_count(), 0) {}

uint64_t ShardKeeper::Need(const std::vector<format::ShardInfo>& infos, uint32_t window,
                           uint64_t in_flight, uint32_t world_size, bool run_ahead,
                           uint32_t downloads, uint64_t* shards) {
  const uint64_t n = infos.size();
  std::vector<uint64_t> counts, sizes;
  uint64_t total = 0;
  for (const auto& info : infos) {
    counts.push_back(info.sample_count);
    sizes.push_back(info.file_bytes);
    total += info.file_bytes;
  }
  // least[k]: the fewest samples any k shards hold (the k smallest, summed).
  std::sort(counts.begin(), counts.end());
  std::vector<uint64_t> least(n + 1, 0);
  for (uint64_t k = 0; k < n; ++k) least[k + 1] = least[k] + counts[k];
  const uint64_t w = std::min<uint64_t>(std::max<uint32_t>(1, window), std::max<uint64_t>(1, n));
  // Samples in flight are consecutive positions of this rank: world_size times as many
  // consecutive global positions, g. A window is w consecutive shards of the block order and
  // its samples are consecutive positions, so a run of g positions that touches m windows
  // holds every sample of the m - 2 between its first and its last, and at least one of each
  // of those two: g >= least[(m - 2) w] + 2. Where run-ahead crosses into the next epoch, one
  // of the windows between may be the epoch's short last one (n % w shards): w - n % w fewer.
  const uint64_t g = std::max<uint64_t>(1, in_flight * world_size);
  const uint64_t short_by = run_ahead && n % w != 0 ? w - n % w : 0;
  uint64_t between = 0;  // the most whole windows a run of g positions can hold
  if (g >= 2) {
    while ((between + 1) * w <= n) {
      const uint64_t k = (between + 1) * w - std::min((between + 1) * w, short_by);
      if (least[k] > g - 2) break;
      ++between;
    }
  }
  const uint64_t windows = g >= 2 ? between + 2 : 1;
  const uint64_t count = std::min<uint64_t>(n, windows * w + downloads);
  if (shards) *shards = count;
  if (count == n) return total;
  // Bytes: the two end windows and the downloads, counted as the largest shards; the shards of
  // the windows between hold at most g - 2 samples in all, so they weigh no more than the
  // heaviest bytes per sample can fill with g - 2 samples (a fractional knapsack: a bound on
  // any set of shards of that many samples), nor than the largest (windows - 2) w shards. Shard
  // files split by bytes hold few samples where the images are big: counting the shards between
  // as the largest would ask for a window's worth of bytes that no run of g samples can hold.
  std::vector<uint64_t> by_size = sizes;
  std::sort(by_size.begin(), by_size.end(), std::greater<uint64_t>());
  auto largest = [&](uint64_t k) {
    uint64_t sum = 0;
    for (uint64_t i = 0; i < std::min(k, n); ++i) sum += by_size[i];
    return sum;
  };
  const uint64_t ends = largest(std::min(windows, uint64_t{2}) * w + downloads);
  uint64_t inner = 0;
  if (windows > 2) {
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
    // Densest first (bytes per sample); empty shards weigh nothing in samples, all in bytes.
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      const auto& x = infos[a];
      const auto& y = infos[b];
      return static_cast<unsigned __int128>(x.file_bytes) * y.sample_count >
             static_cast<unsigned __int128>(y.file_bytes) * x.sample_count;
    });
    long double room = static_cast<long double>(g - 2), fill = 0;
    for (size_t i : order) {
      const auto& s = infos[i];
      if (s.sample_count <= room) {
        room -= s.sample_count;
        fill += s.file_bytes;
      } else {
        fill += room / s.sample_count * s.file_bytes;
        break;
      }
    }
    inner = std::min(largest((windows - 2) * w), static_cast<uint64_t>(std::ceil(fill)));
  }
  return std::min(largest(count), ends + inner);
}

ShardSpan ShardKeeper::Span(const EpochPlan& plan) const {
  const size_t n = archive_->shard_count();
  ShardSpan span;
  span.first.assign(n, std::numeric_limits<uint64_t>::max());
  span.last.assign(n, 0);
  // Padding (positions past the plan's samples on this rank, which repeat from its start) does
  // not keep a shard held all epoch: it reopens the shard when it comes.
  const uint64_t remaining = sampler_->size() - std::min(sampler_->size(), plan.start);
  for (uint64_t k = 0; k < plan.samples; ++k) {
    if (k * world_size_ + rank_ >= remaining) break;
    const size_t s = archive_->ShardOf(sampler_->At(plan, k));
    if (span.first[s] == std::numeric_limits<uint64_t>::max()) {
      span.first[s] = k;
      span.order.push_back(static_cast<uint32_t>(s));
    }
    span.last[s] = k;
  }
  return span;
}

void ShardKeeper::Touch(const EpochPlan& plan, uint64_t k, uint32_t n,
                        std::vector<uint32_t>* shards) const {
  shards->clear();
  for (uint64_t i = k; i < k + n; ++i) {
    const auto s = static_cast<uint32_t>(archive_->ShardOf(sampler_->At(plan, i)));
    if (std::find(shards->begin(), shards->end(), s) == shards->end()) shards->push_back(s);
  }
}

void ShardKeeper::Claimed(const EpochPlan& plan, uint64_t k, uint32_t n) {
  Hold(plan, k, n, &scratch_);
}

namespace {

// The shards `span` has not begun to read at position `next`, in the order it first reads them
// (the first `downloads` of them are those fetched ahead).
std::vector<uint32_t>::const_iterator FirstUnbegun(const ShardSpan& span, uint64_t next) {
  return std::partition_point(span.order.begin(), span.order.end(),
                              [&](uint32_t x) { return span.first[x] < next; });
}

// Shard `s` is begun in `span` (a position before `next`) and not finished (one at or after it),
// or is among the first `downloads` shards not begun (those fetched ahead for it). A
// shard the plan reads only later is not: held from an abandoned plan until the new one reached
// it, it would take cache the new plan's windows need (it is opened again when it comes).
bool Needed(const ShardSpan& span, uint64_t next, uint32_t s, uint32_t downloads) {
  if (span.first[s] < next) return span.last[s] >= next;
  if (span.first[s] == std::numeric_limits<uint64_t>::max()) return false;
  auto it = FirstUnbegun(span, next);
  for (uint32_t i = 0; i < downloads && it != span.order.end(); ++i, ++it) {
    if (*it == s) return true;
  }
  return false;
}

}  // namespace

bool ShardKeeper::Pending(uint32_t s, const ShardSpan& current, uint64_t current_next,
                          const ShardSpan* ahead, uint64_t ahead_next) const {
  if (busy_[s] > 0) return true;
  return Needed(current, current_next, s, downloads_) ||
         (ahead && Needed(*ahead, ahead_next, s, downloads_));
}

void ShardKeeper::Finished(const EpochPlan& plan, uint64_t k, uint32_t n, const ShardSpan& current,
                           uint64_t current_next, const ShardSpan* ahead, uint64_t ahead_next) {
  Touch(plan, k, n, &scratch_);
  Unhold(scratch_, current, current_next, ahead, ahead_next);
}

void ShardKeeper::Hold(const EpochPlan& plan, uint64_t k, uint32_t n,
                       std::vector<uint32_t>* shards) {
  Touch(plan, k, n, shards);
  for (uint32_t s : *shards) ++busy_[s];
}

void ShardKeeper::Unhold(const std::vector<uint32_t>& shards, const ShardSpan& current,
                         uint64_t current_next, const ShardSpan* ahead, uint64_t ahead_next) {
  for (uint32_t s : shards) {
    if (busy_[s] > 0) --busy_[s];
    if (busy_[s] == 0 && retry_[s]) {  // failed in an earlier plan: its error is forgotten now
      retry_[s] = 0;
      if (archive_->ShardFailed(s)) archive_->ReleaseShard(s);
    }
    if (!Pending(s, current, current_next, ahead, ahead_next)) Release(s);
  }
}

void ShardKeeper::Sweep(const ShardSpan& current, uint64_t current_next, const ShardSpan* ahead,
                        uint64_t ahead_next) {
  for (uint32_t s = 0; s < busy_.size(); ++s) {
    // A new plan tries a shard whose open failed again (a network outage need not last), once no
    // run still reads it; within a plan, its other samples fail at once (no retry storm).
    if (archive_->ShardFailed(s)) {
      if (busy_[s] == 0) {
        archive_->ReleaseShard(s);
      } else {
        retry_[s] = 1;
      }
    }
    if (!Pending(s, current, current_next, ahead, ahead_next)) Release(s);
  }
}

void ShardKeeper::ReleaseUnneeded(uint32_t s, const ShardSpan& current, uint64_t current_next,
                                  const ShardSpan* ahead, uint64_t ahead_next) {
  if (!Pending(s, current, current_next, ahead, ahead_next)) Release(s);
}

void ShardKeeper::Release(uint32_t s) {
  // Not open: closed already, or being opened by a fetcher thread, which holds the shard's mutex
  // for its whole download; ReleaseShard would wait for that with the loader's lock held. The
  // fetcher gives such a shard back itself once downloaded (ReleaseUnneeded).
  if (archive_->ShardOpen(s) || archive_->ShardFailed(s)) archive_->ReleaseShard(s);
}

int64_t ShardKeeper::NextDownload(const ShardSpan& span, uint64_t next, uint64_t plan_id) {
  auto it = FirstUnbegun(span, next);
  for (uint32_t i = 0; i < downloads_ && it != span.order.end(); ++i, ++it) {
    if (fetched_for_[*it] != plan_id + 1) {
      fetched_for_[*it] = plan_id + 1;
      return *it;
    }
  }
  return -1;
}

}  // namespace shardfeed::reader
