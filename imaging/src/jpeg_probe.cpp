// JPEG marker parsing without libjpeg: cheap enough to run on every file at pack time.
#include <cstring>

#include "shardfeed/imaging/image.h"

namespace shardfeed::imaging {
namespace {

uint16_t Be16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }

uint32_t Rd32(const uint8_t* p, bool le) {
  return le ? (uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24)
            : (uint32_t{p[3]} | uint32_t{p[2]} << 8 | uint32_t{p[1]} << 16 | uint32_t{p[0]} << 24);
}
uint16_t Rd16(const uint8_t* p, bool le) {
  return le ? static_cast<uint16_t>(p[0] | p[1] << 8) : static_cast<uint16_t>(p[1] | p[0] << 8);
}

bool IsSof(uint8_t m) { return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC; }

}  // namespace

int ParseExifOrientation(const uint8_t* p, size_t n) {
  if (n < 14 || std::memcmp(p, "Exif\0\0", 6) != 0) return 1;
  const uint8_t* t = p + 6;
  size_t tn = n - 6;
  bool le;
  if (t[0] == 'I' && t[1] == 'I') {
    le = true;
  } else if (t[0] == 'M' && t[1] == 'M') {
    le = false;
  } else {
    return 1;
  }
  if (Rd16(t + 2, le) != 42) return 1;
  uint32_t ifd = Rd32(t + 4, le);
  if (ifd < 8 || ifd > tn - 2) return 1;
  uint16_t count = Rd16(t + ifd, le);
  for (uint32_t i = 0; i < count; ++i) {
    size_t e = size_t{ifd} + 2 + size_t{i} * 12;
    if (e + 12 > tn) return 1;
    if (Rd16(t + e, le) == 0x0112) {
      uint16_t type = Rd16(t + e + 2, le);
      uint16_t v = type == 3 ? Rd16(t + e + 8, le) : static_cast<uint16_t>(Rd32(t + e + 8, le));
      return (v >= 1 && v <= 8) ? v : 1;
    }
  }
  return 1;
}

Result<JpegInfo> ProbeJpeg(const uint8_t* data, size_t size, bool check_end, const Limits& limits) {
  JpegInfo info;
  if (size < 4 || data[0] != 0xFF || data[1] != 0xD8) {
    return Status::Corrupt("not a JPEG (no start-of-image marker)");
  }
  size_t pos = 2;
  bool have_sof = false;
  for (;;) {
    // Markers may be preceded by any number of 0xFF fill bytes.
    if (pos < size && data[pos] != 0xFF) {
      return Status::Corrupt("garbage between JPEG markers at byte ", pos);
    }
    while (pos < size && data[pos] == 0xFF) ++pos;
    if (pos >= size) return Status::Corrupt("truncated JPEG: file ends inside the headers");
    uint8_t m = data[pos++];
    if (m == 0xD9) return Status::Corrupt("JPEG ends before any image data");
    if (m == 0x01 || (m >= 0xD0 && m <= 0xD7)) continue;  // no length
    if (pos + 2 > size) return Status::Corrupt("truncated JPEG: file ends inside a marker");
    uint16_t len = Be16(data + pos);
    if (len < 2 || pos + len > size) {
      return Status::Corrupt("truncated JPEG: marker 0x", std::hex, int{m}, " runs past the end");
    }
    const uint8_t* seg = data + pos + 2;
    size_t seg_len = len - 2u;
    if (IsSof(m)) {
      if (seg_len < 6) return Status::Corrupt("JPEG frame header too short");
      if (m == 0xC3 || m == 0xC7 || m == 0xCB || m == 0xCF) {
        return Status::Unsupported("lossless JPEG is not supported");
      }
      if (seg[0] != 8) return Status::Unsupported(int{seg[0]}, "-bit JPEG is not supported");
      info.height = Be16(seg + 1);
      info.width = Be16(seg + 3);
      info.components = seg[5];
      info.progressive = (m == 0xC2 || m == 0xC6 || m == 0xCA || m == 0xCE);
      if (info.height == 0) return Status::Unsupported("JPEG with height defined later (DNL)");
      if (info.width == 0) return Status::Corrupt("JPEG with zero width");
      if (info.components != 1 && info.components != 3 && info.components != 4) {
        return Status::Unsupported("JPEG with ", info.components, " components");
      }
      if (seg_len < 6u + 3u * info.components)
        return Status::Corrupt("JPEG frame header too short");
      if (uint64_t{info.width} * info.height > limits.max_pixels) {
        return Status::ResourceExhausted("image of ", info.width, "x", info.height,
                                         " exceeds the limit of ", limits.max_pixels, " pixels");
      }
      have_sof = true;
    } else if (m == 0xE1 && info.orientation == 1) {
      info.orientation = ParseExifOrientation(seg, seg_len);
    } else if (m == 0xEE && seg_len >= 5 && std::memcmp(seg, "Adobe", 5) == 0) {
      info.adobe = true;
    } else if (m == 0xDA) {
      if (!have_sof) return Status::Corrupt("JPEG scan before any frame header");
      pos += len;
      break;
    }
    pos += len;
  }
  info.scans = 1;
  if (check_end) {
    // In entropy-coded data 0xFF is always followed by 0x00 or a marker; 0xFF 0xD9 is the end
    // and 0xFF 0xDA starts another scan (counted: too many is a decompression bomb).
    const uint8_t* p = data + pos;
    const uint8_t* end = data + size;
    while (p < end) {
      p = static_cast<const uint8_t*>(std::memchr(p, 0xFF, static_cast<size_t>(end - p)));
      if (!p || p + 1 >= end) break;
      if (p[1] == 0xD9) {
        info.complete = true;
        break;
      }
      if (p[1] == 0xDA && ++info.scans > kMaxJpegScans && info.progressive) {
        return Status::Unsupported("progressive JPEG with more than ", kMaxJpegScans, " scans");
      }
      ++p;
    }
    if (!info.complete) return Status::Corrupt("truncated JPEG: no end-of-image marker");
  }
  return info;
}

}  // namespace shardfeed::imaging
