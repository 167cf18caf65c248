// The epoch plan and who decodes what next (internal to the loader).
//
// Work is handed out in epoch order, a short run of samples per claim (Claim, ClaimFrom in
// epoch_plan.cpp), so all workers help with the oldest unfinished batch; a batch takes a free
// slot when its first sample is handed out, and the ring's size is the only bound on how far
// workers run ahead (back-pressure). Each StartEpoch begins a new generation: a slot records the
// generation it was filled for, and a batch of a generation that is no longer live (the epoch in
// progress, or the one run ahead) is never delivered.
//
// Run-ahead: once every sample of the epoch in progress is handed out, workers go on with the
// epoch StartEpoch is expected to ask for next, as generation + 1, in free slots. StartEpoch of
// that epoch from its start adopts those batches; any other skips past that generation.
#pragma once

#include <cstdint>
#include <vector>

#include "shardfeed/reader/sampler.h"

namespace shardfeed::reader {

// A worker's current run of samples. The worker keeps one Task for its life: `plan` is its copy
// of the epoch's plan, refreshed under the loader's lock only when the epoch changes, so the
// sampler lookup and the seed (Resolve) run outside the lock.
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

// An epoch's work as handed out: its plan (positions [0, plan.samples) on this rank), the next
// position to hand out, and the slot of each batch begun (batch % capacity -> slot).
struct EpochWork {
  EpochPlan plan;
  uint64_t next_task = 0;
  std::vector<int> filling;
};

}  // namespace shardfeed::reader
