#include "shardfeed/reader/geometry.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace shardfeed::reader {

void StoredToUpright(int orientation, uint32_t width, uint32_t height, double x, double y,
                     double* u, double* v) {
  const double w = width, h = height;
  switch (orientation) {
    case 2:
      *u = w - x, *v = y;
      return;
    case 3:
      *u = w - x, *v = h - y;
      return;
    case 4:
      *u = x, *v = h - y;
      return;
    case 5:
      *u = y, *v = x;
      return;
    case 6:
      *u = h - y, *v = x;
      return;
    case 7:
      *u = h - y, *v = w - x;
      return;
    case 8:
      *u = y, *v = w - x;
      return;
    default:
      *u = x, *v = y;
  }
}

size_t MapBoxes(const SampleGeometry& g, const void* in, size_t n, float* out, uint32_t* rows) {
  if (!g.valid || g.crop.width == 0 || g.crop.height == 0) return 0;
  const double sx = double(g.out_width) / g.crop.width;
  const double sy = double(g.out_height) / g.crop.height;
  const double ow = g.out_width, oh = g.out_height;
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    float b[4];
    std::memcpy(b, static_cast<const uint8_t*>(in) + i * sizeof b, sizeof b);
    double u0, v0, u1, v1;
    StoredToUpright(g.orientation, g.stored_width, g.stored_height, b[0], b[1], &u0, &v0);
    StoredToUpright(g.orientation, g.stored_width, g.stored_height, b[2], b[3], &u1, &v1);
    // An inverted box stays inverted through any orientation (it is dropped below); a proper one
    // comes out with its corners swapped by mirroring orientations.
    const bool inverted = !(b[0] <= b[2] && b[1] <= b[3]);
    double x0 = (std::min(u0, u1) - g.crop.x) * sx, x1 = (std::max(u0, u1) - g.crop.x) * sx;
    double y0 = (std::min(v0, v1) - g.crop.y) * sy, y1 = (std::max(v0, v1) - g.crop.y) * sy;
    if (g.flip) {
      const double t = ow - x1;
      x1 = ow - x0;
      x0 = t;
    }
    x0 = std::clamp(x0, 0.0, ow), x1 = std::clamp(x1, 0.0, ow);
    y0 = std::clamp(y0, 0.0, oh), y1 = std::clamp(y1, 0.0, oh);
    if (inverted || !(x1 - x0 >= kMinBoxSide && y1 - y0 >= kMinBoxSide)) continue;
    float* o = out + 4 * kept;
    o[0] = float(x0), o[1] = float(y0), o[2] = float(x1), o[3] = float(y1);
    if (rows) rows[kept] = static_cast<uint32_t>(i);
    ++kept;
  }
  return kept;
}

namespace {

// Upright pixel of output index `j` (of `out` pixels) within a crop from `start` of `side`
// pixels: the pixel holding the output pixel's centre.
uint32_t Source(uint32_t j, uint32_t out, uint32_t start, uint32_t side) {
  const uint64_t k = (uint64_t{2} * j + 1) * side / (uint64_t{2} * out);
  return start + static_cast<uint32_t>(std::min<uint64_t>(k, side - 1));
}

}  // namespace

void MapMask(const SampleGeometry& g, const uint8_t* mask, uint8_t* out) {
  const uint32_t ow = g.out_width, oh = g.out_height;
  if (!g.valid || g.crop.width == 0 || g.crop.height == 0) {
    std::memset(out, 0, size_t{ow} * oh);
    return;
  }
  const size_t w = g.stored_width, h = g.stored_height;
  const bool swap = g.orientation >= 5 && g.orientation <= 8;
  // Stored pixel of upright (u, v) is mask[row[v-part] + col[u-part]]: orientations 1-4 take x
  // from u and y from v, 5-8 the other way round (StoredToUpright's inverse, per pixel).
  auto stored_x = [&](uint32_t u, uint32_t v) -> size_t {
    switch (g.orientation) {
      case 2:
      case 3:
        return w - 1 - u;
      case 5:
      case 6:
        return v;
      case 7:
      case 8:
        return w - 1 - v;
      default:
        return u;
    }
  };
  auto stored_y = [&](uint32_t u, uint32_t v) -> size_t {
    switch (g.orientation) {
      case 3:
      case 4:
        return h - 1 - v;
      case 5:
      case 8:
        return u;
      case 6:
      case 7:
        return h - 1 - u;
      default:
        return v;
    }
  };
  std::vector<size_t> col(ow), row(oh);
  for (uint32_t j = 0; j < ow; ++j) {
    const uint32_t u = Source(g.flip ? ow - 1 - j : j, ow, g.crop.x, g.crop.width);
    col[j] = swap ? stored_y(u, 0) * w : stored_x(u, 0);
  }
  for (uint32_t i = 0; i < oh; ++i) {
    const uint32_t v = Source(i, oh, g.crop.y, g.crop.height);
    row[i] = swap ? stored_x(0, v) : stored_y(0, v) * w;
  }
  for (uint32_t i = 0; i < oh; ++i) {
    uint8_t* dst = out + size_t{i} * ow;
    const uint8_t* src = mask + row[i];
    for (uint32_t j = 0; j < ow; ++j) dst[j] = src[col[j]];
  }
}

}  // namespace shardfeed::reader
