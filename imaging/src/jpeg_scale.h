// Which DCT scale a region decode uses, and whether libjpeg-turbo's chroma upsampling at that
// scale reads across block edges: shared by the decoder and the synthetic-JPEG builder, which
// must agree on how much context a region needs.
#pragma once

#include <cstdint>
#include <cstdio>
// clang-format off
#include <jpeglib.h>
// clang-format on

#include "shardfeed/imaging/image.h"

namespace shardfeed::imaging::internal {

// The narrowest an exact region decode crops (pixels at the decode's scale), and so the narrowest
// synthetic image of a region: libjpeg-turbo upsamples a component under 2 samples wide without
// interpolation, unlike the same component in the whole image. 16 covers a 4x subsampled chroma.
constexpr uint32_t kMinExactWidth = 16;

// The n of the n/8 scale DecodeJpegRegion picks for a region of `rw` x `rh` stored pixels (see
// JpegRegion): the smallest whose output still covers the minimum size, among 1, 2, 4, 8 unless
// any n is allowed.
inline int PickJpegScale(uint32_t rw, uint32_t rh, const JpegRegion& region) {
  auto scaled = [](uint32_t side, int n) { return (uint64_t{side} * unsigned(n) + 7) / 8; };
  for (int n = 1; n < 8 && region.min_width + region.min_height > 0; ++n) {
    if (!region.any_scale && (n & (n - 1)) != 0) continue;
    if (scaled(rw, n) >= region.min_width && scaled(rh, n) >= region.min_height) return n;
  }
  return 8;
}

// Whether decoding at scale n/8 upsamples some component horizontally (`*across_x`) or
// vertically (`*across_y`). Fancy (triangle) upsampling reads the neighbouring chroma samples,
// so only then does a region need decoded context beyond its own blocks. libjpeg-turbo first
// scales chroma up inside the IDCT where a power of two allows (jdmaster.c,
// jpeg_calc_output_dimensions: 4:2:0 at 1/8, 2/8 and 4/8 needs no upsampling at all); this is
// that rule, for components with sampling factors h[i] x v[i].
inline void UpsamplesAcross(const int* h, const int* v, int components, int n, bool* across_x,
                            bool* across_y) {
  int hmax = 1, vmax = 1;
  for (int i = 0; i < components; ++i)
    hmax = h[i] > hmax ? h[i] : hmax, vmax = v[i] > vmax ? v[i] : vmax;
  *across_x = *across_y = false;
  for (int i = 0; i < components; ++i) {
    int size = n;
    while (size < 8 && (hmax * n) % (h[i] * size * 2) == 0 && (vmax * n) % (v[i] * size * 2) == 0) {
      size *= 2;
    }
    if (h[i] * size != hmax * n) *across_x = true;
    if (v[i] * size != vmax * n) *across_y = true;
  }
}

// After jpeg_start_decompress: whether any component is upsampled across block edges
// horizontally (`*across_x`) or vertically (`*across_y`) at the chosen scale, and whether
// jpeg_crop_scanline crops this image correctly (the return value). libjpeg-turbo 2.1's
// jpeg_crop_scanline sizes a component as if its IDCT were not scaled up: one that is, and still
// upsampled, is upsampled over half its width (luma 4x2 or 2x4 over 1x1 chroma at 4/8 and below,
// or 3/8 and 7/8), leaving columns unwritten. Such rare files decode whole rows.
inline bool CropUpsampling(const jpeg_decompress_struct& cinfo, bool* across_x, bool* across_y) {
  bool croppable = true;
  *across_x = *across_y = false;
  for (int c = 0; c < cinfo.num_components; ++c) {
    const jpeg_component_info& k = cinfo.comp_info[c];
    const bool x =
        k.h_samp_factor * k.DCT_scaled_size != cinfo.max_h_samp_factor * cinfo.min_DCT_scaled_size;
    const bool y =
        k.v_samp_factor * k.DCT_scaled_size != cinfo.max_v_samp_factor * cinfo.min_DCT_scaled_size;
    *across_x |= x, *across_y |= y;
    if ((x || y) && k.DCT_scaled_size != cinfo.min_DCT_scaled_size) croppable = false;
  }
  return croppable;
}

}  // namespace shardfeed::imaging::internal
