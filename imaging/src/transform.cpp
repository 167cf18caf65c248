// Resampling (bilinear in fixed point here, area averaging by OpenCV imgproc) and pixel
// rearrangements.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "shardfeed/imaging/image.h"

namespace shardfeed::imaging {
namespace {

// Our callers already run one resize per worker thread; OpenCV's own thread pool would only
// oversubscribe the cores.
struct SingleThreadedOpenCv {
  SingleThreadedOpenCv() { cv::setNumThreads(0); }
};

// Bilinear RGB resize in fixed point (see ResizeBilinearRgb in image.h). Separable, vertical pass
// first: each output row blends two source rows over their whole width (contiguous, vectorised)
// into 16-bit samples with 7 fraction bits, then blends two neighbours per output channel from
// that row. Vertical weights have 15 bits, horizontal ones 14; only the last step rounds to a
// whole level, so a value is within about half a level of exact bilinear interpolation.
constexpr int kFracBits = 7;    // fraction bits of the intermediate row's samples
constexpr int kVertBits = 15;   // vertical weights (as _mm256_mulhrs_epi16 takes them)
constexpr int kHorizBits = 14;  // horizontal weights: 255 << 7 times 1 << 14 fits in 31 bits
constexpr int kHorizShift = kFracBits + kHorizBits;

// Where output sample d of `dst` lands in a source of `src` samples: pixel centres aligned, as
// OpenCV's and Pillow's bilinear do ((d + 0.5) * src / dst - 0.5), clamped to the edges.
// `*first` is the left (upper) neighbour, `*weight` the share of the one after it in 1 << bits.
void Tap(uint32_t d, uint32_t src, uint32_t dst, int bits, uint32_t* first, uint32_t* weight) {
  const double f = (d + 0.5) * double(src) / dst - 0.5;
  const uint32_t one = 1u << bits;
  if (f <= 0) {
    *first = 0, *weight = 0;
    return;
  }
  uint32_t s = static_cast<uint32_t>(f);
  uint32_t w = static_cast<uint32_t>(std::lround((f - s) * one));
  if (w == one) ++s, w = 0;
  if (s >= src - 1) s = src - 1, w = 0;  // the pixel after it is the edge replicated
  *first = s, *weight = w;
}

// One output row's vertical blend of rows `a` and `b` (weight `w` on b), `n` samples:
// (a << 7) + round(((b - a) << 7) * w >> 15), exactly what _mm256_mulhrs_epi16 computes.
inline void BlendRowsPortable(const uint8_t* a, const uint8_t* b, uint32_t w, size_t n,
                              int16_t* out) {
  for (size_t i = 0; i < n; ++i) {
    const int32_t d = (int32_t{b[i]} - a[i]) * (1 << kFracBits);
    out[i] = static_cast<int16_t>((a[i] << kFracBits) +
                                  ((d * static_cast<int32_t>(w) + (1 << 14)) >> kVertBits));
  }
}

// The horizontal pass, per output pixel x: the pixel whose first sample is row[at[x]] and the one
// after it, blended with weights wt[x] (low 16 bits: the first's, high 16 bits: the second's).
inline void GatherRowPortable(const int16_t* row, const int32_t* at, const uint32_t* wt, size_t n,
                              uint8_t* out) {
  for (size_t x = 0; x < n; ++x, out += 3) {
    const int16_t* s = row + at[x];
    const int32_t u = static_cast<int32_t>(wt[x] & 0xFFFF), v = static_cast<int32_t>(wt[x] >> 16);
    for (int c = 0; c < 3; ++c) {
      const int32_t r = (s[c] * u + s[c + 3] * v + (1 << (kHorizShift - 1))) >> kHorizShift;
      out[c] = static_cast<uint8_t>(std::min(255, std::max(0, r)));
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define SHARDFEED_RESIZE_SIMD 1
__attribute__((target("avx2"))) void BlendRowsSimd(const uint8_t* a, const uint8_t* b, uint32_t w,
                                                   size_t n, int16_t* out) {
  const __m256i weight = _mm256_set1_epi16(static_cast<int16_t>(w));
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i va =
        _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    const __m256i vb =
        _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    const __m256i d = _mm256_slli_epi16(_mm256_sub_epi16(vb, va), kFracBits);
    const __m256i r =
        _mm256_add_epi16(_mm256_slli_epi16(va, kFracBits), _mm256_mulhrs_epi16(d, weight));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), r);
  }
  BlendRowsPortable(a + i, b + i, w, n - i, out + i);
}

// Four output pixels at a time: each one's two source pixels (six 16-bit samples) come in one
// 16-byte load, a shuffle pairs their channels, and one multiply-add per pixel blends all three.
// (AVX2 gathers were tried first: slower than OpenCV here, as this Xeon's microcode makes
// gathers slow.)
__attribute__((target("ssse3"), always_inline)) inline __m128i BlendPixel(const int16_t* at,
                                                                          uint32_t wt) {
  const __m128i pairs = _mm_setr_epi8(0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11, -1, -1, -1, -1);
  const __m128i s = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at)), pairs);
  const __m128i r = _mm_madd_epi16(s, _mm_set1_epi32(static_cast<int>(wt)));
  return _mm_srai_epi32(_mm_add_epi32(r, _mm_set1_epi32(1 << (kHorizShift - 1))), kHorizShift);
}

__attribute__((target("ssse3"))) void GatherRowSsse3(const int16_t* row, const int32_t* at,
                                                     const uint32_t* wt, size_t n, uint8_t* out) {
  const __m128i compact = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
  size_t x = 0;
  for (; x + 4 <= n; x += 4, out += 12) {
    const __m128i lo =
        _mm_packs_epi32(BlendPixel(row + at[x], wt[x]), BlendPixel(row + at[x + 1], wt[x + 1]));
    const __m128i hi = _mm_packs_epi32(BlendPixel(row + at[x + 2], wt[x + 2]),
                                       BlendPixel(row + at[x + 3], wt[x + 3]));
    const __m128i px = _mm_shuffle_epi8(_mm_packus_epi16(lo, hi), compact);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out), px);
    const uint32_t tail = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_srli_si128(px, 8)));
    std::memcpy(out + 8, &tail, 4);
  }
  GatherRowPortable(row, at + x, wt + x, n - x, out);
}

// Two pixels four apart, x in the low lane and x + 4 in the high one, blended as BlendPixel does.
__attribute__((target("avx2"), always_inline)) inline __m256i BlendPixelPair(const int16_t* row,
                                                                             const int32_t* at,
                                                                             __m256i weights) {
  const __m256i pairs = _mm256_setr_epi8(0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11, -1, -1, -1, -1, 0, 1,
                                         6, 7, 2, 3, 8, 9, 4, 5, 10, 11, -1, -1, -1, -1);
  const __m256i s = _mm256_shuffle_epi8(
      _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + at[0]))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + at[4])), 1),
      pairs);
  const __m256i r = _mm256_madd_epi16(s, weights);
  return _mm256_srai_epi32(_mm256_add_epi32(r, _mm256_set1_epi32(1 << (kHorizShift - 1))),
                           kHorizShift);
}

// Eight output pixels at a time, two per register; the rest four at a time (SSSE3).
__attribute__((target("avx2"))) void GatherRowSimd(const int16_t* row, const int32_t* at,
                                                   const uint32_t* wt, size_t n, uint8_t* out) {
  const __m256i compact8 = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,
                                            0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
  // Pixel x + k's weights in the low lane, x + k + 4's in the high one.
  const __m256i lane0 = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
  const __m256i lane1 = _mm256_setr_epi32(1, 1, 1, 1, 5, 5, 5, 5);
  const __m256i lane2 = _mm256_setr_epi32(2, 2, 2, 2, 6, 6, 6, 6);
  const __m256i lane3 = _mm256_setr_epi32(3, 3, 3, 3, 7, 7, 7, 7);
  size_t x = 0;
  for (; x + 8 <= n; x += 8, out += 24) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wt + x));
    const __m256i ab =
        _mm256_packs_epi32(BlendPixelPair(row, at + x, _mm256_permutevar8x32_epi32(w, lane0)),
                           BlendPixelPair(row, at + x + 1, _mm256_permutevar8x32_epi32(w, lane1)));
    const __m256i cd =
        _mm256_packs_epi32(BlendPixelPair(row, at + x + 2, _mm256_permutevar8x32_epi32(w, lane2)),
                           BlendPixelPair(row, at + x + 3, _mm256_permutevar8x32_epi32(w, lane3)));
    // Lane 0: pixels x..x+3 as RGB0, lane 1: x+4..x+7; then 12 bytes of RGB at each lane's start.
    const __m256i px = _mm256_shuffle_epi8(_mm256_packus_epi16(ab, cd), compact8);
    const __m128i lo = _mm256_castsi256_si128(px), hi = _mm256_extracti128_si256(px, 1);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out), lo);
    const uint32_t lo_tail = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_srli_si128(lo, 8)));
    std::memcpy(out + 8, &lo_tail, 4);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + 12), hi);
    const uint32_t hi_tail = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_srli_si128(hi, 8)));
    std::memcpy(out + 20, &hi_tail, 4);
  }
  GatherRowSsse3(row, at + x, wt + x, n - x, out);
}

bool HaveSimd() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("ssse3");
  return yes;
}
#endif

// Reduces RGB pixels by whole factors `fx` x `fy` into `out`: each output pixel is the mean of the
// fx x fy source pixels it covers, rounded once; a partial last column or row is dropped.
void BoxReduceRgb(const uint8_t* src, uint32_t w, uint32_t h, size_t stride, uint32_t fx,
                  uint32_t fy, std::vector<uint8_t>* out, uint32_t* out_w, uint32_t* out_h) {
  const uint32_t nw = w / fx, nh = h / fy, n = fx * fy;
  const size_t m = size_t{nw} * 3;
  thread_local std::vector<uint32_t> sums_buffer;
  sums_buffer.resize(m);
  uint32_t* sums = sums_buffer.data();
  out->resize(m * nh);
  uint8_t* o = out->data();
  for (uint32_t y = 0; y < nh; ++y, o += m) {
    std::fill(sums, sums + m, 0u);
    for (uint32_t j = 0; j < fy; ++j) {
      const uint8_t* row = src + (size_t{y} * fy + j) * stride;
      if (fx == 1) {
        for (size_t i = 0; i < m; ++i) sums[i] += row[i];
      } else if (fx == 2) {
        for (size_t x = 0; x < nw; ++x, row += 6) {
          sums[3 * x] += uint32_t{row[0]} + row[3];
          sums[3 * x + 1] += uint32_t{row[1]} + row[4];
          sums[3 * x + 2] += uint32_t{row[2]} + row[5];
        }
      } else {
        for (size_t x = 0; x < nw; ++x) {
          for (uint32_t i = 0; i < fx; ++i, row += 3) {
            sums[3 * x] += row[0], sums[3 * x + 1] += row[1], sums[3 * x + 2] += row[2];
          }
        }
      }
    }
    for (size_t i = 0; i < m; ++i) {
      o[i] = static_cast<uint8_t>((sums[i] + n / 2) / n);  // factors of 3+ only: rare
    }
  }
  *out_w = nw, *out_h = nh;
}

}  // namespace

void ResizeBilinearRgb(const uint8_t* src, uint32_t src_w, uint32_t src_h, size_t src_stride,
                       uint8_t* dst, uint32_t dst_w, uint32_t dst_h, size_t dst_stride, bool mirror,
                       bool simd) {
  if (src_w == 0 || src_h == 0 || dst_w == 0 || dst_h == 0) return;
  if (src_stride == 0) src_stride = size_t{src_w} * 3;
  if (dst_stride == 0) dst_stride = size_t{dst_w} * 3;
  // Per thread: every loader worker resizes one sample after another at the same few sizes.
  thread_local std::vector<int32_t> at;
  thread_local std::vector<uint32_t> wt;
  thread_local std::vector<int16_t> row;
  const size_t m = size_t{src_w} * 3;
  at.resize(dst_w);
  wt.resize(dst_w);
  for (uint32_t x = 0; x < dst_w; ++x) {
    uint32_t s = 0, w = 0;
    Tap(x, src_w, dst_w, kHorizBits, &s, &w);
    const uint32_t p = mirror ? dst_w - 1 - x : x;  // mirrored: written right to left
    at[p] = static_cast<int32_t>(size_t{s} * 3);
    wt[p] = ((1u << kHorizBits) - w) | (w << 16);
  }
  // The blended row, then its last pixel again (the right neighbour of the right edge) and
  // samples the 16-byte loads may read past it.
  row.resize(m + 8);
  auto blend = BlendRowsPortable;
  auto gather = GatherRowPortable;
#ifdef SHARDFEED_RESIZE_SIMD
  if (simd && HaveSimd()) blend = BlendRowsSimd, gather = GatherRowSimd;
#else
  (void)simd;
#endif
  for (uint32_t y = 0; y < dst_h; ++y) {
    uint32_t s = 0, w = 0;
    Tap(y, src_h, dst_h, kVertBits, &s, &w);
    const uint8_t* a = src + s * src_stride;
    // Weight 0 reads row a only (its pixel after is past the last row).
    blend(a, w == 0 ? a : a + src_stride, w, m, row.data());
    std::memcpy(row.data() + m, row.data() + m - 3, 3 * sizeof(int16_t));
    std::fill(row.begin() + static_cast<ptrdiff_t>(m) + 3, row.end(), int16_t{0});
    gather(row.data(), at.data(), wt.data(), dst_w, dst + y * dst_stride);
  }
}

void ResizeInto(const uint8_t* src, uint32_t src_w, uint32_t src_h, size_t src_stride,
                uint32_t channels, uint8_t* dst, uint32_t dst_w, uint32_t dst_h, size_t dst_stride,
                bool mirror) {
  static SingleThreadedOpenCv once;
  (void)once;
  if (src_w == 0 || src_h == 0 || dst_w == 0 || dst_h == 0 || channels == 0) return;
  if (src_stride == 0) src_stride = size_t{src_w} * channels;
  if (dst_stride == 0) dst_stride = size_t{dst_w} * channels;
  // Below a 2x reduction bilinear reads every source pixel anyway and aliasing stays small (the
  // reader's DCT-scaled decode leaves such residual ratios). For RGB both steps are ours:
  // OpenCV 4.6's INTER_LINEAR does its horizontal pass in scalar code for 3 channels, and its
  // non-integer INTER_AREA costs about as much as decoding the JPEG (0.9 ms for 460x340 ->
  // 224x224; build/resize_bench, docs/BENCHMARKS.md "Region decode", third pass). Other channel
  // counts use OpenCV.
  const double ratio = std::max(double(src_w) / dst_w, double(src_h) / dst_h);
  if (channels == 3 && (src_w != dst_w || src_h != dst_h)) {
    // RGB: an axis reduced 2x or more is first box-reduced by the whole factor that leaves it
    // under 2x, then bilinear. As antialiased as area averaging, and 2.7-8.5x cheaper than
    // OpenCV's non-integer INTER_AREA (resize_bench).
    if (src_w >= 2 * dst_w || src_h >= 2 * dst_h) {
      thread_local std::vector<uint8_t> reduced;
      const uint32_t fx = std::max<uint32_t>(1, src_w / dst_w);
      const uint32_t fy = std::max<uint32_t>(1, src_h / dst_h);
      if (fx <= 2 && fy <= 2) {
        // Halving is bilinear at exactly 2x (every sample midway between two pixels, weights
        // 1/2 exact in fixed point): the same means, in SIMD. An odd last pixel is dropped.
        const uint32_t hw = src_w / fx, hh = src_h / fy;
        reduced.resize(size_t{hw} * hh * 3);
        ResizeBilinearRgb(src, hw * fx, hh * fy, src_stride, reduced.data(), hw, hh, 0, false);
        src_w = hw, src_h = hh;
      } else {
        BoxReduceRgb(src, src_w, src_h, src_stride, fx, fy, &reduced, &src_w, &src_h);
      }
      src = reduced.data(), src_stride = size_t{src_w} * 3;
    }
    ResizeBilinearRgb(src, src_w, src_h, src_stride, dst, dst_w, dst_h, dst_stride, mirror);
    return;
  }
  const int type = CV_8UC(static_cast<int>(channels));
  cv::Mat in(static_cast<int>(src_h), static_cast<int>(src_w), type, const_cast<uint8_t*>(src),
             src_stride);
  cv::Mat out(static_cast<int>(dst_h), static_cast<int>(dst_w), type, dst, dst_stride);
  if (src_w == dst_w && src_h == dst_h) {
    in.copyTo(out);
  } else {
    cv::resize(in, out, out.size(), 0, 0, ratio >= 2.0 ? cv::INTER_AREA : cv::INTER_LINEAR);
  }
  if (mirror) FlipHorizontal(dst, dst_w, dst_h, channels, dst_stride);
}

void ShortSideSize(uint32_t w, uint32_t h, uint32_t short_side, uint32_t* out_w, uint32_t* out_h) {
  if (w <= h) {
    *out_w = short_side;
    *out_h = std::max<uint32_t>(1, static_cast<uint32_t>(std::lround(double(h) * short_side / w)));
  } else {
    *out_h = short_side;
    *out_w = std::max<uint32_t>(1, static_cast<uint32_t>(std::lround(double(w) * short_side / h)));
  }
}

void ResizeShortSide(const Image& src, uint32_t short_side, bool center_crop, Image* out) {
  ResizeShortSide(src, short_side, center_crop, out, src.width, src.height);
}

void ResizeShortSide(const Image& src, uint32_t short_side, bool center_crop, Image* out,
                     uint32_t source_w, uint32_t source_h) {
  uint32_t rw, rh;
  ShortSideSize(source_w, source_h, short_side, &rw, &rh);
  if (!center_crop) {
    out->Resize(rw, rh, src.channels);
    ResizeInto(src.pixels.data(), src.width, src.height, 0, src.channels, out->pixels.data(), rw,
               rh);
    return;
  }
  // Crop first in source coordinates (the centre square of the short side), then resize: the
  // same pixels as resize-then-crop up to rounding, at a fraction of the work.
  uint32_t side = std::min(src.width, src.height);
  uint32_t x0 = (src.width - side) / 2, y0 = (src.height - side) / 2;
  out->Resize(short_side, short_side, src.channels);
  const uint8_t* origin = src.pixels.data() + (size_t{y0} * src.width + x0) * src.channels;
  ResizeInto(origin, side, side, size_t{src.width} * src.channels, src.channels, out->pixels.data(),
             short_side, short_side);
}

void FlipHorizontal(uint8_t* pixels, uint32_t w, uint32_t h, uint32_t channels, size_t stride) {
  if (stride == 0) stride = size_t{w} * channels;
  for (uint32_t y = 0; y < h; ++y) {
    uint8_t* row = pixels + y * stride;
    for (uint32_t a = 0, b = w - 1; a < b; ++a, --b) {
      for (uint32_t c = 0; c < channels; ++c)
        std::swap(row[a * channels + c], row[b * channels + c]);
    }
  }
}

void OrientBoxes(float* boxes, size_t n, uint32_t w, uint32_t h, int orientation) {
  if (orientation <= 1 || orientation > 8) return;
  const float fw = static_cast<float>(w), fh = static_cast<float>(h);
  // Where a point at pixel edge (x, y) goes: ApplyOrientation's pixel map on edges (a pixel x
  // covers [x, x+1), so x -> w-1-x on pixels is x -> w-x on edges).
  auto map = [&](float x, float y, float* ox, float* oy) {
    switch (orientation) {
      case 2:
        *ox = fw - x, *oy = y;
        break;
      case 3:
        *ox = fw - x, *oy = fh - y;
        break;
      case 4:
        *ox = x, *oy = fh - y;
        break;
      case 5:
        *ox = y, *oy = x;
        break;
      case 6:
        *ox = fh - y, *oy = x;
        break;
      case 7:
        *ox = fh - y, *oy = fw - x;
        break;
      default:
        *ox = y, *oy = fw - x;
        break;  // 8
    }
  };
  for (size_t i = 0; i < n; ++i) {
    float* b = boxes + 4 * i;
    float ax, ay, bx, by;
    map(b[0], b[1], &ax, &ay);
    map(b[2], b[3], &bx, &by);
    b[0] = std::min(ax, bx), b[1] = std::min(ay, by);
    b[2] = std::max(ax, bx), b[3] = std::max(ay, by);
  }
}

void ApplyOrientation(Image* image, int orientation) {
  if (orientation <= 1 || orientation > 8) return;
  const uint32_t w = image->width, h = image->height, ch = image->channels;
  const bool swap = orientation >= 5;  // 5..8 transpose the axes
  const uint32_t ow = swap ? h : w, oh = swap ? w : h;
  Bytes out(image->pixels.size());
  for (uint32_t y = 0; y < h; ++y) {
    for (uint32_t x = 0; x < w; ++x) {
      uint32_t dx, dy;
      switch (orientation) {
        case 2:
          dx = w - 1 - x;
          dy = y;
          break;  // mirror horizontal
        case 3:
          dx = w - 1 - x;
          dy = h - 1 - y;
          break;  // rotate 180
        case 4:
          dx = x;
          dy = h - 1 - y;
          break;  // mirror vertical
        case 5:
          dx = y;
          dy = x;
          break;  // transpose
        case 6:
          dx = h - 1 - y;
          dy = x;
          break;  // rotate 90 clockwise
        case 7:
          dx = h - 1 - y;
          dy = w - 1 - x;
          break;  // transverse
        default:
          dx = y;
          dy = w - 1 - x;
          break;  // 8: rotate 270 clockwise
      }
      std::memcpy(&out[(size_t{dy} * ow + dx) * ch], &image->pixels[(size_t{y} * w + x) * ch], ch);
    }
  }
  image->pixels.swap(out);
  image->width = ow;
  image->height = oh;
}

}  // namespace shardfeed::imaging
