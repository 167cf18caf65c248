// Remote archives read with shuffle="block" (internal to the loader): which shards the loader
// holds in the local cache, so that a cache smaller than the archive works.
//
// A shard is held (mapped, its cached file flocked: storage/remote.h) from its first use until
// every sample of it in the epoch's plan has been decoded into a batch slot; then the keeper
// releases it (format::Archive::ReleaseShard) and the cache may evict it. Meanwhile `downloads`
// fetcher threads open the next shards of the plan, in the order the plan first reads them, at
// most `downloads` shards ahead of the workers, so workers seldom wait for a download.
//
// What a reader holds at once is then bounded (Need): the shards of the samples in flight (at
// most the ring's capacity of batches, spanning a few windows of `shuffle_window` shards) plus
// those fetched ahead. Loader::Create refuses a cache_limit below it, giving the minimum. The
// bound is for one plan: after StartEpoch abandons one, no run of the new plan is claimed until
// the abandoned plan's runs in flight have ended (Loader::Impl::AbandonedRunsInFlight), and no
// fetcher thread downloads for the new plan until then either, so the two plans' batches never
// hold shards at once.
//
// Thread-safety: every method but Need, ShardsOf and the archive's own calls runs with the
// loader's lock (Impl::mu) held; ReleaseShard runs there too, so no worker can claim a run of a
// shard while it is being released. A shard is released only when no claimed run touches it
// (busy == 0, which also covers a batch whose variable fields the consumer has yet to gather)
// and, in the plan being handed out and in the epoch run ahead, it is neither begun and
// unfinished nor among the next shards fetched ahead: no worker holds a view of it then. A
// shard a new plan reads only later is released (StartEpoch) and opened again when it comes.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "shardfeed/base/status.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/reader/sampler.h"

namespace shardfeed::reader {

// Shards downloaded ahead of the workers (fetcher threads), where the cache holds them; a
// cache too small for that many gets fewer (down to none: workers then fetch what they read).
inline constexpr uint32_t kShardDownloadsAhead = 2;

// Where one plan (an epoch on this rank) first and last reads each shard.
struct ShardSpan {
  std::vector<uint64_t> first, last;  // per shard: positions; first = UINT64_MAX when unread
  std::vector<uint32_t> order;        // shards read, by first position
};

class ShardKeeper {
 public:
  // `downloads`: shards the fetcher threads open ahead of the workers (PlanCache's choice).
  ShardKeeper(std::shared_ptr<format::Archive> archive, const Sampler* sampler, uint32_t world_size,
              uint32_t rank, uint32_t downloads);

  // Bytes a reader holds at most with `window` shards per window, `in_flight` samples of this
  // rank being decoded at once (ring capacity x batch size), `world_size` ranks, run-ahead on or
  // off and `downloads` shards fetched ahead, over an archive of `shards_of` (its manifest's
  // list): the shards of the most windows those samples can span (counted from the smallest
  // shards' sample counts, so one short shard does not inflate it) plus the downloads. Bytes:
  // the end windows and the downloads at the largest shards' sizes, the windows between at
  // most what their samples can weigh (shard_keeper.cpp). *shards gets the count (the whole
  // archive at most). Pure; any thread.
  static uint64_t Need(const std::vector<format::ShardInfo>& shards_of, uint32_t window,
                       uint64_t in_flight, uint32_t world_size, bool run_ahead, uint32_t downloads,
                       uint64_t* shards);

  // mu held. A plan became the current one (or the one run ahead): where it reads each shard.
  ShardSpan Span(const EpochPlan& plan) const;
  // mu held. A run [k, k + n) of `plan` was claimed / is done. Finished releases the shards of
  // the run that nothing needs now (see the header comment), given where the current plan and
  // the one run ahead (nullptr when none) are handed out up to.
  void Claimed(const EpochPlan& plan, uint64_t k, uint32_t n);
  void Finished(const EpochPlan& plan, uint64_t k, uint32_t n, const ShardSpan& current,
                uint64_t current_next, const ShardSpan* ahead, uint64_t ahead_next);
  // mu held. A batch whose variable fields the consumer gathers from the archive (Next,
  // GatherFields) after its runs finished: the shards of its positions [k, k + n) of `plan` go
  // to *shards and stay held until Unhold (after the gather, or when its slot is freed unread).
  void Hold(const EpochPlan& plan, uint64_t k, uint32_t n, std::vector<uint32_t>* shards);
  void Unhold(const std::vector<uint32_t>& shards, const ShardSpan& current, uint64_t current_next,
              const ShardSpan* ahead, uint64_t ahead_next);
  // mu held. Releases every shard nothing needs (a new plan: what the old one left open).
  void Sweep(const ShardSpan& current, uint64_t current_next, const ShardSpan* ahead,
             uint64_t ahead_next);
  // mu held. A fetcher thread downloaded shard `s` for a plan that is gone (StartEpoch; Sweep
  // left the shard alone while it was being downloaded): released unless something needs it.
  void ReleaseUnneeded(uint32_t s, const ShardSpan& current, uint64_t current_next,
                       const ShardSpan* ahead, uint64_t ahead_next);
  // mu held. The next shard to fetch ahead (the first `downloads` shards the plan has
  // not begun to read, not fetched already), or -1. Marks it as taken.
  int64_t NextDownload(const ShardSpan& span, uint64_t next, uint64_t plan_id);

  format::Archive& archive() { return *archive_; }
  uint32_t downloads() const { return downloads_; }

 private:
  bool Pending(uint32_t s, const ShardSpan& current, uint64_t current_next, const ShardSpan* ahead,
               uint64_t ahead_next) const;
  void Touch(const EpochPlan& plan, uint64_t k, uint32_t n, std::vector<uint32_t>* shards) const;
  // ReleaseShard (which also forgets a failed open), unless `s` is neither open nor failed (maybe
  // being downloaded).
  void Release(uint32_t s);

  std::shared_ptr<format::Archive> archive_;
  const Sampler* sampler_;
  uint32_t world_size_, rank_;
  uint32_t downloads_;
  std::vector<uint32_t> busy_;         // per shard: claimed runs not done that read it
  std::vector<uint8_t> retry_;         // per shard: failed, to be forgotten when busy_ reaches 0
  std::vector<uint64_t> fetched_for_;  // per shard: plan_id + 1 it was fetched ahead for
  std::vector<uint32_t> scratch_;
};

}  // namespace shardfeed::reader
