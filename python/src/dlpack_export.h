// Exporting device memory to Python through DLPack (the framework-neutral tensor exchange ABI),
// so torch.utils.dlpack.from_dlpack() can wrap a batch that lives on the GPU without a copy.
// The structs below follow the DLPack 0.x ABI (dlpack.h), which is frozen.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace shardfeed_py {

enum DLDeviceType : int32_t { kDLCPU = 1, kDLCUDA = 2 };
enum DLDataTypeCode : uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4 };

struct DLDevice {
  DLDeviceType device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

// Owns the shape array and a share of the batch lease for as long as the consumer holds the
// tensor.
struct ExportContext {
  DLManagedTensor managed{};
  std::vector<int64_t> shape;
  std::shared_ptr<void> lease;
};

// A "dltensor" capsule over `data` (C-contiguous). The lease is released when the consumer
// (torch) frees the tensor, or when the capsule dies unconsumed.
inline pybind11::capsule ExportDlpack(void* data, const std::vector<ssize_t>& shape,
                                      DLDataTypeCode code, uint8_t bits, DLDeviceType device,
                                      int32_t device_id, std::shared_ptr<void> lease) {
  auto* ctx = new ExportContext();
  ctx->shape.assign(shape.begin(), shape.end());
  ctx->lease = std::move(lease);
  DLTensor& t = ctx->managed.dl_tensor;
  t.data = data;
  t.device = DLDevice{device, device_id};
  t.ndim = static_cast<int32_t>(ctx->shape.size());
  t.dtype = DLDataType{code, bits, 1};
  t.shape = ctx->shape.data();
  t.strides = nullptr;  // compact row-major
  t.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = [](DLManagedTensor* self) {
    delete static_cast<ExportContext*>(self->manager_ctx);
  };
  return pybind11::capsule(&ctx->managed, "dltensor", [](PyObject* capsule) {
    // Unconsumed capsules still own the tensor; consumed ones were renamed "used_dltensor".
    if (PyCapsule_IsValid(capsule, "dltensor")) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
      m->deleter(m);
    }
  });
}

}  // namespace shardfeed_py
