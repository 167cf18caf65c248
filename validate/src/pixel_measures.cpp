#include "pixel_measures.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <limits>

// The XXH3 that picks AVX2 where the CPU has it (the same hash either way).
#include <xxh_x86dispatch.h>

#include "shardfeed/base/clones.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SF_HAVE_AVX2_SUMS 1
#endif

// SF_CLONES (base/clones.h) only on integer loops, whose results cannot depend on the clone.

namespace shardfeed::validate {
namespace {

// Sums in 48 lanes (16 pixels; lane k holds channel k % 3) of 32 bits that the compiler
// vectorises for any x86-64, flushed to 64 bits every 4096 blocks (4096 * 255^2 < 2^32).
void AddSumsPortable(const uint8_t* p, size_t bytes, uint64_t sum[3], uint64_t squares[3]) {
  const size_t blocks = bytes / 48;
  for (size_t b0 = 0; b0 < blocks; b0 += 4096) {
    uint32_t s[48] = {}, q[48] = {};
    const size_t b1 = std::min(blocks, b0 + 4096);
    for (size_t b = b0; b < b1; ++b) {
      const uint8_t* v = p + b * 48;
      for (int k = 0; k < 48; ++k) s[k] += v[k], q[k] += uint32_t(v[k]) * v[k];
    }
    for (int k = 0; k < 48; ++k) sum[k % 3] += s[k], squares[k % 3] += q[k];
  }
  for (size_t i = blocks * 48; i < bytes; ++i) {
    sum[i % 3] += p[i], squares[i % 3] += uint32_t(p[i]) * p[i];
  }
}

#ifdef SF_HAVE_AVX2_SUMS
// Adds a SIMD kernel's stored accumulators into the per-channel sums: pass m of W-byte vectors
// (W = 32 for AVX2, 64 for AVX-512), sv[h] the 16-bit sums of the unpacked halves h and qv[h]
// the 32-bit squares. Unpack works within 128-bit quarters, so word w of sv[h] is byte
// 16 (w / 8) + 8 h + w % 8 of the vector, and dword i of qv[h] is byte 16 (i / 4) + 4 h + i % 4.
template <int W>
void FoldLanes(int m, const uint16_t (&sv)[2][W / 2], const uint32_t (&qv)[4][W / 4],
               uint64_t sum[3], uint64_t squares[3]) {
  for (int h = 0; h < 2; ++h) {
    for (int w = 0; w < W / 2; ++w) sum[(W * m + 16 * (w / 8) + 8 * h + w % 8) % 3] += sv[h][w];
  }
  for (int h = 0; h < 4; ++h) {
    for (int i = 0; i < W / 4; ++i) squares[(W * m + 16 * (i / 4) + 4 * h + i % 4) % 3] += qv[h][i];
  }
}

// The same sums with AVX2, 2.5x faster than the portable loop (3.4 GB/s against 1.3 on the
// bench machine) and 5x faster than the per-row loop this replaced. Byte i of a 96-byte
// chunk (32 pixels) and byte i of the next chunk are the same channel, so interleaving two
// chunks' 32-byte vectors (x, y) keeps each 16-bit lane of maddubs(xy, 1) = x + y and each
// 32-bit lane of madd(xy16, xy16) = x^2 + y^2 to one channel. The three 32-byte vectors of a
// chunk (m = 0, 1, 2) start on different channels: one pass per m, six accumulators each.
__attribute__((target("avx2"))) void AddSumsAvx2(const uint8_t* p, size_t bytes, uint64_t sum[3],
                                                 uint64_t squares[3]) {
  const size_t pairs = bytes / 192;
  const __m256i zero = _mm256_setzero_si256(), ones = _mm256_set1_epi8(1);
  for (int m = 0; m < 3; ++m) {
    // 128 pairs: 16-bit sums up to 128 * 510 < 2^16; 32-bit squares up to 128 * 130050.
    for (size_t k0 = 0; k0 < pairs; k0 += 128) {
      const size_t k1 = std::min(pairs, k0 + 128);
      __m256i s[2] = {zero, zero}, q[4] = {zero, zero, zero, zero};
      for (size_t k = k0; k < k1; ++k) {
        const uint8_t* v = p + k * 192 + 32 * m;
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v));
        const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 96));
        const __m256i a = _mm256_unpacklo_epi8(x, y), b = _mm256_unpackhi_epi8(x, y);
        s[0] = _mm256_add_epi16(s[0], _mm256_maddubs_epi16(a, ones));
        s[1] = _mm256_add_epi16(s[1], _mm256_maddubs_epi16(b, ones));
        const __m256i al = _mm256_unpacklo_epi8(a, zero), ah = _mm256_unpackhi_epi8(a, zero);
        const __m256i bl = _mm256_unpacklo_epi8(b, zero), bh = _mm256_unpackhi_epi8(b, zero);
        q[0] = _mm256_add_epi32(q[0], _mm256_madd_epi16(al, al));
        q[1] = _mm256_add_epi32(q[1], _mm256_madd_epi16(ah, ah));
        q[2] = _mm256_add_epi32(q[2], _mm256_madd_epi16(bl, bl));
        q[3] = _mm256_add_epi32(q[3], _mm256_madd_epi16(bh, bh));
      }
      alignas(32) uint16_t sv[2][16];
      alignas(32) uint32_t qv[4][8];
      for (int h = 0; h < 2; ++h) _mm256_store_si256(reinterpret_cast<__m256i*>(sv[h]), s[h]);
      for (int h = 0; h < 4; ++h) _mm256_store_si256(reinterpret_cast<__m256i*>(qv[h]), q[h]);
      FoldLanes<32>(m, sv, qv, sum, squares);
    }
  }
  AddSumsPortable(p + pairs * 192, bytes - pairs * 192, sum, squares);
}

// The AVX2 kernel at twice the width (AVX-512BW): byte i of a 192-byte chunk (64 pixels) and
// byte i of the next are the same channel; the lane maps of AddSumsAvx2 hold for the four
// 128-bit quarters. 1.5x the AVX2 kernel on the bench machine, which read the pixels from
// cache at 1 byte a cycle with it.
__attribute__((target("avx512f,avx512bw"))) void AddSumsAvx512(const uint8_t* p, size_t bytes,
                                                               uint64_t sum[3],
                                                               uint64_t squares[3]) {
  const size_t pairs = bytes / 384;
  const __m512i zero = _mm512_setzero_si512(), ones = _mm512_set1_epi8(1);
  for (int m = 0; m < 3; ++m) {
    for (size_t k0 = 0; k0 < pairs; k0 += 128) {  // the AVX2 kernel's bounds, per lane
      const size_t k1 = std::min(pairs, k0 + 128);
      __m512i s[2] = {zero, zero}, q[4] = {zero, zero, zero, zero};
      for (size_t k = k0; k < k1; ++k) {
        const uint8_t* v = p + k * 384 + 64 * m;
        const __m512i x = _mm512_loadu_si512(v);
        const __m512i y = _mm512_loadu_si512(v + 192);
        const __m512i a = _mm512_unpacklo_epi8(x, y), b = _mm512_unpackhi_epi8(x, y);
        s[0] = _mm512_add_epi16(s[0], _mm512_maddubs_epi16(a, ones));
        s[1] = _mm512_add_epi16(s[1], _mm512_maddubs_epi16(b, ones));
        const __m512i al = _mm512_unpacklo_epi8(a, zero), ah = _mm512_unpackhi_epi8(a, zero);
        const __m512i bl = _mm512_unpacklo_epi8(b, zero), bh = _mm512_unpackhi_epi8(b, zero);
        q[0] = _mm512_add_epi32(q[0], _mm512_madd_epi16(al, al));
        q[1] = _mm512_add_epi32(q[1], _mm512_madd_epi16(ah, ah));
        q[2] = _mm512_add_epi32(q[2], _mm512_madd_epi16(bl, bl));
        q[3] = _mm512_add_epi32(q[3], _mm512_madd_epi16(bh, bh));
      }
      alignas(64) uint16_t sv[2][32];
      alignas(64) uint32_t qv[4][16];
      for (int h = 0; h < 2; ++h) _mm512_store_si512(sv[h], s[h]);
      for (int h = 0; h < 4; ++h) _mm512_store_si512(qv[h], q[h]);
      FoldLanes<64>(m, sv, qv, sum, squares);
    }
  }
  AddSumsAvx2(p + pairs * 384, bytes - pairs * 384, sum, squares);
}

bool force_portable = false;  // ForcePortablePixelLoops
bool force_avx2 = false;      // ForceAvx2PixelLoops

bool HaveAvx2() {
  static const bool have = __builtin_cpu_supports("avx2");
  return have && !force_portable;
}
bool HaveAvx512() {
  static const bool have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return have && !force_portable && !force_avx2;
}
#endif

// cos((2x + 1) u pi / 64) for the 8 lowest frequencies u over 32 samples x.
const std::array<std::array<double, 32>, 8>& CosTable() {
  static const auto table = [] {
    std::array<std::array<double, 32>, 8> t{};
    for (int u = 0; u < 8; ++u) {
      for (int x = 0; x < 32; ++x) t[u][x] = std::cos((2 * x + 1) * u * M_PI / 64.0);
    }
    return t;
  }();
  return table;
}

}  // namespace

void ForcePortablePixelLoops(bool portable) {
#ifdef SF_HAVE_AVX2_SUMS
  force_portable = portable;
#else
  (void)portable;
#endif
}

void ForceAvx2PixelLoops(bool avx2) {
#ifdef SF_HAVE_AVX2_SUMS
  force_avx2 = avx2;
#else
  (void)avx2;
#endif
}

void PixelSums::Add(const uint8_t* rgb, size_t count) {
#ifdef SF_HAVE_AVX2_SUMS
  if (HaveAvx512()) {
    AddSumsAvx512(rgb, count * 3, sum, squares);
    pixels += count;
    return;
  }
  if (HaveAvx2()) {
    AddSumsAvx2(rgb, count * 3, sum, squares);
    pixels += count;
    return;
  }
#endif
  AddSumsPortable(rgb, count * 3, sum, squares);
  pixels += count;
}

void PixelSums::Merge(const PixelSums& o) {
  pixels += o.pixels;
  for (int c = 0; c < 3; ++c) sum[c] += o.sum[c], squares[c] += o.squares[c];
}

namespace {

// Luma of the pixels at byte offsets columns[0..w) of `row` into out[0..w); returns R ^ G | G ^ B
// over them (0: all gray). 4-byte reads are allowed at the first `wide` offsets.
// Adds their sum and sum of squares to *sum and *squares.
uint32_t SampleRowPortable(const uint8_t* row, const uint32_t* columns, uint32_t begin, uint32_t w,
                           uint16_t* out, uint64_t* sum, uint64_t* squares) {
  uint32_t bits = 0;
  uint64_t s = 0, q = 0;
  for (uint32_t x = begin; x < w; ++x) {
    const uint8_t* p = row + columns[x];
    const uint32_t r = p[0], g = p[1], b = p[2];
    const uint32_t l = 77 * r + 150 * g + 29 * b;
    out[x] = uint16_t(l);
    s += l, q += uint64_t{l} * l;
    bits |= (r ^ g) | (g ^ b);
  }
  *sum += s, *squares += q;
  return bits;
}

#ifdef SF_HAVE_AVX2_SUMS
// Eight samples at a time: one gather of R, G, B (and the next byte) per pixel, luma by madd.
// Luma sums in the same registers: 32-bit lanes for the sum (a row of at most 256 samples puts
// at most 32 * 65280 in a lane), 64-bit lanes for the squares (each < 2^32).
__attribute__((target("avx2"))) uint32_t SampleRowAvx2(const uint8_t* row, const uint32_t* columns,
                                                       uint32_t w, uint32_t wide, uint16_t* out,
                                                       uint64_t* sum, uint64_t* squares) {
  const __m256i low = _mm256_set1_epi32(0x00FF00FF), rb = _mm256_set1_epi32(29 << 16 | 77),
                g_ = _mm256_set1_epi32(150), rgb_mask = _mm256_set1_epi32(0xFFFF);
  __m256i bits = _mm256_setzero_si256(), ls = _mm256_setzero_si256(), lq = _mm256_setzero_si256();
  uint32_t x = 0;
  for (; x + 8 <= wide; x += 8) {
    const __m256i at = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(columns + x));
    const __m256i d = _mm256_i32gather_epi32(reinterpret_cast<const int*>(row), at, 1);
    const __m256i r_b = _mm256_and_si256(d, low);                        // R, B as 16-bit
    const __m256i g_n = _mm256_and_si256(_mm256_srli_epi32(d, 8), low);  // G, next
    const __m256i l = _mm256_add_epi32(_mm256_madd_epi16(r_b, rb), _mm256_madd_epi16(g_n, g_));
    ls = _mm256_add_epi32(ls, l);
    lq = _mm256_add_epi64(lq, _mm256_mul_epu32(l, l));
    const __m256i odd = _mm256_srli_epi64(l, 32);
    lq = _mm256_add_epi64(lq, _mm256_mul_epu32(odd, odd));
    bits = _mm256_or_si256(
        bits, _mm256_and_si256(_mm256_xor_si256(d, _mm256_srli_epi32(d, 8)), rgb_mask));
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(l, l), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + x), _mm256_castsi256_si128(packed));
  }
  alignas(32) uint32_t lanes[8], sums[8];
  alignas(32) uint64_t quads[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), bits);
  _mm256_store_si256(reinterpret_cast<__m256i*>(sums), ls);
  _mm256_store_si256(reinterpret_cast<__m256i*>(quads), lq);
  uint32_t any = 0;
  for (uint32_t v : lanes) any |= v;
  for (uint32_t v : sums) *sum += v;
  for (uint64_t v : quads) *squares += v;
  return any | SampleRowPortable(row, columns, x, w, out, sum, squares);
}
#endif

uint32_t SampleRow(const uint8_t* row, const uint32_t* columns, uint32_t w, uint32_t wide,
                   uint16_t* out, uint64_t* sum, uint64_t* squares) {
#ifdef SF_HAVE_AVX2_SUMS
  if (HaveAvx2()) return SampleRowAvx2(row, columns, w, wide, out, sum, squares);
#endif
  (void)wide;
  return SampleRowPortable(row, columns, 0, w, out, sum, squares);
}

// The luma image is sampled a band of rows at a time (SampleRowsFrom), then measured (Finish).
struct LumaPass {
  uint32_t width, height, f, w, h;
  uint32_t left;                  // rows of the reduced image not sampled yet: 0 .. left - 1
  uint32_t differ = 0;            // any bit set: some sampled pixel has R != G or G != B
  uint64_t sum = 0, squares = 0;  // of the samples so far
  PixelScratch* sc;

  LumaPass(uint32_t width, uint32_t height, PixelScratch* scratch)
      : width(width), height(height), f((std::max(width, height) + 255) / 256), sc(scratch) {
    w = std::max<uint32_t>(1, width / f), h = std::max<uint32_t>(1, height / f);
    left = h;
    sc->luma.resize(size_t{w} * h);
    sc->columns.resize(w);
    for (uint32_t x = 0; x < w; ++x) sc->columns[x] = std::min(width - 1, x * f + f / 2) * 3;
  }
  uint32_t SourceRow(uint32_t yo) const { return std::min(height - 1, yo * f + f / 2); }

  // Point samples, not block averages: a box filter over every pixel cost more than the JPEG
  // decode, and the hash averages 32 x 32 cells of these samples anyway. Samples the rows of
  // the reduced image not sampled yet whose source rows are at or below `y_begin`: called with
  // the image's bands from the last up (MeasurePixels' order).
  void SampleRowsFrom(const uint8_t* rgb, uint32_t y_begin) {
    for (; left > 0 && SourceRow(left - 1) >= y_begin; --left) {
      const uint32_t y = SourceRow(left - 1);
      // Gathers read 4 bytes a pixel: the last pixel of the last row has no 4th.
      const uint32_t wide = y + 1 < height ? w : w - 1;
      differ |= SampleRow(rgb + size_t{y} * width * 3, sc->columns.data(), w, wide,
                          sc->luma.data() + size_t{left - 1} * w, &sum, &squares);
    }
  }
  LumaMeasures Finish() const;
};

}  // namespace

LumaMeasures MeasureLuma(const uint8_t* rgb, uint32_t width, uint32_t height, PixelScratch* sc) {
  LumaPass pass(width, height, sc);
  pass.SampleRowsFrom(rgb, 0);
  return pass.Finish();
}

PixelMeasures MeasurePixels(const uint8_t* rgb, uint32_t width, uint32_t height, PixelScratch* sc) {
  LumaPass luma(width, height, sc);
  PixelMeasures m;
  const size_t row = size_t{width} * 3;
  const uint32_t band = uint32_t(std::max<size_t>(1, (32 << 10) / std::max<size_t>(1, row)));
  // The last band first: the decoder wrote the image top down, so its last rows are the ones
  // still in the cache, and they are read before the first rows' reading evicts them.
  for (uint32_t k = (height + band - 1) / band; k-- > 0;) {
    const uint32_t y = k * band, y_end = std::min(height, y + band);
    m.sums.Add(rgb + y * row, size_t{y_end - y} * width);
    luma.SampleRowsFrom(rgb, y);
  }
  m.luma = luma.Finish();
  // Equal pixels give equal sums, sizes and perceptual hashes: a key that groups every set of
  // equal images (and, rarely, a few images that only share these).
  const uint64_t fields[9] = {uint64_t{width} << 32 | height,
                              m.sums.sum[0],
                              m.sums.sum[1],
                              m.sums.sum[2],
                              m.sums.squares[0],
                              m.sums.squares[1],
                              m.sums.squares[2],
                              m.luma.phash,
                              m.luma.gray};
  m.key = XXH3_64bits(fields, sizeof fields);
  return m;
}

uint64_t PixelHash(const uint8_t* rgb, uint32_t width, uint32_t height) {
  return XXH3_64bits_withSeed(rgb, size_t{width} * height * 3, (uint64_t{width} << 32) | height);
}

namespace {

// Integer loops over the reduced luma image, vectorised for AVX2 where the CPU has it (the same
// integers either way).
// Sum and sum of squares of the 4-neighbour Laplacian over the inner pixels (|l| <= 4 * 65280).
SF_CLONES void LaplacianSums(const uint16_t* luma, uint32_t w, uint32_t h, int64_t* sum,
                             uint64_t* squares) {
  int64_t ls = 0;
  uint64_t lq = 0;
  for (uint32_t y = 1; y + 1 < h && w > 2; ++y) {
    const uint16_t *c = luma + size_t{y} * w, *up = c - w, *down = c + w;
    int32_t rs = 0;  // at most 254 * 261120
    for (uint32_t x = 1; x + 1 < w; ++x) {
      const int32_t l = int32_t(c[x - 1]) + c[x + 1] + up[x] + down[x] - 4 * int32_t(c[x]);
      const uint32_t a = uint32_t(l < 0 ? -l : l);
      rs += l;
      lq += uint64_t{a} * a;
    }
    ls += rs;
  }
  *sum = ls, *squares = lq;
}

#ifdef SF_HAVE_AVX2_SUMS
// The same sums, eight pixels at a time: the Laplacian in 32-bit lanes (a row's sum too: at most
// 32 * 261120 a lane), its squares in 64-bit lanes by two signed 32 x 32 multiplies. 2-3x the
// compiler's clone of the loop above, which widened every term to 64 bits.
// Eight u16 as 32-bit lanes.
__attribute__((target("avx2"), always_inline)) inline __m256i Widen8(const uint16_t* p) {
  return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

__attribute__((target("avx2"))) void LaplacianSumsAvx2(const uint16_t* luma, uint32_t w, uint32_t h,
                                                       int64_t* sum, uint64_t* squares) {
  int64_t ls = 0;
  uint64_t lq = 0;
  __m256i q = _mm256_setzero_si256();
  for (uint32_t y = 1; y + 1 < h && w > 2; ++y) {
    const uint16_t *c = luma + size_t{y} * w, *up = c - w, *down = c + w;
    __m256i rs = _mm256_setzero_si256();
    uint32_t x = 1;
    for (; x + 9 <= w; x += 8) {  // x .. x + 7 inner, x + 8 read
      const __m256i n = _mm256_add_epi32(_mm256_add_epi32(Widen8(c + x - 1), Widen8(c + x + 1)),
                                         _mm256_add_epi32(Widen8(up + x), Widen8(down + x)));
      const __m256i l = _mm256_sub_epi32(n, _mm256_slli_epi32(Widen8(c + x), 2));
      rs = _mm256_add_epi32(rs, l);
      const __m256i odd = _mm256_srli_epi64(l, 32);
      q = _mm256_add_epi64(q, _mm256_add_epi64(_mm256_mul_epi32(l, l), _mm256_mul_epi32(odd, odd)));
    }
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), rs);
    for (int32_t v : lanes) ls += v;
    for (; x + 1 < w; ++x) {
      const int32_t l = int32_t(c[x - 1]) + c[x + 1] + up[x] + down[x] - 4 * int32_t(c[x]);
      const uint32_t a = uint32_t(l < 0 ? -l : l);
      ls += l;
      lq += uint64_t{a} * a;
    }
  }
  alignas(32) uint64_t quads[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(quads), q);
  for (uint64_t v : quads) lq += v;
  *sum = ls, *squares = lq;
}
#endif

// 32-bit sums: twice the lanes of 64-bit ones, and a cell's rows (at most ceil(height / 32),
// 8 for the reduced images) hold at most 65536 x 65535 < 2^32 for heights up to 2^21.
SF_CLONES void AddRow(const uint16_t* row, uint32_t width, uint32_t* columns) {
  for (uint32_t x = 0; x < width; ++x) columns[x] += row[x];
}
SF_CLONES void AddRow(const uint16_t* row, uint32_t width, uint64_t* columns) {
  for (uint32_t x = 0; x < width; ++x) columns[x] += row[x];
}

// Sums of the 32 x 32 cells of LumaHash (cell cx spans columns edge[cx] .. edge[cx + 1] - 1).
template <typename Sum>
void CellSums(const uint16_t* image, uint32_t width, uint32_t height, const uint32_t edge[33],
              uint64_t cells[32][32]) {
  std::vector<Sum> columns(width);  // one row of cells, summed down its rows
  for (uint32_t cy = 0, y = 0; cy < 32; ++cy) {
    std::fill(columns.begin(), columns.end(), 0);
    for (; y < height && uint64_t{y} * 32 / height == cy; ++y) {
      AddRow(image + size_t{y} * width, width, columns.data());
    }
    for (int cx = 0; cx < 32; ++cx) {
      for (uint32_t x = edge[cx]; x < edge[cx + 1]; ++x) cells[cy][cx] += columns[x];
    }
  }
}

}  // namespace

LumaMeasures LumaPass::Finish() const {
  LumaMeasures m;
  m.gray = differ == 0;
  const uint16_t* luma = sc->luma.data();
  const double n = double(w) * h, mean = double(sum) / n;
  m.mean = float(mean / kLumaScale);
  m.std = float(std::sqrt(std::max(0.0, double(squares) / n - mean * mean)) / kLumaScale);
  // Variance of the 4-neighbour Laplacian, in exact integers.
  int64_t ls = 0;
  uint64_t lq = 0;
#ifdef SF_HAVE_AVX2_SUMS
  if (HaveAvx2()) {
    LaplacianSumsAvx2(luma, w, h, &ls, &lq);
  } else {
    LaplacianSums(luma, w, h, &ls, &lq);
  }
#else
  LaplacianSums(luma, w, h, &ls, &lq);
#endif
  const uint64_t ln = w > 2 && h > 2 ? uint64_t{w - 2} * (h - 2) : 0;
  if (ln) {
    const double ml = double(ls) / double(ln);
    m.laplacian = float((double(lq) / double(ln) - ml * ml) / (double(kLumaScale) * kLumaScale));
  } else {  // under 3 rows or columns: no Laplacian to measure, so no sign of blur (not 0)
    m.laplacian = std::numeric_limits<float>::infinity();
  }
  m.phash = LumaHash(luma, w, h);
  return m;
}

uint64_t LumaHash(const uint16_t* image, uint32_t width, uint32_t height) {
  double luma[32][32] = {};
  if (width >= 32 && height >= 32) {
    // Area averages: pixel (x, y) is in cell (32 x / width, 32 y / height); cell cx spans columns
    // edge[cx] .. edge[cx + 1] - 1.
    uint32_t edge[33];
    for (uint32_t c = 0; c <= 32; ++c) edge[c] = uint32_t((uint64_t{c} * width + 31) / 32);
    uint64_t cells[32][32] = {};
    if (height <= (uint32_t{1} << 21)) {
      CellSums<uint32_t>(image, width, height, edge, cells);
    } else {
      CellSums<uint64_t>(image, width, height, edge, cells);
    }
    for (uint32_t cy = 0; cy < 32; ++cy) {
      const uint64_t rows =
          (uint64_t(cy + 1) * height + 31) / 32 - (uint64_t(cy) * height + 31) / 32;
      for (int cx = 0; cx < 32; ++cx) {
        const uint64_t n = std::max<uint64_t>(1, rows * (edge[cx + 1] - edge[cx]));
        luma[cy][cx] = double(cells[cy][cx]) / double(n) / kLumaScale;
      }
    }
  } else {
    for (int cy = 0; cy < 32; ++cy) {
      for (int cx = 0; cx < 32; ++cx) {
        luma[cy][cx] =
            double(image[size_t{cy * height / 32} * width + cx * width / 32]) / kLumaScale;
      }
    }
  }
  const auto& c = CosTable();
  double rows[32][8];  // each row's 8 lowest frequencies
  for (int y = 0; y < 32; ++y) {
    for (int u = 0; u < 8; ++u) {
      double s = 0;
      for (int x = 0; x < 32; ++x) s += luma[y][x] * c[u][x];
      rows[y][u] = s;
    }
  }
  double coef[64];
  for (int v = 0; v < 8; ++v) {
    for (int u = 0; u < 8; ++u) {
      double s = 0;
      for (int y = 0; y < 32; ++y) s += rows[y][u] * c[v][y];
      coef[v * 8 + u] = s;
    }
  }
  double ac[63];
  std::copy(coef + 1, coef + 64, ac);
  std::nth_element(ac, ac + 31, ac + 63);
  const double median = ac[31];
  uint64_t hash = 0;
  for (int i = 0; i < 64; ++i) {
    if (coef[i] > median) hash |= uint64_t{1} << i;
  }
  return hash;
}

}  // namespace shardfeed::validate
