// Which shards a loader holds in the cache of a remote archive (shard_keeper.h).
#include "shard_keeper.h"

#include <algorithm>
#include <functional>
#include <limits>

namespace shardfeed::reader {

ShardKeeper::ShardKeeper(std::shared_ptr<format::Archive> archive, const Sampler* sampler,
                         uint32_t world_size, uint32_t rank)
    : archive_(std::move(archive)),
      sampler_(sampler),
      world_size_(world_size),
      rank_(rank),
      busy_(archive_->shard_count(), 0),
      retry_(archive_->shard_count(), 0),
      fetched_for_(archive_->shard_count(), 0) {}

uint64_t ShardKeeper::Need(const format::Archive& archive, uint32_t window, uint64_t in_flight,
                           uint32_t world_size, bool run_ahead, uint64_t* shards) {
  const auto& infos = archive.manifest().shards;
  const uint64_t n = infos.size();
  uint64_t fewest = std::numeric_limits<uint64_t>::max();
  std::vector<uint64_t> sizes;
  for (const auto& info : infos) {
    if (info.sample_count > 0) fewest = std::min(fewest, info.sample_count);
    sizes.push_back(info.file_bytes);
  }
  if (fewest == std::numeric_limits<uint64_t>::max()) fewest = 1;
  const uint64_t w = std::max<uint32_t>(1, window);
  // Samples in flight are consecutive positions of this rank: world_size times as many
  // consecutive global positions, which span this many windows of at least w x fewest samples
  // (one more where run-ahead crosses into the next epoch past a short last window).
  const uint64_t global = in_flight * world_size;
  uint64_t windows = (global + w * fewest - 1) / (w * fewest) + 1;
  if (run_ahead && n % w != 0) ++windows;
  uint64_t count = std::min<uint64_t>(n, windows * w + kShardDownloadsAhead);
  std::sort(sizes.begin(), sizes.end(), std::greater<uint64_t>());
  uint64_t bytes = 0;
  for (uint64_t i = 0; i < count; ++i) bytes += sizes[i];
  if (shards) *shards = count;
  return bytes;
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
  Touch(plan, k, n, &scratch_);
  for (uint32_t s : scratch_) ++busy_[s];
}

namespace {

// Shard `s` is begun in `span` (a position before `next`) and not finished (one at or after it),
// or is among the first kShardDownloadsAhead shards not begun (those fetched ahead for it). A
// shard the plan reads only later is not: held from an abandoned plan until the new one reached
// it, it would take cache the new plan's windows need (it is opened again when it comes).
bool Needed(const ShardSpan& span, uint64_t next, uint32_t s) {
  if (span.first[s] < next) return span.last[s] >= next;
  if (span.first[s] == std::numeric_limits<uint64_t>::max()) return false;
  auto it = std::partition_point(span.order.begin(), span.order.end(),
                                 [&](uint32_t x) { return span.first[x] < next; });
  for (uint32_t i = 0; i < kShardDownloadsAhead && it != span.order.end(); ++i, ++it) {
    if (*it == s) return true;
  }
  return false;
}

}  // namespace

bool ShardKeeper::Pending(uint32_t s, const ShardSpan& current, uint64_t current_next,
                          const ShardSpan* ahead, uint64_t ahead_next) const {
  if (busy_[s] > 0) return true;
  return Needed(current, current_next, s) || (ahead && Needed(*ahead, ahead_next, s));
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
  // The first shards the plan has not begun to read, in the order it reads them.
  auto it = std::partition_point(span.order.begin(), span.order.end(),
                                 [&](uint32_t s) { return span.first[s] < next; });
  for (uint32_t i = 0; i < kShardDownloadsAhead && it != span.order.end(); ++i, ++it) {
    if (fetched_for_[*it] != plan_id + 1) {
      fetched_for_[*it] = plan_id + 1;
      return *it;
    }
  }
  return -1;
}

}  // namespace shardfeed::reader
