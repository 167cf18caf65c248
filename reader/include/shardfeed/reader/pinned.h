// Page-locked host memory and the CUDA runtime, behind one small interface that also works in a
// build without the CUDA Toolkit and on a machine without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardfeed/base/status.h"
#include "shardfeed/reader/transform.h"

namespace shardfeed::reader {

// True when this build links the CUDA runtime and a device is usable.
bool CudaAvailable();
// Why CUDA is not used (empty when it is).
std::string CudaUnavailableReason();
// True when this build has shardfeed's CUDA kernels (nvcc was found): normalize_on_device.
bool CudaKernelsBuilt();
// The calling thread's current CUDA device (0 without CUDA).
int CurrentCudaDevice();

// How ring memory is pinned (strongest first).
enum class PinKind {
  kCudaRegistered,  // page-locked and registered with the driver (cudaHostRegister)
  kMlocked,         // no device: aligned memory locked with mlock
  kPageable,        // mlock refused (RLIMIT_MEMLOCK): aligned, touched, but pageable
};
const char* PinKindName(PinKind kind);

// The loader's ring: address space for `capacity` slots of `slot_bytes` each (a multiple of the
// page size), reserved at once and committed slot by slot. Reserving costs no memory; Commit()
// touches a slot's pages (first-touch faults are paid then, never per batch) and pins them
// (cudaHostRegister with a device, else mlock; pageable if both are refused); Decommit()
// unpins them and gives the pages back to the system. A ring whose depth is tuned online
// (prefetch="auto") commits only the slots it uses; a fixed ring commits every slot at once.
//
// Private rings are anonymous memory; shared rings (process workers) are a MAP_SHARED mapping
// of a memfd the caller made, which this object maps and unmaps. data() never moves.
// Thread-safety: Commit/Decommit/kind/committed_bytes from one thread at a time (the loader
// calls them with its lock held or from its consumer thread); the slots' bytes are the
// caller's to share. Move-only; destruction unpins and unmaps everything.
class RingMemory {
 public:
  // Reserves the ring. `shared_fd` >= 0: maps that memfd (already sized to slot_bytes x
  // capacity) MAP_SHARED; otherwise private anonymous memory. Fails if the address space
  // cannot be reserved.
  static Result<RingMemory> Reserve(size_t slot_bytes, size_t capacity, int shared_fd = -1);
  static size_t PageSize();

  RingMemory() = default;
  RingMemory(RingMemory&& other) noexcept { *this = std::move(other); }
  RingMemory& operator=(RingMemory&& other) noexcept;
  ~RingMemory();

  // Touches and pins slot `slot` (no-op if committed). Fails only if the pages cannot be had
  // (the system is out of memory: a SIGBUS-free check through MADV_POPULATE_WRITE where the
  // kernel has it).
  Status Commit(size_t slot);
  // Unpins slot `slot` and returns its pages (its contents are lost). No-op if not committed.
  void Decommit(size_t slot);
  bool committed(size_t slot) const { return slot < pinned_.size() && pinned_[slot] != kNone; }

  uint8_t* data() const { return data_; }
  size_t slot_bytes() const { return slot_bytes_; }
  size_t capacity() const { return pinned_.size(); }
  size_t committed_bytes() const { return committed_ * slot_bytes_; }
  // How the committed slots are pinned: the weakest of them (kPageable if any is pageable).
  PinKind kind() const;

 private:
  static constexpr uint8_t kNone = 0xff;
  void Release();
  uint8_t* data_ = nullptr;
  size_t slot_bytes_ = 0;
  bool shared_ = false;
  size_t committed_ = 0;
  std::vector<uint8_t> pinned_;  // per slot: kNone, or the PinKind it was pinned with
};

// A device buffer plus a stream and two events: one per ring slot, on one device. Only
// constructed when CudaAvailable(). The copy of a batch runs on the slot's stream and `copied`
// marks its end; `released` marks the end of the consumer's work on the slot, and the next copy
// waits for it, so a slot is never overwritten while a kernel still reads it.
// Thread-safety: one batch at a time uses a slot (the ring guarantees it); calls are not
// concurrent.
//
// Normalising on the device: with a DeviceNormalize, each copy is followed (on the same stream,
// before `copied`) by a kernel that turns the slot's first `samples` uint8 NHWC images into
// `dtype`/`layout` in a second device buffer; device_images() is then that buffer.
struct DeviceNormalize {
  DType dtype = DType::kFloat32;
  Layout layout = Layout::kNCHW;
  size_t plane = 0;        // height x width of one image
  size_t max_samples = 0;  // the batch size
  std::array<float, 3> scale{1.f, 1.f, 1.f}, bias{0.f, 0.f, 0.f};
};

class DeviceSlot {
 public:
  static Result<std::unique_ptr<DeviceSlot>> Create(size_t bytes, int device,
                                                    const DeviceNormalize* normalize = nullptr);
  ~DeviceSlot();
  // Starts an asynchronous host-to-device copy of [src, src + bytes), after the consumer's work
  // recorded by the last Release(), then (when normalising) the kernel over `samples` images,
  // and records `copied`.
  Status CopyAsync(const void* src, size_t bytes, size_t samples = 0);
  // Blocks until the copy is done.
  Status Synchronize();
  // Makes `stream` (a cudaStream_t, nullptr = legacy default) wait for the copy, without
  // blocking the host, and remembers it as the consumer's stream for Release().
  Status StreamWait(void* stream);
  // The consumer let go of the slot: records `released` on its stream. Errors are not
  // reportable from a deleter; a failed record makes the next copy synchronize the device.
  void Release();
  void* device_data() const { return device_; }  // the copy of the slot (images, labels, ...)
  // The images the consumer reads: the normalised buffer when normalising, else device_data().
  void* device_images() const { return normalized_ ? normalized_ : device_; }
  int device() const { return device_index_; }

 private:
  DeviceSlot() = default;
  Status Normalize(size_t samples);  // queues the kernel after the copy
  void* device_ = nullptr;
  void* normalized_ = nullptr;
  DeviceNormalize normalize_;
  void* stream_ = nullptr;
  void* copied_ = nullptr;
  void* released_ = nullptr;
  void* consumer_stream_ = nullptr;
  int device_index_ = 0;
  bool release_pending_ = false;  // `released` recorded since the last copy
  bool release_failed_ = false;
};

}  // namespace shardfeed::reader
