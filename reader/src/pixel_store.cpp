#include "pixel_store.h"

#include <cstring>

// One clone for AVX2+FMA+F16C CPUs (x86-64-v3) and one for the baseline, picked at load time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(SHARDFEED_NO_CLONES)
#define SF_CLONES __attribute__((target_clones("arch=haswell", "default")))
#else
#define SF_CLONES
#endif
#define SF_INLINE [[gnu::always_inline]] inline

namespace shardfeed::reader::internal {
namespace {

SF_INLINE uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
SF_INLINE float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Round-to-nearest-even binary16, branch-free so that loops over it vectorise. Normal results
// rebias the exponent and round the mantissa in integer arithmetic; subnormal ones let a float
// addition do the rounding (adding 0.5 aligns the value's bits to the binary16 subnormal grid).
SF_INLINE uint16_t Half(float f) {
  uint32_t u = Bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7FFFFFFFu;
  const uint32_t normal = (u + 0xC8000FFFu + ((u >> 13) & 1u)) >> 13;  // exponent -= 112
  const uint32_t subnormal = Bits(FromBits(u) + 0.5f) - (126u << 23);
  // Selects as masks (all ones or zero): a conditional here would stop the vectoriser.
  const uint32_t nan = 0u - uint32_t{u > 0x7F800000u};
  const uint32_t big = 0u - uint32_t{u >= (143u << 23)};  // NaN, infinity or overflow
  const uint32_t small = 0u - uint32_t{u < (113u << 23)};
  const uint32_t special = 0x7C00u | (nan & 0x0200u);
  const uint32_t finite = (subnormal & small) | (normal & ~small);
  return static_cast<uint16_t>((special & big) | (finite & ~big) | sign);
}

SF_INLINE uint16_t BFloat16(float f) {
  const uint32_t u = Bits(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  const uint32_t nan = 0u - uint32_t{(u & 0x7FFFFFFFu) > 0x7F800000u};
  return static_cast<uint16_t>((quiet_nan & nan) | (rounded & ~nan));
}

struct ToFloat {
  SF_INLINE float operator()(float v) const { return v; }
};
struct ToHalf {
  SF_INLINE uint16_t operator()(float v) const { return Half(v); }
};
struct ToBFloat16 {
  SF_INLINE uint16_t operator()(float v) const { return BFloat16(v); }
};

// NHWC: channel = element index mod 3. Blocks of 48 elements (16 pixels) use a repeated
// scale/bias pattern, so the loop body has no modulo and vectorises at any width up to 16.
template <typename Out, typename Conv>
SF_INLINE void Interleaved(const uint8_t* in, size_t pixels, const Affine& a, Out* out, Conv conv) {
  constexpr size_t kBlock = 48;
  float s[kBlock], b[kBlock];
  for (size_t j = 0; j < kBlock; ++j) s[j] = a.scale[j % 3], b[j] = a.bias[j % 3];
  const size_t n = pixels * 3;
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    for (size_t j = 0; j < kBlock; ++j) out[i + j] = conv(float(in[i + j]) * s[j] + b[j]);
  }
  for (; i < n; ++i) out[i] = conv(float(in[i]) * s[i % 3] + b[i % 3]);
}

// NCHW: one pass over the pixels, three output planes.
template <typename Out, typename Conv>
SF_INLINE void Planar(const uint8_t* __restrict in, size_t pixels, const Affine& a,
                      Out* __restrict out, Conv conv) {
  Out* __restrict r = out;
  Out* __restrict g = out + pixels;
  Out* __restrict bl = out + 2 * pixels;
  const float s0 = a.scale[0], s1 = a.scale[1], s2 = a.scale[2];
  const float b0 = a.bias[0], b1 = a.bias[1], b2 = a.bias[2];
  for (size_t i = 0; i < pixels; ++i) {
    r[i] = conv(float(in[3 * i]) * s0 + b0);
    g[i] = conv(float(in[3 * i + 1]) * s1 + b1);
    bl[i] = conv(float(in[3 * i + 2]) * s2 + b2);
  }
}

SF_CLONES void PlanarBytes(const uint8_t* __restrict in, size_t pixels, uint8_t* __restrict out) {
  uint8_t* __restrict r = out;
  uint8_t* __restrict g = out + pixels;
  uint8_t* __restrict b = out + 2 * pixels;
  for (size_t i = 0; i < pixels; ++i) {
    r[i] = in[3 * i];
    g[i] = in[3 * i + 1];
    b[i] = in[3 * i + 2];
  }
}

SF_CLONES void StoreFloat(const uint8_t* in, size_t pixels, bool planar, const Affine& a,
                          float* out) {
  planar ? Planar(in, pixels, a, out, ToFloat()) : Interleaved(in, pixels, a, out, ToFloat());
}
SF_CLONES void StoreHalf(const uint8_t* in, size_t pixels, bool planar, const Affine& a,
                         uint16_t* out) {
  planar ? Planar(in, pixels, a, out, ToHalf()) : Interleaved(in, pixels, a, out, ToHalf());
}
SF_CLONES void StoreBFloat16(const uint8_t* in, size_t pixels, bool planar, const Affine& a,
                             uint16_t* out) {
  planar ? Planar(in, pixels, a, out, ToBFloat16()) : Interleaved(in, pixels, a, out, ToBFloat16());
}

}  // namespace

Affine AffineFor(const TransformOptions& o) {
  // (x / 255 - mean) / std = x * (1 / (255 std)) + (-mean / std)
  Affine a{};
  for (int c = 0; c < 3; ++c) {
    a.scale[c] = static_cast<float>(1.0 / (255.0 * double(o.std[c])));
    a.bias[c] = static_cast<float>(-double(o.mean[c]) / double(o.std[c]));
  }
  return a;
}

void StorePixels(const uint8_t* hwc, size_t pixels, Layout layout, DType dtype, const Affine& a,
                 void* dst) {
  const bool planar = layout == Layout::kNCHW;
  switch (dtype) {
    case DType::kUint8:
      if (planar) {
        PlanarBytes(hwc, pixels, static_cast<uint8_t*>(dst));
      } else if (dst != hwc) {
        std::memcpy(dst, hwc, pixels * 3);
      }
      return;
    case DType::kFloat32:
      return StoreFloat(hwc, pixels, planar, a, static_cast<float*>(dst));
    case DType::kFloat16:
      return StoreHalf(hwc, pixels, planar, a, static_cast<uint16_t*>(dst));
    case DType::kBFloat16:
      return StoreBFloat16(hwc, pixels, planar, a, static_cast<uint16_t*>(dst));
  }
}

uint16_t FloatToHalf(float f) { return Half(f); }
uint16_t FloatToBFloat16(float f) { return BFloat16(f); }

float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  if (exp == 0x1F) return FromBits(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    const float v = float(mant) * FromBits(103u << 23);
    return sign ? -v : v;
  }
  return FromBits(sign | ((exp + 112) << 23) | (mant << 13));
}

}  // namespace shardfeed::reader::internal
