#include "pixel_store.h"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define SF_HAVE_AVX2_PATH 1
#endif

#include "shardfeed/base/clones.h"  // SF_CLONES: an AVX2 clone and a baseline one
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

#ifdef SF_HAVE_AVX2_PATH
// NCHW float output on AVX2+F16C CPUs, written by hand because it is the layout training
// reads and the compilers' code for it leaves speed behind: 16 pixels per step are
// de-interleaved with byte shuffles, converted, multiplied-added, and written with streaming
// (non-temporal) stores: the batch is read later by another core or the GPU copy, so pulling
// its lines into this core's cache first (a read for ownership) is wasted bandwidth.
#define SF_AVX2 __attribute__((target("avx2,f16c")))

SF_AVX2 inline __m128i Pick(__m128i a, __m128i b, __m128i c, __m128i ma, __m128i mb, __m128i mc) {
  return _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, ma), _mm_shuffle_epi8(b, mb)),
                      _mm_shuffle_epi8(c, mc));
}

// 8 values of one channel as float, from the low 8 bytes of `x`.
// A multiply then an add, never a fused multiply-add: every path (this one, the compiled
// loops, built with -ffp-contract=off, and the CUDA kernel) rounds twice, so their outputs are
// bit for bit the same.
SF_AVX2 inline __m256 Lanes(__m128i x, __m256 scale, __m256 bias) {
  return _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(x)), scale), bias);
}

template <bool kStream>
SF_AVX2 inline void Put(float* dst, __m256 v) {
  if (kStream) {
    _mm256_stream_ps(dst, v);
  } else {
    _mm256_storeu_ps(dst, v);
  }
}
template <bool kStream>
SF_AVX2 inline void Put(uint16_t* dst, __m128i v) {
  if (kStream) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst), v);
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), v);
  }
}

SF_AVX2 inline __m128i BFloat16x8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), odd), 16);
  // NaN stays a quiet NaN (the scalar BFloat16's rule).
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  r = _mm256_blendv_epi8(r, quiet, nan);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

// Splits 16 interleaved RGB pixels (48 bytes) into 16 R, 16 G and 16 B bytes.
struct Deinterleave {
  __m128i ra, rb, rc, ga, gb, gc, ba, bb, bc;
  SF_AVX2 Deinterleave() {
    ra = _mm_setr_epi8(0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    rb = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14, -1, -1, -1, -1, -1);
    rc = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 1, 4, 7, 10, 13);
    ga = _mm_setr_epi8(1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    gb = _mm_setr_epi8(-1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1);
    gc = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14);
    ba = _mm_setr_epi8(2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    bb = _mm_setr_epi8(-1, -1, -1, -1, -1, 1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1);
    bc = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15);
  }
  SF_AVX2 void operator()(const uint8_t* p, __m128i ch[3]) const {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i y = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16));
    const __m128i w = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32));
    ch[0] = Pick(x, y, w, ra, rb, rc);
    ch[1] = Pick(x, y, w, ga, gb, gc);
    ch[2] = Pick(x, y, w, ba, bb, bc);
  }
};

SF_AVX2 void PlanarBytesAvx2(const uint8_t* in, size_t pixels, uint8_t* out) {
  const Deinterleave split;
  size_t i = 0;
  for (; i + 16 <= pixels; i += 16) {
    __m128i ch[3];
    split(in + 3 * i, ch);
    for (int c = 0; c < 3; ++c) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + c * pixels + i), ch[c]);
    }
  }
  for (; i < pixels; ++i) {
    for (int c = 0; c < 3; ++c) out[c * pixels + i] = in[3 * i + c];
  }
}

template <typename Out, bool kStream>
SF_AVX2 void PlanarAvx2(const uint8_t* in, size_t pixels, const Affine& a, Out* out, DType dtype) {
  const Deinterleave split;
  const __m256 s[3] = {_mm256_set1_ps(a.scale[0]), _mm256_set1_ps(a.scale[1]),
                       _mm256_set1_ps(a.scale[2])};
  const __m256 b[3] = {_mm256_set1_ps(a.bias[0]), _mm256_set1_ps(a.bias[1]),
                       _mm256_set1_ps(a.bias[2])};
  Out* plane[3] = {out, out + pixels, out + 2 * pixels};
  size_t i = 0;
  for (; i + 16 <= pixels; i += 16) {
    __m128i ch[3];
    split(in + 3 * i, ch);
    for (int c = 0; c < 3; ++c) {
      const __m256 lo = Lanes(ch[c], s[c], b[c]);
      const __m256 hi = Lanes(_mm_srli_si128(ch[c], 8), s[c], b[c]);
      if constexpr (sizeof(Out) == 4) {
        Put<kStream>(plane[c] + i, lo);
        Put<kStream>(plane[c] + i + 8, hi);
      } else if (dtype == DType::kFloat16) {
        Put<kStream>(plane[c] + i, _mm256_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT));
        Put<kStream>(plane[c] + i + 8, _mm256_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT));
      } else {
        Put<kStream>(plane[c] + i, BFloat16x8(lo));
        Put<kStream>(plane[c] + i + 8, BFloat16x8(hi));
      }
    }
  }
  if (kStream) _mm_sfence();  // streaming stores are visible before the sample is reported done
  for (; i < pixels; ++i) {
    for (int c = 0; c < 3; ++c) {
      const float v = float(in[3 * i + c]) * a.scale[c] + a.bias[c];
      if constexpr (sizeof(Out) == 4) {
        plane[c][i] = v;
      } else {
        plane[c][i] = dtype == DType::kFloat16 ? Half(v) : BFloat16(v);
      }
    }
  }
}

// NHWC (channels interleaved) float output: 8 pixels (24 elements, three vectors of 8) per
// step; the channel pattern repeats every 24 elements, so three scale/bias vectors cover it.
template <typename Out, bool kStream>
SF_AVX2 void InterleavedAvx2(const uint8_t* in, size_t pixels, const Affine& a, Out* out,
                             DType dtype) {
  float sp[24], bp[24];
  for (int j = 0; j < 24; ++j) sp[j] = a.scale[j % 3], bp[j] = a.bias[j % 3];
  __m256 s[3], b[3];
  for (int k = 0; k < 3; ++k)
    s[k] = _mm256_loadu_ps(sp + 8 * k), b[k] = _mm256_loadu_ps(bp + 8 * k);
  const size_t n = pixels * 3;
  size_t i = 0;
  for (; i + 24 <= n; i += 24) {
    for (int k = 0; k < 3; ++k) {
      const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(in + i + 8 * k));
      const __m256 v = Lanes(x, s[k], b[k]);
      if constexpr (sizeof(Out) == 4) {
        Put<kStream>(out + i + 8 * k, v);
      } else if (dtype == DType::kFloat16) {
        Put<kStream>(out + i + 8 * k, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
      } else {
        Put<kStream>(out + i + 8 * k, BFloat16x8(v));
      }
    }
  }
  if (kStream) _mm_sfence();
  for (; i < n; ++i) {
    const float v = float(in[i]) * a.scale[i % 3] + a.bias[i % 3];
    if constexpr (sizeof(Out) == 4) {
      out[i] = v;
    } else {
      out[i] = dtype == DType::kFloat16 ? Half(v) : BFloat16(v);
    }
  }
}

bool HaveAvx2Path() {
  // SHARDFEED_NO_AVX2 forces the compiled loops (tests compare the two).
  // (__builtin_cpu_supports knows "avx2", with the OS's AVX state check, but not "f16c" in
  // clang 14: CPUID leaf 1 says that.)
  static const bool have = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    return __builtin_cpu_supports("avx2") && f16c && !std::getenv("SHARDFEED_NO_AVX2");
  }();
  return have;
}

// True when every plane start allows aligned (streaming) stores.
bool PlanesAligned(const void* out, size_t pixels, size_t element, size_t align) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(out);
  return p % align == 0 && (pixels * element) % align == 0;
}

template <typename Out>
bool TryAvx2(const uint8_t* in, size_t pixels, bool planar, const Affine& a, Out* out,
             DType dtype) {
  if (!HaveAvx2Path()) return false;
  const size_t align = sizeof(Out) == 4 ? 32 : 16;
  if (planar) {
    if (PlanesAligned(out, pixels, sizeof(Out), align)) {
      PlanarAvx2<Out, true>(in, pixels, a, out, dtype);
    } else {
      PlanarAvx2<Out, false>(in, pixels, a, out, dtype);
    }
  } else if (reinterpret_cast<uintptr_t>(out) % align == 0) {
    InterleavedAvx2<Out, true>(in, pixels, a, out, dtype);
  } else {
    InterleavedAvx2<Out, false>(in, pixels, a, out, dtype);
  }
  return true;
}
#endif

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
                 void* dst, bool portable) {
  const bool planar = layout == Layout::kNCHW;
  const bool simd = !portable;
  switch (dtype) {
    case DType::kUint8:
      if (planar) {
#ifdef SF_HAVE_AVX2_PATH
        if (simd && HaveAvx2Path()) {  // (uint8 NHWC is a copy, or nothing)
          PlanarBytesAvx2(hwc, pixels, static_cast<uint8_t*>(dst));
          return;
        }
#endif
        PlanarBytes(hwc, pixels, static_cast<uint8_t*>(dst));
      } else if (dst != hwc) {
        std::memcpy(dst, hwc, pixels * 3);
      }
      return;
    case DType::kFloat32:
#ifdef SF_HAVE_AVX2_PATH
      if (simd && TryAvx2(hwc, pixels, planar, a, static_cast<float*>(dst), dtype)) return;
#endif
      return StoreFloat(hwc, pixels, planar, a, static_cast<float*>(dst));
    case DType::kFloat16:
#ifdef SF_HAVE_AVX2_PATH
      if (simd && TryAvx2(hwc, pixels, planar, a, static_cast<uint16_t*>(dst), dtype)) return;
#endif
      return StoreHalf(hwc, pixels, planar, a, static_cast<uint16_t*>(dst));
    case DType::kBFloat16:
#ifdef SF_HAVE_AVX2_PATH
      if (simd && TryAvx2(hwc, pixels, planar, a, static_cast<uint16_t*>(dst), dtype)) return;
#endif
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
