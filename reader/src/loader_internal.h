// Loader internals shared by the thread and process worker implementations.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "shardfeed/reader/loader.h"

namespace shardfeed::reader {

// kAbsent: no memory committed (prefetch="auto" above its depth); kRetiring: freed while the
// ring is above its depth, its memory to be given back by the consumer thread (MaintainRing).
enum class SlotState { kAbsent, kFree, kFilling, kReady, kLeased, kRetiring };

// A worker's current sample. The worker keeps one Task for its life: `plan` is its copy of the
// epoch's plan, refreshed under the loader's lock only when the epoch changes, so the sampler
// lookup and the seed (Resolve) run outside the lock.
struct Task {
  int slot = -1;
  uint32_t position = 0;  // within the batch (of the run's first sample)
  uint32_t count = 1;     // a run of consecutive samples of one batch, claimed at once
  uint64_t k = 0;         // position in the epoch (this rank's plan)
  uint64_t index = 0;     // archive sample index (Resolve)
  uint64_t seed = 0;      // augmentation seed (Resolve)
  // Positions [prefetch_begin, prefetch_end) of `plan` are the next batch, to madvise before
  // decoding.
  uint64_t prefetch_begin = 0, prefetch_end = 0;
  EpochPlan plan;
  uint64_t plan_generation = ~uint64_t{0};
};

struct Loader::Impl {
  struct Slot {
    SlotState state = SlotState::kAbsent;
    uint64_t batch = 0;
    uint64_t generation = 0;
    uint32_t count = 0, remaining = 0, skipped = 0;
    // Tasks handed to workers and not yet completed. A slot whose epoch was abandoned goes back
    // to the ring when this reaches zero: no worker can still be writing into it.
    uint32_t in_flight = 0;
    Status error;
  };

  // What each worker is doing, for the timeout's message (no clock read per sample: the waiting
  // consumer keeps time; the oldest claim identifies the slowest worker).
  struct WorkerProgress {
    bool busy = false;
    uint64_t claim = 0;       // claims handed out before this one
    uint64_t generation = 0;  // of the claim's epoch: `plan`'s, or the epoch run ahead
  };

  ~Impl();
  void Shutdown();
  bool Claim(size_t worker, Task* task);
  // mu held: hands `worker` the next run of `from` (generation `gen`), taking a free slot for a
  // new batch; false when that needs a slot and none is free.
  struct EpochWork;
  bool ClaimFrom(EpochWork& from, uint64_t gen, size_t worker, Task* task);
  bool RunAhead();                 // mu held: start (or go on with) the epoch expected next
  bool Live(uint64_t gen) const;   // mu held: `gen` is the epoch in progress or run ahead
  void Resolve(Task* task) const;  // index and seed of a claimed task (no lock needed)
  // What a run's samples came to: stage times, failures, the first error.
  struct RunTally {
    StageTimes total;
    uint32_t failures = 0;
    Status first_error;
  };
  // One sample of a claimed run is done: its label, index (and zeros, for a skipped error) go
  // into the slot, its outcome into `tally`. No lock: the slot is this run's until FinishRun.
  void SampleDone(const Task& sample, const Status& status, const StageTimes& times,
                  RunTally* tally);
  // The run is done (`tally.failures` of its samples failed; skipped, or the first is the
  // batch's error).
  void FinishRun(size_t worker, const Task& run, const RunTally& tally);
  uint32_t RunLength() const;  // samples a claim hands out at most
  void ReleaseSlot(int slot);
  void FreeSlot(int slot);  // mu held: back to the ring, or retiring
  // Commits slots up to `depth` and gives back retiring ones: pinning and unpinning happen
  // here, on the consumer's thread (or Create's), outside the lock. A slot that cannot be
  // committed stops the ring's growth (the tuning says why); at Create it is an error.
  Status MaintainRing();
  bool RingStarved() const;              // mu held: every usable slot is leased by the consumer
  int batch_slot(uint64_t batch) const;  // slot filling or holding `batch`, or -1 (mu held)
  // The slot of `batch` of generation `gen` in `map` (batch % capacity -> slot), or -1.
  int SlotOf(const std::vector<int>& map, uint64_t gen, uint64_t batch) const;
  void ThreadWorker(size_t worker);
  Status ThreadWorkerLoop(size_t worker, SampleDecoder* decoder);
  void IssuePrefetch(Task* task, StageTimes* times);  // madvise the next batch (no lock held)
  void SetFatal(const Status& status);
  // A consumer waited `timeout` with no sample completed: the error naming the slowest worker.
  // Process mode also kills that worker (it is stuck, or stopped).
  Status OnTimeout(double waited);  // mu held
  bool InOwnerProcess() const;

  // Process mode (process_workers.cpp).
  Status StartProcesses();
  void StopWorkers();
  void DispatchTo(size_t child);

  uint8_t* SlotBase(int s) const { return ring_base + size_t(s) * slot_bytes; }
  uint8_t* SlotImages(int s) const { return SlotBase(s); }
  int64_t* SlotLabels(int s) const {
    return reinterpret_cast<int64_t*>(SlotBase(s) + labels_offset);
  }
  uint64_t* SlotIndices(int s) const {
    return reinterpret_cast<uint64_t*>(SlotBase(s) + indices_offset);
  }

  std::weak_ptr<Impl> self;
  pid_t owner_pid = 0;  // the process that created the loader; a forked copy never touches it
  std::shared_ptr<const format::Archive> archive;
  LoaderOptions options;
  TransformOptions normalize_target;  // what the consumer asked for (normalize_on_device)
  std::unique_ptr<Sampler> sampler;
  uint32_t out_h = 0, out_w = 0;
  size_t sample_bytes = 0, slot_bytes = 0, labels_offset = 0, indices_offset = 0;

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
  std::condition_variable cv_work, cv_ready;
  bool stopping = false, started = false;
  Status fatal;  // the loader cannot go on (a worker died): every later call reports it
  std::vector<Slot> slots;
  std::vector<int> free_slots;
  uint32_t depth = 0;   // slots the ring may use now: prefetch, or the tuned depth
  size_t ring_cap = 0;  // the most it may grow to (lowered if committing a slot failed)
  uint32_t usable = 0;  // committed slots, retiring ones aside
  std::vector<int> retiring;
  // An epoch's work as handed out: its plan (positions [0, plan.samples) on this rank), the
  // next position to hand out, and the slot of each batch begun (batch % capacity -> slot).
  struct EpochWork {
    EpochPlan plan;
    uint64_t next_task = 0;
    std::vector<int> filling;
  };
  EpochWork current;  // the epoch being delivered, as generation `generation`
  // run_ahead: once every sample of `current` is handed out, workers go on with `ahead`, the
  // epoch StartEpoch is expected to ask for next, as generation `generation + 1`, in free
  // slots. StartEpoch of that epoch from its start adopts it; any other skips past it.
  struct Ahead : EpochWork {
    bool on = false;
  } ahead;
  uint64_t epoch_step = 1;  // the epoch expected next is epoch + epoch_step (1, or 0: repeated)
  std::vector<WorkerProgress> progress;
  // The epoch position each worker is decoding now (written by the worker, per sample).
  std::unique_ptr<std::atomic<uint64_t>[]> holding;
  uint64_t claims = 0, completions = 0;
  uint64_t epoch = 0, generation = 0, next_deliver = 0, batches = 0;
  EpochStats stats;
  // Workers idle on a full ring now, and when stats.ring_full_seconds last took in their time:
  // it is accrued whenever the count changes and when the tuner reads it, so idle time lands
  // in the tuning window it happened in (a long idle spell that ends in a new, data-bound
  // phase is not that phase's evidence).
  int ring_full_waiters = 0;
  std::chrono::steady_clock::time_point ring_full_mark;
  void AccrueRingFull(std::chrono::steady_clock::time_point now);
  // workers="auto" (LoaderOptions): workers >= active_workers sleep in Claim(); Tune() moves
  // the bound after every kTuneWindow delivered batches from the window's wait fraction and
  // worker busy time.
  bool auto_workers = false;
  int active_workers = 0;
  static constexpr uint64_t kTuneWindow = 4;
  struct TuneWindow {
    uint64_t batches = 0;
    double wait = 0, consumer = 0, busy = 0, ring_full = 0;
    std::chrono::steady_clock::time_point start;
    uint32_t lead_min = ~0u;  // fewest ready batches to spare at a delivery in the window
  } tune;
  // prefetch="auto": calm windows in a row, and how many it takes to give a slot back.
  uint32_t calm_windows = 0, shrink_after = 4;
  bool shrunk = false;  // the ring has given a slot back since it last grew
  // With mu held, after each delivered batch; `lead`: ready batches to spare at that moment.
  void Tune(std::chrono::steady_clock::time_point now, uint32_t lead);
  std::chrono::steady_clock::time_point epoch_start, last_return;
};

}  // namespace shardfeed::reader

namespace shardfeed::reader {
// The body of the `shardfeed-worker` program (reader/src/worker_main.cpp): serves one loader's
// decode tasks over descriptor 3 into the ring mapped from descriptor 4. Returns the exit code.
int RunWorkerProcess();

// Inside a catch block: the exception a decoder or resizer threw, as that sample's error.
Status SampleException(const std::string& archive, uint64_t index);
}  // namespace shardfeed::reader
