// The workers (internal to the loader): thread workers (worker_pool.cpp) or worker processes
// (process_workers.cpp), each a loop of Claim -> decode a run of samples into the slot ->
// SampleDone per sample -> FinishRun. No exception crosses a worker's boundary: whatever a
// decoder throws becomes its sample's error (SampleException); a failure outside a sample
// fails the loader (SetFatal). Workers hold no lock while decoding; a run's slot is theirs
// alone until FinishRun.
#pragma once

#include <cstdint>
#include <string>

#include "shardfeed/base/status.h"
#include "shardfeed/reader/transform.h"

namespace shardfeed::reader {

// What each worker is doing, for the timeout's message (no clock read per sample: the waiting
// consumer keeps time; the oldest claim identifies the slowest worker).
struct WorkerProgress {
  bool busy = false;
  uint64_t claim = 0;       // claims handed out before this one
  uint64_t generation = 0;  // of the claim's epoch: the one in progress, or the one run ahead
};

// What a run's samples came to: stage times, failures, the first error, and the first error
// skip_errors does not skip (kChanged: the archive changed under the reader).
struct RunTally {
  StageTimes total;
  uint32_t failures = 0;
  Status first_error;
  Status unskippable;
};

// The body of the `shardfeed-worker` program (reader/src/worker_main.cpp): serves one loader's
// decode tasks over descriptor 3 into the ring mapped from descriptor 4. Returns the exit code.
int RunWorkerProcess();

// Inside a catch block: the exception a decoder or resizer threw, as that sample's error.
Status SampleException(const std::string& archive, uint64_t index);

}  // namespace shardfeed::reader
