// Checks before stb_image decodes a file; see stb_checks.h.
#include "stb_checks.h"

#include <cstring>
#include <ios>

namespace shardfeed::imaging {
namespace {

uint32_t Le16(const uint8_t* p) { return uint32_t{p[0]} | uint32_t{p[1]} << 8; }
uint32_t Le32(const uint8_t* p) { return Le16(p) | Le16(p + 2) << 16; }

}  // namespace

// Binary PNM (P5 grey, P6 RGB), checked before stb_image sees it. Debian's stb (2022-09)
// converts a 16-bit PNM (maxval over 255) to 4 channels with its 8-bit routine and then reads
// twice the buffer (a crash found by decode_fuzz), and leaves a truncated file's missing pixels
// uninitialised. So: 16-bit is refused, and the pixel data must all be there. The header is
// walked as stb walks it: whitespace and # comments before each number, one byte after maxval.
Status CheckPnm(const uint8_t* d, size_t n) {
  if (n < 2 || d[0] != 'P' || (d[1] != '5' && d[1] != '6')) return Status::OK();
  size_t p = 2;
  uint64_t v[3] = {0, 0, 0};  // width, height, maxval
  for (uint64_t& value : v) {
    for (;;) {
      while (p < n && std::strchr(" \t\n\v\f\r", d[p]) && d[p] != 0) ++p;
      if (p >= n || d[p] != '#') break;
      while (p < n && d[p] != '\n' && d[p] != '\r') ++p;
    }
    if (p >= n || d[p] < '0' || d[p] > '9') return Status::Corrupt("PNM header: a number expected");
    while (p < n && d[p] >= '0' && d[p] <= '9' && value < (uint64_t{1} << 32)) {
      value = value * 10 + static_cast<uint64_t>(d[p++] - '0');
    }
  }
  ++p;  // the one whitespace byte after maxval
  if (v[0] == 0 || v[1] == 0 || v[0] > (1u << 24) || v[1] > (1u << 24)) {
    return Status::Corrupt("PNM header: size ", v[0], "x", v[1]);
  }
  if (v[2] == 0 || v[2] > 255) {
    return Status::Unsupported("PNM with maxval ", v[2], ": only 8-bit (maxval 1-255) is read");
  }
  const uint64_t need = v[0] * v[1] * (d[1] == '6' ? 3 : 1);
  const uint64_t have = p < n ? n - p : 0;
  if (have < need) {
    return Status::Corrupt("PNM pixel data truncated: ", have, " of ", need, " bytes");
  }
  return Status::OK();
}

// A BMP's rows are padded to 4 bytes and start at the file header's pixel offset (stb_image
// seeks there when it lies beyond the headers and palette). Run-length and embedded JPEG/PNG
// compression are left to stb_image, as are headers it would refuse.
Status CheckBmp(const uint8_t* d, size_t n) {
  if (n < 2 || d[0] != 'B' || d[1] != 'M') return Status::OK();
  if (n < 30) return Status::Corrupt("BMP header truncated: ", n, " bytes");
  const uint64_t offset = Le32(d + 10);
  const uint64_t header = Le32(d + 14);
  uint64_t width, height, bpp, compression = 0;
  if (header == 12) {  // OS/2 BITMAPCOREHEADER
    width = Le16(d + 18);
    height = Le16(d + 20);
    bpp = Le16(d + 24);
  } else {
    if (n < 34) return Status::Corrupt("BMP header truncated: ", n, " bytes");
    const auto w = static_cast<int32_t>(Le32(d + 18));
    const auto h = static_cast<int32_t>(Le32(d + 22));
    width = w < 0 ? 0 : static_cast<uint64_t>(w);
    height = h < 0 ? uint64_t{0} - static_cast<int64_t>(h) : static_cast<uint64_t>(h);
    bpp = Le16(d + 28);
    compression = Le32(d + 30);
  }
  const bool plain_rows = compression == 0 || compression == 3 || compression == 6;
  if (!plain_rows || width == 0 || height == 0 || width > (1u << 24) || height > (1u << 24) ||
      bpp == 0 || bpp > 32) {
    return Status::OK();
  }
  const uint64_t row = (width * bpp + 31) / 32 * 4;
  const uint64_t start = offset >= 14 + header ? offset : 14 + header;
  const uint64_t need = row * height;
  const uint64_t have = n > start ? n - start : 0;
  if (have < need) {
    return Status::Corrupt("BMP pixel data truncated: ", have, " of ", need, " bytes");
  }
  return Status::OK();
}

// A GIF is a header, an optional colour table, then blocks: extensions (0x21) and images (0x2C),
// each carrying data in sub-blocks of 1-255 bytes that end with an empty one. The first image is
// the frame decoded; the walk ends when its data's closing sub-block is found.
Status CheckGif(const uint8_t* d, size_t n) {
  if (n < 6 || (std::memcmp(d, "GIF87a", 6) != 0 && std::memcmp(d, "GIF89a", 6) != 0)) {
    return Status::OK();
  }
  const auto truncated = [n](const char* where) {
    return Status::Corrupt("GIF truncated in ", where, " (the file has ", n, " bytes)");
  };
  const auto table = [](uint8_t packed) -> size_t {
    return (packed & 0x80) ? size_t{3} << ((packed & 7) + 1) : 0;
  };
  size_t p = 13;
  if (n < p) return truncated("the screen descriptor");
  p += table(d[10]);
  // Skips sub-blocks from p up to and past the empty one; false when the file ends first.
  const auto skip_blocks = [&] {
    while (p < n) {
      const uint8_t len = d[p++];
      if (len == 0) return true;
      p += len;
    }
    return false;
  };
  for (;;) {
    if (p >= n) return truncated("the block list before the first image");
    const uint8_t kind = d[p++];
    if (kind == 0x21) {  // extension: a label, then sub-blocks
      ++p;
      if (!skip_blocks()) return truncated("an extension before the first image");
    } else if (kind == 0x2C) {  // image descriptor, local colour table, LZW code size, data
      if (n < p + 9) return truncated("the first image's descriptor");
      p += 9;
      p += table(d[p - 1]);
      ++p;
      if (!skip_blocks()) return truncated("the first image's pixel data");
      return Status::OK();
    } else if (kind == 0x3B) {
      return Status::Corrupt("GIF holds no image");
    } else {
      return Status::Corrupt("GIF block of unknown kind 0x", std::hex, int{kind}, " at byte ",
                             std::dec, p - 1);
    }
  }
}

}  // namespace shardfeed::imaging
