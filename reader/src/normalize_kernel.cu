#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "normalize_kernel.h"

namespace shardfeed::reader::internal {
namespace {

// One thread per pixel (grid-stride): reads its 3 bytes, writes 3 elements.
template <typename Out, typename Conv>
__global__ void Normalize(const uint8_t* __restrict__ src, Out* __restrict__ dst, size_t samples,
                          size_t plane, bool planar, float3 scale, float3 bias, Conv conv) {
  const size_t total = samples * plane;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const uint8_t* p = src + 3 * i;
    // A multiply then an add, each rounded, as the CPU path does: bit-identical results.
    const float r = __fadd_rn(__fmul_rn(float(p[0]), scale.x), bias.x);
    const float g = __fadd_rn(__fmul_rn(float(p[1]), scale.y), bias.y);
    const float b = __fadd_rn(__fmul_rn(float(p[2]), scale.z), bias.z);
    if (planar) {
      const size_t s = i / plane, at = i % plane;
      Out* base = dst + s * 3 * plane + at;
      base[0] = conv(r);
      base[plane] = conv(g);
      base[2 * plane] = conv(b);
    } else {
      Out* base = dst + 3 * i;
      base[0] = conv(r);
      base[1] = conv(g);
      base[2] = conv(b);
    }
  }
}

struct F32 {
  __device__ float operator()(float v) const { return v; }
};
struct F16 {
  __device__ __half operator()(float v) const { return __float2half_rn(v); }
};
struct BF16 {
  __device__ __nv_bfloat16 operator()(float v) const { return __float2bfloat16_rn(v); }
};

template <typename Out, typename Conv>
int Launch(const DeviceNormalizeArgs& a, cudaStream_t stream) {
  const size_t total = a.samples * a.plane;
  if (total == 0) return 0;
  const int threads = 256;
  const size_t want = (total + threads - 1) / threads;
  const int blocks = static_cast<int>(want < 65535 ? want : 65535);
  Normalize<Out, Conv><<<blocks, threads, 0, stream>>>(
      a.src, static_cast<Out*>(a.dst), a.samples, a.plane, a.planar,
      make_float3(a.scale[0], a.scale[1], a.scale[2]),
      make_float3(a.bias[0], a.bias[1], a.bias[2]), Conv());
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int LaunchDeviceNormalize(const DeviceNormalizeArgs& a, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  switch (a.dtype) {
    case 1:  // DType::kFloat32
      return Launch<float, F32>(a, s);
    case 2:  // DType::kFloat16
      return Launch<__half, F16>(a, s);
    case 3:  // DType::kBFloat16
      return Launch<__nv_bfloat16, BF16>(a, s);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace shardfeed::reader::internal
