// The device side of normalise-on-GPU (LoaderOptions::normalize_on_device): a CUDA kernel,
// built by nvcc when the toolkit has it (SHARDFEED_WITH_CUDA_KERNELS), that turns a batch of
// uint8 NHWC images already on the device into normalised float32/float16/bfloat16, NHWC or
// NCHW, with exactly the CPU path's arithmetic (x * scale[c], rounded, + bias[c], rounded, then
// to the output type rounding to nearest even): the results are bit for bit the CPU path's
// (pixel_store.h, the reference); tests/python/test_device.py checks that on a GPU.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shardfeed::reader::internal {

struct DeviceNormalizeArgs {
  const uint8_t* src = nullptr;   // device: `samples` images of height x width x 3 uint8
  void* dst = nullptr;            // device: the same images as `dtype` (transform.h's DType)
  size_t samples = 0, plane = 0;  // plane = height x width
  int dtype = 0;                  // static_cast<int>(DType)
  bool planar = false;            // NCHW
  float scale[3] = {1, 1, 1}, bias[3] = {0, 0, 0};
};

// Queues the kernel on `stream` (a cudaStream_t). Returns the cudaError_t of the launch (0 on
// success). Thread-safety: any thread whose current device owns the buffers.
int LaunchDeviceNormalize(const DeviceNormalizeArgs& args, void* stream);

}  // namespace shardfeed::reader::internal
