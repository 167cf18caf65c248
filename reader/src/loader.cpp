// The batch ring. Work is handed out one sample at a time, in epoch order, so all workers help
// with the oldest unfinished batch; a batch claims a free slot when its first sample is handed
// out, and the ring's size is the only bound on how far workers run ahead (back-pressure).
#include "shardfeed/reader/loader.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <thread>

#include "loader_internal.h"
#include "pixel_store.h"
#include "shardfeed/base/cpus.h"
#include "shardfeed/reader/options.h"

namespace shardfeed::reader {

using Clock = std::chrono::steady_clock;

static double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

size_t Batch::image_bytes() const {
  size_t n = DTypeSize(dtype_);
  for (int64_t d : shape_) n *= static_cast<size_t>(d);
  return n;
}

const void* Batch::device_images() const { return device_ ? device_->device_images() : nullptr; }

const int64_t* Batch::device_labels() const {
  return device_ ? reinterpret_cast<const int64_t*>(
                       static_cast<const uint8_t*>(device_->device_data()) + device_label_offset_)
                 : nullptr;
}

Status Batch::Wait(void* stream) const {
  if (!device_) return Status::InvalidArgument("batch is not on a device");
  return device_->StreamWait(stream);
}

Status Batch::Synchronize() const {
  if (!device_) return Status::OK();
  return device_->Synchronize();
}

// ---- Impl --------------------------------------------------------------------------------

bool Loader::Impl::InOwnerProcess() const { return ::getpid() == owner_pid; }

void Loader::Impl::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (stopping) return;
    stopping = true;
  }
  cv_work.notify_all();
  cv_ready.notify_all();
  StopWorkers();
}

void Loader::Impl::SetFatal(const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (fatal.ok()) fatal = status;
  }
  cv_ready.notify_all();
  cv_work.notify_all();
}

bool Loader::Impl::Claim(size_t worker, Task* task) {
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    if (stopping || !fatal.ok()) return false;
    if (worker >= static_cast<size_t>(active_workers)) {  // asleep (workers="auto")
      cv_work.wait(lock);
      continue;
    }
    bool work_left = true;
    if (current.next_task < current.plan.samples) {
      if (ClaimFrom(current, generation, worker, task)) return true;
    } else if (RunAhead() && ahead.next_task < ahead.plan.samples) {
      if (ClaimFrom(ahead, generation + 1, worker, task)) return true;
    } else {
      work_left = false;
    }
    if (!work_left) {
      cv_work.wait(lock);
      continue;
    }
    // Work is left but every slot is taken: back-pressure, time the ring's depth costs.
    AccrueRingFull(Clock::now());
    ++ring_full_waiters;
    cv_work.wait(lock);
    AccrueRingFull(Clock::now());
    --ring_full_waiters;
  }
}

void Loader::Impl::AccrueRingFull(Clock::time_point now) {
  stats.ring_full_seconds += ring_full_waiters * Seconds(now - ring_full_mark);
  ring_full_mark = now;
}

bool Loader::Impl::ClaimFrom(EpochWork& from, uint64_t gen, size_t worker, Task* task) {
  const uint64_t b = from.next_task / options.batch_size;
  int s = SlotOf(from.filling, gen, b);
  if (s < 0) {
    if (free_slots.empty()) return false;
    s = free_slots.back();
    free_slots.pop_back();
    Slot& slot = slots[s];
    slot.batch = b;
    slot.generation = gen;
    slot.state = SlotState::kFilling;
    const uint64_t first = b * options.batch_size;
    slot.count =
        static_cast<uint32_t>(std::min<uint64_t>(options.batch_size, from.plan.samples - first));
    slot.remaining = slot.count;
    slot.in_flight = 0;
    slot.skipped = 0;
    slot.error = Status::OK();
    from.filling[b % from.filling.size()] = s;
    if (gen != generation) ++stats.run_ahead_batches;
    // A batch just started: have the kernel read the next one's records meanwhile.
    task->prefetch_begin = std::min<uint64_t>(from.plan.samples, first + options.batch_size);
    task->prefetch_end =
        std::min<uint64_t>(from.plan.samples, task->prefetch_begin + options.batch_size);
  }
  if (task->plan_generation != gen) {  // once per epoch per worker
    task->plan = from.plan;
    task->plan_generation = gen;
  }
  const uint64_t batch_end = std::min<uint64_t>(from.plan.samples, (b + 1) * options.batch_size);
  const uint32_t n =
      static_cast<uint32_t>(std::min<uint64_t>(RunLength(), batch_end - from.next_task));
  task->slot = s;
  task->position = static_cast<uint32_t>(from.next_task % options.batch_size);
  task->count = n;
  task->k = from.next_task;
  slots[s].in_flight += n;
  progress[worker] = WorkerProgress{true, claims++, gen};
  holding[worker].store(from.next_task, std::memory_order_relaxed);
  from.next_task += n;
  return true;
}

bool Loader::Impl::RunAhead() {
  if (!options.run_ahead || !started) return false;
  if (!ahead.on) {
    ahead.plan = sampler->Plan(epoch + epoch_step);
    ahead.next_task = 0;
    std::fill(ahead.filling.begin(), ahead.filling.end(), -1);
    ahead.on = true;
  }
  return true;
}

bool Loader::Impl::Live(uint64_t gen) const {
  return gen == generation || (ahead.on && gen == generation + 1);
}

void Loader::Impl::Tune(Clock::time_point now, uint32_t lead) {
  if (!auto_workers && !auto_prefetch) return;
  AccrueRingFull(now);  // idle time up to now belongs to this window, not the one it ends in
  const double busy = stats.read + stats.decode + stats.collate;
  TuneWindow& w = tune;
  auto restart = [&] {
    w = TuneWindow{1,    stats.wait_seconds,      stats.consumer_seconds,
                   busy, stats.ring_full_seconds, now};
  };
  if (w.batches++ == 0) return restart();
  w.lead_min = std::min(w.lead_min, lead);
  if (w.batches <= kTuneWindow) return;
  const double wait = stats.wait_seconds - w.wait, consumer = stats.consumer_seconds - w.consumer;
  const double used = busy - w.busy, wall = Seconds(now - w.start);
  const double full = stats.ring_full_seconds - w.ring_full;
  const double fraction = wait + consumer > 0 ? wait / (wait + consumer) : 0;
  const bool can_wake = auto_workers && active_workers < options.workers;
  const bool can_grow = auto_prefetch && depth < ring_cap;
  // Workers idle on a full ring for a tenth of their time: a deeper ring lets them run ahead.
  const bool ring_bound = full > 0.1 * wall * active_workers;
  std::ostringstream why;
  why << std::fixed << std::setprecision(1) << "consumer waited " << 100 * fraction << "% over "
      << kTuneWindow << " batches (target " << 100 * options.wait_target << "%), workers busy "
      << (wall > 0 ? used / wall : 0) << " of " << active_workers << ", idle on a full ring "
      << (wall > 0 ? full / wall : 0) << ", " << depth << " slots";
  std::string did =
      "kept " + std::to_string(active_workers) + " workers, " + std::to_string(depth) + " slots";
  if (fraction > options.wait_target) {
    calm_windows = 0;
    // Starved for most of the window, the decode rate is short, not the depth: a deeper ring
    // absorbs uneven steps but cannot make up a deficit, so a worker that can wake comes first
    // (the next window grows the ring if waiting and idling on a full ring persist).
    const bool rate_short = can_wake && fraction > 0.5;
    if (can_grow && !rate_short && (ring_bound || (!can_wake && full > 0))) {
      ++depth;
      did = "the ring grew to " + std::to_string(depth) + " slots";
      if (shrunk) shrink_after = std::min<uint32_t>(2 * shrink_after, 64);
      shrunk = false;
    } else if (can_wake) {
      // Starved for most of the window: double (a many-core machine ramps in a few windows);
      // otherwise one more.
      const int wake = fraction > 0.5 ? active_workers : 1;
      active_workers = std::min(options.workers, active_workers + wake);
      did = wake == 1 ? "woke a worker" : "woke " + std::to_string(wake) + " workers";
      cv_work.notify_all();
    }
  } else if (fraction <= options.wait_target / 2) {
    ++calm_windows;
    if (auto_workers && active_workers > 1 && used < (active_workers - 1) * wall * 0.7) {
      --active_workers;  // the others carry the load with room to spare
      did = "one worker sleeps";
    } else if (auto_prefetch && depth > 2 && w.lead_min >= 1 && calm_windows >= shrink_after) {
      --depth;  // a ready batch was always to spare: one slot fewer still keeps up
      calm_windows = 0;
      shrunk = true;
      did = "the ring gave a slot back (" + std::to_string(depth) + " slots)";
    }
  } else {
    calm_windows = 0;
  }
  stats.tuning = why.str() + ": " + did;
  stats.workers = active_workers;
  stats.prefetch = static_cast<int>(depth);
  restart();
}

uint32_t Loader::Impl::RunLength() const {
  // Up to 8 samples per lock round trip, fewer for small batches so that every worker still
  // has a share of each batch (its tail stays parallel).
  const uint64_t share = options.batch_size / (4 * std::max<uint64_t>(1, progress.size()));
  return static_cast<uint32_t>(std::clamp<uint64_t>(share, 1, 8));
}

void Loader::Impl::Resolve(Task* task) const {
  task->index = sampler->At(task->plan, task->k);
  task->seed = MixSeed(options.seed, task->plan.epoch, task->index);
}

int Loader::Impl::SlotOf(const std::vector<int>& map, uint64_t gen, uint64_t b) const {
  const int s = map[b % map.size()];
  if (s >= 0 && slots[s].batch == b && slots[s].generation == gen &&
      (slots[s].state == SlotState::kFilling || slots[s].state == SlotState::kReady ||
       slots[s].state == SlotState::kLeased)) {
    return s;
  }
  return -1;
}

int Loader::Impl::batch_slot(uint64_t b) const { return SlotOf(current.filling, generation, b); }

void Loader::Impl::FreeSlot(int s) {
  slots[s].in_flight = 0;
  if (usable > depth) {  // the ring is shrinking: this slot's memory goes back
    slots[s].state = SlotState::kRetiring;
    --usable;
    retiring.push_back(s);
    return;
  }
  slots[s].state = SlotState::kFree;
  free_slots.push_back(s);
}

bool Loader::Impl::RingStarved() const {
  return free_slots.empty() && std::none_of(slots.begin(), slots.end(), [](const Slot& x) {
           return x.state == SlotState::kFilling || x.state == SlotState::kReady;
         });
}

Status Loader::Impl::MaintainRing() {
  std::vector<int> release, commit;
  {
    std::lock_guard<std::mutex> lock(mu);
    while (usable < depth && !retiring.empty()) {  // grown again before it was given back
      const int s = retiring.back();
      retiring.pop_back();
      slots[s].state = SlotState::kFree;
      free_slots.push_back(s);
      ++usable;
    }
    release.swap(retiring);
    for (size_t s = 0; s < slots.size() && usable + commit.size() < depth; ++s) {
      if (slots[s].state == SlotState::kAbsent) commit.push_back(static_cast<int>(s));
    }
  }
  if (release.empty() && commit.empty()) return Status::OK();
  for (int s : release) {
    if (options.device) device_slots[s].reset();
    ring.Decommit(s);
  }
  Status status;
  std::vector<int> ready;
  for (int s : commit) {
    status = ring.Commit(s);
    if (status.ok() && options.device) {
      auto ds = DeviceSlot::Create(slot_bytes, options.device_index, normalize.get());
      if (ds.ok()) {
        device_slots[s] = std::move(*ds);
      } else {
        status = ds.status();
        ring.Decommit(s);
      }
    }
    if (!status.ok()) break;
    ready.push_back(s);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    for (int s : release) slots[s].state = SlotState::kAbsent;
    for (int s : ready) {
      slots[s].state = SlotState::kFree;
      free_slots.push_back(s);
      ++usable;
    }
    if (!status.ok()) {
      depth = ring_cap = usable;  // stop growing here
      stats.tuning = "the ring stays at " + std::to_string(depth) + " slots: " + status.ToString();
    }
    stats.prefetch = static_cast<int>(depth);
    stats.ring_bytes = ring.committed_bytes();
  }
  if (!ready.empty()) cv_work.notify_all();
  return status;
}

void Loader::Impl::SampleDone(const Task& t, const Status& status, const StageTimes& times,
                              RunTally* tally) {
  tally->total.read += times.read;
  tally->total.decode += times.decode;
  tally->total.resize += times.resize;
  if (!status.ok() && tally->failures++ == 0) tally->first_error = status;
  int64_t* labels = SlotLabels(t.slot);
  uint64_t* indices = SlotIndices(t.slot);
  indices[t.position] = t.index;
  if (!status.ok() && options.skip_errors) {
    std::memset(SlotImages(t.slot) + size_t{t.position} * sample_bytes, 0, sample_bytes);
    labels[t.position] = -1;
  } else {
    labels[t.position] = times.label >= 0 ? times.label : archive->Label(t.index);
  }
}

void Loader::Impl::FinishRun(size_t worker, const Task& run, const RunTally& tally) {
  const StageTimes& times = tally.total;
  const uint32_t failures = tally.failures;
  Slot& slot = slots[run.slot];
  bool last;
  {
    std::lock_guard<std::mutex> lock(mu);
    progress[worker].busy = false;
    completions += run.count;
    stats.decode += times.decode;
    stats.collate += times.resize;
    stats.read += times.read;
    slot.in_flight -= run.count;
    if (!Live(slot.generation)) {  // an abandoned epoch's batch: never delivered
      if (slot.in_flight == 0 && slot.state == SlotState::kFilling) {
        FreeSlot(run.slot);
        cv_work.notify_all();
        cv_ready.notify_all();
      }
      return;
    }
    if (failures) {
      if (options.skip_errors) {
        slot.skipped += failures;
      } else if (slot.error.ok()) {
        slot.error = tally.first_error;
      }
    }
    slot.remaining -= run.count;
    last = slot.remaining == 0;
  }
  if (!last) return;
  Status copy_status;
  if (options.device && slot.error.ok()) {
    auto t = Clock::now();
    copy_status = device_slots[run.slot]->CopyAsync(SlotImages(run.slot), slot_bytes, slot.count);
    std::lock_guard<std::mutex> lock(mu);
    stats.copy += Seconds(Clock::now() - t);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!copy_status.ok() && slot.error.ok()) slot.error = copy_status;
    slot.state = SlotState::kReady;
  }
  cv_ready.notify_all();
}

void Loader::Impl::ReleaseSlot(int s) {
  if (!InOwnerProcess()) return;  // a forked copy's lease: the parent's ring is not ours
  if (options.device) device_slots[s]->Release();
  {
    std::lock_guard<std::mutex> lock(mu);
    FreeSlot(s);
  }
  // Workers only: the consumer learns of the freed slot when a batch completes into it.
  cv_work.notify_all();
}

void Loader::Impl::IssuePrefetch(Task* task, StageTimes* times) {
  if (task->prefetch_begin >= task->prefetch_end) return;
  auto t = Clock::now();
  for (uint64_t k = task->prefetch_begin; k < task->prefetch_end; ++k) {
    archive->WillNeed(sampler->At(task->plan, k));
  }
  task->prefetch_begin = task->prefetch_end = 0;
  times->read += Seconds(Clock::now() - t);
}

Status Loader::Impl::OnTimeout(double waited) {
  int slowest = -1;  // the busy worker with the oldest claim
  for (size_t w = 0; w < progress.size(); ++w) {
    if (progress[w].busy && (slowest < 0 || progress[w].claim < progress[slowest].claim)) {
      slowest = static_cast<int>(w);
    }
  }
  std::ostringstream msg;
  msg << archive->path() << ": no sample completed for " << std::fixed << std::setprecision(1)
      << waited << " s (timeout " << options.timeout << " s) while waiting for batch "
      << next_deliver << " of epoch " << epoch;
  if (slowest < 0) {
    msg << "; no worker is decoding";
  } else {
    msg << "; worker " << slowest;
    if (!children.empty()) msg << " (process " << children[slowest].pid << ")";
    const uint64_t k = holding[slowest].load(std::memory_order_relaxed);
    const uint64_t gen = progress[slowest].generation;
    if (Live(gen)) {
      msg << " has held sample " << sampler->At(gen == generation ? current.plan : ahead.plan, k);
    } else {
      msg << " has held position " << k << " of an abandoned epoch";
    }
    msg << " all that time";
  }
  Status status = Status::Timeout(msg.str());
  if (!children.empty() && slowest >= 0) {
    // A stuck or stopped process: kill it, and the loader cannot go on without it.
    ::kill(children[slowest].pid, SIGKILL);
    status = Status::Timeout(msg.str(), "; it was killed and this loader cannot continue");
    if (fatal.ok()) fatal = status;
  }
  return status;
}

Status SampleException(const std::string& archive, uint64_t index) {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted(archive, ": sample ", index, ": out of memory while decoding");
  } catch (const std::exception& e) {
    return Status::Internal(archive, ": sample ", index, ": ", e.what());
  } catch (...) {
    return Status::Internal(archive, ": sample ", index, ": unknown exception");
  }
}

Status Loader::Impl::ThreadWorkerLoop(size_t worker, SampleDecoder* decoder) {
  Task run;
  while (Claim(worker, &run)) {
    RunTally tally;
    IssuePrefetch(&run, &tally.total);
    Task t = run;
    for (uint32_t i = 0; i < run.count; ++i) {
      t.k = run.k + i;
      t.position = run.position + i;
      holding[worker].store(t.k, std::memory_order_relaxed);
      Status s;
      StageTimes times;
      try {
        Resolve(&t);
        uint8_t* dst = SlotImages(t.slot) + size_t{t.position} * sample_bytes;
        s = decoder->DecodeInto(t.index, t.seed, dst, &times);
      } catch (...) {
        s = SampleException(archive->path(), t.index);
      }
      SampleDone(t, s, times, &tally);
    }
    FinishRun(worker, run, tally);
  }
  return Status::OK();
}

// Thread entry point: nothing escapes it. A failure outside a sample's decode (the worker's own
// setup, an allocation in Claim) fails the loader with that error.
void Loader::Impl::ThreadWorker(size_t worker) {
  Status s;
  try {
    SampleDecoder decoder(archive, options.transform);
    s = ThreadWorkerLoop(worker, &decoder);
  } catch (const std::exception& e) {
    s = Status::Internal("loader worker ", worker, ": ", e.what());
  } catch (...) {
    s = Status::Internal("loader worker ", worker, ": unknown exception");
  }
  if (!s.ok()) SetFatal(s);
}

// ---- Loader ------------------------------------------------------------------------------

Loader::Loader(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Loader::~Loader() {
  if (!impl_) return;
  if (!impl_->InOwnerProcess()) {
    // A forked copy: the workers, the lock and the ring belong to the parent. Touch nothing.
    new std::shared_ptr<Impl>(std::move(impl_));  // deliberately leaked
    return;
  }
  impl_->Shutdown();
}

Result<std::unique_ptr<Loader>> Loader::Create(std::shared_ptr<const format::Archive> archive,
                                               const LoaderOptions& options) {
  if (!archive) return Status::InvalidArgument("no archive");
  SF_RETURN_IF_ERROR(ValidateLoaderOptions(options));
  if (options.device && !CudaAvailable()) {
    return Status::Unsupported("device copies requested but CUDA is unavailable: ",
                               CudaUnavailableReason());
  }
  auto impl = std::make_shared<Impl>();
  impl->self = impl;
  impl->owner_pid = ::getpid();
  impl->archive = std::move(archive);
  impl->options = options;
  impl->normalize_target = options.transform;
  if (options.normalize_on_device) {
    // The workers write uint8 NHWC; the kernel produces what was asked for on the device.
    TransformOptions& t = impl->options.transform;
    t.dtype = DType::kUint8;
    t.layout = Layout::kNHWC;
    t.mean = {0.f, 0.f, 0.f};
    t.std = {1.f, 1.f, 1.f};
  }
  if (options.workers == LoaderOptions::kAutoWorkers) {
    impl->auto_workers = true;
    impl->options.workers =
        options.max_workers > 0 ? static_cast<int>(options.max_workers) : AvailableCpus();
  } else if (impl->options.workers <= 0) {
    impl->options.workers = AvailableCpus();
  }
  impl->active_workers = impl->auto_workers ? 1 : impl->options.workers;
  SF_RETURN_IF_ERROR(
      SampleDecoder::OutputShape(*impl->archive, options.transform, &impl->out_h, &impl->out_w));
  SamplerOptions so;
  so.shuffle = options.shuffle;
  so.seed = options.seed;
  so.drop_last = options.drop_last;
  so.rank = options.rank;
  so.world_size = options.world_size;
  so.batch_size = options.batch_size;
  so.shuffle_block = options.shuffle_block;
  so.shuffle_window = options.shuffle_window;
  if (options.shuffle_by_shard) {
    for (const auto& shard : impl->archive->manifest().shards)
      so.shard_starts.push_back(shard.first_sample);
  }
  impl->sampler = std::make_unique<Sampler>(impl->archive->size(), so);

  // Slot layout: images, then labels (int64), then indices (uint64), each 64-byte aligned; a
  // slot is a whole number of pages (committed and pinned one by one).
  const size_t b = options.batch_size;
  const size_t element = DTypeSize(impl->options.transform.dtype);
  size_t image_bytes = 0;
  if (uint64_t{impl->out_h} * impl->out_w > kMaxOutputPixels ||
      __builtin_mul_overflow(size_t{impl->out_h} * impl->out_w * 3 * element, b, &image_bytes) ||
      image_bytes > kMaxRingBytes) {
    return Status::InvalidArgument("output ", impl->out_h, "x", impl->out_w, " x batch ", b,
                                   " is beyond the ring's limit of ", kMaxRingBytes >> 30,
                                   " GiB (or ", kMaxOutputPixels, " pixels per image)");
  }
  impl->sample_bytes = size_t{impl->out_h} * impl->out_w * 3 * element;
  auto align = [](size_t n, size_t to) { return (n + to - 1) / to * to; };
  impl->labels_offset = align(impl->sample_bytes * b, 64);
  impl->indices_offset = impl->labels_offset + align(b * sizeof(int64_t), 64);
  impl->slot_bytes = align(impl->indices_offset + b * sizeof(uint64_t), RingMemory::PageSize());
  size_t capacity = options.prefetch;
  impl->auto_prefetch = options.prefetch == LoaderOptions::kAutoPrefetch;
  if (impl->auto_prefetch) {
    const uint64_t budget = options.ring_mb > 0
                                ? uint64_t{options.ring_mb} << 20
                                : std::min<uint64_t>(AvailableMemoryBytes() / 8, uint64_t{4} << 30);
    const uint64_t fits = budget / impl->slot_bytes;
    if (options.ring_mb > 0 && fits < 2) {
      return Status::InvalidArgument("prefetch=auto needs 2 slots of ", impl->slot_bytes >> 20,
                                     " MiB (batch ", b, " of ", impl->out_h, "x", impl->out_w,
                                     "), more than ring_mb=", options.ring_mb);
    }
    capacity = std::max<uint64_t>(
        2, std::min<uint64_t>(options.max_prefetch > 0 ? options.max_prefetch : 16, fits));
    impl->depth = 2;
  } else {
    impl->depth = options.prefetch;
  }
  if (capacity > kMaxRingBytes / impl->slot_bytes) {
    return Status::InvalidArgument("output ", impl->out_h, "x", impl->out_w, " x batch ", b,
                                   " x prefetch ", capacity, " is beyond the ring's limit of ",
                                   kMaxRingBytes >> 30, " GiB");
  }
  impl->slots.resize(capacity);
  impl->ring_cap = capacity;
  impl->current.filling.assign(capacity, -1);
  impl->ahead.filling.assign(capacity, -1);
  if (options.device) {
    impl->device_slots.resize(capacity);
    // Slots may be added later, from the consumer's thread: fix the device now.
    if (impl->options.device_index < 0) impl->options.device_index = CurrentCudaDevice();
  }
  if (options.normalize_on_device) {
    auto& n = impl->normalize;
    n = std::make_unique<DeviceNormalize>();
    n->dtype = options.transform.dtype;
    n->layout = options.transform.layout;
    n->plane = size_t{impl->out_h} * impl->out_w;
    n->max_samples = options.batch_size;
    const internal::Affine a = internal::AffineFor(options.transform);
    for (int c = 0; c < 3; ++c) n->scale[c] = a.scale[c], n->bias[c] = a.bias[c];
  }

  if (options.mode == WorkerMode::kProcesses) {
    SF_RETURN_IF_ERROR(impl->StartProcesses());
  } else {
    SF_ASSIGN_OR_RETURN(impl->ring, RingMemory::Reserve(impl->slot_bytes, capacity));
  }
  impl->ring_base = impl->ring.data();
  SF_RETURN_IF_ERROR(impl->MaintainRing());
  if (options.mode == WorkerMode::kThreads) {
    impl->progress.resize(static_cast<size_t>(impl->options.workers));
    impl->holding.reset(new std::atomic<uint64_t>[impl->progress.size()]());
    for (int w = 0; w < impl->options.workers; ++w) {
      impl->threads.emplace_back([p = impl.get(), w] { p->ThreadWorker(static_cast<size_t>(w)); });
    }
  }
  return std::unique_ptr<Loader>(new Loader(std::move(impl)));
  // (Create's error paths drop `impl`, whose destructor stops anything started.)
}

namespace {

Status ForkedCopy(pid_t owner) {
  return Status::InvalidArgument("this loader's workers live in process ", owner,
                                 "; this is a forked copy: create a loader in this process");
}

}  // namespace

Status Loader::StartEpoch(uint64_t epoch, uint64_t start_batch, uint64_t start_position) {
  Impl& p = *impl_;
  if (!p.InOwnerProcess()) return ForkedCopy(p.owner_pid);
  if (start_position > p.sampler->size()) {
    return Status::InvalidArgument("resume position ", start_position, " is past the epoch's ",
                                   p.sampler->size(), " samples");
  }
  EpochPlan plan = p.sampler->Plan(epoch, start_position);
  if (start_batch > plan.batches) {
    return Status::InvalidArgument("resume batch ", start_batch, " is past the epoch's ",
                                   plan.batches, " batches");
  }
  {
    std::lock_guard<std::mutex> lock(p.mu);
    if (!p.fatal.ok()) return p.fatal;
    // The epoch run ahead is this one, from its start: its batches are kept.
    const bool adopt = p.ahead.on && start_batch == 0 && plan.start == 0 &&
                       p.ahead.plan.epoch == epoch && p.ahead.plan.start == 0;
    // A fresh generation, past the one run ahead unless it is adopted.
    p.generation += adopt || !p.ahead.on ? 1 : 2;
    // Undelivered batches of other generations are cancelled. Ready ones, and filling ones with
    // no sample in a worker's hands, go back to the ring now; filling ones with samples in
    // flight go back when the last of those completes (FinishRun sees the generation change);
    // leased ones when their consumer releases them.
    for (size_t s = 0; s < p.slots.size(); ++s) {
      const Impl::Slot& slot = p.slots[s];
      if (slot.generation != p.generation &&
          (slot.state == SlotState::kReady ||
           (slot.state == SlotState::kFilling && slot.in_flight == 0))) {
        p.FreeSlot(static_cast<int>(s));
      }
    }
    if (adopt) {
      p.current.filling.swap(p.ahead.filling);
      p.current.next_task = p.ahead.next_task;
    } else {
      p.current.next_task = std::min<uint64_t>(plan.samples, start_batch * p.options.batch_size);
    }
    std::fill(p.ahead.filling.begin(), p.ahead.filling.end(), -1);
    p.ahead.on = false;
    if (p.started) {  // what comes next is guessed from this step: repeated, or the next one
      p.epoch_step = epoch == p.epoch ? 0 : 1;
    }
    p.current.plan = std::move(plan);
    p.epoch = epoch;
    p.next_deliver = start_batch;
    p.batches = p.current.plan.batches;
    p.stats = EpochStats();
    p.ring_full_mark = Clock::now();  // idle time before this belonged to the old epoch
    p.stats.epoch = epoch;
    p.stats.workers = p.active_workers;
    p.stats.prefetch = static_cast<int>(p.depth);
    p.stats.ring_bytes = p.ring.committed_bytes();
    p.tune.batches = 0;  // stats restart: so does the tuning window
    if (adopt) {
      for (const Impl::Slot& slot : p.slots) {
        p.stats.ahead_kept +=
            slot.generation == p.generation &&
            (slot.state == SlotState::kFilling || slot.state == SlotState::kReady);
      }
    }
    p.epoch_start = Clock::now();
    p.last_return = Clock::time_point();
    p.started = true;
  }
  p.cv_work.notify_all();
  return Status::OK();
}

Result<Batch> Loader::Next(const WaitHook& hook) {
  Impl& p = *impl_;
  if (!p.InOwnerProcess()) return ForkedCopy(p.owner_pid);
  auto enter = Clock::now();
  std::unique_lock<std::mutex> lock(p.mu);
  if (!p.started) {
    lock.unlock();
    SF_RETURN_IF_ERROR(StartEpoch(0));
    lock.lock();
  }
  if (p.last_return != Clock::time_point()) {
    p.stats.consumer_seconds += Seconds(enter - p.last_return);
  }
  if (!p.fatal.ok()) return p.fatal;
  if (p.next_deliver >= p.batches) {
    p.last_return = Clock::time_point();
    return Batch();
  }
  const uint64_t b = p.next_deliver;
  int s = -1;
  bool starved = false;
  auto ready = [&] {
    starved = false;
    if (p.stopping || !p.fatal.ok()) return true;
    s = p.batch_slot(b);
    if (s >= 0 && p.slots[s].state == SlotState::kReady) return true;
    starved = s < 0 && p.RingStarved();
    return starved;
  };
  // Bounded wait: wake every poll interval for the hook, and give up after `timeout` seconds in
  // which no sample completed.
  const double poll = hook ? kWaitPollSeconds : 1.0;
  uint64_t seen = p.completions;
  auto progressed = enter;  // when a sample last completed, as far as this wait knows
  for (;;) {
    if (ready()) {
      if (!starved || !p.auto_prefetch || p.depth >= p.ring_cap || !p.fatal.ok()) break;
      // The consumer holds every slot: a deeper ring is the only way on (within the budget).
      ++p.depth;
      p.stats.tuning = "the consumer holds all " + std::to_string(p.usable) +
                       " slots: the ring grew to " + std::to_string(p.depth);
      lock.unlock();
      (void)p.MaintainRing();  // a slot that cannot be had lowers ring_cap: the error below
      lock.lock();
      continue;
    }
    const auto now = Clock::now();
    if (p.completions != seen) {
      seen = p.completions;
      progressed = now;
    }
    if (p.options.timeout > 0) {
      const double idle = Seconds(now - progressed);
      if (idle >= p.options.timeout) return p.OnTimeout(idle);
    }
    p.cv_ready.wait_for(lock, std::chrono::duration<double>(poll));
    if (hook) {
      lock.unlock();
      Status h = hook();
      lock.lock();
      if (!h.ok()) return h;
    }
  }
  if (!p.fatal.ok()) return p.fatal;
  if (starved) {
    return Status::ResourceExhausted(
        "all ", p.usable, " prefetch slots are held by the consumer: release batches (or raise ",
        p.auto_prefetch ? "max_prefetch or ring_mb" : "prefetch", ") before asking for more");
  }
  if (p.stopping) return Status::Cancelled("loader is shutting down");
  Impl::Slot& slot = p.slots[s];
  slot.state = SlotState::kLeased;
  ++p.next_deliver;
  auto now = Clock::now();
  p.stats.wait_seconds += Seconds(now - enter);
  p.stats.seconds = Seconds(now - p.epoch_start);
  p.last_return = now;
  if (!slot.error.ok()) {
    Status err = slot.error;
    lock.unlock();
    p.ReleaseSlot(s);
    return err;
  }
  ++p.stats.batches;
  p.stats.images += slot.count;
  p.stats.skipped += slot.skipped;
  uint32_t lead = 0;  // ready batches to spare (only the ring's tuner reads it)
  if (p.auto_prefetch) {
    for (const Impl::Slot& x : p.slots) lead += x.state == SlotState::kReady;
  }
  const uint32_t depth_before = p.depth;
  p.Tune(now, lead);
  const bool maintain = p.depth != depth_before || !p.retiring.empty();

  Batch batch;
  batch.images_ = p.SlotImages(s);
  batch.labels_ = p.SlotLabels(s);
  batch.indices_ = p.SlotIndices(s);
  batch.size_ = slot.count;
  batch.skipped_ = slot.skipped;
  batch.epoch_ = p.epoch;
  batch.number_ = b;
  batch.dtype_ = p.options.transform.dtype;
  const int64_t n = slot.count, h = p.out_h, w = p.out_w;
  batch.shape_ = p.options.transform.layout == Layout::kNCHW ? std::vector<int64_t>{n, 3, h, w}
                                                             : std::vector<int64_t>{n, h, w, 3};
  batch.device_dtype_ = batch.dtype_;
  batch.device_shape_ = batch.shape_;
  if (p.options.device) {
    batch.device_ = p.device_slots[s].get();
    if (p.options.normalize_on_device) {
      const TransformOptions& want = p.normalize_target;
      batch.device_dtype_ = want.dtype;
      batch.device_shape_ = want.layout == Layout::kNCHW ? std::vector<int64_t>{n, 3, h, w}
                                                         : std::vector<int64_t>{n, h, w, 3};
    }
    batch.device_label_offset_ = p.labels_offset;
  }
  lock.unlock();
  if (maintain) (void)p.MaintainRing();  // a failure is in stats().tuning
  // The lease: a token whose deleter returns the slot. Impl outlives leases only if the
  // consumer drops them first; Loader's destructor waits for none (see Impl::Shutdown).
  std::shared_ptr<Impl> keep = p.self.lock();
  batch.lease_ = std::shared_ptr<void>(
      reinterpret_cast<void*>(static_cast<intptr_t>(s + 1)), [keep](void* token) {
        int slot_index = static_cast<int>(reinterpret_cast<intptr_t>(token)) - 1;
        if (keep) keep->ReleaseSlot(slot_index);
      });
  return batch;
}

LoaderState Loader::State() const {
  const Impl& p = *impl_;
  std::lock_guard<std::mutex> lock(p.mu);
  LoaderState s;
  s.epoch = p.epoch;
  s.position = p.next_deliver;
  s.seed = p.options.seed;
  s.plan_start = p.current.plan.start;
  s.consumed = p.sampler->Consumed(p.current.plan, p.next_deliver);
  s.world_size = p.options.world_size;
  return s;
}

Status Loader::Resume(const LoaderState& state) {
  if (state.seed != impl_->options.seed) {
    return Status::InvalidArgument("state was saved with seed ", state.seed,
                                   ", this loader has seed ", impl_->options.seed);
  }
  if (state.world_size == impl_->options.world_size) {
    return StartEpoch(state.epoch, state.position, state.plan_start);  // exact, padding included
  }
  return StartEpoch(state.epoch, 0, state.consumed);  // elastic: the rest of the global order
}

EpochStats Loader::Stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

uint64_t Loader::batches_per_epoch() const { return impl_->sampler->batches_per_epoch(); }
uint64_t Loader::samples_per_epoch() const {
  const auto& o = impl_->options;
  return o.drop_last ? batches_per_epoch() * o.batch_size : impl_->sampler->samples_per_rank();
}
const LoaderOptions& Loader::options() const { return impl_->options; }
uint32_t Loader::out_height() const { return impl_->out_h; }
uint32_t Loader::out_width() const { return impl_->out_w; }
PinKind Loader::pin_kind() const { return impl_->ring.kind(); }
bool Loader::on_device() const { return impl_->options.device; }
std::vector<int> Loader::worker_pids() const {
  std::vector<int> pids;
  for (const auto& c : impl_->children) pids.push_back(c.pid);
  return pids;
}

}  // namespace shardfeed::reader
