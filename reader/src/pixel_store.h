// The last step of every sample: a resized, flipped uint8 RGB crop (HWC, cache-resident) is
// written into its batch slot in the requested element type and layout, normalised on the way:
// one pass that reads each byte once and writes each output element once.
//
// Vectorisation: the loops are plain C++ written so GCC and Clang vectorise them (no gathers,
// no data-dependent branches; float16/bfloat16 rounding is integer arithmetic with selects),
// and each entry point is compiled twice (`target_clones`): for x86-64-v3 (Haswell) and for the
// x86-64 baseline, chosen once at load time by the CPU it runs on. NCHW float output, the
// layout training reads, has a hand-written AVX2+F16C path with streaming stores (measured:
// float32 NCHW went from 88% to 100% of uint8 NHWC throughput). `tests/reader/
// normalize_test.cpp` checks every path against a scalar reference (SHARDFEED_NO_AVX2=1
// forces the compiled loops).
#pragma once

#include <cstddef>
#include <cstdint>

#include "shardfeed/reader/transform.h"

namespace shardfeed::reader::internal {

// Per-channel affine map: value = x * scale[c] + bias[c] for a uint8 x of channel c, computed
// as a rounded multiply then a rounded add on every path (no fused multiply-add), so every
// path, CPU or GPU, gives the same bits.
struct Affine {
  float scale[3];
  float bias[3];
};
Affine AffineFor(const TransformOptions& options);

// Writes `pixels` RGB pixels from `hwc` (uint8, interleaved) to `dst` as `dtype` in `layout`
// (NCHW: plane c at dst + c * pixels elements). uint8 ignores `affine` (a copy or transpose).
// `portable`: skip the hand-written SIMD path (tests compare the two).
void StorePixels(const uint8_t* hwc, size_t pixels, Layout layout, DType dtype,
                 const Affine& affine, void* dst, bool portable = false);

// IEEE binary16 and bfloat16 from float, rounding to nearest even (NaN stays NaN, overflow goes
// to infinity). Scalar forms of what the vector loops compute, for tests and references.
uint16_t FloatToHalf(float f);
uint16_t FloatToBFloat16(float f);
float HalfToFloat(uint16_t h);

}  // namespace shardfeed::reader::internal
