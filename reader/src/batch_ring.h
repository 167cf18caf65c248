// The batch ring (internal to the loader): slots of page-locked memory, each holding one batch.
//
// A batch's life, from beginning to end:
//   1. kFree -> kFilling: the first sample of a batch is claimed (epoch_plan.cpp, ClaimFrom)
//      and takes a free slot. The slot records the batch number and the epoch's generation.
//   2. Workers decode samples straight into the slot (worker_pool.cpp); the last sample of the
//      batch to complete makes it kReady (FinishRun), after the device copy if any.
//   3. kReady -> kLeased: Next() (loader.cpp) delivers it; the Batch handed out holds a lease,
//      a shared token whose deleter calls ReleaseSlot.
//   4. kLeased -> kFree: the last copy of the Batch is dropped (any thread). A batch of an
//      abandoned epoch skips 3 and 4: it goes back to the ring once no sample of it is in a
//      worker's hands (StartEpoch, FinishRun).
// With prefetch="auto" the ring's depth moves: slots beyond it are kAbsent (no memory
// committed), and a slot freed while the ring is above its depth is kRetiring until the
// consumer's thread gives its memory back (MaintainRing). Committing, pinning and unpinning
// happen only in MaintainRing, on the consumer's thread (or Create's), outside the lock.
//
// Slot layout: images (batch x sample_bytes), labels (int64), indices (uint64), then with fields
// (batch_fields.h) each stacked field region (batch x its bytes) and the samples' geometry, each
// 64-byte aligned; a slot is a whole number of pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "shardfeed/base/status.h"

namespace shardfeed::reader {

enum class SlotState { kAbsent, kFree, kFilling, kReady, kLeased, kRetiring };

struct Slot {
  SlotState state = SlotState::kAbsent;
  uint64_t batch = 0;
  uint64_t generation = 0;
  uint32_t count = 0, remaining = 0, skipped = 0;
  // Tasks handed to workers and not yet completed. A slot whose epoch was abandoned goes back
  // to the ring when this reaches zero: no worker can still be writing into it.
  uint32_t in_flight = 0;
  Status error;
  // Remote shuffle="block" with variable fields: the shards the consumer's gather of this
  // batch reads, held by the shard keeper until the gather is done or the slot is freed.
  std::vector<uint32_t> held_shards;
};

struct SlotLayout {
  size_t sample_bytes = 0, slot_bytes = 0, labels_offset = 0, indices_offset = 0;
  std::vector<size_t> region_offsets;  // stacked field regions (batch_fields.h)
  size_t geometry_offset = 0;          // SampleGeometry per sample (0: none)
};

// The layout of a slot for `batch` images of out_h x out_w x 3 elements of `element` bytes,
// plus stacked regions of `regions[k]` bytes per sample and, with `geometry`, a SampleGeometry
// per sample; an error when that is beyond the ring's limits (kMaxOutputPixels, kMaxRingBytes).
Result<SlotLayout> LayOutSlot(uint32_t out_h, uint32_t out_w, size_t element, uint32_t batch,
                              const std::vector<size_t>& regions = {}, bool geometry = false);

}  // namespace shardfeed::reader
