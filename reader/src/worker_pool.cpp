// The workers (worker_pool.h): thread workers, what happens when a run of samples completes,
// the timeout's diagnosis, and stopping. Worker processes are in process_workers.cpp.
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <iomanip>
#include <sstream>
#include <system_error>

#include "failpoint.h"
#include "loader_internal.h"

namespace shardfeed::reader {

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

void Loader::Impl::SampleDone(const Task& t, const Status& status, const StageTimes& times,
                              RunTally* tally) {
  tally->total.read += times.read;
  tally->total.decode += times.decode;
  tally->total.resize += times.resize;
  if (!status.ok() && tally->failures++ == 0) tally->first_error = status;
  if (status.code() == StatusCode::kChanged && tally->unskippable.ok()) {
    tally->unskippable = status;
  }
  int64_t* labels = SlotLabels(t.slot);
  uint64_t* indices = SlotIndices(t.slot);
  indices[t.position] = t.index;
  if (!status.ok() && options.skip_errors) {
    std::memset(SlotImages(t.slot) + size_t{t.position} * layout.sample_bytes, 0,
                layout.sample_bytes);
    labels[t.position] = -1;
    if (!fields.empty()) FieldWriter::Clear(fields, layout, SlotBase(t.slot), t.position);
  } else {
    labels[t.position] = times.label >= 0 ? times.label : archive->Label(t.index);
  }
}

bool Loader::Impl::RunLive(const Task& run) const {
  std::lock_guard<std::mutex> lock(mu);
  return Live(slots[run.slot].generation);
}

void Loader::Impl::FinishRun(size_t worker, const Task& run, const RunTally& tally) {
  const StageTimes& times = tally.total;
  const uint32_t failures = tally.failures;
  Slot& slot = slots[run.slot];
  // mu held. The run's samples are out of the workers' hands; an abandoned epoch's batch (never
  // delivered) goes back to the ring once none of its runs is.
  auto end_abandoned = [&] {
    slot.in_flight -= run.count;
    if (slot.in_flight == 0 && slot.state == SlotState::kFilling) {
      FreeSlot(run.slot);
      cv_work.notify_all();
      cv_ready.notify_all();
    }
  };
  bool last;
  uint64_t batch;  // the slot's, read under `mu`
  {
    std::lock_guard<std::mutex> lock(mu);
    batch = slot.batch;
    if (keeper) KeeperFinished(run);
    progress[worker].busy = false;
    completions += run.count;
    stats.decode += times.decode;
    stats.collate += times.resize;
    stats.read += times.read;
    if (!Live(slot.generation)) return end_abandoned();
    if (failures) {
      const bool skip = options.skip_errors && tally.unskippable.ok();
      if (skip) {
        slot.skipped += failures;
      } else if (slot.error.ok()) {
        // The changed shard first: it is the reason, and skip_errors would not get past it.
        slot.error = tally.unskippable.ok() ? tally.first_error : tally.unskippable;
      }
    }
    slot.remaining -= run.count;
    last = slot.remaining == 0;
    // The last run's samples stay counted in flight until the slot is marked ready below: a
    // StartEpoch in between frees only slots with nothing in flight, so it cannot hand this
    // one to another batch that the mark below would then declare ready half-filled.
    if (!last) slot.in_flight -= run.count;
  }
  if (!last) return;
  if (batch == Failpoints::Get().finish_gate) Failpoints::Get().WaitAtFinishGate();
  Status copy_status;
  if (options.device && slot.error.ok()) {
    auto t = Clock::now();
    copy_status =
        device_slots[run.slot]->CopyAsync(SlotImages(run.slot), layout.slot_bytes, slot.count);
    std::lock_guard<std::mutex> lock(mu);
    stats.copy += Seconds(Clock::now() - t);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!Live(slot.generation)) return end_abandoned();  // abandoned meanwhile
    slot.in_flight -= run.count;
    if (!copy_status.ok() && slot.error.ok()) slot.error = copy_status;
    slot.state = SlotState::kReady;
  }
  cv_ready.notify_all();
}

void Loader::Impl::IssuePrefetch(Task* task, StageTimes* times) {
  if (task->prefetch_begin >= task->prefetch_end) return;
  if (keeper) {  // the next batch may read shards not claimed yet, which the keeper may release
    task->prefetch_begin = task->prefetch_end = 0;
    return;
  }
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
  if (archive->remote() && children.empty()) {
    msg << "; no byte arrived from " << archive->remote()->location() << " in that time either";
  }
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
  std::unique_ptr<FieldWriter> writer;
  if (!fields.empty()) {
    writer =
        std::make_unique<FieldWriter>(*archive, fields, layout, options.transform.verify_checksums);
  }
  Task run;
  while (Claim(worker, &run)) {
    uint64_t switches = epoch_switches.load(std::memory_order_acquire);
    RunTally tally;
    IssuePrefetch(&run, &tally.total);
    Task t = run;
    for (uint32_t i = 0; i < run.count; ++i) {
      // A StartEpoch since the claim may have abandoned this run's batch (never delivered): its
      // other samples are not decoded (nor their shards downloaded), so the slot comes back
      // soon and, with the shard keeper, Claim's wait for abandoned runs stays short.
      const uint64_t now = epoch_switches.load(std::memory_order_acquire);
      if (now != switches) {
        switches = now;
        if (!RunLive(run)) break;
      }
      t.k = run.k + i;
      t.position = run.position + i;
      holding[worker].store(t.k, std::memory_order_relaxed);
      Status s;
      StageTimes times;
      try {
        Resolve(&t);
        if (keeper) AwaitShard(t.index);
        uint8_t* dst = SlotImages(t.slot) + size_t{t.position} * layout.sample_bytes;
        SampleGeometry geometry;
        s = decoder->DecodeInto(t.index, t.seed, dst, &times, writer ? &geometry : nullptr);
        if (s.ok() && writer) s = writer->Write(t.index, geometry, SlotBase(t.slot), t.position);
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
  {
    std::lock_guard<std::mutex> lock(mu);
    --threads_running;
  }
  cv_exit.notify_all();
}

Status Loader::Impl::StartThreads() {
  progress.resize(static_cast<size_t>(options.workers));
  holding.reset(new std::atomic<uint64_t>[progress.size()]());
  threads_running = options.workers;
  for (int w = 0; w < options.workers; ++w) {
    // Each thread keeps the loader's state alive (the archive's mapping, the ring, the lock):
    // one that is still decoding when the loader is destroyed is left to finish (StopThreads).
    try {
      if (static_cast<uint64_t>(w) == Failpoints::Get().thread_start_fail) {
        throw std::system_error(EAGAIN, std::generic_category(), "failpoint thread_start_fail");
      }
      threads.emplace_back([keep = self.lock(), w] { keep->ThreadWorker(static_cast<size_t>(w)); });
    } catch (const std::exception& e) {  // std::system_error (no thread left), bad_alloc
      // The threads started keep this Impl alive: stop them, or they would wait for work
      // forever. Nothing was claimed yet, so they end at once.
      {
        std::lock_guard<std::mutex> lock(mu);
        threads_running -= options.workers - w;
      }
      Shutdown();
      return Status::ResourceExhausted("cannot start loader worker thread ", w, " of ",
                                       options.workers, ": ", e.what(),
                                       " (fewer workers, or mode=\"processes\")");
    }
  }
  return Status::OK();
}

void Loader::Impl::StopThreads() {
  bool ended;
  {
    std::unique_lock<std::mutex> lock(mu);
    ended = cv_exit.wait_for(lock, std::chrono::duration<double>(kShutdownGrace),
                             [&] { return threads_running == 0; });
  }
  for (auto& t : threads) {
    if (!t.joinable()) continue;
    if (ended) {
      t.join();
    } else {
      t.detach();  // stuck in a decode (a slow read, a huge image): it ends on its own
    }
  }
  threads.clear();
}

}  // namespace shardfeed::reader
