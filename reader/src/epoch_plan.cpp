// Which sample is decoded next (epoch_plan.h): claims in epoch order, run-ahead into the next
// epoch, generations; and the consumer's calls that move the plan: StartEpoch, State, Resume.
#include <algorithm>

#include "loader_internal.h"

namespace shardfeed::reader {

bool Loader::Impl::Claim(size_t worker, Task* task) {
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    if (stopping || !fatal.ok()) return false;
    if (worker >= static_cast<size_t>(active_workers)) {  // asleep (workers="auto")
      cv_work.wait(lock);
      continue;
    }
    if (keeper && AbandonedRunsInFlight()) {  // woken when the last of them frees its slot
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
    // The consumer gathers variable fields from the archive after the runs finish: the batch's
    // shards stay held until then (KeeperUnholdSlot), not just while a run decodes them.
    if (keeper && fields.ragged) keeper->Hold(from.plan, first, slot.count, &slot.held_shards);
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
  if (keeper) keeper->Claimed(from.plan, from.next_task, n);
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
    if (keeper) ahead_span = keeper->Span(ahead.plan), ahead_plan_id = ++plan_id;
  }
  return true;
}

bool Loader::Impl::AbandonedRunsInFlight() const {
  return std::any_of(slots.begin(), slots.end(), [&](const Slot& slot) {
    return slot.state == SlotState::kFilling && slot.in_flight > 0 && !Live(slot.generation);
  });
}

bool Loader::Impl::Live(uint64_t gen) const {
  return gen == generation || (ahead.on && gen == generation + 1);
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

void Loader::Impl::BeginEpoch(EpochPlan plan, uint64_t start_batch, bool again) {
  const uint64_t epoch_no = plan.epoch;
  reread = false;  // whatever asked for this plan, it replaces the one a failed batch left
  epoch_switches.fetch_add(1, std::memory_order_release);
  // The epoch run ahead is this one, from its start: its batches are kept.
  const bool adopt = ahead.on && start_batch == 0 && plan.start == 0 &&
                     ahead.plan.epoch == epoch_no && ahead.plan.start == 0;
  // A fresh generation, past the one run ahead unless it is adopted.
  generation += adopt || !ahead.on ? 1 : 2;
  // Undelivered batches of other generations are cancelled. Ready ones, and filling ones with
  // no sample in a worker's hands, go back to the ring now; filling ones with samples in
  // flight go back when the last of those completes (FinishRun sees the generation change);
  // leased ones when their consumer releases them.
  for (size_t s = 0; s < slots.size(); ++s) {
    const Slot& slot = slots[s];
    if (slot.generation != generation &&
        (slot.state == SlotState::kReady ||
         (slot.state == SlotState::kFilling && slot.in_flight == 0))) {
      FreeSlot(static_cast<int>(s));
    }
  }
  if (adopt) {
    current.filling.swap(ahead.filling);
    current.next_task = ahead.next_task;
  } else {
    current.next_task = std::min<uint64_t>(plan.samples, start_batch * options.batch_size);
  }
  std::fill(ahead.filling.begin(), ahead.filling.end(), -1);
  ahead.on = false;
  if (started && !again) {  // what comes next is guessed from this step: repeated, or the next
    epoch_step = epoch_no == epoch ? 0 : 1;
  }
  current.plan = std::move(plan);
  if (keeper) {  // what the new plan reads where; what the old one left open is given back
    current_span = adopt ? std::move(ahead_span) : keeper->Span(current.plan);
    ahead_span = ShardSpan();
    current_plan_id = ++plan_id;
    keeper->Sweep(current_span, current.next_task, nullptr, 0);
  }
  epoch = epoch_no;
  next_deliver = start_batch;
  batches = current.plan.batches;
  if (again) return;  // the epoch goes on: its figures too
  stats = EpochStats();
  fetch_base = storage::GetFetchStats();
  fetch_wait_ns.store(0, std::memory_order_relaxed);
  ring_full_mark = Clock::now();  // idle time before this belonged to the old epoch
  stats.epoch = epoch;
  stats.workers = active_workers;
  stats.prefetch = static_cast<int>(depth);
  stats.ring_bytes = ring.committed_bytes();
  tuner.Restart();  // stats restart: so does the tuning window
  if (adopt) {
    for (const Slot& slot : slots) {
      stats.ahead_kept += slot.generation == generation &&
                          (slot.state == SlotState::kFilling || slot.state == SlotState::kReady);
    }
  }
  epoch_start = Clock::now();
  last_return = Clock::time_point();
  started = true;
}

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
    p.BeginEpoch(std::move(plan), start_batch);
  }
  p.cv_work.notify_all();
  return Status::OK();
}

LoaderState Loader::State(uint64_t undelivered) const {
  const Impl& p = *impl_;
  std::lock_guard<std::mutex> lock(p.mu);
  LoaderState s;
  s.epoch = p.epoch;
  s.position = p.next_deliver - std::min(undelivered, p.next_deliver);
  s.seed = p.options.seed;
  s.plan_start = p.current.plan.start;
  s.consumed = p.sampler->Consumed(p.current.plan, s.position);
  s.world_size = p.options.world_size;
  s.batch_size = p.options.batch_size;
  return s;
}

Status Loader::Resume(const LoaderState& state) {
  if (state.seed != impl_->options.seed) {
    return Status::InvalidArgument("state was saved with seed ", state.seed,
                                   ", this loader has seed ", impl_->options.seed);
  }
  const bool same_batches = state.batch_size == 0 || state.batch_size == impl_->options.batch_size;
  if (state.world_size == impl_->options.world_size && same_batches) {
    return StartEpoch(state.epoch, state.position, state.plan_start);  // exact, padding included
  }
  // Elastic (another world size or batch size): the rest of the global order, by samples
  // consumed. A position counts batches of the saving run's size: never this loader's.
  return StartEpoch(state.epoch, 0, state.consumed);
}

}  // namespace shardfeed::reader
