// The batch ring (batch_ring.h): slot layout and sizing, the slots' bookkeeping, committing
// and giving back their memory, and the lease that ends a delivered batch's life.
#include "batch_ring.h"

#include <algorithm>
#include <cstdio>

#include "loader_internal.h"
#include "shardfeed/base/cpus.h"
#include "shardfeed/reader/geometry.h"

namespace shardfeed::reader {

Result<SlotLayout> LayOutSlot(uint32_t out_h, uint32_t out_w, size_t element, uint32_t batch,
                              const std::vector<size_t>& regions, bool geometry) {
  const size_t b = batch;
  size_t image_bytes = 0;
  if (uint64_t{out_h} * out_w > kMaxOutputPixels ||
      __builtin_mul_overflow(size_t{out_h} * out_w * 3 * element, b, &image_bytes) ||
      image_bytes > kMaxRingBytes) {
    return Status::InvalidArgument("output ", out_h, "x", out_w, " x batch ", b,
                                   " is beyond the ring's limit of ", kMaxRingBytes >> 30,
                                   " GiB (or ", kMaxOutputPixels, " pixels per image)");
  }
  auto align = [](size_t n, size_t to) { return (n + to - 1) / to * to; };
  SlotLayout l;
  l.sample_bytes = size_t{out_h} * out_w * 3 * element;
  l.labels_offset = align(l.sample_bytes * b, 64);
  l.indices_offset = l.labels_offset + align(b * sizeof(int64_t), 64);
  size_t end = l.indices_offset + b * sizeof(uint64_t);
  for (size_t per_sample : regions) {
    end = align(end, 64);
    l.region_offsets.push_back(end);
    size_t bytes = 0;
    if (__builtin_mul_overflow(per_sample, b, &bytes) || bytes > kMaxRingBytes) {
      return Status::InvalidArgument("fields of ", per_sample, " bytes a sample x batch ", b,
                                     " are beyond the ring's limit of ", kMaxRingBytes >> 30,
                                     " GiB");
    }
    end += bytes;
  }
  if (geometry) {
    end = align(end, 64);
    l.geometry_offset = end;
    end += b * sizeof(SampleGeometry);
  }
  if (end > kMaxRingBytes) {
    return Status::InvalidArgument("a batch of ", b, " with its fields is beyond the ring's limit");
  }
  l.slot_bytes = align(end, RingMemory::PageSize());
  return l;
}

Status Loader::Impl::SizeRing(const LoaderOptions& o) {
  const size_t slot_bytes = layout.slot_bytes;
  size_t capacity = o.prefetch;
  auto_prefetch = o.prefetch == LoaderOptions::kAutoPrefetch;
  if (auto_prefetch) {
    const uint64_t budget = o.ring_mb > 0
                                ? uint64_t{o.ring_mb} << 20
                                : std::min<uint64_t>(AvailableMemoryBytes() / 8, uint64_t{4} << 30);
    const uint64_t fits = budget / slot_bytes;
    if (o.ring_mb > 0 && fits < 2) {
      return Status::InvalidArgument("prefetch=auto needs 2 slots of ", slot_bytes >> 20,
                                     " MiB (batch ", o.batch_size, " of ", out_h, "x", out_w,
                                     "), more than ring_mb=", o.ring_mb);
    }
    capacity =
        std::max<uint64_t>(2, std::min<uint64_t>(o.max_prefetch > 0 ? o.max_prefetch : 16, fits));
    depth = 2;
  } else {
    depth = o.prefetch;
  }
  if (capacity > kMaxRingBytes / slot_bytes) {
    return Status::InvalidArgument("output ", out_h, "x", out_w, " x batch ", o.batch_size,
                                   " x prefetch ", capacity, " is beyond the ring's limit of ",
                                   kMaxRingBytes >> 30, " GiB");
  }
  // Room for kept batches past the ring (committed only when the consumer holds every slot).
  const uint64_t kept_budget =
      o.kept_mb > 0 ? uint64_t{o.kept_mb} << 20 : AvailableMemoryBytes() / 4;
  kept_cap = static_cast<uint32_t>(std::min<uint64_t>(
      {kept_budget / slot_bytes, kMaxKeptBatches, kMaxRingBytes / slot_bytes - capacity}));
  slots.resize(capacity + kept_cap);
  if (!fields.empty()) slot_fields.resize(slots.size());
  ring_cap = capacity;
  current.filling.assign(capacity, -1);
  ahead.filling.assign(capacity, -1);
  if (o.device) {
    device_slots.resize(slots.size());
    // Slots may be added later, from the consumer's thread: fix the device now.
    if (options.device_index < 0) options.device_index = CurrentCudaDevice();
  }
  return Status::OK();
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
  KeeperUnholdSlot(s);  // a batch freed before (or without) its gather
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
  return free_slots.empty() &&
         std::none_of(slots.begin(), slots.begin() + slot_end, [](const Slot& x) {
           return x.state == SlotState::kFilling || x.state == SlotState::kReady;
         });
}

Status Loader::Impl::MaintainRing() {
  std::vector<int> release, commit;
  bool for_kept, revived = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    for_kept = kept_request > 0;
    const uint32_t target = std::max(depth, usable + kept_request);
    kept_request = 0;
    while (usable < target && !retiring.empty()) {  // grown again before it was given back
      const int s = retiring.back();
      retiring.pop_back();
      slots[s].state = SlotState::kFree;
      free_slots.push_back(s);
      ++usable;
      revived = true;
    }
    release.swap(retiring);
    for (size_t s = 0; s < slots.size() && usable + commit.size() < target; ++s) {
      if (slots[s].state == SlotState::kAbsent) commit.push_back(static_cast<int>(s));
    }
  }
  // A slot taken back from retiring is free now: a worker waiting for one must hear of it
  // (regression: without this the loop below may have nothing to commit and return, and a
  // worker slept until the consumer's timeout).
  if (revived) cv_work.notify_all();
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
      auto ds = DeviceSlot::Create(layout.slot_bytes, options.device_index, normalize.get());
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
      slot_end = std::max(slot_end, size_t(s) + 1);
      ++usable;
    }
    if (!status.ok() && !for_kept) {
      depth = ring_cap = usable;  // stop growing here
      stats.tuning = "the ring stays at " + std::to_string(depth) + " slots: " + status.ToString();
    }
    stats.prefetch = static_cast<int>(depth);
    stats.ring_bytes = ring.committed_bytes();
    stats.kept_slots = std::max<uint64_t>(stats.kept_slots, kept());
  }
  if (!ready.empty()) cv_work.notify_all();
  return status;
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

Status Loader::Impl::AddKeptSlot(std::unique_lock<std::mutex>& lock) {
  const uint64_t kib = layout.slot_bytes >> 10;
  if (kept() >= kept_cap) {
    return Status::ResourceExhausted(
        "the consumer holds all ", usable, " slots: the ring's ", depth, " and ", kept(),
        " kept beyond it, the most kept_mb=", options.kept_mb, " allows (",
        options.kept_mb ? "" : "the default, a quarter of memory; ", "at most ", kMaxKeptBatches,
        " batches of ", kib,
        " KiB): release batches (copy what you keep), "
        "or raise kept_mb");
  }
  ++kept_request;
  if (!kept_warned) {
    kept_warned = true;
    std::fprintf(stderr,
                 "shardfeed: the consumer keeps every one of the ring's %u batches; the loader "
                 "adds a slot (%llu KiB) for each batch kept beyond them, up to kept_mb. Copy "
                 "what you keep (labels, single images) to let the ring reuse its memory.\n",
                 usable, static_cast<unsigned long long>(layout.slot_bytes >> 10));
  }
  stats.tuning = "the consumer holds all " + std::to_string(usable) +
                 " slots: a slot beyond the ring for a kept batch";
  lock.unlock();
  Status status = MaintainRing();
  lock.lock();
  if (!status.ok()) {
    return Status::ResourceExhausted(
        "the consumer holds all ", usable,
        " slots and no slot could be added for a kept batch: ", status.ToString());
  }
  return Status::OK();
}

std::shared_ptr<void> Loader::Impl::Lease(int s) {
  // Impl outlives leases only if the consumer drops them first; Loader's destructor waits for
  // none (see Impl::Shutdown).
  std::shared_ptr<Impl> keep = self.lock();
  return std::shared_ptr<void>(
      reinterpret_cast<void*>(static_cast<intptr_t>(s + 1)), [keep](void* token) {
        int slot_index = static_cast<int>(reinterpret_cast<intptr_t>(token)) - 1;
        if (keep) keep->ReleaseSlot(slot_index);
      });
}

}  // namespace shardfeed::reader
