// The loader over a remote archive (s3://, http(s)://; docs/REMOTE.md): the cache it needs at
// Create, and with shuffle="block" the shard keeper (shard_keeper.h) and its fetcher threads.
#include <algorithm>
#include <string>

#include "loader_internal.h"

namespace shardfeed::reader {
namespace {

std::string Shards(uint64_t n) { return std::to_string(n) + (n == 1 ? " shard" : " shards"); }

}  // namespace

// long: the cache plan and the refusals that spell out what each choice needs, in one place.
Status Loader::Impl::PlanCache(LoaderOptions* o, std::shared_ptr<format::Archive>* own_copy,
                               uint32_t* downloads, const CancelToken* cancel) {
  const storage::Remote& remote = *archive->remote();
  const uint64_t limit = remote.cache_limit();  // 0: unlimited
  uint64_t whole = 0;
  for (const auto& info : archive->manifest().shards) whole += info.file_bytes;
  const bool by_shard = o->shuffle && o->shuffle_by_shard;
  *downloads = kShardDownloadsAhead;
  // The archive given to the loader keeps the shards it has opened (mapped, their cached files
  // held) while the loader's own copy opens what it reads again: those count too. (Shards the
  // caller opens through it later are the caller's to fit.)
  uint64_t held = 0, held_shards = 0;
  for (size_t s = 0; s < archive->shard_count(); ++s) {
    if (archive->ShardOpen(s)) held += archive->manifest().shards[s].file_bytes, ++held_shards;
  }
  // Both archives map the same cached files, so what they hold together is the union: never
  // more than the whole archive (adding them refused a cache that holds every shard, while a
  // smaller one, where the given archive opened lazily and held nothing, was taken).
  // With `slots` ring slots of samples in flight and `ahead` downloads ahead of the workers.
  auto need_with = [&](uint32_t window, uint32_t slots, uint32_t ahead, uint64_t* shards) {
    const uint64_t bytes = held + ShardKeeper::Need(archive->manifest().shards, window,
                                                    uint64_t{slots} * o->batch_size, o->world_size,
                                                    o->run_ahead, ahead, shards);
    return std::min(bytes, whole);
  };
  auto need = [&](uint32_t window, uint64_t* shards) {
    return need_with(window, ring_cap, *downloads, shards);
  };
  if (!by_shard || o->mode != WorkerMode::kThreads) {
    // Every shard stays held until the archive is closed: the cache must hold them all. The
    // figure quoted for threads with shuffle="block" is the least that path takes (below): a
    // ring of 2 slots when prefetch is auto, no download ahead, the window given or 1.
    const uint64_t block =
        need_with(o->shuffle_window == LoaderOptions::kAutoWindow ? 1 : o->shuffle_window,
                  auto_prefetch ? std::min<uint32_t>(ring_cap, 2) : ring_cap, 0, nullptr);
    std::string why = "of " + archive->path() + "'s shards (";
    why += by_shard ? "worker processes hold every shard they read; mode=\"threads\" with "
                      "shuffle=\"block\" releases them and needs " +
                          std::to_string(block) + " bytes"
                    : "global shuffle holds every shard it has read; shuffle=\"block\" reads "
                      "a window of shards at a time and needs only " +
                          std::to_string(block) + " bytes";
    SF_RETURN_IF_ERROR(remote.CheckLimit(whole, why + ")"));
    if (o->shuffle_window == LoaderOptions::kAutoWindow) o->shuffle_window = 8;
    return Status::OK();
  }
  // shuffle="block": the window fits the cache (auto: the most up to 8 that does).
  uint64_t shards = 0;
  // prefetch="auto": fewer ring slots (each slot's samples keep their shards held) rather than
  // a refusal; an explicit prefetch is taken as given.
  while (auto_prefetch && limit != 0 && ring_cap > 2 && need(1, &shards) > limit) --ring_cap;
  // Then fewer shards fetched ahead (workers wait for more downloads, but the epoch reads).
  const uint32_t fit_window =
      o->shuffle_window == LoaderOptions::kAutoWindow ? 1 : o->shuffle_window;
  while (limit != 0 && *downloads > 0 && need(fit_window, &shards) > limit) --*downloads;
  if (o->shuffle_window == LoaderOptions::kAutoWindow) {
    uint32_t w = 8;
    while (w > 1 && limit != 0 && need(w, &shards) > limit) --w;
    o->shuffle_window = w;
  }
  const uint64_t bytes = need(o->shuffle_window, &shards);
  std::string more;  // refused with no download ahead: what the full number would need
  if (*downloads < kShardDownloadsAhead) {
    more = "; " +
           std::to_string(need_with(o->shuffle_window, ring_cap, kShardDownloadsAhead, nullptr)) +
           " bytes let it download " + std::to_string(kShardDownloadsAhead) +
           " shards ahead of the workers";
  }
  SF_RETURN_IF_ERROR(remote.CheckLimit(
      bytes, "a loader of " + archive->path() + " holds at once with shuffle=\"block\" (" +
                 Shards(shards) +
                 ": the windows of shuffle_window=" + std::to_string(o->shuffle_window) +
                 " shards that " + std::to_string(uint64_t{ring_cap} * o->batch_size) +
                 " samples in flight span, and " + std::to_string(*downloads) +
                 " downloaded ahead, the end windows' and the " +
                 "downloads' at the largest shards' sizes; a smaller shuffle_window, batch_size " +
                 "or prefetch needs less" + more +
                 (held_shards ? "; and " + Shards(held_shards) + " the archive given to the " +
                                    "loader holds open, " + std::to_string(held) + " bytes"
                              : std::string()) +
                 ")"));
  // A copy of the archive of the loader's own: only the keeper releases its shards, and no
  // view of it is ever handed to anyone else. Lazy: a shard is fetched when the plan needs it.
  format::OpenOptions open = archive->open_options();
  open.check = format::IndexCheck::kLazy;
  open.cache.dir = remote.cache_dir();
  open.cache.limit = limit;
  open.cancel = cancel;
  SF_ASSIGN_OR_RETURN(std::shared_ptr<format::Archive> own,
                      format::Archive::Open(archive->path(), open));
  const auto& a = archive->manifest().shards;
  const auto& b = own->manifest().shards;
  bool same = own->size() == archive->size() && a.size() == b.size();
  for (size_t s = 0; same && s < a.size(); ++s) same = a[s].content_hash == b[s].content_hash;
  if (!same) {
    return Status::Corrupt(archive->path(), ": its manifest changed while the loader opened it");
  }
  archive = own;
  *own_copy = std::move(own);
  return Status::OK();
}

void Loader::Impl::KeeperFinished(const Task& run) {
  keeper->Finished(run.plan, run.k, run.count, current_span, current.next_task,
                   ahead.on ? &ahead_span : nullptr, ahead.next_task);
}

void Loader::Impl::KeeperUnholdSlot(int s) {
  if (!keeper || slots[s].held_shards.empty()) return;
  keeper->Unhold(slots[s].held_shards, current_span, current.next_task,
                 ahead.on ? &ahead_span : nullptr, ahead.next_task);
  slots[s].held_shards.clear();
}

void Loader::Impl::AwaitShard(uint64_t index) {
  format::Archive& own = keeper->archive();
  const size_t s = own.ShardOf(index);
  if (own.ShardOpen(s)) return;
  const auto start = Clock::now();
  (void)own.OpenShardNow(s);  // an error is the sample's, reported by its read
  fetch_wait_ns.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count(),
      std::memory_order_relaxed);
}

void Loader::Impl::FetchAhead() {
  {
    std::unique_lock<std::mutex> lock(mu);
    while (!stopping && fatal.ok()) {
      int64_t s = -1;
      uint64_t for_plan = 0;
      if (AbandonedRunsInFlight()) {
        // The new plan's shards wait, as its runs do (Claim): downloaded now, they would share
        // the cache with the abandoned runs' shards, which the cache is not sized for.
      } else if (started && current.next_task < current.plan.samples) {
        s = keeper->NextDownload(current_span, current.next_task, current_plan_id);
        for_plan = current_plan_id;
      } else if (started && ahead.on) {
        s = keeper->NextDownload(ahead_span, ahead.next_task, ahead_plan_id);
        for_plan = ahead_plan_id;
      }
      if (s < 0) {
        // Bounded: wakes for a new claim position (no notification is sent for it).
        cv_work.wait_for(lock, std::chrono::milliseconds(20));
        continue;
      }
      lock.unlock();
      try {
        (void)keeper->archive().OpenShardNow(static_cast<size_t>(s));  // errors: at the read
      } catch (...) {
        // Stops here (a thread boundary): fetching ahead is only a head start, and the read of
        // one of the shard's samples opens it again and reports what goes wrong.
      }
      lock.lock();
      if (for_plan != current_plan_id && !(ahead.on && for_plan == ahead_plan_id)) {
        keeper->ReleaseUnneeded(static_cast<uint32_t>(s), current_span, current.next_task,
                                ahead.on ? &ahead_span : nullptr, ahead.next_task);
      }
    }
    --threads_running;
  }
  cv_exit.notify_all();
}

}  // namespace shardfeed::reader
