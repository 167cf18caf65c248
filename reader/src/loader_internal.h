// The loader's state (internal), shared by its parts, each with its own file and contract:
//   batch_ring.{h,cpp}    slots and leases: where a batch's life begins and ends
//   epoch_plan.{h,cpp}    which sample is decoded next: claims, run-ahead, generations,
//                         StartEpoch / State / Resume
//   worker_pool.{h,cpp}   thread workers, a run's completion, timeouts;
//                         process_workers.cpp the worker processes
//   tuner.{h,cpp}         workers="auto" and prefetch="auto"
//   loader.cpp            Create and Next: the consumer's side
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "batch_fields.h"
#include "batch_ring.h"
#include "epoch_plan.h"
#include "shard_keeper.h"
#include "shardfeed/reader/loader.h"
#include "shardfeed/storage/remote.h"
#include "tuner.h"
#include "worker_pool.h"

namespace shardfeed::reader {

using Clock = std::chrono::steady_clock;
inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The error of a call on a forked copy of a loader whose workers live in process `owner`.
inline Status ForkedCopy(pid_t owner) {
  return Status::InvalidArgument("this loader's workers live in process ", owner,
                                 "; this is a forked copy: create a loader in this process");
}

struct Loader::Impl {
  ~Impl();
  void Shutdown();
  bool InOwnerProcess() const;
  // Processes mode: no longer a ring the fork handler privatises in a child (process_workers.cpp).
  void ForgetSharedRing();

  // ---- The epoch plan (epoch_plan.cpp) ----
  // A worker's next run of samples; false when the loader stops. Sleeps while there is nothing
  // to claim, every slot is taken, or the worker is asleep (workers="auto").
  bool Claim(size_t worker, Task* task);
  // mu held: hands `worker` the next run of `from` (generation `gen`), taking a free slot for a
  // new batch; false when that needs a slot and none is free.
  bool ClaimFrom(EpochWork& from, uint64_t gen, size_t worker, Task* task);
  bool RunAhead();                // mu held: start (or go on with) the epoch expected next
  bool Live(uint64_t gen) const;  // mu held: `gen` is the epoch in progress or run ahead
  // mu held: a worker still decodes a run of a batch whose epoch was abandoned (StartEpoch).
  // With the shard keeper, Claim hands out nothing new until those runs end: their batches'
  // shards stay held until then, and the cache is sized for one plan's batches in flight
  // (ShardKeeper::Need), not two.
  bool AbandonedRunsInFlight() const;
  bool RunLive(const Task& run) const;  // takes mu: the run's batch may still be delivered
  void Resolve(Task* task) const;       // index and seed of a claimed task (no lock needed)
  uint32_t RunLength() const;           // samples a claim hands out at most
  // mu held: StartEpoch's switch to `plan` (batch `start_batch` on), cancelling what other
  // generations have not delivered. `again`: the same epoch read again from a batch that failed
  // (Next), its statistics, fetch counters and the epoch expected next kept.
  void BeginEpoch(EpochPlan plan, uint64_t start_batch, bool again = false);

  // ---- The ring (batch_ring.cpp) ----
  void ReleaseSlot(int slot);  // a lease ended (any thread)
  void FreeSlot(int slot);     // mu held: back to the ring, or retiring
  // Commits slots up to `depth` and gives back retiring ones: pinning and unpinning happen
  // here, on the consumer's thread (or Create's), outside the lock. A slot that cannot be
  // committed stops the ring's growth (the tuning says why); at Create it is an error.
  Status MaintainRing();
  bool RingStarved() const;              // mu held: every usable slot is leased by the consumer
  int batch_slot(uint64_t batch) const;  // slot filling or holding `batch`, or -1 (mu held)
  // The slot of `batch` of generation `gen` in `map` (batch % capacity -> slot), or -1.
  int SlotOf(const std::vector<int>& map, uint64_t gen, uint64_t batch) const;
  // The consumer holds every slot: asks for one beyond the ring (mu held by `lock`, released
  // while it is committed). An error naming kept_mb when the cap is reached.
  Status AddKeptSlot(std::unique_lock<std::mutex>& lock);
  uint32_t kept() const { return usable > depth ? usable - depth : 0; }  // mu held
  // Sizes the ring for `options` (capacity, starting depth, budget) and reserves it.
  Status SizeRing(const LoaderOptions& options);
  // The lease of a delivered slot: a token whose deleter returns the slot to the ring.
  std::shared_ptr<void> Lease(int slot);

  // ---- The workers (worker_pool.cpp, process_workers.cpp) ----
  // One sample of a claimed run is done: its label, index (and zeros, for a skipped error) go
  // into the slot, its outcome into `tally`. No lock: the slot is this run's until FinishRun.
  void SampleDone(const Task& sample, const Status& status, const StageTimes& times,
                  RunTally* tally);
  // The run is done (`tally.failures` of its samples failed; skipped, or the first is the
  // batch's error).
  void FinishRun(size_t worker, const Task& run, const RunTally& tally);
  void ThreadWorker(size_t worker);
  Status ThreadWorkerLoop(size_t worker, SampleDecoder* decoder);
  Status StartThreads();
  // Thread mode (stopping set): waits up to kShutdownGrace for every worker thread to end and
  // joins them; a thread still decoding then is detached, and it keeps this Impl alive (and with
  // it the archive and the ring it writes into) until its sample is done.
  void StopThreads();
  void IssuePrefetch(Task* task, StageTimes* times);  // madvise the next batch (no lock held)
  void SetFatal(const Status& status);
  // A consumer waited `timeout` with no sample completed: the error naming the slowest worker.
  // Process mode also kills that worker (it is stuck, or stopped).
  Status OnTimeout(double waited);  // mu held
  Status StartProcesses();
  void StopWorkers();
  void DispatchTo(size_t child);

  // ---- Remote archives (shard_keeper.h, loader.cpp) ----
  // Create: the cache a remote archive needs (refused below it, giving the minimum); with
  // shuffle="block" in thread mode, a private lazily opened copy of the archive whose shards the
  // keeper releases, shuffle_window "auto" fitted to the cache, and the fetcher threads.
  // `own_copy` gets that copy (the keeper's archive), else stays null.
  // *downloads: the shards to fetch ahead that fit the cache (kShardDownloadsAhead at most).
  // `cancel` (may be null): ends the copy's open.
  Status PlanCache(LoaderOptions* options, std::shared_ptr<format::Archive>* own_copy,
                   uint32_t* downloads, const CancelToken* cancel);
  void FetchAhead();  // a fetcher thread: opens the next shards of the plan (keeper->downloads())
  void KeeperFinished(const Task& run);  // mu held: FinishRun's part
  void KeeperUnholdSlot(int slot);       // mu held: a batch's gather is done (or never comes)
  // A worker about to read sample `index`: waits for its shard's download here, timed as fetch
  // wait (no lock held).
  void AwaitShard(uint64_t index);

  // ---- The consumer's side (loader.cpp) ----
  // mu held by `lock` (released while it sleeps or calls `hook`): waits until batch `b` is
  // ready in `*slot`. An error when the wait ends otherwise: the loader failed or stops, the
  // hook said so, `timeout` passed with no sample completed, or the consumer holds every slot
  // (`*starved`).
  Status WaitForBatch(std::unique_lock<std::mutex>& lock, uint64_t b, const WaitHook& hook,
                      Clock::time_point enter, int* slot, bool* starved);
  Batch Deliver(int slot, uint64_t b);  // mu held: the Batch of a leased slot, without lease
  // With mu held, after each delivered batch; `lead`: ready batches to spare at that moment.
  void Tune(Clock::time_point now, uint32_t lead);
  void AccrueRingFull(Clock::time_point now);

  uint8_t* SlotBase(int s) const { return ring_base + size_t(s) * layout.slot_bytes; }
  uint8_t* SlotImages(int s) const { return SlotBase(s); }
  int64_t* SlotLabels(int s) const {
    return reinterpret_cast<int64_t*>(SlotBase(s) + layout.labels_offset);
  }
  uint64_t* SlotIndices(int s) const {
    return reinterpret_cast<uint64_t*>(SlotBase(s) + layout.indices_offset);
  }

  std::weak_ptr<Impl> self;
  pid_t owner_pid = 0;  // the process that created the loader; a forked copy never touches it
  std::shared_ptr<const format::Archive> archive;
  LoaderOptions options;
  TransformOptions normalize_target;  // what the consumer asked for (normalize_on_device)
  std::unique_ptr<Sampler> sampler;
  uint32_t out_h = 0, out_w = 0;
  SlotLayout layout;
  FieldPlan fields;                     // LoaderOptions::fields (batch_fields.h)
  std::vector<SlotFields> slot_fields;  // per slot: the consumer's part (Next's thread only)

  RingMemory ring;  // private (threads) or a shared memfd mapping (processes)
  uint8_t* ring_base = nullptr;
  bool auto_prefetch = false;
  std::vector<std::unique_ptr<DeviceSlot>> device_slots;  // per committed slot, with `device`
  std::unique_ptr<DeviceNormalize> normalize;             // normalize_on_device's kernel setup
  std::vector<std::thread> threads;  // workers (thread mode) or dispatchers (process mode)

  // Process mode.
  struct Child {
    pid_t pid = -1;
    int fd = -1;  // socketpair end: tasks out, results in
  };
  std::vector<Child> children;

  // Everything below is guarded by mu.
  mutable std::mutex mu;
  std::condition_variable cv_work, cv_ready, cv_exit;
  int threads_running = 0;  // thread mode: worker threads not yet at their end (cv_exit)
  bool stopping = false, started = false;
  // The batch at next_deliver failed for a reason that may pass (Next): the next Next() reads
  // the epoch again from it.
  bool reread = false;
  Status fatal;  // the loader cannot go on (a worker died): every later call reports it
  std::vector<Slot> slots;
  std::vector<int> free_slots;
  uint32_t depth = 0;   // slots the ring may use now: prefetch, or the tuned depth
  size_t ring_cap = 0;  // the most it may grow to (lowered if committing a slot failed)
  uint32_t usable = 0;  // committed slots, retiring ones aside
  size_t slot_end = 0;  // slots [slot_end, slots.size()) have never been committed
  // Kept batches (LoaderOptions::kept_mb): slots past the ring's capacity, up to kept_cap of
  // them committed beyond `depth`; kept_request asks MaintainRing for that many more now.
  uint32_t kept_cap = 0, kept_request = 0;
  bool kept_warned = false;
  std::vector<int> retiring;
  EpochWork current;  // the epoch being delivered, as generation `generation`
  struct Ahead : EpochWork {
    bool on = false;
  } ahead;                  // the epoch run ahead, as generation `generation + 1`
  uint64_t epoch_step = 1;  // the epoch expected next is epoch + epoch_step (1, or 0: repeated)
  std::vector<WorkerProgress> progress;
  // The epoch position each worker is decoding now (written by the worker, per sample).
  std::unique_ptr<std::atomic<uint64_t>[]> holding;
  uint64_t claims = 0, completions = 0;
  uint64_t epoch = 0, generation = 0, next_deliver = 0, batches = 0;
  // BeginEpoch calls so far (written under mu): a worker that sees it change mid-run checks
  // whether its run was abandoned (RunLive) without taking the lock per sample.
  std::atomic<uint64_t> epoch_switches{0};
  EpochStats stats;
  // Workers idle on a full ring now, and when stats.ring_full_seconds last took in their time:
  // it is accrued whenever the count changes and when the tuner reads it, so idle time lands
  // in the tuning window it happened in (a long idle spell that ends in a new, data-bound
  // phase is not that phase's evidence).
  int ring_full_waiters = 0;
  Clock::time_point ring_full_mark;
  // workers="auto" (LoaderOptions): workers >= active_workers sleep in Claim(); the tuner
  // moves the bound (and the ring's depth with prefetch="auto").
  bool auto_workers = false;
  int active_workers = 0;
  Tuner tuner;
  Clock::time_point epoch_start, last_return;

  // Remote archives with shuffle="block" (threads): null otherwise. Spans and plan ids under mu.
  std::unique_ptr<ShardKeeper> keeper;
  ShardSpan current_span, ahead_span;
  uint64_t plan_id = 0, current_plan_id = 0, ahead_plan_id = 0;
  storage::FetchStats fetch_base;          // the process's counters at the epoch's start
  std::atomic<uint64_t> fetch_wait_ns{0};  // workers' time waiting for downloads, this epoch
};

}  // namespace shardfeed::reader
