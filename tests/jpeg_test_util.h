// JPEGs for the C++ tests, written through the libjpeg API (sampling, restart intervals and
// table kinds TurboJPEG does not offer). Shared by codec/jpeg_index_test.cpp and
// imaging/jpeg_huffman_test.cpp.
#pragma once

#include <cstdio>
// clang-format off
#include <jpeglib.h>
// clang-format on

#include <cstdint>
#include <cstdlib>
#include <vector>

namespace shardfeed::testing {

struct LibjpegOptions {
  int quality = 88;      // 1-100
  int h0 = 1, v0 = 1;    // the first component's sampling; every other component 1 x 1
  bool optimal = false;  // optimised Huffman tables, else the standard ones
  int restart = 0;       // MCUs a restart segment, 0 for none, -1 for one MCU row
};

// `pixels`: w x h x comps bytes (1 gray, 3 RGB, 4 CMYK).
inline std::vector<uint8_t> EncodeLibjpeg(const uint8_t* pixels, uint32_t w, uint32_t h, int comps,
                                          const LibjpegOptions& o) {
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* buf = nullptr;
  unsigned long len = 0;
  jpeg_mem_dest(&c, &buf, &len);
  c.image_width = w, c.image_height = h;
  c.input_components = comps;
  c.in_color_space = comps == 1 ? JCS_GRAYSCALE : comps == 3 ? JCS_RGB : JCS_CMYK;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, o.quality, TRUE);
  c.optimize_coding = o.optimal;
  c.comp_info[0].h_samp_factor = o.h0, c.comp_info[0].v_samp_factor = o.v0;
  for (int i = 1; i < c.num_components; ++i) {
    c.comp_info[i].h_samp_factor = c.comp_info[i].v_samp_factor = 1;
  }
  if (o.restart > 0) c.restart_interval = static_cast<unsigned>(o.restart);
  if (o.restart < 0) c.restart_in_rows = 1;
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(pixels) + size_t{c.next_scanline} * w * comps;
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  std::vector<uint8_t> out(buf, buf + len);
  std::free(buf);
  return out;
}

}  // namespace shardfeed::testing
