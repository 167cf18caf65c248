// The loader: shuffled, fixed-shape uint8 batches from a mapped archive, decoded by a pool of
// workers straight into a bounded ring of page-locked slots, optionally copied to the GPU on a
// stream per slot while the consumer works on the previous batch.
//
// Thread-safety: one consumer thread calls StartEpoch/Next/State; Batch leases may be released
// from any thread. Memory is fixed at Create(): prefetch slots of batch_size samples each.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardfeed/format/archive.h"
#include "shardfeed/format/status.h"
#include "shardfeed/reader/pinned.h"
#include "shardfeed/reader/sampler.h"
#include "shardfeed/reader/transform.h"

namespace shardfeed::reader {

enum class WorkerMode {
  kThreads,    // worker threads in this process (default)
  kProcesses,  // forked worker processes writing into a shared-memory ring (crash isolation)
};

struct LoaderOptions {
  uint32_t batch_size = 64;
  bool shuffle = false;
  uint64_t seed = 0;
  bool drop_last = false;
  uint32_t shuffle_block = 0;  // see SamplerOptions: 0 = true global shuffle
  uint32_t shuffle_window = 8;
  uint32_t rank = 0, world_size = 1;
  int workers = 0;        // 0: all cores
  uint32_t prefetch = 4;  // ring slots (batches decoded ahead); memory = prefetch x batch
  TransformOptions transform;
  bool skip_errors = false;  // a sample that fails to decode becomes zeros with label -1
  WorkerMode mode = WorkerMode::kThreads;
  bool device = false;  // copy each batch to the CUDA device (needs CudaAvailable())
};

// Where an interrupted run stands: enough to resume on exactly the next batch.
struct LoaderState {
  uint64_t epoch = 0;
  uint64_t position = 0;  // batches already delivered in `epoch`
  uint64_t seed = 0;
};

struct EpochStats {
  uint64_t epoch = 0, batches = 0, images = 0, skipped = 0;
  double seconds = 0;           // first StartEpoch to last batch
  double wait_seconds = 0;      // consumer blocked in Next(): data was late
  double consumer_seconds = 0;  // consumer's time between batches (its "training step")
  // Per-stage worker time, summed over workers (seconds of CPU, roughly).
  double read = 0, decode = 0, collate = 0, copy = 0;
  // Fraction of the consumer's time spent waiting for data.
  double wait_fraction() const {
    double t = wait_seconds + consumer_seconds;
    return t > 0 ? wait_seconds / t : 0;
  }
};

class Loader;

// A batch: a lease on one ring slot. The slot goes back to the ring when the last copy of the
// Batch (it is a shared handle) is destroyed; until then its memory is never overwritten.
class Batch {
 public:
  Batch() = default;
  uint32_t size() const { return size_; }  // samples (the last batch may be short)
  uint8_t* images() const { return images_; }
  const int64_t* labels() const { return labels_; }
  const uint64_t* indices() const { return indices_; }  // archive index of each sample
  // {size, H, W, 3} for NHWC or {size, 3, H, W} for NCHW.
  std::vector<int64_t> shape() const { return shape_; }
  size_t image_bytes() const;
  uint64_t epoch() const { return epoch_; }
  uint64_t number() const { return number_; }  // batch number within the epoch
  uint32_t skipped() const { return skipped_; }
  // On the device (only with LoaderOptions::device): images then labels, copied on the slot's
  // stream. Call Wait(stream) before using them from `stream`, or Synchronize().
  const void* device_images() const;
  const int64_t* device_labels() const;
  Status Wait(void* cuda_stream) const;
  Status Synchronize() const;
  // Releases this handle's share of the lease now.
  void Release() { lease_.reset(); }
  explicit operator bool() const { return lease_ != nullptr; }
  // The lease itself, for bindings that tie the slot's life to foreign objects.
  std::shared_ptr<void> lease() const { return lease_; }

 private:
  friend class Loader;
  std::shared_ptr<void> lease_;
  uint8_t* images_ = nullptr;
  int64_t* labels_ = nullptr;
  uint64_t* indices_ = nullptr;
  uint32_t size_ = 0, skipped_ = 0;
  std::vector<int64_t> shape_;
  uint64_t epoch_ = 0, number_ = 0;
  DeviceSlot* device_ = nullptr;
  size_t device_label_offset_ = 0;
};

class Loader {
 public:
  static Result<std::unique_ptr<Loader>> Create(std::shared_ptr<const format::Archive> archive,
                                                const LoaderOptions& options);
  ~Loader();

  // Begins `epoch` at batch `start_batch` (a resume), abandoning any epoch in progress.
  Status StartEpoch(uint64_t epoch, uint64_t start_batch = 0);
  // The next batch, in order. Returns an empty Batch at the end of the epoch. An error from a
  // worker (decode failure naming the sample, dead worker process) is returned here.
  Result<Batch> Next();

  LoaderState State() const;  // to resume: StartEpoch(state.epoch, state.position)
  EpochStats Stats() const;   // of the current (or just finished) epoch
  uint64_t batches_per_epoch() const;
  uint64_t samples_per_epoch() const;  // on this rank
  const LoaderOptions& options() const;
  uint32_t out_height() const;
  uint32_t out_width() const;
  PinKind pin_kind() const;
  bool on_device() const;
  // Process ids of the worker processes (WorkerMode::kProcesses), else empty.
  std::vector<int> worker_pids() const;

  struct Impl;

 private:
  explicit Loader(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;  // shared with outstanding Batch leases (the ring outlives us)
};

}  // namespace shardfeed::reader
