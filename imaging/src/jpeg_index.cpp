// Lossless re-layout of JPEGs with restart markers (libjpeg's transcoding API, as jpegtran), the
// walk that finds every restart segment, and the synthetic JPEG that holds just a region's.
#include "shardfeed/imaging/jpeg_index.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
// clang-format off
#include <jpeglib.h>
// clang-format on

#include <algorithm>

#include "jpeg_errors.h"
#include "jpeg_scale.h"

namespace shardfeed::imaging {
namespace {

constexpr uint8_t kSoi = 0xD8, kEoi = 0xD9, kSos = 0xDA, kDri = 0xDD, kRst0 = 0xD0;

uint32_t Load16Be(const uint8_t* p) { return uint32_t{p[0]} << 8 | p[1]; }
uint32_t Load32Le(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
bool IsRst(uint8_t m) { return m >= kRst0 && m <= kRst0 + 7; }

// What the region decode needs from the headers of a re-laid JPEG.
struct Header {
  uint32_t width = 0, height = 0;
  uint32_t mcu_width = 0, mcu_height = 0;  // pixels
  uint32_t mcus_per_row = 0, mcu_rows = 0;
  uint32_t restart_interval = 0;
  int components = 0;
  int h[4] = {}, v[4] = {};  // sampling factors
  size_t sof = 0;            // offset of the SOF marker
  size_t scan = 0;           // first entropy-coded byte
};

// Parses SOI..SOS. Only one baseline/extended Huffman scan holding every component is accepted:
// the layout RelayoutJpeg writes.
Status ParseHeader(const uint8_t* d, size_t n, Header* h) {
  if (n < 4 || d[0] != 0xFF || d[1] != kSoi) return Status::Corrupt("no JPEG start marker");
  size_t p = 2;
  int components = 0;
  uint32_t hmax = 1, vmax = 1;
  for (;;) {
    if (p + 4 > n || d[p] != 0xFF) return Status::Corrupt("JPEG header ends early at byte ", p);
    const uint8_t m = d[p + 1];
    const size_t len = Load16Be(d + p + 2);
    if (len < 2 || p + 2 + len > n) return Status::Corrupt("JPEG marker runs past the end");
    const uint8_t* s = d + p + 4;
    if (m == 0xC0 || m == 0xC1) {
      if (len < 8 || s[0] != 8) return Status::Corrupt("indexed JPEG: bad frame header");
      h->sof = p;
      h->height = Load16Be(s + 1);
      h->width = Load16Be(s + 3);
      components = s[5];
      if (components < 1 || components > 4 || len < 8 + 3u * components) {
        return Status::Corrupt("indexed JPEG: bad frame header");
      }
      h->components = components;
      for (int c = 0; c < components; ++c) {
        h->h[c] = s[7 + 3 * c] >> 4, h->v[c] = s[7 + 3 * c] & 15;
        if (h->h[c] < 1 || h->h[c] > 4 || h->v[c] < 1 || h->v[c] > 4) {
          return Status::Corrupt("indexed JPEG: bad sampling factors");
        }
        hmax = std::max<uint32_t>(hmax, h->h[c]);
        vmax = std::max<uint32_t>(vmax, h->v[c]);
      }
    } else if ((m >= 0xC2 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC)) {
      return Status::Corrupt("indexed JPEG is not baseline (marker ", int{m}, ")");
    } else if (m == kDri) {
      if (len != 4) return Status::Corrupt("indexed JPEG: bad DRI marker");
      h->restart_interval = Load16Be(s);
    } else if (m == kSos) {
      if (h->sof == 0 || h->width == 0 || h->height == 0) {
        return Status::Corrupt("indexed JPEG: scan before frame header");
      }
      if (s[0] != components) return Status::Corrupt("indexed JPEG: scan lacks a component");
      h->scan = p + 2 + len;
      break;
    }
    p += 2 + len;
  }
  h->mcu_width = components == 1 ? 8 : 8 * hmax;
  h->mcu_height = components == 1 ? 8 : 8 * vmax;
  h->mcus_per_row = (h->width + h->mcu_width - 1) / h->mcu_width;
  h->mcu_rows = (h->height + h->mcu_height - 1) / h->mcu_height;
  if (h->restart_interval == 0 || h->mcus_per_row % h->restart_interval != 0) {
    return Status::Corrupt("indexed JPEG: restart interval ", h->restart_interval,
                           " does not divide the ", h->mcus_per_row, " MCUs of a row");
  }
  return Status::OK();
}

// The next marker in entropy-coded data at or after `p` and before `end` (stuffed 0xFF00 and
// fill bytes skipped), or `end` if none.
size_t NextMarker(const uint8_t* d, size_t p, size_t end) {
  while (p + 1 < end) {
    const void* hit = std::memchr(d + p, 0xFF, end - p - 1);
    if (!hit) return end;
    p = static_cast<size_t>(static_cast<const uint8_t*>(hit) - d);
    const uint8_t b = d[p + 1];
    if (b == 0x00 || b == 0xFF) {
      p += b == 0x00 ? 2 : 1;
      continue;
    }
    return p;
  }
  return end;
}

// libjpeg state for one transcode; members outlive the setjmp in RelayoutJpeg.
struct Transcoder {
  Transcoder() {
    err.Install(&src, &progress);
    dst.err = &err.pub;
    jpeg_create_decompress(&src);
    jpeg_create_compress(&dst);
  }
  ~Transcoder() {
    jpeg_destroy_compress(&dst);
    jpeg_destroy_decompress(&src);
    std::free(buffer);
  }
  jpeg_decompress_struct src;
  jpeg_compress_struct dst;
  JpegErrors err;
  jpeg_progress_mgr progress{};
  unsigned char* buffer = nullptr;
  unsigned long length = 0;
};

}  // namespace

Status ScanRestartLayout(const uint8_t* d, size_t n, JpegRestartLayout* layout) {
  Header h;
  SF_RETURN_IF_ERROR(ParseHeader(d, n, &h));
  const uint32_t per_row = h.mcus_per_row / h.restart_interval;
  const uint64_t segments = uint64_t{per_row} * h.mcu_rows;
  layout->mcus_per_row = h.mcus_per_row;
  layout->mcu_rows = h.mcu_rows;
  layout->restart_interval = h.restart_interval;
  layout->row_offsets.assign(h.mcu_rows, 0);
  layout->row_offsets[0] = static_cast<uint32_t>(h.scan);
  size_t p = h.scan;
  for (uint64_t j = 0;; ++j) {
    const size_t m = NextMarker(d, p, n);
    if (m + 1 >= n) return Status::Corrupt("indexed JPEG: scan has no end marker");
    if (!IsRst(d[m + 1])) {
      if (d[m + 1] != kEoi) return Status::Corrupt("indexed JPEG: unexpected marker in the scan");
      if (j + 1 != segments) {
        return Status::Corrupt("indexed JPEG: ", j + 1, " restart segments, expected ", segments);
      }
      layout->scan_end = static_cast<uint32_t>(m);
      return Status::OK();
    }
    if (j + 1 >= segments) return Status::Corrupt("indexed JPEG: more restart segments than MCUs");
    if (d[m + 1] != kRst0 + j % 8) {
      return Status::Corrupt("indexed JPEG: restart marker ", j, " out of sequence");
    }
    p = m + 2;
    if ((j + 1) % per_row == 0) layout->row_offsets[(j + 1) / per_row] = static_cast<uint32_t>(p);
  }
}

Status RelayoutJpeg(const uint8_t* data, size_t size, const Limits& limits,
                    std::vector<uint8_t>* out, JpegRestartLayout* layout) {
  Transcoder t;
  if (setjmp(t.err.jump)) return Status::Corrupt("JPEG re-layout failed: ", t.err.message);
  jpeg_mem_src(&t.src, data, static_cast<unsigned long>(size));
  for (int m = 0; m < 16; ++m) jpeg_save_markers(&t.src, JPEG_APP0 + m, 0xFFFF);
  jpeg_save_markers(&t.src, JPEG_COM, 0xFFFF);
  jpeg_read_header(&t.src, TRUE);
  const uint64_t w = t.src.image_width, h = t.src.image_height;
  if (w * h > limits.max_pixels) {
    return Status::ResourceExhausted("image of ", w, "x", h, " exceeds the limit of ",
                                     limits.max_pixels, " pixels");
  }
  jvirt_barray_ptr* coefficients = jpeg_read_coefficients(&t.src);
  if (t.err.warnings > 0) return Status::Corrupt("corrupt JPEG data: ", t.err.message);
  jpeg_mem_dest(&t.dst, &t.buffer, &t.length);
  jpeg_copy_critical_parameters(&t.src, &t.dst);
  t.dst.optimize_coding = TRUE;
  t.dst.arith_code = FALSE;
  // The source's own APP0 (JFIF) and APP14 (Adobe) are copied below, byte for byte, with the
  // rest: they decide how a decoder reads the colour space, so they must not change.
  t.dst.write_JFIF_header = FALSE;
  t.dst.write_Adobe_marker = FALSE;
  int hmax = 1;
  for (int c = 0; c < t.src.num_components; ++c) {
    hmax = std::max(hmax, t.src.comp_info[c].h_samp_factor);
  }
  const uint32_t mcu_width = t.src.num_components == 1 ? 8 : 8 * static_cast<uint32_t>(hmax);
  const uint32_t per_row = static_cast<uint32_t>((w + mcu_width - 1) / mcu_width);
  uint32_t interval = per_row;  // see kMaxRestartInterval
  for (uint32_t k = std::min(kMaxRestartInterval, per_row / 4); k > 1; --k) {
    if (per_row % k == 0) {
      interval = k;
      break;
    }
  }
  t.dst.restart_interval = interval;
  jpeg_write_coefficients(&t.dst, coefficients);
  for (jpeg_saved_marker_ptr m = t.src.marker_list; m; m = m->next) {
    jpeg_write_marker(&t.dst, m->marker, m->data, m->data_length);
  }
  jpeg_finish_compress(&t.dst);
  jpeg_finish_decompress(&t.src);
  if (t.err.warnings > 0) return Status::Corrupt("corrupt JPEG data: ", t.err.message);
  out->assign(t.buffer, t.buffer + t.length);
  if (out->size() > UINT32_MAX) return Status::Unsupported("re-laid JPEG over 4 GiB");
  Status scanned = ScanRestartLayout(out->data(), out->size(), layout);
  if (!scanned.ok()) return Status::Internal("re-laid JPEG unreadable: ", scanned.message());
  return Status::OK();
}

// The first and one past the last MCU (`mcu` stored pixels each, `count` of them) holding
// [at, at + size) and, with `pad`, the pixel on each side of it at scale n/8. Scaled iMCU edges
// fall on stored MCU edges.
void McuSpan(uint32_t at, uint32_t size, uint32_t mcu, uint32_t count, bool pad, uint32_t n,
             uint32_t* first, uint32_t* end) {
  if (!pad) {
    *first = at / mcu, *end = (at + size + mcu - 1) / mcu;
    return;
  }
  const uint64_t s = uint64_t{at} * n / 8, e = (uint64_t{at + size} * n + 7) / 8;  // scaled
  *first = static_cast<uint32_t>((s > 0 ? (s - 1) * 8 / n : 0) / mcu);
  *end = std::min<uint32_t>(count, static_cast<uint32_t>(e * 8 / n / mcu + 1));
}

// The restart segments [*s0, *s1) of each row and the MCU rows [*row0, *row1) that `region`
// needs: the MCUs it touches, widened by one pixel of the decode's scale on each side where that
// decode upsamples chroma across block edges in that direction (the context DecodeJpegRegion
// takes with `exact`; 4:2:0 at 1/8, 2/8 and 4/8 needs none: libjpeg scales its chroma up in the
// IDCT), and to at least kMinExactWidth there (DecodeJpegRegion's exact crop is never narrower),
// by segments to the left, then to the right.
void NeededMcus(const Header& h, const JpegRegion& region, uint32_t* s0, uint32_t* s1,
                uint32_t* row0, uint32_t* row1) {
  const uint32_t k = h.restart_interval, C = h.mcus_per_row;
  bool across_x = true, across_y = true;
  const uint32_t n =
      static_cast<uint32_t>(internal::PickJpegScale(region.width, region.height, region));
  internal::UpsamplesAcross(h.h, h.v, h.components, static_cast<int>(n), &across_x, &across_y);
  uint32_t c0, c1;
  McuSpan(region.x, region.width, h.mcu_width, C, across_x, n, &c0, &c1);
  McuSpan(region.y, region.height, h.mcu_height, h.mcu_rows, across_y, n, row0, row1);
  *s0 = c0 / k, *s1 = (c1 + k - 1) / k;
  auto scaled_width = [&] {
    const uint64_t w =
        *s1 * k == C ? h.width - *s0 * k * h.mcu_width : (*s1 - *s0) * k * h.mcu_width;
    return (w * n + 7) / 8;
  };
  while (across_x && *s0 > 0 && scaled_width() < internal::kMinExactWidth) --*s0;
  while (across_x && *s1 * k < C && scaled_width() < internal::kMinExactWidth) ++*s1;
}

Status BuildRegionJpeg(const uint8_t* d, size_t n, const JpegRowIndex& index,
                       const JpegRegion& region, std::vector<uint8_t>* synth, uint32_t* origin_x,
                       uint32_t* origin_y, bool* worthwhile) {
  *worthwhile = false;
  Header h;
  SF_RETURN_IF_ERROR(ParseHeader(d, n, &h));
  if (h.restart_interval != index.restart_interval || h.mcu_rows != index.mcu_rows ||
      index.scan_end + 2 > n || d[index.scan_end] != 0xFF || d[index.scan_end + 1] != kEoi) {
    return Status::Corrupt("JPEG region index does not match the JPEG's headers");
  }
  if (region.width == 0 || region.height == 0 || region.x >= h.width || region.y >= h.height ||
      region.width > h.width - region.x || region.height > h.height - region.y) {
    return Status::OK();  // whole image, or a region the plain decode will refuse
  }
  const uint32_t k = h.restart_interval, C = h.mcus_per_row, R = h.mcu_rows;
  uint32_t s0, s1, row0, row1;
  NeededMcus(h, region, &s0, &s1, &row0, &row1);
  // The stored JPEG's own decode of the region entropy-decodes every MCU down to the region's
  // last row: unless the synthetic one saves 3% of those (what building it costs, measured on
  // ~460x400 and camera photos; docs/BENCHMARKS.md "Region decode"), decode the stored one.
  if (uint64_t{s1 - s0} * k * (row1 - row0) * 100 > uint64_t{C} * row1 * 97) return Status::OK();

  synth->clear();
  synth->reserve(
      h.scan +
      (index.scan_end - h.scan) * uint64_t{s1 - s0} * k * (row1 - row0) / (uint64_t{C} * R) + 1024);
  synth->push_back(0xFF);
  synth->push_back(kSoi);
  const uint32_t x0 = s0 * k * h.mcu_width, y0 = row0 * h.mcu_height;
  const uint32_t sw = s1 * k == C ? h.width - x0 : (s1 - s0) * k * h.mcu_width;
  const uint32_t sh = row1 == R ? h.height - y0 : (row1 - row0) * h.mcu_height;
  for (size_t p = 2; p < h.scan;) {
    const uint8_t m = d[p + 1];
    const size_t len = Load16Be(d + p + 2);
    // APP0 (JFIF) and APP14 (Adobe) decide the colour space; other APPn and COM are not needed.
    const bool keep = !((m >= 0xE1 && m <= 0xED) || m == 0xEF || m == 0xFE);
    if (keep) {
      const size_t at = synth->size();
      synth->insert(synth->end(), d + p, d + p + 2 + len);
      if (p == h.sof) {
        uint8_t* s = synth->data() + at + 4;
        s[1] = static_cast<uint8_t>(sh >> 8), s[2] = static_cast<uint8_t>(sh);
        s[3] = static_cast<uint8_t>(sw >> 8), s[4] = static_cast<uint8_t>(sw);
      }
    }
    p += 2 + len;
  }
  const uint32_t per_row = C / k;
  const uint64_t last = uint64_t{s1 - s0} * (row1 - row0);
  uint64_t t = 0;  // segments written
  for (uint32_t r = row0; r < row1; ++r) {
    const size_t start = Load32Le(index.row_offsets + 4 * size_t{r});
    const bool ok_start = r == 0 ? start == h.scan
                                 : start >= h.scan + 2 && start <= index.scan_end &&
                                       d[start - 2] == 0xFF && IsRst(d[start - 1]);
    if (!ok_start) return Status::Corrupt("JPEG region index: row ", r, " is not a segment start");
    size_t p = start;
    for (uint32_t j = 0; j < s1; ++j) {
      const bool final = r + 1 == R && j + 1 == per_row;
      const size_t m = final ? index.scan_end : NextMarker(d, p, index.scan_end);
      if (!final && (m >= index.scan_end || !IsRst(d[m + 1]))) {
        return Status::Corrupt("JPEG region index: row ", r, " has too few restart segments");
      }
      if (j >= s0) {
        synth->insert(synth->end(), d + p, d + m);
        if (++t < last) {
          synth->push_back(0xFF);
          synth->push_back(static_cast<uint8_t>(kRst0 + (t - 1) % 8));
        }
      }
      p = m + 2;
    }
  }
  synth->push_back(0xFF);
  synth->push_back(kEoi);
  *origin_x = x0;
  *origin_y = y0;
  *worthwhile = true;
  return Status::OK();
}

}  // namespace shardfeed::imaging
