// The loader: shuffled, fixed-shape batches (uint8, or normalised float32/float16/bfloat16) from a
// mapped archive, decoded by a pool of workers straight into a bounded ring of page-locked slots,
// optionally copied to the GPU on a stream per slot while the consumer works on the previous batch.
//
// Ownership. The Loader owns its workers, the ring and (with `device`) the device buffers. A
// Batch is a lease on one ring slot: its pointers stay valid, and the slot is never written,
// until the last copy of that Batch is destroyed or Release()d, even after the Loader itself is
// destroyed (the ring is freed with the last lease).
//
// Thread-safety. One consumer thread calls StartEpoch/Next/State/Stats; Batch leases may be
// released from any thread. Memory: `prefetch` slots of batch_size samples, committed (touched
// and pinned) at Create(); with prefetch="auto" slots are committed as the tuned depth grows
// (from the consumer's thread, inside Next()) and given back when it shrinks, never beyond the
// ring's budget (max_prefetch, ring_mb).
//
// Lifecycle and failure (docs/DESIGN.md, "Lifecycle and failure"):
// - StartEpoch() abandons the epoch in progress. Batches not yet delivered are cancelled: ready
//   ones return to the ring at once; a slot still being filled returns once every sample already
//   handed to a worker has completed (those samples are accounted for, never delivered). Leased
//   batches stay valid until released. Leaving an epoch early (a `break`) and starting another
//   any number of times never leaks a slot. Batches that workers decoded ahead for the epoch
//   StartEpoch() asks for (run_ahead) are kept; those for another epoch are cancelled alike.
// - No exception crosses a worker boundary: whatever a decoder, resizer or allocator throws for
//   a sample becomes that sample's error (named by archive and index), returned by the Next()
//   that would have delivered its batch, or, with skip_errors, a zero image with label -1.
// - Every wait in Next() is bounded by `timeout`: if no sample completes for that long while the
//   consumer waits, Next() returns kTimeout naming the slowest worker and the sample it holds.
//   In process mode that worker is killed and the loader fails (below); in thread mode the
//   loader stays usable (a later Next() waits again).
// - A worker process that dies (a crash, SIGKILL, killed after a timeout) fails the loader:
//   Next() and StartEpoch() return the error naming the worker and the sample, for good. Make a
//   new Loader to go on.
// - Destruction is bounded by kShutdownGrace: worker processes are asked to exit, killed after
//   the grace period and reaped. Worker threads finish the one sample they hold and are joined;
//   a thread still decoding after the grace period (a stuck read, a huge image) is detached and
//   ends on its own once that sample is done, keeping the archive's mapping and the ring alive
//   until then (a thread cannot be killed). Nothing is left behind: no process, no shared
//   memory, no descriptor (a detached thread's, once it ends).
// - Worker processes reopen the archive by its path and check it is the one the loader opened
//   (its manifest, which names every shard's content hash): an archive replaced on disk, or a
//   relative path after a chdir, makes Create() fail naming the path, never read another one.
// - fork(): a child's copy of a Loader is inert. Destroying it neither joins, signals nor waits
//   for the parent's workers, and leaks its memory rather than touching state a parent thread
//   may have held at fork time; calling Next()/StartEpoch() on it returns an error. The child
//   may create Loaders of its own.
// - With `device`, batch slots are ordered both ways on the GPU: a batch's copy is complete
//   before the consumer's stream uses it (Batch::Wait), and the next copy into that slot waits
//   for the work the consumer queued on its stream before it released the lease.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardfeed/base/status.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/reader/pinned.h"
#include "shardfeed/reader/sampler.h"
#include "shardfeed/reader/transform.h"

namespace shardfeed::reader {

enum class WorkerMode {
  kThreads,    // worker threads in this process (default)
  kProcesses,  // worker processes (exec'd `shardfeed-worker`) writing into a shared-memory ring
};

// How long Loader's destructor lets worker processes exit on their own before killing them.
inline constexpr double kShutdownGrace = 2.0;  // seconds
// Create() refuses output images above this many pixels, and rings above this many bytes.
inline constexpr uint64_t kMaxOutputPixels = uint64_t{1} << 28;
inline constexpr uint64_t kMaxRingBytes = uint64_t{1} << 36;
// The most batches LoaderOptions::kept_mb lets the consumer keep beyond the ring.
inline constexpr uint32_t kMaxKeptBatches = 4096;

struct LoaderOptions {
  uint32_t batch_size = 64;
  bool shuffle = false;
  uint64_t seed = 0;
  bool drop_last = false;
  uint32_t shuffle_block = 0;  // see SamplerOptions: 0 = true global shuffle
  // Samples are mixed within windows of this many blocks (shuffle_block) or shards
  // (shuffle="block"). kAutoWindow ("auto", the default): 8, except for a remote archive read with
  // shuffle="block", where it is the most, up to 8, that the cache_limit allows (Loader::Create).
  static constexpr uint32_t kAutoWindow = 0;
  uint32_t shuffle_window = kAutoWindow;
  bool shuffle_by_shard = false;  // shuffle="block": SamplerOptions::shard_starts from the archive
  uint32_t rank = 0, world_size = 1;
  // Decode workers. 0: the CPUs this process may use (affinity and cgroup quota, base/cpus.h).
  // kAutoWorkers ("auto"): tuned online. Up to max_workers (0: the CPUs this process may use)
  // are started, one claims work at first, and after every few batches the loader wakes one
  // more while the consumer waits more than wait_target of its time (doubles them while it
  // waits more than half its time), or lets one sleep (no CPU) when the others could carry
  // the load. Tuning changes timing only, never the samples or batches delivered.
  // EpochStats::workers and ::tuning say what it chose and why. The default (docs/DESIGN.md,
  // "Tuned online": it matched the best hand-picked setting at every step time measured).
  static constexpr int kAutoWorkers = -1;
  int workers = kAutoWorkers;
  uint32_t max_workers = 0;
  double wait_target = 0.02;  // fraction of the consumer's time spent waiting for data
  // Ring slots: batches decoded ahead (memory = prefetch x batch). kAutoPrefetch (0, "auto"):
  // tuned online. The ring starts at 2 slots and grows by one when, over a tuning window, the
  // consumer waited more than wait_target while workers stood idle because every slot was
  // full (EpochStats::ring_full_seconds) (a worker that can wake comes first while the consumer
  // waits more than half its time), or at once when the consumer holds every slot; it
  // gives one back after a calm spell (no waiting, a ready batch always to spare), a spell
  // that doubles each time a shrink had to be undone. At most max_prefetch slots (0: 16) and
  // ring_mb MiB (0: 1/8 of the memory this process may use, at most 4 GiB; always room for
  // 2). Like workers=auto it changes timing only, never the batches delivered. The default.
  static constexpr uint32_t kAutoPrefetch = 0;
  uint32_t prefetch = kAutoPrefetch;
  uint32_t max_prefetch = 0;
  uint32_t ring_mb = 0;
  // Batches the consumer keeps (a list of batches, a view of one image kept past the loop)
  // never make iteration fail: when the consumer holds every ring slot, Next() commits a slot
  // beyond the ring for the next batch, and gives its memory back once that batch is released.
  // At most kept_mb MiB of such slots (0: a quarter of the memory this process may use) and
  // kMaxKeptBatches of them; past that, Next() returns kResourceExhausted naming kept_mb.
  // EpochStats::kept_slots counts them; the first one also prints a warning on stderr (each
  // kept batch costs a slot of pinned memory; copy what you keep, e.g. labels).
  uint32_t kept_mb = 0;
  // Once every sample of the epoch in progress is handed out, workers start the epoch expected
  // next (epoch + 1, or the same epoch again if the last StartEpoch repeated one) in the ring's
  // free slots, so it does not begin with an empty ring. StartEpoch of that epoch from its
  // start keeps those batches; any other StartEpoch discards them (as it cancels the epoch in
  // progress). It takes no slot the epoch in progress needs and never changes what is
  // delivered. Costs at most one ring of decoding that is thrown away, after the last epoch.
  bool run_ahead = true;
  TransformOptions transform;
  // A sample that cannot be read or decoded becomes zeros with label -1 (counted in the batch's
  // skipped). Not kChanged (a shard changed on disk while mapped): that fails the batch.
  bool skip_errors = false;
  WorkerMode mode = WorkerMode::kThreads;
  bool device = false;    // copy each batch to the CUDA device (needs CudaAvailable())
  int device_index = -1;  // that device; -1: the creating thread's current device
  // With `device` and a float transform.dtype: workers write uint8 NHWC (a quarter of float32's
  // bytes over PCIe) and a CUDA kernel normalises on the device into transform.dtype/layout.
  // Batch::images() is then the host's uint8 NHWC copy and device_images() the normalised
  // batch. Needs a build with nvcc (CudaKernelsBuilt()).
  bool normalize_on_device = false;
  // Seconds Next() waits with no sample completing before it returns kTimeout (see above).
  // 0 waits forever. The default is far above any single sample's decode time.
  double timeout = 120;
  // Fields of the archive's schema (format/fields.h) each batch carries beside its images and
  // labels (Batch::fields()): with all_fields (the default) every field, except a str field named
  // "path" (a folder or list pack's source path: for tracing a sample back, Archive::Field or
  // extract, not for training; gathering it costs ~0.4 us a sample, 25% of a 32x32 raw read)
  // unless source_path_too ("*"); else those named in `fields` (Create() refuses a name the
  // schema lacks, naming the closest). The image field and the class field ("label") always come
  // as images() and labels(), named or not. A field not carried costs nothing: with none,
  // batches are laid out and read exactly as image + label.
  bool all_fields = true;
  bool source_path_too = false;
  std::vector<std::string> fields;
  // How the Python bindings hand out a variable field: kList, a list of per-sample arrays
  // (views of the batch); kOffsets, one values array and one offsets array (no per-sample
  // Python work). C++ callers always get both forms (BatchField).
  enum class Ragged { kList, kOffsets };
  Ragged ragged = Ragged::kList;
};

// Where an interrupted run stands: enough to resume on exactly the next batch at the same world
// size, and on exactly the rest of the epoch's global order at another (elastic resume).
struct LoaderState {
  uint64_t epoch = 0;
  uint64_t position = 0;  // batches already delivered by this rank in the current plan
  uint64_t seed = 0;
  uint64_t plan_start = 0;  // global position the current plan started at (0: a whole epoch)
  uint64_t consumed = 0;    // global positions consumed, once every rank is at `position`
  uint32_t world_size = 1;  // of the run that saved it
  uint32_t batch_size = 0;  // of the run that saved it (0: not recorded, taken as this loader's)
};

struct EpochStats {
  uint64_t epoch = 0, batches = 0, images = 0, skipped = 0;
  double seconds = 0;           // first StartEpoch to last batch
  double wait_seconds = 0;      // consumer blocked in Next(): data was late
  double consumer_seconds = 0;  // consumer's time between batches (its "training step")
  // Per-stage worker time, summed over workers (seconds of CPU, roughly).
  double read = 0, decode = 0, collate = 0, copy = 0;
  int workers = 0;          // workers claiming work at the end of the epoch (auto: the tuned count)
  int prefetch = 0;         // ring slots in use at the end of the epoch (auto: the tuned depth)
  uint64_t ring_bytes = 0;  // ring memory committed (pinned) at the end of the epoch
  double ring_full_seconds = 0;  // worker time spent idle because every ring slot was taken
  // run_ahead: batches of the epoch expected next that workers began while this one ran, and
  // batches of this epoch begun before it started that StartEpoch kept.
  uint64_t run_ahead_batches = 0, ahead_kept = 0;
  std::string tuning;  // workers or prefetch "auto": the last decision and its reason
  // Slots committed beyond the ring for batches the consumer kept (the most at once, this
  // epoch; LoaderOptions::kept_mb).
  uint64_t kept_slots = 0;
  // Remote archives (s3://, http(s)://, docs/REMOTE.md), this epoch: shard bytes received, shards
  // found in the cache and shards downloaded, counted for the whole process (every remote archive
  // it reads; storage::GetFetchStats; worker processes' own fetches are not in them), and the
  // worker time spent waiting for a shard's download (thread mode). A consumer wait
  // (wait_seconds) while fetch_wait_seconds grows is fetch wait: the network is the bottleneck.
  uint64_t bytes_fetched = 0, cache_hits = 0, cache_misses = 0;
  double fetch_wait_seconds = 0;
  // Batches decoded and waiting in the ring at the moment Stats() was called (a gauge, not an
  // epoch total): what a consumer that wants to run behind the workers can wait for.
  uint32_t ready_batches = 0;
  // Fraction of the consumer's time spent waiting for data.
  double wait_fraction() const {
    double t = wait_seconds + consumer_seconds;
    return t > 0 ? wait_seconds / t : 0;
  }
};

class Loader;

// One field of a batch (LoaderOptions::fields), in the schema's order. Views, valid while the
// Batch's lease is held (like images()). Two forms:
// - stacked (ragged() false): fixed-size fields (int64, float32, float64, fixed arrays) as
//   shape {size(), dims...} (scalars {size()}), and masks as {size(), H, W} uint8, H x W the
//   images' output size, resampled with each image's crop, flip and orientation (geometry.h).
//   In the ring slot, page-locked like the images.
// - ragged (variable fields: boxes, arrays with a "*" dim, str, bytes, json): every sample's
//   value back to back in `data`; sample i is entries [offsets[i], offsets[i + 1]) of data's
//   first axis and has its own shape dims[i * ndim, (i + 1) * ndim). `shape` is data's: {rows,
//   trailing dims...} when only the first dim varies (boxes: {rows, 4}), else {elements}
//   (str, bytes, json: {bytes}, ndim 0). Boxes are in output pixels (geometry.h: mapped,
//   clipped, boxes under kMinBoxSide dropped) and every field declared per those boxes keeps
//   the same rows. A skipped sample (skip_errors) has no rows, an empty string, a zero mask and
//   zero fixed fields. In host memory of the slot's own (not page-locked), reused with it.
struct BatchField {
  std::string_view name;  // lives as long as the archive
  format::FieldKind kind = format::FieldKind::kBytes;
  format::ElemType elem = format::ElemType::kUint8;  // of `data` (str, bytes, json: uint8)
  const uint8_t* data = nullptr;
  size_t bytes = 0;
  std::vector<int64_t> shape;        // of `data`
  const int64_t* offsets = nullptr;  // ragged: size() + 1 entries, from 0
  const uint32_t* dims = nullptr;    // ragged: size() x ndim
  uint32_t ndim = 0;
  bool ragged() const { return offsets != nullptr; }
};

// A batch: a lease on one ring slot. The slot goes back to the ring when the last copy of the
// Batch (it is a shared handle) is destroyed; until then its memory is never overwritten.
class Batch {
 public:
  Batch() = default;
  uint32_t size() const { return size_; }  // samples (the last batch may be short)
  // The images: shape() elements of dtype() (LoaderOptions::transform.dtype), C-contiguous.
  uint8_t* images() const { return images_; }
  DType dtype() const { return dtype_; }
  const int64_t* labels() const { return labels_; }
  const uint64_t* indices() const { return indices_; }  // archive index of each sample
  // {size, H, W, 3} for NHWC or {size, 3, H, W} for NCHW.
  std::vector<int64_t> shape() const { return shape_; }
  // Of device_images(): as dtype()/shape(), except with normalize_on_device (see LoaderOptions).
  DType device_dtype() const { return device_dtype_; }
  std::vector<int64_t> device_shape() const { return device_shape_; }
  size_t image_bytes() const;  // elements x DTypeSize(dtype())
  uint64_t epoch() const { return epoch_; }
  uint64_t number() const { return number_; }  // batch number within the epoch
  uint32_t skipped() const { return skipped_; }
  // The fields carried (LoaderOptions::fields) other than the image and the class field, in
  // schema order; empty when none. Valid while the lease is held.
  const std::vector<BatchField>& fields() const;
  const BatchField* field(std::string_view name) const;  // nullptr if not carried
  // On the device (only with LoaderOptions::device): images then labels, copied on the slot's
  // stream. Call Wait(stream) before using them from `stream`, or Synchronize().
  // Wait() also names the stream whose work must finish before the slot is refilled: on
  // release the loader records an event there and the slot's next copy waits for it (without
  // Wait, the legacy default stream).
  const void* device_images() const;
  const int64_t* device_labels() const;
  int device() const { return device_ ? device_->device() : -1; }  // CUDA device, or -1
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
  DType dtype_ = DType::kUint8, device_dtype_ = DType::kUint8;
  std::vector<int64_t> shape_, device_shape_;
  uint64_t epoch_ = 0, number_ = 0;
  DeviceSlot* device_ = nullptr;
  size_t device_label_offset_ = 0;
  const std::vector<BatchField>* fields_ = nullptr;
};

class Loader {
 public:
  // `cancel` (may be null; used only during Create): ends a remote archive's start-up reads
  // (the loader's own lazily opened copy of it, shuffle="block") with kCancelled.
  static Result<std::unique_ptr<Loader>> Create(std::shared_ptr<const format::Archive> archive,
                                                const LoaderOptions& options,
                                                const CancelToken* cancel = nullptr);
  ~Loader();

  // Begins `epoch` at batch `start_batch` (a resume) of the plan that starts at global position
  // `start_position` (0: the whole epoch; see sampler.h), abandoning any epoch in progress (see
  // the lifecycle notes above). Fails if the loader has failed or this is a forked copy.
  Status StartEpoch(uint64_t epoch, uint64_t start_batch = 0, uint64_t start_position = 0);
  // Resumes from a saved State(): exactly the next batch when `state.world_size` and
  // `state.batch_size` are this loader's, else by samples consumed (elastic): the rest of the
  // epoch's global order spread over this world size and batch size, so the interrupted epoch
  // is covered exactly once across ranks (padding aside), no sample repeated or skipped.
  // To continue the current epoch where it stands after leaving it early (a `break`), call
  // StartEpoch(State().epoch, State().position): only StartEpoch moves the plan.
  Status Resume(const LoaderState& state);

  // Called about every kWaitPollSeconds while Next() waits; a non-OK Status ends the wait and
  // is returned by Next() (the batch is not consumed: the next call delivers it). The Python
  // bindings use it to raise KeyboardInterrupt on Ctrl-C.
  using WaitHook = std::function<Status()>;
  static constexpr double kWaitPollSeconds = 0.05;

  // The next batch, in order. Returns an empty Batch at the end of the epoch (and again on
  // every later call, until StartEpoch). Before the first StartEpoch, Next() starts epoch 0
  // from its start, as StartEpoch(0) would. An error from a worker (decode failure naming the
  // sample, dead worker process, timeout) is returned here; the batch it concerns is consumed
  // (the next call delivers the one after: a sample's data error fails the same way each
  // time; skip_errors skips the sample instead), except
  // - a wait that ends without a batch (the hook's error, kTimeout, kResourceExhausted for
  //   kept_mb): the next call waits for the same batch again;
  // - a batch of a remote archive that failed for a reason that may pass (kIOError, kTimeout:
  //   a shard's download, the server down): not consumed either; the next call reads it again,
  //   and the batches after it that were begun, so an epoch continued after the error delivers
  //   every sample once (a shard whose download failed is tried again 2 s later: a loop that
  //   catches the error and goes on should wait a moment). With skip_errors the sample is
  //   skipped instead, as any sample that cannot be read.
  Result<Batch> Next(const WaitHook& hook = {});

  // To resume: Resume(state). `undelivered`: the last batches Next() returned that the caller
  // did not hand on (a Python iterator interrupted after Next() returned, which delivers them
  // again first): the state as if they had not been returned.
  LoaderState State(uint64_t undelivered = 0) const;
  EpochStats Stats() const;  // of the current (or just finished) epoch
  uint64_t batches_per_epoch() const;
  uint64_t samples_per_epoch() const;  // on this rank
  // The options as the loader runs them, resolved: `workers` (auto or 0) is the number of
  // worker threads or processes started (auto: the most that may wake; Stats().workers says
  // how many claim work now), `device_index` the device used, and with normalize_on_device the
  // workers' transform (uint8 NHWC, mean 0, std 1; Batch::device_dtype() is the target).
  // `prefetch` stays 0 for auto (Stats().prefetch is the depth now). Valid for the Loader's life.
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
