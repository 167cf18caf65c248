// Normalised float output (issue 13): the conversions and the one-pass store against scalar
// references, and the loader's float batches against its uint8 batches.
#include <cmath>
#include <cstring>
#include <random>

#include "../../reader/src/pixel_store.h"
#include "shardfeed/converter/pack.h"
#include "shardfeed/reader/loader.h"
#include "shardfeed/reader/options.h"
#include "test_util.h"

namespace shardfeed::reader {
namespace {

using internal::Affine;
using internal::FloatToBFloat16;
using internal::FloatToHalf;
using internal::HalfToFloat;
using internal::StorePixels;

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The compiler's own float -> _Float16 conversion (round to nearest even) as the reference.
uint16_t ReferenceHalf(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}

// bfloat16 by definition: the nearest of the two bfloat16 neighbours, ties to the even one.
uint16_t ReferenceBFloat16(float f) {
  if (std::isnan(f)) return static_cast<uint16_t>((Bits(f) >> 16) | 0x40);
  const uint32_t lo = Bits(f) & 0xFFFF0000u, hi = lo + 0x10000u;
  // Above the largest bfloat16 the upper neighbour is 2^128 (it rounds to infinity).
  const bool top = (hi & 0x7F800000u) == 0x7F800000u;
  const double d = f, dlo = FromBits(lo);
  const double dhi = top ? std::copysign(std::ldexp(1.0, 128), d) : double(FromBits(hi));
  const double elo = std::fabs(d - dlo), ehi = std::fabs(dhi - d);
  if (elo < ehi || (elo == ehi && ((lo >> 16) & 1) == 0)) return static_cast<uint16_t>(lo >> 16);
  return static_cast<uint16_t>(hi >> 16);
}

TEST_CASE("float16 conversion rounds to nearest even over the whole float range") {
  // Every 97th float bit pattern (44 million values: normals, subnormals, overflow, inf, NaN).
  uint64_t mismatches = 0;
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 97) {
    const float f = FromBits(static_cast<uint32_t>(u));
    const uint16_t got = FloatToHalf(f), want = ReferenceHalf(f);
    if (std::isnan(f)) {
      mismatches += (got & 0x7C00) != 0x7C00 || (got & 0x3FF) == 0;
    } else {
      mismatches += got != want;
    }
  }
  CHECK(mismatches == 0);
  // Exact edges: the largest half, the rounding boundary to infinity, the smallest subnormal.
  CHECK(FloatToHalf(65504.f) == 0x7BFF);
  CHECK(FloatToHalf(65520.f) == 0x7C00);
  CHECK(FloatToHalf(-65520.f) == 0xFC00);
  CHECK(FloatToHalf(std::ldexp(1.f, -24)) == 0x0001);
  CHECK(FloatToHalf(std::ldexp(1.f, -25)) == 0x0000);  // a tie: to even (zero)
  CHECK(HalfToFloat(0x3C00) == 1.f);
  CHECK(HalfToFloat(0x0001) == std::ldexp(1.f, -24));
}

TEST_CASE("bfloat16 conversion rounds to nearest even") {
  uint64_t mismatches = 0;
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 101) {
    const float f = FromBits(static_cast<uint32_t>(u));
    if (std::isinf(f)) continue;
    const uint16_t got = FloatToBFloat16(f), want = ReferenceBFloat16(f);
    if (std::isnan(f)) {
      mismatches += (got & 0x7F80) != 0x7F80 || (got & 0x7F) == 0;
    } else {
      mismatches += got != want;
    }
  }
  CHECK(mismatches == 0);
  CHECK(FloatToBFloat16(1.f) == 0x3F80);
  CHECK(FloatToBFloat16(FromBits(0x3F808000u)) == 0x3F80);  // tie, even stays
  CHECK(FloatToBFloat16(FromBits(0x3F818000u)) == 0x3F82);  // tie, odd rounds up
}

// What StorePixels must write, element by element, computed the obvious way.
template <typename F>
void ForEachReference(const std::vector<uint8_t>& hwc, size_t pixels, Layout layout,
                      const Affine& a, F&& check) {
  for (size_t p = 0; p < pixels; ++p) {
    for (int c = 0; c < 3; ++c) {
      volatile float product = float(hwc[3 * p + c]) * a.scale[c];  // rounded: no contraction
      const float v = product + a.bias[c];
      const size_t at = layout == Layout::kNCHW ? c * pixels + p : 3 * p + c;
      check(at, v, hwc[3 * p + c]);
    }
  }
}

TEST_CASE("StorePixels writes every dtype and layout exactly as the scalar reference") {
  std::mt19937 rng(7);
  TransformOptions o;
  o.dtype = DType::kFloat32;
  o.mean = {0.485f, 0.456f, 0.406f};
  o.std = {0.229f, 0.224f, 0.225f};
  const Affine a = internal::AffineFor(o);
  // Pixel counts around the vector block sizes, so every tail path runs; both the hand-written
  // SIMD path (where the CPU has it) and the compiled loops; aligned and unaligned outputs.
  for (size_t pixels : {1u, 5u, 15u, 16u, 17u, 31u, 33u, 224u * 224u + 3u, 224u * 224u}) {
    std::vector<uint8_t> hwc(pixels * 3);
    for (auto& b : hwc) b = static_cast<uint8_t>(rng());
    for (bool portable : {false, true}) {
      for (Layout layout : {Layout::kNHWC, Layout::kNCHW}) {
        INFO("pixels " << pixels << " layout " << int(layout) << " portable " << portable);
        std::vector<float> f(pixels * 3 + 8);
        StorePixels(hwc.data(), pixels, layout, DType::kFloat32, a, f.data(), portable);
        std::vector<uint16_t> h(pixels * 3 + 8), bf(pixels * 3 + 8);
        StorePixels(hwc.data(), pixels, layout, DType::kFloat16, a, h.data(), portable);
        // One element in: a destination that is not 16- or 32-byte aligned.
        StorePixels(hwc.data(), pixels, layout, DType::kBFloat16, a, bf.data() + 1, portable);
        std::vector<uint8_t> u(pixels * 3);
        StorePixels(hwc.data(), pixels, layout, DType::kUint8, a, u.data(), portable);
        size_t bad = 0;
        ForEachReference(hwc, pixels, layout, a, [&](size_t at, float v, uint8_t x) {
          // A rounded multiply, a rounded add, then the output type: the same bits everywhere.
          bad += Bits(f[at]) != Bits(v);
          bad += h[at] != FloatToHalf(v);
          bad += bf[at + 1] != FloatToBFloat16(v);
          bad += u[at] != x;
        });
        CHECK(bad == 0);
      }
    }
  }
}

TEST_CASE("float batches equal the uint8 batches normalised; NCHW is NHWC transposed") {
  testing::TempDir dir;
  auto src = converter::ScanImageFolder(testing::SampleDir());
  REQUIRE(src.ok());
  converter::PackResult result;
  REQUIRE(converter::Pack(*src, dir / "a", {}, &result).ok());
  auto archive = format::Archive::Open(dir / "a");
  REQUIRE(archive.ok());

  auto read_all = [&](DType dtype, Layout layout, std::vector<std::vector<uint8_t>>* out) {
    LoaderOptions o;
    o.batch_size = 5;
    o.workers = 2;
    o.shuffle = true;
    o.seed = 11;
    o.transform.crop = Crop::kRandom;
    o.transform.flip = true;
    o.transform.size = 24;
    o.transform.layout = layout;
    o.transform.dtype = dtype;
    if (dtype != DType::kUint8) {
      o.transform.mean = {0.5f, 0.4f, 0.3f};
      o.transform.std = {0.25f, 0.2f, 0.3f};
    }
    auto loader = Loader::Create(*archive, o);
    REQUIRE(loader.ok());
    REQUIRE((*loader)->StartEpoch(0).ok());
    for (;;) {
      auto b = (*loader)->Next();
      REQUIRE(b.ok());
      if (!*b) break;
      CHECK(b->dtype() == dtype);
      CHECK(b->image_bytes() == size_t{b->size()} * 24 * 24 * 3 * DTypeSize(dtype));
      out->emplace_back(b->images(), b->images() + b->image_bytes());
    }
  };
  std::vector<std::vector<uint8_t>> u8, f32_nhwc, f32_nchw, f16, bf16;
  read_all(DType::kUint8, Layout::kNHWC, &u8);
  read_all(DType::kFloat32, Layout::kNHWC, &f32_nhwc);
  read_all(DType::kFloat32, Layout::kNCHW, &f32_nchw);
  read_all(DType::kFloat16, Layout::kNCHW, &f16);
  read_all(DType::kBFloat16, Layout::kNHWC, &bf16);
  REQUIRE(u8.size() == f32_nhwc.size());
  const float mean[3] = {0.5f, 0.4f, 0.3f}, sd[3] = {0.25f, 0.2f, 0.3f};
  size_t bad = 0, checked = 0;
  for (size_t b = 0; b < u8.size(); ++b) {
    const size_t n = u8[b].size() / (24 * 24 * 3), plane = 24 * 24;
    auto* f = reinterpret_cast<const float*>(f32_nhwc[b].data());
    auto* fc = reinterpret_cast<const float*>(f32_nchw[b].data());
    auto* h = reinterpret_cast<const uint16_t*>(f16[b].data());
    auto* bf = reinterpret_cast<const uint16_t*>(bf16[b].data());
    for (size_t s = 0; s < n; ++s) {
      for (size_t p = 0; p < plane; ++p) {
        for (int c = 0; c < 3; ++c) {
          const size_t hwc = (s * plane + p) * 3 + c, chw = (s * 3 + c) * plane + p;
          const float want = (u8[b][hwc] / 255.f - mean[c]) / sd[c];
          bad += std::fabs(f[hwc] - want) > 2e-6f * std::max(1.f, std::fabs(want));
          bad += fc[chw] != f[hwc];  // NCHW holds exactly NHWC's values, transposed
          bad += std::fabs(HalfToFloat(h[chw]) - want) > std::ldexp(std::fabs(want), -10) + 1e-6f;
          bad += std::fabs(FromBits(uint32_t{bf[hwc]} << 16) - want) >
                 std::ldexp(std::fabs(want), -8) + 1e-6f;
          ++checked;
        }
      }
    }
  }
  CHECK(checked == 36 * 24 * 24 * 3);
  CHECK(bad == 0);
}

TEST_CASE("normalisation options are validated") {
  TransformOptions o;
  o.mean = {0.5f, 0.5f, 0.5f};
  CHECK(ValidateTransform(o).code() == StatusCode::kInvalidArgument);  // uint8 + mean
  o.dtype = DType::kFloat16;
  CHECK(ValidateTransform(o).ok());
  o.std = {1.f, 0.f, 1.f};
  CHECK(ValidateTransform(o).message().find("std") != std::string::npos);
  o.std = {1.f, NAN, 1.f};
  CHECK(!ValidateTransform(o).ok());
  o.std = {1.f, 1e-4f, 1.f};  // +-inf in float16 outputs
  CHECK(ValidateTransform(o).message().find("at least 0.001") != std::string::npos);
  o.std = {1.f, 1.f, 1.f};
  o.mean = {123.7f, 116.3f, 103.5f};  // 0..255 units
  CHECK(ValidateTransform(o).message().find("0..1 units") != std::string::npos);
  o.mean = {0.5f, 0.5f, 0.5f};
  CHECK(!ParseDType("float64").ok());
  CHECK(*ParseDType("bfloat16") == DType::kBFloat16);
  LoaderOptions lo;
  CHECK(SetLoaderOption(&lo, "mean", "1,2").message() ==
        "mean (--mean) must be one number or three (R,G,B), or archive, not '1,2'");
  CHECK(!SetLoaderOption(&lo, "mean", "1,x,2").ok());
  REQUIRE(SetLoaderOption(&lo, "std", "0.5").ok());
  CHECK(lo.transform.std[2] == 0.5f);
  CHECK(SetLoaderOption(&lo, "dtype", "float64").message() ==
        "dtype (--dtype) must be one of uint8, float32, float16, bfloat16, not 'float64'");
}

}  // namespace
}  // namespace shardfeed::reader
