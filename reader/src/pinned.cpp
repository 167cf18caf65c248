#include "shardfeed/reader/pinned.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#ifdef SHARDFEED_WITH_CUDA
#include <cuda_runtime_api.h>
#endif
#ifdef SHARDFEED_WITH_CUDA_KERNELS
#include "normalize_kernel.h"
static_assert(int(shardfeed::reader::DType::kFloat32) == 1 &&
                  int(shardfeed::reader::DType::kFloat16) == 2 &&
                  int(shardfeed::reader::DType::kBFloat16) == 3,
              "normalize_kernel.cu numbers the dtypes as transform.h does");
#endif

namespace shardfeed::reader {

bool CudaKernelsBuilt() {
#ifdef SHARDFEED_WITH_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

namespace {

struct CudaProbe {
  bool available = false;
  std::string reason;
};

const CudaProbe& Probe() {
  static CudaProbe probe = [] {
    CudaProbe p;
#ifdef SHARDFEED_WITH_CUDA
    if (const char* off = std::getenv("SHARDFEED_DISABLE_CUDA"); off && *off && *off != '0') {
      p.reason = "disabled by SHARDFEED_DISABLE_CUDA";
      return p;
    }
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      p.reason = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
      cudaGetLastError();  // clear the sticky error
    } else if (count == 0) {
      p.reason = "no CUDA device";
    } else {
      p.available = true;
    }
#else
    p.reason = "built without the CUDA Toolkit";
#endif
    return p;
  }();
  return probe;
}

}  // namespace

bool CudaAvailable() { return Probe().available; }

int CurrentCudaDevice() {
  int device = 0;
#ifdef SHARDFEED_WITH_CUDA
  if (CudaAvailable() && cudaGetDevice(&device) != cudaSuccess) device = 0;
#endif
  return device;
}
std::string CudaUnavailableReason() { return Probe().reason; }

const char* PinKindName(PinKind kind) {
  switch (kind) {
    case PinKind::kCudaRegistered:
      return "cudaHostRegister";
    case PinKind::kMlocked:
      return "mlock";
    case PinKind::kPageable:
      return "pageable (mlock refused)";
  }
  return "?";
}

size_t RingMemory::PageSize() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

Result<RingMemory> RingMemory::Reserve(size_t slot_bytes, size_t capacity, int shared_fd) {
  RingMemory r;
  const size_t page = PageSize();
  if (slot_bytes == 0 || slot_bytes % page != 0 || capacity == 0) {
    return Status::InvalidArgument("ring slots must be a positive number of pages, not ",
                                   slot_bytes, " bytes x ", capacity);
  }
  const size_t bytes = slot_bytes * capacity;
  void* map = shared_fd >= 0
                  ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, shared_fd, 0)
                  : ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (map == MAP_FAILED) {
    return Status::ResourceExhausted("cannot reserve ", bytes,
                                     " bytes for the batch ring: ", std::strerror(errno));
  }
  r.data_ = static_cast<uint8_t*>(map);
  r.slot_bytes_ = slot_bytes;
  r.shared_ = shared_fd >= 0;
  r.pinned_.assign(capacity, kNone);
  return r;
}

Status RingMemory::Commit(size_t slot) {
  if (slot >= pinned_.size()) return Status::InvalidArgument("no ring slot ", slot);
  if (pinned_[slot] != kNone) return Status::OK();
  uint8_t* p = data_ + slot * slot_bytes_;
  // First touch now, not in the first batches. MADV_POPULATE_WRITE faults the (zero) pages in
  // and reports a shortage as an error, where touching a shared mapping the system cannot back
  // would raise SIGBUS; kernels before 5.14 answer EINVAL and the pages are touched by hand.
  bool populated = false;
#ifdef MADV_POPULATE_WRITE
  if (::madvise(p, slot_bytes_, MADV_POPULATE_WRITE) == 0) {
    populated = true;
  } else if (errno != EINVAL) {
    return Status::ResourceExhausted("cannot commit ", slot_bytes_,
                                     " bytes of ring memory: ", std::strerror(errno));
  }
#endif
  if (!populated) std::memset(p, 0, slot_bytes_);
  PinKind kind = PinKind::kPageable;
#ifdef SHARDFEED_WITH_CUDA
  if (CudaAvailable()) {
    if (cudaHostRegister(p, slot_bytes_, cudaHostRegisterPortable) == cudaSuccess) {
      kind = PinKind::kCudaRegistered;
    } else {
      cudaGetLastError();
    }
  }
#endif
  if (kind == PinKind::kPageable && ::mlock(p, slot_bytes_) == 0) kind = PinKind::kMlocked;
  pinned_[slot] = static_cast<uint8_t>(kind);
  ++committed_;
  return Status::OK();
}

void RingMemory::Decommit(size_t slot) {
  if (slot >= pinned_.size() || pinned_[slot] == kNone) return;
  uint8_t* p = data_ + slot * slot_bytes_;
  switch (static_cast<PinKind>(pinned_[slot])) {
    case PinKind::kCudaRegistered:
#ifdef SHARDFEED_WITH_CUDA
      cudaHostUnregister(p);
#endif
      break;
    case PinKind::kMlocked:
      ::munlock(p, slot_bytes_);
      break;
    case PinKind::kPageable:
      break;
  }
  // Private memory: dropped pages read back as zeros. Shared memory: the memfd's pages are
  // freed (MADV_REMOVE punches a hole), so the workers' views of it shrink too.
  ::madvise(p, slot_bytes_, shared_ ? MADV_REMOVE : MADV_DONTNEED);
  pinned_[slot] = kNone;
  --committed_;
}

PinKind RingMemory::kind() const {
  int weakest = -1;
  for (uint8_t k : pinned_) {
    if (k != kNone) weakest = std::max(weakest, int{k});
  }
  return weakest < 0 ? PinKind::kPageable : static_cast<PinKind>(weakest);
}

RingMemory& RingMemory::operator=(RingMemory&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = other.data_;
    slot_bytes_ = other.slot_bytes_;
    shared_ = other.shared_;
    committed_ = other.committed_;
    pinned_ = std::move(other.pinned_);
    other.data_ = nullptr;
    other.pinned_.clear();
    other.committed_ = 0;
  }
  return *this;
}

RingMemory::~RingMemory() { Release(); }

void RingMemory::Release() {
  if (!data_) return;
  for (size_t s = 0; s < pinned_.size(); ++s) Decommit(s);
  ::munmap(data_, slot_bytes_ * pinned_.size());
  data_ = nullptr;
  pinned_.clear();
}

#ifdef SHARDFEED_WITH_CUDA

namespace {
Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::OK();
  return Status::IOError(what, ": ", cudaGetErrorString(err));
}

// Makes `device` current for a scope and restores the caller's device after: Release() and the
// destructor run on the consumer's threads, whose current device is theirs, not ours.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};
}  // namespace

Result<std::unique_ptr<DeviceSlot>> DeviceSlot::Create(size_t bytes, int device,
                                                       const DeviceNormalize* normalize) {
  if (!CudaAvailable()) return Status::Unsupported("CUDA: ", CudaUnavailableReason());
  if (normalize && !CudaKernelsBuilt()) {
    return Status::Unsupported(
        "normalize_on_device needs shardfeed's CUDA kernels, and this build has none (nvcc was "
        "not found at configure time)");
  }
  std::unique_ptr<DeviceSlot> s(new DeviceSlot());
  s->device_index_ = device >= 0 ? device : CurrentCudaDevice();
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || s->device_index_ >= count) {
    cudaGetLastError();
    return Status::InvalidArgument("CUDA device ", s->device_index_, " does not exist (", count,
                                   " devices)");
  }
  DeviceScope scope(s->device_index_);  // the caller's current device is left as it was
  SF_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&s->device_, bytes), "cudaMalloc"));
  if (normalize) {
    s->normalize_ = *normalize;
    const size_t out = normalize->max_samples * normalize->plane * 3 * DTypeSize(normalize->dtype);
    SF_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&s->normalized_, out), "cudaMalloc"));
  }
  cudaStream_t stream;
  SF_RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  s->stream_ = stream;
  for (void** slot : {&s->copied_, &s->released_}) {
    cudaEvent_t event;
    SF_RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate"));
    *slot = event;
  }
  return s;
}

DeviceSlot::~DeviceSlot() {
  DeviceScope scope(device_index_);
  if (stream_) cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  if (copied_) cudaEventDestroy(static_cast<cudaEvent_t>(copied_));
  if (released_) cudaEventDestroy(static_cast<cudaEvent_t>(released_));
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  if (device_) cudaFree(device_);
  if (normalized_) cudaFree(normalized_);
}

Status DeviceSlot::CopyAsync(const void* src, size_t bytes, size_t samples) {
  // Worker threads are not the thread that chose the device.
  SF_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_index_), "cudaSetDevice"));
  auto stream = static_cast<cudaStream_t>(stream_);
  if (release_failed_) {
    SF_RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
    release_failed_ = false;
  } else if (release_pending_) {
    SF_RETURN_IF_ERROR(
        CudaStatus(cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(released_), 0),
                   "cudaStreamWaitEvent"));
  }
  release_pending_ = false;
  SF_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(device_, src, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync"));
  if (normalized_) SF_RETURN_IF_ERROR(Normalize(samples));
  return CudaStatus(cudaEventRecord(static_cast<cudaEvent_t>(copied_), stream), "cudaEventRecord");
}

Status DeviceSlot::Normalize(size_t samples) {
#ifdef SHARDFEED_WITH_CUDA_KERNELS
  internal::DeviceNormalizeArgs a;
  a.src = static_cast<const uint8_t*>(device_);
  a.dst = normalized_;
  a.samples = std::min(samples, normalize_.max_samples);
  a.plane = normalize_.plane;
  a.dtype = static_cast<int>(normalize_.dtype);
  a.planar = normalize_.layout == Layout::kNCHW;
  for (int c = 0; c < 3; ++c) a.scale[c] = normalize_.scale[c], a.bias[c] = normalize_.bias[c];
  return CudaStatus(static_cast<cudaError_t>(internal::LaunchDeviceNormalize(a, stream_)),
                    "normalize kernel launch");
#else
  (void)samples;
  return Status::Unsupported("built without CUDA kernels");
#endif
}

Status DeviceSlot::Synchronize() {
  return CudaStatus(cudaEventSynchronize(static_cast<cudaEvent_t>(copied_)),
                    "cudaEventSynchronize");
}

Status DeviceSlot::StreamWait(void* stream) {
  consumer_stream_ = stream;
  return CudaStatus(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(copied_), 0),
      "cudaStreamWaitEvent");
}

void DeviceSlot::Release() {
  DeviceScope scope(device_index_);
  cudaError_t err = cudaEventRecord(static_cast<cudaEvent_t>(released_),
                                    static_cast<cudaStream_t>(consumer_stream_));
  if (err != cudaSuccess) {
    cudaGetLastError();
    release_failed_ = true;
  }
  release_pending_ = true;
  consumer_stream_ = nullptr;
}

#else

Result<std::unique_ptr<DeviceSlot>> DeviceSlot::Create(size_t, int, const DeviceNormalize*) {
  return Status::Unsupported("CUDA: ", CudaUnavailableReason());
}
Status DeviceSlot::Normalize(size_t) { return Status::Unsupported("no CUDA"); }
DeviceSlot::~DeviceSlot() = default;
void DeviceSlot::Release() {}
Status DeviceSlot::CopyAsync(const void*, size_t, size_t) { return Status::Unsupported("no CUDA"); }
Status DeviceSlot::Synchronize() { return Status::Unsupported("no CUDA"); }
Status DeviceSlot::StreamWait(void*) { return Status::Unsupported("no CUDA"); }

#endif

}  // namespace shardfeed::reader
