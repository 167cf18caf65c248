// Page-locked host memory and the CUDA runtime, behind one small interface that also works in a
// build without the CUDA Toolkit and on a machine without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

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

// How a PinnedBuffer's memory was obtained.
enum class PinKind {
  kCudaHostAlloc,   // cudaHostAlloc: page-locked and registered with the driver
  kCudaRegistered,  // memory we own (e.g. shared) registered with cudaHostRegister
  kMlocked,         // no device: aligned memory locked with mlock
  kPageable,        // mlock refused (RLIMIT_MEMLOCK): aligned, touched, but pageable
};
const char* PinKindName(PinKind kind);

// A page-aligned host buffer, allocated and touched once (first-touch faults are paid at
// construction, never per batch). Move-only; frees with the matching call.
class PinnedBuffer {
 public:
  // Allocates `bytes` of page-locked memory: cudaHostAlloc with a device, else mlock'ed memory.
  static Result<PinnedBuffer> Allocate(size_t bytes);
  // Pins memory the caller owns (a shared mapping): cudaHostRegister with a device, else mlock.
  static PinnedBuffer Adopt(void* data, size_t bytes);

  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& other) noexcept { *this = std::move(other); }
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  ~PinnedBuffer();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  PinKind kind() const { return kind_; }

 private:
  void Release();
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  PinKind kind_ = PinKind::kPageable;
  bool owned_ = true;
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
